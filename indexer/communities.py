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

from collections import Counter, defaultdict
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

    With `previous`, the previous hierarchy is updated locally (`_local_update`): communities
    whose members did not change keep their exact membership; if the updated partition's
    modularity falls more than `modularity_drift` below a fresh clustering's, the fresh clustering
    is used instead (the quality guard of design §4)."""
    memberships = _clustering(relationships, max_cluster_size, seed, max_levels, previous, modularity_drift)
    _attach_isolated(memberships, entities, max_cluster_size)

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


def _attach_isolated(memberships: list[_Membership], entities: dict[str, Entity], max_cluster_size: int) -> None:
    """Give entities without relationships a community (in place).

    An isolated entity joins the deepest community holding most of the connected entities that
    share a text unit with it (and that community's ancestors); entities of units with no
    connected entity at all are grouped by unit. Every entity ends up in exactly one community
    per level, without one low-value report per lonely name."""
    clustered = {n for _, _, _, nodes in memberships for n in nodes}
    index = {key: i for i, (_, key, _, _) in enumerate(memberships)}
    deepest: dict[str, int] = {}
    for i, (level, _, _, nodes) in enumerate(memberships):
        for n in nodes:
            if n not in deepest or memberships[deepest[n]][0] < level:
                deepest[n] = i
    by_unit_connected: dict[str, list[str]] = defaultdict(list)
    for e in entities.values():
        if e.id in clustered:
            for u in e.text_unit_ids:
                by_unit_connected[u].append(e.id)
    lonely: dict[str, list[str]] = defaultdict(list)
    for e in sorted(entities.values(), key=lambda e: e.id):
        if e.id in clustered:
            continue
        votes: Counter[int] = Counter(deepest[n] for u in e.text_unit_ids for n in by_unit_connected.get(u, ()))
        if not votes:
            lonely[min(e.text_unit_ids) if e.text_unit_ids else ""].append(e.id)
            continue
        i: int | None = min(votes, key=lambda j: (-votes[j], memberships[j][1]))
        while i is not None:
            memberships[i][3].append(e.id)
            parent = memberships[i][2]
            i = index[parent] if parent is not None else None
    for unit, members in sorted(lonely.items()):
        for k in range(0, len(members), max_cluster_size):
            memberships.append((0, f"iso:{unit}:{k}", None, members[k : k + max_cluster_size]))


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
    fresh = _leiden(edges, max_cluster_size, seed, max_levels)
    if not previous:
        return fresh
    local = _local_update(edges, previous, max_cluster_size, seed, max_levels)
    local_q, fresh_q = _root_modularity(edges, local), _root_modularity(edges, fresh)
    if local_q < fresh_q - drift:
        log.info("community guard: local-update modularity %.3f < fresh %.3f - %.2f; re-clustered", local_q, fresh_q, drift)
        return fresh
    return local


def _root_modularity(edges: list[tuple[str, str, float]], memberships: list[_Membership]) -> float:
    part = {n: i for i, (level, _, _, ns) in enumerate(memberships) if level == 0 for n in ns}
    return float(gn.modularity(edges=edges, communities=part))


def _leiden(edges: list[tuple[str, str, float]], max_cluster_size: int, seed: int, max_levels: int) -> list[_Membership]:
    """Hierarchical Leiden as a per-level recursion: level 0 over the whole graph, then each
    community larger than `max_cluster_size` split by Leiden on its own subgraph."""
    nodes = sorted({n for a, b, _ in edges for n in (a, b)})
    out: list[_Membership] = []
    for members in _partition(nodes, edges, seed):
        _split(members, edges, 0, None, max_cluster_size, seed, max_levels, out)
    return out


def _partition(nodes: list[str], edges: list[tuple[str, str, float]], seed: int) -> list[list[str]]:
    """Leiden groups of `nodes` over `edges` restricted to them; nodes without an edge among
    them come back as one extra group."""
    inside = set(nodes)
    sub = [e for e in edges if e[0] in inside and e[1] in inside]
    groups: dict[int, list[str]] = defaultdict(list)
    if sub:
        _, part = gn.leiden(edges=sub, seed=seed)
        for node, cluster in part.items():
            groups[cluster].append(node)
    loose = sorted(inside - {n for g in groups.values() for n in g})
    if loose:
        groups[-1] = loose
    return sorted((sorted(g) for g in groups.values()), key=lambda g: g[0])


def _split(
    members: list[str], edges: list[tuple[str, str, float]], level: int, parent: str | None,
    max_cluster_size: int, seed: int, max_levels: int, out: list[_Membership],
) -> None:
    key = f"L{level}:{members[0]}"
    out.append((level, key, parent, members))
    if len(members) <= max_cluster_size or level + 1 >= max_levels:
        return
    inside = set(members)
    sub = [e for e in edges if e[0] in inside and e[1] in inside]
    groups = _partition(members, sub, seed)
    if len(groups) < 2:
        return  # Leiden found no finer structure: this community is a leaf
    for g in groups:
        _split(g, sub, level + 1, key, max_cluster_size, seed, max_levels, out)


def _local_update(
    edges: list[tuple[str, str, float]], previous: dict[str, Community], max_cluster_size: int, seed: int,
    max_levels: int,
) -> list[_Membership]:
    """Update the previous hierarchy in place of re-clustering it (design §4).

    At every level, each previous community keeps its surviving members; new entities join the
    community they are most strongly connected to (or are clustered among themselves); then the
    same rule runs inside each community for its children. A community whose members and their
    edges did not change therefore keeps its exact membership, and so its report. The caller's
    modularity guard re-clusters from scratch when these local decisions drift too far."""
    out: list[_Membership] = []
    nodes = sorted({n for a, b, _ in edges for n in (a, b)})
    roots = [c for c in previous.values() if c.level == 0]
    adjacency: dict[str, dict[str, float]] = defaultdict(dict)
    for a, b, w in edges:
        adjacency[a][b] = w
        adjacency[b][a] = w
    _update_level(nodes, edges, adjacency, 0, None, roots, previous, max_cluster_size, seed, max_levels, out)
    return out


def _update_level(
    members: list[str], edges: list[tuple[str, str, float]], adjacency: dict[str, dict[str, float]], level: int,
    parent: str | None, prev_here: list[Community], previous: dict[str, Community],
    max_cluster_size: int, seed: int, max_levels: int, out: list[_Membership],
) -> None:
    inside = set(members)
    groups: list[tuple[set[str], Community | None]] = []
    owner: dict[str, int] = {}
    for c in sorted(prev_here, key=lambda c: c.id):
        kept = inside.intersection(c.entity_ids)
        if kept:
            for n in kept:
                owner[n] = len(groups)
            groups.append((kept, c))
    pending = sorted(inside - set(owner))
    changed = True
    while pending and changed:  # newcomers join their most strongly connected group
        changed = False
        still = []
        for n in pending:
            weights: dict[int, float] = defaultdict(float)
            for m, w in adjacency[n].items():
                if m in owner:
                    weights[owner[m]] += w
            if weights:
                g = min(weights, key=lambda i: (-weights[i], i))
                groups[g][0].add(n)
                owner[n] = g
                changed = True
            else:
                still.append(n)
        pending = still
    for new_group in _partition(pending, edges, seed) if pending else []:
        groups.append((set(new_group), None))
    for group, prev in sorted(groups, key=lambda g: min(g[0])):
        ordered = sorted(group)
        sub = [e for e in edges if e[0] in group and e[1] in group]
        if prev is not None and prev.children:
            key = f"L{level}:{ordered[0]}"
            out.append((level, key, parent, ordered))
            if level + 1 < max_levels:
                _update_level(ordered, sub, adjacency, level + 1, key, [previous[k] for k in prev.children], previous,
                              max_cluster_size, seed, max_levels, out)
        else:
            _split(ordered, sub, level, parent, max_cluster_size, seed, max_levels, out)


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
