"""The graph stage's batches: their summaries awaited together, their rows staged in order;
entities' and relationships' summaries asked in one wave."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from canopy.indexer.pipeline import run_index
from canopy.indexer.stages import graph
from canopy.providers import make_embedder
from canopy.providers.builtin import BuiltinProvider
from canopy.server.runtime import open_workspace
from canopy.store import Staging
from tests.conftest import EXAMPLES


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


class HeldSummaries(BuiltinProvider):
    """Every summary waits until the build has nothing else to do, then all are released:
    what was asked and written by then is what the merge does while its requests run."""

    in_process = False  # its summaries wait, as an endpoint's do

    def __init__(self) -> None:
        super().__init__()
        self.asked_before_release: list[str] = []
        self.released = False
        self._go: asyncio.Event | None = None

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        if self._go is None:
            self._go = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, self._release)
        if not self.released:
            self.asked_before_release.append(name)
        await self._go.wait()
        return await super().summarize(name, descriptions, max_tokens=max_tokens)

    def _release(self) -> None:
        self.released = True
        assert self._go is not None
        self._go.set()


def test_entity_and_relationship_summaries_are_asked_together_and_other_rows_written_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: one wave of summary requests (a relationship's does not wait for the entities'
    replies), and the rows that need no summary are staged while the requests run."""
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    provider = HeldSummaries()
    staged_before_release: dict[str, int] = {}
    real_put = Staging.put

    def put(self: Staging, table: str, rows: Any) -> None:
        rows = list(rows)
        if not provider.released and provider._go is not None:
            staged_before_release[table] = staged_before_release.get(table, 0) + len(rows)
        real_put(self, table, rows)

    monkeypatch.setattr(Staging, "put", put)
    ws = open_workspace(docs, index_dir=tmp_path / "index")
    store = ws.store()
    try:
        asyncio.run(run_index(docs, store, ws.settings, provider, make_embedder(ws.settings),
                              labeler=ws.policy.labels_for))
    finally:
        store.close()
    asked = provider.asked_before_release
    assert any(" -- " in name for name in asked), asked  # a relationship's summary
    assert any(" -- " not in name for name in asked), asked  # an entity's
    assert staged_before_release.get("entities", 0) > 0
    assert staged_before_release.get("relationships", 0) > 0
