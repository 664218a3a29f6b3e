"""Stored rows: an artifact as the model defines it, plus what serving needs to know about its
provenance without reading it (`Gate`), plus bookkeeping columns the indexer maintains."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from canopy.model import Claim, Document, Entity, Finding, Relationship, Report, TextUnit

__all__ = [
    "ClaimRow",
    "CommunityRow",
    "DocumentRow",
    "Edge",
    "EntityRow",
    "Gate",
    "RelationshipRow",
    "ReportRow",
    "UnitRow",
    "dump",
    "findings_json",
]


def dump(value: Any) -> str:
    """Compact JSON, as every list column is stored."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@functools.lru_cache(maxsize=8192)
def _classes(acl: str) -> frozenset[int]:
    """The parsed ACL class list (few distinct lists recur across millions of rows)."""
    return frozenset(json.loads(acl))


@dataclass(frozen=True)
class Gate:
    """An artifact's provenance, summarized for the serving rule (design §2).

    `acl`: the ACL classes (label sets) of the text units it derives from; `sig`: a hash of its
    (unit, class) pairs, which changes when a source unit is relabelled; `stale`: a source unit
    was revoked (deleted or relabelled) and regeneration has not caught up yet."""

    acl: frozenset[int]
    sig: str
    stale: bool

    def readable_by(self, readable: frozenset[int]) -> bool:
        """Every source unit is live and readable with these classes."""
        return not self.stale and self.acl <= readable

    def touches(self, readable: frozenset[int]) -> bool:
        """Some source unit has a class among these (it may no longer be live if stale)."""
        return not self.acl.isdisjoint(readable)

    @staticmethod
    def of(acl: str, sig: str, stale: int) -> Gate:
        return Gate(_classes(acl), sig, bool(stale))


@dataclass(frozen=True)
class DocumentRow:
    document: Document
    acl: int
    size: int
    mtime_ns: int

    def values(self) -> tuple[Any, ...]:
        d = self.document
        return (d.id, d.path, d.content_hash, d.title, d.n_chars, dump(d.labels), dump(d.metadata),
                self.acl, self.size, self.mtime_ns, d.time, d.time_source)

    @staticmethod
    def of(r: tuple[Any, ...]) -> DocumentRow:
        meta = tuple(tuple(kv) for kv in json.loads(r[6]))
        doc = Document(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])), meta,  # type: ignore[arg-type]
                       r[10], r[11])
        return DocumentRow(doc, r[7], r[8], r[9])


@dataclass(frozen=True)
class UnitRow:
    unit: TextUnit
    acl: int
    sort_key: str  # merge order: hash of the unit's text (independent of document ids)
    n_terms: int  # lexical terms of header + text: BM25 length
    # its text's terms piece by piece, for local_search (builtin.text.sentence_terms; "" when
    # not read, or for a unit stored before the column existed)
    sentence_terms: str = ""

    def values(self) -> tuple[Any, ...]:
        u = self.unit
        return (u.id, u.document_id, u.ordinal, u.text, u.n_tokens, u.char_start, u.char_end,
                self.acl, self.sort_key, self.n_terms, self.sentence_terms)

    @staticmethod
    def of(r: tuple[Any, ...]) -> UnitRow:
        """From a row of all its columns, or of the first ten (without sentence_terms)."""
        return UnitRow(TextUnit(*r[:7]), r[7], r[8], r[9], r[10] if len(r) > 10 else "")


@dataclass(frozen=True)
class EntityRow:
    entity: Entity
    key: str  # normalized name
    gate: Gate
    hash: str  # content hash of what reports are written from

    def values(self) -> tuple[Any, ...]:
        e = self.entity
        return (e.id, self.key, e.name, e.type, e.description, dump(e.text_unit_ids), e.degree,
                dump(sorted(self.gate.acl)), self.gate.sig, self.hash, int(self.gate.stale))

    @staticmethod
    def of(r: tuple[Any, ...]) -> EntityRow:
        e = Entity(r[0], r[2], r[3], r[4], tuple(json.loads(r[5])), r[6])
        return EntityRow(e, r[1], Gate.of(r[7], r[8], r[10]), r[9])


