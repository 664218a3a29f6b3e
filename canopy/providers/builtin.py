"""The builtin offline provider: heuristics and extractive text in the LLM path's schemas.

Used when no endpoint is configured (design §7), so indexing and every query engine run with no
network and no keys. Nothing here generates language: extraction finds name-like phrases
(canopy.providers.extractive), reports and answers are assembled from sentences of the inputs,
and relevance is lexical (canopy.providers.heuristics.Scorer). Deterministic: same inputs, same
outputs, ties broken by position. `usage()` counts calls per task with zero tokens.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace

from canopy.ids import normalize_name
from canopy.model import Extraction, Report, TextUnit
from canopy.providers import lexicon as lx
from canopy.providers.base import (
    ContextBlock,
    DriftOut,
    FindingOut,
    MapOut,
    MapPoint,
    ReportContext,
    ReportOut,
    Usage,
)
from canopy.providers.extractive import extract_unit, summarize_descriptions
from canopy.providers.heuristics import Scorer, find_mentions, split_sentences, terms, trim
from canopy.tokens import get_tokenizer

__all__ = ["NO_INFORMATION", "BuiltinProvider"]

NO_INFORMATION = "No relevant information was found in the index for this question."
MAX_FINDINGS = 8
MAX_ANSWER_SENTENCES = 8
MAX_REDUCE_POINTS = 12
MAX_FOLLOW_UPS = 5
_INTRO = "The community around "


def _join_names(names: Sequence[str]) -> str:
    if len(names) <= 1:
        return "".join(names)
    return ", ".join(names[:-1]) + " and " + names[-1]


def _first_sentence(text: str, *, skip_intro: bool = False) -> str:
    for s in split_sentences(text):
        if not (skip_intro and s.startswith(_INTRO)):
            return s
    return ""


class BuiltinProvider:
    """`Provider` with no model: see the module docstring for what each task does."""

    name = "builtin"

    def __init__(self, *, encoding: str = "o200k_base") -> None:
        self._tokenizer = get_tokenizer(encoding)
        self._usage: dict[str, Usage] = {}
        self._lock = threading.Lock()

    def _count(self, task: str) -> None:
        with self._lock:
            self._usage.setdefault(task, Usage()).calls += 1

    def usage(self) -> dict[str, Usage]:
        with self._lock:
            return {task: replace(u) for task, u in sorted(self._usage.items())}

    # ---- indexing ---------------------------------------------------------------------------

    async def extract(self, unit: TextUnit, *, entity_types: list[str], claims: bool,
                      max_gleanings: int) -> Extraction:
        """Heuristic extraction in one pass; `max_gleanings` is ignored (a second pass of the
        same rules would find nothing new)."""
        self._count("extract")
        return extract_unit(unit, entity_types=entity_types, claims=claims)

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        self._count("summarize")
        return summarize_descriptions(descriptions, max_tokens, self._tokenizer)

    async def report(self, context: ReportContext, *, max_tokens: int) -> ReportOut:
        self._count("report")
        return self._report(context, max_tokens)

    def _report(self, ctx: ReportContext, max_tokens: int) -> ReportOut:
        count = self._tokenizer.count
        ents, rels, subs = ctx.entities, ctx.relationships, ctx.sub_reports
        degree = [ctx.degrees.get(e.id, e.degree) for e in ents]
        by_degree = sorted(range(len(ents)), key=lambda i: (-degree[i], i))
        index = {e.id: i for i, e in enumerate(ents)}
        names = {e.id: e.name for e in ents}
        top = [ents[i].name for i in by_degree[:3]]
        title = _join_names(top) or (subs[0].title if subs else f"Community {ctx.community_id}")

        intro = f"{_INTRO}{title} has {len(ents)} entities and {len(rels)} relationships"
        intro += f" and draws on {len(subs)} sub-community reports." if subs else "."
        sentences = [intro]
        for r in subs[:2]:
            sentences.append(_first_sentence(r.summary, skip_intro=True))
        for i in by_degree:
            if len(sentences) >= 4:
                break
            sentences.append(_first_sentence(ents[i].description))
        summary = " ".join(dict.fromkeys(s for s in sentences if s))

        total_degree = sum(degree)
        size = len(ents) + total_degree / 2 + sum(r.rating for r in subs)
        rating = round(min(10.0, 1.5 * math.log2(1 + size)), 1)
        explanation = (
            f"Heuristic rating from community size ({len(ents)} entities, {len(rels)} relationships, "
            f"total degree {total_degree}" + (f", {len(subs)} sub-reports" if subs else "")
            + "); the builtin provider does not assess impact."
        )

        def rel_finding(j: int) -> FindingOut:
            r = rels[j]
            a, b = names.get(r.source, r.source), names.get(r.target, r.target)
            ids = [index[x] for x in (r.source, r.target) if x in index]
            return FindingOut(summary=f"{a} — {b}", explanation=trim(r.description, 500) or f"{a} relates to {b}.",
                              entity_ids=ids, relationship_ids=[j])

        def ent_finding(i: int) -> FindingOut:
            e = ents[i]
            return FindingOut(summary=e.name, explanation=trim(e.description, 500) or f"{e.name} ({e.type}).",
                              entity_ids=[i])

        rel_order = sorted(range(len(rels)), key=lambda j: (
            -rels[j].weight, -(degree[index[rels[j].source]] if rels[j].source in index else 0)
            - (degree[index[rels[j].target]] if rels[j].target in index else 0), j))
        sub_f = [FindingOut(summary=r.title, explanation=trim(r.summary, 500), report_ids=[k])
                 for k, r in enumerate(subs[:3])]
        rel_f = [rel_finding(j) for j in rel_order[:MAX_FINDINGS]]
        ent_f = [ent_finding(i) for i in by_degree[:MAX_FINDINGS]]
        claim_f = [FindingOut(summary=f"{names.get(c.subject, c.subject)} — {c.type} ({c.status})",
                              explanation=trim(c.description, 500),
                              entity_ids=[index[c.subject]] if c.subject in index else [])
                   for c in ctx.claims[:2]]
        candidates = sub_f + rel_f[:3] + ent_f[:3] + claim_f[:1] + rel_f[3:] + ent_f[3:] + claim_f[1:]

        used = count(title) + count(summary) + count(explanation) + 16
        if used > max_tokens:
            summary = self._tokenizer.truncate(summary, max(0, max_tokens - count(title) - count(explanation) - 16))
            used = max_tokens
        findings: list[FindingOut] = []
        for f in candidates:
            if len(findings) >= MAX_FINDINGS:
                break
            cost = count(f.summary) + count(f.explanation) + 12
            if used + cost <= max_tokens:
                findings.append(f)
                used += cost
        return ReportOut(title=title, summary=summary, rating=rating, rating_explanation=explanation,
                         findings=findings)

    # ---- query time -------------------------------------------------------------------------

    async def rate(self, query: str, report: Report) -> int:
        """0-10: the share of the query's terms found in the report (its own rating for a
        generic question such as "what are the main themes?")."""
        self._count("rate")
        scorer = Scorer(query)
        if scorer.generic:
            return max(1, min(10, round(report.rating)))
        cov = scorer.score(report.full_text())
        return max(1, round(10 * cov)) if cov > 0 else 0

    async def map(self, query: str, reports: list[Report], *, response_type: str) -> MapOut:
        """One point per report that shares terms with the query: its best sentences, cited."""
        self._count("map")
        per_report: list[list[tuple[str, set[str]]]] = []
        for r in reports:
            items = [(s, set(terms(s)) | set(terms(r.title))) for s in split_sentences(r.summary)]
            for f in r.findings:
                head = set(terms(f.summary))
                items += [(s, set(terms(s)) | head) for s in split_sentences(f.explanation)]
            per_report.append(items)
        scorer = Scorer(query, [t for items in per_report for _, t in items])
        points: list[MapPoint] = []
        for r, items in zip(reports, per_report):
            cite = f" [Data: Reports ({r.community_id})]"
            if scorer.generic:
                lead = [s for s, _ in items if not s.startswith(_INTRO)][:2] or [r.title]
                points.append(MapPoint(description=trim(" ".join(lead), 600) + cite,
                                       score=max(1, min(100, round(10 + 8 * r.rating))),
                                       report_ids=[r.community_id]))
                continue
            covered = scorer.score(set().union(*(t for _, t in items))) if items else 0.0
            scored = sorted(((scorer.score(t), i) for i, (_, t) in enumerate(items)), key=lambda x: (-x[0], x[1]))
            best = [(sc, i) for sc, i in scored[:2] if sc > 0]
            if covered == 0 or not best:
                continue
            text = " ".join(items[i][0] for _, i in sorted(best, key=lambda x: x[1]))
            score = max(1, min(100, round(100 * (0.6 * best[0][0] + 0.4 * covered))))
            points.append(MapPoint(description=trim(text, 600) + cite, score=score, report_ids=[r.community_id]))
        return MapOut(points=points)

    async def reduce(self, query: str, points: list[MapPoint], *, response_type: str) -> str:
        """The best points, highest score first, as a cited bullet list."""
        self._count("reduce")
        good = sorted((p for p in points if p.score > 0), key=lambda p: (-p.score, p.description))
        if not good:
            return NO_INFORMATION
        lines = [f"- {p.description}" for p in good[:MAX_REDUCE_POINTS]]
        head = ("Extractive answer (builtin provider, no language model): the most relevant points "
                "from the community reports, best first.")
        return head + "\n\n" + "\n".join(lines)

    async def answer(self, query: str, blocks: list[ContextBlock], *, response_type: str) -> str:
        self._count("answer")
        return self._answer(query, blocks)[0]

    def _answer(self, query: str, blocks: Sequence[ContextBlock]) -> tuple[str, int]:
        """The extractive answer and a 0-100 score of how well it covers the query."""
        items: list[tuple[int, str, set[str], set[str]]] = []
        for bi, b in enumerate(blocks):
            head = set(terms(b.title)) if b.kind != "text_unit" else set()
            for s in split_sentences(b.text) or ([b.title] if b.title else []):
                items.append((bi, s, set(terms(s)), head))
        scorer = Scorer(query, [t for _, _, t, _ in items])
        if scorer.generic:
            firsts = list(dict.fromkeys(bi for bi, *_ in items))[:MAX_ANSWER_SENTENCES]
            chosen = [next(i for i, it in enumerate(items) if it[0] == bi) for bi in firsts]
            score = 30 if chosen else 0
        else:
            ranked = sorted(
                ((0.7 * scorer.score(t | h) + 0.3 * scorer.score(t), i) for i, (_, _, t, h) in enumerate(items)),
                key=lambda x: (-x[0], x[1]))
            chosen, seen = [], set()
            for sc, i in ranked:
                key = normalize_name(items[i][1])
                if sc <= 0 or len(chosen) >= MAX_ANSWER_SENTENCES:
                    break
                if key not in seen:
                    seen.add(key)
                    chosen.append(i)
            union = set().union(*(items[i][2] | items[i][3] for i in chosen)) if chosen else set()
            best = ranked[0][0] if ranked else 0.0
            score = round(100 * (0.5 * scorer.score(union) + 0.5 * best)) if chosen else 0
        if not chosen:
            return NO_INFORMATION, 0
        lines = [f"- {trim(items[i][1], 400)} [{blocks[items[i][0]].kind} {blocks[items[i][0]].id}]"
                 for i in chosen]
        head = "Extractive answer (builtin provider, no language model): the most relevant passages, best first."
        return head + "\n\n" + "\n".join(lines), max(0, min(100, score))

    async def hyde(self, query: str) -> str:
        """The query itself: with no generative model there is no hypothetical answer to write,
        and a lexical or hashed-embedding match on the query is what the primer can use."""
        self._count("hyde")
        return query

    async def drift(self, query: str, blocks: list[ContextBlock]) -> DriftOut:
        """Intermediate extractive answer, its coverage score and follow-up questions about the
        entities and communities in the context that the query does not already name."""
        self._count("drift")
        answer, score = self._answer(query, blocks)
        subject = _subject(query)
        asked = set(terms(query))
        follow: list[str] = []
        seen: set[str] = set()
        for b in blocks:
            if b.kind not in ("entity", "report") or not b.title.strip():
                continue
            title = " ".join(b.title.split())
            key = normalize_name(title)
            tt = set(terms(title))
            if key in seen or (tt and tt <= asked):
                continue
            seen.add(key)
            if not subject:
                follow.append(f"What is known about {title}?")
            elif b.kind == "entity":
                follow.append(f"What is the role of {title} in {subject}?")
            else:
                follow.append(f"What does the community of {title} reveal about {subject}?")
            if len(follow) >= MAX_FOLLOW_UPS:
                break
        return DriftOut(intermediate_answer=answer, score=score, follow_up_queries=follow)


def _subject(query: str) -> str:
    """What a query is about: its first name-like phrase, else its content words."""
    for m in find_mentions(query):
        if m.name.lower() not in lx.STOPWORDS and not m.initial:
            return m.name
    words = [w.strip("?!.,;:\"'()") for w in query.split()]
    content = [w for w in words if w and w.lower() not in lx.STOPWORDS and w.lower() not in lx.GENERIC_QUERY_WORDS]
    return " ".join(content[:6])
