"""Which text units each cached LLM response, stored view and cached embedding was derived from,
so that removing a unit also removes every cached text that could quote it, and every vector
that could betray it (issue "Safety", case 10).

Callers that send a request derived from known units declare them around the call:

    with cache_sources(unit_ids):
        await provider.extract(unit, ...)

and `Store.cache_put` / `Store.view_put` record (unit, key) rows in `cache_sources`. What is
tracked: extraction and gleaning (the unit), description summaries (every unit with an
instance of the element), community reports and report views (every unit of the report's
context), entity and relationship views (their visible units), and the embeddings of search
rows (`Store.embeddings_put`: the unit, the entity's units, the report's units). A response
cached with no declared sources (the query-time calls: rate, map, reduce, answer, HyDE,
DRIFT; they quote whatever the engines retrieved) is recorded under `UNATTRIBUTED` and dropped
whenever any unit is removed: a repeated question then costs its calls again, which is cheap
next to keeping deleted text.

`purge` runs inside the transaction that removes the units (revocation, or the commit that
replaces them), so the cache never outlives, nor dies before, the units it quotes.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from canopy.store.rows import dump

__all__ = ["UNATTRIBUTED", "cache_sources", "current_sources", "purge", "record"]

UNATTRIBUTED = ""  # the unit id of responses whose sources are unknown
_SOURCES: ContextVar[frozenset[str] | None] = ContextVar("canopy_cache_sources", default=None)
_IN = "IN (SELECT value FROM json_each(?))"
_BATCH = 500


@contextmanager
def cache_sources(unit_ids: Iterable[str]) -> Iterator[None]:
    """Responses cached inside this block derive from these units (this task/thread only)."""
    token = _SOURCES.set(frozenset(unit_ids))
    try:
        yield
    finally:
        _SOURCES.reset(token)


def current_sources() -> frozenset[str]:
    """The units declared by the innermost `cache_sources` block, or {UNATTRIBUTED}."""
    units = _SOURCES.get()
    return units if units else frozenset({UNATTRIBUTED})


def record(db: sqlite3.Connection, key: str, units: Iterable[str]) -> None:
    """Note that the cached entry `key` derives from `units` (in the caller's transaction)."""
    db.executemany("INSERT OR IGNORE INTO cache_sources VALUES (?, ?)",
                   [(u, key) for u in sorted(set(units) or {UNATTRIBUTED})])


def purge(db: sqlite3.Connection, unit_ids: Iterable[str]) -> int:
    """Delete cached responses and views derived from these units, and every unattributed one,
    in the caller's transaction; returns how many entries went."""
    units = sorted(set(unit_ids) - {UNATTRIBUTED})
    if not units:
        return 0
    keys = [r[0] for r in db.execute(f"SELECT DISTINCT key FROM cache_sources WHERE unit_id {_IN}",
                                     (dump([*units, UNATTRIBUTED]),))]
    for i in range(0, len(keys), _BATCH):
        batch = dump(keys[i:i + _BATCH])
        for table in ("llm_cache", "acl_views", "embeddings", "cache_sources"):
            db.execute(f"DELETE FROM {table} WHERE key {_IN}", (batch,))  # noqa: S608
    return len(keys)