@dataclass(frozen=True)
class RelationshipRow:
    relationship: Relationship
    gate: Gate
    hash: str

    def values(self) -> tuple[Any, ...]:
        r = self.relationship
        return (r.id, r.source, r.target, r.description, r.weight, dump(r.text_unit_ids),
                dump(sorted(self.gate.acl)), self.gate.sig, self.hash, int(self.gate.stale))

    @staticmethod
    def of(r: tuple[Any, ...]) -> RelationshipRow:
        rel = Relationship(r[0], r[1], r[2], r[3], r[4], tuple(json.loads(r[5])))
        return RelationshipRow(rel, Gate.of(r[6], r[7], r[9]), r[8])


@dataclass(frozen=True)
class Edge:
    """A relationship's endpoints, weight and gate: enough to decide whether it exists for a
    caller and to rank it, without reading its description or sources."""

    id: str
    source: str
    target: str
    weight: float
    gate: Gate

    @staticmethod
    def of(r: tuple[Any, ...]) -> Edge:
        return Edge(r[0], r[1], r[2], r[3], Gate.of(r[4], r[5], r[6]))


@dataclass(frozen=True)
class ClaimRow:
    claim: Claim
    gate: Gate
    hash: str

    def values(self) -> tuple[Any, ...]:
        c = self.claim
        return (c.id, c.subject, c.object, c.type, c.status, c.description, c.text_unit_ids[0],
                dump(sorted(self.gate.acl)), self.hash, int(self.gate.stale), c.start_date,
                c.end_date, c.quote)

    @staticmethod
    def of(r: tuple[Any, ...]) -> ClaimRow:
        claim = Claim(r[0], r[1], r[2], r[3], r[4], r[5], (r[6],), r[10], r[11], r[12])
        return ClaimRow(claim, Gate.of(r[7], "", r[9]), r[8])


@dataclass(frozen=True)
class CommunityRow:
    """A community as stored: its place in the hierarchy, sizes and gate; members and children
    are separate rows (`community_members`, `communities.parent`)."""

    id: str
    level: int
    parent: str | None
    n_members: int
    n_children: int
    fingerprint: str
    gate: Gate
    w_in: float = 0.0  # internal edge weight (roots only: the modularity guard's aggregates)
    d_tot: float = 0.0  # summed weighted degree of members (roots only)

    def values(self) -> tuple[Any, ...]:
        return (self.id, self.level, self.parent, self.n_members, self.n_children,
                dump(sorted(self.gate.acl)), self.gate.sig, self.fingerprint,
                int(self.gate.stale), self.w_in, self.d_tot)

    @staticmethod
    def of(r: tuple[Any, ...]) -> CommunityRow:
        return CommunityRow(r[0], r[1], r[2], r[3], r[4], r[7], Gate.of(r[5], r[6], r[8]),
                            r[9], r[10])


def findings_json(findings: Iterable[Finding]) -> str:
    return dump([[f.summary, f.explanation, list(f.entity_ids), list(f.relationship_ids),
                  list(f.text_unit_ids)] for f in findings])


def findings_of(text: str) -> tuple[Finding, ...]:
    return tuple(Finding(f[0], f[1], tuple(f[2]), tuple(f[3]), tuple(f[4]))
                 for f in json.loads(text))


@dataclass(frozen=True)
class ReportRow:
    report: Report
    gate: Gate

    def values(self) -> tuple[Any, ...]:
        r = self.report
        return (r.community_id, r.level, r.title, r.summary, r.rating, r.rating_explanation,
                findings_json(r.findings), dump(r.text_unit_ids), r.fingerprint, r.context_tokens,
                dump(r.used_subreports), dump(sorted(self.gate.acl)), int(self.gate.stale))

    @staticmethod
    def of(r: tuple[Any, ...]) -> ReportRow:
        report = Report(r[0], r[1], r[2], r[3], r[4], r[5], findings_of(r[6]),
                        tuple(json.loads(r[7])), r[8], r[9], tuple(json.loads(r[10])))
        return ReportRow(report, Gate.of(r[11], "", r[12]))
