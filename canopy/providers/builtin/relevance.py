"""Lexical relevance for the builtin provider's query-time tasks (rate, map, answer, drift).

A text's relevance to a query is the idf-weighted share of the query's terms
(canopy.providers.builtin.text.terms) it contains: 0 when it shares none, 1 when it has them all.
A query's function words (lexicon.FUNCTION_WORDS: "across", "within", "several") are never among
them, like its stop words. Global search reads a question's content words alone
(`content_terms`: no scaffolding such as "main", "themes" or "documents" either), and scores a
community report by what it is about (`Scorer.about`: where in the report each content word
stands) and by its importance (`importance`: its rating and how much of the corpus it covers).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from canopy.model import Report
from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.text import terms

__all__ = ["ReportFields", "Scorer", "content_terms", "importance", "is_generic",
           "report_fields"]


def _terms_of(words: frozenset[str]) -> frozenset[str]:
    # through the same analysis as a query, so that a word and its plural meet
    return frozenset(t for w in words for t in terms(w))


_GENERIC = _terms_of(lx.GENERIC_QUERY_WORDS)
_FUNCTION = _terms_of(lx.FUNCTION_WORDS)

# Where a content word stands in a report, and how much that says the report is about it.
FIELD_WEIGHTS = {"title": 1.0, "summary": 0.8, "headlines": 0.7, "body": 0.5}
# Text units at which a report counts as covering a full share of the corpus for `importance`.
BROAD_UNITS = 64


def content_terms(query: str) -> list[str]:
    """The terms that say what a question is about, in order, once each: its terms without
    function words (lexicon.FUNCTION_WORDS), the scaffolding of questions about a collection
    (lexicon.GENERIC_QUERY_WORDS: "main", "themes", "overview", "documents") and counts ("the
    top 5"). Stop words are never terms."""
    return list(dict.fromkeys(t for t in terms(query)
                              if t not in _GENERIC and t not in _FUNCTION and not t.isdigit()))


def is_generic(query: str) -> bool:
    """True for a question about the collection as a whole: it has no content terms ("What are
    the main themes across these articles?", "the top 5 topics"), so it names nothing to look
    for and everything is relevant in proportion to its importance. The one definition of such a
    question: the builtin provider's tasks and the `search` router both use it."""
    return not content_terms(query)


@dataclass(frozen=True)
class ReportFields:
    """A report's terms by where they stand (FIELD_WEIGHTS), and per part (its summary, each
    finding) for how much of the report a topic fills."""

    title: frozenset[str]
    summary: frozenset[str]
    headlines: frozenset[str]
    body: frozenset[str]
    parts: tuple[frozenset[str], ...]

    @property
    def all(self) -> frozenset[str]:
        return self.title | self.summary | self.headlines | self.body


def report_fields(report: Report) -> ReportFields:
    summary = frozenset(terms(report.summary))
    heads = [frozenset(terms(f.summary)) for f in report.findings]
    bodies = [frozenset(terms(f.explanation)) for f in report.findings]
    return ReportFields(title=frozenset(terms(report.title)), summary=summary,
                        headlines=frozenset().union(*heads), body=frozenset().union(*bodies),
                        parts=(summary, *(h | b for h, b in zip(heads, bodies, strict=True))))


def importance(report: Report) -> float:
    """0..1: half its rating (the builtin rating measures size), half the share of the corpus
    it covers, counted in text units on a log scale up to BROAD_UNITS."""
    covered = math.log2(1 + len(report.text_unit_ids)) / math.log2(1 + BROAD_UNITS)
    return 0.5 * min(10.0, max(0.0, report.rating)) / 10 + 0.5 * min(1.0, covered)


class Scorer:
    """Relevance of texts to one query, 0..1.

    Words such as "main", "themes" or "overview" weigh a quarter of a content word
    (`content_only`: nothing); a query without content terms is `generic` ("what are the main
    themes?"): it is about everything, so `score` is 0 and callers rank by importance instead."""

    def __init__(self, query: str, corpus: Sequence[str | set[str] | frozenset[str]] = (), *,
                 content_only: bool = False) -> None:
        """`corpus` (texts or their term sets) gives the idf weights; with fewer than three
        texts every query term weighs the same."""
        asked = content_terms(query) if content_only else [
            t for t in dict.fromkeys(terms(query)) if t not in _FUNCTION]
        self.query_terms = asked
        self.generic = is_generic(query)
        sets = [d if isinstance(d, (set, frozenset)) else set(terms(d)) for d in corpus]
        wanted = set(self.query_terms)
        df = Counter(t for s in sets for t in s & wanted)
        n = len(sets)
        self.weights: dict[str, float] = {}
        for t in self.query_terms:
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) if n >= 3 else 1.0
            self.weights[t] = idf * (0.25 if t in _GENERIC and not self.generic else 1.0)
        self._total = sum(self.weights.values())

    def score(self, text: str | set[str] | frozenset[str]) -> float:
        """The weighted share of query terms found in `text` (a string or its term set)."""
        if not self._total or self.generic:
            return 0.0
        found = text if isinstance(text, (set, frozenset)) else set(terms(text))
        return sum(w for t, w in self.weights.items() if t in found) / self._total

    def about(self, fields: ReportFields) -> float:
        """How much a report is about the query, 0..1: each query term counts by the most
        prominent place it holds (title, summary, a finding's headline, a finding's text:
        FIELD_WEIGHTS), and a fifth of the score is the share of the report's parts that
        mention the query at all."""
        if not self._total or self.generic:
            return 0.0
        placed = 0.0
        for t, w in self.weights.items():
            placed += w * max((FIELD_WEIGHTS[name] for name in FIELD_WEIGHTS
                               if t in getattr(fields, name)), default=0.0)
        wanted = set(self.weights)
        filled = sum(1 for p in fields.parts if p & wanted) / max(1, len(fields.parts))
        return 0.8 * placed / self._total + 0.2 * filled
