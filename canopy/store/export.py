"""The whole committed generation as Python objects: for tests that compare indexes and for
benchmarks. Nothing that serves or indexes uses it (it holds the whole graph in memory).

The same thing at two depths as the export package canopy.server.wings.graphrag.export (`canopy
export`): both take a generation out whole; this one at the store's depth, every row and no
caller, the package as one caller is served it, through their reader. The package does not use
this module.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from canopy.model import Claim, Community, Document, Entity, Relationship, Report, TextUnit
from canopy.store.rows import (
    ClaimRow,
    CommunityRow,
    DocumentRow,
    EntityRow,
    RelationshipRow,
    ReportRow,
    UnitRow,
)
from canopy.store.store import Store

__all__ = ["Graph", "load_graph"]


@dataclass
class Graph:
    documents: dict[str, Document] = field(default_factory=dict)
    units: dict[str, TextUnit] = field(default_factory=dict)
    entities: dict[str, Entity] = field(default_factory=dict)
    relationships: dict[str, Relationship] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    communities: dict[str, Community] = field(default_factory=dict)
    reports: dict[str, Report] = field(default_factory=dict)
    community_rows: dict[str, CommunityRow] = field(default_factory=dict)


def load_graph(store: Store) -> Graph:
    """Every row of the committed generation, read in one snapshot."""
    g = Graph()
    with store.snapshot() as s:
        db = s.db
        g.documents = {r[0]: DocumentRow.of(r).document
                       for r in db.execute("SELECT * FROM documents")}
        g.units = {r[0]: UnitRow.of(r).unit for r in db.execute("SELECT * FROM text_units")}
        g.entities = {r[0]: EntityRow.of(r).entity for r in db.execute("SELECT * FROM entities")}
        g.relationships = {r[0]: RelationshipRow.of(r).relationship
                           for r in db.execute("SELECT * FROM relationships")}
        g.claims = {r[0]: ClaimRow.of(r).claim for r in db.execute("SELECT * FROM claims")}
        g.reports = {r[0]: ReportRow.of(r).report for r in db.execute("SELECT * FROM reports")}
        g.community_rows = {r[0]: CommunityRow.of(r)
                            for r in db.execute("SELECT * FROM communities")}
        members: dict[str, list[str]] = defaultdict(list)
        for cid, eid in db.execute("SELECT community_id, entity_id FROM community_members "
                                   "ORDER BY community_id, entity_id"):
            members[cid].append(eid)
        children: dict[str, list[str]] = defaultdict(list)
        for cid, row in sorted(g.community_rows.items()):
            if row.parent:
                children[row.parent].append(cid)
    by_entity: dict[str, list[str]] = defaultdict(list)
    for r in g.relationships.values():
        by_entity[r.source].append(r.id)
    for cid, row in g.community_rows.items():
        inside = set(members[cid])
        rels = sorted({rid for e in inside for rid in by_entity[e]
                       if g.relationships[rid].target in inside})
        g.communities[cid] = Community(cid, row.level, row.parent, tuple(children[cid]),
                                       tuple(members[cid]), tuple(rels), row.fingerprint)
    return g
