"""Navigation of the community hierarchy (design §6): roots, one community's report with its
parents, children, members and sources, an entity's place in the hierarchy, and text spans.

Handles passed back by clients are re-authorized on every call (design §5): an id the caller may
not see raises exactly the NotFound message of an id that does not exist.
"""

from __future__ import annotations

from collections import Counter

from canopy.errors import InvalidArgument, NotFound
from canopy.ids import normalize_name
from canopy.model import Entity, Relationship, Report
from server.engines.common import metered, tokenizer
from server.engines.serving import (
    community_card,
    entity_card,
    finding_card,
    relationship_card,
    root_ids,
    servable_entity,
    servable_relationship,
    servable_report,
    servable_tops,
    servable_unit,
    span_of,
)
from server.results import CommunityCard, DrillResult, SourceSpan
from server.service import QueryContext

__all__ = ["MAX_LIMIT", "drill_down", "list_servable_reports", "report_markdown", "source_span"]

MAX_LIMIT = 100


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "…")


def _no_community(community_id: str) -> NotFound:
    return NotFound(f"No community {_shown(community_id)} in this index.")


def _no_entity(name: str) -> NotFound:
    return NotFound(f"No entity {_shown(name)} in this index.")


def _no_unit(unit_id: str) -> NotFound:
    return NotFound(f"No text unit {_shown(unit_id)} in this index.")


