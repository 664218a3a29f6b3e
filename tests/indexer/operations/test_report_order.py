"""The order reports are written in (canopy.indexer.operations.report_order): bottom-up, by id
within a level, in chunks bounded by communities and by members; the plan by height, each chunk
after the chunks holding its children."""

from __future__ import annotations

from canopy.indexer.operations.report_order import (
    ReportChunk,
    by_member_budget,
    levels_deepest_first,
    report_batches,
    report_plan,
)


def test_levels_come_deepest_first_with_their_communities_by_id() -> None:
    assert levels_deepest_first({0: {"r2", "r1"}, 2: {"c"}, 1: {"b", "a"}}) == [
        (2, ["c"]), (1, ["a", "b"]), (0, ["r1", "r2"])]


def test_batches_keep_the_order_and_hold_at_most_the_bound() -> None:
    ids = [f"c{i:02d}" for i in range(7)]
    batches = list(report_batches(ids, 3))
    assert batches == [ids[0:3], ids[3:6], ids[6:7]]
    assert list(report_batches([], 3)) == []


def test_a_chunk_is_cut_before_the_community_that_would_pass_the_member_budget() -> None:
    members = {"a": 4, "b": 4, "c": 3, "d": 1}
    assert list(by_member_budget(["a", "b", "c", "d"], members, 8)) == [["a", "b"], ["c", "d"]]


def test_a_community_larger_than_the_budget_is_a_chunk_of_its_own() -> None:
    members = {"small": 1, "huge": 50, "tail": 1}
    assert list(by_member_budget(["small", "huge", "tail"], members, 10)) == [
        ["small"], ["huge"], ["tail"]]


def test_a_community_of_unknown_size_counts_nothing() -> None:
    assert list(by_member_budget(["x", "y"], {}, 1)) == [["x", "y"]]


# A tree: root R (level 0) over A and B (level 1); A over a1, a2 (level 2), B over b1 (level 2);
# L is a level-0 community with no children.
_PARENT = {"R": None, "L": None, "A": "R", "B": "R", "a1": "A", "a2": "A", "b1": "B"}
_LEVELS = {0: {"R", "L"}, 1: {"A", "B"}, 2: {"a1", "a2", "b1"}}


def _plan(levels: dict[int, set[str]], size: int = 2, members: dict[str, int] | None = None,
          max_members: int = 100) -> list[ReportChunk]:
    return report_plan(levels, _PARENT, members or {}, size, max_members)


def test_the_plan_goes_by_height_so_a_childless_top_community_goes_with_the_leaves() -> None:
    plan = _plan(_LEVELS, size=10)
    assert [(c.height, c.ids) for c in plan] == [
        (0, ("a1", "a2", "b1", "L")), (1, ("A", "B")), (2, ("R",))]
    assert [c.after for c in plan] == [(), (0,), (1,)]


def test_each_chunk_waits_for_exactly_the_chunks_holding_its_children() -> None:
    plan = _plan(_LEVELS, size=2)
    assert [c.ids for c in plan] == [("a1", "a2"), ("b1", "L"), ("A", "B"), ("R",)]
    assert [c.after for c in plan] == [(), (), (0, 1), (2,)]
    one = _plan(_LEVELS, size=1)  # A waits for a1's and a2's chunks, not for b1's
    at = {c.ids[0]: i for i, c in enumerate(one)}
    assert one[at["A"]].after == (at["a1"], at["a2"]) and one[at["B"]].after == (at["b1"],)
    for i, chunk in enumerate(one):  # never before a chunk of a child
        kids = {k for k, p in _PARENT.items() if p in chunk.ids}
        assert all(at[k] < i for k in kids)


def test_children_not_rewritten_are_waited_for_by_nobody() -> None:
    # an edit under A: a1, A and R are rewritten; a2, B, b1 keep their reports
    plan = _plan({0: {"R"}, 1: {"A"}, 2: {"a1"}}, size=10)
    assert [(c.ids, c.after, c.height) for c in plan] == [
        (("a1",), (), 0), (("A",), (0,), 1), (("R",), (1,), 2)]


def test_the_plan_keeps_the_member_budget_per_chunk() -> None:
    members = {"a1": 6, "a2": 6, "b1": 1, "L": 1, "A": 12, "B": 1, "R": 14}
    plan = _plan(_LEVELS, size=10, members=members, max_members=8)
    assert [c.ids for c in plan] == [("a1",), ("a2", "b1", "L"), ("A",), ("B",), ("R",)]
    assert all(sum(members[i] for i in c.ids) <= 8 or len(c.ids) == 1 for c in plan)
