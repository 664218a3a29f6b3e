"""Embeddings and search rows of what changed (design §3.7): the stage over canopy.vectors,
which holds the search tables themselves (the same thing at two depths).

Vectors are cached in SQLite by (embedder name, text hash), so unchanged text is never
re-embedded and the LanceDB tables can always be rebuilt from the store (the hashing embedder's
are computed afresh instead: `caches_vectors`). Only rows of artifacts
this run staged (units, entities, reports: written or deleted) are rewritten; a full build, or an
index built with another embedder, rewrites the tables from scratch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from canopy.errors import ProviderError
from canopy.ids import content_hash
from canopy.indexer.stages.build import Build
from canopy.providers.base import Embedder
from canopy.providers.builtin.embedder import HashEmbedder
from canopy.providers.builtin.processes import ProcessEmbedder, embedding_processes
from canopy.settings import StorageSettings
from canopy.store import Store
from canopy.tasks import side_by_side
from canopy.vectors import (
    FOLD_CHECK_ROWS,
    TABLES,
    VectorRow,
    VectorStore,
    floor,
    load_scrub,
    merge_scrub,
    superseded,
)

__all__ = ["EmbeddingsAhead", "VectorOutcome", "caches_vectors", "embeds_remotely",
           "SearchRows", "retrain_noted", "search_tables_need_tidy", "tidy_search_tables"]

log = logging.getLogger(__name__)

_BATCH = 512
# Texts being embedded ahead at once, in batches of _BATCH: bounds the memory of what waits.
_AHEAD_BATCHES = 4


@dataclass
class VectorOutcome:
    embedded: int
    versions: dict[str, int]
    scrub: dict[str, set[int]]  # fragments rows were deleted from (VectorStore.scrub)
    written: int = 0  # rows added (VectorStore.written)
    retrain: frozenset[str] = frozenset()  # tables whose vector index tidy trains anew


@dataclass(frozen=True)
class _Item:
    id: str
    text: str
    acl: tuple[int, ...]
    units: tuple[str, ...]  # what the text derives from: its embedding goes with them
    level: int = -1


def _ids(b: Build, table: str, rebuild: bool) -> list[str]:
    if rebuild:
        return b.reads.keys(table)
    return sorted(b.staging.staged_keys(table))


def _items(b: Build, table: str, ids: list[str]) -> Iterator[_Item]:
    reads = b.reads
    if table == "text_units":
        for uid, (unit, doc) in sorted(reads.unit_documents(ids).items()):
            yield _Item(uid, f"{doc.header()}\n{unit.unit.text}", (unit.acl,), (uid,))
    elif table == "entities":
        for eid, (name, description, acl, units) in sorted(reads.entity_texts(ids).items()):
            yield _Item(eid, f"{name}: {description}", tuple(sorted(acl)), tuple(units))
    else:
        for cid, row in sorted(reads.reports(ids).items()):
            r = row.report
            yield _Item(cid, r.full_text(), tuple(sorted(row.gate.acl)), r.text_unit_ids, r.level)


def _keys(b: Build, items: list[_Item]) -> dict[str, str]:
    """The embedding cache key of each item's text (embedder and text: nothing else)."""
    return {it.id: content_hash(b.embedder.name, it.text, length=32) for it in items}


def caches_vectors(embedder: object) -> bool:
    """Whether this embedder's vectors are worth the embedding cache: an embedder that says
    `cache_vectors = False` (the hashing one) computes a text's vector faster than the cache
    reads it back and records which units it derives from."""
    return bool(getattr(embedder, "cache_vectors", True))


