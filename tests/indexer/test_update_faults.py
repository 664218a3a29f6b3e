"""Faults during an update never lose an edit, never stop the rest of the corpus, and the next
run completes to exactly a clean build (issue 9, cases 4 and 9; design §4).

A document's new state is committed only together with all of its units, so an update that dies
(an outage, a crash) leaves the document's committed version in place and the next run sees it
as changed again. A unit whose extraction keeps failing is recorded, stays visible in status,
and is retried by the next run, while every other unit is indexed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from canopy.errors import EndpointUnavailable
from canopy.indexer.pipeline import run_index
from canopy.providers import make_embedder
from canopy.providers.builtin import BuiltinProvider
from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.status import index_status
from canopy.store import Store
from canopy.store.export import load_graph
from tests.conftest import EXAMPLES, REPO
from tests.indexer.test_incremental import assert_community_invariants, canonical


class Outage(BuiltinProvider):
    """Every extraction fails as if the endpoint were unreachable."""

    async def extract(self, unit: Any, **kw: Any) -> Any:
        raise EndpointUnavailable("LLM endpoint unreachable (test)")


class Flaky(BuiltinProvider):
    """Every third unit (by id) exhausts its retries; the rest extract normally."""

    async def extract(self, unit: Any, **kw: Any) -> Any:
        if int(unit.id[-6:], 16) % 3 == 0:
            raise EndpointUnavailable("LLM endpoint unavailable: 6 attempts failed (test)")
        return await super().extract(unit, **kw)


def _run(ws: Workspace, provider: Any) -> Any:
    store = ws.store()
    try:
        return asyncio.run(run_index(ws.docs_dir, store, ws.settings, provider,
                                     make_embedder(ws.settings), labeler=ws.policy.labels_for))
    finally:
        store.close()


def _fresh(docs: Path, index_dir: Path) -> dict[str, Any]:
    build_index(open_workspace(docs, index_dir=index_dir))
    return canonical(index_dir)


def test_an_outage_during_an_edit_keeps_the_old_version_and_the_next_run_completes_it(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    target = docs / "helio_cells.md"
    before = {d.path: d.content_hash for d in load_graph(ws.store()).documents.values()}
    target.write_text(target.read_text(encoding="utf-8")
                      + "\n\nOphelia Grantham became head of quality at Helio Cells Ltd.\n",
                      encoding="utf-8")
    with pytest.raises(EndpointUnavailable):
        _run(ws, Outage())
    store = Store(ws.index_dir)
    try:
        after = {d.path: d.content_hash for d in load_graph(store).documents.values()}
        assert after == before  # the edit is not recorded without its units
        assert not store.failures()
    finally:
        store.close()
    result = build_index(ws)
    assert result.stats["units_extracted"] >= 1 and not result.stats.get("noop")
    assert canonical(ws.index_dir) == _fresh(docs, tmp_path / "fresh")
    assert_community_invariants(ws.index_dir)


def test_units_whose_requests_keep_failing_are_recorded_and_the_rest_is_indexed(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    result = _run(ws, Flaky())
    failed = [f for f in result.failures if f.task == "extract"]
    assert failed and result.stats["units_extracted"] > len(failed)
    assert result.stats["entities"] > 0 and result.stats["reports"] > 0
    store = Store(ws.index_dir)
    try:
        status = index_status(store)
    finally:
        store.close()
    assert {f.id for f in status.failures} == {f.unit_id for f in failed}
    retried = build_index(ws)  # a healthy endpoint: the failed units are extracted now
    assert retried.stats["units_extracted"] == len(failed) and not retried.failures
    assert canonical(ws.index_dir) == _fresh(docs, tmp_path / "fresh")
    assert_community_invariants(ws.index_dir)


def _spawn_index(docs: Path, index_dir: Path, base_url: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CANOPY_LLM_BASE_URL": base_url, "CANOPY_LLM__CONCURRENCY": "2",
           "CANOPY_LLM__BACKOFF_S": "0.01", "CANOPY_EXTRACT__MAX_GLEANINGS": "0",
           "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "canopy.server.cli", "index", str(docs),
                             "--index-dir", str(index_dir)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("phase", ["extract", "report"])
def test_kill_9_during_an_incremental_update_then_rerun_equals_a_clean_build(
        tmp_path: Path, phase: str) -> None:
    """Edits, an addition and a deletion applied by an update that is killed at a random point of
    its extraction or of its reports; the next run must finish exactly what a clean build gives."""
    from tests.fakes.openai_server import FakeOpenAI

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    llm = {"max_retries": 2, "backoff_s": 0.01}
    with FakeOpenAI(latency=0.05) as fake:
        first = open_workspace(docs, index_dir=tmp_path / "idx",
                               llm={"base_url": fake.base_url, **llm},
                               extract={"max_gleanings": 0})
        build_index(first)
        (docs / "suppliers" / "helio_cells.md").write_text(
            (docs / "suppliers" / "helio_cells.md").read_text(encoding="utf-8")
            + "\n\nOphelia Grantham became head of quality at Helio Cells Ltd.\n", encoding="utf-8")
        (docs / "projects" / "wren.md").write_text(
            "# Project Wren\n\nProject Wren is led by Tomas Ekberg in Gothenburg. Wren builds "
            "sorting arms for Verdant Grocers with cells from Helio Cells Ltd.\n", encoding="utf-8")
        (docs / "events" / "tern_recall.md").unlink()
        seen = fake.count(phase)
        proc = _spawn_index(docs, tmp_path / "idx", fake.base_url)
        deadline = time.monotonic() + 90
        while fake.count(phase) < seen + 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.01)
        assert proc.poll() is None, "the update finished before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        build_index(first)
    with FakeOpenAI() as fake2:
        clean = open_workspace(docs, index_dir=tmp_path / "clean",
                               llm={"base_url": fake2.base_url, **llm},
                               extract={"max_gleanings": 0})
        build_index(clean)
    assert canonical(first.index_dir) == canonical(clean.index_dir)
    assert_community_invariants(first.index_dir)
