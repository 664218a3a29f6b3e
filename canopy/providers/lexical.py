"""Lexical relevance for the builtin provider's query-time tasks (rate, map, answer, drift).

Terms are lowercase words without stopwords, lightly stemmed (-s, -es, -ies, -ed, -ing), and
jieba words for Chinese. A text's relevance to a query is the idf-weighted share of the query's
terms it contains: 0 when it shares none, 1 when it has them all.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from canopy.providers import lexicon as lx
from canopy.providers.heuristics import has_cjk, load_jieba

__all__ = ["Scorer", "terms"]

_LAT_WORD = re.compile(r"[a-z0-9à-öø-ÿ]+(?:['’][a-z]+)?")
_CJK_RUN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def _stem(w: str) -> str:
    if w.endswith(("'s", "’s")):
        w = w[:-2]
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith("es") and (w[-3] in "sxz" or w[-4:-2] in ("ch", "sh")):
        return w[:-2]
    if len(w) > 4 and w.endswith("ed"):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def terms(text: str) -> list[str]:
    """Search terms of `text`, in order (repeats kept)."""
    low = text.lower()
    out = [_stem(w) for w in _LAT_WORD.findall(low)
           if w not in lx.STOPWORDS and (len(w) > 1 or w.isdigit())]
    if has_cjk(low):
        cut = load_jieba().cut
        for run in _CJK_RUN.findall(low):
            out += [w for w in cut(run) if len(w) > 1 and w not in lx.STOPWORDS_ZH]
    return out


_GENERIC = frozenset(_stem(w) for w in lx.GENERIC_QUERY_WORDS)


class Scorer:
    """Relevance of texts to one query, 0..1.

    Words such as "main", "themes" or "overview" weigh a quarter of a content word; a query
    made only of them is `generic` ("what are the main themes?"): it is about everything, so
    `score` is 0 and callers rank by importance instead."""

    def __init__(self, query: str, corpus: Sequence[str | set[str]] = ()) -> None:
        """`corpus` (texts or their term sets) gives the idf weights; with fewer than three
        texts every query term weighs the same."""
        self.query_terms = list(dict.fromkeys(terms(query)))
        self.generic = all(t in _GENERIC for t in self.query_terms)
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
