"""`CallerReader`: everything one caller may read of one committed generation, and the only way
query engines reach the index.

It binds the caller's readable ACL classes once: search prefilters on them, every artifact it
hands out has passed the serving rule (canopy.acl.access), and an artifact the caller may only
partly read comes back as the caller's view (canopy.acl.views), built when first asked for and
cached. Engines ask in bulk (`entities(ids)`, `reports(ids)`, ...): the reader reads the rows in
one query, builds the missing views concurrently, and answers. A hidden id is answered exactly like
a missing one: it is absent from the result.

A request may restrict its evidence to a time window (`within`, issue 31): after the permission
filter, only text units whose time falls in the window count. Units, mentions and searches drop
the others; an entity, relationship or community with no such unit does not exist for the request;
a report keeps the findings that cite such units (its summary only when all its evidence does).
What the window leaves out is absent, exactly as a hidden artifact is: no count or error shows it.

A reader lives for one request, on one thread, over one snapshot (canopy.storage.GraphSnapshot,
SQLite's canopy.store.Snapshot): the request sees one generation from its first read to its last;
search goes through a canopy.storage.SearchIndex pinned to the same generation.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from dataclasses import replace as dc_replace
from typing import Any

import numpy as np

from canopy.acl.access import State, community_state, state
from canopy.acl.caller import Caller
from canopy.acl.inventory import Inventory
from canopy.acl.view_cache import BuiltView, ViewCache
from canopy.acl.views import ViewParams, entity_view, relationship_view, report_view, view_key
from canopy.aliases import MergedName, merged_names
from canopy.errors import ConfigError
from canopy.model import Claim, Document, Entity, Relationship, Report, TextUnit
from canopy.periods import TimeWindow
from canopy.providers.base import Embedder, Provider, Usage, detached_usage
from canopy.storage import GraphSnapshot, SearchIndex
from canopy.store import CommunityRow, Edge, EntityRow, Gate, RelationshipRow, Store
from canopy.vectors import Hit

__all__ = ["WINDOW_OVERFETCH", "CallerReader", "ViewSupport"]

WINDOW_OVERFETCH = 4  # a search within a time window fetches this many times k, then filters


@dataclass(frozen=True)
class ViewSupport:
    """What building views needs: the provider, the cache, the budgets, the store's memo."""

    provider: Provider
    cache: ViewCache
    params: ViewParams
    store: Store


