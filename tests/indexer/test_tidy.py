"""The search tables' tidy runs off the update's path (issue "Scale"): `canopy index` starts it
detached, a watcher runs it when idle, and it gives way to any writer that starts waiting.

An update that only adds text notes no fragment for rewriting (what it replaced derives from
text still indexed); one that removes text does, and the background tidy then erases it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import lancedb
import pytest

from canopy.indexer.index_writer import writer_lock, writer_waiting
from canopy.indexer.watcher import Watcher
from canopy.server.runtime import build_index, maintain_index, open_workspace, tidy_needed
from canopy.store import Store
from tests.conftest import EXAMPLES, REPO, wait_until


def _scrub(index_dir: Path) -> dict[str, list[int]]:
    store = Store(index_dir)
    try:
        return json.loads(store.get_meta("lance_scrub") or "{}")
    finally:
        store.close()


def _stored_deleted(index_dir: Path) -> dict[str, int]:
    db = lancedb.connect(str(index_dir / "lance"))
    return {name: int(db.open_table(name).list_versions()[-1]["metadata"]
                      .get("total_deletion_file_rows", 0) or 0)
            for name in ("text_units", "entities", "reports")}


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "suppliers", tmp_path / "docs")
    return tmp_path / "docs"


def test_an_addition_notes_nothing_to_erase_and_a_deletion_does(docs: Path,
                                                                  tmp_path: Path) -> None:
    ws = open_workspace(docs, index_dir=tmp_path / "idx", storage={"keep_versions_s": 0})
    build_index(ws)
    assert _scrub(ws.index_dir) == {}
    first = sorted(docs.iterdir())[0]
    (docs / "added.md").write_text(
        f"# Quillon Forge\n\nQuillon Forge buys parts from {first.stem.replace('_', ' ')}.\n",
        encoding="utf-8")
    build_index(ws, tidy=False)
    assert _scrub(ws.index_dir) == {}  # entity rows were replaced, nothing left the index
    assert tidy_needed(ws)
    assert maintain_index(ws) is True
    assert not tidy_needed(ws)
    first.unlink()
    build_index(ws, tidy=False)
    assert _scrub(ws.index_dir)  # rows derived from the deleted file: rewrite their fragments
    assert maintain_index(ws) is True
    assert _scrub(ws.index_dir) == {}
    assert _stored_deleted(ws.index_dir)["text_units"] == 0


def test_canopy_index_returns_before_the_tidy_which_then_erases_the_deletion(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI with the default `[storage] tidy = "background"`: the update commits and
    returns, a detached `canopy tidy --if-idle` rewrites what the deletion left in the
    tables' files and prunes the versions that held it."""
    monkeypatch.delenv("CANOPY_STORAGE__TIDY")
    monkeypatch.setenv("CANOPY_STORAGE__KEEP_VERSIONS_S", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO),
                                                                   os.environ.get("PYTHONPATH")])))
    index_dir = tmp_path / "idx"

    def index() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "canopy.server.cli", "index", str(docs),
                               "--index-dir", str(index_dir)], capture_output=True, text=True,
                              timeout=300, cwd=REPO)

    assert index().returncode == 0  # a full build tidies inline: nothing starts
    victim = sorted(docs.iterdir())[0]
    text = victim.read_text(encoding="utf-8").split("\n\n")[1][:40]
    victim.unlink()
    done = index()
    assert done.returncode == 0, done.stderr
    assert "tidying the search tables in the background" in done.stderr
    log = index_dir / "tidy.log"
    assert wait_until(lambda: "search tables of" in log.read_text(encoding="utf-8"), 120), (
        log.read_text(encoding="utf-8"))
    assert _stored_deleted(index_dir) == {"text_units": 0, "entities": 0, "reports": 0}
    lance = [p for p in (index_dir / "lance").rglob("*") if p.is_file()]
    assert not any(text.encode() in p.read_bytes() for p in lance)
    assert not list(index_dir.glob("write.waiting.*"))


