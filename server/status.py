"""What `canopy status` and the `index_status` tool report about an index."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from canopy.store import Store

if TYPE_CHECKING:
    from server.service import QueryContext

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
    failures: list[FailureInfo]
    last_run: dict[str, object] = Field(default_factory=dict, description="Stats of the last committed run")
    llm_usage: dict[str, dict[str, int]] = Field(default_factory=dict, description="LLM usage of the last run, by task")
    llm_concurrency: ConcurrencyInfo | None = Field(
        None, description="Requests in flight the LLM client achieved in the last run (None: builtin)")


def index_status(store: Store) -> IndexStatus:
    """Counts of the committed generation, read with COUNT queries in one snapshot (the graph
    itself is never loaded: the tool answers in milliseconds on large indexes)."""
    with store.snapshot():
        counts = {t: store.count(t) for t in ("documents", "text_units", "entities", "relationships",
                                               "claims", "communities", "reports")}
        levels = store.communities_by_level()
        runs = [r for r in store.runs(10) if r.generation is not None]
        skips = store.skips()
        failures = store.failures()
        provider = store.get_meta("provider", "none") or "none"
        embedder = store.get_meta("embedder", "none") or "none"
        generation = store.generation
    last = runs[0] if runs else None
    last_stats = dict(last.stats) if last else {}
    load = last_stats.pop("llm_concurrency", None)
    return IndexStatus(
        index_dir=str(store.index_dir), generation=generation, provider=provider, embedder=embedder,
        **counts, communities_by_level=levels,
        skipped=[SkipInfo(path=s.path, reason=s.reason) for s in skips],
        failures=[FailureInfo(id=f.unit_id, task=f.task, error=f.error) for f in failures],
        last_run=last_stats, llm_usage=last.usage if last else {},
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

    A caller who reads every live unit of a generation whose artifacts are all live gets `full`
    unchanged. Anyone else (a restricted caller, or anyone during a revocation generation) gets
    counts of what they can be served, canonical or as views (server.engines.serving): documents
    and units they can read; entities, relationships, claims, communities and reports that exist
    for them; skips of paths they could read, failures of units or communities they can see, and
    no corpus-wide run statistics or LLM usage (a caller who reads every document keeps those).
    Counts thus depend only on what the caller can see (communities are clustered on the whole
    graph: design §2's residual channel).
    """
    from server.engines.serving import caller_views_of

    vis = ctx.vis
    cv = caller_views_of(ctx)
    if cv.trivial:
        return full
    g = ctx.view.graph
    communities = [c for c in g.communities.values() if any(cv.entity_state(e) for e in c.entity_ids)]
    levels = Counter(c.level for c in communities)

    def failure_visible(f: FailureInfo) -> bool:
        if f.id in g.communities:
            return vis.can_see(g.communities[f.id].text_unit_ids)
        return f.id in vis.readable_units

    return full.model_copy(update={
        "documents": len(vis.readable_docs),
        "text_units": len(vis.readable_units),
        "entities": sum(1 for e in g.entities if cv.entity_state(e)),
        "relationships": sum(1 for r in g.relationships if cv.relationship_state(r)),
        "claims": sum(1 for c in g.claims.values() if cv.claim_visible(c)),
        "communities": len(communities),
        "communities_by_level": {str(k): v for k, v in sorted(levels.items())},
        "reports": sum(1 for c in g.communities if cv.community_state(c)),
        "skipped": [s for s in full.skipped if readable_path(s.path)],
        "failures": [f for f in full.failures if failure_visible(f)],
        "last_run": full.last_run if vis.everything else {},
        "llm_usage": full.llm_usage if vis.everything else {},
        "llm_concurrency": full.llm_concurrency if vis.everything else None,
    })
