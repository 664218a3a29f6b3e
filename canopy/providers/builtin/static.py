"""An optional offline semantic embedder: WordLlama's static token embeddings, mean-pooled.

`[embed] builtin = "wordllama"` with `pip install 'wordllama>=0.4,<0.5'`. WordLlama
(https://github.com/dleemiller/WordLlama) ships its default model in its wheel (about 19 MB, no
torch): a 32,000-token Llama-2 vocabulary with a 256-dimension vector per token, trained so
that the mean of a text's token vectors is a sentence embedding. Loading takes a fraction of a
second and needs no network; embedding is a tokenizer call and a sum per text.

WordLlama's own loader looks for the tokenizer under a folder name the wheel does not use and
would download it, so the files are found in the package folder and loading never downloads
(`disable_download`). Its import also calls `logging.basicConfig(level=INFO)`, which is undone.

Pooling is done here rather than by `WordLlamaInference.embed`, which pads each batch to its
longest text: the same mean of token vectors, without a batch x tokens x 256 array.

Measured against the hash embedder (README "Retrieval without a model", benchmarks/
embed_eval.py): its vectors alone find far more (MultiHop-RAG DEV R@10 0.791 against 0.540),
but fused at full weight they lower local_search, so the engines use them as they use hashed
vectors (`lexical` below), and hashing stays the default.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from canopy.errors import ConfigError
from canopy.extras import install_hint

__all__ = ["MISSING", "WordLlamaEmbedder", "load_wordllama"]

MISSING = ("[embed] builtin = \"wordllama\" needs the wordllama package: "
           + install_hint("wordllama"))

_CONFIG = "l2_supercat"
_DIMS = 256
_POOLING = "mean1"  # part of the name: a change to how vectors are made must re-embed
_BATCH = 256  # texts per tokenizer call


@dataclass(frozen=True)
class _Model:
    table: np.ndarray  # (vocabulary, dims) float32
    tokenizer: Any  # tokenizers.Tokenizer, padding off
    digest: str  # of the weights and tokenizer files


_lock = threading.Lock()
_loaded: _Model | None = None


def _import_wordllama() -> Any:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        import wordllama
    except ImportError:
        raise ConfigError(MISSING) from None
    finally:  # its import configures the root logger: leave logging as the application set it
        root.handlers[:] = handlers
        root.setLevel(level)
    return wordllama


def load_wordllama() -> _Model:
    """The packaged model, loaded once per process (ConfigError when not installed)."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        wordllama = _import_wordllama()
        folder = Path(wordllama.__file__).parent
        try:
            # cache_dir = the package folder: its weights/ and tokenizers/ hold the files
            inference = wordllama.WordLlama.load(_CONFIG, cache_dir=folder, dim=_DIMS,
                                                 disable_download=True)
        except (FileNotFoundError, OSError, ValueError) as exc:
            raise ConfigError(f"[embed] builtin = \"wordllama\": the installed wordllama has no "
                              f"usable {_CONFIG} model ({exc}); reinstall it with "
                              + install_hint("wordllama")) from None
        tokenizer = inference.tokenizer
        tokenizer.no_padding()
        tokenizer.no_truncation()
        digest = hashlib.sha256()
        for path in (folder / "weights" / f"{_CONFIG}_{_DIMS}.safetensors",
                     folder / "tokenizers" / f"{_CONFIG}_tokenizer_config.json"):
            digest.update(path.read_bytes() if path.is_file() else path.name.encode())
        table = np.ascontiguousarray(inference.embedding, dtype=np.float32)
        _loaded = _Model(table, tokenizer, digest.hexdigest()[:12])
        return _loaded


class WordLlamaEmbedder:
    """L2-normalised mean of WordLlama's token vectors (256 dimensions)."""

    # Semantic, but weak next to the engines' full-text evidence: fused at full weight (what
    # `lexical = False` asks of server/engines/evidence.py) it lowered local_search's R@10 from
    # 0.895 to 0.822 and basic_search's from 0.797 to 0.768 on MultiHop-RAG (DEV, 200
    # questions; benchmarks/embed_eval.py). So the engines treat it as they treat the hash
    # embedder: its ranking adds candidates, weighs 0.1 in hybrid search, and leaves
    # local_search's ranking as it is with hashing. Entity search fuses it at full weight.
    lexical = True

    def __init__(self) -> None:
        model = load_wordllama()
        self._model = model
        self.dims = int(model.table.shape[1])
        # Keys cached vectors and is recorded in the index: other weights, tokenizer or
        # pooling must not reuse these vectors.
        self.name = f"builtin-wordllama-{_CONFIG}-{self.dims}-{model.digest}-{_POOLING}"

    async def embed(self, texts: list[str]) -> np.ndarray:
        return self.embed_sync(texts)

    def embed_sync(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dims), dtype=np.float32)
        table = self._model.table
        for start in range(0, len(texts), _BATCH):
            encoded = self._model.tokenizer.encode_batch(texts[start:start + _BATCH],
                                                         add_special_tokens=False)
            for i, enc in enumerate(encoded, start):
                ids = np.asarray(enc.ids, dtype=np.int64)
                if ids.size:
                    out[i] = table[np.clip(ids, 0, len(table) - 1)].sum(axis=0)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1, norms)
