"""The web view's data, read for one caller: the engines' way, through the caller's reader.

Like the drill_down engine (canopy.server.engines.drill), these functions take a `QueryContext` and
read only through its `CallerReader`, so the serving rule and per-caller views apply: a hidden
community or entity is absent exactly like a missing one (the same NotFound message), a
partly visible one is served as the caller's view, and every size and degree counts only what
exists for the caller.
"""

from __future__ import annotations

import re

from canopy.errors import InvalidArgument
from canopy.ids import entity_key, fold_key
from canopy.model import Document, Entity, TextUnit
from canopy.server.context import QueryContext
from canopy.server.engines.cards import community_card, entity_card, finding_cards, span_of
from canopy.server.engines.drill import (
    no_community,
    no_entity,
    served_ancestors,
    served_children,
)
from canopy.server.wings.web.models import (
    CommunityNode,
    CommunityPage,
    EntityMatches,
    EntityPage,
    Excerpt,
    GraphEdge,
    GraphNode,
    Hierarchy,
    Neighbour,
)

__all__ = ["BUDGET", "DEPTH", "GRAPH_LIMIT", "MAX_DEPTH", "MATCHES", "WIDTH", "bounded",
           "community_page", "entity_page", "find_entities", "hierarchy", "no_community",
           "no_entity"]

DEPTH = 2  # levels below the answer's communities by default: three rings of the sunburst
MAX_DEPTH = 4
WIDTH = 200  # sub-communities of one community in one answer (the rest by offset)
BUDGET = 2000  # communities in one answer: at most this many reports are read
GRAPH_LIMIT = 40  # members drawn in a community's graph: a force layout stays legible
NEIGHBOURS = 12  # relationships listed for an entity
SOURCES = 6  # excerpts shown for an entity
BEFORE, AFTER = 220, 380  # characters of an excerpt around the first mention
MATCHES = 20  # entities a search of the graph explorer lists


def bounded(name: str, raw: str | None, default: int, lo: int, hi: int) -> int:
    """A query parameter as an integer from `lo` to `hi` (`default` when absent)."""
    if raw is None:
        return default
    if not raw.isascii() or not raw.isdigit() or not lo <= int(raw) <= hi:
        raise InvalidArgument(f"{name} must be an integer from {lo} to {hi}.")
    return int(raw)


async def hierarchy(ctx: QueryContext, index: str, root: str | None = None, *,
                    depth: int = DEPTH, offset: int = 0, limit: int = WIDTH,
                    budget: int = BUDGET) -> Hierarchy:
    """The caller's servable hierarchy, bounded: the top-level communities from `offset` on (at
    most `limit`), or the community `root` with its sub-communities from `offset` on, each down
    to `depth` levels below. A hidden community's visible descendants hang from its nearest
    visible ancestor (or become top-level), as drill_down navigates. Every list is cut at
    `limit` and the whole answer at `budget` communities; a cut list keeps its full count and
    the offset of the rest. Only the reports of the communities in the answer are read (a
    report of a partly visible community is a view, possibly built by the provider)."""
    reader = ctx.reader
    who = ctx.caller.principal
    limit = min(limit, budget)
    if root is None:
        tops = reader.roots()
        sizes = {c: reader.visible_size(c) for c in tops}
        tops.sort(key=lambda c: (-sizes[c], c))
        page = tops[offset:offset + limit]
        served = await reader.reports(page)
        answer = Hierarchy(index=index, caller=None if who.unrestricted else who.name, root=None,
                           depth=depth, communities=reader.served_report_count(),
                           entities=sum(sizes.values()), roots_count=len(tops),
                           next_offset=_rest(offset, len(page), len(tops)), roots=[])
        start: dict[str, int] = {}
    else:
        served = await reader.reports([root])
        if root not in served:
            raise no_community(root)
        page = [root]
        sizes = {root: reader.visible_size(root)}
        answer = Hierarchy(index=index, caller=None if who.unrestricted else who.name, root=root,
                           depth=depth, communities=None, entities=sizes[root],
                           roots_count=1, next_offset=None, roots=[])
        start = {root: offset}

    # Breadth first, one batch of reads per level; the budget runs out at the deepest levels.
    left = budget - len(page)
    shown: dict[str, list[str]] = {}  # the sub-communities in the answer, per community
    counts: dict[str, int] = {}  # all the caller sees, per community
    nexts: dict[str, int | None] = {}
    level = page
    for below in range(depth + 1):
        kids = reader.child_ids(level)
        deeper: list[str] = []
        for cid in level:
            visible = reader.servable_tops(kids.get(cid, []))
            first = start.get(cid, 0)
            take = visible[first:first + min(limit, left)] if below < depth else []
            left -= len(take)
            shown[cid], counts[cid] = take, len(visible)
            nexts[cid] = _rest(first, len(take), len(visible))
            deeper += take
        if not deeper:
            break
        served.update(await reader.reports([c for c in deeper if c not in served]))
        level = deeper

    def node(cid: str) -> CommunityNode:
        r = served[cid]
        return CommunityNode(id=cid, level=r.level, title=r.title, rating=r.rating,
                             size=sizes[cid] if cid in sizes else reader.visible_size(cid),
                             children=[node(k) for k in shown[cid] if k in served],
                             children_count=counts[cid], next_offset=nexts[cid])

    answer.roots = [node(c) for c in page if c in served]
    return answer


