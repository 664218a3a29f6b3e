"""The community hierarchy of the new generation: updated locally, or clustered afresh.

A local update (canopy.indexer.operations.hierarchy_update.update_hierarchy) touches only
communities whose members or internal edges changed. Its quality guard (design §4) is kept in step
with the change too: the root partition's modularity is maintained from per-root aggregates
(internal edge weight, summed degree) that only the roots the change touches recompute, and when it
falls more than `modularity_drift` below the modularity of the last fresh clustering, the whole
graph is clustered afresh (ids still reused by member overlap, reports by fingerprint).

Both bound the top level to `top_size` (canopy.indexer.operations.grouping): the larger of
`max_cluster_size` and the square root of the text units, unless `max_top_level` is set. A committed
top above the bound (an index built before it, or under a larger one) is clustered afresh at the
next update; so is one the bound shrank below, which takes deleting about 2·sqrt(units) units per
step.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field

from canopy.ids import entity_id
from canopy.indexer.operations.clustering import (
    ClusterParams,
    EdgeArrays,
    GivenCommunities,
    Hierarchy,
    Isolated,
    build_hierarchy,
    modularity,
    root_aggregates,
)
from canopy.indexer.operations.grouping import top_size
from canopy.indexer.operations.hierarchy_update import GraphChange, update_hierarchy
from canopy.indexer.stages.build import Build
from canopy.indexer.stages.graph import GraphDelta
from canopy.store import CommunityRow, Gate

__all__ = ["HierarchyDelta", "stage_communities"]

log = logging.getLogger(__name__)

@dataclass
class HierarchyDelta:
    written: set[str] = field(default_factory=set)  # communities placed anew (members/parent)
    deleted: set[str] = field(default_factory=set)
    replaced_all: bool = False
    root_stats: dict[str, tuple[float, float]] = field(default_factory=dict)  # (w_in, d_tot)
    meta: dict[str, str] = field(default_factory=dict)  # the guard's aggregates


def _params(b: Build) -> ClusterParams:
    c = b.settings.communities
    top = top_size(b.reads.count("text_units"), c.max_cluster_size, c.max_top_level)
    return ClusterParams(c.max_cluster_size, c.seed, c.max_levels, top)


def _sources(b: Build) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Entity id -> (its text units, their documents' paths), for grouping the top."""
    return {e: (units, paths) for batch in b.reads.iter_entity_sources()
            for e, units, paths in batch}


def stage_communities(b: Build, g: GraphDelta) -> HierarchyDelta:
    committed = b.committed
    tops = 0 if b.full else len(committed.roots())
    if b.full or not tops:
        previous = committed.all_memberships() if tops or b.full else None
        return _fresh(b, previous=previous)
    params = _params(b)
    if params.max_top and tops > params.max_top:  # built before the bound, or under a larger
        # one; local updates never add top-level communities past it, so only this catches up
        log.info("community top: %d top-level communities, above the bound of %d; "
                 "re-clustering the whole graph", tops, params.max_top)
        return _fresh(b, previous=committed.all_memberships())
    isolated = _isolated(b, sorted(g.new_entities - g.removed_entities))
    change = GraphChange(frozenset(g.new_entities), frozenset(g.removed_entities),
                         frozenset(g.changed_edges), isolated)
    hierarchy = update_hierarchy(committed, b.reads, change, params)
    delta = _stage(b, hierarchy)
    _guard_aggregates(b, g, delta)
    q = float(delta.meta["q_local"])
    reference = float(b.store.get_meta("q_reference", "0") or 0)
    drift = b.settings.communities.modularity_drift
    if q < reference - drift:
        log.info("community guard: modularity %.3f fell below %.3f - %.2f after local updates; "
                 "re-clustering the whole graph", q, reference, drift)
        return _fresh(b, previous=committed.all_memberships())
    return delta


