"""Edit-stable chunking of a document into text units (design §3.2).

Fixed-size windows shift every boundary after an edit, so every later unit changes id and is
re-extracted. Here boundaries are content-defined, like rsync/CDC chunkers but at sentence
granularity:

1. The text is split into sentences, keeping paragraph starts.
2. A paragraph start is a *natural* boundary when a hash of its first sentence falls below a
   threshold proportional to the paragraph's size (so natural boundaries fall about once a
   unit), provided the current run already has `min` tokens.
3. A run between natural boundaries that exceeds `max_tokens` is cut into the fewest units it
   fits, at its sentence of smallest hash (paragraph starts first) among the cuts that keep
   that count, and its parts likewise: the cut depends on the run's content, not on where the
   run happened to start, and no unit is a short tail the count did not need. Iteratively,
   so a run of any length, such as one long unpunctuated line, is split without recursion.
4. Each unit is prefixed with up to `overlap` tokens of the text before it.

Editing one paragraph therefore changes the unit holding it (and, if the edit is in its last
`overlap` tokens, the next one; if it moves a cut of its run, the run's other units): the
units of other runs keep their ids.
"""

from __future__ import annotations

import hashlib
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import accumulate

import numpy as np

from canopy.ids import content_hash
from canopy.model import TextUnit
from canopy.tokenizer import Tokenizer

__all__ = ["chunk_document"]

_PARA = re.compile(r"\n[ \t]*\n\s*")
# Sentence ends: Western punctuation followed by space, or CJK full stops (no space needed).
# Not canopy.providers.builtin.text.split_sentences on purpose: chunk boundaries, hence unit
# ids, derive from these cut points, and that splitter's (abbreviations, a capital after the
# stop, lines as blocks) would move them in existing documents, re-extracting those units on
# upgrade. Cut points only need to be content-defined, not linguistic.
_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)|(?<=[。！？；])")


@dataclass(frozen=True, slots=True)
class _Seg:
    start: int
    end: int
    tokens: int
    para_start: bool
    para_tokens: int  # tokens of the paragraph this segment starts (0 when not a start)
    key: int  # content hash of the segment, for content-defined decisions


