"""The search rows of text units and entities are written while the communities and reports are
computed, when the embedder runs in the process (indexer.stages.vectors.SearchRows): the rows are
those of a build that writes every table at the end, and a failure on either side ends the run
with nothing committed and nothing left running (no write, no worker process)."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest

from canopy.errors import IndexUnwritable
from canopy.indexer import pipeline
from canopy.indexer.stages import vectors as vector_stage
from canopy.providers.builtin import processes
from canopy.server.runtime import build_index, open_workspace
from canopy.vectors import VectorStore
from tests.conftest import EXAMPLES
from tests.indexer.test_extraction_processes import search_rows, started_workers


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    return docs


def _spy_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The tables VectorStore.write was called for, in order."""
    calls: list[str] = []
    write = VectorStore.write

    def spied(self: VectorStore, name: str, *args: Any) -> None:
        calls.append(name)
        write(self, name, *args)

    monkeypatch.setattr(VectorStore, "write", spied)
    return calls


def test_unit_and_entity_rows_are_written_before_the_reports_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    at_end = build_index(open_workspace(docs, index_dir=tmp_path / "end"))
    # the reference: every table written by the vectors stage, after the last report
    monkeypatch.setattr(vector_stage.SearchRows, "start_early", lambda self: False)
    late = build_index(open_workspace(docs, index_dir=tmp_path / "late"))
    monkeypatch.undo()

    calls = _spy_writes(monkeypatch)
    seen_by_reports: list[list[str]] = []
    stage_reports = pipeline.stage_reports

    async def reports_once_rows_are_in(*args: Any, **kwargs: Any) -> Any:
        # the early rows are written while this stage waits: it never gets them otherwise
        for _ in range(3000):
            if {"text_units", "entities"} <= set(calls):
                break
            await asyncio.sleep(0.01)
        seen_by_reports.append(list(calls))
        return await stage_reports(*args, **kwargs)

    monkeypatch.setattr(pipeline, "stage_reports", reports_once_rows_are_in)
    early = build_index(open_workspace(docs, index_dir=tmp_path / "early"))
    assert {"text_units", "entities"} <= set(seen_by_reports[0])
    assert "reports" not in seen_by_reports[0]
    assert calls[-1] == "reports"
    assert search_rows(tmp_path / "early") == search_rows(tmp_path / "late") \
        == search_rows(tmp_path / "end")
    assert early.stats["embedded"] == late.stats["embedded"] == at_end.stats["embedded"] > 0


def _started_workers(monkeypatch: pytest.MonkeyPatch) -> list[processes._Worker]:
    monkeypatch.setattr(processes, "MIN_EMBED_TEXTS", 4)  # the examples' calls are small
    monkeypatch.setattr(processes, "AUTO_MIN_TEXTS", 1)
    return started_workers(monkeypatch)


def test_an_early_write_that_fails_ends_the_run_with_nothing_committed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    ws = open_workspace(docs, index_dir=tmp_path / "idx", extract={"processes": 2})
    first = build_index(ws)
    (docs / "added.md").write_text("# Added\n\nHelio Cells opened a plant in Skelwick.\n",
                                   encoding="utf-8")
    started = _started_workers(monkeypatch)
    write = VectorStore.write

    def failing(self: VectorStore, name: str, *args: Any) -> None:
        if name == "entities":
            raise OSError(28, "No space left on device")
        write(self, name, *args)

    monkeypatch.setattr(VectorStore, "write", failing)
    with pytest.raises(IndexUnwritable, match="no space left"):
        build_index(ws, full=True)
    assert started and all(w.proc.returncode is not None for w in started)
    monkeypatch.undo()
    store = ws.store(must_exist=True)
    try:
        assert store.generation == first.generation
    finally:
        store.close()
    again = build_index(ws)
    assert again.failures == [] and again.generation == first.generation + 1


def test_a_failing_report_stage_leaves_no_search_rows_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    ws = open_workspace(docs, index_dir=tmp_path / "idx", extract={"processes": 2})
    started = _started_workers(monkeypatch)
    calls = _spy_writes(monkeypatch)
    early: list[asyncio.Task[None] | None] = []

    async def failing_reports(b: Any, *args: Any, **kwargs: Any) -> Any:
        for task in asyncio.all_tasks():  # the early rows' task, running beside this stage
            if "SearchRows._write" in repr(task.get_coro()):
                early.append(task)
        await asyncio.sleep(0)
        raise RuntimeError("reports failed")

    monkeypatch.setattr(pipeline, "stage_reports", failing_reports)
    with pytest.raises(RuntimeError, match="reports failed"):
        build_index(ws)
    assert early and all(t is not None and t.done() for t in early)
    n = len(calls)
    assert started and all(w.proc.returncode is not None for w in started)
    assert len(calls) == n  # nothing wrote after the run ended
    assert "reports" not in calls