class CallerReader:
    def __init__(self, snap: GraphSnapshot, caller: Caller, *, views: ViewSupport,
                 vectors: SearchIndex, embedder: Embedder, all_live: bool) -> None:
        self._snap = snap
        self.inventory = Inventory(snap, caller)
        self.caller = caller
        self.views = views
        self._vectors = vectors
        self.embedder = embedder
        self.generation = snap.generation
        # Reads everything of a generation with nothing revoked: canonical artifacts only.
        self.trivial = caller.reads_everything and all_live
        self.provisional_used = False  # a view written offline fed this request
        self.view_usage: dict[str, Usage] = {}  # provider calls views of this request cost
        self._entities: dict[str, EntityRow | None] = {}
        self._relationships: dict[str, RelationshipRow | None] = {}
        self._entity_gates: dict[str, Gate | None] = {}
        self._edges: dict[str, Edge | None] = {}
        self._communities: dict[str, CommunityRow | None] = {}
        self._report_gates: dict[str, tuple[Gate, str] | None] = {}
        self._states: dict[tuple[str, str], State] = {}
        self._served: dict[tuple[str, str], Any] = {}
        self._members: dict[str, list[str]] = {}
        self._degrees: dict[str, int] = {}
        self.window: TimeWindow | None = None
        self._unit_times: dict[str, tuple[int, str] | None] = {}

    # ---- rows (memoized for the request) ---------------------------------------------------

    @staticmethod
    def _fetch(cache: dict[str, Any], fetch: Any, ids: Iterable[str]) -> dict[str, Any]:
        ids = list(dict.fromkeys(ids))
        missing = [i for i in ids if i not in cache]
        if missing:
            got = fetch(missing)
            for i in missing:
                cache[i] = got.get(i)
        return {i: cache[i] for i in ids if cache[i] is not None}

    def entity_rows(self, ids: Iterable[str]) -> dict[str, EntityRow]:
        return self._fetch(self._entities, self._snap.entities, ids)

    def relationship_rows(self, ids: Iterable[str]) -> dict[str, RelationshipRow]:
        return self._fetch(self._relationships, self._snap.relationships, ids)

    def community_rows(self, ids: Iterable[str]) -> dict[str, CommunityRow]:
        return self._fetch(self._communities, self._snap.communities, ids)

    def _gates(self, ids: Iterable[str]) -> dict[str, Gate]:
        return self._fetch(self._entity_gates, self._snap.entity_gates, ids)

    def edge_rows(self, ids: Iterable[str]) -> dict[str, Edge]:
        return self._fetch(self._edges, self._snap.edge_gates, ids)

    def entity_key(self, eid: str) -> str:
        return self.entity_rows([eid])[eid].key

    def _live_readable(self, units: Iterable[str]) -> bool:
        return any(a in self.caller.readable for a in self._snap.unit_acl(units).values())

    # ---- time --------------------------------------------------------------------------------

    def within(self, window: TimeWindow | None) -> None:
        """Restrict the rest of this request to evidence from text units whose time falls in
        `window` (None: no restriction). Set before reading, as engines do on entry."""
        if window != self.window:
            self.window = window
            self._states.clear()
            self._members.clear()

    def timed_units(self, ids: Iterable[str]) -> set[str]:
        """Which of these units are live, readable and in the window: the permission filter
        first, then the time one."""
        got = self._fetch(self._unit_times, self._snap.unit_times, ids)
        readable, window = self.caller.readable, self.window
        return {u for u, (acl, when) in got.items()
                if acl in readable and (window is None or window.holds(when))}

    def unit_times(self, ids: Iterable[str]) -> dict[str, str]:
        """The time (ISO date, "" when unknown) of each of these units the caller may read,
        whether or not it is in the window."""
        got = self._fetch(self._unit_times, self._snap.unit_times, ids)
        return {u: when for u, (acl, when) in got.items() if acl in self.caller.readable}

    def _in_window(self, units: Iterable[str]) -> bool:
        return self.window is None or bool(self.timed_units(units))

    def _report_in_window(self, report: Report) -> Report | None:
        """`report` as this request serves it: whole without a window; else its findings that
        cite units in the window (citing those only) and its summary when all its readable
        evidence is in the window; None when no finding is left."""
        if self.window is None:
            return report
        cited = {u for f in report.findings for u in f.text_unit_ids}
        inside = self.timed_units(cited | set(report.text_unit_ids))
        findings = tuple(dc_replace(f, text_unit_ids=tuple(u for u in f.text_unit_ids
                                                         if u in inside))
                         for f in report.findings if inside & set(f.text_unit_ids))
        if not findings:
            return None
        readable = self.readable_units(cited | set(report.text_unit_ids), windowed=False)
        whole = readable <= inside
        return dc_replace(report, findings=findings, summary=report.summary if whole else "",
                          text_unit_ids=tuple(u for u in report.text_unit_ids if u in inside))

    # ---- existence (no provider calls) -----------------------------------------------------

    def entity_states(self, ids: Iterable[str]) -> dict[str, State]:
        ids = list(dict.fromkeys(ids))
        todo = [e for e in ids if ("entity", e) not in self._states]
        gates = self._gates(todo)  # the gate decides, except for a stale entity's live units
        stale = self.entity_rows([e for e in todo if e in gates and gates[e].stale])
        for eid in todo:
            gate = gates.get(eid)
            if gate is None:
                st = State.NONE
            elif self.trivial:
                st = State.FULL
            else:
                def live_units(e: str = eid) -> bool:
                    return self._live_readable(stale[e].entity.text_unit_ids)

                st = state(gate, self.caller.readable, live_units)
            self._states[("entity", eid)] = st
        if self.window is not None:  # after the permission filter, the time one
            rows = self.entity_rows(e for e in todo if self._states[("entity", e)])
            for eid, row in rows.items():
                if not self._in_window(row.entity.text_unit_ids):
                    self._states[("entity", eid)] = State.NONE
        return {e: self._states[("entity", e)] for e in ids}

    def relationship_states(self, ids: Iterable[str]) -> dict[str, State]:
        ids = list(dict.fromkeys(ids))
        todo = [r for r in ids if ("relationship", r) not in self._states]
        edges = self.edge_rows(todo)
        self._decide_edges([edges[r] for r in todo if r in edges])
        for rid in todo:
            self._states.setdefault(("relationship", rid), State.NONE)
        return {r: self._states[("relationship", r)] for r in ids}

    def _decide_edges(self, edges: list[Edge]) -> None:
        """Record the state of each edge: its gate's, and none when an endpoint does not exist
        for the caller (a stale edge's live units are read from its row)."""
        ends = self.entity_states({x for e in edges for x in (e.source, e.target)})
        stale = self.relationship_rows([e.id for e in edges if e.gate.stale and not self.trivial])
        for e in edges:
            if self.trivial:
                st = State.FULL
            elif not (ends.get(e.source) and ends.get(e.target)):
                st = State.NONE
            else:
                def live_units(r: str = e.id) -> bool:
                    return self._live_readable(stale[r].relationship.text_unit_ids)

                st = state(e.gate, self.caller.readable, live_units)
            self._states[("relationship", e.id)] = st
        if self.window is not None:
            rows = self.relationship_rows(e.id for e in edges
                                          if self._states[("relationship", e.id)])
            for rid, row in rows.items():
                if not self._in_window(row.relationship.text_unit_ids):
                    self._states[("relationship", rid)] = State.NONE

    def incident(self, entity_ids: Iterable[str]) -> list[Edge]:
        """The relationships incident to these entities that exist for the caller, as Edge rows
        (cheap: for ranking before reading any description; a view's weight may differ)."""
        got = self._snap.incident_edges(entity_ids)
        for rid, edge in got.items():
            self._edges.setdefault(rid, edge)
        self._decide_edges([e for r, e in got.items() if ("relationship", r) not in self._states])
        return sorted((e for r, e in got.items() if self._states[("relationship", r)]),
                      key=lambda e: e.id)

    def served_report_count(self) -> int:
        """How many community reports the caller is served, canonical or as views: each
        community's servability decides, no report is read."""
        states = self.community_states(self.inventory.community_ids())
        return sum(1 for s in states.values() if s)

    def community_states(self, ids: Iterable[str]) -> dict[str, State]:
        """Whether each community's report is served: canonical (FULL), as a view, or not."""
        ids = list(dict.fromkeys(ids))
        rows = self.community_rows(ids)
        gates = self._fetch(self._report_gates, self._snap.report_gates, ids)
        out = {}
        timed: list[str] = []
        for cid in ids:
            st = self._states.get(("community", cid))
            if st is None:
                row = rows.get(cid)
                report = gates.get(cid)
                fresh = report is not None and report[1] == (row.fingerprint if row else None)
                if row is None:
                    st = State.NONE
                elif self.trivial:
                    st = State.FULL if fresh else State.NONE
                else:
                    def any_member(c: str = cid) -> bool:
                        return bool(self.members(c))

                    st = community_state(row.gate, report[0] if report else None, fresh,
                                         self.caller.readable, any_member)
                self._states[("community", cid)] = st
                if st and self.window is not None:
                    timed.append(cid)
            out[cid] = st
        if timed:  # after the permission filter, the time one: a finding's units in the window
            found = self._snap.reports(timed)
            for cid in timed:
                got = found.get(cid)
                if got is None or self._report_in_window(got.report) is None:
                    self._states[("community", cid)] = out[cid] = State.NONE
        return out

    def members(self, cid: str) -> list[str]:
        """Member entities of a community that exist for the caller."""
        got = self._members.get(cid)
        if got is None:
            ids = self._snap.members([cid]).get(cid, [])
            states = self.entity_states(ids)
            got = self._members[cid] = [e for e in ids if states[e]]
        return got

    def visible_size(self, cid: str) -> int:
        """How many of a community's members exist for the caller."""
        row = self.community_rows([cid]).get(cid)
        if row is None:
            return 0
        if self.trivial or row.gate.readable_by(self.caller.readable):
            return row.n_members
        if not row.gate.stale:
            return self._snap.count_members_within(cid, self.caller.readable)
        return len(self.members(cid))

    def degree(self, eid: str) -> int:
        """Relationships of the entity that exist for the caller (never a count with hidden
        ones)."""
        d = self._degrees.get(eid)
        if d is None:
            d = self._degrees[eid] = len(self.incident([eid]))
        return d

    async def ranked_members(self, cid: str, limit: int) -> tuple[list[Entity], int]:
        """A community's `limit` best-connected members as served (most relationships that
        exist for the caller first, then by name) and how many members exist for the caller.
        Ranked on names and degrees alone: a top community may have thousands of members, and
        a caller who reads everything gets the page from the stored order (an index range)."""
        if self.trivial:
            top = self._snap.ranked_member_page(cid, limit)
            served = await self.entities(top)
            return [served[e] for e in top if e in served], self.visible_size(cid)
        ids = self.members(cid)
        briefs = self._snap.entity_briefs(ids)
        counted = Counter(x for e in self.incident(ids) for x in {e.source, e.target})
        degree = {e: counted[e] for e in ids}
        self._degrees.update(degree)
        states = self.entity_states(ids)
        views = await self.entities([e for e in ids if states[e] == State.VIEW])
        name = {e: views[e].name if e in views else briefs[e][0] for e in ids}
        top = sorted(ids, key=lambda e: (-degree[e], name[e]))[:limit]
        served = await self.entities(top)
        return [served[e] for e in top if e in served], len(ids)

    async def ranked_relationships(self, cid: str, limit: int) -> tuple[list[Relationship], int]:
        """The `limit` heaviest relationships among a community's members as served (a view
        weighs what the caller may read of it), and how many exist for the caller. A caller who
        reads everything gets the page and the count from the stored order (index ranges: a top
        community may hold tens of thousands); any other caller's are decided edge by edge."""
        if self.trivial:
            top = self._snap.community_edge_page(cid, limit)
            got = await self.relationships(top)
            return [got[r] for r in top if r in got], self._snap.community_edge_count(cid)
        among = self.relationship_states(self.inventory.relationships_among(cid))
        weight = await self.served_weights(
            self.edge_rows([r for r, st in among.items() if st]).values())
        top = sorted(weight, key=lambda r: (-weight[r], r))[:limit]
        got = await self.relationships(top)
        return [got[r] for r in top if r in got], len(weight)

    # ---- content (views built as needed) ---------------------------------------------------

    async def entities(self, ids: Iterable[str]) -> dict[str, Entity]:
        """Each servable entity among `ids`, in order: canonical, or the caller's view."""
        ids = list(dict.fromkeys(ids))
        states = self.entity_states(ids)
        rows = self.entity_rows(ids)
        todo = [e for e in ids if states[e] == State.VIEW and ("entity", e) not in self._served]
        if todo:
            with detached_usage() as usage:
                await asyncio.gather(*(self._entity_view(e) for e in todo))
            self._count(usage)
        out = {}
        for eid in ids:
            st = states[eid]
            if st == State.NONE:
                continue
            served = self._served.get(("entity", eid))
            if served is None and st == State.FULL:
                e = rows[eid].entity
                served = e if self.trivial else dc_replace(e, degree=self.degree(eid))
                self._served[("entity", eid)] = served
            if served is not None:
                out[eid] = served
        return out

    def _count(self, usage: dict[str, Usage]) -> None:
        for task, u in usage.items():
            self.view_usage.setdefault(task, Usage()).add(u)

    def _live_classes(self, units: Iterable[str]) -> list[str]:
        """What a stale artifact's view is keyed by besides its gate, which a revocation leaves
        as it was: `unit:class` of each live unit among these, and which of those classes the
        caller reads. (Unit ids and the gate's classes the caller reads were not enough: a
        relabelled unit stays live in a class outside the gate, so a caller who may not read it
        met the view of one who may, cached under the same key, between the relabel and the
        regeneration; issue 30.)"""
        live = self._snap.unit_acl(units)
        readable = sorted({a for a in live.values() if a in self.caller.readable})
        return [*(f"{u}:{a}" for u, a in sorted(live.items())),
                "reads:" + ",".join(map(str, readable))]

    async def _entity_view(self, eid: str) -> None:
        row = self.entity_rows([eid])[eid]
        extra = self._live_classes(row.entity.text_unit_ids) if row.gate.stale else []
        key = view_key("entity", eid, row.hash, row.gate, self.caller.readable,
                       self.views.provider.name, self.views.params, *extra)

        async def build() -> BuiltView:
            view, durable = await entity_view(self, row.entity, key)
            return BuiltView(view, persist=durable and view is not None and view.description != "",
                             provisional=not durable)

        view, durable = await self.views.cache.once(key, "entity", eid, build)
        if view is not None:
            self.provisional_used |= not durable
            self._served[("entity", eid)] = dc_replace(view, degree=self.degree(eid))

    async def relationships(self, ids: Iterable[str]) -> dict[str, Relationship]:
        ids = list(dict.fromkeys(ids))
        states = self.relationship_states(ids)
        rows = self.relationship_rows(ids)
        todo = [r for r in ids
                if states[r] == State.VIEW and ("relationship", r) not in self._served]
        if todo:
            ends = await self.entities({e for r in todo for e in (
                rows[r].relationship.source, rows[r].relationship.target)})
            with detached_usage() as usage:
                await asyncio.gather(*(self._relationship_view(r, ends) for r in todo))
            self._count(usage)
        out = {}
        for rid in ids:
            if states[rid] == State.FULL:
                out[rid] = rows[rid].relationship
            elif (served := self._served.get(("relationship", rid))) is not None:
                out[rid] = served
        return out

    async def _relationship_view(self, rid: str, ends: dict[str, Entity]) -> None:
        row = self.relationship_rows([rid])[rid]
        r = row.relationship
        ends_rows = self.entity_rows([r.source, r.target])
        extra = [f"{e.hash}:{e.gate.sig}" for e in ends_rows.values()]
        if row.gate.stale:
            extra += self._live_classes(r.text_unit_ids)
        key = view_key("relationship", rid, row.hash, row.gate, self.caller.readable,
                       self.views.provider.name, self.views.params, *extra)

        async def build() -> BuiltView:
            view, durable = await relationship_view(self, r, ends)
            return BuiltView(view, persist=durable and view is not None, provisional=not durable)

        view, durable = await self.views.cache.once(key, "relationship", rid, build)
        if view is not None:
            self.provisional_used |= not durable
            self._served[("relationship", rid)] = view

    async def reports(self, ids: Iterable[str]) -> dict[str, Report]:
        """Each servable community report among `ids`: canonical, or the caller's view."""
        ids = list(dict.fromkeys(ids))
        states = self.community_states(ids)
        full = [c for c in ids if states[c] == State.FULL]
        canonical = {c: r.report for c, r in self._snap.reports(full).items()} if full else {}
        todo = [c for c in ids if states[c] == State.VIEW and ("report", c) not in self._served]
        if todo:
            with detached_usage() as usage:
                await asyncio.gather(*(self._report_view(c) for c in todo))
            self._count(usage)
        out = {}
        for cid in ids:
            got = canonical.get(cid) or self._served.get(("report", cid))
            if got is not None:
                got = self._report_in_window(got)
            if got is not None:
                out[cid] = got
        return out

    async def _report_view(self, cid: str) -> None:
        row = self.community_rows([cid])[cid]
        extra: list[str] = []
        if row.gate.stale:  # its visible members, and the classes of their live units
            members = sorted(self.members(cid))
            units = {u for e in self.entity_rows(members).values() for u in e.entity.text_unit_ids}
            extra = members + self._live_classes(units)
        key = view_key("report", cid, row.fingerprint, row.gate, self.caller.readable,
                       self.views.provider.name, self.views.params, *extra)

        async def build() -> BuiltView:
            view, durable = await report_view(self, cid)
            return BuiltView(view, persist=durable and view is not None, provisional=not durable)

        view, durable = await self.views.cache.once(key, "report", cid, build)
        if view is not None:
            self.provisional_used |= not durable
            self._served[("report", cid)] = view

    def merged_names(self, eid: str) -> list[MergedName]:
        """The other names entity `eid` was merged from, as the caller's own readable, live
        units support them (canopy.aliases): a link only hidden text makes is never listed."""
        if not self.entity_states([eid]).get(eid):
            return []
        key = self.entity_key(eid)
        rows = self._snap.entity_instances([key], classes=self.caller.readable)
        units = self._snap.units({r.unit_id for r in rows})
        documents = {u: row.unit.document_id for u, row in units.items()}
        return merged_names(key, ((r.name, r.type, r.unit_id) for r in rows), documents)

    def claims_of(self, entity_ids: Iterable[str]) -> list[Claim]:
        """Servable claims about these entities (claims are per unit: no views)."""
        rows = self._snap.claims_of(entity_ids)
        ends = self.entity_states({e for c in rows for e in (c.claim.subject, c.claim.object) if e})
        out = []
        for c in rows:
            readable = self.trivial or (not c.gate.stale and c.gate.acl <= self.caller.readable)
            if (readable and ends.get(c.claim.subject)
                    and (not c.claim.object or ends.get(c.claim.object))):
                out.append(c.claim)
        if self.window is not None:  # a claim is from its unit's time (its period is its own)
            inside = self.timed_units(u for c in out for u in c.text_unit_ids)
            out = [c for c in out if inside & set(c.text_unit_ids)]
        return out

    def documents(self) -> list[Document]:
        """Every document the caller may read (a full scan: for evaluation and exports, not for
        serving a question)."""
        readable, window = self.caller.readable, self.window
        return [r.document for r in self._snap.all_documents().values()
                if r.acl in readable and (window is None or window.holds(r.document.time))]

    def iter_units(self, batch: int = 2000) -> Iterator[list[tuple[TextUnit, Document]]]:
        """Every text unit the caller may read, with its document, in batches (a full scan: for
        evaluation baselines, not for serving a question)."""
        readable = self.caller.readable
        docs = {d.id: d for d in self.documents()}
        for rows in self._snap.iter_units(batch):
            out = [(r.unit, docs[r.unit.document_id]) for r in rows
                   if r.acl in readable and r.unit.document_id in docs]
            if out:
                yield out

    def readable_units(self, ids: Iterable[str], *, windowed: bool = True) -> set[str]:
        """Which of these text units are servable (live and readable, and in the request's
        window unless `windowed` is False), without reading them."""
        if windowed and self.window is not None:
            return self.timed_units(ids)
        return {u for u, a in self._snap.unit_acl(ids).items() if a in self.caller.readable}

    def units(self, ids: Iterable[str]) -> dict[str, tuple[TextUnit, Document]]:
        """Servable text units (live and readable) with their documents, in order."""
        ids = list(dict.fromkeys(ids))
        got = self._snap.unit_documents(ids)
        window = self.window
        return {u: (got[u][0].unit, got[u][1]) for u in ids
                if u in got and got[u][0].acl in self.caller.readable
                and (window is None or window.holds(got[u][1].time))}

    def sentence_terms(self, ids: Iterable[str]) -> dict[str, str]:
        """The stored analysis (builtin.text.sentence_terms) of each servable unit of these."""
        readable = self.caller.readable
        got = {u: terms for u, (acl, terms) in self._snap.unit_sentence_terms(ids).items()
               if acl in readable}
        if self.window is not None:
            inside = self.timed_units(got)
            got = {u: t for u, t in got.items() if u in inside}
        return got

    # ---- navigation ------------------------------------------------------------------------

    def entity_ids_by_key(self, keys: Iterable[str]) -> dict[str, str]:
        """Entity id of each normalized name that names an entity existing for the caller."""
        found = self._snap.entity_ids_by_key(keys)
        states = self.entity_states(found.values())
        return {k: e for k, e in found.items() if states[e]}

    async def served_weights(self, edges: Iterable[Edge]) -> dict[str, float]:
        """Each existing edge's weight as served: a view's own (what the caller may not read
        does not weigh), else the edge row's. Views are built only for edges served as views."""
        edges = list(edges)
        states = self.relationship_states(e.id for e in edges)
        views = await self.relationships([e.id for e in edges if states[e.id] == State.VIEW])
        return {e.id: views[e.id].weight if e.id in views else e.weight
                for e in edges if states[e.id]}

    def relationship_ids_of(self, entity_ids: Iterable[str]) -> dict[str, list[str]]:
        entity_ids = set(entity_ids)
        out: dict[str, list[str]] = {}
        for e in self.incident(entity_ids):
            for end in {e.source, e.target} & entity_ids:
                out.setdefault(end, []).append(e.id)
        return out

    def communities_of(self, entity_ids: Iterable[str]) -> dict[str, list[str]]:
        """Communities holding each entity, deepest first (their reports may not be servable)."""
        return self._snap.communities_of(entity_ids)

    def child_ids(self, ids: Iterable[str]) -> dict[str, list[str]]:
        return self._snap.children(ids)

    def servable_tops(self, ids: Iterable[str]) -> list[str]:
        """The given communities where servable, else their nearest servable descendants: a
        hidden parent may have visible children, and navigation never dead-ends at it."""
        out: list[str] = []
        todo = list(ids)
        while todo:
            states = self.community_states(todo)
            descend = [c for c in todo if not states[c]]
            out += [c for c in todo if states[c]]
            kids = self.child_ids(descend)
            todo = [k for c in descend for k in kids.get(c, [])]
        return sorted(out)

    def roots(self) -> list[str]:
        """The tops of the caller's servable hierarchy."""
        return self.servable_tops(r.id for r in self._snap.roots())

    def level_partition(self, level: int) -> list[str]:
        """Servable communities standing for `level` (communities at it plus childless
        shallower ones)."""
        ids = [r.id for r in self._snap.level_partition(level)]
        states = self.community_states(ids)
        return [c for c in ids if states[c]]

    def deepest_level(self) -> int:
        """The caller's deepest level: levels made only of hidden communities do not exist."""
        levels = self._snap.levels()
        if self.trivial:
            return max(levels, default=0)
        for level in reversed(levels):
            if self._snap.level_touches(level, self.caller.readable):
                return level
        return 0

    # ---- the entity–unit graph ---------------------------------------------------------------

    def unit_mentions(self, unit_ids: Iterable[str]) -> dict[str, list[str]]:
        """Entity keys (normalized names) mentioned in each unit the caller may read."""
        if self.window is not None:
            unit_ids = self.timed_units(unit_ids)
        return self._snap.unit_mentions(unit_ids, self.caller.readable)

    def mention_counts(self, keys: Iterable[str]) -> dict[str, int]:
        """How many units the caller may read mention each entity key (never a count with
        hidden or revoked units, nor with units outside the window)."""
        if self.window is not None:
            return {k: len(us) for k, us in self.mentioning_units(keys).items() if us}
        return self._snap.mention_counts(keys, self.caller.readable)

    def mentioning_units(self, keys: Iterable[str]) -> dict[str, list[str]]:
        """Units the caller may read that mention each entity key."""
        got = self._snap.mentioning_units(keys, self.caller.readable)
        if self.window is not None:
            inside = self.timed_units(u for us in got.values() for u in us)
            got = {k: [u for u in us if u in inside] for k, us in got.items()}
        return got

    # ---- search ----------------------------------------------------------------------------

    async def embed(self, text: str) -> np.ndarray:
        """`text`'s vector, by the embedder that made the index's vectors: ConfigError (one
        line) when the settings now select another one and no index run has re-embedded yet."""
        built = self._snap.meta("embedder")
        if built is not None and built != self.embedder.name:
            raise ConfigError(
                f"the index's vectors were made by the embedder {built} but the settings now "
                f"select {self.embedder.name}: run `canopy index` on the documents folder to "
                "embed them again")
        return (await self.embedder.embed([text]))[0]

    async def search(self, table: str, *, vector: np.ndarray | None, text: str | None, k: int,
                     level: int | None = None, vector_weight: float = 1.0) -> list[Hit]:
        """Hybrid search over rows the caller may read in full (prefiltered before ranking).
        With a window, rows with no evidence in it are dropped after the search (which
        fetches more to make up for them)."""
        if self.window is None:
            return await self._vectors.search(table, vector=vector, text=text, k=k,
                                              hidden_acl=self.caller.hidden, level=level,
                                              vector_weight=vector_weight)
        hits = await self._vectors.search(table, vector=vector, text=text,
                                          k=k * WINDOW_OVERFETCH, hidden_acl=self.caller.hidden,
                                          level=level, vector_weight=vector_weight)
        ids = [h.id for h in hits]
        if table == "text_units":
            keep = self.timed_units(ids)
        elif table == "entities":
            keep = {e for e, st in self.entity_states(ids).items() if st}
        elif table == "reports":
            keep = {c for c, st in self.community_states(ids).items() if st}
        elif table == "relationships":
            keep = {r for r, st in self.relationship_states(ids).items() if st}
        else:
            keep = set(ids)
        return [h for h in hits if h.id in keep][:k]

    def term_stats(self, terms: Iterable[str]) -> tuple[dict[str, int], int, int]:
        """(document frequency per term, units, summed terms) over the units the caller may
        read: BM25 weights that no hidden unit moves."""
        return (self._snap.term_df(terms, self.caller.readable),
                *self._snap.unit_stats(self.caller.readable))
