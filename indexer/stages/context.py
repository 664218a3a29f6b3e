"""What every stage of one index run shares."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from canopy.indexer.forecast import PlanSink
from canopy.indexer.operations.clustering import GivenCommunities
from canopy.providers.base import Embedder, Provider
from canopy.settings import Settings
from canopy.store import GraphReads, Staging, Store
from canopy.tokenizer import Tokenizer

__all__ = ["Build", "Progress"]

# progress(stage, total) -> advance(n); the CLI passes tqdm bars, library callers may pass None.
Progress = Callable[[str, int], Callable[[int], None]]


def no_progress(stage: str, total: int) -> Callable[[int], None]:
    return lambda n: None


@dataclass
class Build:
    """One index run: the store, the generation being staged, providers, settings."""

    store: Store
    staging: Staging
    settings: Settings
    provider: Provider
    embedder: Embedder
    tok: Tokenizer
    full: bool
    progress: Progress = no_progress
    stats: dict[str, Any] = field(default_factory=dict)
    # communities clustered elsewhere, for a fresh hierarchy to start from (import-graphrag)
    given: GivenCommunities | None = None
    # told the extraction plan and the projection of a build that calls an LLM (the CLI prints)
    on_plan: PlanSink | None = None

    @property
    def reads(self) -> GraphReads:
        """The generation being built: staged rows overlaid on the committed ones."""
        return self.staging.reads

    @property
    def committed(self) -> GraphReads:
        """The committed generation, as it was when this run started staging."""
        return GraphReads(self.store.writer)

    @property
    def memo(self) -> Store | None:
        """Where summaries are memoized: the store for an endpoint's (they cost calls), nowhere
        for the builtin provider's (writing them down costs more than writing them again)."""
        return self.store if self.settings.llm.enabled else None

    @property
    def concurrency(self) -> int:
        """Provider calls in flight (the builtin provider works in this process: a few)."""
        return self.settings.llm.concurrency if self.settings.llm.enabled else 4
