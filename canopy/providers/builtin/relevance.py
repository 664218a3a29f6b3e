"""Lexical relevance for the builtin provider's query-time tasks (rate, map, answer, drift).

A text's relevance to a query is the idf-weighted share of the query's terms
(canopy.providers.builtin.text.terms) it contains: 0 when it shares none, 1 when it has them all.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.text import stem, terms

__all__ = ["Scorer", "is_generic"]

_GENERIC = frozenset(stem(w) for w in lx.GENERIC_QUERY_WORDS)


def _generic(query_terms: Sequence[str]) -> bool:
    # "the top 5 topics": a count says how much to list, not what about
    return all(t in _GENERIC or t.isdigit() for t in query_terms)


def is_generic(query: str) -> bool:
    """True for a question about the collection as a whole, made only of words such as "main",
    "themes", "overview" or "documents" (and counts: "the top 5 topics"): it names nothing to
    look for, so everything is relevant in proportion to its importance. The one definition of
    such a question: the builtin provider's ratings and the `search` router both use it."""
    return _generic(terms(query))


class Scorer:
    """Relevance of texts to one query, 0..1.

    Words such as "main", "themes" or "overview" weigh a quarter of a content word; a query
    made only of them is `generic` ("what are the main themes?"): it is about everything, so
    `score` is 0 and callers rank by importance instead."""

    def __init__(self, query: str, corpus: Sequence[str | set[str]] = ()) -> None:
        """`corpus` (texts or their term sets) gives the idf weights; with fewer than three
        texts every query term weighs the same."""
        self.query_terms = list(dict.fromkeys(terms(query)))
        self.generic = _generic(self.query_terms)  # see is_generic
        sets = [d if isinstance(d, set) else set(terms(d)) for d in corpus]
        wanted = set(self.query_terms)
        df = Counter(t for s in sets for t in s & wanted)
        n = len(sets)
        self.weights: dict[str, float] = {}
        for t in self.query_terms:
            idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5)) if n >= 3 else 1.0
            self.weights[t] = idf * (0.25 if t in _GENERIC and not self.generic else 1.0)
        self._total = sum(self.weights.values())

    def score(self, text: str | set[str]) -> float:
        """The weighted share of query terms found in `text` (a string or its term set)."""
        if not self._total or self.generic:
            return 0.0
        found = text if isinstance(text, set) else set(terms(text))
        return sum(w for t, w in self.weights.items() if t in found) / self._total
