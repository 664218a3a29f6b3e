"""Local search: a question about particular entities, answered from their neighbourhood
(design §6; GraphRAG's mixed local context).

Query -> entities (exact names in the query, then a hybrid vector + full-text search over entity
descriptions) -> their relationships, claims, community reports and supporting text units, mixed
under one token budget by proportions -> one answer call over the cited blocks.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from canopy.ids import normalize_name
from canopy.model import Entity, Relationship, Report
from canopy.providers.base import ContextBlock, render_blocks
from canopy.vectors import rrf
from server.engines.common import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    pack_blocks,
)
from server.engines.serving import (
    block_citation,
    servable_claim,
    servable_entity,
    servable_relationship,
    servable_report,
    servable_unit,
)
from server.results import SearchResult
from server.service import QueryContext

__all__ = ["LocalContext", "build_local_context", "local_search", "report_block", "unit_block"]

TOP_ENTITIES = 10
TOP_UNITS_SEARCHED = 20
# Shares of the context budget (GraphRAG's community_prop / text_unit_prop); unused budget of
# one part passes to the next, in this order.
REPORT_SHARE = 0.25
GRAPH_SHARE = 0.25  # entities (at most half of it), then claims and relationships
# text units get the rest
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


async def local_search(
    ctx: QueryContext, query: str, *, response_type: str = "multiple paragraphs"
) -> SearchResult:
    """Answer a question about specific entities from their graph neighbourhood and sources."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    with metered(ctx) as meter:
        await ctx.report_progress(0, 2, "local search: gathering context")
        local = await build_local_context(ctx, query, budget=ctx.settings.local_context_tokens)
        await ctx.report_progress(1, 2, f"local search: answering from {len(local.blocks)} records")
        if local.blocks:
            answer = await ctx.provider.answer(query, local.blocks, response_type=response_type)
        else:
            answer = NOTHING_FOUND
        await ctx.report_progress(2, 2, "local search: done")
        result = SearchResult(method="local", query=query, answer=answer,
                              citations=[block_citation(b) for b in local.blocks],
                              context=render_blocks(local.blocks))
        name = repr(local.entities[0].name) if local.entities else "'<entity name>'"
        result = fit_result(ctx, result, more=(
            f"call drill_down(entity={name}) for one entity's community and sources, or ask "
            "local_search a narrower question."))
        result.usage = meter.info()
        return result


@dataclass
class LocalContext:
    entities: list[Entity]  # the selected entities, best first
    blocks: list[ContextBlock]  # reports, entities, relationships, claims, text units


