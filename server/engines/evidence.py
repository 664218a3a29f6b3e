"""Which text units state the facts a question asks about: local_search's text-unit ranking.

Whole-unit BM25 favours units that mention many of a long question's words. A multi-hop
question ("Did the TechCrunch report on X and The Verge's article on Y both ...?") combines
facts that are each stated in one sentence of a different article, so a unit is scored by

    bm25(unit)                      over the question's terms (header + text, as indexed: the
                                    header is the document's title and front-matter metadata)
  + BIGRAM   * question bigrams     pairs of adjacent content words found in the unit
  + SENTENCE * best window          idf mass of question terms in its best two-sentence window
                                    (windows include the header: it is said of every sentence)
  + CLAUSE   * best clause          max over the question's clauses c of m_c**2 / M_c, where m_c
                                    is the idf mass of c's terms in the unit's best window and
                                    M_c that of the whole clause: one window stating one clause

The head of the ranking is then re-chosen greedily (cover_clauses): one unit per document, each
adding the most clause mass not yet matched, so that every clause of the question gets its unit.

Candidates are pooled from full-text search for the question and for each of its clauses,
vector search, and the units behind the graph items the caller passes (local search's entities
and relationships); every candidate is scored alike: a source adds candidates, not votes. With a
semantic embedder (an endpoint) the vector ranking is then fused in by reciprocal rank fusion;
the builtin embedder is lexical (signed feature hashing) and any weight of its ranking lowered
Hits@10, so it only contributes candidates. Weighting units by the entities the question names
(idf-weighted entity support) lowered Hits@10 too with the builtin (heuristic) graph, so the
graph contributes candidates, not score. Measured with benchmarks/retrieval_eval.py on the DEV
split of MultiHop-RAG; the weights below are not sensitive (+-0.005 Hits@10 over a grid).

Terms are canopy.providers.hashing.lexical_terms (stemmed words, CJK bigrams). Document
frequencies are counted over the view's units once per index generation, on first use; a unit's
sentence analysis is computed when it is first a candidate and kept (bounded).
"""

from __future__ import annotations

import math
import re
import threading
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise
from typing import TypeVar

import numpy as np

from canopy.providers.hashing import lexical_terms
from canopy.vectors import rrf
from server.service import QueryContext

__all__ = [
    "LEXICAL_VECTOR_WEIGHT",
    "UnitEvidence",
    "corpus_stats",
    "cover_clauses",
    "excerpt",
    "per_view",
    "rank_units",
    "split_clauses",
    "vector_weight",
]

T = TypeVar("T")

UNIT_POOL = 50  # full-text hits of the whole question
CLAUSE_POOL = 10  # full-text hits of each clause
VECTOR_POOL = 20  # vector hits of the whole question
MAX_CLAUSES = 8
BIGRAM = 1.0
SENTENCE = 1.0
CLAUSE = 2.0
WINDOW = 2  # sentences per window
COVER = 3.0  # weight of the clause mass a unit adds to those already covered (cover_clauses)
COVER_DOCS = 10
_K1, _B = 1.2, 0.75
# RRF weight of a lexical embedder's ranking against full-text search's (hybrid searches): with
# the builtin embedder, equal fusion loses 0.11 Hits@10 on MultiHop-RAG against BM25 alone, and
# 0.1 costs nothing while keeping vector-only rows (e.g. CJK text) after the full-text ones.
LEXICAL_VECTOR_WEIGHT = 0.1
_CACHE_UNITS = 50_000  # unit analyses kept per view

# Clause boundaries: punctuation, and conjunctions that join two separate statements.
_CLAUSE = re.compile(r"[,;:?!()\[\]]|\s(?:while|whereas|but|compared to|in contrast to)\s",
                     re.IGNORECASE)
_SENTENCE = re.compile(r"(?<=[.!?…。！？])[\"'”’)\]]*\s+|\s*\n\s*")


