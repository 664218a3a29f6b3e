"""Embedding providers: `embed(texts) -> float32 array` with L2-normalised rows.

- `OpenAIEmbedder`: any OpenAI-compatible `/embeddings` endpoint, batched, with the same retry
  policy as chat (`canopy.llm.call_with_retries`) and its own adaptive window of requests in
  flight (`canopy.limiter.AdaptiveLimiter`, between 1 and `EmbedSettings.concurrency`).
- The builtin offline embedders are `canopy.providers.builtin.HashEmbedder` (the default)
  and `canopy.providers.builtin.static.WordLlamaEmbedder` (`[embed] builtin = "wordllama"`).
"""

from __future__ import annotations

import asyncio
import base64
import json

import numpy as np

from canopy.endpoint import (
    Endpoint,
    EndpointConfig,
    EndpointError,
    EndpointFactory,
    local_endpoint,
)
from canopy.errors import ConfigError, ProviderError
from canopy.limiter import AdaptiveLimiter, LimiterStats
from canopy.llm import PerLoop, RetryPolicy, UsageCounter, call_with_retries, note_failure
from canopy.providers.base import Usage
from canopy.settings import EmbedSettings

__all__ = ["OpenAIEmbedder", "normalize_rows"]


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """float32 rows scaled to unit length (all-zero rows stay zero)."""
    out = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1, norms)


class OpenAIEmbedder:
    """Embeddings from an OpenAI-compatible endpoint, `settings.batch_size` texts per request and
    at most `concurrency` (default `settings.concurrency`) requests in flight, shared by every
    caller of this embedder."""

    def __init__(
        self,
        settings: EmbedSettings,
        *,
        max_retries: int = 5,
        timeout_s: float = 60.0,
        concurrency: int | None = None,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        endpoints: EndpointFactory = local_endpoint,
    ) -> None:
        if not settings.base_url:
            raise ConfigError(
                "No embedding endpoint configured: set [embed] base_url or CANOPY_EMBED_BASE_URL."
            )
        self.settings = settings
        self.model = settings.model
        self.name = f"openai:{settings.model}"
        self.what = f"Embedding endpoint {settings.base_url}"
        self.dims: int | None = None  # known after the first reply
        self._policy = RetryPolicy(max_retries, backoff_base, backoff_max)
        self._reached = False  # has the endpoint answered once?
        self._usage = UsageCounter()
        api_key = settings.api_key.get_secret_value() if settings.api_key else "not-needed"
        ceiling = concurrency or settings.concurrency
        config = EndpointConfig(settings.base_url, api_key, timeout_s, ceiling)
        self._loop_state = PerLoop(lambda: endpoints(config), lambda endpoint: endpoint.close())
        self._limiter = AdaptiveLimiter(
            ceiling=ceiling,
            initial=min(settings.initial_concurrency, ceiling),
            max_pause=backoff_max,
        )

    def usage(self) -> dict[str, Usage]:
        return self._usage.snapshot()

    def concurrency(self) -> LimiterStats:
        return self._limiter.stats()

    async def aclose(self) -> None:
        """Close the running event loop's connection pool now (optional, as for ChatClient)."""
        await self._loop_state.close()

    async def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dims or 0), dtype=np.float32)
        size = self.settings.batch_size
        batches = [texts[i : i + size] for i in range(0, len(texts), size)]
        try:
            parts = await asyncio.gather(*(self._batch(b) for b in batches))
        except ProviderError:
            self._usage.add("embed", failures=1)
            raise
        widths = {p.shape[1] for p in parts}
        if len(widths) != 1:
            raise ProviderError(
                f"{self.what} returned vectors of different sizes {sorted(widths)}."
            )
        self.dims = widths.pop()
        return normalize_rows(np.vstack(parts))

    async def _batch(self, texts: list[str]) -> np.ndarray:
        endpoint: Endpoint = await self._loop_state.get()
        # Endpoints reject empty strings; a space embeds as "nothing" just as well.
        inputs = [t if t.strip() else " " for t in texts]
        # base64 float32, as the official openai client asks by default (so servers made for it
        # accept it): a quarter of the reply's bytes of a JSON float list, decoded by numpy
        # instead of parsed number by number. A server that ignores it sends floats, read too.
        body = json.dumps(
            {"input": inputs, "model": self.model, "encoding_format": "base64"}, ensure_ascii=False
        ).encode("utf-8")

        async def once() -> bytes:
            async with self._limiter.slot("embed") as permit:
                try:
                    raw = await endpoint.post("/embeddings", body)
                except EndpointError as exc:
                    note_failure(permit, exc)
                    raise
                permit.succeeded()
                self._reached = True
                return raw

        try:
            raw = await call_with_retries(
                once, what=self.what, model=self.model, policy=self._policy,
                first_contact=not self._reached, progress=self._limiter.successes,
            )
        except EndpointError as exc:
            status = getattr(exc, "status", None)
            raise ProviderError(
                f"{self.what} refused an embedding request (HTTP {status})."
            ) from None
        try:
            reply = json.loads(raw)
            data = sorted(reply["data"], key=lambda d: d["index"])
            vectors = np.asarray([_vector(d["embedding"]) for d in data], dtype=np.float32)
        except (ValueError, KeyError, TypeError) as exc:
            raise ProviderError(
                f"{self.what} sent an unusable embedding reply ({type(exc).__name__})."
            ) from None
        if len(data) != len(texts):
            raise ProviderError(f"{self.what} returned {len(data)} vectors for {len(texts)} texts.")
        usage = reply.get("usage") or {}
        self._usage.add("embed", calls=1, prompt_tokens=int(usage.get("prompt_tokens") or 0))
        return vectors


def _vector(value: list[float] | str) -> np.ndarray:
    """One embedding: base64 little-endian float32, or a list of floats (servers that ignore
    encoding_format)."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value), dtype="<f4")
    return np.asarray(value, dtype=np.float32)
