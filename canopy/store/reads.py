"""Read queries over one generation, in batches, through indexes: nothing here loads a whole table
unless its name says so (`all_*`, used by the planner, status and export).

The same queries serve two readers: the server reads the committed generation (the `main`
tables), and the indexer reads the generation it is building (views overlaying its staged rows
on the committed ones; canopy.store.staging). `Tables` names what each query reads.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from canopy.ids import entity_id
from canopy.model import Document
from canopy.store.rows import (
    ClaimRow,
    CommunityRow,
    DocumentRow,
    Edge,
    EntityRow,
    Gate,
    RelationshipRow,
    ReportRow,
    UnitRow,
)

__all__ = ["COMMITTED", "EntityInstanceRow", "GraphReads", "RelationshipInstanceRow", "Tables"]


@dataclass(frozen=True)
class Tables:
    documents: str
    text_units: str
    entities: str
    relationships: str
    claims: str
    communities: str
    community_members: str
    reports: str
    term_df: str
    acl_stats: str
    community_edges: str
    member_ranks: str

    @staticmethod
    def prefixed(schema: str, suffix: str = "") -> Tables:
        return Tables(*(f"{schema}.{name}{suffix}" for name in (
            "documents", "text_units", "entities", "relationships", "claims", "communities",
            "community_members", "reports", "term_df", "acl_stats", "community_edges",
            "member_ranks")))


COMMITTED = Tables.prefixed("main")


@dataclass(frozen=True)
class EntityInstanceRow:
    unit_id: str
    sort_key: str
    acl: int
    key: str
    name: str
    type: str
    description: str


@dataclass(frozen=True)
class RelationshipInstanceRow:
    unit_id: str
    sort_key: str
    acl: int
    rid: str
    source_key: str
    target_key: str
    description: str
    strength: float


_I = TypeVar("_I", EntityInstanceRow, RelationshipInstanceRow)


def _ids(values: Iterable[str]) -> str:
    return json.dumps(sorted(set(values)))


_IN = "IN (SELECT value FROM json_each(?))"
# A unit's columns but its stored analysis, which only local_search's scoring reads
# (unit_sentence_terms): units are read for their text far more often.
_UNIT_COLUMNS = ("u.id, u.document_id, u.ordinal, u.text, u.n_tokens, u.char_start, u.char_end, "
                 "u.acl, u.sort_key, u.n_terms")


class GraphReads:
    """Batched reads of one generation (`tables`) over one connection."""

    def __init__(self, db: sqlite3.Connection, tables: Tables = COMMITTED) -> None:
        self.db = db
        self.t = tables

    def _rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        return self.db.execute(sql, args).fetchall()

    # ---- documents and units ---------------------------------------------------------------------

    def documents(self, ids: Iterable[str]) -> dict[str, DocumentRow]:
        rows = self._rows(f"SELECT * FROM {self.t.documents} WHERE id {_IN}", _ids(ids))
        return {r[0]: DocumentRow.of(r) for r in rows}

    def all_documents(self) -> dict[str, DocumentRow]:
        return {r[0]: DocumentRow.of(r) for r in self._rows(f"SELECT * FROM {self.t.documents}")}

    def units(self, ids: Iterable[str]) -> dict[str, UnitRow]:
        rows = self._rows(f"SELECT * FROM {self.t.text_units} WHERE id {_IN}", _ids(ids))
        return {r[0]: UnitRow.of(r) for r in rows}

    def unit_tokens(self, ids: Iterable[str]) -> dict[str, int]:
        """Token count of each unit among `ids` (the build's projection scales by tokens)."""
        sql = f"SELECT id, n_tokens FROM {self.t.text_units} WHERE id {_IN}"
        return dict(self._rows(sql, _ids(ids)))  # type: ignore[arg-type]

    def unit_acl(self, ids: Iterable[str]) -> dict[str, int]:
        """ACL class of each live unit among `ids` (absent: not live)."""
        sql = f"SELECT id, acl FROM {self.t.text_units} WHERE id {_IN}"
        return dict(self._rows(sql, _ids(ids)))  # type: ignore[arg-type]

    def unit_times(self, ids: Iterable[str]) -> dict[str, tuple[int, str]]:
        """ACL class and time (its document's, canopy.indexer.doc_time) of each live unit among
        `ids` (absent: not live)."""
        sql = (f"SELECT u.id, u.acl, d.time FROM {self.t.text_units} u JOIN {self.t.documents} d "
               f"ON d.id = u.document_id WHERE u.id {_IN}")
        return {r[0]: (r[1], r[2]) for r in self._rows(sql, _ids(ids))}

    def units_of_documents(self, document_ids: Iterable[str]) -> dict[str, list[UnitRow]]:
        sql = (f"SELECT * FROM {self.t.text_units} WHERE document_id {_IN} "
               "ORDER BY document_id, ordinal")
        out: dict[str, list[UnitRow]] = defaultdict(list)
        for r in self._rows(sql, _ids(document_ids)):
            out[r[1]].append(UnitRow.of(r))
        return dict(out)

    def unit_ids_of_documents(self, document_ids: Iterable[str]) -> dict[str, list[str]]:
        """The live units of these documents, in text order."""
        sql = (f"SELECT document_id, id FROM {self.t.text_units} WHERE document_id {_IN} "
               "ORDER BY document_id, ordinal")
        out: dict[str, list[str]] = defaultdict(list)
        for doc, uid in self._rows(sql, _ids(document_ids)):
            out[doc].append(uid)
        return dict(out)

    def misfiled_documents(self) -> set[str]:
        """Documents with a unit whose ACL class is not the document's. None in an index this
        release wrote; the planner relabels any it finds (an index written before issue 30's
        fix, where an edit in the update that relabelled a document left its unchanged units
        with the old class)."""
        sql = (f"SELECT DISTINCT u.document_id FROM {self.t.text_units} u "
               f"JOIN {self.t.documents} d ON d.id = u.document_id WHERE u.acl != d.acl")
        return {r[0] for r in self._rows(sql)}

    def unit_documents(self, unit_ids: Iterable[str]) -> dict[str, tuple[UnitRow, Document]]:
        """Each live unit with its document (one join)."""
        sql = (f"SELECT {_UNIT_COLUMNS}, d.* FROM {self.t.text_units} u JOIN {self.t.documents} d "
               f"ON d.id = u.document_id WHERE u.id {_IN}")
        out = {}
        for r in self._rows(sql, _ids(unit_ids)):
            out[r[0]] = (UnitRow.of(r[:10]), DocumentRow.of(r[10:]).document)
        return out

    def unit_sentence_terms(self, unit_ids: Iterable[str]) -> dict[str, tuple[int, str]]:
        """Each live unit's ACL class and stored analysis (builtin.text.sentence_terms)."""
        sql = f"SELECT id, acl, sentence_terms FROM {self.t.text_units} WHERE id {_IN}"
        return {r[0]: (r[1], r[2]) for r in self._rows(sql, _ids(unit_ids))}

    # What clustering reads of where entities are mentioned: the top of the hierarchy groups
    # communities by the text units and documents their entities share
    # (canopy.indexer.operations.grouping).
    # Lookups by id, no joins: over the indexer's overlay views a join materializes whole tables.

    def entity_sources(self, entity_ids: Iterable[str]) -> dict[str, tuple[set[str], set[str]]]:
        """The live text units each entity is mentioned in, and the paths of their documents."""
        units = {r[0]: json.loads(r[1]) for r in self._rows(
            f"SELECT id, units FROM {self.t.entities} WHERE id {_IN}", _ids(entity_ids))}
        docs = dict(self._rows(f"SELECT id, document_id FROM {self.t.text_units} WHERE id {_IN}",
                               _ids(u for us in units.values() for u in us)))
        paths = dict(self._rows(f"SELECT id, path FROM {self.t.documents} WHERE id {_IN}",
                                _ids(docs.values())))
        path = {u: paths[d] for u, d in docs.items() if d in paths}
        return {e: ({u for u in us if u in path}, {path[u] for u in us if u in path})
                for e, us in units.items()}

    def iter_entity_sources(self, batch: int = 20_000
                            ) -> Iterator[list[tuple[str, tuple[str, ...], tuple[str, ...]]]]:
        """Every entity with its live text units and their documents' paths, in batches (a
        fresh clustering). Each unit id and path is one shared string object."""
        paths = {d: sys.intern(p)
                 for d, p in self._rows(f"SELECT id, path FROM {self.t.documents}")}
        unit_path = {sys.intern(u): paths[d] for u, d in
                     self._rows(f"SELECT id, document_id FROM {self.t.text_units}") if d in paths}
        unit_id = {u: u for u in unit_path}  # json.loads makes new strings: share the stored ones
        last = ""
        while True:
            rows = self._rows(f"SELECT id, units FROM {self.t.entities} WHERE id > ? ORDER BY id "
                              "LIMIT ?", last, batch)
            if not rows:
                return
            out = []
            for eid, units in rows:
                live = sorted({unit_id[u] for u in json.loads(units) if u in unit_id})
                out.append((eid, tuple(live), tuple(sorted({unit_path[u] for u in live}))))
            yield out
            last = rows[-1][0]

    def unit_entities(self, unit_ids: Iterable[str]) -> dict[str, set[str]]:
        """Ids of the entities mentioned in each of these (live) text units."""
        out: dict[str, set[str]] = defaultdict(set)
        for unit, key in self._rows(
                f"SELECT unit_id, key FROM main.entity_instances WHERE unit_id {_IN}",
                _ids(unit_ids)):
            out[unit].add(entity_id(key))
        return dict(out)

    def document_entities(self, paths: Iterable[str]) -> dict[str, set[str]]:
        """Ids of the entities mentioned in each of these documents (by path)."""
        docs = dict(self._rows(f"SELECT id, path FROM {self.t.documents} WHERE path {_IN}",
                               _ids(paths)))
        unit_path = {u: docs[d] for d, us in self.unit_ids_of_documents(docs).items() for u in us}
        out: dict[str, set[str]] = defaultdict(set)
        for unit, entities in self.unit_entities(unit_path).items():
            out[unit_path[unit]] |= entities
        return dict(out)

    def documents_near(self, path: str, k: int) -> tuple[list[str], list[str]]:
        """The paths of up to `k` documents before `path` (nearest first) and after it."""
        before = [r[0] for r in self._rows(f"SELECT path FROM {self.t.documents} WHERE path < ? "
                                           "ORDER BY path DESC LIMIT ?", path, k)]
        after = [r[0] for r in self._rows(f"SELECT path FROM {self.t.documents} WHERE path > ? "
                                          "ORDER BY path LIMIT ?", path, k)]
        return before, after

    def iter_units(self, batch: int = 2000) -> Iterator[list[UnitRow]]:
        """Every live unit, in batches (for full rebuilds of derived data)."""
        last = ""
        while True:
            rows = self._rows(f"SELECT * FROM {self.t.text_units} WHERE id > ? ORDER BY id LIMIT ?",
                              last, batch)
            if not rows:
                return
            yield [UnitRow.of(r) for r in rows]
            last = rows[-1][0]

    # ---- entities, relationships, claims ---------------------------------------------------------

    def entities(self, ids: Iterable[str]) -> dict[str, EntityRow]:
        rows = self._rows(f"SELECT * FROM {self.t.entities} WHERE id {_IN}", _ids(ids))
        return {r[0]: EntityRow.of(r) for r in rows}

    def entity_texts(self, ids: Iterable[str]
                     ) -> dict[str, tuple[str, str, list[int], list[str]]]:
        """(name, description, ACL classes, text units) of each entity: what it is searched by,
        and where that comes from."""
        sql = f"SELECT id, name, description, acl, units FROM {self.t.entities} WHERE id {_IN}"
        return {r[0]: (r[1], r[2], json.loads(r[3]), json.loads(r[4]))
                for r in self._rows(sql, _ids(ids))}

    def entity_hashes(self, ids: Iterable[str]) -> dict[str, str]:
        """The content hash of each entity (what its stored token size is keyed by)."""
        sql = f"SELECT id, hash FROM {self.t.entities} WHERE id {_IN}"
        return dict(self._rows(sql, _ids(ids)))  # type: ignore[arg-type]

    def entity_briefs(self, ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """(name, degree) of each entity: what ranks a list of members."""
        sql = f"SELECT id, name, degree FROM {self.t.entities} WHERE id {_IN}"
        return {r[0]: (r[1], r[2]) for r in self._rows(sql, _ids(ids))}

    def entity_names(self, ids: Iterable[str]) -> dict[str, str]:
        sql = f"SELECT id, name FROM {self.t.entities} WHERE id {_IN}"
        return dict(self._rows(sql, _ids(ids)))  # type: ignore[arg-type]

    def entity_ids_by_key(self, keys: Iterable[str]) -> dict[str, str]:
        """Entity id of each normalized name that names an entity."""
        sql = f"SELECT key, id FROM {self.t.entities} WHERE key {_IN}"
        return dict(self._rows(sql, _ids(keys)))  # type: ignore[arg-type]

    def stale_ids(self, table: str) -> list[str]:
        name = getattr(self.t, table)
        return [r[0] for r in self._rows(f"SELECT id FROM {name} WHERE stale = 1")]

    def relationships(self, ids: Iterable[str]) -> dict[str, RelationshipRow]:
        rows = self._rows(f"SELECT * FROM {self.t.relationships} WHERE id {_IN}", _ids(ids))
        return {r[0]: RelationshipRow.of(r) for r in rows}

    def relationship_ids_of(self, entity_ids: Iterable[str]) -> dict[str, list[str]]:
        """Ids of the relationships incident to each entity."""
        ids = _ids(entity_ids)
        sql = (f"SELECT source, id FROM {self.t.relationships} WHERE source {_IN} UNION ALL "
               f"SELECT target, id FROM {self.t.relationships} WHERE target {_IN}")
        out: dict[str, list[str]] = defaultdict(list)
        for eid, rid in self._rows(sql, ids, ids):
            out[eid].append(rid)
        return {e: sorted(set(rs)) for e, rs in out.items()}

    def edge_gates(self, ids: Iterable[str]) -> dict[str, Edge]:
        sql = (f"SELECT id, source, target, weight, acl, acl_sig, stale FROM "
               f"{self.t.relationships} WHERE id {_IN}")
        return {r[0]: Edge.of(r) for r in self._rows(sql, _ids(ids))}

    def incident_edges(self, entity_ids: Iterable[str]) -> dict[str, Edge]:
        """Every relationship incident to these entities, as cheap Edge rows."""
        ids = _ids(entity_ids)
        cols = "id, source, target, weight, acl, acl_sig, stale"
        sql = (f"SELECT {cols} FROM {self.t.relationships} WHERE source {_IN} UNION "
               f"SELECT {cols} FROM {self.t.relationships} WHERE target {_IN}")
        return {r[0]: Edge.of(r) for r in self._rows(sql, ids, ids)}

    def entity_gates(self, ids: Iterable[str]) -> dict[str, Gate]:
        sql = f"SELECT id, acl, acl_sig, stale FROM {self.t.entities} WHERE id {_IN}"
        return {r[0]: Gate.of(r[1], r[2], r[3]) for r in self._rows(sql, _ids(ids))}

    def edges_of(self, entity_ids: Iterable[str]) -> list[tuple[str, str, str, float]]:
        """(id, source, target, weight) of relationships incident to these entities."""
        ids = _ids(entity_ids)
        sql = (f"SELECT id, source, target, weight FROM {self.t.relationships} WHERE source {_IN} "
               f"UNION SELECT id, source, target, weight FROM {self.t.relationships} "
               f"WHERE target {_IN}")
        return self._rows(sql, ids, ids)  # type: ignore[return-value]

    def degrees(self, entity_ids: Iterable[str]) -> dict[str, int]:
        ids = _ids(entity_ids)
        sql = (f"SELECT e, COUNT(*) FROM (SELECT source AS e FROM {self.t.relationships} "
               f"WHERE source {_IN} UNION ALL SELECT target FROM {self.t.relationships} "
               f"WHERE target {_IN}) GROUP BY e")
        return dict(self._rows(sql, ids, ids))  # type: ignore[arg-type]

    def iter_edges(self, batch: int = 50_000) -> Iterator[list[tuple[str, str, float]]]:
        """Every relationship as (source, target, weight), in batches (clustering)."""
        last = ""
        while True:
            rows = self._rows(f"SELECT id, source, target, weight FROM {self.t.relationships} "
                              "WHERE id > ? ORDER BY id LIMIT ?", last, batch)
            if not rows:
                return
            yield [(r[1], r[2], float(r[3])) for r in rows]
            last = rows[-1][0]

    def claims_of(self, entity_ids: Iterable[str]) -> list[ClaimRow]:
        """Claims whose subject or object is one of these entities."""
        ids = _ids(entity_ids)
        sql = (f"SELECT * FROM {self.t.claims} WHERE subject {_IN} UNION "
               f"SELECT * FROM {self.t.claims} WHERE object {_IN}")
        return sorted((ClaimRow.of(r) for r in self._rows(sql, ids, ids)), key=lambda c: c.claim.id)

    def claims(self, ids: Iterable[str]) -> dict[str, ClaimRow]:
        rows = self._rows(f"SELECT * FROM {self.t.claims} WHERE id {_IN}", _ids(ids))
        return {r[0]: ClaimRow.of(r) for r in rows}

    # ---- communities -----------------------------------------------------------------------------

    def communities(self, ids: Iterable[str]) -> dict[str, CommunityRow]:
        rows = self._rows(f"SELECT * FROM {self.t.communities} WHERE id {_IN}", _ids(ids))
        return {r[0]: CommunityRow.of(r) for r in rows}

    def children(self, ids: Iterable[str]) -> dict[str, list[str]]:
        sql = f"SELECT parent, id FROM {self.t.communities} WHERE parent {_IN} ORDER BY id"
        out: dict[str, list[str]] = defaultdict(list)
        for parent, cid in self._rows(sql, _ids(ids)):
            out[parent].append(cid)
        return dict(out)

    def members(self, ids: Iterable[str]) -> dict[str, list[str]]:
        sql = (f"SELECT community_id, entity_id FROM {self.t.community_members} "
               f"WHERE community_id {_IN} ORDER BY community_id, entity_id")
        out: dict[str, list[str]] = defaultdict(list)
        for cid, eid in self._rows(sql, _ids(ids)):
            out[cid].append(eid)
        return dict(out)

    def communities_of(self, entity_ids: Iterable[str]) -> dict[str, list[str]]:
        """Community ids of each entity, deepest first (one per level)."""
        sql = (f"SELECT entity_id, community_id, level FROM {self.t.community_members} "
               f"WHERE entity_id {_IN}")
        out: dict[str, list[tuple[int, str]]] = defaultdict(list)
        for eid, cid, level in self._rows(sql, _ids(entity_ids)):
            out[eid].append((level, cid))
        return {e: [c for _, c in sorted(cs, reverse=True)] for e, cs in out.items()}

    def memberships(self, entity_ids: Iterable[str]) -> dict[str, dict[int, str]]:
        """Each entity's community at every level it has one."""
        sql = (f"SELECT entity_id, community_id, level FROM {self.t.community_members} "
               f"WHERE entity_id {_IN}")
        out: dict[str, dict[int, str]] = defaultdict(dict)
        for eid, cid, level in self._rows(sql, _ids(entity_ids)):
            out[eid][level] = cid
        return dict(out)

    def relationships_among(self, community_ids: Iterable[str]) -> dict[str, list[str]]:
        """Ids of the relationships with both endpoints in each community, by id (read from
        community_edges: the writer stages them before anything reads them)."""
        sql = (f"SELECT community_id, relationship_id FROM {self.t.community_edges} "
               f"WHERE community_id {_IN} ORDER BY community_id, relationship_id")
        out: dict[str, list[str]] = defaultdict(list)
        for cid, rid in self._rows(sql, _ids(community_ids)):
            out[cid].append(rid)
        return dict(out)

    def community_edge_page(self, community_id: str, limit: int, offset: int = 0) -> list[str]:
        """Ids of the relationships among a community's members, heaviest first (then by id):
        items offset .. offset+limit of that order, an index range
        (canopy.store.community_index)."""
        sql = (f"SELECT relationship_id FROM {self.t.community_edges} WHERE community_id = ? "
               "ORDER BY weight DESC, relationship_id LIMIT ? OFFSET ?")
        return [r[0] for r in self._rows(sql, community_id, limit, offset)]

    def community_edge_count(self, community_id: str) -> int:
        """How many relationships have both endpoints in the community."""
        sql = f"SELECT COUNT(*) FROM {self.t.community_edges} WHERE community_id = ?"
        return int(self._rows(sql, community_id)[0][0])

    def ranked_member_page(self, community_id: str, limit: int, offset: int = 0) -> list[str]:
        """Ids of a community's members, highest degree first (then by name and id): items
        offset .. offset+limit of that order."""
        sql = (f"SELECT entity_id FROM {self.t.member_ranks} WHERE community_id = ? "
               "ORDER BY degree DESC, name, entity_id LIMIT ? OFFSET ?")
        return [r[0] for r in self._rows(sql, community_id, limit, offset)]

    def roots(self) -> list[CommunityRow]:
        rows = self._rows(f"SELECT * FROM {self.t.communities} WHERE parent IS NULL ORDER BY id")
        return [CommunityRow.of(r) for r in rows]

    def level_partition(self, level: int) -> list[CommunityRow]:
        """The communities standing for `level` (Edge et al. 2024's C0..C3): those at it plus the
        childless communities of shallower levels; read so, every level partitions the entities."""
        sql = (
            f"SELECT * FROM {self.t.communities} WHERE level = ? OR (level < ? AND n_children = 0) "
            "ORDER BY id"
        )
        return [CommunityRow.of(r) for r in self._rows(sql, level, level)]

    def levels(self) -> list[int]:
        return [
            r[0] for r in self._rows(f"SELECT DISTINCT level FROM {self.t.communities} ORDER BY 1")
        ]

    def communities_by_level(self) -> dict[str, int]:
        rows = self._rows(
            f"SELECT level, COUNT(*) FROM {self.t.communities} GROUP BY level ORDER BY level"
        )
        return {str(level): n for level, n in rows}

    # ---- reports ---------------------------------------------------------------------------------

    def reports(self, ids: Iterable[str]) -> dict[str, ReportRow]:
        rows = self._rows(f"SELECT * FROM {self.t.reports} WHERE community_id {_IN}", _ids(ids))
        return {r[0]: ReportRow.of(r) for r in rows}

    def report_gates(self, community_ids: Iterable[str]) -> dict[str, tuple[Gate, str]]:
        """(gate, fingerprint) of each community's report, without reading the report."""
        sql = (f"SELECT community_id, acl, stale, fingerprint FROM {self.t.reports} "
               f"WHERE community_id {_IN}")
        return {r[0]: (Gate.of(r[1], "", r[2]), r[3]) for r in self._rows(sql, _ids(community_ids))}

    def count_members_within(self, community_id: str, classes: Iterable[int]) -> int:
        """Members of a community with a source unit in one of these ACL classes (not stale)."""
        sql = (
            f"SELECT COUNT(*) FROM {self.t.community_members} m JOIN {self.t.entities} e "
            "ON e.id = m.entity_id WHERE m.community_id = ? AND e.stale = 0 AND EXISTS "
            "(SELECT 1 FROM json_each(e.acl) a WHERE a.value IN (SELECT value FROM json_each(?)))"
        )
        return int(self._rows(sql, community_id, json.dumps(sorted(classes)))[0][0])

    def level_touches(self, level: int, classes: Iterable[int]) -> bool:
        """Some community at `level` has a source unit in one of these ACL classes."""
        sql = (
            f"SELECT 1 FROM {self.t.communities} c WHERE c.level = ? AND EXISTS "
            "(SELECT 1 FROM json_each(c.acl) a WHERE a.value IN (SELECT value FROM json_each(?))) "
            "LIMIT 1"
        )
        return bool(self._rows(sql, level, json.dumps(sorted(classes))))

    def reports_by_fingerprint(self, fingerprints: Iterable[str]) -> dict[str, ReportRow]:
        rows = self._rows(
            f"SELECT * FROM {self.t.reports} WHERE fingerprint {_IN}", _ids(fingerprints)
        )
        return {r[8]: ReportRow.of(r) for r in rows}

    # ---- instances of live units -----------------------------------------------------------------

    def _live(self, unit_ids: Iterable[str]) -> dict[str, tuple[str, int]]:
        """(sort key, ACL class) of each live unit among `unit_ids`. A lookup by id, not a join:
        over the indexer's overlay views a join materializes the whole units table, while an
        IN-list is pushed into both of the view's arms and answered from their indexes."""
        sql = f"SELECT id, sort_key, acl FROM {self.t.text_units} WHERE id {_IN}"
        return {r[0]: (r[1], r[2]) for r in self._rows(sql, _ids(unit_ids))}

    def entity_instances(self, keys: Iterable[str], *,
                         classes: frozenset[int] | None = None) -> list[EntityInstanceRow]:
        """Instances of these entities (normalized names) in live units (optionally only units of
        these ACL classes), in merge order: by the hash of the unit's text, then unit id, then
        position in the unit."""
        sql = ("SELECT unit_id, pos, key, name, type, description FROM main.entity_instances "
               f"WHERE key {_IN}")
        return self._in_merge_order(self._rows(sql, _ids(keys)), EntityInstanceRow, classes)

    def instance_degrees(self, keys: Iterable[str]) -> dict[str, int]:
        """Relationships incident to each entity (by normalized name) in the generation: the
        distinct relationships with an instance in a live unit that has it as an endpoint."""
        ids = _ids(keys)
        sql = (f"SELECT source_key, rid, unit_id FROM main.relationship_instances "
               f"WHERE source_key {_IN} AND rid != '' UNION ALL "
               f"SELECT target_key, rid, unit_id FROM main.relationship_instances "
               f"WHERE target_key {_IN} AND rid != ''")
        found = self._rows(sql, ids, ids)
        live = self._live(r[2] for r in found)
        incident: dict[str, set[str]] = defaultdict(set)
        for key, rid, unit in found:
            if unit in live:
                incident[key].add(rid)
        return {k: len(v) for k, v in incident.items()}

    def relationship_instances(
        self, rids: Iterable[str], *, classes: frozenset[int] | None = None
    ) -> list[RelationshipInstanceRow]:
        sql = ("SELECT unit_id, pos, rid, source_key, target_key, description, strength "
               f"FROM main.relationship_instances WHERE rid {_IN}")
        return self._in_merge_order(self._rows(sql, _ids(rids)), RelationshipInstanceRow,
                                    classes)

    def _in_merge_order(self, found: list[tuple[Any, ...]], make: Callable[..., _I],
                        classes: frozenset[int] | None) -> list[_I]:
        """Instance rows (unit id, position, fields...) of live units (of these ACL classes,
        when given) as `make(unit id, sort key, ACL class, fields...)`, in merge order: by the
        unit's sort key, then unit id, then position."""
        live = self._live(r[0] for r in found)
        rows = sorted((live[u][0], u, pos, make(u, *live[u], *rest))
                      for u, pos, *rest in found
                      if u in live and (classes is None or live[u][1] in classes))
        return [r for *_, r in rows]

    # ---- the entity–unit graph of live units (local search's propagation) ----------------------

    def unit_mentions(self, unit_ids: Iterable[str], classes: Iterable[int]
                      ) -> dict[str, list[str]]:
        """Entity keys with an instance in each live unit of these ACL classes (through the
        instances' primary key: cost follows the units asked)."""
        sql = (f"SELECT i.unit_id, i.key FROM main.entity_instances i JOIN {self.t.text_units} u "
               f"ON u.id = i.unit_id WHERE i.unit_id {_IN} "
               "AND u.acl IN (SELECT value FROM json_each(?)) ORDER BY i.unit_id, i.pos")
        out: dict[str, list[str]] = defaultdict(list)
        for unit, key in self._rows(sql, _ids(unit_ids), json.dumps(sorted(classes))):
            if key not in out[unit]:
                out[unit].append(key)
        return dict(out)

    def mention_counts(self, keys: Iterable[str], classes: frozenset[int]) -> dict[str, int]:
        """Live units of these ACL classes with an instance of each key (absent: none). An
        entity row whose units are all of these classes and live answers from its provenance
        list's length; only the others count instances (cost follows those keys' units)."""
        keys = list(keys)
        cls = json.dumps(sorted(classes))
        sql = (f"SELECT key, json_array_length(units), acl, stale FROM {self.t.entities} "
               f"WHERE key {_IN}")
        out: dict[str, int] = {}
        exact: list[str] = []
        for key, n, acl, stale in self._rows(sql, _ids(keys)):
            if not stale and set(json.loads(acl)) <= classes:
                out[key] = int(n)
            else:
                exact.append(key)
        if exact:
            sql = (f"SELECT i.key, COUNT(DISTINCT i.unit_id) FROM main.entity_instances i "
                   f"JOIN {self.t.text_units} u ON u.id = i.unit_id WHERE i.key {_IN} "
                   "AND u.acl IN (SELECT value FROM json_each(?)) GROUP BY i.key")
            out.update(self._rows(sql, _ids(exact), cls))  # type: ignore[arg-type]
        return {k: n for k, n in out.items() if n}

    def mentioning_units(self, keys: Iterable[str], classes: Iterable[int]
                         ) -> dict[str, list[str]]:
        """Live units of these ACL classes with an instance of each key, by unit id."""
        sql = (f"SELECT DISTINCT i.key, i.unit_id FROM main.entity_instances i "
               f"JOIN {self.t.text_units} u ON u.id = i.unit_id WHERE i.key {_IN} "
               "AND u.acl IN (SELECT value FROM json_each(?)) ORDER BY i.key, i.unit_id")
        out: dict[str, list[str]] = defaultdict(list)
        for key, unit in self._rows(sql, _ids(keys), json.dumps(sorted(classes))):
            out[key].append(unit)
        return dict(out)

    # ---- lexical statistics (BM25 over what a caller may read) -----------------------------------

    def term_df(self, terms: Iterable[str], classes: Iterable[int]) -> dict[str, int]:
        sql = (f"SELECT term, SUM(df) FROM {self.t.term_df} WHERE term {_IN} "
               f"AND acl IN (SELECT value FROM json_each(?)) GROUP BY term")
        return dict(self._rows(sql, _ids(terms), json.dumps(sorted(classes))))  # type: ignore[arg-type]

    def unit_stats(self, classes: Iterable[int]) -> tuple[int, int]:
        """(units, summed lexical terms) of live units of these classes."""
        row = self._rows(f"SELECT COALESCE(SUM(units), 0), COALESCE(SUM(terms), 0) "
                         f"FROM {self.t.acl_stats} WHERE acl IN (SELECT value FROM json_each(?))",
                         json.dumps(sorted(classes)))[0]
        return int(row[0]), int(row[1])

    # ---- counts ----------------------------------------------------------------------------------

    def _touching(self, what: str, table: str) -> str:
        name = getattr(self.t, table)
        if table in ("documents", "text_units"):
            return f"SELECT {what} FROM {name} WHERE acl IN (SELECT value FROM json_each(?))"
        return (f"SELECT {what} FROM {name} t WHERE t.stale = 0 AND EXISTS (SELECT 1 FROM "
                "json_each(t.acl) a WHERE a.value IN (SELECT value FROM json_each(?)))")

    def count_touching(self, table: str, classes: Iterable[int]) -> int:
        """Rows of `table` (not stale) with a source unit in one of these ACL classes."""
        return int(self._rows(self._touching("COUNT(*)", table), json.dumps(sorted(classes)))[0][0])

    def ids_touching(self, table: str, classes: Iterable[int]) -> list[str]:
        """Ids of the rows `count_touching` counts, in id order."""
        sql = self._touching("id", table) + " ORDER BY id"
        return [r[0] for r in self._rows(sql, json.dumps(sorted(classes)))]

    def community_levels_touching(self, classes: Iterable[int]) -> dict[str, int]:
        sql = (
            f"SELECT level, COUNT(*) FROM {self.t.communities} t WHERE t.stale = 0 AND EXISTS "
            "(SELECT 1 FROM json_each(t.acl) a WHERE a.value IN (SELECT value FROM json_each(?))) "
            "GROUP BY level ORDER BY level"
        )
        return {str(level): n for level, n in self._rows(sql, json.dumps(sorted(classes)))}

    def partly_touching(self, table: str, classes: Iterable[int]) -> list[str]:
        """Ids of rows (entities, relationships or communities) with source units both in and
        out of these ACL classes, or stale rows touching them: what a caller with these classes
        is served as views."""
        name = getattr(self.t, table)
        cls = json.dumps(sorted(classes))
        inside = ("EXISTS (SELECT 1 FROM json_each(t.acl) a "
                  "WHERE a.value IN (SELECT value FROM json_each(?)))")
        outside = ("EXISTS (SELECT 1 FROM json_each(t.acl) a WHERE a.value NOT IN "
                   "(SELECT value FROM json_each(?)))")
        sql = f"SELECT id FROM {name} t WHERE {inside} AND ({outside} OR t.stale = 1) ORDER BY id"
        return [r[0] for r in self._rows(sql, cls, cls)]

    def community_ids(self) -> list[str]:
        return [r[0] for r in self._rows(f"SELECT id FROM {self.t.communities} ORDER BY id")]

    # ---- what the writer's stages read of a generation as a whole -------------------------------

    def keys(self, table: str) -> list[str]:
        """Every key of a generation table, in order (a report's key is its community id)."""
        key = "community_id" if table == "reports" else "id"
        return [r[0] for r in self._rows(f"SELECT {key} FROM {getattr(self.t, table)} ORDER BY 1")]

    def community_levels(self) -> dict[str, int]:
        """The level of every community."""
        return dict(self._rows(f"SELECT id, level FROM {self.t.communities}"))  # type: ignore[arg-type]

    def community_lineage(self, ids: Iterable[str]) -> dict[str, CommunityRow]:
        """The rows of these communities and of all their ancestors (a walk up the parents: as
        many reads as the hierarchy has levels)."""
        rows = self.communities(ids)
        frontier = {r.parent for r in rows.values() if r.parent}
        while frontier:
            frontier -= set(rows)
            got = self.communities(frontier)
            rows.update(got)
            frontier = {r.parent for r in got.values() if r.parent}
        return rows

    def all_memberships(self) -> dict[int, dict[str, set[str]]]:
        """Every community's members, by level (what a fresh clustering takes ids from)."""
        out: dict[int, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        sql = f"SELECT community_id, entity_id, level FROM {self.t.community_members}"
        for cid, eid, level in self._rows(sql):
            out[level][cid].add(eid)
        return {level: dict(m) for level, m in out.items()}

    def unrelated_entity_ids(self) -> list[str]:
        """Entities without a relationship (degree 0), by id."""
        sql = f"SELECT id FROM {self.t.entities} WHERE degree = 0 ORDER BY id"
        return [r[0] for r in self._rows(sql)]

    def claim_ids_of_units(self, unit_ids: Iterable[str]) -> list[str]:
        """Ids of the claims extracted from these units."""
        sql = f"SELECT id FROM {self.t.claims} WHERE unit_id {_IN}"
        return [r[0] for r in self._rows(sql, _ids(unit_ids))]

    def instance_keys_of_units(self) -> tuple[set[str], set[str]]:
        """(entity keys, relationship ids) with an instance in this generation's text units: what
        a full build merges."""
        keys = {r[0] for r in self._rows(
            f"SELECT DISTINCT i.key FROM entity_instances i JOIN {self.t.text_units} u "
            "ON u.id = i.unit_id")}
        rids = {r[0] for r in self._rows(
            f"SELECT DISTINCT i.rid FROM relationship_instances i JOIN {self.t.text_units} u "
            "ON u.id = i.unit_id WHERE i.rid != ''")}
        return keys, rids

    def count(self, table: str) -> int:
        name = getattr(self.t, table)
        return int(self._rows(f"SELECT COUNT(*) FROM {name}")[0][0])
