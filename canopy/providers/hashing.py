"""The builtin embedder: signed feature hashing of words, word bigrams and CJK character bigrams.

It needs no model file and no download, is deterministic, and embeds tens of thousands of short
texts per second. It is lexical, not semantic, and at 384 dimensions hash collisions blur long
texts: on MultiHop-RAG (benchmarks/retrieval_eval.py) its vectors alone reach Hits@10 0.49 over
text units against 0.85 for LanceDB's BM25, and equal-weight fusion with BM25 drops to 0.74. So
the query engines give its ranking a small weight next to full-text search, or use it for
candidates only (`lexical = True`; server/engines/evidence.py). Configure an embeddings endpoint
for semantic retrieval.
"""

from __future__ import annotations

import math
import re
import zlib
from collections import Counter, defaultdict
from functools import lru_cache

import numpy as np

__all__ = ["HashEmbedder", "lexical_terms"]

_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_STOP = frozenset(
    "a an and are as at be been but by for from had has have he her his i if in into is it its me "
    "my not of on or our she so that the their them then there these they this to was we were what "
    "when where which who whom why will with would you your do does did can could should about "
    "after before than also more most other some such only own same very just over under again "
    "further once here".split()
)


@lru_cache(maxsize=200_000)
def _stem(w: str) -> str:
    for suf in ("ingly", "edly", "ing", "ies", "ied", "es", "ed", "ly", "s"):
        if len(w) > len(suf) + 3 and w.endswith(suf):
            return w[: -len(suf)] + ("y" if suf in ("ies", "ied") else "")
    return w


@lru_cache(maxsize=200_000)
def _word_terms(w: str) -> tuple[str, ...]:
    """The terms of one lower-cased word (memoized: a corpus has far fewer distinct words)."""
    if _CJK.search(w):
        chars = [c for c in w if _CJK.match(c)]
        return tuple(a + b for a, b in zip(chars, chars[1:], strict=False)) or tuple(chars)
    if w in _STOP or len(w) <= 1:
        return ()
    return (_stem(w),)


def lexical_terms(text: str) -> list[str]:
    """Lower-cased, stemmed content words; CJK runs become character bigrams."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        out += _word_terms(w)
    return out


class HashEmbedder:
    """L2-normalised hashed bag of terms and term bigrams (sublinear tf)."""

    # Lexical, not semantic: query engines rank by full-text evidence and use these vectors for
    # candidates only (server/engines/evidence.py; benchmarks/retrieval_eval.py measures why).
    lexical = True

    def __init__(self, dims: int = 384) -> None:
        self.dims = dims
        self.name = f"builtin-hash-{dims}"

    def _vector(self, text: str) -> np.ndarray:
        terms = lexical_terms(text)
        feats: defaultdict[str, float] = defaultdict(float, Counter(terms))
        for a, b in zip(terms, terms[1:], strict=False):
            feats[a + " " + b] += 0.5
        v = np.zeros(self.dims, dtype=np.float32)
        for f, tf in feats.items():
            h = zlib.crc32(f.encode("utf-8"))
            sign = 1.0 if (h >> 31) & 1 else -1.0
            v[h % self.dims] += sign * (1.0 + math.log(tf) if tf >= 1 else tf)
        n = float(np.linalg.norm(v))
        return v / n if n > 0 else v

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_sync(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])
