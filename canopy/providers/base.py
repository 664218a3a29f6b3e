"""The provider seam: every task that needs "intelligence" goes through one `Provider`.

Two implementations share these signatures and output types:
- `LLMProvider` (canopy.providers.llm_provider): prompts from `prompts/` sent to an
  OpenAI-compatible endpoint through `ChatClient`, with structured outputs validated by the
  pydantic models below;
- `BuiltinProvider` (canopy.providers.builtin): offline heuristics and extractive summaries that
  return the very same types, so the whole product runs and is testable with no network.

Inputs are typed context objects (not pre-rendered prompts) so the builtin provider can work on
structure; the LLM provider renders them (the report's context: canopy.providers.report_prompt).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, Field

from canopy.model import Claim, Entity, Extraction, Relationship, Report, TextUnit

if TYPE_CHECKING:
    from canopy.limiter import LimiterStats

__all__ = [
    "INDEX_TASKS",
    "AnswerOut",
    "BatchExtractor",
    "ContextBlock",
    "DriftOut",
    "Embedder",
    "ExtractionOut",
    "MapOut",
    "MapPoint",
    "Provider",
    "RatingsOut",
    "ReportRating",
    "ReportContext",
    "ReportOut",
    "RouteOut",
    "SummaryOut",
    "Usage",
    "detached_usage",
    "prompt_key",
    "record_usage",
    "usage_scope",
]


# ---- structured outputs (the JSON schemas sent as response_format) --------------------------


class EntityOut(BaseModel):
    name: str = Field(description="Entity name as written in the text")
    type: str = Field(description="One of the allowed entity types")
    description: str = Field(
        description="Comprehensive description of the entity's attributes and activities")


class RelationshipOut(BaseModel):
    source: str = Field(description="Name of the source entity (must be one of the entities)")
    target: str = Field(description="Name of the target entity (must be one of the entities)")
    description: str = Field(description="Why the source and target are related")
    strength: int = Field(ge=1, le=10, description="Strength of the relationship, 1-10")


class ClaimOut(BaseModel):
    subject: str
    object: str = ""
    type: str
    status: str = Field(description="TRUE, FALSE or SUSPECTED")
    description: str
    start_date: str = Field("", description="ISO 8601 date (YYYY-MM-DD) the claimed activity "
                            "began, or \"\" if the text gives none")
    end_date: str = Field("", description="ISO 8601 date (YYYY-MM-DD) it ended, or \"\"")
    quote: str = Field("", description="The sentence(s) of the text stating the claim, copied "
                       "exactly")


class ExtractionOut(BaseModel):
    entities: list[EntityOut] = []
    relationships: list[RelationshipOut] = []
    claims: list[ClaimOut] = []


class AliasAnswer(BaseModel):
    id: int = Field(description="The pair's number")
    same: bool = Field(description="Whether both names refer to one entity in the passage")


class AliasesOut(BaseModel):
    pairs: list[AliasAnswer] = []


class SummaryOut(BaseModel):
    description: str


class FindingOut(BaseModel):
    summary: str = Field(description="Short headline of the insight")
    explanation: str = Field(
        description="Several sentences grounded in the data, citing record ids")
    entity_ids: list[int] = Field(
        [], description="Ids of entity records (from the Entities table) supporting it")
    relationship_ids: list[int] = Field([], description="Ids of relationship records supporting it")
    report_ids: list[int] = Field([], description="Ids of sub-community reports supporting it")


class ReportOut(BaseModel):
    title: str
    summary: str
    rating: float = Field(ge=0, le=10, description="Impact severity / importance, 0-10")
    rating_explanation: str
    findings: list[FindingOut]


class MapPoint(BaseModel):
    description: str = Field(
        description="A point of the answer, citing report ids like [Data: Reports (2, 7)]")
    score: int = Field(
        ge=0, le=100, description="How helpful the point is for answering the question, 0-100")
    report_ids: list[str] = Field([], description="Community/report ids that support the point")


class MapOut(BaseModel):
    points: list[MapPoint]


class ReportRating(BaseModel):
    id: str = Field(description="The report id from its [Report <id>] header")
    score: int = Field(ge=0, le=10, description="Relevance of the report to the question, 0-10")


class RatingsOut(BaseModel):
    scores: list[ReportRating]


class AnswerOut(BaseModel):
    answer: str


class DriftOut(BaseModel):
    intermediate_answer: str
    score: int = Field(ge=0, le=100, description="How well the answer addresses the question")
    follow_up_queries: list[str] = Field(
        description="Specific questions that would improve the answer")


class RouteOut(BaseModel):
    engine: Literal["basic", "local", "global"] = Field(
        description="basic: one fact stated in a passage; local: named entities and how they "
        "relate; global: the collection as a whole")
    reason: str = Field(description="Why, in one sentence")


# ---- inputs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ContextBlock:
    """One citable piece of query context (a report, entity, relationship, claim or text unit)."""

    kind: str  # report | entity | relationship | claim | text_unit
    id: str
    title: str
    text: str
    source: str = ""  # document path for text units
    # the title a citation of it shows, when shorter than the header (a text unit's document
    # title without the metadata its context header carries)
    cite_title: str = ""


_PLURAL = {"entity": "entities", "relationship": "relationships", "text_unit": "text units",
           "claim": "claims", "report": "reports"}


def render_blocks(blocks: list[ContextBlock]) -> str:
    out: list[str] = []
    kind = None
    for b in blocks:
        if b.kind != kind:
            kind = b.kind
            out.append(f"\n-----{_PLURAL.get(kind, kind + 's')}-----")
        head = f"[{b.kind} {b.id}] {b.title}".rstrip()
        out.append(f"{head}\n{b.text}" if b.text else head)
    return "\n".join(out).strip()


@dataclass(frozen=True)
class ReportContext:
    """What one community report is written from (Edge et al. 2024 §2.1.5).

    Elements are listed by prominence; `sub_reports` are child reports substituted for elements
    when the full element list did not fit the budget. Short integer ids (`entities[i]` has id i)
    are what the LLM cites; the indexer maps them back to artifact ids. The text an LLM sees of
    it is canopy.providers.report_prompt's."""

    community_id: str
    level: int
    entities: list[Entity]
    relationships: list[Relationship]
    claims: list[Claim] = field(default_factory=list)
    sub_reports: list[Report] = field(default_factory=list)
    degrees: dict[str, int] = field(default_factory=dict)


