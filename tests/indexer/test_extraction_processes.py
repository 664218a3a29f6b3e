"""The builtin provider's CPU work in worker processes (canopy.providers.builtin.processes):
the index it builds is the in-process one (its search rows and vectors too), a worker that dies
costs its units (recorded, retried by the next run) or its share of an embedding call (hashed
in the writer) and nothing else, and a script without a `__main__` guard builds once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from canopy.providers.builtin import processes
from canopy.providers.builtin.embedder import HashEmbedder
from canopy.providers.builtin.processes import (
    AUTO_MIN_TEXTS,
    AUTO_MIN_UNITS,
    ProcessEmbedder,
    cores,
    embedding_processes,
    extraction_processes,
)
from canopy.server.runtime import build_index, open_workspace
from canopy.vectors import TABLES
from tests.conftest import EXAMPLES, REPO
from tests.indexer.test_incremental import canonical


def search_rows(index_dir: Path) -> dict[str, list[tuple[object, ...]]]:
    import lancedb

    db = lancedb.connect(str(index_dir / "lance"))
    return {name: sorted((r["id"], r["hash"], r["text"], tuple(r["vector"]), r["level"])
                         for r in db.open_table(name).to_arrow().to_pylist())
            for name in TABLES}


def started_workers(monkeypatch: pytest.MonkeyPatch) -> list[processes._Worker]:
    """The worker processes started from now on (each with its process)."""
    started: list[processes._Worker] = []
    start = processes._Worker.start

    async def counted() -> processes._Worker:
        w = await start()
        started.append(w)
        return w

    monkeypatch.setattr(processes._Worker, "start", staticmethod(counted))
    return started


def _docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    return docs


def test_how_many_workers_a_run_gets() -> None:
    assert extraction_processes(None, 0) == 0
    assert extraction_processes(None, AUTO_MIN_UNITS - 1) == 0  # a small update stays in
    assert extraction_processes(None, AUTO_MIN_UNITS) == (cores() if cores() > 1 else 0)
    assert extraction_processes(1, 10_000) == 0
    assert extraction_processes(3, 5) == 3
    assert extraction_processes(3, 0) == 0
    assert embedding_processes(None, AUTO_MIN_TEXTS - 1) == 0
    assert embedding_processes(None, AUTO_MIN_TEXTS) == (cores() if cores() > 1 else 0)
    assert embedding_processes(1, 10**6) == 0 and embedding_processes(2, 3) == 2


def test_worker_processes_build_the_in_process_index(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    inproc = build_index(open_workspace(docs, index_dir=tmp_path / "a", extract={"processes": 1}))
    monkeypatch.setattr(processes, "MIN_EMBED_TEXTS", 4)  # the examples' calls are small
    started = started_workers(monkeypatch)
    tasks: list[str] = []
    run = processes.WorkerPool.run

    async def spied(self: processes.WorkerPool, task: str, *args: object) -> object:
        tasks.append(task)
        return await run(self, task, *args)

    monkeypatch.setattr(processes.WorkerPool, "run", spied)
    workers = build_index(open_workspace(docs, index_dir=tmp_path / "b",
                                         extract={"processes": 2}))
    # one pool for the run: extraction's workers summarize and hash the vectors too
    assert len(started) == 2
    assert {"extract", "describe", "embed"} <= set(tasks)
    assert workers.usage["summarize"]["calls"] == inproc.usage["summarize"]["calls"] > 0
    assert all(w.proc.returncode == 0 for w in started)
    assert workers.stats["units_extracted"] == inproc.stats["units_extracted"] > 0
    assert workers.failures == [] and inproc.failures == []
    assert workers.usage["extract"]["calls"] == inproc.usage["extract"]["calls"] > 0
    assert canonical(tmp_path / "b") == canonical(tmp_path / "a")
    assert search_rows(tmp_path / "b") == search_rows(tmp_path / "a")


def test_an_embedding_worker_that_dies_leaves_its_share_to_the_writer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    texts = [f"Helio Cells supplies cell {i} to Marrowby Works in Skelwick" for i in range(300)]
    local = HashEmbedder()
    want = local.embed_sync(texts)

    async def embed() -> tuple[object, int]:
        e = ProcessEmbedder(local, processes.WorkerPool(2))
        try:
            return await e.embed(texts), e.pool.tasks
        finally:
            await e.pool.close()

    got, tasks = asyncio.run(embed())
    assert tasks == 2 and (got == want).all()  # type: ignore[union-attr]
    monkeypatch.setattr(processes, "_WORKER_MAIN", "import sys; sys.exit(3)")
    got, tasks = asyncio.run(embed())
    assert tasks == 2 and (got == want).all()  # type: ignore[union-attr]


def test_a_dead_worker_costs_its_units_and_the_next_run_extracts_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    ws = open_workspace(docs, index_dir=tmp_path / "idx", extract={"processes": 2})
    # workers that end before they answer (killed, out of memory)
    monkeypatch.setattr(processes, "_WORKER_MAIN", "import sys; sys.exit(3)")
    first = build_index(ws)
    assert first.failures and {f.task for f in first.failures} == {"extract"}
    assert all("worker process ended" in f.error for f in first.failures)
    monkeypatch.undo()
    second = build_index(ws)
    assert second.failures == []
    assert second.stats["units_extracted"] == len(first.failures)
    fresh = build_index(open_workspace(docs, index_dir=tmp_path / "fresh",
                                       extract={"processes": 1}))
    assert fresh.failures == []
    assert canonical(tmp_path / "idx") == canonical(tmp_path / "fresh")


def test_a_script_without_a_main_guard_builds_once(tmp_path: Path) -> None:
    """multiprocessing's spawned children re-run the caller's script: the workers must not."""
    docs = _docs(tmp_path)
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from canopy.server.runtime import build_index, open_workspace
        ws = open_workspace(Path({str(docs)!r}), index_dir=Path({str(tmp_path / "idx")!r}),
                            extract={{"processes": 2}})
        r = build_index(ws)
        print("built", r.stats["units_extracted"], len(r.failures))
    """), encoding="utf-8")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300, check=True)
    assert out.stdout.count("built") == 1
    built = out.stdout.split()
    assert int(built[1]) > 0 and built[2] == "0"


def test_a_task_that_fails_in_a_worker_leaves_the_worker_serving() -> None:
    import asyncio

    from canopy.errors import ProviderError

    async def run() -> tuple[str, object, int]:
        pool = processes.WorkerPool(1)
        try:
            with pytest.raises(ProviderError, match="worker process failed") as failed:
                await pool.run("embed", 384, "not-this-embedder", ["a text"])
            got = await pool.run("embed", 384, HashEmbedder(384).name, ["a text"])
            return str(failed.value), got, pool._alive
        finally:
            await pool.close()

    message, got, workers = asyncio.run(run())
    assert "not-this-embedder" in message
    assert workers == 1 and (got == HashEmbedder(384).embed_sync(["a text"])).all()  # type: ignore[union-attr]
