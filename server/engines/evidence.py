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
R@10, so it only contributes candidates.

Multi-hop evidence (server/engines/propagation.py): a Personalized PageRank over the entity-unit
graph, seeded with the entities the question names and the best-scored units, reaches units
that share a specific entity with them (the second hop of "the association that published X");
the first GRAPH_POOL units it reaches join the candidates, and every score is multiplied by
1 + GRAPH_WEIGHT * the unit's graph evidence. Multiplying keeps a unit that matches nothing at
zero, and lets the graph reorder units that match alike.

Entity pages: a document titled by a name (a title the builtin extractor would read as one, see
canopy.providers.builtin.mentions.heading_name: "Ostrevia", "Tallow Street (novel)"; not a
headline) is that entity's page. When the walk scores the entity among its PAGE_ENTITIES best
(the question's own entities, or the bridge its best units lead to), a candidate unit of the
page that matches the question at all gains PAGE_WEIGHT * the best score * the entity's score
(0..1): a question about Ostrevia, or about "the country where X is", is best answered by the
country's page, which shares few words with the question. Collections without such titles
(news articles titled by headlines) are unaffected. Measured with `canopy eval` on the DEV
questions of MultiHop-RAG (609 articles, with and without front matter) and MuSiQue (README).

Documents of several units: a unit's score is raised by DOC_SECOND times the second-best
score among its document's candidate units (with_document_evidence), so that a document whose
evidence is spread over two units ranks with the one that states it all at once.

Terms are canopy.providers.builtin.text.lexical_terms (stemmed words, CJK bigrams), sentences its
split_at_stops (finer than the builtin provider's sentences: that measured better here). Document
frequencies come from the index's lexical statistics, summed over the ACL classes the caller may
read (maintained by the indexer with every change; nothing is counted at query time). A unit's
terms, piece by piece, are stored with it by the indexer (builtin.text.sentence_terms); its
windows, counts and bigrams are built from them when it is first a candidate and kept in a
bounded cache. A unit stored by another version of the analysis is analysed from its text.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from itertools import pairwise

import numpy as np

from canopy.ids import content_hash, entity_key
from canopy.model import Document, TextUnit
from canopy.providers.builtin.mentions import heading_name
from canopy.providers.builtin.text import lexical_terms, read_sentence_terms, split_at_stops
from canopy.server.context import QueryContext
from canopy.server.engines.propagation import propagate
from canopy.vectors import rrf

__all__ = [
    "LEXICAL_VECTOR_WEIGHT",
    "UnitEvidence",
    "cover_clauses",
    "credit_pages",
    "excerpt",
    "excerpt_text",
    "page_key",
    "rank_units",
    "split_clauses",
    "unit_evidence",
    "vector_weight",
    "with_document_evidence",
]

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
SEED_UNITS = 10  # the best-scored units that seed the propagation, with the question's entities
GRAPH_POOL = 10  # units first reached by the propagation that join the candidates
# A unit's score is multiplied by 1 + GRAPH_WEIGHT * its graph evidence (0..1, the best unit's
# 1). DEV: at 0.5 MuSiQue R@2/5/10 +0.03/+0.02/+0.03 and MultiHop-RAG +0.01/0/0; at 1 MultiHop-RAG
# R@2 -0.02; adding it to the score instead of multiplying lost 0.03 there. 0 switches it off.
GRAPH_WEIGHT = 0.5
# Entity pages (module docstring). DEV, builtin provider: MuSiQue R@2/5/10 0.482/0.566/0.672 ->
# 0.506/0.597/0.672; MultiHop-RAG (headlines: no pages) unchanged with and without front matter.
# At 0.25 R@5 0.590, at 1.0 R@2 0.512 but R@5 0.590; 3 entities 0.576, 10 the same as 5. Reading
# the pages of those entities that are not candidates yet moved nothing: only candidates count.
PAGE_ENTITIES = 5
PAGE_WEIGHT = 0.5
# A document's second-best unit adds this share of its score to each of its units (module
# docstring). DEV, builtin, local_search's ranking: MultiHop-RAG (first 400 DEV questions)
# R@2/5/10 0.557/0.768/0.879 -> 0.560/0.774/0.883, the same with front matter 0.622/0.810/0.911
# -> 0.621/0.820/0.912; MuSiQue (a unit per paragraph) unchanged by construction. At 0.6
# MultiHop-RAG R@10 0.872.
DOC_SECOND = 0.3
_K1, _B = 1.2, 0.75
# RRF weight of a lexical embedder's ranking against full-text search's (hybrid searches): with
# the builtin embedder, equal fusion loses 0.11 R@10 on MultiHop-RAG against BM25 alone, and
# 0.1 costs nothing while keeping vector-only rows (e.g. CJK text) after the full-text ones.
LEXICAL_VECTOR_WEIGHT = 0.1

# Clause boundaries: punctuation. (A list of comparison conjunctions, "while", "whereas",
# "compared to"..., moved no DEV figure on MultiHop-RAG or MuSiQue by more than 0.002: dropped.)
_CLAUSE = re.compile(r"[,;:?!()\[\]]")


def split_clauses(query: str) -> list[str]:
    """The question's clauses that carry at least two content terms (at most MAX_CLAUSES)."""
    parts = [p.strip() for p in _CLAUSE.split(query)]
    out = [p for p in parts if len(set(lexical_terms(p))) >= 2]
    return out[:MAX_CLAUSES] if len(out) > 1 else []


@dataclass
class UnitEvidence:
    # the unit's sentences (its text, not its title); None until an excerpt needs them (the
    # terms come stored from the index, which keeps no sentence strings)
    sentences: list[str] | None
    sentence_terms: list[frozenset[str]]
    windows: list[frozenset[str]]  # terms of each run of WINDOW consecutive sentences + header
    tf: Counter[str]  # term counts of header + text
    bigrams: frozenset[tuple[str, str]]
    length: int  # terms of header + text
    sentence_tokens: list[int] | None = None  # tokens of each sentence, when first needed


def _evidence_key(unit: TextUnit, header: str) -> tuple[str, str]:
    return (unit.id, content_hash(header))


def unit_evidence(ctx: QueryContext, unit: TextUnit, doc: Document,
                  stored: str = "") -> UnitEvidence:
    """The unit's sentence analysis (cached by unit and document header: both are content),
    from its `stored` terms (builtin.text.sentence_terms) when they are of this version."""
    header = doc.header()
    key = _evidence_key(unit, header)
    cache = ctx.caches.unit_evidence
    hit = cache.get(key)
    if hit is not None:
        return hit
    sentences: list[str] | None = None
    terms = read_sentence_terms(stored)
    if terms is None:
        sentences = split_at_stops(unit.text)
        terms = [lexical_terms(s) for s in sentences]
    head = lexical_terms(header)
    flat = head + [t for ts in terms for t in ts]
    sets = [frozenset(ts) for ts in terms] or [frozenset()]
    # The header (title, source, date...) is said of every sentence: "the TechCrunch
    # article" plus a sentence's fact is one clause matched in one window.
    head_set = frozenset(head)
    windows = [frozenset().union(*sets[i:i + WINDOW]) | head_set
               for i in range(max(1, len(sets) - WINDOW + 1))]
    bigrams = frozenset(p for ts in [head, *terms] for p in pairwise(ts))
    ev = UnitEvidence(sentences, sets, windows, Counter(flat), bigrams, len(flat))
    # ~400 bytes per term, measured with tracemalloc: its sets, windows, counts and bigrams.
    cache.put(key, ev, len(unit.text) + 400 * len(flat))
    return ev


def term_weights(ctx: QueryContext, terms: Iterable[str]) -> tuple[dict[str, float], float]:
    """BM25 idf of each term over the units the caller may read, and their mean length."""
    terms = list(dict.fromkeys(terms))
    df, n, total = ctx.reader.term_stats(terms)
    weights = {t: math.log(1 + (n - df.get(t, 0) + 0.5) / (df.get(t, 0) + 0.5)) for t in terms}
    return weights, (total / n if n else 1.0) or 1.0


class _Query:
    """A question's terms, bigrams and clauses, weighted for one caller."""

    def __init__(self, ctx: QueryContext, query: str) -> None:
        seq = lexical_terms(query)
        clauses = [lexical_terms(c) for c in split_clauses(query)]
        idf, self.avg_length = term_weights(ctx, seq)
        self.weights = {t: idf[t] for t in dict.fromkeys(seq)}
        self.bigrams = set(pairwise(seq))
        self.clauses = [{t: idf[t] for t in dict.fromkeys(c) if t in idf} for c in clauses]

    @staticmethod
    def mass(terms: frozenset[str], weights: dict[str, float]) -> float:
        return math.fsum(weights[t] for t in terms & weights.keys())

    def score(self, ev: UnitEvidence) -> tuple[float, list[float]]:
        """The unit's score, and the idf mass of each clause's terms in its best window."""
        norm = _K1 * (1 - _B + _B * ev.length / self.avg_length)
        bm25 = math.fsum(w * tf * (_K1 + 1) / (tf + norm)
                   for t, w in self.weights.items() if (tf := ev.tf.get(t, 0)))
        bigrams = len(self.bigrams & ev.bigrams)
        matched = [win & self.weights.keys() for win in ev.windows]
        best = max(math.fsum(self.weights[t] for t in m) for m in matched)
        clause = 0.0
        masses: list[float] = []
        for weights in self.clauses:
            total = math.fsum(weights.values())
            m = (max(math.fsum(weights.get(t, 0.0) for t in terms) for terms in matched)
                 if total else 0.0)
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
            scores[u] + COVER * math.fsum(max(0.0, m - c)
                                    for m, c in zip(masses[u], covered, strict=True)),
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


def with_document_evidence(scores: dict[str, float], document_of: Callable[[str], str]
                           ) -> dict[str, float]:
    """Each matching unit's score plus DOC_SECOND * the second-best score among the candidate
    units of its document: a long document split into units can state a question's subject in
    one unit and the detail asked in another, which no single unit's score shows (a document of
    one unit is unchanged)."""
    if DOC_SECOND <= 0:
        return scores
    best: dict[str, list[float]] = {}  # document -> its two best scores
    for u, sc in scores.items():
        top = best.setdefault(document_of(u), [0.0, 0.0])
        if sc > top[0]:
            top[:] = [sc, top[0]]
        elif sc > top[1]:
            top[1] = sc
    return {u: sc + DOC_SECOND * best[document_of(u)][1] if sc > 0 else sc
            for u, sc in scores.items()}


@lru_cache(maxsize=8192)
def page_key(title: str) -> str:
    """The entity key a document's title names ("" when the title is not a name)."""
    name = heading_name(title)
    return entity_key(name) if name else ""


def credit_pages(scores: dict[str, float], units: dict[str, tuple[TextUnit, Document]],
                 entities: dict[str, float]) -> None:
    """Raise the score of each matching unit of the page of one of the PAGE_ENTITIES entities
    best scored by the walk (`entities`: key -> 0..1) by PAGE_WEIGHT * the best score * the
    entity's score."""
    if PAGE_WEIGHT <= 0 or not entities:
        return
    chosen = sorted(entities, key=lambda k: (-entities[k], k))[:PAGE_ENTITIES]
    top = max(scores.values(), default=0.0)
    for u, (_, doc) in units.items():
        key = page_key(doc.title)
        if key in chosen and scores.get(u, 0.0) > 0:
            scores[u] += PAGE_WEIGHT * top * entities[key]


def vector_weight(ctx: QueryContext) -> float:
    """The RRF weight of the vector ranking in a hybrid search: 1 for a semantic embedder."""
    return LEXICAL_VECTOR_WEIGHT if getattr(ctx.reader.embedder, "lexical", False) else 1.0


async def rank_units(ctx: QueryContext, query: str, vector: np.ndarray, *,
                     support: Iterable[str] = (), entities: Iterable[str] = (),
                     graph: bool = True) -> list[str]:
    """Ids of text units (the caller may read) that state what `query` asks, best first.

    `support`: more candidate units (e.g. those behind the entities the question names).
    `entities`: keys (normalized names) of the entities the question names: with the best
    units, the seeds of the graph propagation. `graph=False`: the passages' own evidence only
    (no propagation, no entity pages): basic_search's ranking."""
    r = ctx.reader
    q = _Query(ctx, query)
    pool = [h.id for h in await r.search("text_units", vector=None, text=query, k=UNIT_POOL)]
    for clause in split_clauses(query):
        pool += [h.id for h in await r.search("text_units", vector=None, text=clause,
                                              k=CLAUSE_POOL)]
    by_vector = [h.id for h in await r.search("text_units", vector=vector, text=None,
                                              k=VECTOR_POOL)]
    pool += by_vector
    pool += list(support)
    units = r.units(pool)
    scores: dict[str, float] = {}
    masses: dict[str, list[float]] = {}

    def score(found: dict[str, tuple[TextUnit, Document]]) -> None:
        stored = r.sentence_terms(found)
        for u, (unit, doc) in found.items():
            scores[u], masses[u] = q.score(unit_evidence(ctx, unit, doc, stored.get(u, "")))
            units[u] = (unit, doc)

    score(units)
    if graph and GRAPH_WEIGHT > 0:
        best = sorted((u for u in scores if scores[u] > 0), key=lambda u: (-scores[u], u))
        walk = propagate(r, list(entities), {u: scores[u] for u in best[:SEED_UNITS]})
        led = walk.units
        reached = [u for u in sorted(led, key=lambda u: (-led[u], u)) if u not in scores]
        score(r.units(reached[:GRAPH_POOL]))
        credit_pages(scores, units, walk.entities)
        for u, g in led.items():
            if u in scores:
                scores[u] *= 1 + GRAPH_WEIGHT * g
    scores = with_document_evidence(scores, lambda u: units[u][0].document_id)
    ranked = [u for u in sorted(scores, key=lambda u: (-scores[u], u)) if scores[u] > 0]
    ranked = cover_clauses(ranked, scores, masses, lambda u: units[u][0].document_id)
    if getattr(r.embedder, "lexical", False):
        return ranked + [u for u in by_vector if u in scores and scores[u] <= 0]
    return [h.id for h in rrf(ranked, [u for u in by_vector if u in units])]


# Bytes of a sentence string beyond its characters (object header, its slot in the list), and of
# one sentence's token count (its slot: counts under 257 are CPython's shared small ints).
_SENTENCE_BYTES = 60
_TOKEN_COUNT_BYTES = 8


def excerpt(ctx: QueryContext, unit: TextUnit, doc: Document, query: str, max_tokens: int) -> str:
    """The unit's text, or when longer than `max_tokens`, the sentences that best match the
    question (each with the sentence before it, for context) in document order, gaps marked
    with "…"."""
    from canopy.server.engines.budget import tokenizer

    text = unit.text
    tok = tokenizer()
    if len(text) <= max_tokens:  # a token has at least one character
        return text
    ev = unit_evidence(ctx, unit, doc)
    added = 0
    if ev.sentences is None:  # the same pieces the stored terms were read from
        ev.sentences = split_at_stops(text)
        added += len(text) + _SENTENCE_BYTES * len(ev.sentences)
    if ev.sentence_tokens is None:
        ev.sentence_tokens = [tok.count(s) + 1 for s in ev.sentences]
        added += _TOKEN_COUNT_BYTES * len(ev.sentence_tokens)
    if added:
        # Counted against the cache's budget: left out, the analyses that had given excerpts
        # held more than the budget said (a serving process's unit analyses kept growing
        # while their accounted bytes stood still; benchmarks/heap_per_update.py --trace).
        ctx.caches.unit_evidence.grow(_evidence_key(unit, doc.header()), added)
    if sum(ev.sentence_tokens) <= max_tokens and tok.count(text) <= max_tokens:
        return text
    weights, _ = term_weights(ctx, lexical_terms(query))
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
    return _joined(text, ev.sentences, chosen)


def excerpt_text(ctx: QueryContext, text: str, query: str, max_tokens: int) -> str:
    """`text` (an entity's, relationship's or report's), or when longer than `max_tokens`, its
    pieces that best match the question in their order, gaps marked with "…"; the first piece
    when none matches (a description's first sentence says what the thing is)."""
    from canopy.server.engines.budget import tokenizer

    tok = tokenizer()
    if len(text) <= max_tokens or tok.count(text) <= max_tokens:
        return text
    pieces = split_at_stops(text)
    weights, _ = term_weights(ctx, lexical_terms(query))
    sizes = [tok.count(p) + 1 for p in pieces]
    ranked = sorted((-_Query.mass(frozenset(lexical_terms(p)), weights), i)
                    for i, p in enumerate(pieces))
    chosen: set[int] = set()
    used = 0
    for neg, i in ranked:
        if neg >= 0 and chosen:
            break  # the rest match nothing
        if used + sizes[i] <= max_tokens:
            chosen.add(i)
            used += sizes[i]
    if not chosen:
        return tok.truncate(text, max_tokens) + " …"
    return _joined(text, pieces, chosen)


def _joined(text: str, pieces: list[str], chosen: set[int]) -> str:
    """The `chosen` pieces of `text` in order, with the text's own separators between
    neighbours (line breaks kept, so headings and list items still stand alone) and "…" for
    each gap."""
    spans: list[tuple[int, int]] = []
    pos = 0
    for p in pieces:  # the pieces are the text's, in order, stripped
        start = text.find(p, pos)
        if start < 0:  # not the text's own pieces: plain joining
            spans = []
            break
        spans.append((start, start + len(p)))
        pos = start + len(p)
    out: list[str] = []
    last = -1
    for i in sorted(chosen):
        if last >= 0 and spans:
            between = text[spans[last][1]:spans[i][0]]
            if i != last + 1:
                between = "\n…\n" if "\n" in text[spans[last][1]:spans[i][0]] else " … "
            out.append(between)
        elif last >= 0:
            out.append(" " if i == last + 1 else " … ")
        elif i > 0:
            out.append("… ")
        out.append(pieces[i])
        last = i
    if last < len(pieces) - 1:
        out.append(" …")
    return "".join(out)
