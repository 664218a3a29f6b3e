"""Provider construction: the one place that decides builtin vs. OpenAI-compatible."""

from __future__ import annotations

from typing import TYPE_CHECKING

from canopy.settings import Settings

if TYPE_CHECKING:
    from canopy.providers.base import Embedder, Provider
    from canopy.store import Store

__all__ = ["make_embedder", "make_provider"]


def make_provider(settings: Settings, store: Store | None = None) -> Provider:
    """The LLM provider when an endpoint is configured, else the builtin offline provider."""
    if settings.llm.enabled:
        from canopy.llm import ChatClient
        from canopy.prompt_dir import load_prompt_dir
        from canopy.providers.llm import LLMProvider

        client = ChatClient(settings.llm, cache=store, backoff_base=settings.llm.backoff_s,
                            prompts=load_prompt_dir(settings.prompts.dir))
        return LLMProvider(client)
    from canopy.providers.builtin import BuiltinProvider

    return BuiltinProvider()


def make_embedder(settings: Settings) -> Embedder:
    """An OpenAI-compatible embedder when [embed] base_url is set, else the builtin one chosen
    by [embed] builtin: the hashing embedder, or WordLlama's static vectors (an optional extra;
    ConfigError in one line when it is not installed).

    The chat endpoint is not assumed to serve embeddings (many local servers do not)."""
    if settings.embed.enabled:
        from canopy.providers.embed import OpenAIEmbedder

        return OpenAIEmbedder(settings.embed)
    if settings.embed.builtin == "wordllama":
        from canopy.providers.builtin.static import WordLlamaEmbedder

        return WordLlamaEmbedder()
    from canopy.providers.builtin import HashEmbedder

    return HashEmbedder(settings.embed.dims)
