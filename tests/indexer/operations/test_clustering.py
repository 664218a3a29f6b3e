"""Hierarchical communities: every level partitions the entities; parents contain children; a
local update touches only what changed and keeps every invariant."""

from __future__ import annotations

import dataclasses
import itertools
import random
from collections import defaultdict
from collections.abc import Iterable

from hypothesis import given, settings
from hypothesis import strategies as st

from canopy.indexer.operations.clustering import (
    ClusterParams,
    EdgeArrays,
    Hierarchy,
    Isolated,
    Placement,
    build_hierarchy,
    is_partition,
    modularity,
)
from canopy.indexer.operations.hierarchy_update import GraphChange, update_hierarchy
from canopy.store import CommunityRow, Gate

PARAMS = ClusterParams(max_cluster_size=10, seed=1, max_levels=4)
NO_ISOLATED = Isolated({}, {})
Edges = dict[tuple[str, str], float]
Docs = dict[str, tuple[str, ...]]  # entity -> text units "path#n" ("path" alone: "path#0")
Sources = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def _sources(docs: Docs) -> Sources:
    """Entity -> (text units, document paths), from units written as "path#n"."""
    units = {e: tuple(u if "#" in u else u + "#0" for u in us) for e, us in docs.items()}
    return {e: (us, tuple(sorted({u.split("#")[0] for u in us}))) for e, us in units.items()}


def _edges(pairs: Iterable[tuple[str, str]]) -> Edges:
    return {tuple(sorted(p)): 1.0 for p in pairs if p[0] != p[1]}  # type: ignore[misc]


def _big_graph(seed: int = 7) -> Edges:
    """Five dense clusters of 12 nodes with sparse links: forces a second level (max size 10)."""
    rng = random.Random(seed)
    pairs = []
    for c in range(5):
        nodes = [f"n{c}_{i:02d}" for i in range(12)]
        pairs += [(a, b) for a, b in itertools.combinations(nodes, 2) if rng.random() < 0.5]
    pairs += [(f"n{c}_00", f"n{c + 1}_00") for c in range(4)]
    pairs += [("p", "q")]  # a second, tiny component
    return _edges(pairs)


def _fresh(edges: Edges, isolated: Isolated = NO_ISOLATED, params: ClusterParams = PARAMS,
           previous: dict[int, dict[str, set[str]]] | None = None,
           documents: Docs | None = None) -> dict[str, Placement]:
    arrays = EdgeArrays((a, b, w) for (a, b), w in edges.items())
    return build_hierarchy(arrays, isolated, params, previous,
                           lambda: _sources(documents or {})).placements


