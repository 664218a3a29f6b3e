"""Hierarchical communities: every level partitions the entities; parents contain children."""

from __future__ import annotations

import itertools
import random

from canopy.ids import relationship_id
from canopy.model import Entity, Relationship
from indexer.communities import build_communities, is_partition, level_partition, levels


def _graph(edges: list[tuple[str, str]], isolated: tuple[str, ...] = ()) -> tuple[dict[str, Entity], dict[str, Relationship]]:
    names = sorted({n for e in edges for n in e} | set(isolated))
    ents = {n: Entity(n, n, "person", f"desc {n}", (f"tu-{n}",)) for n in names}
    rels = {}
    for a, b in edges:
        rid = relationship_id(a, b)
        rels[rid] = Relationship(rid, a, b, f"{a}-{b}", 1.0, (f"tu-{a}",))
    return ents, rels


def _two_triangles() -> tuple[dict[str, Entity], dict[str, Relationship]]:
    return _graph([("a", "b"), ("b", "c"), ("a", "c"), ("x", "y"), ("y", "z"), ("x", "z")], isolated=("lonely",))


def _big_graph(seed: int = 7) -> tuple[dict[str, Entity], dict[str, Relationship]]:
    """Five dense clusters of 12 nodes with sparse links: forces a second level (max size 10)."""
    rng = random.Random(seed)
    edges = []
    for c in range(5):
        nodes = [f"n{c}_{i}" for i in range(12)]
        edges += [(a, b) for a, b in itertools.combinations(nodes, 2) if rng.random() < 0.5]
    for c in range(4):
        edges.append((f"n{c}_0", f"n{c + 1}_0"))
    edges += [("p", "q")]  # a second, tiny component
    return _graph(edges, isolated=("solo1", "solo2"))


class TestPartition:
    def test_every_level_partitions_all_entities_exhaustively_without_overlap(self) -> None:
        ents, rels = _big_graph()
        comms = build_communities(ents, rels, max_cluster_size=10, seed=1)
        assert len(levels(comms)) >= 2
        for level in levels(comms):
            groups = [c.entity_ids for c in level_partition(comms, level)]
            assert is_partition(groups, set(ents)), f"level {level} is not a partition"

    def test_entities_outside_the_largest_component_and_isolated_ones_have_communities(self) -> None:
        ents, rels = _two_triangles()
        comms = build_communities(ents, rels, max_cluster_size=10, seed=1)
        member_of = {e for c in comms.values() for e in c.entity_ids}
        assert member_of == set(ents)
        tri = [set(c.entity_ids) for c in comms.values() if c.level == 0]
        assert {"a", "b", "c"} in tri and {"x", "y", "z"} in tri

    def test_is_partition_rejects_overlap_and_gaps(self) -> None:
        assert not is_partition([("a", "b"), ("b", "c")], {"a", "b", "c"})
        assert not is_partition([("a",)], {"a", "b"})
        assert is_partition([("a",), ("b",)], {"a", "b"})


class TestHierarchy:
    def test_parents_contain_their_children_and_links_are_symmetric(self) -> None:
        ents, rels = _big_graph()
        comms = build_communities(ents, rels, max_cluster_size=10, seed=1)
        for c in comms.values():
            for k in c.children:
                child = comms[k]
                assert child.parent == c.id
                assert child.level == c.level + 1
                assert set(child.entity_ids) <= set(c.entity_ids)
            if c.children:
                assert set().union(*(comms[k].entity_ids for k in c.children)) == set(c.entity_ids)
            if c.parent:
                assert c.id in comms[c.parent].children

    def test_no_community_exceeds_max_cluster_size_at_its_deepest_level(self) -> None:
        ents, rels = _big_graph()
        comms = build_communities(ents, rels, max_cluster_size=10, seed=1)
        assert all(len(c.entity_ids) <= 10 for c in comms.values() if not c.children)

    def test_provenance_is_the_union_of_members_and_internal_relationships(self) -> None:
        ents, rels = _two_triangles()
        for c in build_communities(ents, rels, max_cluster_size=10, seed=1).values():
            expected = {u for e in c.entity_ids for u in ents[e].text_unit_ids}
            assert set(c.text_unit_ids) >= expected and c.text_unit_ids
            for r in c.relationship_ids:
                assert rels[r].source in c.entity_ids and rels[r].target in c.entity_ids


class TestDeterminismAndStability:
    def test_same_graph_and_seed_give_identical_communities(self) -> None:
        ents, rels = _big_graph()
        assert build_communities(ents, rels, seed=3) == build_communities(ents, rels, seed=3)

    def test_ids_carry_over_when_a_small_change_keeps_most_members(self) -> None:
        ents, rels = _big_graph()
        first = build_communities(ents, rels, seed=3)
        ents2, rels2 = dict(ents), dict(rels)
        ents2["newbie"] = Entity("newbie", "newbie", "person", "d", ("tu-new",))
        rid = relationship_id("newbie", "n0_1")
        rels2[rid] = Relationship(rid, "newbie", "n0_1", "x", 1.0, ("tu-new",))
        second = build_communities(ents2, rels2, seed=3, previous=first)
        kept = set(first) & set(second)
        assert len(kept) >= len(first) * 0.6
        # Communities that did not gain the newcomer keep their exact membership.
        untouched = [c for c in first.values() if "n0_1" not in c.entity_ids]
        assert all(second.get(c.id) is not None and second[c.id].entity_ids == c.entity_ids for c in untouched)

    def test_the_local_update_keeps_every_level_a_partition(self) -> None:
        ents, rels = _big_graph()
        first = build_communities(ents, rels, seed=3)
        ents2 = {k: v for k, v in ents.items() if k != "n1_3"}
        rels2 = {k: r for k, r in rels.items() if "n1_3" not in (r.source, r.target)}
        second = build_communities(ents2, rels2, seed=3, previous=first)
        for level in levels(second):
            assert is_partition([c.entity_ids for c in level_partition(second, level)], set(ents2))
