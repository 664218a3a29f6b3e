"""What `canopy status` and the `index_status` tool report about an index."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, Field

from canopy.store import Store

__all__ = ["IndexStatus", "index_status"]


class SkipInfo(BaseModel):
    path: str
    reason: str


class FailureInfo(BaseModel):
    id: str = Field(description="Text unit id (extract) or community id (report)")
    task: str
    error: str


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


def index_status(store: Store) -> IndexStatus:
    with store.snapshot():
        g = store.graph()
        docs = store.documents()
        n_units = store._db.execute("SELECT COUNT(*) FROM text_units").fetchone()[0]
        runs = [r for r in store.runs(10) if r.generation is not None]
        skips = store.skips()
        failures = store.failures()
        provider = store.get_meta("provider", "none") or "none"
        embedder = store.get_meta("embedder", "none") or "none"
        generation = store.generation
    levels = Counter(c.level for c in g.communities.values())
    last = runs[0] if runs else None
    return IndexStatus(
        index_dir=str(store.index_dir), generation=generation, provider=provider, embedder=embedder,
        documents=len(docs), text_units=n_units, entities=len(g.entities), relationships=len(g.relationships),
        claims=len(g.claims), communities=len(g.communities),
        communities_by_level={str(k): v for k, v in sorted(levels.items())}, reports=len(g.reports),
        skipped=[SkipInfo(path=s.path, reason=s.reason) for s in skips],
        failures=[FailureInfo(id=f.unit_id, task=f.task, error=f.error) for f in failures],
        last_run=dict(last.stats) if last else {}, llm_usage=last.usage if last else {},
    )