def _children(h: dict[str, Placement]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for p in h.values():
        if p.parent:
            out[p.parent].append(p.id)
    return out


def assert_hierarchy(h: dict[str, Placement], universe: set[str]) -> None:
    kids = _children(h)
    levels = sorted({p.level for p in h.values()})
    for level in levels:
        part = [p.members for p in h.values()
                if p.level == level or (p.level < level and not kids[p.id])]
        assert is_partition(part, universe), f"level {level} is not a partition"
    for p in h.values():
        if p.parent is not None:
            parent = h[p.parent]
            assert p.level == parent.level + 1 and set(p.members) <= set(parent.members)
        if kids[p.id]:
            assert set().union(*(h[k].members for k in kids[p.id])) == set(p.members)


class FakeHierarchy:
    """A committed hierarchy and graph in memory, answering the reads a local update makes;
    `documents`: entity -> paths of the documents that mention it."""

    def __init__(self, placements: dict[str, Placement], edges: Edges,
                 documents: Docs | None = None) -> None:
        self.h = placements
        self.e = edges
        self.sources = _sources(documents or {})

    def roots(self) -> list[CommunityRow]:
        return list(self.communities(i for i, p in self.h.items() if p.parent is None).values())

    def entity_sources(self, entity_ids: Iterable[str]) -> dict[str, tuple[set[str], set[str]]]:
        return {e: (set(self.sources[e][0]), set(self.sources[e][1]))
                for e in entity_ids if e in self.sources}

    def _mentions(self, wanted: Iterable[str], which: int) -> dict[str, set[str]]:
        keep = set(wanted)
        out: dict[str, set[str]] = defaultdict(set)
        for e, found in self.sources.items():
            for source in set(found[which]) & keep:
                out[source].add(e)
        return dict(out)

    def unit_entities(self, unit_ids: Iterable[str]) -> dict[str, set[str]]:
        return self._mentions(unit_ids, 0)

    def document_entities(self, paths: Iterable[str]) -> dict[str, set[str]]:
        return self._mentions(paths, 1)

    def documents_near(self, path: str, k: int) -> tuple[list[str], list[str]]:
        paths = sorted({d for _, ds in self.sources.values() for d in ds})
        return sorted([p for p in paths if p < path], reverse=True)[:k], \
            [p for p in paths if p > path][:k]

    def memberships(self, entity_ids: Iterable[str]) -> dict[str, dict[int, str]]:
        wanted = set(entity_ids)
        out: dict[str, dict[int, str]] = defaultdict(dict)
        for p in self.h.values():
            for m in p.members:
                if m in wanted:
                    out[m][p.level] = p.id
        return dict(out)

    def members(self, ids: Iterable[str]) -> dict[str, list[str]]:
        return {i: list(self.h[i].members) for i in ids if i in self.h}

    def children(self, ids: Iterable[str]) -> dict[str, list[str]]:
        kids = _children(self.h)
        return {i: sorted(kids[i]) for i in ids if kids.get(i)}

    def communities(self, ids: Iterable[str]) -> dict[str, CommunityRow]:
        kids = _children(self.h)
        return {i: CommunityRow(i, p.level, p.parent, len(p.members), len(kids[i]), "",
                                Gate(frozenset(), "", False))
                for i in ids if (p := self.h.get(i)) is not None}

    def edges_of(self, entity_ids: Iterable[str]) -> list[tuple[str, str, str, float]]:
        wanted = set(entity_ids)
        return [(f"{a}|{b}", a, b, w) for (a, b), w in sorted(self.e.items())
                if a in wanted or b in wanted]


def _apply(old: dict[str, Placement], change: Hierarchy) -> dict[str, Placement]:
    out = {k: v for k, v in old.items() if k not in change.deleted}
    out.update(change.placements)
    return out


def _update(old_h: dict[str, Placement], old_e: Edges, new_e: Edges, universe_old: set[str],
            universe_new: set[str], isolated: Isolated = NO_ISOLATED,
            params: ClusterParams = PARAMS, documents: Docs | None = None
            ) -> dict[str, Placement]:
    changed = {k for k in set(old_e) | set(new_e) if old_e.get(k) != new_e.get(k)}
    change = GraphChange(frozenset(universe_new - universe_old),
                         frozenset(universe_old - universe_new), frozenset(changed), isolated)
    live = {e: d for e, d in (documents or {}).items() if e in universe_new}
    delta = update_hierarchy(
        FakeHierarchy(old_h, old_e, live), FakeHierarchy(old_h, new_e, live), change, params
    )
    return _apply(old_h, delta)


def _nodes(edges: Edges) -> set[str]:
    return {n for e in edges for n in e}


class TestFreshClustering:
    def test_every_level_partitions_all_entities_exhaustively_without_overlap(self) -> None:
        edges = _big_graph()
        h = _fresh(edges, Isolated({"solo1": [], "solo2": []}, {"solo1": "u1", "solo2": "u1"}))
        assert len({p.level for p in h.values()}) >= 2
        assert_hierarchy(h, _nodes(edges) | {"solo1", "solo2"})

    def test_small_components_and_isolated_entities_get_communities(self) -> None:
        edges = _edges([("a", "b"), ("b", "c"), ("a", "c"), ("x", "y"), ("y", "z"), ("x", "z")])
        h = _fresh(
            edges, Isolated({"lonely": [], "near_a": ["a"]}, {"lonely": "u9", "near_a": "u1"})
        )
        tops = [set(p.members) for p in h.values() if p.level == 0]
        assert {"a", "b", "c", "near_a"} in tops and {"x", "y", "z"} in tops and {"lonely"} in tops

    def test_no_leaf_exceeds_max_cluster_size_below_the_last_level(self) -> None:
        h = _fresh(_big_graph())
        kids = _children(h)
        assert all(len(p.members) <= 10 for p in h.values() if not kids[p.id])

    def test_same_graph_and_seed_give_identical_communities(self) -> None:
        assert _fresh(_big_graph()) == _fresh(_big_graph())

    def test_ids_are_reused_from_a_previous_hierarchy_by_member_overlap(self) -> None:
        edges = _big_graph()
        first = _fresh(edges)
        previous: dict[int, dict[str, set[str]]] = defaultdict(dict)
        for p in first.values():
            previous[p.level][p.id + "-old"] = set(p.members)
        second = _fresh(edges, previous=previous)
        assert set(second) == {cid + "-old" for cid in first}


class TestLocalUpdate:
    def test_a_newcomer_joins_its_neighbours_and_untouched_communities_keep_their_members(
        self,
    ) -> None:
        old_e = _big_graph()
        old_h = _fresh(old_e)
        new_e = {**old_e, **_edges([("newbie", "n0_01"), ("newbie", "n0_02")])}
        new_h = _update(old_h, old_e, new_e, _nodes(old_e), _nodes(new_e))
        assert_hierarchy(new_h, _nodes(new_e))
        holding = [p for p in new_h.values() if "newbie" in p.members]
        assert all("n0_01" in p.members or "n0_02" in p.members for p in holding)
        for cid, p in old_h.items():
            if "n0_01" not in p.members and "n0_02" not in p.members:
                assert new_h[cid].members == p.members

    def test_a_removed_entity_leaves_every_level_and_empty_communities_go(self) -> None:
        old_e = _edges([("a", "b"), ("b", "c"), ("x", "y")])
        old_h = _fresh(old_e)
        new_e = {k: v for k, v in old_e.items() if "x" not in k and "y" not in k}
        new_h = _update(old_h, old_e, new_e, _nodes(old_e), _nodes(new_e))
        assert_hierarchy(new_h, _nodes(new_e))
        assert not any("x" in p.members for p in new_h.values())

    def test_isolated_newcomers_join_the_community_of_what_shares_their_unit(self) -> None:
        old_e = _big_graph()
        old_h = _fresh(old_e)
        iso = Isolated({"quiet": ["n2_05", "n2_05"], "alone": []}, {"quiet": "u1", "alone": "u2"})
        new_h = _update(old_h, old_e, old_e, _nodes(old_e), _nodes(old_e) | {"quiet", "alone"}, iso)
        assert_hierarchy(new_h, _nodes(old_e) | {"quiet", "alone"})
        deepest = max((p for p in new_h.values() if "n2_05" in p.members), key=lambda p: p.level)
        assert "quiet" in deepest.members
        assert any(p.members == ["alone"] and p.parent is None for p in new_h.values())

    @settings(max_examples=40, deadline=None)
    @given(seed=st.integers(0, 10_000), steps=st.integers(1, 4))
    def test_random_changes_keep_every_level_a_partition(self, seed: int, steps: int) -> None:
        rng = random.Random(seed)
        edges = _edges((f"v{rng.randrange(40)}", f"v{rng.randrange(40)}") for _ in range(120))
        h = _fresh(edges)
        universe = _nodes(edges)
        for step in range(steps):
            new_e = dict(edges)
            for _ in range(rng.randrange(1, 6)):  # new nodes wired into the graph
                n = f"w{step}_{rng.randrange(1000)}"
                for _ in range(rng.randrange(1, 4)):
                    new_e[tuple(sorted((n, rng.choice(sorted(universe)))))] = 1.0  # type: ignore[index]
            for k in rng.sample(sorted(new_e), k=min(len(new_e), rng.randrange(0, 8))):
                del new_e[k]  # removed edges (and with them, maybe, whole nodes)
            for k in rng.sample(sorted(new_e), k=min(len(new_e), 3)):
                new_e[k] = 2.5  # reweighted edges
            new_universe = _nodes(new_e)
            h = _update(h, edges, new_e, universe, new_universe)
            assert_hierarchy(h, new_universe)
            edges, universe = new_e, new_universe


def _topics(n_big: int = 3, n_small: int = 30, seed: int = 3) -> tuple[Edges, Docs]:
    """`n_big` dense clusters of 12 entities, each the subject of three articles in its own
    folder, and `n_small` pairs linked to nothing, each mentioned in one of those articles."""
    rng = random.Random(seed)
    pairs: list[tuple[str, str]] = []
    docs: dict[str, tuple[str, ...]] = {}
    for c in range(n_big):
        nodes = [f"b{c}_{i:02d}" for i in range(12)]
        pairs += [(a, b) for a, b in itertools.combinations(nodes, 2) if rng.random() < 0.5]
        pairs += list(itertools.pairwise(nodes))
        for i, n in enumerate(nodes):
            docs[n] = (f"topic{c}/article{i % 3}.md",)
    for k in range(n_small):
        pairs.append((f"s{k:02d}a", f"s{k:02d}b"))
        docs[f"s{k:02d}a"] = docs[f"s{k:02d}b"] = (f"topic{k % n_big}/article{k % 3}.md",)
    return _edges(pairs), docs


def _top_of(h: dict[str, Placement], entity: str) -> Placement:
    return next(p for p in h.values() if p.parent is None and entity in p.members)


def _with_top(n: int, **kw: int) -> ClusterParams:
    return dataclasses.replace(PARAMS, max_top=n, **kw)


class TestBoundedTop:
    """More top-level candidates than `max_top`: the largest stand, the rest are grafted under
    the one they share documents with (canopy.indexer.operations.grouping), and every invariant
    still holds."""

    def test_small_components_graft_under_the_community_of_their_documents(self) -> None:
        edges, docs = _topics()
        h = _fresh(edges, params=_with_top(3), documents=docs)
        assert_hierarchy(h, _nodes(edges))
        assert len([p for p in h.values() if p.parent is None]) == 3
        for k in range(30):
            top = _top_of(h, f"s{k:02d}a")
            assert f"b{k % 3}_00" in top.members
            pair = next(p for p in h.values() if p.members == [f"s{k:02d}a", f"s{k:02d}b"])
            assert pair.level == 1 and pair.parent == top.id

    def test_a_top_within_the_bound_is_left_as_clustered(self) -> None:
        edges, docs = _topics()
        unbounded = _fresh(edges)
        assert len([p for p in unbounded.values() if p.parent is None]) == 33
        assert _fresh(edges, params=_with_top(33), documents=docs) == unbounded

    def test_a_leaf_that_gains_a_child_gets_its_own_members_as_another(self) -> None:
        edges = _edges([("a", "b"), ("b", "c"), ("a", "c"), ("x", "y"), ("y", "z"), ("x", "z"),
                        ("p", "q")])
        docs = {n: ("d1.md",) for n in "abcpq"} | {n: ("d2.md",) for n in "xyz"}
        h = _fresh(edges, params=_with_top(2), documents=docs)
        assert_hierarchy(h, _nodes(edges))
        top = _top_of(h, "a")
        assert top.members == ["a", "b", "c", "p", "q"]
        assert sorted(p.members for p in h.values() if p.parent == top.id) == [
            ["a", "b", "c"], ["p", "q"]]

    def test_orphans_join_the_top_of_the_nearest_document_in_path_order(self) -> None:
        edges = _edges([("a", "b"), ("b", "c"), ("a", "c"), ("x", "y"), ("y", "z"), ("x", "z"),
                        ("p", "q"), ("u", "v")])
        docs = ({n: ("a.md",) for n in "abc"} | {n: ("z.md",) for n in "xyz"}
                | {n: ("b.md",) for n in "pq"} | {n: ("y.md",) for n in "uv"})
        h = _fresh(edges, params=_with_top(2), documents=docs)
        assert_hierarchy(h, _nodes(edges))
        assert "p" in _top_of(h, "a").members and "u" in _top_of(h, "x").members

    def test_a_shared_text_unit_outweighs_a_larger_community_in_the_same_document(
            self) -> None:
        """In a book (one document) the passage decides; the document alone would send every
        small component under the largest community."""
        edges = _edges([*itertools.combinations("abcd", 2), ("x", "y"), ("y", "z"), ("x", "z"),
                        ("p", "q")])
        docs = ({n: ("book.md#1",) for n in "abcd"} | {n: ("book.md#2",) for n in "xyz"}
                | {n: ("book.md#2",) for n in "pq"})
        h = _fresh(edges, params=_with_top(2), documents=docs)
        assert "p" in _top_of(h, "x").members
        whole_book = {n: ("book.md",) for n in docs}
        h = _fresh(edges, params=_with_top(2), documents=whole_book)
        assert "p" in _top_of(h, "a").members

    def test_grafted_subtrees_are_cut_at_max_levels(self) -> None:
        edges, docs = _topics(n_big=2, n_small=0)
        h = _fresh(edges, params=_with_top(1, max_levels=2), documents=docs)
        assert_hierarchy(h, _nodes(edges))
        assert len([p for p in h.values() if p.parent is None]) == 1
        assert max(p.level for p in h.values()) == 1

    def test_an_update_grafts_new_small_components_while_the_top_is_full(self) -> None:
        old_e, docs = _topics()
        old_h = _fresh(old_e, params=_with_top(3), documents=docs)
        new_e = {**old_e, **_edges([("n1", "n2"), ("o1", "o2")])}
        docs = {**docs, "n1": ("topic1/article2.md",), "n2": ("topic1/article2.md",),
                "o1": ("topic2/zz-new.md",), "o2": ("topic2/zz-new.md",), "loner": ("t0.md",)}
        iso = Isolated({"loner": []}, {"loner": "u9"})
        new_h = _update(old_h, old_e, new_e, _nodes(old_e), _nodes(new_e) | {"loner"}, iso,
                        params=_with_top(3), documents=docs)
        assert_hierarchy(new_h, _nodes(new_e) | {"loner"})
        assert len([p for p in new_h.values() if p.parent is None]) == 3
        assert {"b1_00", "n1"} <= set(_top_of(new_h, "n2").members)
        assert "b2_00" in _top_of(new_h, "o1").members  # nearest path: topic2/article2.md
        assert "b0_00" in _top_of(new_h, "loner").members  # nearest path: topic0/article2.md

    def test_an_update_with_room_at_the_top_keeps_new_components_there(self) -> None:
        old_e, docs = _topics(n_small=0)
        old_h = _fresh(old_e, params=_with_top(4), documents=docs)
        new_e = {**old_e, **_edges([("n1", "n2")])}
        docs = {**docs, "n1": ("topic1/article2.md",), "n2": ("topic1/article2.md",)}
        new_h = _update(old_h, old_e, new_e, _nodes(old_e), _nodes(new_e),
                        params=_with_top(4), documents=docs)
        assert _top_of(new_h, "n1").members == ["n1", "n2"]

    @settings(max_examples=30, deadline=None)
    @given(seed=st.integers(0, 10_000), steps=st.integers(1, 3))
    def test_random_updates_keep_the_top_bounded_and_every_level_a_partition(
            self, seed: int, steps: int) -> None:
        rng = random.Random(seed)
        params = _with_top(rng.randrange(1, 6))
        folders = ["a", "b", "c", "d"]

        def doc() -> tuple[str, ...]:
            return (f"{rng.choice(folders)}/{rng.randrange(6)}.md",)

        edges = _edges((f"v{rng.randrange(60)}", f"v{rng.randrange(60)}") for _ in range(45))
        docs = {n: doc() for n in _nodes(edges)}
        h = _fresh(edges, params=params, documents=docs)
        universe = _nodes(edges)
        assert_hierarchy(h, universe)
        assert len([p for p in h.values() if p.parent is None]) <= params.max_top
        for step in range(steps):
            new_e = dict(edges)
            for i in range(rng.randrange(1, 6)):  # new small components and newcomers
                a, b = f"w{step}_{i}", rng.choice([f"x{step}_{i}", *sorted(universe)])
                new_e[tuple(sorted((a, b)))] = 1.0  # type: ignore[index]
            for k in rng.sample(sorted(new_e), k=min(len(new_e), rng.randrange(0, 6))):
                del new_e[k]
            new_universe = _nodes(new_e)
            docs |= {n: doc() for n in new_universe - set(docs)}
            h = _update(h, edges, new_e, universe, new_universe, params=params, documents=docs)
            assert_hierarchy(h, new_universe)
            assert len([p for p in h.values() if p.parent is None]) <= params.max_top
            edges, universe = new_e, new_universe


def test_modularity_from_aggregates_matches_its_definition() -> None:
    # two triangles joined by one edge, split into the two triangles
    w_in, degrees, m = 6.0, [7.0, 7.0], 7.0
    assert (
        abs(modularity(w_in, sum(d * d for d in degrees), m) - (6 / 7 - 2 * (7 / 14) ** 2)) < 1e-12
    )


def test_is_partition_rejects_overlap_and_gaps() -> None:
    assert not is_partition([("a", "b"), ("b", "c")], {"a", "b", "c"})
    assert not is_partition([("a",)], {"a", "b"})
    assert is_partition([("a",), ("b",)], {"a", "b"})


def test_root_aggregates_of_two_disconnected_triangles() -> None:
    """Each triangle is one root: internal weight 3, degree 6; the guard's modularity is 1/2."""
    from canopy.indexer.operations.clustering import root_aggregates

    triangles = [("a", "b", 1.0), ("b", "c", 1.0), ("a", "c", 1.0),
                 ("x", "y", 1.0), ("y", "z", 1.0), ("x", "z", 1.0)]
    edges = EdgeArrays(triangles)
    h = build_hierarchy(edges, NO_ISOLATED, PARAMS)
    agg = root_aggregates(edges, h)
    assert sorted(agg.per_root.values()) == [(3.0, 6.0), (3.0, 6.0)]
    assert (agg.m_total, agg.s_in, agg.s_d2) == (6.0, 6.0, 72.0)
    assert agg.modularity == 0.5