def split_clauses(query: str) -> list[str]:
    """The question's clauses that carry at least two content terms (at most MAX_CLAUSES)."""
    parts = [p.strip() for p in _CLAUSE.split(query)]
    out = [p for p in parts if len(set(lexical_terms(p))) >= 2]
    return out[:MAX_CLAUSES] if len(out) > 1 else []


@dataclass
class UnitEvidence:
    sentences: list[str]  # the unit's sentences (its text, not its title)
    sentence_terms: list[frozenset[str]]
    windows: list[frozenset[str]]  # terms of each run of WINDOW consecutive sentences + header
    tf: Counter[str]  # term counts of header + text
    bigrams: frozenset[tuple[str, str]]
    length: int  # terms of header + text
    sentence_tokens: list[int] | None = None  # tokens of each sentence, when first needed


class CorpusStats:
    """Which units each term occurs in, over one view's text units, so that a caller's idf
    weights count only the units that caller may read (design §5); and cached unit analyses."""

    def __init__(self, ctx: QueryContext) -> None:
        view = ctx.view
        self.order = list(view.units)
        postings: dict[str, list[int]] = {}
        lengths = np.zeros(len(self.order), dtype=np.float64)
        for i, uid in enumerate(self.order):
            doc = view.document_of(uid)
            terms = lexical_terms(f"{doc.header() if doc else ''}\n{view.units[uid].text}")
            lengths[i] = len(terms)
            for t in set(terms):
                postings.setdefault(t, []).append(i)
        self.postings = {t: np.asarray(ix, dtype=np.int32) for t, ix in postings.items()}
        self.lengths = lengths
        self._units: OrderedDict[str, UnitEvidence] = OrderedDict()
        self._lock = threading.Lock()
        self._mask: tuple[frozenset[str], np.ndarray] | None = None

    def _readable(self, ctx: QueryContext) -> np.ndarray:
        """Which units (in self.order) the caller may read; the last caller's is kept."""
        readable = ctx.vis.readable_units
        last = self._mask
        if last is not None and last[0] is readable:
            return last[1]
        mask = np.fromiter((u in readable for u in self.order), dtype=bool, count=len(self.order))
        self._mask = (readable, mask)
        return mask

    def weights(self, ctx: QueryContext, terms: Iterable[str]) -> tuple[dict[str, float], float]:
        """BM25 idf of each term over the units the caller may read, and their mean length."""
        mask = self._readable(ctx)
        n = int(mask.sum())
        avg = float(self.lengths[mask].sum()) / n if n else 1.0
        out = {}
        for t in dict.fromkeys(terms):
            ix = self.postings.get(t)
            df = int(mask[ix].sum()) if ix is not None else 0
            out[t] = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return out, avg or 1.0

    def unit(self, ctx: QueryContext, unit_id: str) -> UnitEvidence:
        with self._lock:
            hit = self._units.get(unit_id)
            if hit is not None:
                self._units.move_to_end(unit_id)
                return hit
        unit = ctx.view.units[unit_id]
        doc = ctx.view.document_of(unit_id)
        sentences = [s.strip() for s in _SENTENCE.split(unit.text) if s and s.strip()]
        terms = [lexical_terms(s) for s in sentences]
        head = lexical_terms(doc.header()) if doc else []
        flat = head + [t for ts in terms for t in ts]
        sets = [frozenset(ts) for ts in terms] or [frozenset()]
        # The header (title, source, date...) is said of every sentence: "the TechCrunch
        # article" plus a sentence's fact is one clause matched in one window.
        header = frozenset(head)
        windows = [frozenset().union(*sets[i:i + WINDOW]) | header
                   for i in range(max(1, len(sets) - WINDOW + 1))]
        bigrams = frozenset(p for ts in [head, *terms] for p in pairwise(ts))
        ev = UnitEvidence(sentences, sets, windows, Counter(flat), bigrams, len(flat))
        with self._lock:
            self._units[unit_id] = ev
            while len(self._units) > _CACHE_UNITS:
                self._units.popitem(last=False)
        return ev


