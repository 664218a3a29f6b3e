"""Navigation of the community hierarchy (design §6): roots, one community's report with its
parents, children, members and sources, an entity's place in the hierarchy, and text spans.

Handles passed back by clients are re-authorized on every call (design §5): an id the caller may
not see raises exactly the NotFound message of an id that does not exist.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from canopy.acl.reader import CallerReader
from canopy.errors import InvalidArgument, NotFound
from canopy.ids import entity_key, fold_key
from canopy.model import Entity, Relationship, Report
from canopy.server.context import QueryContext
from canopy.server.engines.budget import (
    delivered_chars,
    delivered_tokens,
    metered,
    tokenizer,
)
from canopy.server.engines.cards import (
    claim_card,
    community_card,
    entity_card,
    finding_cards,
    relationship_card,
    span_of,
)
from canopy.server.results import AliasCard, ClaimCard, CommunityCard, DrillResult, SourceSpan

__all__ = ["MAX_LIMIT", "REPORT_CHILDREN", "drill_down", "list_servable_reports", "no_community",
           "no_entity", "report_markdown", "served_ancestors", "served_children", "source_span"]

MAX_LIMIT = 100
MAX_OFFSET = 1_000_000
REPORT_CHILDREN = 20  # sub-communities a report's Markdown lists; drill_down pages the rest


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "…")


def no_community(community_id: str) -> NotFound:
    """What a caller reads for a community that is absent or hidden from them: the same."""
    return NotFound(f"No community {_shown(community_id)} in this index.")


def no_entity(name: str) -> NotFound:
    """What a caller reads for an entity that is absent or hidden from them: the same."""
    return NotFound(f"No entity {_shown(name)} in this index.")


def _no_unit(unit_id: str) -> NotFound:
    return NotFound(f"No text unit {_shown(unit_id)} in this index.")


async def served_ancestors(reader: CallerReader, cid: str) -> list[CommunityCard]:
    """The ancestors of community `cid` that the caller is served, root first (a hidden one is
    left out; the chain goes on above it)."""
    chain: list[str] = []
    parent = reader.community_rows([cid])[cid].parent
    while parent is not None:
        chain.insert(0, parent)
        row = reader.community_rows([parent]).get(parent)
        parent = row.parent if row is not None else None
    served = await reader.reports(chain)
    return [community_card(reader, served[p]) for p in chain if p in served]


def served_children(reader: CallerReader, cid: str) -> list[str]:
    """The sub-communities of community `cid` the caller is served, in drill_down's order: its
    children where servable, else their nearest servable descendants. Each has a report for the
    caller, so a page of them is read by slicing this list: a top community may have a thousand.
    """
    return reader.servable_tops(reader.child_ids([cid]).get(cid, []))


async def drill_down(
    ctx: QueryContext,
    *,
    community_id: str | None = None,
    entity: str | None = None,
    finding: int | None = None,
    limit: int = 10,
    offset: int = 0,
) -> DrillResult:
    """One step through the hierarchy: the roots (no arguments), a community, or the deepest
    community of an entity; with sources at a leaf or for one finding. Every list of the view
    shows its items offset+1 .. offset+limit (a page); notes name the call for the next page."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_LIMIT}.")
    if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
        raise InvalidArgument(f"offset must be an integer from 0 to {MAX_OFFSET}.")
    if community_id is not None and entity is not None:
        raise InvalidArgument("Pass community_id or entity, not both.")
    if finding is not None and community_id is None and entity is None:
        raise InvalidArgument("finding selects a finding of a community: pass community_id too.")
    if finding is not None and (isinstance(finding, bool) or not isinstance(finding, int)
                                or finding < 0):
        raise InvalidArgument("finding must be a finding's index (0 for the first).")
    with metered(ctx) as meter:
        page = _Page(limit, offset)
        if community_id is None and entity is None:
            result = await _roots(ctx, page)
        elif community_id is not None:
            report = (await ctx.reader.reports([community_id])).get(community_id)
            if report is None:
                raise no_community(community_id)
            result = await _community(ctx, report, finding, page)
        else:
            assert entity is not None
            result = await _entity(ctx, entity, finding, page)
        _fit(ctx, result, page)
        result.usage = meter.info()
        return result


