"""LanceDB tables for vector and full-text (BM25) retrieval; derived data, rebuilt from SQLite.

Three tables - `text_units`, `entities`, `reports` - share one schema. Each row carries the
text-unit ids it derives from and its ACL classes (the distinct label sets of those units), so
retrieval can *prefilter* by what a caller may read before ranking (design §5): scores, counts and
top-k never reflect hidden rows.

Hybrid retrieval fuses the vector and full-text rankings with reciprocal rank fusion. Table
versions are recorded with each committed generation; readers check out those versions, so a
half-written update is never visible.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa

__all__ = ["Hit", "TABLES", "VectorRow", "VectorStore", "acl_class", "rrf"]

log = logging.getLogger(__name__)
TABLES = ("text_units", "entities", "reports")
_RRF_K = 60
_WORD = re.compile(r"\w+", re.UNICODE)  # FTS query syntax characters are dropped, words kept


@dataclass(frozen=True)
class VectorRow:
    id: str
    text: str  # what is embedded and full-text indexed
    hash: str  # content hash of `text` (+ model); a changed hash replaces the row
    vector: np.ndarray
    unit_ids: tuple[str, ...]
    acl: tuple[str, ...]
    level: int = -1


@dataclass(frozen=True)
class Hit:
    id: str
    score: float


def acl_class(labels: tuple[str, ...]) -> str:
    """Canonical key of one label set ("" = unrestricted)."""
    return "+".join(sorted(labels))


def _schema(dims: int) -> pa.Schema:
    return pa.schema([
        ("id", pa.string()), ("text", pa.string()), ("hash", pa.string()),
        ("vector", pa.list_(pa.float32(), dims)), ("unit_ids", pa.list_(pa.string())),
        ("acl", pa.list_(pa.string())), ("level", pa.int32()),
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


def _quote(values: list[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


class VectorStore:
    def __init__(self, index_dir: Path, dims: int) -> None:
        self.path = index_dir / "lance"
        self.dims = dims
        self._db = lancedb.connect(str(self.path))
        self._tables: dict[str, lancedb.table.Table] = {}

    def _table(self, name: str, create: bool = False) -> lancedb.table.Table | None:
        if name not in self._tables:
            if name in self._db.list_tables().tables:
                self._tables[name] = self._db.open_table(name)
            elif create:
                self._tables[name] = self._db.create_table(name, schema=_schema(self.dims))
            else:
                return None
        return self._tables[name]

    # ---- writing --------------------------------------------------------------------------

    def existing_hashes(self, name: str) -> dict[str, str]:
        t = self._table(name)
        if t is None:
            return {}
        t.checkout_latest()
        data = t.to_arrow().select(["id", "hash"]).to_pydict()
        return dict(zip(data["id"], data["hash"], strict=True))

    def sync(self, name: str, wanted: dict[str, str], rows: list[VectorRow]) -> int:
        """Make table `name` hold exactly the ids in `wanted` (id -> hash); `rows` carries the
        new or changed rows. Idempotent, so a crash between sync and commit is repaired by rerun.
        Returns the table version to record with the generation."""
        t = self._table(name, create=True)
        assert t is not None
        t.checkout_latest()
        have = self.existing_hashes(name)
        stale = [i for i, h in have.items() if wanted.get(i) != h]
        for i in range(0, len(stale), 500):
            t.delete(f"id IN ({_quote(stale[i:i + 500])})")
        if rows:
            t.add(pa.Table.from_pylist([
                {"id": r.id, "text": r.text, "hash": r.hash, "vector": r.vector.astype(np.float32),
                 "unit_ids": list(r.unit_ids), "acl": list(r.acl), "level": r.level}
                for r in rows
            ], schema=_schema(self.dims)))
        if stale or rows or not t.list_indices():
            t.create_fts_index("text", replace=True)
        return int(t.version)

    def delete_derived_from(self, unit_ids: list[str]) -> dict[str, int]:
        """Drop every row derived from any of these units (revocation before regeneration);
        returns the new table versions."""
        versions: dict[str, int] = {}
        for name in TABLES:
            t = self._table(name)
            if t is None:
                continue
            t.checkout_latest()
            for i in range(0, len(unit_ids), 200):
                t.delete(f"array_has_any(unit_ids, [{_quote(unit_ids[i:i + 200])}])")
            versions[name] = int(t.version)
        return versions

    # ---- reading --------------------------------------------------------------------------

    def checkout(self, versions: dict[str, int]) -> None:
        for name, version in versions.items():
            t = self._table(name)
            if t is not None and t.version != version:
                t.checkout(version)

    def search(
        self,
        name: str,
        *,
        vector: np.ndarray | None,
        text: str | None,
        k: int,
        hidden_acl: list[str] | None = None,
        level: int | None = None,
        exclude_units: list[str] | None = None,
        vector_weight: float = 1.0,
    ) -> list[Hit]:
        """Hybrid top-k over rows the caller may see (prefiltered), fused by RRF.

        `vector_weight` scales the vector ranking against the full-text one (1: equal). A
        lexical embedder such as the builtin one is best given a small weight: its ranking then
        orders the rows full-text search missed, after those it found."""
        t = self._table(name)
        if t is None or k <= 0:
            return []
        clauses = []
        if hidden_acl:
            clauses.append(f"NOT array_has_any(acl, [{_quote(hidden_acl)}])")
        if exclude_units:
            clauses.append(f"NOT array_has_any(unit_ids, [{_quote(exclude_units)}])")
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
