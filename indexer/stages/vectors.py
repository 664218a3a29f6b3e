"""Embeddings and search rows of what changed (design §3.7).

Vectors are cached in SQLite by (embedder name, text hash), so unchanged text is never
re-embedded and the LanceDB tables can always be rebuilt from the store. Only rows of artifacts
this run staged (units, entities, reports: written or deleted) are rewritten; a full build, or an
index built with another embedder, rewrites the tables from scratch.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from canopy.ids import content_hash
from canopy.settings import StorageSettings
from canopy.store import Store
from canopy.vectors import TABLES, VectorRow, VectorStore, floor, load_scrub, superseded
from indexer.stages.context import Build

__all__ = ["VectorOutcome", "stage_vectors", "tidy_search_tables"]

log = logging.getLogger(__name__)

_BATCH = 512


@dataclass
class VectorOutcome:
    embedded: int
    versions: dict[str, int]
    scrub: dict[str, set[int]]  # fragments rows were deleted from (VectorStore.scrub)


@dataclass(frozen=True)
class _Item:
    id: str
    text: str
    acl: tuple[int, ...]
    units: tuple[str, ...]  # what the text derives from: its embedding goes with them
    level: int = -1


def _ids(b: Build, table: str, rebuild: bool) -> list[str]:
    if rebuild:
        key = "community_id" if table == "reports" else "id"
        return [
            r[0] for r in b.store.writer.execute(f"SELECT {key} FROM temp.{table}_new ORDER BY 1")
        ]
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


async def stage_vectors(b: Build, *, rebuild: bool) -> VectorOutcome:
    """Write the search rows of staged artifacts (all artifacts with `rebuild`)."""
    embedder = b.embedder
    vectors = VectorStore(b.store.index_dir, embedder.dims or 0)
    committed = json.loads(b.store.get_meta("lance_versions", "{}") or "{}")
    vectors.restore(committed, missing_ok=rebuild)
    if rebuild:
        vectors.clear()
    plan = {table: _ids(b, table, rebuild) for table in TABLES}
    advance = b.progress("embed", sum(len(v) for v in plan.values()))
    embedded = 0
    for table, ids in plan.items():
        for start in range(0, len(ids), _BATCH):
            batch = ids[start:start + _BATCH]
            items = list(_items(b, table, batch))
            keys = {it.id: content_hash(embedder.name, it.text, length=32) for it in items}
            cached = b.store.embeddings_get(keys.values())
            missing = sorted(
                {keys[it.id]: it.text for it in items if keys[it.id] not in cached}.items()
            )
            if missing:
                got = await embedder.embed([text for _, text in missing])
                new = {k: np.asarray(v, dtype=np.float32).tobytes()
                       for (k, _), v in zip(missing, got, strict=True)}
                cached.update(new)
                embedded += len(new)
            else:
                new = {}
            # cached vectors too: a text now also derives from these units
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
            vectors.write(table, [] if rebuild else batch, rows)
            advance(len(batch))
        vectors.maintain(table)
    return VectorOutcome(embedded, vectors.versions(), vectors.scrub)


def tidy_search_tables(store: Store, storage: StorageSettings, *, changed: bool) -> None:
    """After a commit (`changed`), or a run with nothing to do: fold appended rows into the
    search indexes when they are many, and, at most once per `keep_versions_s`, rewrite tables
    that still store deleted rows and prune versions no reader may hold any more
    (`VectorStore.tidy`, `floor`).

    A run with nothing to do opens the tables only when a tidy is due and the tables changed
    after the last tidy's grace period began (what they superseded may still be on disk). So
    deleted text leaves the disk at the index runs that follow the deletion by one to two
    grace periods (plus `_PRUNE_MARGIN`)."""
    committed = {name: int(v) for name, v in
                 json.loads(store.get_meta("lance_versions", "{}") or "{}").items()}
    if not committed:
        return
    now, keep = time.time(), storage.keep_versions_s
    tidied = float(store.get_meta("lance_tidied_at", "0") or 0)
    changed_at = now if changed else float(store.get_meta("lance_changed_at", "0") or 0)
    due = now - tidied >= keep
    if not changed and not (due and changed_at > tidied - keep):
        return
    keep_from, history = floor(store.get_meta("lance_history"), committed, now, keep)

    def record(versions: dict[str, int]) -> None:
        meta = {"lance_versions": json.dumps(versions),
                "lance_history": superseded(history, committed, now)}
        if due:  # every table's noted fragments were rewritten
            meta["lance_scrub"] = "{}"
        store.set_meta(meta)

    VectorStore(store.index_dir, 0).tidy(committed, keep_from if keep else None, due=due,
                                         record=record,
                                         scrub=load_scrub(store.get_meta("lance_scrub")))
    stamps = {"lance_changed_at": str(changed_at)}
    if due:
        stamps["lance_tidied_at"] = str(now)
    store.set_meta(stamps)
