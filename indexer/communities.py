"""Hierarchical Leiden communities over the entity graph (Edge et al. 2024 §2.1.4).

- Every connected component is clustered (no largest-component filter). An entity with no
  relationship joins the deepest community holding most of the connected entities that share a
  text unit with it; entities of units with no connected entity are grouped by unit.
- Level 0 is the coarsest partition; a community larger than `max_cluster_size` is split by
  Leiden on its own subgraph into children one level down, up to `max_levels`. Read at level L,
  the hierarchy means "the communities at L plus the childless communities of shallower levels"
  (the paper's C0..C3), so every level partitions the entities (`is_partition`).

Two entry points produce a `Hierarchy` to stage:
- `build_hierarchy`: a fresh clustering of the whole graph, on compact arrays (the edge list is
  int32/float64 arrays, ~16 bytes an edge, plus graspologic's own copy while Leiden runs on a
  level: about 200 MB per million edges at the top level). Ids are reused from the previous
  hierarchy where a new community's members overlap an old one's (Jaccard >= 0.5).
- `update_hierarchy`: a local update that touches only communities whose members or internal
  edges changed (design §4). Unchanged communities keep their ids, members and subtree, hence
  their reports; newcomers join the group they are most strongly connected to, level by level;
  removed entities leave; oversized changed leaves are split again. The pipeline's modularity
  guard (`modularity`) re-clusters from scratch when local decisions drift too far.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import graspologic_native as gn
import numpy as np

from canopy.ids import content_hash
from canopy.store.rows import CommunityRow

__all__ = [
    "ClusterParams",
    "EdgeArrays",
    "Hierarchy",
    "Placement",
    "build_hierarchy",
    "is_partition",
    "modularity",
    "update_hierarchy",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterParams:
    max_cluster_size: int = 10
    seed: int = 0xDEADBEEF
    max_levels: int = 4


@dataclass
class Placement:
    """A community to write: its level, parent and (sorted) member entity ids."""

    id: str
    level: int
    parent: str | None
    members: list[str]


@dataclass
class Hierarchy:
    """What a clustering step changes: communities to (re)write and communities to delete.

    With `replace_all` (fresh clustering) `placements` is the whole hierarchy."""

    placements: dict[str, Placement] = field(default_factory=dict)
    deleted: set[str] = field(default_factory=set)
    replace_all: bool = False


def is_partition(groups: Iterable[Iterable[str]], universe: set[str]) -> bool:
    """True when the groups cover `universe` exactly, without overlap."""
    seen: set[str] = set()
    for g in groups:
        for x in g:
            if x in seen:
                return False
            seen.add(x)
    return seen == universe


def modularity(w_in: float, d_sq: float, m: float) -> float:
    """Modularity of a partition from its aggregates: summed internal edge weight, summed squared
    community degree, and total edge weight (resolution 1, as graspologic computes it)."""
    return 0.0 if m <= 0 else w_in / m - d_sq / (4 * m * m)


def community_id(level: int, members: Sequence[str]) -> str:
    return f"c{level}-" + content_hash(*sorted(members), length=10)


# ---- fresh clustering on arrays --------------------------------------------------------------


class EdgeArrays:
    """The entity graph as arrays: node i is `names[i]` (entity ids in sorted order, so index
    order is id order), edge k joins src[k] and dst[k] with weight w[k], edges sorted."""

    def __init__(self, edges: Iterable[tuple[str, str, float]], nodes: Iterable[str] = ()) -> None:
        index: dict[str, int] = {}
        for n in nodes:  # nodes that may have no edge (a community's loose members)
            index.setdefault(n, len(index))
        src: list[int] = []
        dst: list[int] = []
        weights: list[float] = []
        for s, t, w in edges:
            if s == t:
                continue
            src.append(index.setdefault(s, len(index)))
            dst.append(index.setdefault(t, len(index)))
            weights.append(max(float(w), 1e-6))
        order = sorted(index, key=index.__getitem__)
        rank = np.empty(len(order), dtype=np.int64)
        names = sorted(order)
        position = {n: i for i, n in enumerate(names)}
        for i, n in enumerate(order):
            rank[i] = position[n]
        s_arr = rank[np.asarray(src, dtype=np.int64)] if src else np.zeros(0, np.int64)
        t_arr = rank[np.asarray(dst, dtype=np.int64)] if dst else np.zeros(0, np.int64)
        keys = np.lexsort((t_arr, s_arr))
        self.names: list[str] = names
        self.index = position
        self.src = s_arr[keys].astype(np.int32)
        self.dst = t_arr[keys].astype(np.int32)
        self.w = np.asarray(weights, dtype=np.float64)[keys]

    @property
    def n_nodes(self) -> int:
        return len(self.names)


class _Fresh:
    """Hierarchical Leiden as a per-level recursion over bucketed edge arrays."""

    def __init__(self, edges: EdgeArrays, params: ClusterParams) -> None:
        self.e = edges
        self.p = params
        self.label = np.full(edges.n_nodes, -1, dtype=np.int64)
        # level, key, parent key, nodes
        self.out: list[tuple[int, str, str | None, np.ndarray]] = []

    def groups(self, nodes: np.ndarray, edge_idx: np.ndarray) -> list[np.ndarray]:
        """Leiden groups of `nodes` over `edge_idx` (edges among them); nodes with no edge among
        them form one more group. Groups are sorted by their smallest node."""
        e = self.e
        found: dict[int, list[int]] = defaultdict(list)
        if len(edge_idx):
            names = e.names
            tuples = [(names[s], names[t], w) for s, t, w in
                      zip(e.src[edge_idx].tolist(), e.dst[edge_idx].tolist(),
                          e.w[edge_idx].tolist(), strict=True)]
            _, part = gn.leiden(edges=tuples, seed=self.p.seed)
            for name, cluster in part.items():
                found[cluster].append(e.index[name])
        placed = {i for g in found.values() for i in g}
        loose = [int(i) for i in nodes if int(i) not in placed]
        groups = [np.sort(np.asarray(g, dtype=np.int64)) for g in found.values()]
        if loose:
            groups.append(np.asarray(sorted(loose), dtype=np.int64))
        return sorted(groups, key=lambda g: int(g[0]))

    def buckets(self, groups: list[np.ndarray], edge_idx: np.ndarray) -> list[np.ndarray]:
        """For each group, the edges of `edge_idx` with both ends in it (one pass)."""
        e = self.e
        for i, g in enumerate(groups):
            self.label[g] = i
        ls, lt = self.label[e.src[edge_idx]], self.label[e.dst[edge_idx]]
        inside = edge_idx[ls == lt]
        owner = self.label[e.src[inside]]
        order = np.argsort(owner, kind="stable")
        inside, owner = inside[order], owner[order]
        bounds = np.searchsorted(owner, np.arange(len(groups) + 1))
        out = [inside[bounds[i]:bounds[i + 1]] for i in range(len(groups))]
        for g in groups:
            self.label[g] = -1
        return out

    def split(self, nodes: np.ndarray, edge_idx: np.ndarray, level: int,
              parent: str | None) -> None:
        key = f"L{level}:{self.e.names[int(nodes[0])]}"
        self.out.append((level, key, parent, nodes))
        if len(nodes) <= self.p.max_cluster_size or level + 1 >= self.p.max_levels:
            return
        groups = self.groups(nodes, edge_idx)
        if len(groups) < 2:
            return  # Leiden found no finer structure: this community is a leaf
        for g, sub in zip(groups, self.buckets(groups, edge_idx), strict=True):
            self.split(g, sub, level + 1, key)

    def run(self, level: int = 0, parent: str | None = None) -> None:
        all_nodes = np.arange(self.e.n_nodes, dtype=np.int64)
        all_edges = np.arange(len(self.e.src), dtype=np.int64)
        if not len(all_nodes):
            return
        groups = self.groups(all_nodes, all_edges)
        for g, sub in zip(groups, self.buckets(groups, all_edges), strict=True):
            self.split(g, sub, level, parent)


@dataclass(frozen=True)
class Isolated:
    """Entities without relationships and what attaches them: for each, the entities it shares a
    text unit with (with multiplicity, one per shared unit), and its first unit."""

    cooccurring: dict[str, list[str]]
    first_unit: dict[str, str]


def build_hierarchy(
    edges: EdgeArrays,
    isolated: Isolated,
    params: ClusterParams,
    previous: dict[int, dict[str, set[str]]] | None = None,
) -> Hierarchy:
    """A fresh hierarchy of the whole graph (ids reused from `previous`: level -> id -> members)."""
    fresh = _Fresh(edges, params)
    fresh.run()
    names = edges.names
    placements = [(level, key, parent, [names[int(i)] for i in nodes])
                  for level, key, parent, nodes in fresh.out]
    _attach_isolated(placements, isolated, params.max_cluster_size)
    placements.sort(key=lambda p: (p[0], p[1]))
    ids: dict[str, str] = {}
    prev = previous or {}
    for level in sorted({p[0] for p in placements}):
        at_level = [(key, members) for lv, key, _, members in placements if lv == level]
        ids.update(_stable_ids(level, at_level, prev.get(level, {})))
    out = Hierarchy(replace_all=True)
    for level, key, parent, members in placements:
        cid = ids[key]
        out.placements[cid] = Placement(cid, level, ids[parent] if parent else None,
                                        sorted(members))
    out.deleted = {cid for level in prev.values() for cid in level} - set(out.placements)
    return out


def _attach_isolated(placements: list[tuple[int, str, str | None, list[str]]], isolated: Isolated,
                     max_cluster_size: int) -> None:
    """Give entities without relationships a community (in place): the deepest community holding
    most of the connected entities sharing a unit with them, and its ancestors; else groups of
    entities of one unit (so no report is written per lonely name)."""
    index = {key: i for i, (_, key, _, _) in enumerate(placements)}
    deepest: dict[str, int] = {}
    for i, (level, _, _, members) in enumerate(placements):
        for n in members:
            if n not in deepest or placements[deepest[n]][0] < level:
                deepest[n] = i
    lonely: dict[str, list[str]] = defaultdict(list)
    for e in sorted(isolated.cooccurring):
        votes = Counter(deepest[n] for n in isolated.cooccurring[e] if n in deepest)
        if not votes:
            lonely[isolated.first_unit.get(e, "")].append(e)
            continue
        at: int | None = min(votes, key=lambda j: (-votes[j], placements[j][1]))
        while at is not None:
            placements[at][3].append(e)
            parent = placements[at][2]
            at = index[parent] if parent is not None else None
    for unit, members in sorted(lonely.items()):
        for k in range(0, len(members), max_cluster_size):
            placements.append((0, f"iso:{unit}:{k}", None, members[k:k + max_cluster_size]))


def _stable_ids(level: int, new: list[tuple[str, list[str]]],
                old: dict[str, set[str]]) -> dict[str, str]:
    """Each new community key's id: the id of the old community at its level it overlaps best
    (greedy, Jaccard >= 0.5), else a hash of its members."""
    owner: dict[str, str] = {}
    for cid, old_members in old.items():
        for m in old_members:
            owner[m] = cid
    pairs = []
    for key, members in new:
        overlap = Counter(owner[m] for m in members if m in owner)
        for cid, inter in overlap.items():
            jac = inter / (len(members) + len(old[cid]) - inter)
            if jac >= 0.5:
                pairs.append((-jac, key, cid))
    pairs.sort()
    out: dict[str, str] = {}
    used: set[str] = set()
    for _, key, cid in pairs:
        if key not in out and cid not in used:
            out[key] = cid
            used.add(cid)
    for key, members in new:
        if key not in out:
            cid = community_id(level, members)
            while cid in used or cid in old:
                cid += "x"
            out[key] = cid
            used.add(cid)
    return out


# ---- local update ----------------------------------------------------------------------------


class HierarchyReads(Protocol):
    """The reads a local update needs (canopy.store.GraphReads provides them)."""

    def memberships(self, entity_ids: Iterable[str]) -> dict[str, dict[int, str]]: ...
    def members(self, ids: Iterable[str]) -> dict[str, list[str]]: ...
    def children(self, ids: Iterable[str]) -> dict[str, list[str]]: ...
    def communities(self, ids: Iterable[str]) -> dict[str, CommunityRow]: ...
    def edges_of(self, entity_ids: Iterable[str]) -> list[tuple[str, str, str, float]]: ...


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
        for g in groups:
            self.subtree(g, 0, None)
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
        f = _Fresh(arrays, self.p)
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
                top: str | None = None) -> None:
        """A freshly clustered subtree for `members` at `level` under `parent` (newcomers no old
        community holds, or an oversized leaf split again, which keeps its id `top`)."""
        inside = set(members)
        edges = {(min(s, t), max(s, t)): w for _, s, t, w in self.new.edges_of(members)
                 if s in inside and t in inside}
        arrays = EdgeArrays(((a, b, w) for (a, b), w in sorted(edges.items())), sorted(inside))
        f = _Fresh(arrays, self.p)
        f.split(np.arange(arrays.n_nodes, dtype=np.int64),
                np.arange(len(arrays.src), dtype=np.int64), level, None)
        ids: dict[str, str] = {}
        for lv, key, parent_key, nodes in f.out:  # preorder: parents before children
            names = [arrays.names[int(i)] for i in nodes]
            cid = top if parent_key is None and top else self.new_id(lv, names)
            ids[key] = cid
            self.place(cid, lv, ids[parent_key] if parent_key else parent, names)

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
        for _unit, members in sorted(lonely.items()):  # by unit
            for k in range(0, len(members), self.p.max_cluster_size):
                group = members[k:k + self.p.max_cluster_size]
                self.place(self.new_id(0, group), 0, None, group)

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
