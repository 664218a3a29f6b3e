"""Per-caller views of derived artifacts (design §2, "fallback views").

When a canonical artifact is not servable to a caller (some text unit it was derived from is
hidden from them, or no longer live), the caller is served a *view* of it instead, derived only
from the live units they can read:

- entity: name, type and description re-derived from the entity's instances in visible units
  (the per-unit extractions): one distinct description is used as is, several are summarized by
  the provider. An entity with no visible instance does not exist for the caller.
- relationship: likewise from its instances in visible units, provided both endpoints exist for
  the caller.
- community report: re-written by the provider from the visible part of the community: its
  visible members (their views), visible relationships and claims, and, when that context must
  be shortened, the visible children's reports. A community with no visible member does not
  exist for the caller.

A view keeps the artifact's id and its provenance is exactly the visible units it was derived
from, so it passes the serving rule like any canonical artifact. An entity served to a caller
who cannot see all of the graph carries its *visible* degree (relationships that exist for that
caller), never a count that includes hidden edges.

Caching: a view is keyed by (kind, artifact id, artifact fingerprint, the ACL classes and units
of its visible provenance, the inputs it depends on, provider, parameters). Deleting, editing or
relabelling a document changes the visible unit set (and, once regenerated, the fingerprint), so
a stale view is never looked up again. Views are kept in memory; those that cost provider calls
(summaries, reports) are also stored in the index's SQLite table `acl_views`, so they survive
restarts and are shared by every caller with the same visible provenance. Builds are
single-flight per key (an asyncio lock per key): concurrent calls never build one view twice.

Engines stay synchronous: a hook that needs a view which is not built yet records it as pending
(`collecting`) and answers None for now; the caller's call is then re-run once the pending views
are built (server.engines.serving.run_with_views). Outside such a call a missing view raises
`ViewsPending`. What exists for a caller is decided without building anything.

How a report is written from its context belongs to the indexer; the server injects it as a
`ReportWriter`, which keeps this package free of indexer imports.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any

from acl.view_cache import (
    PENDING_VIEWS,
    PROVISIONAL_S,
    BuiltView,
    ViewBook,
    ViewsPending,
    close_books,
)
from canopy.errors import EndpointUnavailable, InvalidOutput
from canopy.ids import content_hash, entity_id, normalize_name, relationship_id, text_hash
from canopy.model import (
    Claim,
    Community,
    Document,
    Entity,
    EntityInstance,
    Extraction,
    Relationship,
    RelationshipInstance,
    Report,
    TextUnit,
)
from canopy.providers.base import Provider
from canopy.store import Graph, Store
from canopy.tokens import get_tokenizer
from canopy.vectors import acl_class
from indexer.graph import most_frequent, summary_input, summary_key

__all__ = ["FULL", "NONE", "VIEW", "CallerViews", "caller_views", "forget_views"]

log = logging.getLogger(__name__)


NONE, VIEW, FULL = 0, 1, 2  # what an artifact is for a caller: absent, a view, the canonical one


def forget_views() -> None:
    """Drop this process's in-memory views and close their cache connections (the SQLite
    cache stays): what a restart does. For benchmarks and tests."""
    close_books()
    _GENERATIONS.clear()


# ---- one generation's shared indexes --------------------------------------------------------------


class _Generation:
    """What every caller of one committed generation shares: adjacency, ACL classes, merge
    order, and whether all provenance is live (false in a revocation generation)."""

    def __init__(self, graph: Graph, units: dict[str, TextUnit], documents: dict[str, Document]) -> None:
        self.graph = graph
        self.units = units
        self.documents = documents
        self._lock = threading.Lock()
        self._all_live: bool | None = None
        self._adj: dict[str, list[str]] | None = None
        self._claims: dict[str, list[Claim]] | None = None
        self._class: dict[str, str] = {}
        self._order: dict[str, str] = {}
        self._instances: dict[str, _UnitInstances] = {}
        self.callers: OrderedDict[Any, CallerViews] = OrderedDict()

    @property
    def all_live(self) -> bool:
        if self._all_live is None:
            live = self.units
            g = self.graph
            groups: Iterable[Iterable[Any]] = (g.entities.values(), g.relationships.values(),
                                               g.claims.values(), g.reports.values())
            self._all_live = all(u in live for items in groups for a in items for u in a.text_unit_ids)
        return self._all_live

    def relationships_of(self, eid: str) -> list[str]:
        if self._adj is None:
            adj: dict[str, list[str]] = {}
            for r in self.graph.relationships.values():
                adj.setdefault(r.source, []).append(r.id)
                adj.setdefault(r.target, []).append(r.id)
            self._adj = adj
        return self._adj.get(eid, [])

    def claims_of(self, eid: str) -> list[Claim]:
        if self._claims is None:
            by: dict[str, list[Claim]] = {}
            for c in sorted(self.graph.claims.values(), key=lambda c: c.id):
                by.setdefault(c.subject, []).append(c)
            self._claims = by
        return self._claims.get(eid, [])

    def acl_class(self, uid: str) -> str:
        cls = self._class.get(uid)
        if cls is None:
            unit = self.units.get(uid)
            doc = self.documents.get(unit.document_id) if unit else None
            cls = acl_class(doc.labels) if doc else "?"
            self._class[uid] = cls
        return cls

    def instances(self, unit_ids: list[str], store: Store) -> dict[str, _UnitInstances]:
        """The units' extracted instances, indexed by artifact id (each unit parsed once)."""
        missing = [u for u in unit_ids if u not in self._instances]
        if missing:
            loaded = store.extractions_of(missing)
            with self._lock:
                for uid in missing:
                    self._instances[uid] = _UnitInstances.of(loaded.get(uid))
        return {u: self._instances[u] for u in unit_ids}

    def order(self, uid: str) -> tuple[str, str]:
        """The merge order of indexer.graph.merge_extractions: hash of the unit's text, then id."""
        h = self._order.get(uid)
        if h is None:
            unit = self.units.get(uid)
            h = text_hash(unit.text) if unit else ""
            self._order[uid] = h
        return (h, uid)


