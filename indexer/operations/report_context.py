"""Community reports, bottom-up (Edge et al. 2024 §2.1.5), and the fingerprints that decide
when one must be written again.

Context rules (`build_report_context`):
- Leaf communities: relationships by prominence (source degree + target degree, descending), each
  with its endpoints' descriptions and claims, added until the token budget is reached; then the
  remaining entities by degree.
- Higher levels: if all element descriptions fit, as for leaves. Otherwise sub-communities are
  ranked by the tokens of their elements, largest first, and their (shorter) reports substituted
  for their elements until the context fits.
- When even the sub-community reports together overflow the budget, the report is written from
  them alone: the largest children's (by members) reports that fit (`reports_only`). Such a
  community is large; the indexer then writes and fingerprints it from its children alone
  (`reports_only_fingerprint`), without reading its elements, so an update near the top of a
  large hierarchy costs what its children's reports cost, not what the whole community holds.

Pure: plain data in, plain data out (the tokenizer counts). The one report writer, which calls
the provider with these contexts, is canopy.indexer.report_writer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from canopy.ids import content_hash
from canopy.model import Claim, Community, Entity, Finding, Relationship, Report
from canopy.providers.base import ReportContext, ReportOut
from canopy.tokenizer import Tokenizer

__all__ = [
    "CommunityContent",
    "ElementSizes",
    "build_report_context",
    "context_units",
    "fingerprint",
    "reports_only",
    "reports_only_context",
    "reports_only_fingerprint",
    "to_report",
]


@dataclass
class CommunityContent:
    """What a community's report is written from: the community, its elements, and its
    children's memberships (for sub-report substitution)."""

    community: Community
    entities: dict[str, Entity]
    relationships: dict[str, Relationship]
    claims: list[Claim] = field(default_factory=list)
    children: dict[str, Community] = field(default_factory=dict)


def fingerprint(level: int, entity_hashes: Iterable[str], relationship_hashes: Iterable[str],
                claim_hashes: Iterable[str], child_fingerprints: Iterable[str],
                prompt: str = "") -> str:
    """A hash of everything a report could be written from: members (names, types, descriptions,
    degrees, provenance), internal relationships, claims, and the children's fingerprints, and
    the report template when it is replaced (`prompt`: canopy.providers.base.prompt_key).
    Community ids are deliberately not part of it, so a report survives a renumbering."""
    return content_hash(str(level), *sorted(entity_hashes), *sorted(relationship_hashes),
                        *sorted(claim_hashes), *sorted(child_fingerprints),
                        *([prompt] if prompt else []), length=24)


# An element's context line costs at least this many tokens (one for its text, two added), so a
# community with more members than budget / MIN_ELEMENT_TOKENS cannot fit its elements.
MIN_ELEMENT_TOKENS = 3


def reports_only_fingerprint(level: int, child_report_fingerprints: Iterable[str],
                             prompt: str = "") -> str:
    """The fingerprint of a community written from its children's reports alone: what such a
    report is made of is those reports (each named by its fingerprint, which also fixes the
    child's members), the level, and a replaced report template (`prompt`)."""
    return content_hash("reports-only", str(level), *sorted(child_report_fingerprints),
                        *([prompt] if prompt else []), length=24)


def reports_only(reports: dict[str, Report], members: dict[str, int], tok: Tokenizer,
                 budget: int) -> list[Report] | None:
    """When the children's reports (`reports`, by child id) together overflow `budget`: the
    reports the report is written from, taken largest child first (by `members`, then id) while
    they fit (one too long is passed over). None when they fit together (sub-report
    substitution), or when not one of them fits alone (elements, as the budget allows)."""
    cost = {k: tok.count(r.full_text()) + 4 for k, r in reports.items()}
    if sum(cost.values()) <= budget:
        return None
    chosen: list[Report] = []
    used = 0
    for k in sorted(reports, key=lambda k: (-members.get(k, 0), k)):
        if used + cost[k] <= budget:
            used += cost[k]
            chosen.append(reports[k])
    return chosen or None


