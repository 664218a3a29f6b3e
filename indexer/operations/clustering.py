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
- `canopy.indexer.operations.hierarchy_update.update_hierarchy`: a local update of the previous
  hierarchy that touches only what changed (design §4).

A top of more than `ClusterParams.max_top` candidates is grouped: the largest stand, the others
are grafted under the one they share the most text units, else documents, with
(canopy.indexer.operations.grouping).
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import graspologic_native as gn
import numpy as np

from canopy.ids import content_hash
from canopy.indexer.operations.grouping import Candidate, Sources, nearest_by_path, plan_top

__all__ = [
    "GivenCommunities",
    "ClusterParams",
    "EdgeArrays",
    "Hierarchy",
    "Isolated",
    "LeidenLevels",
    "Placement",
    "build_hierarchy",
    "community_id",
    "is_partition",
    "modularity",
    "root_aggregates",
    "RootAggregates",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ClusterParams:
    max_cluster_size: int = 10
    seed: int = 0xDEADBEEF
    max_levels: int = 4
    # most top-level communities (canopy.indexer.operations.grouping.top_size); 0 = no bound
    max_top: int = 0


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


@dataclass(frozen=True)
class RootAggregates:
    """The root partition's modularity aggregates: each root's (internal edge weight, summed
    degree), and the totals the modularity guard keeps (design §4)."""

    per_root: dict[str, tuple[float, float]]
    m_total: float  # total edge weight
    s_in: float  # summed internal edge weight
    s_d2: float  # summed squared root degree

    @property
    def modularity(self) -> float:
        return modularity(self.s_in, self.s_d2, self.m_total)


def root_aggregates(edges: EdgeArrays, hierarchy: Hierarchy) -> RootAggregates:
    """The aggregates of the top-level communities of `hierarchy` over `edges`."""
    root_of = np.full(edges.n_nodes, -1, dtype=np.int64)
    roots = sorted(p.id for p in hierarchy.placements.values() if p.parent is None)
    position = {cid: i for i, cid in enumerate(roots)}
    for p in hierarchy.placements.values():
        if p.parent is None:
            for m in p.members:
                i = edges.index.get(m)
                if i is not None:
                    root_of[i] = position[p.id]
    w_in = np.zeros(len(roots))
    d_tot = np.zeros(len(roots))
    rs, rt = root_of[edges.src], root_of[edges.dst]
    np.add.at(d_tot, rs, edges.w)
    np.add.at(d_tot, rt, edges.w)
    same = rs == rt
    np.add.at(w_in, rs[same], edges.w[same])
    return RootAggregates({cid: (float(w_in[i]), float(d_tot[i])) for cid, i in position.items()},
                          float(edges.w.sum()), float(w_in.sum()), float((d_tot ** 2).sum()))


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


class LeidenLevels:
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


_Placed = tuple[int, str, str | None, list[str]]  # level, key, parent key, members


@dataclass
class GivenCommunities:
    """Communities clustered elsewhere (an imported Microsoft GraphRAG index) that a fresh
    hierarchy starts from instead of clustering their members again: (level, key, parent key,
    member entity ids) each, parents before children, members of entities in the graph only.
    `build_hierarchy` fills `ids`: key -> community id, for each given community placed with
    exactly its given members (the others gained members or moved: see there)."""

    placements: list[tuple[int, str, str | None, list[str]]]
    ids: dict[str, str] = field(default_factory=dict)


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
    sources: Callable[[], Sources] = dict,
    given: GivenCommunities | None = None,
) -> Hierarchy:
    """A fresh hierarchy of the whole graph (ids reused from `previous`: level -> id -> members).
    With `params.max_top`, a top of more candidates is grouped by `sources()` (entity id -> the
    text units and documents that mention it; canopy.indexer.operations.grouping), read only then.

    With `given`, its communities stand as given and only the entities outside them are placed:
    those linked among themselves are clustered here, those linked only to given members join
    the deepest community holding most of their neighbours (as entities without relationships
    join the community of the entities they share units with). A given community that gains
    members that way, or is grafted under another by the top bound, is a new community."""
    placements: list[_Placed]
    if given is None:
        placements = _leiden_placements(edges, params)
    else:
        placements = [(lv, k, parent, list(ms)) for lv, k, parent, ms in given.placements]
        covered = {m for p in placements for m in p[3]}
        names = edges.names
        rest = EdgeArrays((names[s], names[t], w) for s, t, w in
                          zip(edges.src.tolist(), edges.dst.tolist(), edges.w.tolist(), strict=True)
                          if names[s] not in covered and names[t] not in covered)
        placements += _leiden_placements(rest, params)
        placed = covered | set(rest.names)
        neighbours: dict[str, list[str]] = defaultdict(list)
        for s, t in zip(edges.src.tolist(), edges.dst.tolist(), strict=True):
            a, b = names[s], names[t]
            if a not in placed:
                neighbours[a].append(b)
            if b not in placed:
                neighbours[b].append(a)
        _attach_isolated(placements, Isolated(dict(neighbours), {}), params.max_cluster_size)
    _attach_isolated(placements, isolated, params.max_cluster_size)
    if params.max_top and sum(p[2] is None for p in placements) > params.max_top:
        placements = _group_top(placements, sources(), params)
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
    if given is not None:
        final = {key: (level, parent, set(members)) for level, key, parent, members in placements}
        given.ids = {key: ids[key] for level, key, parent, members in given.placements
                     if final.get(key) == (level, parent, set(members))}
    out.deleted = {cid for level in prev.values() for cid in level} - set(out.placements)
    return out


def _leiden_placements(edges: EdgeArrays, params: ClusterParams) -> list[_Placed]:
    fresh = LeidenLevels(edges, params)
    fresh.run()
    names = edges.names
    return [(level, key, parent, [names[int(i)] for i in nodes])
            for level, key, parent, nodes in fresh.out]


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


def _group_top(placements: list[_Placed], sources: Sources,
               params: ClusterParams) -> list[_Placed]:
    """The `max_top` largest top-level candidates stand; every other one is grafted, with its
    subtree one level down, under the one it shares the most sources with
    (canopy.indexer.operations.grouping).
    Levels past `max_levels` are cut: their parents become leaves."""
    tops = [Candidate.of(key, members, sources)
            for _, key, parent, members in placements if parent is None]
    plan = plan_top([], tops, params.max_top)
    joins = plan.joins | nearest_by_path(plan, tops)
    children: dict[str | None, list[int]] = defaultdict(list)
    for i, p in enumerate(placements):
        children[p[2]].append(i)
    index = {p[1]: i for i, p in enumerate(placements)}
    out = list(placements)
    for key, target in sorted(joins.items()):
        t_level, _, _, t_members = out[index[target]]
        if not children[target]:  # a leaf gains children: its own members become one of them
            out.append((t_level + 1, f"self:{target}", target, list(t_members)))
            children[target].append(len(out) - 1)
        t_members.extend(placements[index[key]][3])
        todo = [index[key]]
        while todo:  # the grafted subtree, one level down
            i = todo.pop()
            level, k, parent, members = out[i]
            out[i] = (level + 1, k, target if k == key else parent, members)
            todo += children[k]
        children[target].append(index[key])
    return [p for p in out if p[0] < params.max_levels]


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