def _fresh(b: Build, previous: dict[int, dict[str, set[str]]] | None) -> HierarchyDelta:
    edges = EdgeArrays(e for batch in b.reads.iter_edges() for e in batch)
    connected = set(edges.names)
    isolated_ids = [e for e in b.reads.unrelated_entity_ids() if e not in connected]
    given = b.given
    if given is not None:  # an import: only members the new graph has
        nodes = connected | set(isolated_ids)
        given = GivenCommunities([(lv, k, parent, [m for m in ms if m in nodes])
                                  for lv, k, parent, ms in given.placements])
        given.placements = [p for p in given.placements if p[3]]
    hierarchy = build_hierarchy(edges, _isolated(b, isolated_ids), _params(b), previous,
                                lambda: _sources(b), given)
    if given is not None and b.given is not None:
        b.given.ids = given.ids
    if not b.full:  # a guard re-cluster over a committed hierarchy: replace every community,
        # committed or staged by the local update it overrides
        old = [*b.committed.community_ids(), *b.staging.staged_keys("communities")]
        b.staging.delete("communities", old)
        b.staging.delete("community_members", old)
    delta = _stage(b, hierarchy)
    delta.replaced_all = True
    # The guard's reference: the modularity of this fresh root partition.
    agg = root_aggregates(edges, hierarchy)
    delta.root_stats = agg.per_root
    q = agg.modularity
    delta.meta = {"q_reference": repr(q), "q_local": repr(q), "m_total": repr(agg.m_total),
                  "s_in": repr(agg.s_in), "s_d2": repr(agg.s_d2)}
    return delta


def _stage(b: Build, h: Hierarchy) -> HierarchyDelta:
    """Stage placements (with provisional fingerprints, written for real by the reports stage)
    and deletions."""
    deleted = sorted(h.deleted - set(h.placements))
    b.staging.delete("communities", deleted)
    b.staging.delete("community_members", deleted)
    b.staging.delete("reports", deleted)
    placed = sorted(h.placements.values(), key=lambda p: p.id)
    b.staging.put("communities", [
        CommunityRow(p.id, p.level, p.parent, len(p.members), 0, "",
                     Gate(frozenset(), "", False)).values() for p in placed])
    b.staging.put_members((p.id, p.level, p.members) for p in placed)
    return HierarchyDelta(set(h.placements), set(deleted), h.replace_all)


def _isolated(b: Build, candidates: list[str]) -> Isolated:
    """For entities without relationships among `candidates`: the connected entities they share
    units with, and their first unit."""
    units: dict[str, tuple[str, ...]] = {}
    for start in range(0, len(candidates), 2000):
        for eid, row in b.reads.entities(candidates[start:start + 2000]).items():
            if row.entity.degree == 0:
                units[eid] = row.entity.text_unit_ids
    all_units = sorted({u for us in units.values() for u in us})
    in_unit: dict[str, list[str]] = defaultdict(list)
    for start in range(0, len(all_units), 2000):
        for uid, keys in b.store.entity_keys_by_unit(all_units[start:start + 2000]).items():
            in_unit[uid] = [entity_id(k) for k in keys]
    others = sorted({e for es in in_unit.values() for e in es} - set(units))
    connected: set[str] = set()
    for start in range(0, len(others), 2000):
        connected |= {e for e, d in b.reads.degrees(others[start:start + 2000]).items() if d > 0}
    cooccurring = {e: [n for u in us for n in in_unit.get(u, ()) if n in connected]
                   for e, us in units.items()}
    return Isolated(cooccurring, {e: min(us) for e, us in units.items() if us})


