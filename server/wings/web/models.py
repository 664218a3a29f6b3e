"""What the web view's JSON endpoints return (`/ui/api/...`): the caller's community hierarchy,
one community with its entity graph, one entity with its source excerpts.

Every count here is a count of what exists for the caller (served through canopy.acl.reader): sizes
are visible member entities, degrees visible relationships, never a total with hidden items.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from canopy.server.results import CommunityCard, EntityCard, FindingCard

__all__ = [
    "CommunityNode",
    "CommunityPage",
    "EntityPage",
    "Excerpt",
    "GraphEdge",
    "GraphNode",
    "Hierarchy",
    "Neighbour",
]


class CommunityNode(BaseModel):
    """One community of the caller's hierarchy (a sunburst arc), with the sub-communities the
    answer reaches (all of them, or the first ones, or none where it stops)."""

    id: str
    level: int
    title: str
    rating: float | None = None
    size: int = Field(description="Member entities that exist for the caller")
    children: list[CommunityNode] = Field(default_factory=list)
    children_count: int = Field(0, description="Sub-communities the caller sees, in `children` "
                                               "or not")
    next_offset: int | None = Field(None, description="Where the sub-communities not in "
                                                      "`children` start (`?root=ID&offset=N`); "
                                                      "None when all are there")


class Hierarchy(BaseModel):
    """The caller's hierarchy from the top, or from one community (`root`), to a bounded depth."""

    index: str = Field(description="Name of the indexed folder")
    caller: str | None = Field(None, description="Who the page is shown to (None: the local "
                                                 "user of an index without a policy)")
    root: str | None = Field(None, description="The community asked for; None: the top")
    depth: int = Field(description="Levels filled in below each of `roots`")
    communities: int | None = Field(description="Communities the caller sees in the whole "
                                                "index (in the top's answer only)")
    entities: int = Field(description="Entities the caller can see: all top-level communities' "
                                      "sizes summed, or the root's size")
    roots: list[CommunityNode] = Field(description="Top-level communities from `offset` on, "
                                                   "or the root alone")
    roots_count: int = Field(description="All top-level communities the caller sees (1 for "
                                         "a root)")
    next_offset: int | None = Field(None, description="Where the top-level communities not "
                                                      "in `roots` start; None when all are "
                                                      "there")


class GraphNode(BaseModel):
    id: str
    name: str
    type: str
    degree: int = Field(description="The caller's relationships of this entity (any community)")


class GraphEdge(BaseModel):
    id: str
    source: str = Field(description="Entity id")
    target: str = Field(description="Entity id")
    weight: float
    description: str


class CommunityPage(BaseModel):
    """A community's report, a page of its sub-communities, and the graph of its
    best-connected members."""

    community: CommunityCard
    parents: list[CommunityCard] = Field(description="Root first, down to the parent")
    children: list[CommunityCard] = Field(description="Sub-communities from `?offset=N` on (at "
                                                      "most `?limit=N`), in the tree's order")
    children_count: int = Field(description="Sub-communities the caller sees, in `children` "
                                            "or not")
    next_offset: int | None = Field(None, description="Where the sub-communities not in "
                                                      "`children` start (`?offset=N`); None "
                                                      "when all are there")
    rating_explanation: str
    findings: list[FindingCard]
    nodes: list[GraphNode] = Field(description="Top members by degree (a bounded number)")
    edges: list[GraphEdge] = Field(description="Relationships among the shown members")
    members: int = Field(description="All members that exist for the caller")


class Neighbour(BaseModel):
    """A relationship of an entity, seen from that entity."""

    id: str
    entity_id: str = Field(description="The other end")
    entity: str
    description: str
    weight: float


class Excerpt(BaseModel):
    """A window of one source text unit around the entity's mentions."""

    text_unit_id: str
    document: str
    char_start: int = Field(description="Span of the whole unit in its document")
    char_end: int
    text: str = Field(description="The excerpt ('…' marks cut ends)")
    marks: list[tuple[int, int]] = Field(
        default_factory=list, description="[start, end) of each mention within `text`")


class EntityPage(BaseModel):
    entity: EntityCard
    communities: list[CommunityCard] = Field(description="The entity's communities, root first")
    relationships: list[Neighbour] = Field(description="Heaviest first")
    n_relationships: int
    sources: list[Excerpt]
    n_sources: int = Field(description="Source text units the caller may read")


class EntityMatches(BaseModel):
    """Entities the caller can see whose name matches a search of the graph explorer."""

    query: str
    entities: list[GraphNode] = Field(description="An exact name first, then by text match")


class Ask(BaseModel):
    """A question from the page's query box (POST /ui/api/ask)."""

    query: str = Field(min_length=1, max_length=4000)
    mode: Literal["auto", "global", "local", "drift", "basic"] = Field(
        "auto", description="auto: the router of the `search` tool picks the engine")