_VIEWS: dict[tuple[int, str], tuple[weakref.ref, object]] = {}
_VIEWS_LOCK = threading.Lock()


def per_view(ctx: QueryContext, name: str, build: Callable[[], T]) -> T:
    """`build()` once per index view (generation) and name; dropped with the view."""
    key = (id(ctx.view), name)
    with _VIEWS_LOCK:
        entry = _VIEWS.get(key)
        if entry is not None and entry[0]() is ctx.view:
            return entry[1]  # type: ignore[return-value]
        for k in [k for k, (ref, _) in _VIEWS.items() if ref() is None]:
            del _VIEWS[k]
    value = build()
    with _VIEWS_LOCK:
        entry = _VIEWS.get(key)
        if entry is not None and entry[0]() is ctx.view:  # built concurrently: keep the first
            return entry[1]  # type: ignore[return-value]
        _VIEWS[key] = (weakref.ref(ctx.view), value)
    return value


def corpus_stats(ctx: QueryContext) -> CorpusStats:
    """The view's statistics, built on first use (about 0.7 s per 2,000 units)."""
    return per_view(ctx, "corpus_stats", lambda: CorpusStats(ctx))


class _Query:
    """A question's terms, bigrams and clauses, weighted for one caller."""

    def __init__(self, ctx: QueryContext, stats: CorpusStats, query: str) -> None:
        seq = lexical_terms(query)
        clauses = [lexical_terms(c) for c in split_clauses(query)]
        idf, self.avg_length = stats.weights(ctx, seq)
        self.weights = {t: idf[t] for t in dict.fromkeys(seq)}
        self.bigrams = set(pairwise(seq))
        self.clauses = [{t: idf[t] for t in dict.fromkeys(c) if t in idf} for c in clauses]

    @staticmethod
    def mass(terms: frozenset[str], weights: dict[str, float]) -> float:
        return sum(weights[t] for t in terms & weights.keys())

    def score(self, ev: UnitEvidence) -> tuple[float, list[float]]:
        """The unit's score, and the idf mass of each clause's terms in its best window."""
        norm = _K1 * (1 - _B + _B * ev.length / self.avg_length)
        bm25 = sum(w * tf * (_K1 + 1) / (tf + norm)
                   for t, w in self.weights.items() if (tf := ev.tf.get(t, 0)))
        bigrams = len(self.bigrams & ev.bigrams)
        matched = [win & self.weights.keys() for win in ev.windows]
        best = max(sum(self.weights[t] for t in m) for m in matched)
        clause = 0.0
        masses: list[float] = []
        for weights in self.clauses:
            total = sum(weights.values())
            m = max(sum(weights.get(t, 0.0) for t in terms) for terms in matched) if total else 0.0
            masses.append(m)
            if total > 0:
                clause = max(clause, m * m / total)
        return bm25 + BIGRAM * bigrams + SENTENCE * best + CLAUSE * clause, masses


def cover_clauses(ranked: list[str], scores: dict[str, float], masses: dict[str, list[float]],
                  document_of: Callable[[str], str], *, docs: int = COVER_DOCS) -> list[str]:
    """`ranked` with its head re-chosen greedily, one unit per document for `docs` documents:
    each pick maximises score + COVER * the clause mass it adds over the clauses' best matches
    so far. A question joining facts from several articles gets a unit for each clause before
    a second, slightly better match of a clause already covered."""
    if not ranked or not masses.get(ranked[0]):
        return ranked
    covered = [0.0] * len(masses[ranked[0]])
    position = {u: i for i, u in enumerate(ranked)}
    head: list[str] = []
    seen: set[str] = set()
    remaining = list(ranked)
    while remaining and len(head) < docs:
        best = max(remaining, key=lambda u: (
            scores[u] + COVER * sum(max(0.0, m - c) for m, c in zip(masses[u], covered, strict=True)),
            -position[u]))
        remaining.remove(best)
        doc = document_of(best)
        if doc in seen:
            continue
        seen.add(doc)
        head.append(best)
        covered = [max(m, c) for m, c in zip(masses[best], covered, strict=True)]
    chosen = set(head)
    return head + [u for u in ranked if u not in chosen]


