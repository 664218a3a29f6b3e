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
from datetime import timedelta

import numpy as np

from canopy.ids import content_hash
from canopy.settings import StorageSettings
from canopy.store import Store
from canopy.vectors import TABLES, VectorRow, VectorStore, stored_versions
from indexer.stages.context import Build

__all__ = ["VectorOutcome", "stage_vectors", "tidy_search_tables"]

log = logging.getLogger(__name__)

_BATCH = 512


@dataclass
class VectorOutcome:
    embedded: int
    versions: dict[str, int]


@dataclass(frozen=True)
class _Item:
    id: str
    text: str
    acl: tuple[int, ...]
    level: int = -1


def _ids(b: Build, table: str, rebuild: bool) -> list[str]:
    if rebuild:
        key = "community_id" if table == "reports" else "id"
        return [r[0] for r in b.store.writer.execute(f"SELECT {key} FROM temp.{table}_new ORDER BY 1")]
    return sorted(b.staging.staged_keys(table))


def _items(b: Build, table: str, ids: list[str]) -> Iterator[_Item]:
    reads = b.reads
    if table == "text_units":
        for uid, (unit, doc) in sorted(reads.unit_documents(ids).items()):
            yield _Item(uid, f"{doc.header()}\n{unit.unit.text}", (unit.acl,))
    elif table == "entities":
        for eid, (name, description, acl) in sorted(reads.entity_texts(ids).items()):
            yield _Item(eid, f"{name}: {description}", tuple(sorted(acl)))
    else:
        for cid, row in sorted(reads.reports(ids).items()):
            yield _Item(cid, row.report.full_text(), tuple(sorted(row.gate.acl)), row.report.level)


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
            missing = sorted({keys[it.id]: it.text for it in items if keys[it.id] not in cached}.items())
            if missing:
                got = await embedder.embed([text for _, text in missing])
                new = {k: np.asarray(v, dtype=np.float32).tobytes()
                       for (k, _), v in zip(missing, got, strict=True)}
                b.store.embeddings_put(new)
                cached.update(new)
                embedded += len(new)
            if not vectors.dims and cached:  # an endpoint tells its width with its first reply
                vectors.dims = len(next(iter(cached.values()))) // 4
            rows = [VectorRow(it.id, it.text, keys[it.id],
                              np.frombuffer(cached[keys[it.id]], dtype=np.float32), it.acl, it.level)
                    for it in items]
            vectors.write(table, [] if rebuild else batch, rows)
            advance(len(batch))
        vectors.maintain(table)
    return VectorOutcome(embedded, vectors.versions())


def tidy_search_tables(store: Store, storage: StorageSettings, *, changed: bool) -> None:
    """After a commit (or a run with nothing to do): fold appended rows into the search
    indexes when they are many, and, at most once per `keep_versions_s`, rewrite tables that
    still store deleted rows and prune old versions (canopy.vectors, `VectorStore.tidy`).
    A run that changed nothing opens the tables only when that is due and old versions
    remain (counted from their files, without importing lancedb)."""
    recorded = json.loads(store.get_meta("lance_versions", "{}") or "{}")
    versions = {name: int(v) for name, v in recorded.items()}
    if not versions:
        return
    keep = storage.keep_versions_s
    due = time.time() - float(store.get_meta("lance_tidied_at", "0") or 0) >= keep
    if not changed and not (due and stored_versions(store.index_dir) > len(versions)):
        return
    vectors = VectorStore(store.index_dir, 0)
    vectors.tidy(versions, timedelta(seconds=keep), due=due,
                 record=lambda v: store.set_meta({"lance_versions": json.dumps(v)}))
    if due:
        store.set_meta({"lance_tidied_at": str(time.time())})
