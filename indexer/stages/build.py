"""What every stage of one index run shares: the `Build` (store, staging, providers, settings)
and its `BuildCounters`."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Protocol

from canopy.indexer.forecast import PlanSink
from canopy.indexer.operations.clustering import GivenCommunities
from canopy.indexer.operations.report_context import ElementSizes
from canopy.providers.base import Embedder, Provider
from canopy.providers.builtin.processes import WorkerPool
from canopy.settings import Settings
from canopy.store import GraphReads, Staging, Store
from canopy.tokenizer import Tokenizer

__all__ = ["Build", "BuildCounters", "EmbedSink", "Progress"]

# progress(stage, total) -> advance(n); the CLI passes tqdm bars, library callers may pass None.
Progress = Callable[[str, int], Callable[[int], None]]


class EmbedSink(Protocol):
    """Where a stage hands rows whose texts are final, to be embedded while the build goes on
    (canopy.indexer.stages.vectors.EmbeddingsAhead)."""

    def submit(self, table: str, ids: Iterable[str]) -> None: ...


class _NoEmbedAhead:
    def submit(self, table: str, ids: Iterable[str]) -> None:
        return None


def no_progress(stage: str, total: int) -> Callable[[int], None]:
    return lambda n: None


@dataclass
class BuildCounters:
    """What one run did, counted by its stages (the run's stats, beside its timings)."""

    documents: int = 0
    documents_rechunked: int = 0
    skipped: int = 0
    units_extracted: int = 0
    units_failed: int = 0
    entities_changed: int = 0
    communities_recomputed: int = 0
    reports_generated: int = 0
    reports_reused: int = 0
    embedded: int = 0
    # a new unit holds CJK text (the server preloads its segmenter): meta, not a stat
    cjk: bool = field(default=False, compare=False)

    def as_stats(self) -> dict[str, int]:
        out = asdict(self)
        del out["cjk"]
        return out


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
    counters: BuildCounters = field(default_factory=BuildCounters)
    # communities clustered elsewhere, for a fresh hierarchy to start from (import-graphrag)
    given: GivenCommunities | None = None
    # told the extraction plan and the projection of a build that calls an LLM (the CLI prints)
    on_plan: PlanSink | None = None
    # texts handed over as soon as they are final, so their embeddings overlap the later stages
    ahead: EmbedSink = field(default_factory=_NoEmbedAhead)
    # token sizes of entities and relationships in report contexts, counted where their rows
    # are written (the merge: while its summary requests run) for the reports to use
    sizes: ElementSizes = field(init=False)

    # the builtin provider's worker processes, shared by the stages that use them (`workers`)
    _workers: WorkerPool | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.sizes = ElementSizes(self.tok)

    def workers(self, processes: int) -> WorkerPool:
        """The run's worker processes (`processes` of them when the first stage to ask starts
        them; later stages take the same ones): extraction's workers hash the vectors too,
        instead of a second pool paying the imports again (seconds, on a loaded machine)."""
        if self._workers is None:
            self._workers = WorkerPool(processes)
        return self._workers

    async def close_workers(self) -> None:
        if self._workers is not None:
            await self._workers.close()
            self._workers = None

    @property
    def computes_here(self) -> bool:
        """Whether the provider's calls compute in this process and return without waiting
        (the builtin one: `in_process`), so there is nothing to overlap them with; the merge
        (canopy.indexer.stages.graph._streams) and the reports take their order from it."""
        return bool(getattr(self.provider, "in_process", False))

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