def _guard_aggregates(b: Build, g: GraphDelta, delta: HierarchyDelta) -> None:
    """Root aggregates of the roots this update touched, and the modularity they imply.

    A root's aggregates are sums over edges, so a root that was committed before moves by the
    edges whose weight or endpoints' root changed: those of changed relationships and of
    entities that joined or left a root. Only a root without a committed row (new) is summed
    over all its edges."""
    reads, committed = b.reads, b.committed
    touched = {e for edge in g.changed_edges for e in edge}
    roots = {cid for cid, row in reads.communities(delta.written).items() if row.parent is None}
    for chain in reads.memberships(touched).values():
        if 0 in chain:
            roots.add(chain[0])
    old_rows = committed.communities(roots | delta.deleted)
    get = b.store.get_meta
    s_in = float(get("s_in", "0") or 0)
    s_d2 = float(get("s_d2", "0") or 0)
    m = float(get("m_total", "0") or 0)
    for row in old_rows.values():
        if row.parent is None:
            s_in -= row.w_in
            s_d2 -= row.d_tot ** 2
    known = sorted(r for r in roots if r in old_rows and old_rows[r].parent is None)
    stats = _root_stats_moved(b, touched, known, old_rows)
    for cid in sorted(roots - set(known)):
        stats[cid] = _root_stats_summed(b, cid)
    for cid, (w_in, d_tot) in sorted(stats.items()):
        delta.root_stats[cid] = (w_in, d_tot)
        s_in += w_in
        s_d2 += d_tot ** 2
    old_weights = committed.relationships(g.relationships | g.removed_relationships)
    new_weights = reads.relationships(g.relationships)
    m += sum(r.relationship.weight for r in new_weights.values())
    m -= sum(r.relationship.weight for r in old_weights.values())
    delta.meta = {"q_local": repr(modularity(s_in, s_d2, m)), "m_total": repr(m),
                  "s_in": repr(s_in), "s_d2": repr(s_d2)}


def _root_stats_summed(b: Build, root: str) -> tuple[float, float]:
    """(w_in, d_tot) of one root over all its members' edges."""
    inside = set(b.reads.members([root]).get(root, []))
    w_in = d_tot = 0.0
    if inside:
        for _, s, t, w in b.reads.edges_of(sorted(inside)):
            d_tot += w * ((s in inside) + (t in inside))
            if s in inside and t in inside:
                w_in += w
    return w_in, d_tot


def _root_stats_moved(b: Build, touched: set[str], roots: list[str],
                      old_rows: dict[str, CommunityRow]) -> dict[str, tuple[float, float]]:
    """(w_in, d_tot) of committed roots, moved from their committed values by the edges whose
    contribution changed: edges of `touched` entities (changed relationships) and of entities
    that joined or left one of these roots."""
    if not roots:
        return {}
    reads, committed = b.reads, b.committed
    now, before = reads.members(roots), committed.members(roots)
    movers = set(touched)
    for r in roots:
        movers |= set(now.get(r, ())) ^ set(before.get(r, ()))
    ids = sorted(movers)
    old_edges = {i: (s, t, w) for i, s, t, w in committed.edges_of(ids)}
    new_edges = {i: (s, t, w) for i, s, t, w in reads.edges_of(ids)}
    ends = sorted({e for s, t, _ in [*old_edges.values(), *new_edges.values()] for e in (s, t)})
    old_root = {e: c[0] for e, c in committed.memberships(ends).items() if 0 in c}
    new_root = {e: c[0] for e, c in reads.memberships(ends).items() if 0 in c}
    out = {r: [old_rows[r].w_in, old_rows[r].d_tot] for r in roots}

    def add(edges: dict[str, tuple[str, str, float]], root_of: dict[str, str], sign: float) -> None:
        for s, t, w in edges.values():
            rs, rt = root_of.get(s), root_of.get(t)
            for r in {rs, rt}:
                if r in out:
                    ins = (rs == r) + (rt == r)
                    out[r][1] += sign * w * ins
                    if ins == 2:
                        out[r][0] += sign * w

    add(old_edges, old_root, -1.0)
    add(new_edges, new_root, 1.0)
    return {r: (w_in, d_tot) for r, (w_in, d_tot) in out.items()}
