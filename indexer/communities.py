"""Hierarchical Leiden communities over the whole entity graph (Edge et al. 2024 §2.1.4).

- Every connected component is clustered (no largest-component filter), and entities with no
  relationship are grouped by the text unit they first appear in, so every entity has a community.
- Level 0 is the coarsest partition; a community larger than `max_cluster_size` is split into
  children one level down. Read at level L, the hierarchy means "the communities at L plus the
  childless communities of shallower levels" (the paper's C0..C3): every level partitions the
  entities (`level_partition`, checked by `is_partition`).
- Ids are stable: a new community takes the id of the previous community at its level with which
  it shares most members (Jaccard >= 0.5); otherwise its id is a hash of its members.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import logging

import graspologic_native as gn

from canopy.ids import content_hash
from canopy.model import Community, Entity, Relationship

__all__ = ["build_communities", "is_partition", "level_partition", "levels", "modularity", "refresh_communities"]

log = logging.getLogger(__name__)


def build_communities(
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
    *,
    max_cluster_size: int = 10,
    seed: int = 0xDEADBEEF,
    max_levels: int = 4,
    previous: dict[str, Community] | None = None,
    modularity_drift: float = 0.05,
) -> dict[str, Community]:
    """Communities with parents, children, members and provenance; fingerprints left empty.

    With `previous`, Leiden starts from the previous level-0 partition (new entities as
    singletons), so a small graph change moves few members and most reports stay valid; if that
    partition's modularity falls more than `modularity_drift` below a fresh clustering's, the
    fresh clustering is used instead (the quality guard of design §4)."""
    memberships = _clustering(relationships, max_cluster_size, seed, max_levels, previous, modularity_drift)
    clustered = {n for _, _, _, nodes in memberships for n in nodes}
    by_unit: dict[str, list[str]] = defaultdict(list)
    for e in sorted(entities.values(), key=lambda e: e.id):
        if e.id not in clustered:
            by_unit[min(e.text_unit_ids) if e.text_unit_ids else ""].append(e.id)
    for unit, members in sorted(by_unit.items()):
        for i in range(0, len(members), max_cluster_size):
            memberships.append((0, f"iso:{unit}:{i}", None, members[i : i + max_cluster_size]))

    # Assign ids level by level so a child's parent id is known.
    ids: dict[str, str] = {}
    prev_by_level: dict[int, list[Community]] = defaultdict(list)
    for c in (previous or {}).values():
        prev_by_level[c.level].append(c)
    memberships.sort(key=lambda m: (m[0], m[1]))
    for level in sorted({m[0] for m in memberships}):
        at_level = [m for m in memberships if m[0] == level]
        ids.update(_stable_ids(level, [(k, ns) for _, k, _, ns in at_level], prev_by_level[level]))

    placed = [(level, ids[key], ids[parent_key] if parent_key is not None else None, nodes)
              for level, key, parent_key, nodes in memberships]
    return _assemble(placed, entities, relationships)


def refresh_communities(
    previous: dict[str, Community], entities: dict[str, Entity], relationships: dict[str, Relationship]
) -> dict[str, Community]:
    """The previous communities, unchanged in membership, with relationships and provenance
    recomputed (used when the graph itself did not change: no re-clustering, no id churn)."""
    placed = [(c.level, c.id, c.parent, list(c.entity_ids)) for c in previous.values()]
    return _assemble(placed, entities, relationships)


def _assemble(
    placed: list[tuple[int, str, str | None, list[str]]],
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
) -> dict[str, Community]:
    rel_by_entity: dict[str, list[Relationship]] = defaultdict(list)
    for r in relationships.values():
        rel_by_entity[r.source].append(r)
        rel_by_entity[r.target].append(r)
    children: dict[str, list[str]] = defaultdict(list)
    for _, cid, parent, _ in placed:
        if parent is not None:
            children[parent].append(cid)
    out: dict[str, Community] = {}
    for level, cid, parent, nodes in placed:
        members = set(nodes)
        rels = sorted({r.id for n in members for r in rel_by_entity[n] if r.source in members and r.target in members})
        units = sorted({u for n in members for u in entities[n].text_unit_ids} |
                       {u for rid in rels for u in relationships[rid].text_unit_ids})
        out[cid] = Community(
            id=cid, level=level, parent=parent, children=tuple(sorted(children[cid])),
            entity_ids=tuple(sorted(members)), relationship_ids=tuple(rels), text_unit_ids=tuple(units),
        )
    return out


_Membership = tuple[int, str, str | None, list[str]]  # (level, key, parent key, member ids)


def _edges(relationships: dict[str, Relationship]) -> list[tuple[str, str, float]]:
    return sorted((r.source, r.target, float(max(r.weight, 1e-6))) for r in relationships.values() if r.source != r.target)


def _clustering(
    relationships: dict[str, Relationship], max_cluster_size: int, seed: int, max_levels: int,
    previous: dict[str, Community] | None, drift: float,
) -> list[_Membership]:
    edges = _edges(relationships)
    if not edges:
        return []
    fresh = _leiden(edges, max_cluster_size, seed, max_levels, None)
    if not previous:
        return fresh
    nodes = sorted({n for a, b, _ in edges for n in (a, b)})
    roots = sorted((c for c in previous.values() if c.level == 0), key=lambda c: c.id)
    start: dict[str, int] = {}
    for i, c in enumerate(roots):
        for e in c.entity_ids:
            start[e] = i
    nxt = len(roots)
    for n in nodes:
        if n not in start:
            start[n] = nxt
            nxt += 1
    start = {n: start[n] for n in nodes}
    warm = _leiden(edges, max_cluster_size, seed, max_levels, start)
    warm_q, fresh_q = _root_modularity(edges, warm), _root_modularity(edges, fresh)
    if warm_q < fresh_q - drift:
        log.info("community guard: warm-start modularity %.3f < fresh %.3f - %.2f; re-clustered", warm_q, fresh_q, drift)
        return fresh
    return warm


def _root_modularity(edges: list[tuple[str, str, float]], memberships: list[_Membership]) -> float:
    part = {n: i for i, (level, _, _, ns) in enumerate(memberships) if level == 0 for n in ns}
    return float(gn.modularity(edges=edges, communities=part))


def _leiden(
    edges: list[tuple[str, str, float]], max_cluster_size: int, seed: int, max_levels: int,
    starting: dict[str, int] | None,
) -> list[_Membership]:
    result = gn.hierarchical_leiden(edges=edges, starting_communities=starting, max_cluster_size=max_cluster_size,
                                    seed=seed)
    nodes: dict[tuple[int, int], list[str]] = defaultdict(list)
    parent: dict[tuple[int, int], int | None] = {}
    for hc in result:
        if hc.level >= max_levels:
            continue
        nodes[(hc.level, hc.cluster)].append(hc.node)
        parent[(hc.level, hc.cluster)] = hc.parent_cluster
    out = []
    for (level, cluster), members in nodes.items():
        p = parent[(level, cluster)]
        out.append((level, f"L{level}:{cluster}", f"L{level - 1}:{p}" if p is not None and level > 0 else None, sorted(members)))
    return out


def _stable_ids(level: int, new: list[tuple[str, list[str]]], old: list[Community]) -> dict[str, str]:
    """Map each new community key to an id, reusing the best-overlapping old id (greedy, Jaccard >= 0.5)."""
    pairs = []
    old_sets = {c.id: set(c.entity_ids) for c in old}
    owner: dict[str, list[str]] = defaultdict(list)
    for cid, members in old_sets.items():
        for m in members:
            owner[m].append(cid)
    for key, members in new:
        ms = set(members)
        for cid in {o for m in ms for o in owner.get(m, ())}:
            inter = len(ms & old_sets[cid])
            jac = inter / len(ms | old_sets[cid])
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
            cid = f"c{level}-" + content_hash(*sorted(members), length=10)
            while cid in used:  # identical member sets cannot occur within a level; be safe
                cid += "x"
            out[key] = cid
            used.add(cid)
    return out


def levels(communities: dict[str, Community]) -> list[int]:
    return sorted({c.level for c in communities.values()})


def level_partition(communities: dict[str, Community], level: int) -> list[Community]:
    """Communities that stand for level `level`: those at it, plus childless shallower ones."""
    return sorted(
        (c for c in communities.values() if c.level == level or (c.level < level and not c.children)),
        key=lambda c: c.id,
    )


def is_partition(groups: Iterable[Iterable[str]], universe: set[str]) -> bool:
    """True when the groups cover `universe` exactly, without overlap."""
    seen: set[str] = set()
    for g in groups:
        for x in g:
            if x in seen:
                return False
            seen.add(x)
    return seen == universe


def modularity(relationships: dict[str, Relationship], partition: dict[str, int]) -> float:
    """Modularity of a node->community partition of the relationship graph."""
    edges = [e for e in _edges(relationships) if e[0] in partition and e[1] in partition]
    return float(gn.modularity(edges=edges, communities=partition)) if edges else 0.0
