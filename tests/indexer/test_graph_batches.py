"""The graph stage's batches: their summaries awaited together, their rows staged in order."""

from __future__ import annotations

import asyncio

import pytest

from canopy.indexer.stages import graph


def test_batches_overlap_up_to_the_bound_and_are_staged_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph, "_BATCH", 2)
    running, most, staged = 0, 0, []

    async def merged(batch: list[str]) -> list[str]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01 if batch[0] == "a" else 0)  # the first batch finishes last
        running -= 1
        return batch

    asyncio.run(graph._overlapped(list("abcdefghij"), merged, staged.append))
    assert staged == [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"], ["i", "j"]]
    assert most == graph._BATCHES_IN_FLIGHT


def test_a_failed_batch_cancels_the_others_and_stages_nothing_after_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graph, "_BATCH", 1)
    cancelled, staged = [], []

    async def merged(batch: list[str]) -> list[str]:
        try:
            if batch == ["b"]:
                raise RuntimeError("endpoint gone")
            await asyncio.sleep(0 if batch == ["a"] else 1)
            return batch
        except asyncio.CancelledError:
            cancelled.append(batch[0])
            raise

    async def run() -> None:
        await graph._overlapped(list("abcdef"), merged, staged.append)

    with pytest.raises(RuntimeError, match="endpoint gone"):
        asyncio.run(run())
    assert staged == [["a"]] and sorted(cancelled) == ["c", "d"]
