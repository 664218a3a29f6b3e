"""Rows of community_edges and member_ranks (schema: _COMMUNITY_INDEX_DDL), derived in SQL.

A relationship has one community_edges row per community holding both its endpoints (at most
one per level), with its weight; a member has one member_ranks row per community holding it,
with its degree and name. Serving pages through them in index order (canopy.store.reads:
`community_edge_page`, `ranked_member_page`). The rows are a function of the relationships,
entities and memberships of a generation: a full build derives them all, an update those of
the relationships and entities it touched (canopy.indexer.stages.community_index: the same
thing at two depths, the stage that asks for them).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable

from canopy.store.reads import _IN, Tables, _ids

__all__ = ["fill_edges", "fill_ranks"]


def fill_edges(db: sqlite3.Connection, t: Tables, dst: str,
               relationship_ids: Iterable[str] | None = None) -> None:
    """Insert into `dst` the community_edges rows of these relationships (every one when None),
    read from `t`'s relationships and memberships."""
    where, args = _only("r.id", relationship_ids)
    db.execute(
        f"INSERT INTO {dst} (relationship_id, community_id, weight) "  # noqa: S608
        f"SELECT r.id, a.community_id, r.weight FROM {t.relationships} r "
        f"JOIN {t.community_members} a ON a.entity_id = r.source "
        f"JOIN {t.community_members} b ON b.community_id = a.community_id "
        f"AND b.entity_id = r.target{where}", args)


def fill_ranks(db: sqlite3.Connection, t: Tables, dst: str,
               entity_ids: Iterable[str] | None = None) -> None:
    """Insert into `dst` the member_ranks rows of these entities (every one when None)."""
    where, args = _only("e.id", entity_ids)
    db.execute(
        f"INSERT INTO {dst} (entity_id, community_id, degree, name) "  # noqa: S608
        f"SELECT e.id, m.community_id, e.degree, e.name "
        f"FROM {t.entities} e JOIN {t.community_members} m ON m.entity_id = e.id{where}", args)


def _only(column: str, ids: Iterable[str] | None) -> tuple[str, tuple[str, ...]]:
    if ids is None:
        return "", ()
    return f" WHERE {column} {_IN}", (_ids(ids),)