def source_span(ctx: QueryContext, unit_id: str) -> SourceSpan:
    """The document span of one text unit (a citation's text_unit id)."""
    got = ctx.reader.units([unit_id]).get(unit_id)
    if got is None:
        raise _no_unit(unit_id)
    return span_of(*got)


async def report_markdown(ctx: QueryContext, community_id: str) -> str:
    """A community report as Markdown, with the ids that drill_down and source_span accept: its
    first `REPORT_CHILDREN` sub-communities, and a note naming the drill_down call for the rest.
    """
    reader = ctx.reader
    report = (await reader.reports([community_id])).get(community_id)
    if report is None:
        raise no_community(community_id)
    row = reader.community_rows([community_id])[community_id]
    rating = (f"Community `{community_id}`, level {report.level}; "
              f"rating {report.rating:g}/10: {report.rating_explanation}")
    lines = [f"# {report.title}", "", rating, "", report.summary]
    if row.parent:
        parent = (await reader.reports([row.parent])).get(row.parent)
        if parent is not None:
            lines += ["", f"Parent: `{parent.community_id}` {parent.title}"]
    lines += await _sub_community_lines(reader, community_id)
    for i, card in enumerate(finding_cards(reader, report)):
        lines += ["", f"## {i}. {card.summary}", "", card.explanation]
        if card.text_unit_ids:
            lines += ["", "Sources: " + ", ".join(f"`{u}`" for u in card.text_unit_ids)]
    return "\n".join(lines) + "\n"


async def _sub_community_lines(reader: CallerReader, cid: str) -> list[str]:
    """The report's list of sub-communities: the first page of drill_down's, and its note naming
    the drill_down call for the next page (only the listed reports are read)."""
    page = _Page(REPORT_CHILDREN, 0)
    shown = page.cut(served_children(reader, cid), "sub-communities", f"community_id={cid!r}")
    children = await reader.reports(shown)
    if not children:
        return []
    lines = ["", "Sub-communities:"]
    lines += [f"- `{c.community_id}` {c.title}" for c in children.values()]
    notes = page.notes()
    return lines + ["", *notes] if notes else lines


async def list_servable_reports(ctx: QueryContext) -> list[CommunityCard]:
    """Every report the caller may read, broadest level first."""
    reader = ctx.reader
    reports = await reader.reports(reader.inventory.community_ids_by_level())
    cards = [community_card(reader, r) for r in reports.values()]
    return sorted(cards, key=lambda c: (c.level, c.id))


# ---- the three views ------------------------------------------------------------------------


@dataclass
class _Listed:
    """One list of a view: what it holds, the drill_down arguments of its view, how many
    items it has for the caller, and how many this page shows."""

    what: str
    args: str
    total: int
    shown: int


@dataclass
class _Page:
    """Which items of each list a view shows (offset .. offset+limit), and, from what each list
    left out, the notes that name the call for the next page."""

    limit: int
    offset: int
    listed: list[_Listed] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.offset + self.limit

    def cut(self, items: list[Any], what: str, args: str, *, total: int | None = None
            ) -> list[Any]:
        """This page of `items` (`total`: how many there are, when `items` holds only the first
        ones); `args`: the view's own drill_down arguments."""
        total = len(items) if total is None else total
        shown = items[self.offset:self.end]
        self.listed.append(_Listed(what, args, total, len(shown)))
        return shown

    def notes(self, most: int | None = None) -> list[str]:
        """Notes naming the exact call for the next page of each list with more to see; lists
        continued by the same call share one note. `most`: the items per list the result kept
        after a cut to fit the size limit (`_fit`), below `limit`: each list shows at most that
        many, and its next page is a page of that size."""
        size = self.limit if most is None else most
        more: dict[str, list[str]] = {}  # the call -> what it continues
        out = []
        for x in self.listed:
            shown = min(x.shown, size)
            call = ", ".join(a for a in (x.args, f"limit={size}") if a)
            if x.total > self.offset + shown:
                more.setdefault(f"drill_down({call}, offset={self.offset + shown})", []).append(
                    f"{x.what} {self.offset + 1}-{self.offset + shown} of {x.total}")
            elif self.offset and not shown and x.total:
                out.append(f"offset {self.offset} is past the {x.total} {x.what}; "
                           f"call drill_down({call}, offset=0) for the first ones.")
        return [f"Showing {', '.join(shown)}: call {call} for the next ones."
                for call, shown in more.items()] + out


