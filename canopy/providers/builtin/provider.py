"""The builtin offline provider: heuristics and extractive text in the LLM path's schemas.

Used when no endpoint is configured (design §7), so indexing and every query engine run with no
network and no keys. Nothing here generates language: extraction finds name-like phrases
(canopy.providers.builtin.extraction), summaries, reports and answers are assembled from
sentences of the inputs, and relevance is lexical (canopy.providers.builtin.relevance.Scorer).
Deterministic: same inputs, same outputs, ties broken by position. `usage()` counts calls per
task with zero tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from canopy.ids import normalize_name
from canopy.model import Extraction, Report, TextUnit
from canopy.providers.base import (
    ContextBlock,
    DriftOut,
    MapOut,
    MapPoint,
    ReportContext,
    ReportOut,
    Usage,
    record_usage,
)
from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.extraction import extract_unit
from canopy.providers.builtin.extractive_reports import REPORT_INTRO, extractive_report
from canopy.providers.builtin.mentions import find_mentions
from canopy.providers.builtin.relevance import Scorer, importance, report_fields
from canopy.providers.builtin.summaries import summarize_descriptions
from canopy.providers.builtin.text import split_sentences, terms, trim
from canopy.tokenizer import get_tokenizer

if TYPE_CHECKING:  # imported where used: worker processes serve large builds only
    from canopy.providers.builtin.processes import ProcessDescriber, WorkerPool

__all__ = ["NO_INFORMATION", "BuiltinProvider"]

NO_INFORMATION = "No relevant information was found in the index for this question."
MAX_ANSWER_SENTENCES = 8
MAX_REDUCE_POINTS = 12
MAX_FOLLOW_UPS = 5


class BuiltinProvider:
    """`Provider` with no model: see the module docstring for what each task does."""

    name = "builtin"
    # Part of the extraction fingerprint: raise it when the extraction rules or word lists change,
    # so that the next `canopy index` extracts every unit again (cheap here) instead of keeping
    # what the old rules found. 2: word lists without corpus-fitted names, rules for unknown names;
    # 3: a level-one heading names the entity its section is about; 4: a person's initials stay
    # in the name ("H.P. Lovecraft", "George A. Romero") and end no sentence.
    extraction_version = "4"
    # Its calls compute in this process and return without waiting: nothing to overlap them
    # with (the merge writes its rows in one go; canopy.indexer.stages.graph._streams).
    in_process = True

    def __init__(self, *, encoding: str = "o200k_base") -> None:
        self._tokenizer = get_tokenizer(encoding)
        self._usage: dict[str, Usage] = {}
        self._lock = threading.Lock()

    def _count(self, task: str) -> None:
        with self._lock:
            self._usage.setdefault(task, Usage()).calls += 1
        record_usage(task, calls=1)

    def describer(self, pool: WorkerPool) -> ProcessDescriber:
        """Its summaries of merged elements computed by worker processes (a large merge:
        canopy.indexer.stages.graph), counted here as `summarize` calls."""
        from canopy.providers.builtin.processes import ProcessDescriber

        return ProcessDescriber(pool, self._count, self._tokenizer.name)

    def usage(self) -> dict[str, Usage]:
        with self._lock:
            return {task: replace(u) for task, u in sorted(self._usage.items())}

    def concurrency(self) -> None:
        return None  # no endpoint, nothing in flight

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
        return extractive_report(context, max_tokens, self._tokenizer)

    # ---- query time -------------------------------------------------------------------------

    async def rate(self, query: str, reports: list[Report]) -> list[int]:
        """0-10 each, from the question's content words alone (relevance.content_terms: no
        stop words, function words or scaffolding): the share of them the report holds, each
        weighing the same (a report that holds one word of a topic may hold the topic below
        it: its children are rated next). It reads whole reports, not digests: lexical
        matching needs the words, and costs nothing here. A question with no content words
        ("what are the main themes across these articles?") is about the whole collection: its
        answer is the top-level communities, each rated by its own rating, and the communities
        below them are rated 0, so dynamic selection stays at the top."""
        self._count("rate")
        scorer = Scorer(query, content_only=True)
        if scorer.generic:
            return [max(1, min(10, round(r.rating))) if r.level == 0 else 0 for r in reports]
        out = []
        for r in reports:
            cov = scorer.score(report_fields(r).all)
            out.append(max(1, round(10 * cov)) if cov > 0 else 0)
        return out

    async def map(self, query: str, reports: list[Report], *, response_type: str) -> MapOut:
        """One point per report that holds the question's content words: its two sentences
        that match them best, cited, scored by how much the report is about them (where they
        stand in it, how much of it they fill, relevance.Scorer.about) and by its importance
        (rating and coverage). A question with no content words gets each report's leading
        sentences, scored by importance alone. No point is ever chosen for a stop word, a
        function word or the question's scaffolding."""
        self._count("map")
        per_report: list[list[tuple[str, set[str]]]] = []
        for r in reports:
            title = set(terms(r.title))
            items = [(s, set(terms(s)) | title) for s in split_sentences(r.summary)]
            for f in r.findings:
                head = set(terms(f.summary))
                items += [(s, set(terms(s)) | head) for s in split_sentences(f.explanation)]
            seen: set[str] = set()  # summaries and findings often repeat a sentence
            kept = []
            for it in items:
                if it[0] not in seen:
                    seen.add(it[0])
                    kept.append(it)
            per_report.append(kept)
        # Every content word weighs the same here: these reports were chosen for holding the
        # question's words, so how often a word occurs among them says nothing of its weight.
        scorer = Scorer(query, content_only=True)
        points: list[MapPoint] = []
        for r, items in zip(reports, per_report, strict=True):
            cite = f" [Data: Reports ({r.community_id})]"
            weight = importance(r)
            if scorer.generic:
                lead = [s for s, _ in items if not s.startswith(REPORT_INTRO)][:2] or [r.title]
                points.append(MapPoint(description=trim(" ".join(lead), 600) + cite,
                                       score=max(1, min(100, round(10 + 90 * weight))),
                                       report_ids=[r.community_id]))
                continue
            about = scorer.about(report_fields(r))
            scored = sorted((-scorer.score(t), i) for i, (_, t) in enumerate(items))
            best = [(-neg, i) for neg, i in scored[:2] if neg < 0]
            if about == 0 or not best:
                continue
            text = " ".join(items[i][0] for _, i in sorted(best, key=lambda x: x[1]))
            fit = 0.5 * best[0][0] + 0.5 * about
            score = max(1, min(100, round(100 * fit * (0.7 + 0.3 * weight))))
            points.append(MapPoint(description=trim(text, 600) + cite, score=score,
                                   report_ids=[r.community_id]))
        return MapOut(points=points)

    async def reduce(self, query: str, points: list[MapPoint], *, response_type: str) -> str:
        """The best points, highest score first, as a cited bullet list."""
        self._count("reduce")
        good = sorted((p for p in points if p.score > 0), key=lambda p: (-p.score, p.description))
        if not good:
            return NO_INFORMATION
        lines: list[str] = []
        for p in good:
            for line in _bullets(p.description):
                if line not in lines:
                    lines.append(line)
        head = ("Extractive answer (builtin provider, no language model): the most relevant "
                "points, best first.")
        return head + "\n\n" + "\n".join(lines[:MAX_REDUCE_POINTS])

    async def answer(self, query: str, blocks: list[ContextBlock], *, response_type: str) -> str:
        self._count("answer")
        return self._answer(query, blocks)[0]

    def _answer(self, query: str, blocks: Sequence[ContextBlock]) -> tuple[str, int]:
        """The extractive answer and a 0-100 score of how well it covers the query.

        The blocks come in the engine's order, best first: the answer takes, from each block in
        that order, its sentence that best matches the question (none from a block that shares
        no term with it), up to MAX_ANSWER_SENTENCES; so it follows the ranking, and a
        lower-ranked block never displaces a better one by sharing more words. A question about
        the whole collection ("the main themes") takes each block's first sentence."""
        items: list[tuple[int, str, set[str], set[str]]] = []
        for bi, b in enumerate(blocks):
            head = set(terms(b.title)) if b.kind != "text_unit" else set()
            for s in split_sentences(b.text) or ([b.title] if b.title else []):
                items.append((bi, s, set(terms(s)), head))
        scorer = Scorer(query, [t for _, _, t, _ in items])
        best_of: dict[int, tuple[float, int]] = {}  # block -> (score, item) of its best sentence
        for i, (bi, _, t, h) in enumerate(items):
            # the block title (an entity's name) counts, the sentence's own words count more
            sc = 1.0 if scorer.generic else 0.7 * scorer.score(t | h) + 0.3 * scorer.score(t)
            if sc > 0 and (bi not in best_of or sc > best_of[bi][0]):
                best_of[bi] = (sc, i)
        chosen: list[int] = []
        seen: set[str] = set()
        for bi in sorted(best_of):
            i = best_of[bi][1]
            key = normalize_name(items[i][1])
            if key in seen:
                continue
            seen.add(key)
            chosen.append(i)
            if len(chosen) >= MAX_ANSWER_SENTENCES:
                break
        if not chosen:
            return NO_INFORMATION, 0
        if scorer.generic:
            score = 30
        else:
            union = set().union(*(items[i][2] | items[i][3] for i in chosen))
            best = max(sc for sc, _ in best_of.values())
            score = round(100 * (0.5 * scorer.score(union) + 0.5 * best))
        lines = [f"- {trim(items[i][1], 400)} [{blocks[items[i][0]].kind} {blocks[items[i][0]].id}]"
                 for i in chosen]
        intro = ("Extractive answer (builtin provider, no language model): the best-matching "
                 "sentence of each of the top-ranked passages, best first.")
        return intro + "\n\n" + "\n".join(lines), max(0, min(100, score))

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

    async def route(self, query: str, names: list[str]) -> None:
        """No judgement of its own: the router's offline rules (server/engines/router.py)
        classify the question from the index and its wording."""
        return None


def _subject(query: str) -> str:
    """What a query is about: its first name-like phrase, else its content words."""
    for m in find_mentions(query):
        if m.name.lower() not in lx.STOPWORDS and not m.initial:
            return m.name
    words = [w.strip("?!.,;:\"'()") for w in query.split()]
    skip = lx.STOPWORDS | lx.GENERIC_QUERY_WORDS
    content = [w for w in words if w and w.lower() not in skip]
    return " ".join(content[:6])


def _bullets(description: str) -> list[str]:
    """A map point as bullet lines; a point that is itself an extractive answer (DRIFT's
    intermediate answers) contributes its bullets without its header."""
    if description.startswith("Extractive answer") and "\n\n" in description:
        description = description.split("\n\n", 1)[1]
    lines = [ln.strip() for ln in description.splitlines() if ln.strip()]
    if lines and all(ln.startswith("- ") for ln in lines):
        return lines
    return [f"- {description.strip()}"]
