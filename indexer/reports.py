"""Community reports, bottom-up (Edge et al. 2024 §2.1.5).

Context rules:
- Leaf communities: relationships by prominence (source degree + target degree, descending), each
  with its endpoints' descriptions and claims, added until the token budget is reached.
- Higher levels: if all element descriptions fit, as for leaves. Otherwise sub-communities are
  ranked by the tokens of their elements, largest first, and their (shorter) reports substituted
  for their elements until the context fits.
A report is regenerated iff its community's fingerprint changed; otherwise the previous report
(looked up by fingerprint, so renamed community ids keep theirs) is reused with no LLM call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace

from canopy.errors import InvalidOutput
from canopy.ids import content_hash
from canopy.model import Claim, Community, Entity, Finding, Relationship, Report, UnitFailure
from canopy.providers.base import Provider, ReportContext, ReportOut
from canopy.tokens import Tokenizer

__all__ = ["ReportBuild", "build_report_context", "community_fingerprints", "generate_reports"]


def community_fingerprints(
    communities: dict[str, Community],
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
    claims: dict[str, Claim],
) -> dict[str, Community]:
    """Communities with `fingerprint` set: a hash of everything a report could be written from
    (members' names, types, descriptions, relationship descriptions and weights, claims, and the
    text units they come from, since a report's provenance must stay exact) and of the children's
    fingerprints. Community ids are deliberately not part of it."""
    claims_by_subject: dict[str, list[Claim]] = {}
    for c in claims.values():
        claims_by_subject.setdefault(c.subject, []).append(c)
    out: dict[str, Community] = {}
    for c in sorted(communities.values(), key=lambda c: -c.level):  # children first
        parts = [str(c.level)]
        parts += [f"{e.id}|{e.name}|{e.type}|{e.description}|{e.degree}|{','.join(e.text_unit_ids)}"
                  for e in (entities[i] for i in c.entity_ids)]
        parts += [f"{r.id}|{r.description}|{r.weight:g}|{','.join(r.text_unit_ids)}"
                  for r in (relationships[i] for i in c.relationship_ids)]
        parts += sorted(f"{cl.id}|{cl.status}" for i in c.entity_ids for cl in claims_by_subject.get(i, []))
        parts += sorted(out[ch].fingerprint for ch in c.children)
        out[c.id] = replace(c, fingerprint=content_hash(*parts, length=24))
    return out


@dataclass
class _Sizes:
    tok: Tokenizer
    entities: dict[str, Entity]
    relationships: dict[str, Relationship]

    def __post_init__(self) -> None:
        self._cache: dict[str, int] = {}

    def of(self, element_id: str) -> int:
        if element_id not in self._cache:
            if element_id in self.entities:
                e = self.entities[element_id]
                text = f"{e.name},{e.description},{e.degree}"
            else:
                r = self.relationships[element_id]
                text = f"{r.source},{r.target},{r.description},{r.weight}"
            self._cache[element_id] = self.tok.count(text) + 2
        return self._cache[element_id]


def build_report_context(
    c: Community,
    communities: dict[str, Community],
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
    claims: dict[str, Claim],
    child_reports: dict[str, Report],
    sizes: _Sizes,
    tok: Tokenizer,
    budget: int,
) -> ReportContext:
    members = set(c.entity_ids)
    rels = sorted(
        (relationships[r] for r in c.relationship_ids),
        key=lambda r: (-(entities[r.source].degree + entities[r.target].degree), r.id),
    )
    all_tokens = sum(sizes.of(e) for e in members) + sum(sizes.of(r.id) for r in rels)
    subs: list[Report] = []
    if c.children and all_tokens > budget:
        # Substitute child reports, largest child first, until the rest fits.
        kids = [communities[k] for k in c.children if k in child_reports]
        kids.sort(key=lambda k: (-sum(sizes.of(e) for e in k.entity_ids) - sum(sizes.of(r) for r in k.relationship_ids), k.id))
        covered: set[str] = set()
        sub_tokens = 0
        for k in kids:
            subs.append(child_reports[k.id])
            sub_tokens += tok.count(child_reports[k.id].full_text()) + 4
            covered |= set(k.entity_ids)
            rest = sum(sizes.of(e) for e in members - covered) + sum(
                sizes.of(r.id) for r in rels if not (r.source in covered and r.target in covered))
            if sub_tokens + rest <= budget:
                break
        while subs and sub_tokens > budget:  # even the reports alone are too long: drop the smallest
            dropped = subs.pop()
            sub_tokens -= tok.count(dropped.full_text()) + 4
            covered -= set(communities[dropped.community_id].entity_ids)
        members_left = members - covered
        rels = [r for r in rels if not (r.source in covered and r.target in covered)]
        budget -= sub_tokens
    else:
        members_left = members

    # Pack relationships by prominence, each with its endpoints; then remaining entities.
    used = 0
    chosen_rels: list[Relationship] = []
    chosen_ents: dict[str, Entity] = {}
    for r in rels:
        cost = sizes.of(r.id) + sum(sizes.of(x) for x in (r.source, r.target) if x not in chosen_ents and x in members)
        if used + cost > budget:
            break
        used += cost
        chosen_rels.append(r)
        for x in (r.source, r.target):
            if x in members and x not in chosen_ents:
                chosen_ents[x] = entities[x]
    for e in sorted((entities[i] for i in members_left if i not in chosen_ents), key=lambda e: (-e.degree, e.id)):
        if used + sizes.of(e.id) > budget:
            break
        used += sizes.of(e.id)
        chosen_ents[e.id] = e
    ent_list = sorted(chosen_ents.values(), key=lambda e: (-e.degree, e.id))
    ent_claims = [cl for cl in claims.values() if cl.subject in chosen_ents]
    return ReportContext(
        community_id=c.id, level=c.level, entities=ent_list, relationships=chosen_rels,
        claims=sorted(ent_claims, key=lambda cl: cl.id)[:50], sub_reports=subs,
        degrees={e.id: e.degree for e in ent_list},
    )


def _to_report(c: Community, ctx: ReportContext, out: ReportOut, context_tokens: int) -> Report:
    def units_of(ents: list[Entity], rels: list[Relationship], subs: list[Report]) -> tuple[str, ...]:
        s: set[str] = set()
        for e in ents:
            s.update(e.text_unit_ids)
        for r in rels:
            s.update(r.text_unit_ids)
        for sr in subs:
            s.update(sr.text_unit_ids)
        for cl in ctx.claims:
            s.update(cl.text_unit_ids)
        return tuple(sorted(s))

    findings = []
    for f in out.findings:
        ents = [ctx.entities[i] for i in f.entity_ids if 0 <= i < len(ctx.entities)]
        rels = [ctx.relationships[i] for i in f.relationship_ids if 0 <= i < len(ctx.relationships)]
        subs = [ctx.sub_reports[i] for i in f.report_ids if 0 <= i < len(ctx.sub_reports)]
        fu: set[str] = set()
        for x in [*ents, *rels, *subs]:
            fu.update(x.text_unit_ids)
        findings.append(Finding(f.summary, f.explanation, tuple(e.id for e in ents), tuple(r.id for r in rels), tuple(sorted(fu))))
    return Report(
        community_id=c.id, level=c.level, title=out.title.strip() or c.id, summary=out.summary.strip(),
        rating=float(out.rating), rating_explanation=out.rating_explanation, findings=tuple(findings),
        text_unit_ids=units_of(ctx.entities, ctx.relationships, ctx.sub_reports), fingerprint=c.fingerprint,
        context_tokens=context_tokens, used_subreports=tuple(r.community_id for r in ctx.sub_reports),
    )


@dataclass
class ReportBuild:
    reports: dict[str, Report]
    generated: int
    reused: int
    failures: list[UnitFailure]


async def generate_reports(
    communities: dict[str, Community],
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
    claims: dict[str, Claim],
    previous: dict[str, Report],
    provider: Provider,
    tok: Tokenizer,
    *,
    max_context_tokens: int,
    max_report_tokens: int,
    concurrency: int = 8,
    on_done: Callable[[], None] | None = None,
) -> ReportBuild:
    """Reports for every community, deepest level first; unchanged fingerprints reuse old reports."""
    by_fp = {r.fingerprint: r for r in previous.values()}
    sizes = _Sizes(tok, entities, relationships)
    reports: dict[str, Report] = {}
    failures: list[UnitFailure] = []
    generated = reused = 0
    sem = asyncio.Semaphore(concurrency)

    async def one(c: Community) -> None:
        nonlocal generated, reused
        old = by_fp.get(c.fingerprint)
        if old is not None:
            reports[c.id] = replace(old, community_id=c.id, level=c.level,
                                    used_subreports=old.used_subreports)
            reused += 1
        else:
            ctx = build_report_context(c, communities, entities, relationships, claims, reports, sizes, tok,
                                       max_context_tokens)
            ctx_tokens = tok.count(ctx.render())
            try:
                async with sem:
                    out = await provider.report(ctx, max_tokens=max_report_tokens)
            except InvalidOutput as exc:
                failures.append(UnitFailure(c.id, "report", str(exc)[:300]))
                return
            reports[c.id] = _to_report(c, ctx, out, ctx_tokens)
            generated += 1
        if on_done:
            on_done()

    for level in sorted({c.level for c in communities.values()}, reverse=True):
        batch = sorted((c for c in communities.values() if c.level == level), key=lambda c: c.id)
        await asyncio.gather(*(one(c) for c in batch))
    return ReportBuild(reports, generated, reused, failures)
