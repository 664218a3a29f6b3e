"""Extractive community reports (Edge et al. 2024 §2.1.5, without a model): a report assembled
from its context's own names and sentences, in the LLM path's schema. Deterministic: ties are
broken by position.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from canopy.providers.base import FindingOut, ReportContext, ReportOut
from canopy.providers.builtin.text import split_sentences, trim
from canopy.tokenizer import Tokenizer

__all__ = ["REPORT_INTRO", "extractive_report"]

REPORT_INTRO = "The community around "
MAX_FINDINGS = 8
EXPLANATION_CHARS = 500


def _join_names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _first_sentence(text: str) -> str:
    """The first sentence of `text` that is not a builtin report's own introduction."""
    return next((s for s in split_sentences(text) if not s.startswith(REPORT_INTRO)), "")


def extractive_report(ctx: ReportContext, max_tokens: int, tokenizer: Tokenizer) -> ReportOut:
    """A community report assembled from its context: title from the best-connected entities,
    summary from sub-report summaries and top entity descriptions, findings one per heavy
    relationship, top entity, sub-report or claim (ids index into `ctx`), all within
    `max_tokens`. The rating only measures size: nothing here judges impact."""
    count = tokenizer.count
    ents, rels, subs = ctx.entities, ctx.relationships, ctx.sub_reports
    degree = [ctx.degrees.get(e.id, e.degree) for e in ents]
    by_degree = sorted(range(len(ents)), key=lambda i: (-degree[i], i))
    index = {e.id: i for i, e in enumerate(ents)}
    names = {e.id: e.name for e in ents}
    if ents:
        title = _join_names([ents[i].name for i in by_degree[:3]])
        intro = f"{REPORT_INTRO}{title} has {len(ents)} entities and {len(rels)} relationships"
        intro += f" and draws on {len(subs)} sub-community reports." if subs else "."
    elif subs:
        title = "; ".join(r.title for r in subs[:2])
        title += f" (+{len(subs) - 2} more)" if len(subs) > 2 else ""
        intro = f"{REPORT_INTRO}{title} combines {len(subs)} sub-communities."
    else:
        title = f"Community {ctx.community_id}"
        intro = f"{title} has no entities."
    sentences = [intro] + [_first_sentence(r.summary) for r in subs[:2]]
    sentences += [_first_sentence(ents[i].description) for i in by_degree[: 4 - len(sentences)]]
    summary = " ".join(dict.fromkeys(s for s in sentences if s))

    total_degree = sum(degree)
    size = len(ents) + total_degree / 2 + sum(r.rating for r in subs)
    rating = round(min(10.0, 1.5 * math.log2(1 + size)), 1)
    parts = f"{len(ents)} entities, {len(rels)} relationships, total degree {total_degree}"
    parts += f", {len(subs)} sub-reports" if subs else ""
    explanation = (f"Heuristic rating from community size ({parts}); "
                   "the builtin provider does not assess impact.")

    def endpoint_degree(j: int) -> int:
        return sum(degree[index[x]] for x in (rels[j].source, rels[j].target) if x in index)

    def text(value: str, fallback: str) -> str:
        return trim(value, EXPLANATION_CHARS) or fallback

    rel_f = []
    heaviest = sorted(range(len(rels)), key=lambda j: (-rels[j].weight, -endpoint_degree(j), j))
    for j in heaviest[:MAX_FINDINGS]:
        r = rels[j]
        a, b = names.get(r.source, r.source), names.get(r.target, r.target)
        rel_f.append(FindingOut(
            summary=f"{a} — {b}", explanation=text(r.description, f"{a} relates to {b}."),
            entity_ids=[index[x] for x in (r.source, r.target) if x in index],
            relationship_ids=[j]))
    ent_f = [FindingOut(summary=ents[i].name, entity_ids=[i],
                        explanation=text(ents[i].description, f"{ents[i].name} ({ents[i].type})."))
             for i in by_degree[:MAX_FINDINGS]]
    sub_f = [FindingOut(summary=r.title, explanation=text(r.summary, r.title), report_ids=[k])
             for k, r in enumerate(subs[:3])]
    claim_f = [FindingOut(summary=f"{names.get(c.subject, c.subject)} — {c.type} ({c.status})",
                          explanation=trim(c.description, EXPLANATION_CHARS),
                          entity_ids=[index[c.subject]] if c.subject in index else [])
               for c in ctx.claims[:2]]
    candidates = sub_f + rel_f[:3] + ent_f[:3] + claim_f[:1] + rel_f[3:] + ent_f[3:] + claim_f[1:]

    used = count(title) + count(summary) + count(explanation) + 16
    if used > max_tokens:
        summary = tokenizer.truncate(summary, max(0, max_tokens - (used - count(summary))))
        used = max_tokens
    findings: list[FindingOut] = []
    for f in candidates:
        cost = count(f.summary) + count(f.explanation) + 12
        if len(findings) < MAX_FINDINGS and used + cost <= max_tokens:
            findings.append(f)
            used += cost
    return ReportOut(title=title, summary=summary, rating=rating, rating_explanation=explanation,
                     findings=findings)