def test_canopy_index_given_a_relative_path_tidies_that_folders_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`canopy index mydocs` run from the folder that holds mydocs: the background tidy runs
    from the package's folder, so it must be handed absolute paths; it tidies mydocs/.canopy
    (its log names that index) and looks for no `mydocs` anywhere else."""
    monkeypatch.delenv("CANOPY_STORAGE__TIDY")
    monkeypatch.setenv("CANOPY_STORAGE__KEEP_VERSIONS_S", "0")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO),
                                                                   os.environ.get("PYTHONPATH")])))
    name = f"mydocs-{os.getpid()}"  # a name no folder beside the package has
    shutil.copytree(EXAMPLES / "suppliers", tmp_path / name)
    index_dir = (tmp_path / name / ".canopy").resolve()

    def index() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "canopy.server.cli", "index", name],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)

    assert index().returncode == 0
    victim = sorted(p for p in (tmp_path / name).iterdir() if p.is_file())[0]
    text = victim.read_text(encoding="utf-8").split("\n\n")[1][:40]
    victim.unlink()
    done = index()
    assert done.returncode == 0, done.stderr
    assert "tidying the search tables in the background" in done.stderr
    log = index_dir / "tidy.log"
    assert wait_until(lambda: any(end in log.read_text(encoding="utf-8")
                                  for end in ("canopy tidy:", "Error")), 120)
    assert f"canopy tidy: search tables of {index_dir} tidy" in log.read_text(
        encoding="utf-8"), log.read_text(encoding="utf-8")
    assert _stored_deleted(index_dir) == {"text_units": 0, "entities": 0, "reports": 0}
    lance = [p for p in (index_dir / "lance").rglob("*") if p.is_file()]
    assert not any(text.encode() in p.read_bytes() for p in lance)
    assert not (REPO / name).exists() and not (REPO.parent / name).exists()


def test_a_waiting_writer_is_seen_and_a_dead_ones_marker_is_cleared(tmp_path: Path) -> None:
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    (index_dir / "write.waiting.999999.1").write_text("")  # a writer that died while waiting
    assert not writer_waiting(index_dir)
    assert not list(index_dir.glob("write.waiting.*"))
    entered = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with writer_lock(index_dir):
            entered.set()
            release.wait(30)

    def wait_for_turn() -> None:
        with writer_lock(index_dir):
            pass

    holder = threading.Thread(target=hold)
    holder.start()
    assert entered.wait(10)
    waiter = threading.Thread(target=wait_for_turn)
    waiter.start()
    assert wait_until(lambda: writer_waiting(index_dir), 10)
    release.set()
    holder.join(10)
    waiter.join(10)
    assert not writer_waiting(index_dir)


def test_a_background_tidy_gives_way_to_a_writer_and_keeps_what_it_finished(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that starts waiting stops the tidy at its next step: the tidied tables are
    recorded, the rest wait for the next tidy, and the writer's update is correct."""
    import canopy.indexer.index_writer as writer

    ws = open_workspace(docs, index_dir=tmp_path / "idx", storage={"keep_versions_s": 0})
    build_index(ws)
    sorted(docs.iterdir())[0].unlink()
    build_index(ws, tidy=False)
    before = _scrub(ws.index_dir)
    assert len(before) >= 2
    calls = [0]

    def waiting_after_first_table(index_dir: Path) -> bool:
        calls[0] += 1
        return bool(_scrub(index_dir) != before)  # a table was recorded: "a writer arrives"

    monkeypatch.setattr(writer, "writer_waiting", waiting_after_first_table)
    assert maintain_index(ws) is False
    left = _scrub(ws.index_dir)
    assert left and set(left) < set(before)
    monkeypatch.undo()
    assert maintain_index(ws) is True
    assert _scrub(ws.index_dir) == {}
    assert _stored_deleted(ws.index_dir) == {"text_units": 0, "entities": 0, "reports": 0}


def test_maintain_index_does_nothing_while_another_writer_holds_the_lock(
        docs: Path, tmp_path: Path) -> None:
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    with writer_lock(ws.index_dir):
        assert maintain_index(ws) is None