@dataclass
class Usage:
    """LLM accounting for one task."""

    calls: int = 0
    cached: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: int = 0

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.cached += other.cached
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.failures += other.failures

    def as_dict(self) -> dict[str, int]:
        return dict(calls=self.calls, cached=self.cached, prompt_tokens=self.prompt_tokens,
                    completion_tokens=self.completion_tokens, failures=self.failures)


# Per-call accounting. A scope is entered by one query-engine call; every provider call made in
# that call's task (and in the tasks it starts: asyncio copies the context) adds to it, so
# concurrent calls sharing one provider never mix their counts. Scopes nest (DRIFT inside a tool).
_SCOPES: ContextVar[tuple[dict[str, Usage], ...]] = ContextVar("canopy_usage_scopes", default=())
_SCOPE_LOCK = threading.Lock()


@contextmanager
def usage_scope() -> Iterator[dict[str, Usage]]:
    """Usage per task of the provider calls made inside the `with` block (filled as they run)."""
    usage: dict[str, Usage] = {}
    token = _SCOPES.set((*_SCOPES.get(), usage))
    try:
        yield usage
    finally:
        _SCOPES.reset(token)


@contextmanager
def detached_usage() -> Iterator[dict[str, Usage]]:
    """Usage of the provider calls made inside the block, counted there only and in no
    enclosing scope: work shared between calls (per-caller views) must not show in the usage of
    the call that happened to trigger it (design §2: no count that betrays hidden content)."""
    token = _SCOPES.set(())
    try:
        with usage_scope() as usage:
            yield usage
    finally:
        _SCOPES.reset(token)


