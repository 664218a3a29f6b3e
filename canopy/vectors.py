"""LanceDB tables for vector and full-text (BM25) retrieval: derived data, rebuilt from SQLite.

Three tables - `text_units`, `entities`, `reports` - share one schema. Each row carries the ACL
classes of the units it derives from, so retrieval *prefilters* by what a caller may read before
ranking (design §5): scores, counts and top-k never reflect hidden rows.

Writes are diffs (rows of changed artifacts deleted and added); rows appended since the last
index optimization are searched by a flat scan until `maintain` folds them into the full-text
index, which happens when they pass a share of the table. Every committed generation records
the table versions it was written with; readers check out exactly those (`reader`), and a
writer first rolls the tables back to the committed versions (`restore`), so a crashed update
leaves nothing behind that a later one could duplicate.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

# lancedb and pyarrow are imported where tables are opened: importing them takes seconds, and
# commands that never touch the search tables (status, token, the HTTP supervisor) skip that.

__all__ = ["TABLES", "Hit", "VectorReader", "VectorRow", "VectorStore", "rrf"]

log = logging.getLogger(__name__)
TABLES = ("text_units", "entities", "reports")
_RRF_K = 60
_WORD = re.compile(r"\w+", re.UNICODE)  # FTS query syntax characters are dropped, words kept
# Unindexed rows are scanned flat: fold them into the FTS index past this share of the table.
_UNINDEXED_SHARE = 0.1
_UNINDEXED_MIN = 2000
_KEEP_VERSIONS = timedelta(hours=1)  # readers hold a generation's versions for one request
# A table this large gets an IVF vector index (exact distances within the probed partitions):
# a flat scan of 380,000 rows x 384 dims takes about a second, the index answers in ~10 ms and
# builds in ~20 s. Below it a flat scan is fast enough.
VECTOR_INDEX_MIN = 20_000


@dataclass(frozen=True)
class VectorRow:
    id: str
    text: str  # what is embedded and full-text indexed
    hash: str  # content hash of the row (text, model, ACL classes)
    vector: np.ndarray
    acl: tuple[int, ...]  # ACL classes of the units the row derives from
    level: int = -1


@dataclass(frozen=True)
class Hit:
    id: str
    score: float


def _schema(dims: int) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()), ("text", pa.string()), ("hash", pa.string()),
        ("vector", pa.list_(pa.float32(), dims)), ("acl", pa.list_(pa.int32())),
        ("level", pa.int32()),
    ])


def rrf(*rankings: list[str], k: int = _RRF_K, weights: list[float] | None = None) -> list[Hit]:
    """Reciprocal rank fusion of several ranked id lists (ties broken by id); `weights` scale
    each ranking's contribution (default 1 each)."""
    scores: dict[str, float] = {}
    for i, ranking in enumerate(rankings):
        w = 1.0 if weights is None else weights[i]
        for rank, rid in enumerate(ranking):
            scores[rid] = scores.get(rid, 0.0) + w / (k + rank + 1)
    return [Hit(i, s) for i, s in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def _quote(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


class VectorStore:
    """The LanceDB tables of one index folder (the writer's side, and readers' factory)."""

    def __init__(self, index_dir: Path, dims: int, *, cache_bytes: int | None = None) -> None:
        """`cache_bytes`: what LanceDB may keep of index and table metadata in memory (its
        defaults allow gigabytes); None keeps its defaults (one-off index runs)."""
        self.path = Path(index_dir) / "lance"
        self.dims = dims
        import lancedb

        session = None
        if cache_bytes is not None:
            session = lancedb.Session(index_cache_size_bytes=cache_bytes * 3 // 4,
                                      metadata_cache_size_bytes=cache_bytes // 4)
        self._db = lancedb.connect(str(self.path), session=session)
        self._local = threading.local()
        self._clearing: set[str] = set()

    def _table(self, name: str) -> Any | None:
        if name in self._db.list_tables().tables:
            return self._db.open_table(name)
        return None

    # ---- writing --------------------------------------------------------------------------

    def restore(self, versions: dict[str, int]) -> None:
        """Roll each table back to the version its committed generation recorded (tables the
        generation does not know are dropped): what a crashed update wrote is undone."""
        for name in TABLES:
            t = self._table(name)
            if t is None:
                continue
            version = versions.get(name)
            if version is None:
                self._db.drop_table(name)
            elif t.version != version:
                t.restore(version)

    def clear(self) -> None:
        """Empty every table before this writer's first write to it (a full rebuild). Rows are
        deleted rather than tables dropped, so readers of the committed versions carry on; a
        table whose vectors have another width (another embedder) is dropped."""
        self._clearing = set(TABLES)

    def _clear(self, name: str, t: Any) -> Any:
        self._clearing.discard(name)
        width = t.schema.field("vector").type.list_size if t is not None else None
        if t is not None and width == self.dims:
            t.delete("true")
            return t
        if t is not None:
            self._db.drop_table(name)
        return self._db.create_table(name, schema=_schema(self.dims)) if self.dims else None

    def write(self, name: str, delete: Iterable[str], rows: list[VectorRow]) -> None:
        """Delete rows with these ids, then add `rows` (ids of changed rows appear in both)."""
        t = self._table(name)
        if name in self._clearing:
            t = self._clear(name, t)
        if t is None:
            if not rows or not self.dims:
                return
            t = self._db.create_table(name, schema=_schema(self.dims))
        ids = sorted(set(delete))
        for i in range(0, len(ids), 500):
            t.delete(f"id IN ({_quote(ids[i:i + 500])})")
        import pyarrow as pa

        for i in range(0, len(rows), 5000):
            t.add(pa.Table.from_pylist([
                {"id": r.id, "text": r.text, "hash": r.hash, "vector": r.vector.astype(np.float32),
                 "acl": list(r.acl), "level": r.level} for r in rows[i:i + 5000]
            ], schema=_schema(self.dims)))

    def maintain(self, name: str) -> None:
        """Keep the table's indexes current: create the full-text index (and, once the table is
        large, a vector index), or fold appended rows into them once they are many."""
        t = self._table(name)
        if t is None:
            return
        rows = t.count_rows()
        indices = {tuple(i.columns): i for i in t.list_indices()}
        created = False
        if ("text",) not in indices and rows:
            t.create_fts_index("text", replace=True)
            created = True
        if ("vector",) not in indices and rows >= VECTOR_INDEX_MIN:
            from lancedb.index import IvfFlat

            partitions = max(16, int(rows ** 0.5))
            t.create_index("vector", config=IvfFlat(distance_type="l2", num_partitions=partitions))
            created = True
        if created:
            return
        unindexed = max((i.num_unindexed_rows or 0 for i in indices.values()), default=0)
        if unindexed > max(_UNINDEXED_MIN, _UNINDEXED_SHARE * rows):
            t.optimize(cleanup_older_than=_KEEP_VERSIONS)

    def versions(self) -> dict[str, int]:
        """The tables' current versions (tables still waiting to be cleared are cleared)."""
        for name in sorted(self._clearing):
            self._clear(name, self._table(name))
        out = {}
        for name in TABLES:
            t = self._table(name)
            if t is not None:
                out[name] = int(t.version)
        return out

    # ---- reading --------------------------------------------------------------------------

    def reader(self, versions: dict[str, int]) -> VectorReader:
        """This thread's reader of the tables at these versions (one generation)."""
        key = tuple(sorted(versions.items()))
        cached = getattr(self._local, "reader", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        tables = {}
        for name, version in versions.items():
            t = self._table(name)
            if t is not None:
                t.checkout(version)
                tables[name] = t
        reader = VectorReader(tables)
        self._local.reader = (key, reader)
        return reader


class VectorReader:
    """Hybrid search over tables checked out at one generation's versions."""

    def __init__(self, tables: dict[str, Any]) -> None:
        self.tables = tables

    def search(
        self,
        name: str,
        *,
        vector: np.ndarray | None,
        text: str | None,
        k: int,
        hidden_acl: Iterable[int] = (),
        level: int | None = None,
        vector_weight: float = 1.0,
    ) -> list[Hit]:
        """Top-k over rows the caller may see (prefiltered on ACL classes), vector and
        full-text rankings fused by RRF. `vector_weight` scales the vector ranking against the
        full-text one (1: equal); a lexical embedder such as the builtin one is best given a
        small weight: its ranking then orders the rows full-text search missed."""
        t = self.tables.get(name)
        if t is None or k <= 0:
            return []
        clauses = []
        hidden = sorted(set(hidden_acl))
        if hidden:
            clauses.append(f"NOT array_has_any(acl, [{', '.join(map(str, hidden))}])")
        if level is not None:
            clauses.append(f"level = {int(level)}")
        where = " AND ".join(clauses) or None
        rankings: list[list[str]] = []
        weights: list[float] = []
        if vector is not None:
            q = t.search(vector.astype(np.float32), query_type="vector").limit(k).select(["id", "_distance"])
            if where:
                q = q.where(where, prefilter=True)
            rankings.append([r["id"] for r in q.to_list()])
            weights.append(vector_weight)
        words = " ".join(_WORD.findall(text or ""))
        if words:
            try:
                q = t.search(words, query_type="fts").limit(k).select(["id", "_score"])
                if where:
                    q = q.where(where, prefilter=True)
                rankings.append([r["id"] for r in q.to_list()])
                weights.append(1.0)
            except Exception as exc:  # e.g. a query made only of FTS syntax characters
                log.debug("full-text search skipped: %s", exc)
        return rrf(*rankings, weights=weights)[:k]