async def _cached_and_new(b: Build, items: list[_Item], keys: dict[str, str],
                          embedder: Embedder | None = None
                          ) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The vectors of these items' texts by key: those the cache holds, and those it did not,
    asked of the embedder (the build's unless given) now (not yet cached: the caller records
    them with their units)."""
    embedder = embedder or b.embedder
    cached = b.store.embeddings_get(keys.values()) if caches_vectors(embedder) else {}
    missing = sorted({keys[it.id]: it.text for it in items if keys[it.id] not in cached}.items())
    if not missing:
        return cached, {}
    got = await embedder.embed([text for _, text in missing])
    return cached, {k: np.asarray(v, dtype=np.float32).tobytes()
                    for (k, _), v in zip(missing, got, strict=True)}


def embeds_remotely(embedder: object) -> bool:
    """Whether this embedder waits on an endpoint (it keeps a window of requests in flight);
    the builtin ones compute in this process, where embedding ahead would only take turns."""
    return callable(getattr(embedder, "concurrency", None))


@dataclass
class EmbeddingsAhead:
    """Embeddings requested while the other stages run (issue: vectors waited for the last
    report, then sent their batches one after another): the units' texts during extraction,
    the entities' once merged, each report's once written. What it fetches goes to the
    embedding cache, keyed by text alone, so `stage_vectors` later finds it there and
    writes the same rows it would have written without it: this only moves requests earlier.
    A request that fails here is left to `stage_vectors`, which asks again and reports
    the failure as it always has."""

    b: Build
    enabled: bool = True
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(_AHEAD_BATCHES))
    requested: int = 0  # texts sent to the endpoint ahead (the run's stats)

    def submit(self, table: str, ids: Iterable[str]) -> None:
        """Start embedding these rows' texts (ids of artifacts staged in the new generation)."""
        ids = sorted(set(ids))
        if not self.enabled or not ids:
            return
        for start in range(0, len(ids), _BATCH):
            self._tasks.append(asyncio.ensure_future(self._one(table, ids[start:start + _BATCH])))

    async def _one(self, table: str, ids: list[str]) -> None:
        async with self._slots:
            items = list(_items(self.b, table, ids))
            keys = _keys(self.b, items)
            try:
                _, new = await _cached_and_new(self.b, items, keys)
            except ProviderError as exc:
                log.debug("embedding ahead failed (%s); the vectors stage asks again", exc)
                return
            if new:
                self.requested += len(new)
                self.b.store.embeddings_put(
                    new, {keys[it.id]: it.units for it in items if keys[it.id] in new})

    async def drain(self) -> None:
        """Wait for what was submitted (before the vectors stage reads the cache)."""
        tasks, self._tasks = self._tasks, []
        await asyncio.gather(*tasks)

    def cancel(self) -> None:
        """A run that ends early (an error) leaves nothing running behind it."""
        for task in self._tasks:
            task.cancel()
        self._tasks = []


# Rows a batch of the tables written early (`SearchRows.start_early`): that writing moves on only
# when the report stage hands the event loop back (after each report, offline), a few turns a
# batch, so fewer, larger batches than the vectors stage's finish sooner behind it.
_EARLY_BATCH = 4096
_EARLY_TABLES = ("text_units", "entities")


class SearchRows:
    """The vectors stage (design §3.7): the search rows of staged artifacts (of all artifacts
    with `rebuild`), written in one or two steps.

    With an embedder that computes here (the hashing one, a local model), the units' and the
    entities' rows are final once the graph is merged, and writing them is mostly waiting on
    LanceDB's threads and the hashing workers: `start_early` writes them while the communities
    and reports are computed on the writer's thread, and `finish` writes the reports' rows and
    waits for the rest. An endpoint's embeddings are requested ahead instead
    (`EmbeddingsAhead`), so there every table is written by `finish`, from the cache.
    `erase`: text left the index in this run (deleted or edited units), so the rows it deletes
    are noted for rewriting (`VectorStore`)."""

    def __init__(self, b: Build, *, rebuild: bool, erase: bool) -> None:
        self.b = b
        self.rebuild = rebuild
        self.vectors = VectorStore(b.store.index_dir, b.embedder.dims or 0, erase=erase)
        committed = json.loads(b.store.get_meta("lance_versions", "{}") or "{}")
        self.vectors.restore(committed, missing_ok=rebuild)
        if rebuild:
            self.vectors.clear()
        self.embedded = 0
        self._pool: ProcessEmbedder | None = None  # the hashing embedder over worker processes
        self._early: asyncio.Task[None] | None = None  # writing _EARLY_TABLES

    def start_early(self) -> bool:
        """Start writing the units' and entities' rows (their artifacts are final), when the
        embedder runs in this process; whether it started."""
        if embeds_remotely(self.b.embedder) or self._early is not None:
            return False
        plan = {table: _ids(self.b, table, self.rebuild) for table in _EARLY_TABLES}
        self._early = asyncio.ensure_future(self._write(plan, _EARLY_BATCH))
        return True

    async def finish(self) -> VectorOutcome:
        """Write the rows of the tables not written early, and wait for those that were."""
        early = _EARLY_TABLES if self._early is not None else ()
        plan = {table: _ids(self.b, table, self.rebuild) for table in TABLES if table not in early}
        try:
            await side_by_side([*([self._early] if self._early else []),
                                self._write(plan, _BATCH)])
        finally:
            await self.close()
        v = self.vectors
        return VectorOutcome(self.embedded, v.versions(), v.scrub, v.written, frozenset(v.retrain))

    async def close(self) -> None:
        """End what runs: a run that fails early leaves nothing behind (the run ends the
        worker processes: `Build.close_workers`)."""
        if self._early is not None and not self._early.done():
            self._early.cancel()
            await asyncio.gather(self._early, return_exceptions=True)

    def _embedder(self, texts: int) -> Embedder:
        """The build's embedder; the hashing one over worker processes for many texts."""
        if self._pool is not None:
            return self._pool
        local = self.b.embedder
        if isinstance(local, HashEmbedder):
            processes = embedding_processes(self.b.settings.extract.processes, texts)
            if processes:
                self._pool = ProcessEmbedder(local, self.b.workers(processes))
                return self._pool
        return local

    async def _write(self, plan: dict[str, list[str]], batch_size: int) -> None:
        b, vectors, rebuild = self.b, self.vectors, self.rebuild
        texts = sum(len(v) for v in plan.values())
        advance = b.progress("embed", texts)
        embedder = self._embedder(texts)

        async def one_table(table: str, ids: list[str]) -> None:
            for start in range(0, len(ids), batch_size):
                batch = ids[start:start + batch_size]
                items = list(_items(b, table, batch))
                keys = _keys(b, items)
                cached, new = await _cached_and_new(b, items, keys, embedder)
                cached.update(new)
                self.embedded += len(new)
                if caches_vectors(embedder):  # cached ones too: a text now derives from these
                    b.store.embeddings_put(new, {keys[it.id]: it.units for it in items})
                if not vectors.dims and cached:  # an endpoint tells its width with its first reply
                    vectors.dims = len(next(iter(cached.values()))) // 4
                rows = [
                    VectorRow(
                        it.id,
                        it.text,
                        keys[it.id],
                        np.frombuffer(cached[keys[it.id]], dtype=np.float32),
                        it.acl,
                        it.level,
                    )
                    for it in items
                ]
                await asyncio.to_thread(vectors.write, table, [] if rebuild else batch, rows)
                advance(len(batch))
            await asyncio.to_thread(vectors.maintain, table)

        # The tables are written side by side: a write is mostly waiting on LanceDB (its own
        # threads do the work), which one table at a time left idle 0.4 s of a 30-article
        # build's 0.6 s. Only LanceDB calls leave the loop's thread: the store is this thread's.
        await side_by_side(one_table(t, ids) for t, ids in plan.items())