@dataclass(frozen=True)
class _UnitInstances:
    """One unit's extraction by artifact id: entity id -> instances, relationship id -> instances
    (as indexer.graph.merge_extractions keys them)."""

    entities: dict[str, list[EntityInstance]]
    relationships: dict[str, list[RelationshipInstance]]

    @classmethod
    def of(cls, ex: Extraction | None) -> _UnitInstances:
        ents: dict[str, list[EntityInstance]] = {}
        rels: dict[str, list[RelationshipInstance]] = {}
        for e in ex.entities if ex else ():
            key = normalize_name(e.name)
            if key:
                ents.setdefault(entity_id(key), []).append(e)
        for r in ex.relationships if ex else ():
            a, b = normalize_name(r.source), normalize_name(r.target)
            if a and b and a != b:
                rels.setdefault(relationship_id(a, b), []).append(r)
        return cls(ents, rels)


_GENERATIONS: dict[int, _Generation] = {}


def _generation_of(view: Any) -> _Generation:
    key = id(view)
    gen = _GENERATIONS.get(key)
    if gen is None or gen.graph is not view.graph:
        gen = _Generation(view.graph, view.units, view.documents)
        _GENERATIONS[key] = gen
        weakref.finalize(view, _GENERATIONS.pop, key, None)
    return gen


_MAX_CALLERS = 64  # distinct visible-unit sets remembered per generation


def caller_views(view: Any, readable_units: frozenset[str], book: Callable[[], ViewBook]) -> CallerViews:
    """The CallerViews of one generation (`view`: graph, units, documents) for one set of
    readable live units. `book` is called only when a view must be looked up or built."""
    gen = _generation_of(view)
    cv = gen.callers.get(readable_units)
    if cv is None:
        cv = CallerViews(gen, readable_units, book)
        gen.callers[readable_units] = cv
        while len(gen.callers) > _MAX_CALLERS:
            gen.callers.popitem(last=False)
    return cv


