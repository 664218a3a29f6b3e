"""Token counting that works offline and equals tiktoken's counts.

`tiktoken.get_encoding` downloads its vocabulary on first use. The `bpe-openai` wheel ships the
same vocabulary files, so we build a real `tiktoken.Encoding` from them (tiktoken's own pattern and
special tokens): counts are tiktoken's by construction, with no network.
"""

from __future__ import annotations

import binascii
import gzip
import hashlib
import importlib.util
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import tiktoken
from tiktoken_ext import openai_public

log = logging.getLogger(__name__)

__all__ = ["Tokenizer", "get_tokenizer"]

_VOCAB_FILES = {"o200k_base": "o200k_base.tiktoken.gz", "cl100k_base": "cl100k_base.tiktoken.gz"}


def _cache_path(encoding: str, expected_hash: str | None) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "canopy" / f"{encoding}-{(expected_hash or 'unchecked')[:16]}.npz"


def _vocab_file(name: str) -> Path:
    # find_spec locates the package without running its __init__, which parses all three bundled
    # vocabularies (~1 s) to learn their special tokens; only the one file is needed here.
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the bpe-openai package (bundled tiktoken vocabularies) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


def _load_ranks(encoding: str, expected_hash: str | None) -> dict[bytes, int]:
    """The encoding's ranks, from a decoded copy in the user cache when there is one (the
    first query of a fresh server pays this), else from the bundled file."""
    cached = _cache_path(encoding, expected_hash)
    try:
        with np.load(cached, allow_pickle=False) as z:  # plain arrays: nothing is executed
            blob, ends = z["blob"].tobytes(), z["ends"]
        starts = np.concatenate(([0], ends[:-1]))
        return {blob[a:b]: i for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist(),
                                                             strict=True))}
    except (OSError, KeyError, ValueError):
        pass
    data = gzip.decompress(_vocab_file(_VOCAB_FILES[encoding]).read_bytes())
    # The same check tiktoken applies to its download: the bundled file must be byte-identical.
    if expected_hash and hashlib.sha256(data).hexdigest() != expected_hash:
        raise RuntimeError(
            f"bundled {encoding} vocabulary differs from tiktoken's; upgrade bpe-openai")
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[binascii.a2b_base64(token)] = int(rank)
    if sorted(ranks.values()) == list(range(len(ranks))):  # dense ranks: storable as an order
        ordered = sorted(ranks, key=ranks.__getitem__)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(f".{os.getpid()}.tmp.npz")
            np.savez(tmp, blob=np.frombuffer(b"".join(ordered), dtype=np.uint8),
                     ends=np.cumsum([len(t) for t in ordered]))
            tmp.replace(cached)
        except OSError as exc:  # a read-only home: load from the bundled file every time
            log.debug("tokenizer cache not written: %s", exc)
    return ranks


@lru_cache(maxsize=4)
def _encoding(encoding: str) -> tiktoken.Encoding:
    if encoding not in _VOCAB_FILES:
        raise ValueError(f"unsupported encoding {encoding!r}; use one of {sorted(_VOCAB_FILES)}")
    # tiktoken's constructor for this encoding, with the loader pointed at the bundled file.
    original = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = (
        lambda _url, expected_hash=None: _load_ranks(encoding, expected_hash)
    )
    try:
        spec = getattr(openai_public, encoding)()
    finally:
        openai_public.load_tiktoken_bpe = original
    enc = tiktoken.Encoding(**spec)
    # tiktoken keeps its Python dict of the ranks only to pickle the encoding; the Rust side
    # holds its own copy. Dropped: 26 MB per process for o200k (a Tokenizer pickles by name).
    del enc._mergeable_ranks
    return enc


# Texts whose counts are remembered while an index build runs (`Tokenizer.memoizing`), by total
# characters: a build counts the same descriptions and child reports again at every level of the
# hierarchy (about a quarter of the characters it tokenized at 100 articles); past the bound the
# memo starts again. A server counts texts it rarely sees twice: it remembers none (46 MB of
# memo per process at 10,000 articles after 20 questions).
MEMO_CHARS = 16_000_000


class Tokenizer:
    """Counts, encodes and truncates text in one tiktoken encoding."""

    def __init__(self, encoding: str = "o200k_base") -> None:
        self.name = encoding
        self._enc = _encoding(encoding)
        self._counts: dict[str, int] = {}
        self._memo_chars = 0
        self._builds = 0  # memoizing blocks running
        self._lock = threading.Lock()

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return get_tokenizer, (self.name,)  # the encoding is rebuilt (or found) where it lands

    @contextmanager
    def memoizing(self) -> Iterator[None]:
        """Remember counts while the block runs (an index build); forgotten when the last such
        block ends."""
        with self._lock:
            self._builds += 1
        try:
            yield
        finally:
            with self._lock:
                self._builds -= 1
                if not self._builds:
                    self._counts, self._memo_chars = {}, 0

    def count(self, text: str) -> int:
        n = self._counts.get(text)
        if n is None:
            n = len(self._enc.encode_ordinary(text))
            if not self._builds:
                return n
            if self._memo_chars + len(text) > MEMO_CHARS:
                self._counts = {}  # a fresh dict: a thread reading the old one is unaffected
                self._memo_chars = 0
            self._counts[text] = n
            self._memo_chars += len(text)
        return n

    def encode(self, text: str) -> list[int]:
        return self._enc.encode_ordinary(text)

    def decode(self, tokens: list[int]) -> str:
        return self._enc.decode(tokens)

    def truncate(self, text: str, max_tokens: int) -> str:
        toks = self._enc.encode_ordinary(text)
        if len(toks) <= max_tokens:
            return text
        return self._enc.decode(toks[:max_tokens])


@lru_cache(maxsize=4)
def get_tokenizer(encoding: str = "o200k_base") -> Tokenizer:
    return Tokenizer(encoding)


def preload(encoding: str = "o200k_base") -> threading.Thread:
    """Load the tokenizer in the background (servers start it before their first request)."""
    thread = threading.Thread(target=get_tokenizer, args=(encoding,), daemon=True,
                              name="canopy-tokenizer")
    thread.start()
    return thread
