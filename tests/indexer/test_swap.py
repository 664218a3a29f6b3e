"""Edits are swapped atomically, deletions apply at once (issue 14, item 5; design §2, §8).

While `watch` applies an update, readers keep answering from the committed generation: an edited
document is answerable at every moment (its old version until the new one commits, then the new
one), and a deleted document is never served once the revocation commit is in, even while the
rest of the update is still being written.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from canopy.ids import entity_key
from canopy.indexer.pipeline import run_index
from canopy.indexer.watcher import Watcher
from canopy.providers import make_embedder
from canopy.providers.builtin import BuiltinProvider
from canopy.server.engines import basic_search
from canopy.server.results import SearchResult
from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.store import Store
from tests.conftest import EXAMPLES

NOTES = "notes.md"
FACT = "Quillon Varnet audits the Helio Cells plant in Shenzhen every March."
QUESTION = "Who audits the Helio Cells plant every March?"


class SlowReports(BuiltinProvider):
    """The builtin provider with slow reports, so an update spends seconds after its revocation
    commit (if any) and before its final one: the window readers must be safe in."""

    async def report(self, context: Any, *, max_tokens: int) -> Any:
        await asyncio.sleep(0.05)
        return await super().report(context, max_tokens=max_tokens)


def _update(ws: Workspace) -> None:
    store = ws.store()
    try:
        asyncio.run(run_index(ws.docs_dir, store, ws.settings, SlowReports(),
                              make_embedder(ws.settings), labeler=ws.policy.labels_for))
    finally:
        store.close()


@pytest.fixture
def indexed(tmp_path: Path) -> Workspace:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    (docs / NOTES).write_text(f"# Audit notes\n\n{FACT}\n\nThe audit covers cell chemistry.\n",
                              encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    return ws


def _ask(service: CanopyService) -> SearchResult:
    return asyncio.run(service.run(None, lambda c: basic_search(c, QUESTION, k=5)))


def _watch(ws: Workspace, applied: list[Any]) -> Watcher:
    return Watcher(ws.docs_dir, ws.index_dir, lambda: _update(ws), debounce=0.2,
                   on_applied=lambda paths, r: applied.append(r)).start()


def test_an_edited_document_is_answerable_at_every_moment_while_watch_applies_the_edit(
        indexed: Workspace) -> None:
    service = CanopyService(indexed)
    applied: list[Any] = []
    watcher = _watch(indexed, applied)
    try:
        assert NOTES in {c.document for c in _ask(service).citations}
        (indexed.docs_dir / NOTES).write_text(
            f"# Audit notes\n\n{FACT} The March audit now includes the separator line.\n\n"
            "The audit covers cell chemistry and Tern pack assembly.\n", encoding="utf-8")
        asked, generations = 0, set()
        deadline = time.monotonic() + 60
        while not applied and time.monotonic() < deadline:
            result = _ask(service)
            asked += 1
            generations.add(service.store.generation)
            assert NOTES in {c.document for c in result.citations}, f"missing after {asked} asks"
            assert "Quillon Varnet" in result.context
        assert applied, "the watcher never applied the edit"
        assert asked >= 3  # the update took long enough to be asked during it
        after = _ask(service)
        assert "separator line" in after.context  # the new version, once committed
    finally:
        watcher.stop()
        service.close()


def test_a_deleted_document_is_never_served_once_the_revocation_commits(indexed: Workspace) -> None:
    service = CanopyService(indexed)
    before = service.store.generation
    applied: list[Any] = []
    watcher = _watch(indexed, applied)
    try:
        assert NOTES in {c.document for c in _ask(service).citations}
        (indexed.docs_dir / NOTES).unlink()
        deadline = time.monotonic() + 60
        while service.store.generation == before and time.monotonic() < deadline:
            time.sleep(0.01)
        revoked = Store(indexed.index_dir)
        try:
            assert revoked.get_meta("revoking") == "1" or applied  # the revocation commit
        finally:
            revoked.close()
        asked = 0
        while time.monotonic() < deadline:
            result = _ask(service)
            asked += 1
            assert NOTES not in {c.document for c in result.citations}
            assert "Quillon" not in result.context and "Quillon" not in result.answer
            if applied:
                break
        assert applied and asked >= 2
    finally:
        watcher.stop()
        service.close()


def test_readers_see_one_generation_per_request_while_an_update_commits(indexed: Workspace) -> None:
    """A request pins its snapshot: generations committed meanwhile do not leak into it."""
    service = CanopyService(indexed)
    try:
        with service.context(None) as ctx:
            pinned = ctx.reader.generation
            (indexed.docs_dir / "extra.md").write_text(
                "# Extra\n\nOrla Dunmere joined Helio Cells.", encoding="utf-8"
            )
            thread = threading.Thread(target=_update, args=(indexed,))
            thread.start()
            thread.join()
            assert service.store.generation > pinned
            assert ctx.reader.generation == pinned
            assert not ctx.reader.entity_ids_by_key([entity_key("Orla Dunmere")])
        with service.context(None) as ctx:
            assert ctx.reader.entity_ids_by_key([entity_key("Orla Dunmere")])
    finally:
        service.close()


def test_calls_side_by_side_on_one_event_loop_each_read_their_own_generation(
        indexed: Workspace) -> None:
    """Calls run as tasks on the service's event loops: while one waits, another runs on the
    same thread. Each pins the generation it started on, in SQLite and in the search tables,
    whatever the other read meanwhile."""
    service = CanopyService(indexed, loops=1)
    started = threading.Event()
    release: dict[str, asyncio.Event] = {}
    threads: list[int] = []

    async def older(ctx: Any) -> tuple[int, bool, SearchResult]:
        threads.append(threading.get_ident())
        generation = ctx.reader.generation
        release["older"] = asyncio.Event()
        started.set()
        await release["older"].wait()  # the newer call runs meanwhile, on this loop
        found = bool(ctx.reader.entity_ids_by_key([entity_key("Orla Dunmere")]))
        return generation, found, await basic_search(ctx, "Who joined Helio Cells?", k=5)

    async def newer(ctx: Any) -> tuple[int, bool, SearchResult]:
        threads.append(threading.get_ident())
        result = await basic_search(ctx, "Who joined Helio Cells?", k=5)
        found = bool(ctx.reader.entity_ids_by_key([entity_key("Orla Dunmere")]))
        release["older"].set()
        return ctx.reader.generation, found, result

    async def main() -> tuple[Any, Any]:
        first = asyncio.ensure_future(service.run(None, older))
        assert await asyncio.to_thread(started.wait, 30)
        (indexed.docs_dir / "extra.md").write_text(
            "# Extra\n\nOrla Dunmere joined Helio Cells.", encoding="utf-8")
        await asyncio.to_thread(_update, indexed)
        second = await asyncio.wait_for(service.run(None, newer), 30)
        return await asyncio.wait_for(first, 30), second

    try:
        (gen_old, found_old, old), (gen_new, found_new, new) = asyncio.run(main())
    finally:
        service.close()
    assert len(set(threads)) == 1  # both calls ran on the one loop's thread
    assert gen_new > gen_old
    assert found_new and not found_old
    assert "extra.md" in {c.document for c in new.citations}
    assert "extra.md" not in {c.document for c in old.citations}
    assert "Orla" not in old.context