def vector_weight(ctx: QueryContext) -> float:
    """The RRF weight of the vector ranking in a hybrid search: 1 for a semantic embedder."""
    return LEXICAL_VECTOR_WEIGHT if getattr(ctx.view.embedder, "lexical", False) else 1.0


def rank_units(ctx: QueryContext, query: str, vector: np.ndarray, *,
               support: Iterable[str] = ()) -> list[str]:
    """Ids of text units (the caller may see) that state what `query` asks, best first.

    `support`: more candidate units (e.g. those behind the entities the question names)."""
    hidden = list(ctx.vis.hidden_acl)
    search = ctx.view.vectors.search
    stats = corpus_stats(ctx)
    q = _Query(ctx, stats, query)
    pool = [h.id for h in search("text_units", vector=None, text=query, k=UNIT_POOL,
                                 hidden_acl=hidden)]
    for clause in split_clauses(query):
        pool += [h.id for h in search("text_units", vector=None, text=clause, k=CLAUSE_POOL,
                                      hidden_acl=hidden)]
    by_vector = [h.id for h in search("text_units", vector=vector, text=None, k=VECTOR_POOL,
                                      hidden_acl=hidden)]
    pool += by_vector
    pool += [u for u in support if u in ctx.view.units and ctx.vis.can_see([u])]
    scores: dict[str, float] = {}
    masses: dict[str, list[float]] = {}
    for u in dict.fromkeys(pool):
        scores[u], masses[u] = q.score(stats.unit(ctx, u))
    ranked = [u for u in sorted(scores, key=lambda u: (-scores[u], u)) if scores[u] > 0]
    ranked = cover_clauses(ranked, scores, masses, lambda u: ctx.view.units[u].document_id)
    if getattr(ctx.view.embedder, "lexical", False):
        return ranked + [u for u in by_vector if scores[u] <= 0]
    return [h.id for h in rrf(ranked, by_vector)]


def excerpt(ctx: QueryContext, unit_id: str, query: str, max_tokens: int) -> str:
    """The unit's text, or when longer than `max_tokens`, the sentences that best match the
    question (each with the sentence before it, for context) in document order, gaps marked
    with "…"."""
    from server.engines.common import tokenizer

    text = ctx.view.units[unit_id].text
    tok = tokenizer()
    if len(text) <= max_tokens:  # a token has at least one character
        return text
    stats = corpus_stats(ctx)
    ev = stats.unit(ctx, unit_id)
    if ev.sentence_tokens is None:
        ev.sentence_tokens = [tok.count(s) + 1 for s in ev.sentences]
    if sum(ev.sentence_tokens) <= max_tokens and tok.count(text) <= max_tokens:
        return text
    weights, _ = stats.weights(ctx, lexical_terms(query))
    ranked = sorted((-_Query.mass(terms, weights), i) for i, terms in enumerate(ev.sentence_terms))
    chosen: set[int] = set()
    used = 0
    for neg, i in ranked:
        if neg >= 0 and chosen:
            break  # the rest match nothing
        for j in ((i - 1, i) if i > 0 else (i,)):
            n = ev.sentence_tokens[j]
            if j in chosen or used + n > max_tokens:
                continue
            chosen.add(j)
            used += n
    if not chosen:
        return tok.truncate(text, max_tokens) + " …"
    parts: list[str] = []
    last = -1
    for i in sorted(chosen):
        if i != last + 1:
            parts.append("…")
        parts.append(ev.sentences[i])
        last = i
    if last < len(ev.sentences) - 1:
        parts.append("…")
    return " ".join(parts)
