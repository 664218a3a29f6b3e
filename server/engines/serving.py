"""The serving rule at query time (design §2), and the cards and citations built from it.

> An artifact is served to a caller only if every text unit it was derived from is live and
> readable by that caller.

Every engine reads the graph through the `servable_*` hooks below and nothing else, so the rule
is applied in one place. A hook answers None for a hidden artifact exactly as for a missing one.
Per-caller *views* (design §2, "fallback views") will extend `servable_report` and
`servable_entity`: they are the two hooks that may someday return a view instead of None.
"""

from __future__ import annotations

from collections.abc import Iterable

from canopy.model import Claim, Community, Entity, Relationship, Report, TextUnit
from canopy.providers.base import ContextBlock
from server.results import (
    Citation,
    CommunityCard,
    EntityCard,
    FindingCard,
    RelationshipCard,
    SourceSpan,
)
from server.service import QueryContext

__all__ = [
    "block_citation",
    "community_card",
    "entity_card",
    "finding_card",
    "relationship_card",
    "root_ids",
    "servable_claim",
    "servable_entity",
    "servable_relationship",
    "servable_report",
    "servable_tops",
    "servable_unit",
    "span_of",
]


# ---- the hooks ------------------------------------------------------------------------------


def servable_report(ctx: QueryContext, community_id: str) -> Report | None:
    """The community's report if the caller may read it: current (its fingerprint matches the
    community's, so it is not stale) and derived only from live units the caller can read."""
    graph = ctx.view.graph
    report = graph.reports.get(community_id)
    community = graph.communities.get(community_id)
    if report is None or community is None or report.fingerprint != community.fingerprint:
        return None
    return report if ctx.vis.can_see(report.text_unit_ids) else None


def servable_entity(ctx: QueryContext, entity_id: str) -> Entity | None:
    entity = ctx.view.graph.entities.get(entity_id)
    return entity if entity is not None and ctx.vis.can_see(entity.text_unit_ids) else None


def servable_relationship(ctx: QueryContext, relationship_id: str) -> Relationship | None:
    """A relationship is shown with its endpoints' names, so both endpoints must be servable."""
    rel = ctx.view.graph.relationships.get(relationship_id)
    if rel is None or not ctx.vis.can_see(rel.text_unit_ids):
        return None
    if servable_entity(ctx, rel.source) is None or servable_entity(ctx, rel.target) is None:
        return None
    return rel


def servable_claim(ctx: QueryContext, claim_id: str) -> Claim | None:
    claim = ctx.view.graph.claims.get(claim_id)
    if claim is None or not ctx.vis.can_see(claim.text_unit_ids):
        return None
    if servable_entity(ctx, claim.subject) is None:
        return None
    obj = claim.object
    if obj and obj in ctx.view.graph.entities and servable_entity(ctx, obj) is None:
        return None
    return claim


def servable_unit(ctx: QueryContext, unit_id: str) -> TextUnit | None:
    unit = ctx.view.units.get(unit_id)
    if unit is None or ctx.view.document_of(unit_id) is None or not ctx.vis.can_see([unit_id]):
        return None
    return unit


def servable_tops(ctx: QueryContext, community_ids: Iterable[str]) -> list[str]:
    """The given communities where servable, else their nearest servable descendants.

    A report covers a subset of its community's units, so a hidden parent may have visible
    children; they take its place, and navigation never dead-ends at a hidden node."""
    out: list[str] = []
    stack = sorted(community_ids, reverse=True)
    communities = ctx.view.graph.communities
    while stack:
        cid = stack.pop()
        if servable_report(ctx, cid) is not None:
            out.append(cid)
        elif cid in communities:
            stack.extend(reversed(communities[cid].children))
    return out


def root_ids(ctx: QueryContext) -> list[str]:
    """The tops of the caller's servable hierarchy: level-0 communities, or where hidden, their
    servable descendants."""
    roots = [c.id for c in ctx.view.graph.communities.values() if c.parent is None]
    return servable_tops(ctx, roots)


# ---- cards and citations --------------------------------------------------------------------


def community_card(ctx: QueryContext, report: Report) -> CommunityCard:
    community: Community = ctx.view.graph.communities[report.community_id]
    size = sum(1 for e in community.entity_ids if servable_entity(ctx, e) is not None)
    return CommunityCard(id=report.community_id, level=report.level, title=report.title,
                         summary=report.summary, rating=report.rating, size=size)


def finding_card(ctx: QueryContext, index: int, report: Report) -> FindingCard:
    f = report.findings[index]
    return FindingCard(
        summary=f.summary, explanation=f.explanation,
        entity_ids=[e for e in f.entity_ids if servable_entity(ctx, e) is not None],
        relationship_ids=[r for r in f.relationship_ids
                          if servable_relationship(ctx, r) is not None],
        text_unit_ids=[u for u in f.text_unit_ids if servable_unit(ctx, u) is not None],
    )


def entity_card(entity: Entity) -> EntityCard:
    return EntityCard(id=entity.id, name=entity.name, type=entity.type,
                      description=entity.description, degree=entity.degree)


def relationship_card(ctx: QueryContext, rel: Relationship) -> RelationshipCard:
    """Only for servable relationships (whose endpoints are servable)."""
    entities = ctx.view.graph.entities
    return RelationshipCard(id=rel.id, source=entities[rel.source].name,
                            target=entities[rel.target].name, description=rel.description,
                            weight=rel.weight)


def span_of(ctx: QueryContext, unit: TextUnit) -> SourceSpan:
    """The unit's own span of its document: `text` is document[char_start:char_end] (a unit's
    text starts with an overlap prefix from the previous unit, which is not part of the span)."""
    doc = ctx.view.document_of(unit.id)
    assert doc is not None  # servable units have a document
    own = unit.char_end - unit.char_start
    text = unit.text[len(unit.text) - own:] if 0 < own <= len(unit.text) else unit.text
    return SourceSpan(text_unit_id=unit.id, document=doc.path, char_start=unit.char_start,
                      char_end=unit.char_end, text=text)


def block_citation(block: ContextBlock) -> Citation:
    return Citation(kind=block.kind, id=block.id, title=block.title,
                    document=block.source or None)
