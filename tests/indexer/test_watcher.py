"""The watcher turns file activity into debounced incremental updates."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from canopy.indexer.watcher import Watcher, is_ignored
from canopy.server.runtime import build_index, open_workspace
from canopy.store import Store
from canopy.store.export import load_graph
from tests.conftest import EXAMPLES, wait_until


def test_index_folder_vcs_and_editor_temp_files_are_ignored(tmp_path: Path) -> None:
    docs, index = tmp_path / "docs", tmp_path / "docs" / ".canopy"
    assert is_ignored(index / "canopy.sqlite", docs, index)
    assert is_ignored(docs / ".git" / "HEAD", docs, index)
    for name in ("notes.md.swp", "notes.md~", ".#notes.md", "#notes.md#", "draft.tmp", "4913"):
        assert is_ignored(docs / name, docs, index), name
    assert not is_ignored(docs / "notes.md", docs, index)
    assert not is_ignored(docs / "canopy.toml", docs, index)


def test_edits_renames_and_deletions_are_applied_in_debounced_batches(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    applied: list[tuple[set[Path], object]] = []
    watcher = Watcher(docs, ws.index_dir,
                      lambda: build_index(open_workspace(docs, index_dir=ws.index_dir)),
                      debounce=0.3, on_applied=lambda paths, r: applied.append((paths, r))).start()
    try:
        # A burst of writes to one file (as editors do) becomes one batch.
        target = docs / "helio_cells.md"
        for i in range(5):
            target.write_text(
                target.read_text(encoding="utf-8")
                + f"\n\nUpdate {i}: Quentin Marsh joined Helio Cells Ltd.",
                encoding="utf-8",
            )
            time.sleep(0.02)
        (docs / "notes.md.swp").write_bytes(b"\x00swap")
        assert wait_until(lambda: len(applied) >= 1)
        time.sleep(0.6)
        assert len(applied) == 1, "a burst of edits should apply as one batch"

        def names() -> set[str]:
            store = Store(ws.index_dir)
            try:
                return {e.name for e in load_graph(store).entities.values()}
            finally:
                store.close()

        assert "Quentin Marsh" in names()
        (docs / "bluewater_logistics.txt").rename(docs / "bluewater.txt")
        target.unlink()
        assert wait_until(lambda: len(applied) >= 2 and "Quentin Marsh" not in names())
        store = Store(ws.index_dir)
        try:
            paths = {d.path for d in load_graph(store).documents.values()}
        finally:
            store.close()
        assert "bluewater.txt" in paths and "helio_cells.md" not in paths
    finally:
        watcher.stop()


def test_a_failing_update_is_logged_and_the_watcher_keeps_going(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    calls: list[int] = []

    def apply() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("endpoint down")
        return len(calls)

    watcher = Watcher(docs, tmp_path / "idx", apply, debounce=0.1).start()
    try:
        (docs / "a.md").write_text("one", encoding="utf-8")
        assert wait_until(lambda: len(calls) == 1)
        time.sleep(0.3)
        (docs / "b.md").write_text("two", encoding="utf-8")
        assert wait_until(lambda: len(calls) == 2 and watcher.batches == 1)
    finally:
        watcher.stop()


def test_the_watcher_applies_an_edit_while_the_server_keeps_answering(tmp_path: Path) -> None:
    import asyncio

    from canopy.server.engines import basic_search
    from canopy.server.service import CanopyService

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    service = CanopyService(ws)
    watcher = Watcher(docs, ws.index_dir,
                      lambda: build_index(open_workspace(docs, index_dir=ws.index_dir)),
                      debounce=0.2).start()

    async def serve_while_editing() -> tuple[int, bool]:
        answered = 0
        seen_edit = False
        edited = False
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not seen_edit:
            result = await service.run(None, lambda c: basic_search(
                c, "Who is Ophelia Grantham at Helio Cells Ltd?", k=5))
            answered += 1
            seen_edit = "Ophelia Grantham" in result.context
            if not edited and answered >= 3:
                (docs / "helio_cells.md").write_text(
                    (docs / "helio_cells.md").read_text(encoding="utf-8")
                    + "\n\nOphelia Grantham became head of quality at Helio Cells Ltd.",
                    encoding="utf-8",
                )
                edited = True
            await asyncio.sleep(0.05)
        return answered, seen_edit

    try:
        answered, seen_edit = asyncio.run(serve_while_editing())
    finally:
        watcher.stop()
        service.close()
    assert seen_edit, "the edit never became visible to queries"
    assert answered > 3


def test_kill_9_of_canopy_watch_mid_batch_resumes_loses_nothing_and_leaks_nothing(
        tmp_path: Path) -> None:
    """`canopy watch` killed with SIGKILL in the middle of a batch that edits a document,
    adds a restricted one (a canary), deletes one and edits the policy so that a public
    document becomes restricted: at the kill nothing is served against the new policy (the
    relabel committed first); a restarted `canopy watch` resumes, and the index then equals a
    clean build of the final state, access classes included, and serves every principal only
    what the policy lets it read."""
    import os
    import signal
    import subprocess
    import sys

    from tests.compositions import (
        CHUNKING,
        Corpus,
        PolicyModel,
        canonical_with_access,
        check_served,
        check_stored_access,
        workspace,
    )
    from tests.conftest import REPO
    from tests.fakes.openai_server import FakeOpenAI

    corpus = Corpus(tmp_path / "docs", 7)
    index = tmp_path / "index"
    canary = "CANARY-w9-3c1d"
    with FakeOpenAI() as fake:
        llm = {"base_url": fake.base_url, "concurrency": 1, "max_retries": 2, "backoff_s": 0.01}
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))},
               "CANOPY_LLM_BASE_URL": fake.base_url, "CANOPY_LLM__CONCURRENCY": "1",
               "CANOPY_LLM__MAX_RETRIES": "2", "CANOPY_LLM__BACKOFF_S": "0.01",
               "CANOPY_EXTRACT__CLAIMS": "true", "CANOPY_EXTRACT__MAX_GLEANINGS": "0",
               "CANOPY_CHUNKING__CHUNK_TOKENS": str(CHUNKING["chunk_tokens"]),
               "CANOPY_CHUNKING__OVERLAP_TOKENS": str(CHUNKING["overlap_tokens"]),
               "CANOPY_STORAGE__TIDY": "inline"}

        def watch() -> subprocess.Popen[str]:
            return subprocess.Popen(
                [sys.executable, "-m", "canopy.server.cli", "watch", str(corpus.root),
                 "--index-dir", str(index), "--debounce", "0.2"],
                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

        def until_watching(proc: subprocess.Popen[str]) -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                if "watching" in line:
                    return
            pytest.fail(f"canopy watch exited ({proc.wait()}) before watching")

        proc = watch()
        try:
            until_watching(proc)
            fake.latency = 0.3  # the batch is slow enough to be killed in its middle
            before = fake.count("extract")
            # one batch: an edit, a restricted canary document, a deletion, a relabel
            public = sorted(p for p in corpus.files() if p.startswith("pub/"))
            corpus.apply(("edit", corpus.files().index(public[0]), 1))
            (corpus.root / "fx" / "secret.md").write_text(
                f"# Secret\n\nMaria Okafor filed {canary} with Helio Cells Ltd.\n\n"
                + "\n\n".join(f"Tomas Reyes signed ledger {canary}-{i} in Porto."
                              for i in range(6)),
                encoding="utf-8")
            (corpus.root / public[1]).unlink()
            corpus.policy = PolicyModel(corpus.policy.folders, ((public[0], ("x",)),))
            corpus.write_policy()
            assert wait_until(lambda: fake.count("extract") >= before + 2, timeout=60), (
                before, fake.count("extract"), [r.task for r in fake.requests[-5:]])
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            fake.latency = 0.0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        # killed mid-batch: whatever is committed is served by the new policy
        check_served(corpus.root, index, corpus.policy, "killed mid-batch", complete=False,
                     llm=llm)
        proc = watch()
        try:
            until_watching(proc)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(30)
        g = check_stored_access(index, corpus.policy, "after the restart")
        assert any(canary in u.text for u in g.units.values())
        check_served(corpus.root, index, corpus.policy, "after the restart", llm=llm)
        fresh = tmp_path / "fresh"
        from canopy.server.runtime import build_index as build

        build(workspace(corpus.root, fresh, llm=llm))
        assert canonical_with_access(index) == canonical_with_access(fresh)


def _documents(index: Path) -> set[str]:
    import sqlite3

    db = sqlite3.connect(f"file:{index / 'canopy.sqlite'}?mode=ro", uri=True)
    try:
        return {p for (p,) in db.execute("SELECT path FROM documents")}
    finally:
        db.close()


def test_canopy_watch_applies_a_change_made_during_its_first_update(tmp_path: Path) -> None:
    """`canopy watch` indexes, then watches: a file written while that first update runs (after
    its scan) is applied next with no further change, since it observes before it indexes (it
    started observing after, so the change waited for the next one)."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO
    from tests.fakes.openai_server import FakeOpenAI

    docs, index = tmp_path / "docs", tmp_path / "index"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    with FakeOpenAI(latency=0.3) as fake:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))},
               "CANOPY_LLM_BASE_URL": fake.base_url, "CANOPY_LLM__CONCURRENCY": "1",
               "CANOPY_EXTRACT__MAX_GLEANINGS": "0", "CANOPY_STORAGE__TIDY": "inline"}
        proc = subprocess.Popen(
            [sys.executable, "-m", "canopy.server.cli", "watch", str(docs), "--index-dir",
             str(index), "--debounce", "0.2"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            # the first update has scanned the folder: it is extracting
            assert wait_until(lambda: fake.count("extract") >= 1, timeout=60)
            (docs / "late.md").write_text(
                "# Late\n\nPerpetua Lindgren joined Helio Cells Ltd as CFO.", encoding="utf-8")
            # late.md is written during the first update: the rest of it need not be slow
            fake.latency = 0.0
            assert proc.stderr is not None
            for line in proc.stderr:
                if "watching" in line:
                    assert "Indexed 3 documents" in line, line  # late.md came after the scan
                    break
            else:
                pytest.fail(f"canopy watch exited ({proc.wait()}) before watching")
            assert wait_until(lambda: "late.md" in _documents(index), timeout=30)
        finally:
            proc.terminate()
            proc.wait(30)


def test_serve_watch_catches_up_on_changes_made_while_no_server_watched(
        tmp_path: Path) -> None:
    """`canopy serve --watch` on an index that exists: a document added while the server was
    stopped (or killed) is applied at start, not only after the next change."""
    import sys

    import anyio
    from mcp import Client, StdioServerParameters

    from tests.conftest import REPO

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    build_index(open_workspace(docs, index_dir=tmp_path / "idx"))
    (docs / "new_hire.md").write_text(
        "# New hire\n\nPerpetua Lindgren joined Helio Cells Ltd as CFO.", encoding="utf-8")
    params = StdioServerParameters(
        command=sys.executable, cwd=str(REPO), env={"PYTHONPATH": str(REPO)},
        args=["-m", "canopy.server.cli", "serve", str(docs), "--index-dir",
              str(tmp_path / "idx"), "--watch"])

    async def seen() -> bool:
        async with Client(params) as client:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                result = await client.call_tool("basic_search",
                                                {"query": "Who is Perpetua Lindgren?", "k": 3})
                assert not result.is_error
                if "Perpetua Lindgren" in "\n".join(getattr(b, "text", "")
                                                     for b in result.content):
                    return True
                await anyio.sleep(0.5)
        return False

    assert anyio.run(seen), "the change made while no server watched was not applied at start"
