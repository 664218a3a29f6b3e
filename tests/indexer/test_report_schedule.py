"""The reports stage's schedule (canopy.indexer.stages.reports._in_plan_order): a chunk starts as
soon as the chunks it comes after are written, not when its children's whole level is."""

from __future__ import annotations

import asyncio

import pytest

from canopy.indexer.operations.report_order import ReportChunk, report_plan
from canopy.indexer.stages.reports import _in_plan_order

# R over A (over a1) and B (over b1, b2); b2 is slow to write.
_PARENT = {"R": None, "A": "R", "B": "R", "a1": "A", "b1": "B", "b2": "B"}
_LEVELS = {0: {"R"}, 1: {"A", "B"}, 2: {"a1", "b1", "b2"}}


def _run(plan: list[ReportChunk], slow: str, limit: int = 100,
         members: dict[str, int] | None = None) -> tuple[list[str], list[str], int]:
    started: list[str] = []  # "start X" and "end X", in the order they happened
    finished: list[str] = []
    running = most = 0

    async def write(chunk: ReportChunk) -> None:
        nonlocal running, most
        running += sum((members or {}).get(c, 0) for c in chunk.ids)
        most = max(most, running)
        started.extend(f"start {c}" for c in chunk.ids)
        await asyncio.sleep(0.05 if slow in chunk.ids else 0)
        started.extend(f"end {c}" for c in chunk.ids)
        finished.extend(chunk.ids)
        running -= sum((members or {}).get(c, 0) for c in chunk.ids)

    asyncio.run(_in_plan_order(plan, members or {}, write, limit))
    return started, finished, most


def test_a_parent_starts_while_a_chunk_of_its_childrens_height_is_still_written() -> None:
    plan = report_plan(_LEVELS, _PARENT, {}, 1, 100)
    log = _run(plan, slow="b2")[0]
    # A needs only a1: it is written before b2, a leaf like a1, is done
    assert log.index("start A") < log.index("end b2")
    for parent, kids in (("A", ["a1"]), ("B", ["b1", "b2"]), ("R", ["A", "B"])):
        assert all(log.index(f"end {k}") < log.index(f"start {parent}") for k in kids)
    assert log[-1] == "end R"


def test_chunks_in_progress_keep_to_the_member_budget() -> None:
    members = {"a1": 5, "b1": 5, "b2": 5, "A": 1, "B": 1, "R": 1}
    plan = report_plan(_LEVELS, _PARENT, members, 1, 100)
    _, finished, most = _run(plan, slow="b1", limit=10, members=members)
    assert most <= 10 and sorted(finished) == sorted(_PARENT)


def test_a_failed_chunk_is_raised_and_cancels_the_rest() -> None:
    plan = report_plan(_LEVELS, _PARENT, {}, 1, 100)
    cancelled: list[str] = []

    async def write(chunk: ReportChunk) -> None:
        try:
            if chunk.ids == ("a1",):
                raise RuntimeError("endpoint gone")
            await asyncio.sleep(1)
        except asyncio.CancelledError:
            cancelled.extend(chunk.ids)
            raise

    with pytest.raises(RuntimeError, match="endpoint gone"):
        asyncio.run(_in_plan_order(plan, {}, write, 100))
    assert sorted(cancelled) == ["b1", "b2"]  # the others never started