def test_a_watcher_runs_its_idle_work_after_a_batch_and_stops_it_when_changes_come(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    applied: list[int] = []
    idle_runs: list[bool] = []

    def idle(busy) -> None:  # type: ignore[no-untyped-def]
        idle_runs.append(busy())

    watcher = Watcher(docs, tmp_path / "idx", lambda: applied.append(1), debounce=0.1,
                      idle=idle, idle_every=3600).start()
    try:
        time.sleep(0.3)
        assert idle_runs == []  # not before the first batch (nor before idle_every)
        (docs / "a.md").write_text("# A\n\nalpha\n", encoding="utf-8")
        assert wait_until(lambda: bool(idle_runs), 15)
        assert applied and idle_runs == [False]
    finally:
        watcher.stop()


def test_a_small_update_needs_no_tidy_until_rows_pile_up_or_the_period_ends(
        docs: Path, tmp_path: Path) -> None:
    """Spawning a tidy costs a process and LanceDB's import: a small update within the
    period asks for none; one that added many rows (a fold into the indexes may be due), or
    the end of the period after a change, does."""
    ws = open_workspace(docs, index_dir=tmp_path / "idx")  # keep_versions_s = 600
    build_index(ws)
    (docs / "added.md").write_text("# Quillon Forge\n\nQuillon Forge makes brass gears.\n",
                                   encoding="utf-8")
    build_index(ws, tidy=False)
    assert not tidy_needed(ws)
    store = Store(ws.index_dir)
    try:
        store.set_meta({"lance_appended": "5000"})
        assert tidy_needed(ws)
        store.set_meta({"lance_appended": "0", "lance_tidied_at": "0"})
        assert tidy_needed(ws)  # the period is over and the tables changed since
    finally:
        store.close()
    assert maintain_index(ws) is True
    assert not tidy_needed(ws)


def _vector_indexes(index_dir: Path) -> dict[str, list[tuple[str, str]]]:
    db = lancedb.connect(str(index_dir / "lance"))
    out = {}
    for name in ("text_units", "entities", "reports"):
        t = db.open_table(name)
        out[name] = [(i.name, i.index_type) for i in t.list_indices()
                     if tuple(i.columns) == ("vector",)]
    return out


def test_a_stale_vector_index_is_trained_anew_by_the_tidy_after_an_update(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index written before IVF_SQ (here: a name the readers do not know) is noted by the
    next update and replaced by the tidy after its commit, not inside the update."""
    import canopy.vectors as vectors_module

    monkeypatch.setattr(vectors_module, "VECTOR_INDEX_MIN", 10)
    current = vectors_module._vector_index_name
    monkeypatch.setattr(vectors_module, "_vector_index_name", lambda rows: f"vector_old_r{rows}")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    build_index(ws)
    old = _vector_indexes(ws.index_dir)
    assert old["entities"] and all(n.startswith("vector_old_r") for n, _ in old["entities"])
    monkeypatch.setattr(vectors_module, "_vector_index_name", current)

    (docs / "added.md").write_text("# Quillon Forge\n\nQuillon Forge makes brass gears.\n",
                                   encoding="utf-8")
    build_index(ws, tidy=False)
    assert _vector_indexes(ws.index_dir) == old  # the update itself trains nothing
    store = Store(ws.index_dir)
    try:
        assert json.loads(store.get_meta("lance_retrain") or "[]")
    finally:
        store.close()
    assert tidy_needed(ws)
    assert maintain_index(ws) is True
    new = _vector_indexes(ws.index_dir)
    for name, indexes in old.items():
        if indexes:
            assert len(new[name]) == 1 and new[name][0][0].startswith("vector_sq_r"), new
            assert new[name][0][1] == "IvfSq"
    assert not tidy_needed(ws)
    store = Store(ws.index_dir)
    try:
        assert json.loads(store.get_meta("lance_retrain") or "[]") == []
    finally:
        store.close()