async def _roots(ctx: QueryContext, page: _Page) -> DrillResult:
    roots = await ctx.reader.reports(ctx.reader.roots())
    cards = [community_card(ctx.reader, r) for r in roots.values()]
    cards.sort(key=lambda c: (-(c.rating or 0), -c.size, c.id))
    return DrillResult(children=page.cut(cards, "top-level communities", ""))


async def _names(ctx: QueryContext, rels: list[Relationship],
                 known: dict[str, Entity]) -> dict[str, str]:
    ends = {x for r in rels for x in (r.source, r.target)} - set(known)
    got = await ctx.reader.entities(ends)
    return {i: e.name for i, e in {**known, **got}.items()}


async def _community(ctx: QueryContext, report: Report, finding: int | None, page: _Page,
                     *, entity: Entity | None = None) -> DrillResult:
    """A community's view; with `entity`, that entity's relationships and sources instead of
    the community's."""
    reader = ctx.reader
    cid = report.community_id
    findings = finding_cards(reader, report)
    if finding is not None and finding >= len(findings):
        raise InvalidArgument(
            f"finding must be from 0 to {len(findings) - 1} for community {cid!r}.")
    here = f"community_id={cid!r}" if entity is None else f"entity={entity.name!r}"

    def cap(items: list[Any], what: str, args: str = here, total: int | None = None) -> list[Any]:
        return page.cut(items, what, args, total=total)

    parents = await served_ancestors(reader, cid)
    all_children = reader.child_ids([cid]).get(cid, [])
    # Every servable top has a report for the caller (canonical or a view), so only the page's
    # are read: a top community may have a thousand sub-communities.
    tops = reader.servable_tops(all_children)
    kids = await reader.reports(tops[:page.end])
    children = [community_card(reader, kids[k]) for k in kids]
    members, n_members = await reader.ranked_members(cid, page.end)
    if entity is None:
        rels, n_rels = await reader.ranked_relationships(cid, page.end)
    else:  # the entity's own relationships, inside the community or not
        rels, n_rels = await _relationships_of(ctx, entity, page.end)
    names = await _names(ctx, rels, {e.id: e for e in members})
    if finding is not None:
        unit_ids, about = list(findings[finding].text_unit_ids), f"finding {finding}"
        args = f"community_id={cid!r}, finding={finding}"
    elif entity is not None:
        unit_ids, about, args = list(entity.text_unit_ids), f"entity {entity.name!r}", here
    elif not all_children:
        unit_ids, about, args = _by_support(ctx, report), "this leaf community", here
    else:
        unit_ids, about, args = [], "", here
    units = ctx.reader.units(unit_ids)
    claims = await _claims_of(ctx, entity) if entity is not None else []
    return DrillResult(
        community=community_card(reader, report),
        entity=entity_card(entity) if entity is not None else None,
        claims=cap(claims, "claims"),
        findings=cap(findings, "findings", f"community_id={cid!r}"),
        parents=parents,
        children=cap(children, "sub-communities", total=len(tops)),
        entities=cap([entity_card(e) for e in members], "member entities", total=n_members),
        relationships=cap([relationship_card(r, names) for r in rels], "relationships",
                          total=n_rels),
        sources=[span_of(*units[u]) for u in cap([u for u in unit_ids if u in units],
                                                  f"source passages of {about}", args)],
    )


