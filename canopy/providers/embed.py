"""Embedding providers: `embed(texts) -> float32 array` with L2-normalised rows.

- `OpenAIEmbedder`: any OpenAI-compatible `/embeddings` endpoint, batched, with the same retry
  policy as chat (`canopy.llm.call_with_retries`).
- The builtin offline embedder lives in this module too (see the section at the end).
"""

from __future__ import annotations

import asyncio

import numpy as np
import openai

from canopy.errors import ConfigError, ProviderError
from canopy.llm import PerLoop, RetryPolicy, UsageCounter, call_with_retries
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
    at most `concurrency` requests in flight per event loop."""

    def __init__(
        self,
        settings: EmbedSettings,
        *,
        max_retries: int = 5,
        timeout_s: float = 60.0,
        concurrency: int = 4,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
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
        self._usage = UsageCounter()
        api_key = settings.api_key.get_secret_value() if settings.api_key else "not-needed"
        self._loop_state = PerLoop(
            lambda: (
                openai.AsyncOpenAI(
                    base_url=settings.base_url, api_key=api_key, max_retries=0, timeout=timeout_s
                ),
                asyncio.Semaphore(concurrency),
            ),
            lambda state: state[0].close(),
        )

    def usage(self) -> dict[str, Usage]:
        return self._usage.snapshot()

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
        client, semaphore = await self._loop_state.get()
        # Endpoints reject empty strings; a space embeds as "nothing" just as well.
        inputs = [t if t.strip() else " " for t in texts]

        async def once() -> object:
            async with semaphore:
                return await client.embeddings.create(
                    input=inputs, model=self.model, encoding_format="float"
                )

        try:
            response = await call_with_retries(
                once, what=self.what, model=self.model, policy=self._policy
            )
        except openai.APIError as exc:
            status = getattr(exc, "status_code", None)
            raise ProviderError(
                f"{self.what} refused an embedding request (HTTP {status})."
            ) from None
        data = sorted(response.data, key=lambda d: d.index)  # type: ignore[attr-defined]
        if len(data) != len(texts):
            raise ProviderError(f"{self.what} returned {len(data)} vectors for {len(texts)} texts.")
        usage = getattr(response, "usage", None)
        self._usage.add(
            "embed", calls=1, prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0)
        )
        return np.asarray([d.embedding for d in data], dtype=np.float32)


# ---- builtin offline embedder -------------------------------------------------------------------
# HashEmbedder goes here (written by the lead): same `name` / `embed` shape, uses `normalize_rows`.
