"""What `canopy status` and the `index_status` tool report about an index."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from canopy.store import Store

if TYPE_CHECKING:
    from canopy.server.context import QueryContext

__all__ = [
    "ConcurrencyInfo", "IndexStatus", "concurrency_line", "index_status", "status_for_caller",
]


class SkipInfo(BaseModel):
    path: str
    reason: str


class FailureInfo(BaseModel):
    id: str = Field(description="Text unit id (extract) or community id (report)")
    task: str
    error: str


class ConcurrencyInfo(BaseModel):
    """What the LLM client's adaptive window achieved during the last run."""

    adaptive: bool = Field(description="False when a fixed number of requests was kept in flight")
    window: float = Field(description="Requests in flight allowed when the run ended")
    floor: int
    ceiling: int
    requests: int = Field(description="Requests sent, retries included")
    peak_in_flight: int
    mean_in_flight: float = Field(description="Time-weighted, first request to last reply")
    span_s: float = Field(description="From the first request to the last reply")
    busy_s: float = Field(description="Time with at least one request in flight")
    throttled: int = Field(description="429/503/529 replies and timeouts")
    backoffs: int = Field(description="Times the window was cut")
    paused_s: float = Field(description="Time every request waited for a Retry-After")


class IndexStatus(BaseModel):
    index_dir: str
    generation: int
    provider: str = Field(description="'builtin' (offline) or 'openai:<model>'")
    embedder: str
    documents: int
    text_units: int
    entities: int
    relationships: int
    claims: int
    communities: int
    communities_by_level: dict[str, int]
    reports: int
    skipped: list[SkipInfo]
    ignored_types: dict[str, int] = Field(
        default_factory=dict, description="Files not indexed because their type is not in "
        "[input] extensions, counted by extension (hidden files aside)")
    failures: list[FailureInfo]
    last_run: dict[str, object] = Field(
        default_factory=dict, description="Stats of the last committed run")
    llm_usage: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="LLM usage of the last run, by task")
    llm_usage_total: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="LLM usage of every committed run so far, by task")
    llm_concurrency: ConcurrencyInfo | None = Field(
        None,
        description="Requests in flight the LLM client achieved in the last run (None: builtin)")


def index_status(store: Store) -> IndexStatus:
    """Counts of the committed generation, read with COUNT queries in one snapshot (the graph
    itself is never loaded: the tool answers in milliseconds on large indexes)."""
    with store.snapshot() as snap:
        counts = {t: snap.count(t) for t in ("documents", "text_units", "entities", "relationships",
                                             "claims", "communities", "reports")}
        levels = snap.communities_by_level()
        skips = snap.skips()
        failures = snap.failures()
        ignored = json.loads(snap.meta("ignored_types", "{}") or "{}")
        provider = snap.meta("provider", "none") or "none"
        embedder = snap.meta("embedder", "none") or "none"
        generation = snap.generation
    runs = [r for r in store.runs(10) if r.generation is not None]
    last = runs[0] if runs else None
    last_stats = dict(last.stats) if last else {}
    load = last_stats.pop("llm_concurrency", None)
    return IndexStatus(
        index_dir=str(store.index_dir), generation=generation, provider=provider, embedder=embedder,
        **counts, communities_by_level=levels,
        skipped=[SkipInfo(path=s.path, reason=s.reason) for s in skips],
        ignored_types=ignored,
        failures=[FailureInfo(id=f.unit_id, task=f.task, error=f.error) for f in failures],
        last_run=last_stats, llm_usage=last.usage if last else {},
        llm_usage_total=store.usage_total(),
        llm_concurrency=ConcurrencyInfo.model_validate(load) if isinstance(load, dict) else None,
    )


def concurrency_line(c: ConcurrencyInfo) -> str:
    """One line for people: how busy the last run kept the LLM endpoint."""
    if c.adaptive:
        mode = f"adaptive window {c.floor}-{c.ceiling}, now {c.window:g}"
    else:
        mode = f"fixed at {c.ceiling}"
    line = (f"LLM requests in flight: mean {c.mean_in_flight:.1f} over {c.span_s:.1f}s, "
            f"peak {c.peak_in_flight} ({mode}); {c.requests} requests, "
            f"{c.throttled} throttled (429/overload)")
    if c.paused_s:
        line += f", paused {c.paused_s:.1f}s for Retry-After"
    return line


def status_for_caller(
    full: IndexStatus, ctx: QueryContext, readable_path: Callable[[str], bool]
) -> IndexStatus:
    """The status as one caller may see it (design §5: counts never reveal hidden items).

    A caller who reads everything of a generation with nothing revoked gets `full` unchanged.
    Anyone else gets counts of what they can be served, canonical or as views: documents and
    units they can read; entities, relationships, claims and communities with a source unit they
    can read; reports they are served; skips of paths they could read, failures of units or
    communities they can see, and no corpus-wide run statistics or LLM usage (a caller who reads
    every document keeps those). Counts thus depend only on what the caller can see
    (communities are clustered on the whole graph: design §2's residual channel).
    """
    reader = ctx.reader
    if reader.trivial:
        return full
    inventory, readable = reader.inventory, reader.caller.readable
    stale = {table: inventory.stale_ids(table)
             for table in ("entities", "relationships", "communities")}
    entities = inventory.count_readable("entities") + sum(
        1 for s in reader.entity_states(stale["entities"]).values() if s)
    relationships = inventory.count_readable("relationships") + sum(
        1 for s in reader.relationship_states(stale["relationships"]).values() if s)
    levels = inventory.community_levels_readable()
    stale_rows = reader.community_rows(stale["communities"])
    for cid, row in stale_rows.items():
        if reader.members(cid):
            levels[str(row.level)] = levels.get(str(row.level), 0) + 1
    reports = reader.served_report_count()
    units = reader.units(f.id for f in full.failures if f.task == "extract")
    failed_reports = reader.community_rows(f.id for f in full.failures if f.task == "report")
    visible_communities = {cid for cid, row in failed_reports.items()
                           if row.gate.readable_by(readable)}
    everything = reader.caller.reads_everything
    return full.model_copy(update={
        "documents": inventory.count_readable("documents"),
        "text_units": inventory.count_readable("text_units"),
        "entities": entities,
        "relationships": relationships,
        "claims": inventory.count_readable("claims"),
        "communities": sum(levels.values()),
        "communities_by_level": dict(sorted(levels.items(), key=lambda kv: int(kv[0]))),
        "reports": reports,
        "skipped": [s for s in full.skipped if readable_path(s.path)],
        "ignored_types": {},  # counts over the whole folder, hidden files' folders included
        "failures": [f for f in full.failures if f.id in units or f.id in visible_communities],
        "last_run": full.last_run if everything else {},
        "llm_usage": full.llm_usage if everything else {},
        "llm_usage_total": full.llm_usage_total if everything else {},
        "llm_concurrency": full.llm_concurrency if everything else None,
    })