async def drill_down(
    ctx: QueryContext,
    *,
    community_id: str | None = None,
    entity: str | None = None,
    finding: int | None = None,
    limit: int = 10,
) -> DrillResult:
    """One step through the hierarchy: the roots (no arguments), a community, or the deepest
    community of an entity; with sources at a leaf or for one finding."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_LIMIT}.")
    if community_id is not None and entity is not None:
        raise InvalidArgument("Pass community_id or entity, not both.")
    if finding is not None and community_id is None and entity is None:
        raise InvalidArgument("finding selects a finding of a community: pass community_id too.")
    if finding is not None and (isinstance(finding, bool) or not isinstance(finding, int)
                                or finding < 0):
        raise InvalidArgument("finding must be a finding's index (0 for the first).")
    with metered(ctx) as meter:
        notes: list[str] = []
        if community_id is None and entity is None:
            result = _roots(ctx, limit, notes)
        elif community_id is not None:
            report = servable_report(ctx, community_id)
            if report is None:
                raise _no_community(community_id)
            result = _community(ctx, report, finding, limit, notes)
        else:
            assert entity is not None
            result = _entity(ctx, entity, finding, limit, notes)
        _fit(ctx, result, notes)
        if notes:
            result.truncated = True
            result.note = " ".join(notes)
        result.usage = meter.info()
        return result


def source_span(ctx: QueryContext, unit_id: str) -> SourceSpan:
    """The document span of one text unit (a citation's text_unit id)."""
    unit = servable_unit(ctx, unit_id)
    if unit is None:
        raise _no_unit(unit_id)
    return span_of(ctx, unit)


def report_markdown(ctx: QueryContext, community_id: str) -> str:
    """A community report as Markdown, with the ids that drill_down and source_span accept."""
    report = servable_report(ctx, community_id)
    if report is None:
        raise _no_community(community_id)
    community = ctx.view.graph.communities[community_id]
    rating = (f"Community `{community_id}`, level {report.level}; "
              f"rating {report.rating:g}/10: {report.rating_explanation}")
    lines = [f"# {report.title}", "", rating, "", report.summary]
    parent = community.parent and servable_report(ctx, community.parent)
    if parent:
        lines += ["", f"Parent: `{parent.community_id}` {parent.title}"]
    children = [r for c in servable_tops(ctx, community.children)
                if (r := servable_report(ctx, c)) is not None]
    if children:
        lines += ["", "Sub-communities:"]
        lines += [f"- `{c.community_id}` {c.title}" for c in children]
    for i, _ in enumerate(report.findings):
        card = finding_card(ctx, i, report)
        lines += ["", f"## {i}. {card.summary}", "", card.explanation]
        if card.text_unit_ids:
            lines += ["", "Sources: " + ", ".join(f"`{u}`" for u in card.text_unit_ids)]
    return "\n".join(lines) + "\n"


def list_servable_reports(ctx: QueryContext) -> list[CommunityCard]:
    """Every report the caller may read, broadest level first."""
    reports = (servable_report(ctx, cid) for cid in ctx.view.graph.communities)
    cards = [community_card(ctx, r) for r in reports if r is not None]
    return sorted(cards, key=lambda c: (c.level, c.id))


# ---- the three views ------------------------------------------------------------------------


def _cap(items: list, limit: int, what: str, notes: list[str], call: str) -> list:
    if len(items) > limit:
        notes.append(f"Showing {limit} of {len(items)} {what}; {call}.")
    return items[:limit]


def _roots(ctx: QueryContext, limit: int, notes: list[str]) -> DrillResult:
    roots = [servable_report(ctx, cid) for cid in root_ids(ctx)]
    cards = [community_card(ctx, r) for r in roots if r is not None]
    cards.sort(key=lambda c: (-(c.rating or 0), -c.size, c.id))
    shown = _cap(cards, limit, "top-level communities", notes,
                 f"call drill_down(limit={min(len(cards), MAX_LIMIT)}) to list more")
    return DrillResult(children=shown)


def _community(ctx: QueryContext, report: Report, finding: int | None, limit: int,
               notes: list[str], *, entity: Entity | None = None) -> DrillResult:
    """A community's view; with `entity`, that entity's relationships and sources instead of
    the community's."""
    graph = ctx.view.graph
    cid = report.community_id
    community = graph.communities[cid]
    findings = [finding_card(ctx, i, report) for i in range(len(report.findings))]
    if finding is not None and finding >= len(findings):
        raise InvalidArgument(
            f"finding must be from 0 to {len(findings) - 1} for community {cid!r}.")
    here = f"community_id={cid!r}" if entity is None else f"entity={entity.name!r}"

    def cap(items: list, what: str, args: str = here) -> list:
        return _cap(items, limit, what, notes,
                    f"call drill_down({args}, limit={min(len(items), MAX_LIMIT)})")

    parents: list[CommunityCard] = []
    parent = community.parent
    while parent is not None and parent in graph.communities:
        if (p := servable_report(ctx, parent)) is not None:
            parents.insert(0, community_card(ctx, p))
        parent = graph.communities[parent].parent
    children = [community_card(ctx, r) for c in servable_tops(ctx, community.children)
                if (r := servable_report(ctx, c)) is not None]
    members = [e for eid in community.entity_ids if (e := servable_entity(ctx, eid)) is not None]
    members.sort(key=lambda e: (-e.degree, e.name))
    if entity is None:
        rels = [r for rid in community.relationship_ids
                if (r := servable_relationship(ctx, rid)) is not None]
        rels.sort(key=lambda r: (-r.weight, r.id))
    else:  # the entity's own relationships, inside the community or not
        rels = _relationships_of(ctx, entity)
    if finding is not None:
        unit_ids, about = list(findings[finding].text_unit_ids), f"finding {finding}"
        args = f"community_id={cid!r}, finding={finding}"
    elif entity is not None:
        unit_ids, about, args = list(entity.text_unit_ids), f"entity {entity.name!r}", here
    elif not community.children:
        unit_ids, about, args = _by_support(ctx, report), "this leaf community", here
    else:
        unit_ids, about, args = [], "", here
    units = [u for uid in unit_ids if (u := servable_unit(ctx, uid)) is not None]
    return DrillResult(
        community=community_card(ctx, report),
        entity=entity_card(entity) if entity is not None else None,
        findings=cap(findings, "findings", f"community_id={cid!r}"),
        parents=parents,
        children=cap(children, "sub-communities"),
        entities=cap([entity_card(e) for e in members], "member entities"),
        relationships=cap([relationship_card(ctx, r) for r in rels], "relationships"),
        sources=[span_of(ctx, u) for u in cap(units, f"source passages of {about}", args)],
    )


def _entity(ctx: QueryContext, name: str, finding: int | None, limit: int,
            notes: list[str]) -> DrillResult:
    eid = ctx.view.entity_by_name.get(normalize_name(name))
    if eid is None and name in ctx.view.graph.entities:
        eid = name  # an entity id from a citation
    entity = servable_entity(ctx, eid) if eid is not None else None
    if entity is None:
        raise _no_entity(name)
    for cid in ctx.view.communities_of.get(entity.id, []):  # deepest first
        if (report := servable_report(ctx, cid)) is not None:
            return _community(ctx, report, finding, limit, notes, entity=entity)
    if finding is not None:
        raise InvalidArgument(f"No community report is available for entity {entity.name!r}, "
                              "so there are no findings to select.")
    rels = _relationships_of(ctx, entity)
    units = [u for uid in entity.text_unit_ids if (u := servable_unit(ctx, uid)) is not None]
    call = f"call drill_down(entity={entity.name!r}, limit={MAX_LIMIT})"
    return DrillResult(
        entity=entity_card(entity),
        relationships=_cap([relationship_card(ctx, r) for r in rels], limit, "relationships",
                           notes, call),
        sources=[span_of(ctx, u) for u in _cap(units, limit, "source passages", notes, call)])


def _relationships_of(ctx: QueryContext, entity: Entity) -> list[Relationship]:
    rels = (r for r in ctx.view.graph.relationships.values() if entity.id in (r.source, r.target))
    servable = [s for r in rels if (s := servable_relationship(ctx, r.id)) is not None]
    return sorted(servable, key=lambda r: (-r.weight, r.id))


def _by_support(ctx: QueryContext, report: Report) -> list[str]:
    """A report's units, those supporting the most findings first, then in document order."""
    support = Counter(u for f in report.findings for u in f.text_unit_ids)

    def key(uid: str) -> tuple[int, str, int]:
        unit = ctx.view.units.get(uid)
        doc = ctx.view.document_of(uid)
        return (-support[uid], doc.path if doc else "", unit.ordinal if unit else 0)

    return sorted(report.text_unit_ids, key=key)


def _fit(ctx: QueryContext, result: DrillResult, notes: list[str]) -> None:
    """Keep the result under the result token limit: shorten source texts evenly, then drop
    trailing items of the longest lists."""
    limit = ctx.settings.result_token_limit
    tok = tokenizer()

    def over() -> int:
        return tok.count(result.model_dump_json()) + 200 - limit

    excess = over()
    if excess <= 0:
        return
    if result.sources:
        sizes = [tok.count(s.text) for s in result.sources]
        keep = max(20, (sum(sizes) - excess) // len(sizes))
        for s, n in zip(result.sources, sizes, strict=True):
            if n > keep:
                s.text = tok.truncate(s.text, keep) + " …"
        notes.append(f"Source texts were shortened to fit the {limit}-token limit; read a whole "
                     f"passage as the resource canopy://units/{result.sources[0].text_unit_id}.")
    lists = [result.sources, result.relationships, result.entities, result.findings,
             result.children]
    cut = False
    while over() > 0 and any(lists):
        max(lists, key=len).pop()
        cut = True
    if cut:
        longest = max(len(x) for x in lists)
        notes.append(f"Lists were cut to fit the {limit}-token limit; call drill_down again with "
                     f"limit={max(1, longest)} to page through smaller pieces.")