async def build_local_context(ctx: QueryContext, query: str, *, budget: int) -> LocalContext:
    """The mixed local context of `query` within `budget` tokens (servable items only)."""
    vector = await ctx.view.embed_query(query)
    hidden = list(ctx.vis.hidden_acl)
    entities = _select_entities(ctx, query, vector, hidden)
    chosen = {e.id for e in entities}
    relationships = _relationships_of(ctx, chosen)
    reports = _reports_of(ctx, [e.id for e in entities])

    report_blocks, used = pack_blocks([report_block(r) for r in reports],
                                      int(budget * REPORT_SHARE))
    graph_budget = int(budget * (REPORT_SHARE + GRAPH_SHARE)) - used
    entity_blocks, used_entities = pack_blocks(_entity_blocks(entities), graph_budget // 2)
    graph_blocks, used_graph = pack_blocks(_relation_blocks(ctx, entities, relationships),
                                           graph_budget - used_entities)
    graph_blocks = entity_blocks + graph_blocks
    used += used_entities + used_graph

    included = [b.id for b in graph_blocks if b.kind in ("entity", "relationship")]
    support: Counter[str] = Counter()
    graph = ctx.view.graph
    for item_id in included:
        item = graph.entities.get(item_id) or graph.relationships.get(item_id)
        if item is not None:
            support.update(item.text_unit_ids)
    by_support = [u for u, _ in sorted(support.items(), key=lambda kv: (-kv[1], kv[0]))]
    hits = ctx.view.vectors.search("text_units", vector=vector, text=query, k=TOP_UNITS_SEARCHED,
                                   hidden_acl=hidden)
    ranked = [h.id for h in rrf(by_support, [h.id for h in hits])]
    units = [unit_block(ctx, u) for u in ranked if servable_unit(ctx, u) is not None]
    unit_blocks, _ = pack_blocks(units, budget - used)
    return LocalContext(entities, report_blocks + graph_blocks + unit_blocks)


def report_block(report: Report) -> ContextBlock:
    findings = [f"## {f.summary}\n{f.explanation}" for f in report.findings]
    return ContextBlock("report", report.community_id, report.title,
                        "\n\n".join([report.summary, *findings]))


def unit_block(ctx: QueryContext, unit_id: str) -> ContextBlock:
    """A servable text unit as a block titled by its document."""
    unit = ctx.view.units[unit_id]
    doc = ctx.view.document_of(unit_id)
    assert doc is not None
    return ContextBlock("text_unit", unit_id, doc.title, unit.text, source=doc.path)


def named_entities(ctx: QueryContext, query: str) -> list[str]:
    """Ids of servable entities whose (normalized) name occurs in the query as whole words;
    names written capitalized in the query first, then longer names first."""
    padded = f" {normalize_name(query)} "
    found: list[tuple[bool, int, str]] = []
    for name, eid in ctx.view.entity_by_name.items():
        if len(name) < 2:
            continue
        if not (name in padded if _CJK.search(name) else f" {name} " in padded):
            continue
        if servable_entity(ctx, eid) is None:
            continue
        pattern = r"\W+".join(re.escape(w) for w in name.split())
        written = re.search(pattern, query, re.IGNORECASE)
        proper = bool(written and (written.group(0)[:1].isupper() or _CJK.search(name)))
        found.append((not proper, -len(name), eid))
    return [eid for *_, eid in sorted(found)]


def _select_entities(ctx: QueryContext, query: str, vector: np.ndarray,
                     hidden: list[str]) -> list[Entity]:
    hits = ctx.view.vectors.search("entities", vector=vector, text=query, k=2 * TOP_ENTITIES,
                                   hidden_acl=hidden)
    ids = list(dict.fromkeys([*named_entities(ctx, query), *(h.id for h in hits)]))
    entities = [e for i in ids if (e := servable_entity(ctx, i)) is not None]
    return entities[:TOP_ENTITIES]


def _relationships_of(ctx: QueryContext, chosen: set[str]) -> list[Relationship]:
    """Relationships among the chosen entities (heaviest first), then those leading out of
    them, ranked by how many chosen entities the outside endpoint links to (GraphRAG)."""
    inside: list[Relationship] = []
    outside: list[tuple[Relationship, str]] = []
    links: Counter[str] = Counter()
    for r in ctx.view.graph.relationships.values():
        a, b = r.source in chosen, r.target in chosen
        if not (a or b) or servable_relationship(ctx, r.id) is None:
            continue
        if a and b:
            inside.append(r)
        else:
            other = r.target if a else r.source
            outside.append((r, other))
            links[other] += 1
    inside.sort(key=lambda r: (-r.weight, r.id))
    outside.sort(key=lambda ro: (-links[ro[1]], -ro[0].weight, ro[0].id))
    return inside + [r for r, _ in outside]


def _reports_of(ctx: QueryContext, entity_ids: list[str]) -> list[Report]:
    """Servable reports of the communities holding the entities: most entities first, then by
    rating, then deeper (more specific) first."""
    count: Counter[str] = Counter()
    for e in entity_ids:
        count.update(ctx.view.communities_of.get(e, []))
    reports = [r for cid in count if (r := servable_report(ctx, cid)) is not None]
    return sorted(reports,
                  key=lambda r: (-count[r.community_id], -r.rating, -r.level, r.community_id))


def _entity_blocks(entities: list[Entity]) -> list[ContextBlock]:
    return [ContextBlock("entity", e.id, e.name, e.description) for e in entities]


def _relation_blocks(ctx: QueryContext, entities: list[Entity],
                     relationships: list[Relationship]) -> list[ContextBlock]:
    """Claims about the entities, then relationships (packing stops at the first block that
    does not fit, so the few claims go before the many relationships)."""
    names = {e.id: e.name for e in ctx.view.graph.entities.values()}
    chosen = {e.id for e in entities}
    blocks = []
    for c in sorted(ctx.view.graph.claims.values(), key=lambda c: c.id):
        if (c.subject in chosen or c.object in chosen) and servable_claim(ctx, c.id) is not None:
            blocks.append(ContextBlock("claim", c.id, f"{names.get(c.subject, c.subject)}: "
                                       f"{c.type} ({c.status})", c.description))
    blocks += [ContextBlock("relationship", r.id, f"{names[r.source]} — {names[r.target]}",
                            r.description) for r in relationships]
    return blocks