async def _entity(ctx: QueryContext, name: str, finding: int | None, page: _Page
                  ) -> DrillResult:
    reader = ctx.reader
    # a name with its legal form is the bare name's entity where a document links the two
    by_key = reader.entity_ids_by_key([entity_key(name), fold_key(name)])
    eid = by_key.get(entity_key(name)) or by_key.get(fold_key(name))
    if eid is None and reader.entity_states([name]).get(name):
        eid = name  # an entity id from a citation
    entity = (await reader.entities([eid])).get(eid) if eid is not None else None
    if entity is None:
        raise no_entity(name)
    result = await _entity_in_context(ctx, entity, finding, page)
    result.aliases = [AliasCard(name=m.name, rule=m.rule, text_unit_ids=list(m.text_unit_ids))
                      for m in reader.merged_names(entity.id)]
    return result


async def _entity_in_context(ctx: QueryContext, entity: Entity, finding: int | None,
                             page: _Page) -> DrillResult:
    """The entity in its deepest community with a report, or alone with its relationships."""
    reader = ctx.reader
    chain = reader.communities_of([entity.id]).get(entity.id, [])  # deepest first
    states = reader.community_states(chain)
    for cid in chain:
        if states[cid]:
            report = (await reader.reports([cid])).get(cid)
            if report is not None:
                return await _community(ctx, report, finding, page, entity=entity)
    if finding is not None:
        raise InvalidArgument(f"No community report is available for entity {entity.name!r}, "
                              "so there are no findings to select.")
    rels, total = await _relationships_of(ctx, entity, page.end)
    names = await _names(ctx, rels, {entity.id: entity})
    units = reader.units(entity.text_unit_ids)
    here = f"entity={entity.name!r}"
    return DrillResult(
        entity=entity_card(entity),
        claims=page.cut(await _claims_of(ctx, entity), "claims", here),
        relationships=page.cut([relationship_card(r, names) for r in rels], "relationships", here,
                               total=total),
        sources=[span_of(*units[u]) for u in page.cut(
            [u for u in entity.text_unit_ids if u in units], "source passages", here)])


async def _relationships_of(ctx: QueryContext, entity: Entity,
                            limit: int) -> tuple[list[Relationship], int]:
    """The entity's `limit` heaviest relationships (as served), and how many it has for the
    caller. Ranked on the cheap edge rows: a hub may have thousands, only the shown are read."""
    edges = ctx.reader.incident([entity.id])
    weight = await ctx.reader.served_weights(edges)
    kept = sorted(weight, key=lambda r: (-weight[r], r))[:limit]
    served = await ctx.reader.relationships(kept)
    return [served[r] for r in kept if r in served], len(weight)


async def _claims_of(ctx: QueryContext, entity: Entity) -> list[ClaimCard]:
    """The servable claims with the entity as subject or object: dated ones by period, then the
    undated, each with its entities' names as the caller is shown them."""
    claims = ctx.reader.claims_of([entity.id])
    ends = {e for c in claims for e in (c.subject, c.object) if e} - {entity.id}
    names = {i: e.name for i, e in (await ctx.reader.entities(ends)).items()}
    names[entity.id] = entity.name
    claims.sort(key=lambda c: (not c.start_date, c.start_date, c.end_date, c.id))
    return [claim_card(c, names) for c in claims]


def _by_support(ctx: QueryContext, report: Report) -> list[str]:
    """A report's units, those supporting the most findings first, then in document order."""
    support = Counter(u for f in report.findings for u in f.text_unit_ids)
    units = ctx.reader.units(report.text_unit_ids)

    def key(uid: str) -> tuple[int, str, int]:
        got = units.get(uid)
        return (-support[uid], got[1].path if got else "", got[0].ordinal if got else 0)

    return sorted(report.text_unit_ids, key=key)


_LISTS = ("sources", "relationships", "claims", "entities", "findings", "children")
_USAGE_ROOM = 60  # tokens for the usage set after fitting (a line of text when views cost calls)


