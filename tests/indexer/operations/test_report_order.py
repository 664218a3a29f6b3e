"""The order reports are written in (canopy.indexer.operations.report_order): bottom-up, by id
within a level, in chunks bounded by communities and by members."""

from __future__ import annotations

from canopy.indexer.operations.report_order import (
    by_member_budget,
    levels_deepest_first,
    report_batches,
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