def _h(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def _segments(text: str, tok: Tokenizer, max_tokens: int) -> list[_Seg]:
    """The sentences of `text` in order. A sentence's tokens count the separator before it
    (closing quotes, spaces, line and paragraph breaks), so that a unit's tokens are the sum of
    its sentences' and units packed full still fit once their sentences are joined."""
    segs: list[_Seg] = []
    pos = 0
    paras: list[tuple[int, int]] = []
    for m in _PARA.finditer(text):
        paras.append((pos, m.start()))
        pos = m.end()
    paras.append((pos, len(text)))
    prev_end: int | None = None
    for p_start, p_end in paras:
        if not text[p_start:p_end].strip():
            continue
        first, para_tokens = len(segs), 0
        for a, b in _sentences(text, p_start, p_end):
            n = tok.count(text[a if prev_end is None else prev_end:b])
            for a2, b2, n2 in (_split_long(text, a, b, n, max_tokens, tok) if n > max_tokens
                               else ((a, b, n),)):
                segs.append(_Seg(a2, b2, n2, False, 0, _h(text[a2:b2])))
                para_tokens += n2
            prev_end = b
        if len(segs) > first:
            segs[first] = replace(segs[first], para_start=True, para_tokens=para_tokens)
    return segs


def _sentences(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence of the paragraph text[start:end], in order."""
    s = start
    for m in _SENT.finditer(text, start, end):
        if m.start() > s:
            yield s, m.start()
        s = m.end()
    if s < end:
        yield s, end


def _split_long(text: str, a: int, b: int, n: int, max_tokens: int,
                tok: Tokenizer) -> list[tuple[int, int, int]]:
    """A sentence longer than a unit (tables, code, unpunctuated text): cut at whitespace."""
    out: list[tuple[int, int, int]] = []
    width = max(1, int((b - a) * (max_tokens * 0.8) / n))
    s = a
    while s < b:
        e = min(b, s + width)
        if e < b:
            ws = text.rfind(" ", s + width // 2, e)
            e = ws + 1 if ws > s else e
        out.append((s, e, tok.count(text[s:e])))
        s = e
    return out


def _natural_runs(segs: list[_Seg], min_tokens: int, mean_gap: float) -> list[list[_Seg]]:
    """Cut before every paragraph whose first-sentence hash passes a size-proportional threshold,
    then merge each run smaller than `min_tokens` into the next. Both decisions look only at
    nearby content, so an edit's effect stays local (no chain of shifted boundaries)."""
    cuts: list[list[_Seg]] = [[]]
    for seg in segs:
        if cuts[-1] and seg.para_start and seg.key < min(1.0, seg.para_tokens / mean_gap) * 2**64:
            cuts.append([])
        cuts[-1].append(seg)
    runs: list[list[_Seg]] = []
    pending: list[_Seg] = []
    for run in cuts:
        pending = pending + run
        if sum(s.tokens for s in pending) >= min_tokens:
            runs.append(pending)
            pending = []
    if pending:
        if runs:
            runs[-1] = runs[-1] + pending
        else:
            runs.append(pending)
    return runs


class _Cheapest:
    """The cut `_split_run` prefers within a range of positions: smallest (not a paragraph
    start, key), the leftmost among equals. A segment tree over the segments' ranks answers
    each range in O(log n) whatever the content (one unpunctuated line cut into thousands of
    equal pieces included); `rank` orders any two positions the same way."""

    def __init__(self, run: list[_Seg]) -> None:
        n = len(run)
        keys = np.fromiter((s.key for s in run), dtype=np.uint64, count=n)
        later = np.fromiter((not s.para_start for s in run), dtype=np.uint8, count=n)
        self.order = np.lexsort((np.arange(n), keys, later))  # position by rank
        rank = np.empty(n, dtype=np.int64)
        rank[self.order] = np.arange(n)
        self.rank = rank
        self.size = 1 << max(0, (n - 1).bit_length())
        tree = np.full(2 * self.size, n, dtype=np.int64)
        tree[self.size:self.size + n] = rank
        width = self.size
        while width > 1:  # each level holds the minimum of its two children
            half = width // 2
            tree[half:width] = np.minimum(tree[width:2 * width:2], tree[width + 1:2 * width:2])
            width //= 2
        self.tree = tree

    def argmin(self, lo: int, hi: int) -> int:
        """The preferred position in [lo, hi)."""
        best = len(self.order)
        lo, hi = lo + self.size, hi + self.size
        while lo < hi:
            if lo & 1:
                best = min(best, int(self.tree[lo]))
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, int(self.tree[hi]))
            lo, hi = lo >> 1, hi >> 1
        return int(self.order[best])


def _split_run(run: list[_Seg], max_tokens: int) -> list[list[_Seg]]:
    """Split a run longer than a unit into the fewest units it packs into: each cut is the
    sentence of smallest hash (paragraph starts first) among the cuts that keep that count
    (`_cut`), then each part likewise. The cut depends on the run's content, not on where the run
    started, and no unit is a short tail the count did not need. Iterative, over one prefix
    sum: no recursion limit."""
    prefix = list(accumulate((s.tokens for s in run), initial=0))
    if prefix[-1] <= max_tokens or len(run) < 2:
        return [run]
    cheapest = _Cheapest(run)
    out: list[list[_Seg]] = []
    todo = [(0, len(run))]  # ranges [lo, hi) to split; the last one listed is split first
    while todo:
        lo, hi = todo.pop()
        total = prefix[hi] - prefix[lo]
        if total <= max_tokens or hi - lo < 2:
            out.append(run[lo:hi])
            continue
        k = _cut(prefix, cheapest, lo, hi, max_tokens)
        todo += [(k, hi), (lo, k)]  # the left part comes out first: chunks stay in order
    return out


def _cut(prefix: list[int], cheapest: _Cheapest, lo: int, hi: int, max_tokens: int) -> int:
    """Where [lo, hi) is cut: the preferred segment among the cuts that keep the fewest units
    the range packs into, n. Packing greedily from the left, the first j units end at F_j, the
    furthest a left part of j units reaches; packing from the right, the last t units start at
    R_t, the earliest a right part of t units reaches back to. A cut k keeps n exactly when
    R_(n-j) <= k <= F_j for some j in 1..n-1: these intervals are where the cut may fall."""
    ends = _packed(prefix, lo, hi, max_tokens, forward=True)
    starts = _packed(prefix, lo, hi, max_tokens, forward=False)
    best: int | None = None
    n = len(ends)
    for j in range(1, n):
        first, last = max(starts[n - j - 1], lo + 1), min(ends[j - 1], hi - 1)
        if first <= last:
            k = cheapest.argmin(first, last + 1)
            if best is None or cheapest.rank[k] < cheapest.rank[best]:
                best = k
    return best if best is not None else cheapest.argmin(lo + 1, hi)


def _packed(prefix: list[int], lo: int, hi: int, max_tokens: int, *, forward: bool) -> list[int]:
    """Greedy packing of [lo, hi) into units of at most max_tokens (a longer segment alone):
    from the left, where each unit ends; from the right, where each unit starts (the last one
    first). Greedy packing is the fewest units either way."""
    out: list[int] = []
    if forward:
        p = lo
        while p < hi:
            p = max(bisect_right(prefix, prefix[p] + max_tokens, p + 1, hi + 1) - 1, p + 1)
            out.append(p)
    else:
        p = hi
        while p > lo:
            p = min(bisect_left(prefix, prefix[p] - max_tokens, lo, p), p - 1)
            out.append(p)
    return out


def chunk_document(
    document_id: str, text: str, tok: Tokenizer, *, max_tokens: int = 1200, overlap: int = 100
) -> list[TextUnit]:
    """Text units of one document; ids are content hashes (document id + unit text)."""
    segs = _segments(text, tok, max_tokens)
    if not segs:
        return []
    # A natural boundary about once a unit, and a run under two thirds of one joins the next:
    # runs are then cut into full units (`_split_run`). The first 100 MultiHop-RAG articles
    # make 298 units where 1,200/100-token windows make 277 (a boundary every half unit, runs
    # of a third and a cut anywhere made 376); an edit then changes 1.23 units of A Christmas
    # Carol on average, where it changed 1.15 (benchmarks/chunk_units.py).
    runs = _natural_runs(segs, min_tokens=max_tokens * 2 // 3, mean_gap=float(max_tokens))
    chunks = [c for run in runs for c in _split_run(run, max_tokens)]
    units: list[TextUnit] = []
    seen: Counter[str] = Counter()
    prev: list[_Seg] = []
    for ordinal, chunk in enumerate(chunks):
        start, end = chunk[0].start, chunk[-1].end
        prefix_start = _overlap_start(prev, overlap, text, tok)
        body = text[start:end]
        full = (text[prefix_start:start] if prefix_start is not None else "") + body
        seen[full] += 1
        uid = "tu-" + content_hash(document_id, full, str(seen[full] - 1))
        units.append(TextUnit(uid, document_id, ordinal, full, tok.count(full), start, end))
        prev = chunk
    return units


def _overlap_start(prev: list[_Seg], overlap: int, text: str, tok: Tokenizer) -> int | None:
    """Start offset of the overlap prefix: whole trailing sentences of the previous unit."""
    if not prev or overlap <= 0:
        return None
    used = 0
    start = None
    for seg in reversed(prev):
        if used + seg.tokens > overlap:
            break
        used += seg.tokens
        start = seg.start
    if start is None:  # the last sentence alone is longer than the overlap: take its tail words
        last = prev[-1]
        tail = tok.decode(tok.encode(text[last.start : last.end])[-overlap:]).lstrip("\ufffd")
        cut = last.end - len(tail)
        ws = text.find(" ", cut, last.end)
        start = ws + 1 if ws != -1 else cut
    return start
