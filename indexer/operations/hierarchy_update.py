"""A local update of the community hierarchy (design §4): touch only what changed.

Only communities whose members or internal edges changed are rewritten. Unchanged communities
keep their ids, members and subtree, hence their reports; newcomers join the group they are
most strongly connected to, level by level; removed entities leave; oversized changed leaves
are split again. New top-level candidates stand at the top while it has room
(`ClusterParams.max_top`); the others are grafted, as in a fresh build, under the top-level
community whose entities share the most text units (else documents) with theirs
(canopy.indexer.operations.grouping). The pipeline's modularity guard
(canopy.indexer.operations.clustering.modularity) re-clusters from scratch when local decisions
drift too far.

Not a pure function of plain data like the other operations: the committed hierarchy is read
through `HierarchyReads` as the update needs it (the store provides it; the tests, dictionaries),
because reading it whole would make an update cost the corpus.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from canopy.indexer.operations.clustering import (
    ClusterParams,
    EdgeArrays,
    Hierarchy,
    Isolated,
    LeidenLevels,
    Placement,
    community_id,
)
from canopy.indexer.operations.grouping import Candidate, plan_top
from canopy.store.rows import CommunityRow

__all__ = ["GraphChange", "HierarchyReads", "update_hierarchy"]


class HierarchyReads(Protocol):
    """The reads a local update needs (canopy.store.GraphReads provides them)."""

    def memberships(self, entity_ids: Iterable[str]) -> dict[str, dict[int, str]]: ...
    def members(self, ids: Iterable[str]) -> dict[str, list[str]]: ...
    def children(self, ids: Iterable[str]) -> dict[str, list[str]]: ...
    def communities(self, ids: Iterable[str]) -> dict[str, CommunityRow]: ...
    def edges_of(self, entity_ids: Iterable[str]) -> list[tuple[str, str, str, float]]: ...
    def roots(self) -> list[CommunityRow]: ...
    def entity_sources(self, entity_ids: Iterable[str]) -> dict[str, tuple[set[str], set[str]]]:
        ...
    def unit_entities(self, unit_ids: Iterable[str]) -> dict[str, set[str]]: ...
    def document_entities(self, paths: Iterable[str]) -> dict[str, set[str]]: ...
    def documents_near(self, path: str, k: int) -> tuple[list[str], list[str]]: ...


@dataclass(frozen=True)
class GraphChange:
    """How the entity graph changed, for the local update."""

    new_entities: frozenset[str]  # entities of the new generation that the old one lacked
    removed_entities: frozenset[str]  # entities of the old generation that are gone
    # endpoints of relationships added, removed or reweighted
    changed_edges: frozenset[tuple[str, str]]
    isolated: Isolated  # new entities without relationships


def update_hierarchy(old: HierarchyReads, new: HierarchyReads, change: GraphChange,
                     params: ClusterParams) -> Hierarchy:
    """The previous hierarchy (`old`) updated for `change` over the new graph's edges (`new`)."""
    return _Local(old, new, change, params).run()