def reports_only_context(c: Community, subs: list[Report]) -> ReportContext:
    """The context of a report written from sub-community reports alone (`reports_only`)."""
    return ReportContext(community_id=c.id, level=c.level, entities=[], relationships=[],
                         sub_reports=subs)


class ElementSizes:
    """Token sizes of elements as they appear in a report context (memoized by element id;
    `seed` gives sizes known from elsewhere, `fresh` returns those counted here)."""

    def __init__(self, tok: Tokenizer) -> None:
        self.tok = tok
        self._cache: dict[str, int] = {}
        self._seeded: set[str] = set()

    def seed(self, known: dict[str, int]) -> None:
        for i, n in known.items():
            if i not in self._cache:
                self._cache[i] = n
                self._seeded.add(i)

    def known(self, i: str) -> bool:
        return i in self._cache

    def get(self, i: str) -> int | None:
        return self._cache.get(i)

    def fresh(self, ids: Iterable[str]) -> dict[str, int]:
        """Sizes of these ids counted by this object (not seeded), where counted."""
        return {i: self._cache[i] for i in ids if i in self._cache and i not in self._seeded}

    def entity(self, e: Entity) -> int:
        n = self._cache.get(e.id)
        if n is None:
            n = self._cache[e.id] = self.tok.count(f"{e.name},{e.description},{e.degree}") + 2
        return n

    def relationship(self, r: Relationship) -> int:
        n = self._cache.get(r.id)
        if n is None:
            n = self._cache[r.id] = self.tok.count(
                f"{r.source},{r.target},{r.description},{r.weight}") + 2
        return n

    def context(self, ctx: ReportContext) -> int:
        """A report context's tokens as the budget counts them: its elements' sizes, its
        sub-reports' and claims' texts. It differs from counting the rendered context by the
        row numbers and table headers, and saves tokenizing every context a second time."""
        return (sum(self.entity(e) for e in ctx.entities)
                + sum(self.relationship(r) for r in ctx.relationships)
                + sum(self.tok.count(r.full_text()) + 4 for r in ctx.sub_reports)
                + sum(self.tok.count(c.description) + 8 for c in ctx.claims))


