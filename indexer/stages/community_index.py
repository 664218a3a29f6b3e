"""Serving's orderings of each community's contents, staged for what the change touched (the
same thing at two depths: canopy.store.community_index derives the rows in SQL).

A relationship's community_edges rows depend on its weight and on its endpoints' communities; a
member's member_ranks rows on its degree, name and communities. So an update rewrites the rows
of the relationships and entities it wrote or removed, and of every entity whose communities
changed (with the relationships incident to it): the members that differ between the committed
and the new membership of each community the hierarchy update rewrote or deleted. A community
whose members stayed put keeps its rows, however large it is.
"""

from __future__ import annotations

from canopy.indexer.stages.build import Build
from canopy.indexer.stages.communities import HierarchyDelta
from canopy.indexer.stages.graph import GraphDelta
from canopy.store.community_index import fill_edges, fill_ranks

__all__ = ["stage_community_index"]


def stage_community_index(b: Build, g: GraphDelta, h: HierarchyDelta) -> None:
    staging, t = b.staging, b.reads.t
    if b.full:
        fill_edges(staging.db, t, "stage.community_edges")
        fill_ranks(staging.db, t, "stage.member_ranks")
        return
    moved = moved_entities(b, h.written | h.deleted)
    entities = g.entities | g.removed_entities | moved
    relationships = g.relationships | g.removed_relationships
    relationships |= {r for rs in b.reads.relationship_ids_of(moved).values() for r in rs}
    staging.delete("community_edges", relationships)
    staging.delete("member_ranks", entities)
    fill_edges(staging.db, t, "stage.community_edges", relationships)
    fill_ranks(staging.db, t, "stage.member_ranks", entities)


def moved_entities(b: Build, communities: set[str]) -> set[str]:
    """Entities that joined or left any of these communities in the new generation."""
    ids = sorted(communities)
    before = b.committed.members(ids)
    after = b.reads.members(ids)
    out: set[str] = set()
    for cid in ids:
        out |= set(before.get(cid, ())) ^ set(after.get(cid, ()))
    return out
