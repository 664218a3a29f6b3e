"""Local search: a question about particular entities, answered from their neighbourhood
(design §6; GraphRAG's mixed local context).

Query -> entities (names written in the query, then a hybrid vector + full-text search over entity
descriptions) -> their relationships, claims, community reports and supporting text units, mixed
under one token budget by proportions -> one answer call over the cited blocks.

Text units: the units supporting the selected entities and relationships join the candidates of
a full-text and vector search for the question and for each of its clauses; all are ranked by how
well they state what the question asks, and by how strongly a Personalized PageRank over the
entity-unit graph, from the entities the question names and the best units, leads to them
(server/engines/evidence.py, server/engines/propagation.py). Multi-hop questions need
several articles, so the first DIVERSE_DOCS units come from distinct documents, and every unit
longer than its share of the text budget is cut to its sentences that best match the question:
CONTEXT_UNITS units fit the default budget instead of ~4 whole ones. Measured on MultiHop-RAG by
benchmarks/retrieval_eval.py.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from canopy.ids import entity_key, normalize_name
from canopy.model import Document, Entity, Relationship, Report, TextUnit
from canopy.providers.base import ContextBlock
from canopy.server.context import QueryContext
from canopy.server.engines.budget import (
    NOTHING_FOUND,
    block_tokens,
    check_query,
    check_response_type,
    context_budget,
    fit_context,
    fit_result,
    metered,
    pack_blocks,
    within_window,
)
from canopy.server.engines.cards import claim_block
from canopy.server.engines.evidence import excerpt, excerpt_text, rank_units
from canopy.server.results import RouteInfo, SearchResult
from canopy.store import Edge

__all__ = ["LocalContext", "build_local_context", "excerpt_block", "local_search",
           "local_unit_ranking", "names_something",
           "named_entities", "report_block", "unit_block"]

TOP_ENTITIES = 10
SUPPORT_UNITS = 30  # units behind the selected entities and relationships that join the ranking
DIVERSE_DOCS = 10  # the first units of the context come from this many distinct documents
CONTEXT_UNITS = 12  # units the text-unit share is divided among (longer units are excerpted)
MIN_EXCERPT_TOKENS = 150
MIN_ENTITY_TOKENS = 40  # an entity's block at least: its name and a sentence of description
MAX_RELATION_TOKENS = 80  # a relationship's block at most: merged descriptions are excerpted
# A relationship block is at least its two names and a short description: the graph share
# holds at most graph_budget // this many, so no more are read.
MIN_RELATIONSHIP_TOKENS = 12
# Shares of the context budget (GraphRAG's community_prop / text_unit_prop); unused budget of
# one part passes to the next, in this order.
REPORT_SHARE = 0.25
GRAPH_SHARE = 0.25  # entities (at most half of it), then claims and relationships
# text units get the rest
MAX_NAME_WORDS = 8  # longest entity name (in words) looked up from the question
MAX_CJK_NAME = 12  # longest CJK name (in characters) looked up from the question
_CJK = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")
_CJK_RUN = re.compile("[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")


async def local_search(
    ctx: QueryContext, query: str, *, response_type: str = "multiple paragraphs",
    route: RouteInfo | None = None, since: str | None = None, until: str | None = None,
) -> SearchResult:
    """Answer a question about specific entities from their graph neighbourhood and sources.
    `route`, `since`, `until`: as basic_search's."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    within_window(ctx, since, until)
    with metered(ctx) as meter:
        await ctx.report_progress(0, 2, "local search: gathering context")
        configured = ctx.settings.local_context_tokens
        local = await build_local_context(ctx, query,
                                          budget=context_budget(ctx, configured=configured))
        result = SearchResult(method="local", query=query, answer="", route=route)
        # With no budget configured the context is what the result delivers whole; a configured
        # one is answered from in full and cut to the limit afterwards (the result says so).
        blocks = local.blocks if configured else fit_context(ctx, result, local.blocks)
        await ctx.report_progress(1, 2, f"local search: answering from {len(blocks)} records")
        if blocks:
            result.answer = await ctx.provider.answer(query, blocks, response_type=response_type)
        else:
            result.answer = NOTHING_FOUND
        await ctx.report_progress(2, 2, "local search: done")
        name = repr(local.entities[0].name) if local.entities else "'<entity name>'"
        result = fit_result(ctx, result, blocks=blocks, more=(
            f"call drill_down(entity={name}) for one entity's community and sources, or ask "
            "local_search a narrower question."))
        result.usage = meter.info()
        return result


