"""A provider that answers indexing tasks with what GraphRAG already produced (`ReplayProvider`).

An import is an ordinary Canopy build (canopy.indexer.pipeline.run_index) whose model, for the work
GraphRAG did, is GraphRAG's output: extraction of a replayed unit returns its aligned instances
(`ingest.align`), and the report of a community placed exactly as GraphRAG placed it
returns GraphRAG's report, its findings' `[Data: Entities (..); Relationships (..)]` citations
mapped to the elements of Canopy's report context. Everything else (units GraphRAG did not
cover, communities that gained members, summaries of several distinct descriptions) goes to the
configured provider, so the index is the one `canopy index` would keep: same provider name,
same settings fingerprint, same bookkeeping (fingerprints, provenance, ACL classes, vectors).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from canopy.ids import entity_id, entity_key, relationship_id
from canopy.indexer.operations.clustering import GivenCommunities
from canopy.model import Extraction, TextUnit
from canopy.providers.base import FindingOut, Provider, ReportContext, ReportOut
from canopy.server.wings.graphrag.ingest.tables import GROutput, GRReport, cited

__all__ = ["ReplayProvider", "ReplayStats", "community_key"]


def community_key(community: int) -> str:
    """The key of a GraphRAG community among given placements."""
    return f"graphrag:{community}"


@dataclass
class ReplayStats:
    units_replayed: int = 0
    units_extracted: int = 0  # by the configured provider
    reports_imported: int = 0
    reports_written: int = 0  # by the configured provider


class ReplayProvider:
    """Wraps the configured provider (see the module docstring)."""

    def __init__(self, inner: Provider, extractions: dict[str, Extraction], out: GROutput,
                 given: GivenCommunities) -> None:
        self._inner = inner
        self._extractions = extractions
        self._given = given
        self._reports: dict[str, GRReport] = {community_key(n): r for n, r in out.reports.items()}
        self._entity = {e.human_id: entity_id(e.title) for e in out.entities}
        self._relationship = {r.human_id: relationship_id(entity_key(r.source),
                                                          entity_key(r.target))
                              for r in out.relationships}
        self.name = inner.name
        self.stats = ReplayStats()
        self._by_community: dict[str, str] | None = None  # Canopy community id -> key

    def __getattr__(self, attr: str) -> Any:  # everything else is the configured provider's
        return getattr(self._inner, attr)

    async def extract(self, unit: TextUnit, *, entity_types: list[str], claims: bool,
                      max_gleanings: int) -> Extraction:
        found = self._extractions.get(unit.id)
        if found is not None:
            self.stats.units_replayed += 1
            return found
        self.stats.units_extracted += 1
        return await self._inner.extract(unit, entity_types=entity_types, claims=claims,
                                         max_gleanings=max_gleanings)

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        return await self._inner.summarize(name, descriptions, max_tokens=max_tokens)

    async def report(self, context: ReportContext, *, max_tokens: int) -> ReportOut:
        if self._by_community is None:  # the hierarchy is placed before any report is written
            self._by_community = {cid: k for k, cid in self._given.ids.items()}
        key = self._by_community.get(context.community_id)
        theirs = self._reports.get(key) if key is not None else None
        if theirs is None:
            self.stats.reports_written += 1
            return await self._inner.report(context, max_tokens=max_tokens)
        self.stats.reports_imported += 1
        ents = {e.id: i for i, e in enumerate(context.entities)}
        rels = {r.id: i for i, r in enumerate(context.relationships)}
        findings = []
        for f in theirs.findings:
            e_ids, r_ids = cited(f.explanation)
            findings.append(FindingOut(
                summary=f.summary, explanation=f.explanation,
                entity_ids=[ents[x] for x in (self._entity.get(h) for h in e_ids) if x in ents],
                relationship_ids=[rels[x] for x in (self._relationship.get(h) for h in r_ids)
                                  if x in rels]))
        return ReportOut(title=theirs.title, summary=theirs.summary,
                         rating=min(10.0, max(0.0, theirs.rating)),
                         rating_explanation=theirs.rating_explanation, findings=findings)