def _rest(first: int, taken: int, count: int) -> int | None:
    """Where the items after a page start, or None when the page reaches the end."""
    return first + taken if first + taken < count else None


async def community_page(ctx: QueryContext, cid: str, *, offset: int = 0, limit: int = WIDTH,
                         graph: int = GRAPH_LIMIT) -> CommunityPage:
    """Community `cid`'s report, parents, its sub-communities from `offset` on (at most `limit`,
    in the tree's and drill_down's order; only their reports are read) with their count and the
    offset of the rest, and the graph of its `graph` best-connected members."""
    reader = ctx.reader
    report = (await reader.reports([cid])).get(cid)
    if report is None:
        raise no_community(cid)
    tops = served_children(reader, cid)
    page = tops[offset:offset + limit]
    kids = await reader.reports(page)
    members, n_members = await reader.ranked_members(cid, graph)
    shown = {e.id for e in members}
    # Relationships among the drawn members only, ranked on the cheap edge rows as served
    # (read through the members' own edges: a top community's whole set can be tens of
    # thousands at 10k articles).
    edges = [e for e in reader.incident(shown) if e.source in shown and e.target in shown]
    weight = await reader.served_weights(edges)
    rels = await reader.relationships(sorted(weight, key=lambda r: (-weight[r], r)))
    return CommunityPage(
        community=community_card(reader, report),
        parents=await served_ancestors(ctx.reader, cid),
        children=[community_card(reader, kids[k]) for k in page if k in kids],
        children_count=len(tops),
        next_offset=_rest(offset, len(page), len(tops)),
        rating_explanation=report.rating_explanation,
        findings=finding_cards(reader, report),
        nodes=[GraphNode(id=e.id, name=e.name, type=e.type, degree=reader.degree(e.id))
               for e in members],
        edges=[GraphEdge(id=r.id, source=r.source, target=r.target, weight=r.weight,
                         description=r.description) for r in rels.values()],
        members=n_members,
    )


async def entity_page(ctx: QueryContext, eid: str) -> EntityPage:
    reader = ctx.reader
    entity = (await reader.entities([eid])).get(eid)
    if entity is None:
        raise no_entity(eid)
    chain = reader.communities_of([eid]).get(eid, [])  # deepest first
    served = await reader.reports(chain)
    communities = [community_card(reader, served[c]) for c in reversed(chain) if c in served]
    edges = reader.incident([eid])
    weight = await reader.served_weights(edges)
    top = sorted(weight, key=lambda r: (-weight[r], r))[:NEIGHBOURS]
    rels = await reader.relationships(top)
    others = {r.id: r.target if r.source == eid else r.source for r in rels.values()}
    names = await reader.entities(set(others.values()))
    neighbours = [Neighbour(id=r.id, entity_id=others[r.id], entity=names[others[r.id]].name,
                            description=r.description, weight=r.weight)
                  for r in (rels[t] for t in top if t in rels) if others[r.id] in names]
    units = reader.units(entity.text_unit_ids)
    ordered = sorted(units.values(), key=lambda ud: (ud[1].path, ud[0].ordinal))
    return EntityPage(
        entity=entity_card(entity).model_copy(update={"degree": len(weight)}),
        communities=communities,
        relationships=neighbours,
        n_relationships=len(weight),
        sources=[_excerpt(entity, unit, doc) for unit, doc in ordered[:SOURCES]],
        n_sources=len(units),
    )


def _excerpt(entity: Entity, unit: TextUnit, doc: Document) -> Excerpt:
    """The unit's own span, cut to a window around the entity's first mention (by name,
    ignoring case), with every mention inside the window marked."""
    span = span_of(unit, doc)
    text = span.text
    found = [m.span() for m in re.finditer(re.escape(entity.name), text, re.IGNORECASE)]
    first = found[0][0] if found else 0
    start = max(0, first - BEFORE)
    end = min(len(text), first + AFTER)
    if start > 0:  # cut at a word boundary, not inside one
        space = text.find(" ", start)
        start = space + 1 if 0 <= space < first else start
    if end < len(text):
        space = text.rfind(" ", first, end)
        end = space if space > first else end
    head = "… " if start > 0 else ""
    tail = " …" if end < len(text) else ""
    shift = len(head) - start
    marks = [(a + shift, b + shift) for a, b in found if a >= start and b <= end]
    return Excerpt(text_unit_id=span.text_unit_id, document=span.document,
                   char_start=span.char_start, char_end=span.char_end,
                   text=head + text[start:end] + tail, marks=marks)


async def find_entities(ctx: QueryContext, query: str, limit: int = MATCHES) -> EntityMatches:
    """Entities the caller can see that a name search finds: the one named exactly so (also
    when the caller sees only a view of it), then full-text matches over the entity rows the
    caller may read in full (prefiltered before ranking: no hidden row moves a rank)."""
    reader = ctx.reader
    query = query.strip()
    if not query:
        return EntityMatches(query=query, entities=[])
    by_key = reader.entity_ids_by_key([entity_key(query), fold_key(query)])  # "X Corp": X's
    ids = list(dict.fromkeys(by_key.values()))
    ids += [h.id for h in await reader.search("entities", vector=None, text=query,
                                               k=2 * limit) if h.id not in ids]
    found = await reader.entities(ids[:2 * limit])
    nodes = [GraphNode(id=e.id, name=e.name, type=e.type, degree=reader.degree(e.id))
             for e in (found[i] for i in ids if i in found)]
    return EntityMatches(query=query, entities=nodes[:limit])