@dataclass
class LocalContext:
    entities: list[Entity]  # the selected entities, best first
    # text units (ranked), entities, claims, relationships, reports: the delivered order
    blocks: list[ContextBlock]
    ranked_units: list[str]  # the text-unit ranking the context's units are the head of


async def local_unit_ranking(ctx: QueryContext, query: str) -> list[str]:
    """local_search's text units in rank order before its context is cut to its budget (for
    evaluation: what assembly starts from)."""
    budget = context_budget(ctx, configured=ctx.settings.local_context_tokens)
    return (await build_local_context(ctx, check_query(query), budget=budget)).ranked_units


async def build_local_context(ctx: QueryContext, query: str, *, budget: int) -> LocalContext:
    """The mixed local context of `query` within `budget` tokens (servable items only): the
    shares of reports and of the graph are fixed (REPORT_SHARE, GRAPH_SHARE), text units take
    the rest, and the blocks come text units first, in rank order."""
    reader = ctx.reader
    vector = await reader.embed(query)
    named = _named(ctx, query)
    entities = await _select_entities(ctx, query, vector, named)
    chosen = {e.id for e in entities}
    reports = await _reports_of(ctx, [e.id for e in entities])

    report_budget = int(budget * REPORT_SHARE)
    report_blocks, used = pack_blocks(
        [_excerpted(ctx, report_block(r), query, report_budget) for r in reports], report_budget)
    graph_budget = int(budget * (REPORT_SHARE + GRAPH_SHARE)) - used
    relationships = await _relationships_of(ctx, chosen,
                                            limit=max(1, graph_budget // MIN_RELATIONSHIP_TOKENS))
    # Each selected entity is shown, its description excerpted to its share (a long merged
    # description would otherwise leave no room for the entities after it).
    entity_share = max(MIN_ENTITY_TOKENS, graph_budget // 2 // max(1, len(entities)))
    entity_blocks, used_entities = pack_blocks(
        [_excerpted(ctx, b, query, entity_share) for b in _entity_blocks(entities)],
        graph_budget // 2)
    relation_blocks = [_excerpted(ctx, b, query, MAX_RELATION_TOKENS)
                       for b in await _relation_blocks(ctx, entities, relationships)]
    graph_blocks, used_graph = pack_blocks(relation_blocks, graph_budget - used_entities)
    graph_blocks = entity_blocks + graph_blocks
    used += used_entities + used_graph

    served: dict[str, Entity | Relationship] = {e.id: e for e in entities}
    served.update({r.id: r for r in relationships})
    support: Counter[str] = Counter()
    for b in graph_blocks:  # as served: a view's provenance is the caller's visible units
        item = served.get(b.id)
        if item is not None:
            support.update(item.text_unit_ids)
    by_support = [u for u, _ in sorted(support.items(), key=lambda kv: (-kv[1], kv[0]))]
    ranked = await rank_units(ctx, query, vector, support=by_support[:SUPPORT_UNITS],
                              entities=[reader.entity_key(e) for e, _ in named])
    units = reader.units(ranked)
    order = _diverse([u for u in ranked if u in units], units)
    text_budget = budget - used
    share = max(MIN_EXCERPT_TOKENS, text_budget // CONTEXT_UNITS)
    blocks = []
    for u in order[:max(1, text_budget // MIN_EXCERPT_TOKENS)]:
        blocks.append(excerpt_block(ctx, *units[u], query, share))
    unit_blocks, _ = pack_blocks(blocks, text_budget)
    return LocalContext(entities, unit_blocks + graph_blocks + report_blocks, order)


def _excerpted(ctx: QueryContext, block: ContextBlock, query: str, max_tokens: int
               ) -> ContextBlock:
    """`block` with its text excerpted to about `max_tokens` (its header included)."""
    head = len(block.title) // 4 + 8
    text = excerpt_text(ctx, block.text, query, max(20, max_tokens - head))
    return block if text == block.text else replace(block, text=text)


def _diverse(ranked: list[str], units: dict[str, tuple[TextUnit, Document]]) -> list[str]:
    """`ranked` with the best unit of each of the first DIVERSE_DOCS documents first."""
    head: list[str] = []
    tail: list[str] = []
    docs: set[str] = set()
    for u in ranked:
        doc = units[u][0].document_id
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


def unit_block(unit: TextUnit, doc: Document, *, text: str | None = None) -> ContextBlock:
    """A servable text unit as a block titled by its document and the document's metadata, so
    the answer can say which source and date a fact comes from (`text`: an excerpt of it)."""
    return ContextBlock("text_unit", unit.id, doc.label(), unit.text if text is None else text,
                        source=doc.path, cite_title=doc.title)


def excerpt_block(ctx: QueryContext, unit: TextUnit, doc: Document, query: str,
                  share: int) -> ContextBlock:
    """A unit's block of about `share` tokens, its header (title, metadata) included: the
    unit's text, or its sentences that best match the question (evidence.excerpt)."""
    room = max(MIN_EXCERPT_TOKENS // 2, share - block_tokens(unit_block(unit, doc, text="")))
    return unit_block(unit, doc, text=excerpt(ctx, unit, doc, query, room))


def named_entities(ctx: QueryContext, query: str) -> list[str]:
    """Ids of entities (existing for the caller) whose normalized name occurs in the query as
    whole words; names written capitalized in the query first, then longer names first. A name
    found only inside a longer found name ("Verge" in "The Verge") is left out."""
    return [eid for eid, _ in _named(ctx, query)]


def _named(ctx: QueryContext, query: str) -> list[tuple[str, bool]]:
    """named_entities with, for each, whether the query writes it capitalized (or in CJK)."""
    normalized = normalize_name(query)
    words = normalized.split()
    spans: list[tuple[int, int, str]] = []  # word positions [start, end); -1 for CJK names
    for n in range(min(MAX_NAME_WORDS, len(words)), 0, -1):
        for i in range(len(words) - n + 1):
            name = " ".join(words[i:i + n])
            if len(name) >= 2 and not _CJK.search(name):
                spans.append((i, i + n, name))
    for run in _CJK_RUN.findall(normalized):  # CJK text is not space-delimited: every substring
        for n in range(min(MAX_CJK_NAME, len(run)), 1, -1):
            spans += [(-1, -1, run[i:i + n]) for i in range(len(run) - n + 1)]
    found_keys = ctx.reader.entity_ids_by_key({entity_key(name) for _, _, name in spans})
    found_names = {name: found_keys[entity_key(name)] for _, _, name in spans
                   if entity_key(name) in found_keys}
    found: list[tuple[bool, int, str]] = []
    kept: list[tuple[int, int]] = []
    seen: set[str] = set()
    for start, end, name in spans:  # longest first
        eid = found_names.get(name)
        if eid is None or (start >= 0 and any(a <= start and end <= b for a, b in kept)):
            continue
        if not names_something(name):
            continue
        if start >= 0:
            kept.append((start, end))
        if name in seen:
            continue
        seen.add(name)
        pattern = r"\W+".join(re.escape(w) for w in name.split())
        written = re.search(pattern, query, re.IGNORECASE)
        proper = bool(written and (written.group(0)[:1].isupper() or _CJK.search(name)))
        found.append((not proper, -len(name), eid))
    out: dict[str, bool] = {}
    for lower, _, eid in sorted(found):
        out.setdefault(eid, not lower)
    return list(out.items())


# Tokens that are part of a name but name nothing alone: numerals ("II" of "Lothair II", "2" of
# "Tern T2"), honorifics and abbreviations ("Sir", "St", "Jr"), single letters. A query span made
# only of them matches the entities of that "name" across the corpus ("Murad II", "Amalric II").
_AFFIX = re.compile(r"^(?:x{0,3}(?:ix|iv|v?i{0,3})|\d+(?:st|nd|rd|th)?|\w)$")  # roman to 39


def names_something(key: str) -> bool:
    """False for a normalized name made only of name affixes (numerals, roman numerals,
    honorifics, abbreviations, single letters, stop words): it cannot select an entity from a
    question on its own."""
    from canopy.providers.builtin import lexicon as lx

    affixes = lx.HONORIFICS | lx.ABBREVIATIONS | lx.STOPWORDS
    return any(not (_AFFIX.match(t) or t in affixes) for t in key.split())


async def _select_entities(ctx: QueryContext, query: str, vector: np.ndarray,
                           named: list[tuple[str, bool]]) -> list[Entity]:
    """Entities the query names (written capitalized, or in CJK), then those of the hybrid
    search over entity descriptions, then names the query writes in lower case (often common
    words that happen to be entity names)."""
    hits = await ctx.reader.search("entities", vector=vector, text=query, k=2 * TOP_ENTITIES)
    ids = list(dict.fromkeys([*(e for e, proper in named if proper), *(h.id for h in hits),
                              *(e for e, _ in named)]))
    served = await ctx.reader.entities(ids[:3 * TOP_ENTITIES])
    return [served[i] for i in ids if i in served][:TOP_ENTITIES]


async def _relationships_of(ctx: QueryContext, chosen: set[str], *,
                            limit: int) -> list[Relationship]:
    """The first `limit` of: relationships among the chosen entities (heaviest first), then
    those leading out of them, ranked by how many chosen entities the outside endpoint links to
    (GraphRAG). Ranked on the cheap edge rows (a hub entity may have thousands); only the kept
    ones are read, and an edge served as a view ranks by the view's own weight."""
    reader = ctx.reader
    edges = reader.incident(chosen)
    weight = await reader.served_weights(edges)
    links: Counter[str] = Counter()
    for e in edges:
        if not (e.source in chosen and e.target in chosen):
            links[e.target if e.source in chosen else e.source] += 1

    def rank(e: Edge) -> tuple[int, int, float, str]:
        if e.source in chosen and e.target in chosen:
            return (0, 0, -weight[e.id], e.id)
        return (1, -links[e.target if e.source in chosen else e.source], -weight[e.id], e.id)

    kept = [e.id for e in sorted(edges, key=rank)[:limit]]
    served = await reader.relationships(kept)
    return [served[r] for r in kept if r in served]


async def _reports_of(ctx: QueryContext, entity_ids: list[str]) -> list[Report]:
    """Servable reports of the communities holding the entities: most entities first, then by
    rating, then deeper (more specific) first."""
    count: Counter[str] = Counter()
    for cids in ctx.reader.communities_of(entity_ids).values():
        count.update(cids)
    reports = await ctx.reader.reports(sorted(count))
    return sorted(reports.values(),
                  key=lambda r: (-count[r.community_id], -r.rating, -r.level, r.community_id))


def _entity_blocks(entities: list[Entity]) -> list[ContextBlock]:
    return [ContextBlock("entity", e.id, e.name, e.description) for e in entities]


async def _relation_blocks(ctx: QueryContext, entities: list[Entity],
                           relationships: list[Relationship]) -> list[ContextBlock]:
    """Claims about the entities, then relationships (packing stops at the first block that
    does not fit, so the few claims go before the many relationships)."""
    names = {e.id: e.name for e in entities}  # names as served to the caller
    ends = {x for r in relationships for x in (r.source, r.target)} - set(names)
    names.update({i: e.name for i, e in (await ctx.reader.entities(ends)).items()})
    chosen = {e.id for e in entities}
    claims = ctx.reader.claims_of(chosen)
    ends = {e for c in claims for e in (c.subject, c.object) if e} - set(names)
    names.update({i: e.name for i, e in (await ctx.reader.entities(ends)).items()})
    blocks = [claim_block(c, names) for c in claims]
    blocks += [ContextBlock("relationship", r.id, f"{names.get(r.source, '')} — "
                            f"{names.get(r.target, '')}", r.description) for r in relationships]
    return blocks
