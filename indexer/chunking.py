"""Edit-stable chunking of a document into text units (design §3.2).

Fixed-size windows shift every boundary after an edit, so every later unit changes id and is
re-extracted. Here boundaries are content-defined, like rsync/CDC chunkers but at sentence
granularity:

1. The text is split into sentences, keeping paragraph starts.
2. A paragraph start is a *natural* boundary when a hash of its first sentence falls below a
   threshold proportional to the paragraph's size (so chunks average about `target` tokens),
   provided the current chunk already has `min` tokens.
3. A run between natural boundaries that exceeds `max_tokens` is split at its sentence of
   smallest hash (paragraph starts first), recursively: the cut depends on the run's content,
   not on where the run happened to start.
4. Each unit is prefixed with up to `overlap` tokens of the text before it.

Editing one paragraph therefore changes the unit holding it (and, if the edit is in its last
`overlap` tokens or moves a boundary, one neighbour); the units further away keep their ids.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass

from canopy.ids import content_hash
from canopy.model import TextUnit
from canopy.tokens import Tokenizer

__all__ = ["chunk_document"]

_PARA = re.compile(r"\n[ \t]*\n\s*")
# Sentence ends: Western punctuation followed by space, or CJK full stops (no space needed).
# Not canopy.providers.builtin.text.split_sentences on purpose: chunk boundaries, hence unit
# ids, derive from these cut points, and that splitter's (abbreviations, a capital after the
# stop, lines as blocks) would move them in existing documents, re-extracting those units on
# upgrade. Cut points only need to be content-defined, not linguistic.
_SENT = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=\S)|(?<=[。！？；])")


@dataclass(frozen=True)
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
    segs: list[_Seg] = []
    pos = 0
    paras: list[tuple[int, int]] = []
    for m in _PARA.finditer(text):
        paras.append((pos, m.start()))
        pos = m.end()
    paras.append((pos, len(text)))
    for p_start, p_end in paras:
        if not text[p_start:p_end].strip():
            continue
        pieces: list[tuple[int, int, int]] = []
        s = p_start
        for m in _SENT.finditer(text, p_start, p_end):
            if m.start() > s:
                pieces.append((s, m.start(), 0))
            s = m.end()
        if s < p_end:
            pieces.append((s, p_end, 0))
        counted = [(a, b, tok.count(text[a:b])) for a, b, _ in pieces]
        split: list[tuple[int, int, int]] = []
        for a, b, n in counted:
            split.extend(_split_long(text, a, b, n, max_tokens, tok)
                         if n > max_tokens else [(a, b, n)])
        para_tokens = sum(n for _, _, n in split)
        for i, (a, b, n) in enumerate(split):
            segs.append(_Seg(a, b, n, i == 0, para_tokens if i == 0 else 0, _h(text[a:b])))
    return segs


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


def _split_run(run: list[_Seg], max_tokens: int) -> list[list[_Seg]]:
    """Split a run longer than a unit at its sentence of smallest hash (paragraph starts first),
    recursively: the cut depends on the run's content, not on where the run started."""
    total = sum(s.tokens for s in run)
    if total <= max_tokens or len(run) < 2:
        return [run]
    prefix = [0]
    for s in run:
        prefix.append(prefix[-1] + s.tokens)
    floor = max_tokens // 8
    candidates = [k for k in range(1, len(run))
                  if prefix[k] >= floor and total - prefix[k] >= floor]
    if not candidates:
        candidates = list(range(1, len(run)))
    k = min(candidates, key=lambda i: (not run[i].para_start, run[i].key))
    return _split_run(run[:k], max_tokens) + _split_run(run[k:], max_tokens)


def chunk_document(
    document_id: str, text: str, tok: Tokenizer, *, max_tokens: int = 1200, overlap: int = 100
) -> list[TextUnit]:
    """Text units of one document; ids are content hashes (document id + unit text)."""
    segs = _segments(text, tok, max_tokens)
    if not segs:
        return []
    runs = _natural_runs(segs, min_tokens=max_tokens // 3, mean_gap=max_tokens * 0.5)
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