class _Local:
    def __init__(self, old: HierarchyReads, new: HierarchyReads, change: GraphChange,
                 params: ClusterParams) -> None:
        self.old, self.new, self.c, self.p = old, new, change, params
        self.out = Hierarchy()
        self.chain: dict[str, dict[int, str]] = {}  # old memberships of entities we look at
        self.adj: dict[str, dict[str, float]] = defaultdict(dict)  # new edges of newcomers
        self.removed_in: set[str] = set()  # old communities that lose a removed entity
        self.edge_dirty: set[str] = set()  # old communities whose internal edges changed
        self.taken: set[str] = set()
        self.old_roots: set[str] | None = None  # read once, when the top is bounded
        self.new_roots: set[str] = set()  # top-level communities this update created

    def load_chains(self, entities: Iterable[str]) -> None:
        todo = [e for e in set(entities) if e not in self.chain]
        if todo:
            got = self.old.memberships(todo)
            for e in todo:
                self.chain[e] = got.get(e, {})

    def run(self) -> Hierarchy:
        c = self.c
        connected = sorted(c.new_entities - set(c.isolated.cooccurring))
        for _, s, t, w in self.new.edges_of(connected):
            self.adj[s][t] = w
            self.adj[t][s] = w
        ends = {x for edge in c.changed_edges for x in edge}
        self.load_chains([*c.removed_entities, *ends, *(n for e in connected for n in self.adj[e])])
        for e in c.removed_entities:
            self.removed_in.update(self.chain[e].values())
        for a, b in c.changed_edges:
            ca, cb = self.chain.get(a, {}), self.chain.get(b, {})
            self.edge_dirty.update(cid for level, cid in ca.items() if cb.get(level) == cid)
        # Level 0: newcomers join the root they are most strongly connected to.
        joined, groups = self.assign(connected, 0)
        for root in sorted(set(joined.values()) | {self.chain_root(e) for e in c.removed_entities}
                           | {cid for cid in self.edge_dirty if self.is_root(cid)}):
            if root:
                self.process(root, 0, None, [n for n, r in joined.items() if r == root])
        self.place_top(groups)
        self.attach_isolated()
        return self.out

    # -- helpers --

    def chain_root(self, e: str) -> str:
        chain = self.chain.get(e, {})
        return chain[min(chain)] if chain else ""

    def is_root(self, cid: str) -> bool:
        row = self.old.communities([cid]).get(cid)
        return row is not None and row.parent is None

    def assign(self, newcomers: list[str], level: int) -> tuple[dict[str, str], list[list[str]]]:
        """Newcomers -> the level-`level` community (of the old hierarchy) their neighbours
        weigh most in, iterating so newcomers can follow newcomers; the rest are clustered among
        themselves (returned as groups)."""
        owner: dict[str, str] = {}
        pending = list(newcomers)
        changed = True
        while pending and changed:
            changed = False
            still = []
            for n in pending:
                weights: dict[str, float] = defaultdict(float)
                for m, w in self.adj[n].items():
                    group = (owner.get(m) if m in self.c.new_entities
                             else self.chain.get(m, {}).get(level))
                    if group:
                        weights[group] += w
                if weights:
                    owner[n] = min(weights, key=lambda g: (-weights[g], g))
                    changed = True
                else:
                    still.append(n)
            pending = still
        return owner, self.cluster_among(pending)

    def cluster_among(self, nodes: list[str]) -> list[list[str]]:
        """Leiden groups of newcomers no old community holds (loose ones form one group)."""
        if not nodes:
            return []
        inside = set(nodes)
        edges = [(a, b, w) for a in sorted(inside) for b, w in self.adj[a].items()
                 if b in inside and a < b]
        arrays = EdgeArrays(edges, sorted(inside))
        f = LeidenLevels(arrays, self.p)
        groups = f.groups(np.arange(arrays.n_nodes, dtype=np.int64),
                          np.arange(len(arrays.src), dtype=np.int64))
        return [[arrays.names[int(i)] for i in g] for g in groups]

    def new_id(self, level: int, members: list[str]) -> str:
        cid = community_id(level, members)
        while cid in self.taken or self.old.communities([cid]):
            cid += "x"
        self.taken.add(cid)
        return cid

    def subtree(self, members: list[str], level: int, parent: str | None,
                top: str | None = None) -> str:
        """A freshly clustered subtree for `members` at `level` under `parent` (newcomers no old
        community holds, or an oversized leaf split again, which keeps its id `top`); returns
        the id of its top."""
        inside = set(members)
        edges = {(min(s, t), max(s, t)): w for _, s, t, w in self.new.edges_of(members)
                 if s in inside and t in inside}
        arrays = EdgeArrays(((a, b, w) for (a, b), w in sorted(edges.items())), sorted(inside))
        f = LeidenLevels(arrays, self.p)
        f.split(np.arange(arrays.n_nodes, dtype=np.int64),
                np.arange(len(arrays.src), dtype=np.int64), level, None)
        ids: dict[str, str] = {}
        for lv, key, parent_key, nodes in f.out:  # preorder: parents before children
            names = [arrays.names[int(i)] for i in nodes]
            cid = top if parent_key is None and top else self.new_id(lv, names)
            ids[key] = cid
            self.place(cid, lv, ids[parent_key] if parent_key else parent, names)
        return ids[f.out[0][1]]

    def place(self, cid: str, level: int, parent: str | None, members: Iterable[str]) -> None:
        self.out.placements[cid] = Placement(cid, level, parent, sorted(set(members)))

    def delete_subtree(self, cid: str) -> None:
        self.out.deleted.add(cid)
        for child in self.old.children([cid]).get(cid, []):
            self.delete_subtree(child)

    def process(self, cid: str, level: int, parent: str | None, newcomers: list[str]) -> None:
        """An old community that gained `newcomers`, lost removed entities or had its internal
        edges change: its new members, and its children updated the same way."""
        old_members = self.old.members([cid]).get(cid, [])
        members = sorted((set(old_members) - self.c.removed_entities) | set(newcomers))
        if not members:
            self.delete_subtree(cid)
            return
        changed = members != old_members
        children = self.old.children([cid]).get(cid, [])
        if children:
            if changed:
                self.place(cid, level, parent, members)
            self.load_chains(n for e in newcomers for n in self.adj[e])
            joined, groups = self.assign_within(newcomers, level + 1, set(members))
            for child in children:
                mine = [n for n, c in joined.items() if c == child]
                if mine or child in self.removed_in or child in self.edge_dirty:
                    self.process(child, level + 1, cid, mine)
            for g in groups:
                self.subtree(g, level + 1, cid)
            return
        oversized = len(members) > self.p.max_cluster_size and level + 1 < self.p.max_levels
        if oversized and (changed or cid in self.edge_dirty):
            self.subtree(members, level, parent, top=cid)
        elif changed:
            self.place(cid, level, parent, members)

    def assign_within(self, newcomers: list[str], level: int,
                      inside: set[str]) -> tuple[dict[str, str], list[list[str]]]:
        """`assign` counting only edges within the parent community (whose members are `inside`)."""
        saved = {n: self.adj[n] for n in newcomers}
        for n in newcomers:
            self.adj[n] = {m: w for m, w in saved[n].items() if m in inside}
        try:
            return self.assign(newcomers, level)
        finally:
            self.adj.update(saved)

    def attach_isolated(self) -> None:
        """New entities without relationships: into the deepest community of the entities they
        share units with (and its ancestors), else new groups by unit."""
        iso = self.c.isolated
        if not iso.cooccurring:
            return
        placed_deepest: dict[str, tuple[int, str]] = {}
        for p in self.out.placements.values():
            for m in p.members:
                if m not in placed_deepest or placed_deepest[m][0] < p.level:
                    placed_deepest[m] = (p.level, p.id)
        self.load_chains(n for ns in iso.cooccurring.values() for n in ns
                         if n not in placed_deepest)
        lonely: dict[str, list[str]] = defaultdict(list)
        for e in sorted(iso.cooccurring):
            votes: Counter[str] = Counter()
            for n in iso.cooccurring[e]:
                if n in placed_deepest:
                    votes[placed_deepest[n][1]] += 1
                elif self.chain.get(n) and n not in self.c.removed_entities:
                    chain = self.chain[n]
                    deepest = chain[max(chain)]
                    if deepest not in self.out.deleted:
                        votes[deepest] += 1
            if not votes:
                lonely[iso.first_unit.get(e, "")].append(e)
                continue
            target: str | None = min(votes, key=lambda cid: (-votes[cid], cid))
            while target is not None:
                target = self.add_member(target, e)
        self.place_top([members[k:k + self.p.max_cluster_size]
                        for _unit, members in sorted(lonely.items())  # by unit
                        for k in range(0, len(members), self.p.max_cluster_size)])

    def add_member(self, cid: str, e: str) -> str | None:
        """Add `e` to community `cid`; returns its parent."""
        placed = self.out.placements.get(cid)
        if placed is None:
            row = self.old.communities([cid])[cid]
            old_members = self.old.members([cid]).get(cid, [])
            members = sorted((set(old_members) - self.c.removed_entities) | {e})
            self.place(cid, row.level, row.parent, members)
            return row.parent
        if e not in placed.members:
            placed.members = sorted([*placed.members, e])
        return placed.parent

    # -- the top (canopy.indexer.operations.grouping) --

    def place_top(self, groups: list[list[str]]) -> None:
        """New top-level candidates (newcomers no old community holds): largest first, each
        stands at the top while it has room (`max_top`); the others are grafted under the
        top-level community they share the most sources with, as in a fresh build."""
        if not groups:
            return
        room = self.p.max_top - self.top_count() if self.p.max_top else len(groups)
        if room >= len(groups):
            for g in groups:
                self.new_roots.add(self.subtree(g, 0, None))
            return
        sources = self.new.entity_sources(m for g in groups for m in g)
        arriving = [Candidate.of(str(i), g, sources) for i, g in enumerate(groups)]
        plan = plan_top(self.standing(arriving, groups), arriving, room)
        joins = dict(plan.joins)
        for c in plan.orphans:
            near = self.nearest_top(c, {m for g in groups for m in g})
            if near is not None:
                joins[c.key] = near
        ids: dict[str, str] = {}
        for c in arriving:
            if c.key not in joins:
                ids[c.key] = self.subtree(groups[int(c.key)], 0, None)
                self.new_roots.add(ids[c.key])
        for c in arriving:
            if c.key in joins:
                self.graft(ids.get(joins[c.key], joins[c.key]), groups[int(c.key)])

    def top_count(self) -> int:
        """Top-level communities after this update so far."""
        if self.old_roots is None:
            self.old_roots = {r.id for r in self.old.roots()}
        return len(self.old_roots - self.out.deleted) + len(self.new_roots)

    def tops_of(self, entities: Iterable[str], skip: set[str]) -> dict[str, str]:
        """The top-level community of each entity (not in `skip`) after this update so far."""
        placed = {m: p.id for p in self.out.placements.values() if p.parent is None
                  for m in p.members}
        todo = [e for e in entities if e not in skip]
        self.load_chains(e for e in todo if e not in placed)
        out = {}
        for e in todo:
            top = placed.get(e) or (None if e in self.c.removed_entities
                                    else self.chain.get(e, {}).get(0))
            if top is not None and top not in self.out.deleted:
                out[e] = top
        return out

    def standing(self, arriving: list[Candidate], groups: list[list[str]]) -> list[Candidate]:
        """The top-level communities mentioned by the arriving candidates' text units and
        documents, each with its members' mentions of those sources."""
        in_unit = self.new.unit_entities({u for c in arriving for u in c.units})
        in_doc = self.new.document_entities({d for c in arriving for d in c.documents})
        mentioned = {e for es in [*in_unit.values(), *in_doc.values()] for e in es}
        tops = self.tops_of(mentioned, {m for g in groups for m in g})
        units: dict[str, Counter[str]] = defaultdict(Counter)
        docs: dict[str, Counter[str]] = defaultdict(Counter)
        for found, counts in ((in_unit, units), (in_doc, docs)):
            for source, es in found.items():
                for e in es:
                    if e in tops:
                        counts[tops[e]][source] += 1
        return [Candidate(top, 0, units[top], docs[top]) for top in sorted(set(units) | set(docs))]

    def nearest_top(self, c: Candidate, skip: set[str]) -> str | None:
        """The top-level community of the nearest document in path order (earlier on a tie)
        that an entity of the standing top mentions, searched in widening windows."""
        for k in (16, 256, 4096, 65536):
            best: tuple[int, int, str] | None = None
            exhausted = True
            for d in sorted(c.documents):
                before, after = self.new.documents_near(d, k)
                exhausted &= len(before) < k and len(after) < k
                order = sorted([(i, 0, p) for i, p in enumerate(before)]
                               + [(i, 1, p) for i, p in enumerate(after)])
                in_doc = self.new.document_entities(p for *_, p in order)
                tops = self.tops_of({e for es in in_doc.values() for e in es}, skip)
                for i, side, p in order:
                    votes = Counter(tops[e] for e in in_doc.get(p, ()) if e in tops)
                    if votes:
                        top = min(votes, key=lambda t: (-votes[t], t))
                        best = min(best or (i, side, top), (i, side, top))
                        break
            if best is not None:
                return best[2]
            if exhausted:
                return None
        return None

    def graft(self, top: str, members: list[str]) -> None:
        """`members` (a new candidate) clustered one level below the top-level community `top`,
        which gains them; a leaf first gets its own members as a child."""
        placed = self.out.placements.get(top)
        current = placed.members if placed else sorted(
            set(self.old.members([top]).get(top, [])) - self.c.removed_entities)
        if self.p.max_levels > 1:
            kids = [k for k in self.old.children([top]).get(top, []) if k not in self.out.deleted]
            if not kids and not any(p.parent == top for p in self.out.placements.values()):
                self.place(self.new_id(1, current), 1, top, current)
            self.subtree(members, 1, top)
        self.place(top, 0, None, [*current, *members])
