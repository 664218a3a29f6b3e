"""Provider construction: the one place that decides builtin vs. OpenAI-compatible."""

from __future__ import annotations

from typing import TYPE_CHECKING

from canopy.settings import EmbedSettings, Settings

if TYPE_CHECKING:
    from canopy.providers.base import Embedder, Provider
    from canopy.providers.fanout import Fanout
    from canopy.store import Store

__all__ = ["make_builtin_embedder", "make_embedder", "make_provider"]


def make_provider(settings: Settings, store: Store | None = None, *,
                  ray: Fanout | None = None) -> Provider:
    """The LLM provider when an endpoint is configured, else the builtin offline provider.
    With `ray` (the writer's `canopy index --ray`: the Ray wing's executor) the endpoint's
    requests, or the builtin provider's extraction, run on that cluster; everything else is the
    same provider."""
    if settings.llm.enabled:
        from canopy.endpoint import local_endpoint
        from canopy.llm import ChatClient
        from canopy.prompt_dir import load_prompt_dir
        from canopy.providers.llm_provider import LLMProvider
        from canopy.tokenizer import get_tokenizer

        client = ChatClient(settings.llm, cache=store, backoff_base=settings.llm.backoff_s,
                            prompts=load_prompt_dir(settings.prompts.dir),
                            endpoints=ray.endpoints if ray is not None else local_endpoint)
        return LLMProvider(client, get_tokenizer(settings.chunking.encoding))
    if ray is not None:
        return ray.builtin_provider()
    from canopy.providers.builtin import BuiltinProvider

    return BuiltinProvider()


def make_embedder(settings: Settings, *, ray: Fanout | None = None) -> Embedder:
    """An OpenAI-compatible embedder when [embed] base_url is set, else the builtin one chosen
    by [embed] builtin (`make_builtin_embedder`). With `ray`, the endpoint's requests or the
    builtin embedder's batches run on that cluster.

    The chat endpoint is not assumed to serve embeddings (many local servers do not)."""
    if settings.embed.enabled:
        from canopy.endpoint import local_endpoint
        from canopy.providers.embed import OpenAIEmbedder

        return OpenAIEmbedder(settings.embed,
                              endpoints=ray.endpoints if ray is not None else local_endpoint)
    embedder = make_builtin_embedder(settings.embed)
    return ray.builtin_embedder(embedder, settings.embed) if ray is not None else embedder


def make_builtin_embedder(embed: EmbedSettings) -> Embedder:
    """The builtin embedder [embed] builtin names: the hashing embedder, or WordLlama's static
    vectors (an optional extra; ConfigError in one line when it is not installed)."""
    if embed.builtin == "wordllama":
        from canopy.providers.builtin.static import WordLlamaEmbedder

        return WordLlamaEmbedder()
    from canopy.providers.builtin import HashEmbedder

    return HashEmbedder(embed.dims)