def _fit(ctx: QueryContext, result: DrillResult, page: _Page) -> None:
    """Keep the result, text and structured content together (`delivered_tokens`), under the
    result token limit, and write its note: shorten source texts evenly, then show fewer items
    of each list, the same number of each (the most that fit), so that every list's note names
    the exact call for its next page."""
    limit = ctx.settings.result_token_limit
    tok = tokenizer()
    extra: list[str] = []
    most: int | None = None

    def settle(exact: bool = True) -> int:
        """Write the note as it stands; the tokens the result is over the limit (`exact`), or
        else the characters of its text and structured content."""
        notes = page.notes(most) + extra
        result.truncated = bool(notes)
        result.note = " ".join(notes) if notes else None
        if not exact:
            return delivered_chars(result)
        return delivered_tokens(result) + _USAGE_ROOM - limit

    excess = settle()
    if excess > 0 and result.sources:
        extra.append(f"Source texts were shortened to fit the {limit}-token limit; read a whole "
                     f"passage as the resource canopy://units/{result.sources[0].text_unit_id}.")
        excess = settle()
        sizes = [tok.count(s.text) for s in result.sources]
        keep = max(20, (sum(sizes) - excess) // len(sizes))
        for s, n in zip(result.sources, sizes, strict=True):
            if n > keep:
                s.text = tok.truncate(s.text, keep) + " …"
        excess = settle()
    if excess <= 0:
        return
    lists = {name: list(getattr(result, name)) for name in _LISTS}
    longest = max(len(items) for items in lists.values())

    def cut_to(m: int, exact: bool = True) -> int:
        nonlocal most
        most = m
        for name, items in lists.items():
            setattr(result, name, items[:m])
        return settle(exact)

    if longest > 1:
        # The most items per list that fit (1 at least). Counting tokens is most of a cut
        # drill_down's cost, so the search runs on characters, at the tokens per character of
        # the whole result, and exact counts then step from its answer to the most that fit
        # (two or three counts instead of one per halving).
        per_char = (excess + limit - _USAGE_ROOM) / max(1, settle(exact=False))
        low, high = 1, longest - 1
        while low < high:
            mid = (low + high + 1) // 2
            if cut_to(mid, exact=False) * per_char + _USAGE_ROOM - limit <= 0:
                low = mid
            else:
                high = mid - 1
        if cut_to(low) <= 0:
            while low < longest - 1 and cut_to(low + 1) <= 0:
                low += 1
            if most != low:  # the step past it did not fit: back, to a state counted already
                cut_to(low, exact=False)
            return
        while low > 1:
            low -= 1
            if cut_to(low) <= 0:
                return
    # One item per list is still too much (a limit near its floor, long descriptions): the
    # texts are shortened evenly, each counted twice (text and structured content).
    extra.append(f"Descriptions were shortened to fit the {limit}-token limit.")
    for _ in range(4):
        excess = settle()
        if excess <= 0:
            break
        texts = _long_texts(result)
        sizes = [tok.count(getattr(owner, name)) for owner, name in texts]
        keep = max(8, (sum(sizes) - excess // 2 - 8 * len(texts)) // max(1, len(texts)))
        for (owner, name), n in zip(texts, sizes, strict=True):
            if n > keep:
                setattr(owner, name, tok.truncate(getattr(owner, name), keep) + " …")


def _long_texts(result: DrillResult) -> list[tuple[BaseModel, str]]:
    """The free-text fields of a result (descriptions, summaries, explanations, source text),
    as (model, field name)."""
    out: list[tuple[BaseModel, str]] = []
    if result.entity is not None:
        out.append((result.entity, "description"))
    if result.community is not None:
        out.append((result.community, "summary"))
    out += [(f, "explanation") for f in result.findings]
    out += [(c, "summary") for c in result.children]
    out += [(e, "description") for e in result.entities]
    out += [(r, "description") for r in result.relationships]
    out += [(c, "description") for c in result.claims]
    out += [(s, "text") for s in result.sources]
    return out
