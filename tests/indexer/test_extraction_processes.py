"""The builtin provider's extraction in worker processes (canopy.providers.builtin.processes):
the index it builds is the in-process one, a worker that dies costs its units (recorded,
retried by the next run) and nothing else, and a script without a `__main__` guard builds once."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from canopy.providers.builtin import processes
from canopy.providers.builtin.processes import AUTO_MIN_UNITS, cores, extraction_processes
from canopy.server.runtime import build_index, open_workspace
from tests.conftest import EXAMPLES, REPO
from tests.indexer.test_incremental import canonical


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


def test_worker_processes_build_the_in_process_index(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    docs = _docs(tmp_path)
    inproc = build_index(open_workspace(docs, index_dir=tmp_path / "a", extract={"processes": 1}))
    started: list[object] = []
    start = processes._Worker.start

    async def counted() -> processes._Worker:
        w = await start()
        started.append(w)
        return w

    monkeypatch.setattr(processes._Worker, "start", staticmethod(counted))
    workers = build_index(open_workspace(docs, index_dir=tmp_path / "b",
                                         extract={"processes": 2}))
    assert len(started) == 2
    assert all(w.proc.returncode == 0 for w in started)  # type: ignore[attr-defined]
    assert workers.stats["units_extracted"] == inproc.stats["units_extracted"] > 0
    assert workers.failures == [] and inproc.failures == []
    assert workers.usage["extract"]["calls"] == inproc.usage["extract"]["calls"] > 0
    assert canonical(tmp_path / "b") == canonical(tmp_path / "a")


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
