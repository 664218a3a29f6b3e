"""The builtin provider's CPU work as Ray tasks: extraction and embedding, in batches.

With no endpoint, indexing is CPU: the builtin extractor (tens of milliseconds a text unit) and
the builtin embedders. On Ray, a batch of `batch_units` units is one task (a task costs about a
millisecond of Ray overhead, so one per unit would spend a few percent on it), and an embedding
call is split into contiguous chunks, one task each. Every result is a pure function of its
input (the builtin provider is deterministic) and comes back to the writer in input order, so
the build is the one a local run makes. Summaries and reports stay in the writer: they are
cheap next to extraction, and they read the graph the writer is staging.

Accounting is the local path's: `RayBuiltinProvider` counts one "extract" call per unit, in
the writer, as `BuiltinProvider.extract` does.
"""

from __future__ import annotations

import functools

import numpy as np
import ray

from canopy.errors import ProviderError
from canopy.model import Extraction, TextUnit
from canopy.providers.base import Embedder
from canopy.providers.builtin import BuiltinProvider
from canopy.providers.builtin.processes import extract_batch
from canopy.settings import EmbedSettings

__all__ = ["RayBuiltinProvider", "RayEmbedder"]

# Fewer texts than this are not worth a task of their own.
MIN_EMBED_CHUNK = 32


@functools.lru_cache(maxsize=4)
def _embedder(settings_json: str) -> Embedder:
    """The builtin embedder of these settings, made once per worker process (WordLlama's
    vectors load once)."""
    from canopy.providers import make_builtin_embedder

    return make_builtin_embedder(EmbedSettings.model_validate_json(settings_json))


def _embed(settings_json: str, name: str, texts: list[str]) -> np.ndarray:
    embedder = _embedder(settings_json)
    if embedder.name != name:  # other weights or rules on this node: other vectors
        raise ProviderError(f"a Ray worker's builtin embedder is {embedder.name}, the writer's "
                            f"{name}: install the same Canopy on every node")
    return embedder.embed_sync(texts)  # type: ignore[attr-defined, no-any-return]


_extract_task = ray.remote(num_cpus=1)(extract_batch)
_embed_task = ray.remote(num_cpus=1)(_embed)


async def _run(ref: ray.ObjectRef, what: str) -> object:
    """A task's result; an error inside Canopy's code is raised as in a local run, a lost
    worker or node as ProviderError (for extraction: recorded per unit, retried next run)."""
    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        raise exc.as_instanceof_cause() from None
    except ray.exceptions.RayError as exc:
        raise ProviderError(f"Ray lost a {what} task ({type(exc).__name__})") from None


class RayBuiltinProvider(BuiltinProvider):
    """`BuiltinProvider` whose extraction runs on the cluster, `batch_units` units a task
    (`extract_batch`, which `canopy.indexer.stages.instances` uses when a provider has it). Same
    name and extraction version: its index is the local provider's, and either may update it."""

    def __init__(self, *, batch_units: int, in_flight: int, encoding: str = "o200k_base") -> None:
        super().__init__(encoding=encoding)
        self.extract_batch_size = batch_units
        self.extract_batches_in_flight = in_flight
        self.tasks = 0  # extraction tasks sent

    async def extract_batch(self, units: list[TextUnit], *, entity_types: list[str],
                            claims: bool, max_gleanings: int) -> list[Extraction]:
        for _ in units:
            self._count("extract")
        self.tasks += 1
        ref = _extract_task.remote(units, list(entity_types), claims)
        out = await _run(ref, "extraction")
        assert isinstance(out, list)
        return out


class RayEmbedder:
    """A builtin embedder whose batches are embedded on the cluster, split into up to
    `workers` contiguous chunks (at least `MIN_EMBED_CHUNK` texts each) and stacked back in
    order: the same vectors as `local`'s."""

    def __init__(self, local: Embedder, settings: EmbedSettings, workers: int) -> None:
        self.name = local.name
        self.lexical = bool(getattr(local, "lexical", False))
        self.cache_vectors = bool(getattr(local, "cache_vectors", True))
        self._dims = local.dims
        self._settings = settings.model_dump_json()
        self._workers = workers
        self.tasks = 0  # embedding tasks sent

    @property
    def dims(self) -> int | None:
        return self._dims

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self._dims or 0), dtype=np.float32)
        n = max(1, min(self._workers, len(texts) // MIN_EMBED_CHUNK))
        size = -(-len(texts) // n)
        refs = [_embed_task.remote(self._settings, self.name, texts[i:i + size])
                for i in range(0, len(texts), size)]
        self.tasks += len(refs)
        parts = [await _run(ref, "embedding") for ref in refs]
        return np.vstack([np.asarray(p, dtype=np.float32) for p in parts])