# ---- one caller -----------------------------------------------------------------------------------


class CallerViews:
    """What one set of readable live units is served from one generation.

    Existence (`*_state`) is decided from provenance alone, cheaply and without building
    anything; content (`entity`, `relationship`, `report`) is the canonical artifact when the
    caller may read all of it, else a view, cached or built."""

    def __init__(self, gen: _Generation, readable: frozenset[str], book: Callable[[], ViewBook]) -> None:
        self.gen = gen
        self.graph = gen.graph
        self.readable = readable
        self._book_fn = book
        self._book: ViewBook | None = None
        self.trivial = gen.all_live and len(readable) == len(gen.units)
        self._ent: dict[str, int] = {}
        self._rel: dict[str, int] = {}
        self._com: dict[str, int] = {}
        self._deg: dict[str, int] = {}
        self._keys: dict[tuple[str, str, str], str] = {}
        self._served: dict[tuple[str, str, str], Any] = {}
        # views this caller got written offline during an outage (their dependants are too)
        self._provisional: set[tuple[str, str]] = set()

    @property
    def book(self) -> ViewBook:
        if self._book is None:
            self._book = self._book_fn()
        return self._book

    # ---- existence --------------------------------------------------------------------------

    def _visible(self, unit_ids: Iterable[str]) -> list[str]:
        return [u for u in unit_ids if u in self.readable]

    def entity_state(self, eid: str) -> int:
        state = self._ent.get(eid)
        if state is None:
            e = self.graph.entities.get(eid)
            n = len(self._visible(e.text_unit_ids)) if e is not None else 0
            state = NONE if n == 0 else FULL if n == len(e.text_unit_ids) else VIEW  # type: ignore[union-attr]
            self._ent[eid] = state
        return state

    def relationship_state(self, rid: str) -> int:
        state = self._rel.get(rid)
        if state is None:
            r = self.graph.relationships.get(rid)
            n = len(self._visible(r.text_unit_ids)) if r is not None else 0
            if r is None or n == 0 or not (self.entity_state(r.source) and self.entity_state(r.target)):
                state = NONE
            else:
                state = FULL if n == len(r.text_unit_ids) else VIEW
            self._rel[rid] = state
        return state

    def claim_visible(self, claim: Claim) -> bool:
        if not claim.text_unit_ids or len(self._visible(claim.text_unit_ids)) != len(claim.text_unit_ids):
            return False
        if not self.entity_state(claim.subject):
            return False
        obj = claim.object
        return not (obj and obj in self.graph.entities and not self.entity_state(obj))

    def community_state(self, cid: str) -> int:
        """FULL: its canonical report is servable; VIEW: a view is served; NONE: absent."""
        state = self._com.get(cid)
        if state is None:
            c = self.graph.communities.get(cid)
            report = self.graph.reports.get(cid)
            fresh = report is not None and c is not None and report.fingerprint == c.fingerprint
            if c is None:
                state = NONE
            elif fresh and report is not None and report.text_unit_ids and \
                    len(self._visible(report.text_unit_ids)) == len(report.text_unit_ids):
                state = FULL
            elif not any(self.entity_state(e) for e in c.entity_ids):
                state = NONE
            elif not fresh and len(self._visible(c.text_unit_ids)) == len(c.text_unit_ids):
                state = NONE  # nothing hidden to route around: the report itself is missing
            else:
                state = VIEW
            self._com[cid] = state
        return state

    def degree(self, eid: str) -> int:
        """Relationships of the entity that exist for this caller."""
        d = self._deg.get(eid)
        if d is None:
            d = sum(1 for r in self.gen.relationships_of(eid) if self.relationship_state(r))
            self._deg[eid] = d
        return d

    # ---- keys -------------------------------------------------------------------------------

    def _classes(self, units: Iterable[str]) -> str:
        return "|".join(sorted({self.gen.acl_class(u) for u in units}))

    def _key(self, kind: str, artifact_id: str, provider: str) -> str:
        k = (kind, artifact_id, provider)
        key = self._keys.get(k)
        if key is None:
            key = self._compute_key(kind, artifact_id, provider)
            self._keys[k] = key
        return key

    def _compute_key(self, kind: str, artifact_id: str, provider: str) -> str:
        g = self.graph
        params = self.book.params.key()
        if kind == "entity":
            e = g.entities[artifact_id]
            fp = content_hash(e.name, e.type, e.description, *e.text_unit_ids)
            vis = self._visible(e.text_unit_ids)
            return content_hash(kind, artifact_id, fp, self._classes(vis), *vis, provider, params,
                                length=32)
        if kind == "relationship":
            r = g.relationships[artifact_id]
            fp = content_hash(r.description, f"{r.weight:g}", *r.text_unit_ids)
            vis = self._visible(r.text_unit_ids)
            ends = [self._key("entity", x, provider) if self.entity_state(x) == VIEW else x
                    for x in (r.source, r.target)]
            return content_hash(kind, artifact_id, fp, self._classes(vis), *vis, *ends, provider,
                                params, length=32)
        c = g.communities[artifact_id]
        vis = sorted(set(self._visible(self._community_units(c))))
        members = [f"{e}:{self.degree(e)}" for e in c.entity_ids if self.entity_state(e)]
        return content_hash(kind, artifact_id, c.fingerprint, self._classes(vis), *vis, *members,
                            provider, params, length=32)

    def _community_units(self, c: Community) -> list[str]:
        g = self.graph
        units = list(c.text_unit_ids)
        for rid in c.relationship_ids:
            if rid in g.relationships:
                units += g.relationships[rid].text_unit_ids
        for e in c.entity_ids:
            for cl in self.gen.claims_of(e):
                units += cl.text_unit_ids
        return units

    # ---- content (sync): canonical, cached, or pending -------------------------------------------

    def _missing(self, kind: str, artifact_id: str) -> None:
        pending = PENDING_VIEWS.get()
        if pending is None:
            raise ViewsPending(kind, artifact_id)
        pending.add((kind, artifact_id))

    def _with_degree(self, e: Entity) -> Entity:
        d = self.degree(e.id)
        return e if d == e.degree else replace(e, degree=d)

    def entity(self, eid: str, provider: Provider) -> Entity | None:
        state = self.entity_state(eid)
        if state == NONE:
            return None
        memo = ("entity", eid, provider.name)
        served = self._served.get(memo)
        if served is not None:
            return served
        if state == FULL:
            served = self._with_degree(self.graph.entities[eid])
        else:
            key = self._key("entity", eid, provider.name)
            view, durable = self.book.peek(key, "entity", eid)
            if view is None:
                parts = self._entity_parts(eid)
                if len(parts[2]) > 1:  # needs a summary: built asynchronously
                    self._missing("entity", eid)
                    return None
                view = self._entity_view(eid, parts, parts[2][0] if parts[2] else "")
                self.book.remember(key, "entity", eid, BuiltView(view, persist=False), provider.name)
            served = self._with_degree(view)
            if not durable:
                return served
        self._served[memo] = served
        return served

    def relationship(self, rid: str, provider: Provider) -> Relationship | None:
        state = self.relationship_state(rid)
        if state == NONE:
            return None
        if state == FULL:
            return self.graph.relationships[rid]
        memo = ("relationship", rid, provider.name)
        served = self._served.get(memo)
        if served is not None:
            return served
        key = self._key("relationship", rid, provider.name)
        view, durable = self.book.peek(key, "relationship", rid)
        if view is None:
            parts = self._relationship_parts(rid)
            if len(parts[1]) > 1:
                self._missing("relationship", rid)
                return None
            view = self._relationship_view(rid, parts, parts[1][0] if parts[1] else "")
            self.book.remember(key, "relationship", rid, BuiltView(view, persist=False), provider.name)
        if durable:
            self._served[memo] = view
        return view

    def report(self, cid: str, provider: Provider) -> Report | None:
        state = self.community_state(cid)
        if state == NONE:
            return None
        if state == FULL:
            return self.graph.reports[cid]
        memo = ("report", cid, provider.name)
        served = self._served.get(memo)
        if served is not None:
            return served
        key = self._key("report", cid, provider.name)
        view, durable = self.book.peek(key, "report", cid)
        if view is None:
            self._missing("report", cid)
            return None
        if durable:
            self._served[memo] = view
        return view

    # ---- derivation ---------------------------------------------------------------------------

    def _entity_parts(self, eid: str) -> tuple[Counter[str], Counter[str], list[str], list[str]]:
        """(surface names, types, distinct descriptions in merge order, units) of the entity's
        instances in visible units."""
        e = self.graph.entities[eid]
        vis = sorted(self._visible(e.text_unit_ids), key=self.gen.order)
        instances = self.gen.instances(vis, self.book.store)
        names: Counter[str] = Counter()
        types: Counter[str] = Counter()
        descs: list[str] = []
        used: list[str] = []
        for uid in vis:
            for inst in instances[uid].entities.get(eid, ()):
                names[inst.name.strip()] += 1
                types[inst.type.strip().lower()] += 1
                d = inst.description.strip()
                if d and d not in descs:
                    descs.append(d)
                if uid not in used:
                    used.append(uid)
        return names, types, descs, used

    def _entity_view(self, eid: str, parts: tuple[Counter[str], Counter[str], list[str], list[str]],
                     description: str) -> Entity:
        names, types, _, used = parts
        e = self.graph.entities[eid]
        units = tuple(sorted(used)) or tuple(sorted(self._visible(e.text_unit_ids)))
        name = most_frequent(names) if names else ""
        kind = most_frequent(types) if types else e.type
        return Entity(eid, name, kind, description, units, 0)

    def _relationship_parts(self, rid: str) -> tuple[float, list[str], list[str]]:
        r = self.graph.relationships[rid]
        vis = sorted(self._visible(r.text_unit_ids), key=self.gen.order)
        instances = self.gen.instances(vis, self.book.store)
        weight = 0.0
        descs: list[str] = []
        used: list[str] = []
        for uid in vis:
            for inst in instances[uid].relationships.get(rid, ()):
                weight += float(inst.strength)
                d = inst.description.strip()
                if d and d not in descs:
                    descs.append(d)
                if uid not in used:
                    used.append(uid)
        return weight, descs, used

    def _relationship_view(self, rid: str, parts: tuple[float, list[str], list[str]],
                           description: str) -> Relationship:
        weight, _, used = parts
        r = self.graph.relationships[rid]
        units = tuple(sorted(used)) or tuple(sorted(self._visible(r.text_unit_ids)))
        return Relationship(rid, r.source, r.target, description, weight, units)

    async def _summary(self, name: str, descs: list[str], provider: Provider) -> tuple[str, bool]:
        """The summary of several visible descriptions, and whether it is durable (False when
        written offline because the endpoint is down: then it is not cached for long)."""
        max_tokens = self.book.params.summary_max_tokens
        kept = summary_input(descs, get_tokenizer())
        # The indexer's memo key: a visible subset summarized before costs nothing.
        memo = summary_key(provider.name, max_tokens, name, kept)
        text = self.book.store.cache_get(memo)
        if text is None:
            try:
                text = await provider.summarize(name, kept, max_tokens=max_tokens)
            except InvalidOutput:
                text = ""
            except EndpointUnavailable:
                _warn_offline()
                offline = await _offline().summarize(name, kept, max_tokens=max_tokens)
                return offline.strip() or " ".join(kept), False
            if text:
                try:
                    self.book.store.cache_put(memo, text)
                except sqlite3.Error as exc:
                    log.warning("summary not cached: %s", exc)
        return text.strip() or " ".join(kept), True

    # ---- content (async): build what is missing ---------------------------------------------------

    async def entity_async(self, eid: str, provider: Provider) -> Entity | None:
        state = self.entity_state(eid)
        if state != VIEW:
            return self.entity(eid, provider)
        key = self._key("entity", eid, provider.name)

        async def build() -> BuiltView:
            parts = self._entity_parts(eid)
            descs = parts[2]
            if len(descs) <= 1:
                return BuiltView(self._entity_view(eid, parts, descs[0] if descs else ""), persist=False)
            name = most_frequent(parts[0]) if parts[0] else ""
            text, durable = await self._summary(name, descs, provider)
            view = self._entity_view(eid, parts, text)
            return BuiltView(view, persist=durable, fingerprint=key,
                          visible=self._classes(view.text_unit_ids), provisional=not durable)

        view, durable = await self.book.once(key, "entity", eid, provider.name, build)
        served = self._with_degree(view)
        if durable:
            self._served[("entity", eid, provider.name)] = served
            self._provisional.discard(("entity", eid))
        else:
            self._provisional.add(("entity", eid))
        return served

    async def relationship_async(self, rid: str, provider: Provider) -> Relationship | None:
        state = self.relationship_state(rid)
        if state != VIEW:
            return self.relationship(rid, provider)
        r = self.graph.relationships[rid]
        key = self._key("relationship", rid, provider.name)

        async def build() -> BuiltView:
            parts = self._relationship_parts(rid)
            descs = parts[1]
            if len(descs) <= 1:
                return BuiltView(self._relationship_view(rid, parts, descs[0] if descs else ""),
                              persist=False)
            src, tgt = await asyncio.gather(self.entity_async(r.source, provider),
                                            self.entity_async(r.target, provider))
            name = f"{src.name if src else ''} -- {tgt.name if tgt else ''}"
            text, durable = await self._summary(name, descs, provider)
            view = self._relationship_view(rid, parts, text)
            return BuiltView(view, persist=durable, fingerprint=key,
                          visible=self._classes(view.text_unit_ids), provisional=not durable)

        view, durable = await self.book.once(key, "relationship", rid, provider.name, build)
        if durable:
            self._served[("relationship", rid, provider.name)] = view
            self._provisional.discard(("relationship", rid))
        else:
            self._provisional.add(("relationship", rid))
        return view

    async def report_async(self, cid: str, provider: Provider) -> Report | None:
        state = self.community_state(cid)
        if state != VIEW:
            return self.report(cid, provider)
        key = self._key("report", cid, provider.name)

        async def build() -> BuiltView:
            view, durable = await self._write_report(cid, provider)
            return BuiltView(view, persist=durable, fingerprint=self.graph.communities[cid].fingerprint,
                          visible=self._classes(view.text_unit_ids), provisional=not durable)

        view, durable = await self.book.once(key, "report", cid, provider.name, build)
        if durable:
            self._served[("report", cid, provider.name)] = view
            self._provisional.discard(("report", cid))
        else:
            self._provisional.add(("report", cid))
        return view

    def _visible_community(self, c: Community) -> Community:
        g = self.graph
        members = tuple(e for e in c.entity_ids if self.entity_state(e))
        rels = tuple(r for r in c.relationship_ids if r in g.relationships and self.relationship_state(r))
        children = tuple(k for k in c.children if self.community_state(k))
        units: set[str] = set()
        for e in members:
            units.update(self._visible(g.entities[e].text_unit_ids))
        return replace(c, entity_ids=members, relationship_ids=rels, children=children,
                       text_unit_ids=tuple(sorted(units)))

    async def _write_report(self, cid: str, provider: Provider) -> tuple[Report, bool]:
        """The view and whether it is durable (its inputs are, and the endpoint answered)."""
        g = self.graph
        c = self._visible_community(g.communities[cid])
        entities = await self._all("entity", c.entity_ids, provider)
        relationships = {r: rel for r, rel in
                         (await self._all("relationship", c.relationship_ids, provider)).items()
                         if rel.source in entities and rel.target in entities}
        c = replace(c, entity_ids=tuple(entities), relationship_ids=tuple(relationships))
        durable = not any(("entity", e) in self._provisional for e in entities) and not any(
            ("relationship", r) in self._provisional for r in relationships)
        claims = {cl.id: cl for e in entities for cl in self.gen.claims_of(e) if self.claim_visible(cl)}
        communities = {c.id: c}
        for k in c.children:
            child = self._visible_community(g.communities[k])
            communities[k] = replace(
                child, entity_ids=tuple(e for e in child.entity_ids if e in entities),
                relationship_ids=tuple(r for r in child.relationship_ids if r in relationships))

        async def child_reports() -> dict[str, Report]:
            got = await asyncio.gather(*(self.report_async(k, provider) for k in c.children))
            return {k: r for k, r in zip(c.children, got, strict=True) if r is not None}

        try:
            report = await self.book.writer(c, communities, entities, relationships, claims,
                                            child_reports, provider, self.book.params)
        except EndpointUnavailable:
            _warn_offline()
            report = await self.book.writer(c, communities, entities, relationships, claims,
                                            child_reports, _offline(), self.book.params)
            durable = False
        if any(("report", k) in self._provisional for k in report.used_subreports):
            durable = False
        if not report.text_unit_ids:
            report = replace(report, text_unit_ids=c.text_unit_ids)
        if any(u not in self.readable for u in report.text_unit_ids):  # never: a guard
            raise RuntimeError(f"view of {cid} drew on units its caller cannot read")
        return report, durable

    async def _all(self, kind: str, ids: Iterable[str], provider: Provider) -> dict[str, Any]:
        """Served contents of these ids: canonical and already-built ones at once, the rest
        built concurrently."""
        state = self.entity_state if kind == "entity" else self.relationship_state
        sync = self.entity if kind == "entity" else self.relationship
        build = self.entity_async if kind == "entity" else self.relationship_async
        out: dict[str, Any] = {}
        todo: list[str] = []
        for i in ids:
            st = state(i)
            got = sync(i, provider) if st == FULL else self._served.get((kind, i, provider.name))
            if got is not None:
                out[i] = got
            elif st == VIEW:
                todo.append(i)
        for i, got in zip(todo, await asyncio.gather(*(build(i, provider) for i in todo)), strict=True):
            if got is not None:
                out[i] = got
        return {i: out[i] for i in ids if i in out}

    async def build(self, wanted: Iterable[tuple[str, str]], provider: Provider) -> None:
        """Build (or load) the views of these (kind, id) pairs, concurrently."""
        calls = {"entity": self.entity_async, "relationship": self.relationship_async,
                 "report": self.report_async}
        await asyncio.gather(*(calls[kind](i, provider) for kind, i in sorted(set(wanted))))

    # ---- enumeration (warm, status) -------------------------------------------------------------

    def needed(self, kinds: Iterable[str] = ("entity", "relationship", "report")) -> list[tuple[str, str]]:
        """Every (kind, id) that this caller is served as a view."""
        g = self.graph
        out: list[tuple[str, str]] = []
        kinds = set(kinds)
        if "entity" in kinds:
            out += [("entity", e) for e in sorted(g.entities) if self.entity_state(e) == VIEW]
        if "relationship" in kinds:
            out += [("relationship", r) for r in sorted(g.relationships)
                    if self.relationship_state(r) == VIEW]
        if "report" in kinds:
            out += [("report", c) for c in sorted(g.communities) if self.community_state(c) == VIEW]
        return out


_LAST_WARNING = [0.0]


def _warn_offline() -> None:
    now = time.monotonic()
    if now - _LAST_WARNING[0] > PROVISIONAL_S:
        _LAST_WARNING[0] = now
        log.warning("the endpoint is down: views are written offline for now (served for %gs, "
                    "not cached)", PROVISIONAL_S)


def _offline() -> Provider:
    from canopy.providers.builtin import BuiltinProvider

    return BuiltinProvider()