def build_report_context(content: CommunityContent, child_reports: dict[str, Report],
                         sizes: ElementSizes, budget: int) -> ReportContext:
    """The context of one report within `budget` tokens (see the module docstring)."""
    c = content.community
    entities, relationships = content.entities, content.relationships
    tok = sizes.tok
    members = set(entities)
    rels = sorted(
        (relationships[r] for r in c.relationship_ids if r in relationships),
        key=lambda r: (-(_degree(entities, r.source) + _degree(entities, r.target)), r.id),
    )
    all_tokens = sum(sizes.entity(e) for e in entities.values()) + sum(
        sizes.relationship(r) for r in rels
    )
    subs: list[Report] = []
    if c.children and all_tokens > budget:
        kids = [
            content.children[k] for k in c.children if k in child_reports and k in content.children
        ]
        alone = reports_only({k.id: child_reports[k.id] for k in kids},
                             {k.id: len(k.entity_ids) for k in kids}, tok, budget)
        if alone is not None:
            return reports_only_context(c, alone)
        # Substitute child reports, largest child first, until the rest fits.
        kids.sort(
            key=lambda k: (
                -sum(sizes.entity(entities[e]) for e in k.entity_ids if e in entities)
                - sum(
                    sizes.relationship(relationships[r])
                    for r in k.relationship_ids
                    if r in relationships
                ),
                k.id,
            )
        )
        covered: set[str] = set()
        sub_tokens = 0
        # What the elements not yet covered by a substituted child cost, kept up to date as
        # children are added (a relationship leaves once both its ends are covered).
        rest = all_tokens
        incident: dict[str, list[Relationship]] = {}
        for r in rels:
            incident.setdefault(r.source, []).append(r)
            if r.target != r.source:
                incident.setdefault(r.target, []).append(r)
        for k in kids:
            subs.append(child_reports[k.id])
            sub_tokens += tok.count(child_reports[k.id].full_text()) + 4
            for e in k.entity_ids:
                if e in covered:
                    continue
                covered.add(e)
                if e in members:
                    rest -= sizes.entity(entities[e])
                for r in incident.get(e, ()):
                    other = r.target if r.source == e else r.source
                    if other in covered:
                        rest -= sizes.relationship(r)
            if sub_tokens + rest <= budget:
                break
        # no single report fits (reports_only gave None): drop the smallest children's
        while subs and sub_tokens > budget:
            dropped = subs.pop()
            sub_tokens -= tok.count(dropped.full_text()) + 4
            covered -= set(content.children[dropped.community_id].entity_ids)
        members_left = members - covered
        rels = [r for r in rels if not (r.source in covered and r.target in covered)]
        budget -= sub_tokens
    else:
        members_left = members

    # Pack relationships by prominence, each with its endpoints; then remaining entities.
    used = 0
    chosen_rels: list[Relationship] = []
    chosen: dict[str, Entity] = {}
    for r in rels:
        cost = sizes.relationship(r) + sum(sizes.entity(entities[x]) for x in (r.source, r.target)
                                           if x not in chosen and x in members)
        if used + cost > budget:
            break
        used += cost
        chosen_rels.append(r)
        for x in (r.source, r.target):
            if x in members and x not in chosen:
                chosen[x] = entities[x]
    for ent in sorted((entities[i] for i in members_left if i not in chosen),
                      key=lambda e: (-e.degree, e.id)):
        if used + sizes.entity(ent) > budget:
            break
        used += sizes.entity(ent)
        chosen[ent.id] = ent
    ent_list = sorted(chosen.values(), key=lambda e: (-e.degree, e.id))
    claims = sorted((cl for cl in content.claims if cl.subject in chosen),
                    key=lambda cl: cl.id)[:50]
    return ReportContext(community_id=c.id, level=c.level, entities=ent_list,
                         relationships=chosen_rels, claims=claims, sub_reports=subs,
                         degrees={e.id: e.degree for e in ent_list})


def _degree(entities: dict[str, Entity], eid: str) -> int:
    e = entities.get(eid)
    return e.degree if e is not None else 0


def context_units(ctx: ReportContext) -> set[str]:
    """Every text unit the elements of a report's context derive from."""
    units: set[str] = set()
    items: Iterable[Entity | Relationship | Report | Claim]
    for items in (ctx.entities, ctx.relationships, ctx.sub_reports, ctx.claims):
        for item in items:
            units.update(item.text_unit_ids)
    return units


def to_report(c: Community, ctx: ReportContext, out: ReportOut, context_tokens: int) -> Report:
    """The report of `out` with its findings' evidence mapped back to artifact ids and units."""
    units = context_units(ctx)
    findings = []
    for f in out.findings:
        ents = [ctx.entities[i] for i in f.entity_ids if 0 <= i < len(ctx.entities)]
        rels = [ctx.relationships[i] for i in f.relationship_ids if 0 <= i < len(ctx.relationships)]
        subs = [ctx.sub_reports[i] for i in f.report_ids if 0 <= i < len(ctx.sub_reports)]
        fu: set[str] = set()
        cited: list[Entity | Relationship | Report] = [*ents, *rels, *subs]
        for x in cited:
            fu.update(x.text_unit_ids)
        findings.append(Finding(f.summary, f.explanation, tuple(e.id for e in ents),
                                tuple(r.id for r in rels), tuple(sorted(fu))))
    return Report(
        community_id=c.id,
        level=c.level,
        title=out.title.strip() or c.id,
        summary=out.summary.strip(),
        rating=float(out.rating),
        rating_explanation=out.rating_explanation,
        findings=tuple(findings),
        text_unit_ids=tuple(sorted(units)),
        fingerprint=c.fingerprint,
        context_tokens=context_tokens,
        used_subreports=tuple(r.community_id for r in ctx.sub_reports),
    )
