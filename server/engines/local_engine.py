"""Local search: a question about particular entities, answered from their neighbourhood
(design §6; GraphRAG's mixed local context).

Query -> entities (names written in the query, then a hybrid vector + full-text search over entity
descriptions) -> their relationships, claims, community reports and supporting text units, mixed
under one token budget by proportions -> one answer call over the cited blocks.

Text units: the units supporting the selected entities and relationships join the candidates of
a full-text and vector search for the question and for each of its clauses; all are ranked by how
well they state what the question asks (server/engines/evidence.py). Multi-hop questions need
several articles, so the first DIVERSE_DOCS units come from distinct documents, and every unit
longer than its share of the text budget is cut to its sentences that best match the question:
CONTEXT_UNITS units fit the default budget instead of ~4 whole ones. Measured on MultiHop-RAG by
benchmarks/retrieval_eval.py.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

from canopy.ids import normalize_name
from canopy.model import Entity, Relationship, Report
from canopy.providers.base import ContextBlock, render_blocks
from server.engines.common import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    pack_blocks,
)
from server.engines.evidence import excerpt, per_view, rank_units
from server.engines.serving import (
    block_citation,
    entity_name,
    servable_claim,
    servable_entity,
    servable_relationship,
    servable_report,
    servable_unit,
    settle_views,
)
from server.results import SearchResult
from server.service import QueryContext

__all__ = ["LocalContext", "build_local_context", "local_search", "report_block", "unit_block"]

TOP_ENTITIES = 10
SUPPORT_UNITS = 30  # units behind the selected entities and relationships that join the ranking
DIVERSE_DOCS = 10  # the first units of the context come from this many distinct documents
CONTEXT_UNITS = 12  # units the text-unit share is divided among (longer units are excerpted)
MIN_EXCERPT_TOKENS = 150
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
    for item_id in included:  # as served: a view's provenance is the caller's visible units
        item = servable_entity(ctx, item_id) or servable_relationship(ctx, item_id)
        if item is not None:
            support.update(item.text_unit_ids)
    by_support = [u for u, _ in sorted(support.items(), key=lambda kv: (-kv[1], kv[0]))]
    ranked = rank_units(ctx, query, vector, support=by_support[:SUPPORT_UNITS])
    units = _diverse(ctx, [u for u in ranked if servable_unit(ctx, u) is not None])
    text_budget = budget - used
    share = max(MIN_EXCERPT_TOKENS, text_budget // CONTEXT_UNITS)
    blocks = [unit_block(ctx, u, text=excerpt(ctx, u, query, share))
              for u in units[:max(1, text_budget // MIN_EXCERPT_TOKENS)]]
    unit_blocks, _ = pack_blocks(blocks, text_budget)
    await settle_views(ctx)  # views found missing: built, then this call runs again
    return LocalContext(entities, report_blocks + graph_blocks + unit_blocks)


def _diverse(ctx: QueryContext, ranked: list[str]) -> list[str]:
    """`ranked` with the best unit of each of the first DIVERSE_DOCS documents first."""
    head: list[str] = []
    tail: list[str] = []
    docs: set[str] = set()
    for u in ranked:
        doc = ctx.view.units[u].document_id
        if doc not in docs and len(docs) < DIVERSE_DOCS:
            docs.add(doc)
            head.append(u)
        else:
            tail.append(u)
    return head + tail


def report_block(report: Report) -> ContextBlock:
    findings = [f"## {f.summary}\n{f.explanation}" for f in report.findings]
    return ContextBlock("report", report.community_id, report.title,
                        "\n\n".join([report.summary, *findings]))


def unit_block(ctx: QueryContext, unit_id: str, *, text: str | None = None) -> ContextBlock:
    """A servable text unit as a block titled by its document and the document's metadata, so
    the answer can say which source and date a fact comes from (`text`: an excerpt of it)."""
    unit = ctx.view.units[unit_id]
    doc = ctx.view.document_of(unit_id)
    assert doc is not None
    return ContextBlock("text_unit", unit_id, doc.label(), unit.text if text is None else text,
                        source=doc.path)


def named_entities(ctx: QueryContext, query: str) -> list[str]:
    """Ids of servable entities whose (normalized) name occurs in the query as whole words;
    names written capitalized in the query first, then longer names first. A name found only
    inside a longer found name ("Verge" in "The Verge") is left out."""
    return [eid for eid, _ in _named(ctx, query)]


def _named(ctx: QueryContext, query: str) -> list[tuple[str, bool]]:
    """named_entities with, for each, whether the query writes it capitalized (or in CJK)."""
    names = per_view(ctx, "entity_names", lambda: _NameIndex(ctx.view.entity_by_name))
    normalized = normalize_name(query)
    words = normalized.split()
    spans: list[tuple[int, int, str]] = []  # word positions [start, end); -1 for CJK names
    for n in range(min(names.longest, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            name = " ".join(words[i:i + n])
            if len(name) >= 2 and name in names.latin:
                spans.append((i, i + n, name))
    if _CJK.search(query):
        spans += [(-1, -1, name) for name in names.cjk if name in normalized]
    found: list[tuple[bool, int, str]] = []
    kept: list[tuple[int, int]] = []
    for start, end, name in spans:  # longest first
        if start >= 0 and any(a <= start and end <= b for a, b in kept):
            continue
        eid = ctx.view.entity_by_name[name]
        if servable_entity(ctx, eid) is None:
            continue
        kept.append((start, end))
        pattern = r"\W+".join(re.escape(w) for w in name.split())
        written = re.search(pattern, query, re.IGNORECASE)
        proper = bool(written and (written.group(0)[:1].isupper() or _CJK.search(name)))
        found.append((not proper, -len(name), eid))
    out: dict[str, bool] = {}
    for lower, _, eid in sorted(found):
        out.setdefault(eid, not lower)
    return list(out.items())


class _NameIndex:
    """Entity names by script: word n-grams of the query look up Latin names; CJK names are
    matched as substrings (CJK text is not space-delimited)."""

    def __init__(self, by_name: dict[str, str]) -> None:
        self.cjk = sorted(n for n in by_name if _CJK.search(n))
        self.latin = {n for n in by_name if not _CJK.search(n)}
        self.longest = max((len(n.split()) for n in self.latin), default=1)


def _select_entities(ctx: QueryContext, query: str, vector: np.ndarray,
                     hidden: list[str]) -> list[Entity]:
    """Entities the query names (written capitalized, or in CJK), then those of the hybrid
    search over entity descriptions, then names the query writes in lower case (often common
    words that happen to be entity names)."""
    hits = ctx.view.vectors.search("entities", vector=vector, text=query, k=2 * TOP_ENTITIES,
                                   hidden_acl=hidden)
    named = _named(ctx, query)
    ids = list(dict.fromkeys([*(e for e, proper in named if proper), *(h.id for h in hits),
                              *(e for e, _ in named)]))
    entities = [e for i in ids if (e := servable_entity(ctx, i)) is not None]
    return entities[:TOP_ENTITIES]


def _relationships_of(ctx: QueryContext, chosen: set[str]) -> list[Relationship]:
    """Relationships among the chosen entities (heaviest first), then those leading out of
    them, ranked by how many chosen entities the outside endpoint links to (GraphRAG)."""
    adjacency = per_view(ctx, "relationships_by_entity", lambda: _adjacency(ctx))
    inside: list[Relationship] = []
    outside: list[tuple[Relationship, str]] = []
    links: Counter[str] = Counter()
    for rid in sorted({r for e in chosen for r in adjacency.get(e, ())}):
        r = servable_relationship(ctx, rid)  # as served (a view where part of it is hidden)
        if r is None:
            continue
        a, b = r.source in chosen, r.target in chosen
        if a and b:
            inside.append(r)
        else:
            other = r.target if a else r.source
            outside.append((r, other))
            links[other] += 1
    inside.sort(key=lambda r: (-r.weight, r.id))
    outside.sort(key=lambda ro: (-links[ro[1]], -ro[0].weight, ro[0].id))
    return inside + [r for r, _ in outside]


def _adjacency(ctx: QueryContext) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in ctx.view.graph.relationships.values():
        out.setdefault(r.source, []).append(r.id)
        out.setdefault(r.target, []).append(r.id)
    return out


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
    names = {e.id: e.name for e in entities}  # names as served to the caller
    for r in relationships:
        for end in (r.source, r.target):
            if end not in names:
                names[end] = entity_name(ctx, end)
    chosen = {e.id for e in entities}
    blocks = []
    for c in sorted(ctx.view.graph.claims.values(), key=lambda c: c.id):
        if (c.subject in chosen or c.object in chosen) and servable_claim(ctx, c.id) is not None:
            subject = names.get(c.subject) or entity_name(ctx, c.subject)
            blocks.append(ContextBlock("claim", c.id, f"{subject}: "
                                       f"{c.type} ({c.status})", c.description))
    blocks += [ContextBlock("relationship", r.id, f"{names[r.source]} — {names[r.target]}",
                            r.description) for r in relationships]
    return blocks
