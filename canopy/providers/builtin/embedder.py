"""The builtin embedder: signed feature hashing of words, word bigrams and CJK character bigrams.

It needs no model file and no download, is deterministic, and embeds tens of thousands of short
texts per second. It is lexical, not semantic, and at 384 dimensions hash collisions blur long
texts: on MultiHop-RAG (benchmarks/retrieval_eval.py) its vectors alone reach R@10 0.49 over
text units against 0.85 for LanceDB's BM25, and equal-weight fusion with BM25 drops to 0.74. So
the query engines give its ranking a small weight next to full-text search, or use it for
candidates only (`lexical = True`; server/engines/evidence.py). Configure an embeddings endpoint
for semantic retrieval.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from itertools import pairwise

import numpy as np

from canopy.providers.builtin.text import TERMS_VERSION, lexical_terms

__all__ = ["HashEmbedder"]

class HashEmbedder:
    """L2-normalised hashed bag of terms and term bigrams (sublinear tf)."""

    # Lexical, not semantic: query engines rank by full-text evidence and use these vectors for
    # candidates only (server/engines/evidence.py; benchmarks/retrieval_eval.py measures why).
    lexical = True
    # Hashing a text is faster than reading its vector back from the embedding cache (and
    # recording which units it derives from): the vectors stage computes them afresh.
    cache_vectors = False

    def __init__(self, dims: int = 384) -> None:
        self.dims = dims
        # The name keys cached vectors and is recorded in the index: a new analysis of the
        # terms must not reuse vectors hashed from the old one.
        self.name = f"builtin-hash-{dims}-t{TERMS_VERSION}"

    def _vector(self, text: str) -> np.ndarray:
        terms = lexical_terms(text)
        feats: defaultdict[str, float] = defaultdict(float)  # words count 1, bigrams 0.5
        for t in terms:
            feats[t] += 1.0
        for a, b in pairwise(terms):
            feats[a + " " + b] += 0.5
        slots: list[int] = []
        weights: list[float] = []
        for f, tf in feats.items():
            h = zlib.crc32(f.encode("utf-8"))
            slots.append(h % self.dims)
            sign = 1.0 if (h >> 31) & 1 else -1.0
            weights.append(sign * (1.0 + math.log(tf) if tf >= 1 else tf))
        # one bincount instead of a numpy item update per feature (a third of the embedder's time)
        v = np.bincount(slots, weights, minlength=self.dims).astype(np.float32)
        n = float(np.linalg.norm(v))
        return v / n if n > 0 else v

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_sync(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims), dtype=np.float32)
        return np.stack([self._vector(t) for t in texts])