def _tidy_plan(store: Store, storage: StorageSettings, now: float) -> bool | None:
    """Whether the periodic tidy is due, or None when there is nothing to look at: enough
    rows were added since the last tidy that a fold into the indexes may be due
    (`FOLD_CHECK_ROWS`), a periodic tidy is due and the tables changed after the last one's
    grace period began (what they superseded may still be on disk), or a run noted a stale
    vector index (`retrain_noted`)."""
    if not store.get_meta("lance_versions"):
        return None
    keep = storage.keep_versions_s
    tidied = float(store.get_meta("lance_tidied_at", "0") or 0)
    changed_at = float(store.get_meta("lance_changed_at", "0") or 0)
    appended = int(store.get_meta("lance_appended", "0") or 0)
    due = now - tidied >= keep
    if (appended >= FOLD_CHECK_ROWS or (due and changed_at > tidied - keep)
            or retrain_noted(store)):
        return due
    return None


def retrain_noted(store: Store) -> list[str]:
    """Tables whose vector index a run found stale (meta `lance_retrain`)."""
    return sorted(json.loads(store.get_meta("lance_retrain", "[]") or "[]"))


def search_tables_need_tidy(store: Store, storage: StorageSettings) -> bool:
    """Whether `tidy_search_tables` would open the tables (milliseconds: meta only)."""
    return _tidy_plan(store, storage, time.time()) is not None


def tidy_search_tables(store: Store, storage: StorageSettings, *,
                       should_stop: Callable[[], bool] | None = None) -> bool:
    """After commits: fold appended rows into the search indexes when they are many, and, at
    most once per `keep_versions_s`, rewrite the fragments that still store erased rows and
    prune versions no reader may hold any more (`VectorStore.tidy`, `floor`). The caller holds
    the writer lock. `should_stop()` ends the work between steps (a writer is waiting); each
    finished table is recorded at once. False when it stopped early.

    Commits stamp `lance_changed_at`. So deleted text leaves the disk at the first tidy that
    follows the deletion by one to two grace periods (plus `_PRUNE_MARGIN`)."""
    now = time.time()
    due = _tidy_plan(store, storage, now)
    if due is None:
        return True
    keep = storage.keep_versions_s
    committed = {name: int(v) for name, v in
                 json.loads(store.get_meta("lance_versions", "{}") or "{}").items()}
    keep_from, history = floor(store.get_meta("lance_history"), committed, now, keep)
    recorded = store.get_meta("lance_scrub")
    scrub = None if recorded is None else load_scrub(recorded)
    stopped = [False]

    def stop() -> bool:
        stopped[0] = stopped[0] or bool(should_stop and should_stop())
        return stopped[0]

    def record(versions: dict[str, int], done: str) -> None:
        meta = {"lance_versions": json.dumps(versions),
                "lance_history": superseded(history, committed, now)}
        if due:  # this table's noted fragments were rewritten
            left = load_scrub(store.get_meta("lance_scrub"))
            left.pop(done, None)
            meta["lance_scrub"] = merge_scrub(None, left)
        store.set_meta(meta)

    VectorStore(store.index_dir, 0).tidy(committed, keep_from if keep else None, due=due,
                                         record=record, scrub=scrub, should_stop=stop,
                                         retrain=retrain_noted(store))
    if stopped[0]:
        return False
    stamps = {"lance_appended": "0", "lance_retrain": "[]"}
    if due:
        stamps["lance_tidied_at"] = str(now)
        stamps["lance_scrub"] = "{}"
    store.set_meta(stamps)
    return True
