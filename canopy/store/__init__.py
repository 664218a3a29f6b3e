"""The index store: SQLite (WAL) as the source of truth, read on demand through indexes.

- `Store`: one index folder's database; snapshots for readers, caches, extraction instances.
- `Snapshot` / `GraphReads`: batched reads of one generation (canopy.store.reads).
- `Staging`: the generation the writer is building, swapped in atomically (canopy.store.staging).
- Row types (`EntityRow`, ...) carry each artifact with its provenance `Gate` (canopy.store.rows).
"""

from canopy.store.reads import COMMITTED, GraphReads, Tables
from canopy.store.rows import (
    ClaimRow,
    CommunityRow,
    DocumentRow,
    Edge,
    EntityRow,
    Gate,
    RelationshipRow,
    ReportRow,
    UnitRow,
)
from canopy.store.staging import CommitInfo, Staging
from canopy.store.store import DB_NAME, RunRecord, Snapshot, Store

__all__ = [
    "COMMITTED",
    "DB_NAME",
    "ClaimRow",
    "CommitInfo",
    "CommunityRow",
    "DocumentRow",
    "Edge",
    "EntityRow",
    "Gate",
    "GraphReads",
    "RelationshipRow",
    "ReportRow",
    "RunRecord",
    "Snapshot",
    "Staging",
    "Store",
    "Tables",
    "UnitRow",
]