def record_usage(task: str, **counts: int) -> None:
    """Add counts (Usage field names) to every scope open in the current context."""
    scopes = _SCOPES.get()
    if not scopes:
        return
    with _SCOPE_LOCK:
        for scope in scopes:
            usage = scope.setdefault(task, Usage())
            for name, n in counts.items():
                setattr(usage, name, getattr(usage, name) + n)


class Embedder(Protocol):
    """Text -> L2-normalised float32 rows. `dims` may be None until the first reply (endpoints)."""

    name: str

    @property
    def dims(self) -> int | None: ...

    async def embed(self, texts: list[str]) -> np.ndarray: ...


class Provider(Protocol):
    """Task-level operations. All methods are async; implementations must be deterministic
    given their inputs (the LLM path through temperature 0 and the response cache)."""

    name: str  # "builtin" or "openai:<model>"

    def usage(self) -> dict[str, Usage]:
        """Accounting per task name since creation (extract, glean, summarize, report, map, ...)."""
        ...

    def concurrency(self) -> LimiterStats | None:
        """Requests in flight achieved since creation (mean, peak, window, 429s); None when the
        provider calls no endpoint."""
        ...

    async def extract(self, unit: TextUnit, *, entity_types: list[str], claims: bool,
                      max_gleanings: int) -> Extraction:
        """Entities, relationships (and claims) of one text unit, with adaptive gleaning.
        Raises `InvalidOutput` when output stays invalid after retries and repair."""
        ...

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        """One coherent description from several descriptions of the same entity/relationship."""
        ...

    async def report(self, context: ReportContext, *, max_tokens: int) -> ReportOut:
        """A community report; finding ids index into context.entities/relationships/sub_reports."""
        ...

    async def rate(self, query: str, reports: list[Report]) -> list[int]:
        """0-10 relevance of each report to a query, judged from its title and summary, several
        reports per call (dynamic community selection); in the order of `reports`."""
        ...

    async def map(self, query: str, reports: list[Report], *, response_type: str) -> MapOut:
        """Global search map step over one batch of reports; points scored 0-100."""
        ...

    async def reduce(self, query: str, points: list[MapPoint], *, response_type: str) -> str:
        """Global search reduce step: the final answer from the best map points."""
        ...

    async def answer(self, query: str, blocks: list[ContextBlock], *, response_type: str) -> str:
        """Answer from mixed context (local/basic search)."""
        ...

    async def hyde(self, query: str) -> str:
        """A hypothetical answer used to find similar reports (DRIFT primer)."""
        ...

    async def drift(self, query: str, blocks: list[ContextBlock]) -> DriftOut:
        """Intermediate answer, its score and follow-up questions (DRIFT primer and steps)."""
        ...

    async def route(self, query: str, names: list[str]) -> RouteOut | None:
        """Which engine suits the question (the `search` router), given the names of the index
        it writes (with the share of passages each is in); None when the provider has no
        judgement of its own (the router's offline rules decide)."""
        ...


@runtime_checkable
class BatchExtractor(Protocol):
    """A provider whose extraction is cheaper a batch of units at a time (the builtin provider
    on a Ray cluster: one task per batch). The extraction stage sends it batches of up to
    `extract_batch_size` units, `extract_batches_in_flight` at once."""

    extract_batch_size: int
    extract_batches_in_flight: int

    async def extract_batch(self, units: list[TextUnit], *, entity_types: list[str],
                            claims: bool, max_gleanings: int) -> list[Extraction]:
        """`extract` of each unit, in the order of `units`."""
        ...


# The prompts whose output is stored in the index (the others apply at query time).
INDEX_TASKS = ("extract", "glean", "resolve", "summarize", "report")


def prompt_key(provider: Provider, *tasks: str) -> str:
    """What the provider's templates for `tasks` add to the fingerprints and memo keys of what
    they produce: "" with the packaged templates (and for the builtin provider, which uses
    none), else a hash of the replaced ones (`prompts.PromptSet.fingerprint`)."""
    prompts = getattr(provider, "prompts", None)
    return prompts.fingerprint(*tasks) if prompts is not None else ""
