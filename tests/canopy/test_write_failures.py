"""Failures that say what happened (issue 30, findings 4 and 5): a full disk, a read-only index
folder and a database another process holds locked each end a command with one line naming the
index folder and what to do, never a traceback and never "damaged"; a run stopped by a full disk
resumes once space is freed, and equals a clean build.

The disk fills at the write seams themselves: SQLite's own limit (`PRAGMA max_page_count`, which
fails writes exactly as a full disk does: SQLITE_FULL, "database or disk is full") and LanceDB's
error text for ENOSPC; the read-only folder at the writer lock's file (EROFS). (A real tmpfs of a
few MB was tried too: see the closing note of issue 30.)
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from canopy.errors import IndexDamaged, IndexUnwritable
from canopy.health import write_failure
from canopy.indexer.watcher import Watcher
from canopy.server.cli import main
from canopy.server.runtime import build_index, open_workspace
from tests.conftest import EXAMPLES, wait_until
from tests.indexer.test_incremental import canonical

LANCE_ENOSPC = ("lance error: LanceError(IO): No space left on device (os error 28), "
                "/root/.cargo/registry/src/lance-file-13.0.0/src/writer/structural.rs:258:9")


def canopy(docs: Path, index_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(main, [args[0], str(docs), "--index-dir", str(index_dir),
                                     *args[1:]])


def assert_one_line(done: Result, index_dir: Path, *words: str) -> str:
    """Exit code 1, one line on stderr naming the index folder, no traceback, not "damaged"."""
    assert done.exit_code == 1, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert str(index_dir) in line and "Traceback" not in done.output, line
    assert "damaged" not in line.lower() and "--full" not in line, line
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    for name in ("suppliers", "projects"):
        shutil.copytree(EXAMPLES / name, tmp_path / "docs" / name)
    return tmp_path / "docs"


def full_database(monkeypatch: pytest.MonkeyPatch, pages: int) -> None:
    """Every connection the store opens can hold at most `pages` pages: writes past them fail
    as on a full disk."""
    import canopy.store.store as store_module

    real = store_module.connect

    def capped(path: Path, cache_kib: int = 8192) -> sqlite3.Connection:
        db = real(path, cache_kib)
        db.execute(f"PRAGMA max_page_count={pages}")
        return db

    monkeypatch.setattr(store_module, "connect", capped)


def test_write_failures_are_told_from_damage() -> None:
    here = Path("/tmp")
    full = sqlite3.connect(":memory:")
    full.execute("CREATE TABLE t (x TEXT)")
    full.execute("PRAGMA max_page_count=2")
    with pytest.raises(sqlite3.OperationalError) as sqlite_full:
        full.executemany("INSERT INTO t VALUES (?)", [("x" * 4000,)] * 10)
    for exc in (OSError(errno.ENOSPC, "No space left on device"), RuntimeError(LANCE_ENOSPC),
                sqlite_full.value):
        got = write_failure(exc, here)
        assert got is not None and got.problem.startswith("no space left"), exc
    readonly = write_failure(OSError(errno.EROFS, "Read-only file system"), here)
    assert readonly is not None and "read-only" in readonly.problem
    assert write_failure(ValueError("Table 'entities' was not found"), here) is None
    assert write_failure(RuntimeError("some bug"), here) is None
    corrupt = sqlite3.connect(":memory:")
    try:
        corrupt.execute("SELECT * FROM nowhere")
    except sqlite3.OperationalError as exc:  # not a write failure: handled as before
        assert write_failure(exc, here) is None


def test_a_first_build_on_a_full_disk_says_so_and_resumes_when_space_is_freed(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported sequence: the first build stops on a full disk; the next run, disk still
    full, said "The index is damaged ... rebuild with --full" (and --full then moved the
    database and its LLM cache aside). Now both say the disk is full, and once space is freed
    the run resumes and equals a clean build, with nothing set aside."""
    index_dir = tmp_path / "index"
    with pytest.MonkeyPatch.context() as full:
        full_database(full, 60)
        assert_one_line(canopy(docs, index_dir, "index"), index_dir, "no space left",
                        "Free space")
        assert_one_line(canopy(docs, index_dir, "index"), index_dir, "no space left")
        assert_one_line(canopy(docs, index_dir, "index", "--full"), index_dir, "no space left")
    done = canopy(docs, index_dir, "index")
    assert done.exit_code == 0, done.output
    assert not list(index_dir.glob("damaged-*"))
    clean = tmp_path / "clean"
    build_index(open_workspace(docs, index_dir=clean))
    assert canonical(index_dir) == canonical(clean)


def test_a_first_build_stopped_before_its_first_write_is_no_damage(docs: Path,
                                                                   tmp_path: Path) -> None:
    """A full disk can stop SQLite right after it created the database file: an empty file
    with nothing beside it is a build to resume, not a lost index. An empty file beside search
    tables is still damage (the database was lost: an empty index would hide it)."""
    index_dir = tmp_path / "index"
    index_dir.mkdir()
    (index_dir / "canopy.sqlite").write_bytes(b"")
    assert build_index(open_workspace(docs, index_dir=index_dir)).stats["documents"] == 6
    (index_dir / "canopy.sqlite").write_bytes(b"")
    (index_dir / "canopy.sqlite-wal").unlink(missing_ok=True)
    with pytest.raises(IndexDamaged):
        build_index(open_workspace(docs, index_dir=index_dir))


@pytest.mark.parametrize("seam", ["write", "restore"])
def test_an_update_that_fills_the_disk_in_the_search_tables_resumes_when_space_is_freed(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, seam: str) -> None:
    """LanceDB's ENOSPC while the update writes its rows (`write`), and, disk still full, while
    the next run rolls the tables back to the committed versions (`restore`, which writes a
    manifest: it read as "a search table cannot be opened ... damaged")."""
    from canopy.vectors import VectorStore

    index_dir = tmp_path / "index"
    build_index(open_workspace(docs, index_dir=index_dir))
    (docs / "suppliers" / "helio_cells.md").unlink()
    with (docs / "projects" / "kestrel.md").open("a", encoding="utf-8") as f:
        f.write("\n\nMaria Okafor met Tomas Reyes of Bluewater Logistics in Porto.\n")

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(LANCE_ENOSPC)

    with pytest.MonkeyPatch.context() as full:
        full.setattr(VectorStore, "write", no_space)
        assert_one_line(canopy(docs, index_dir, "index"), index_dir, "no space left")
        if seam == "restore":
            import lancedb.table

            full.setattr(lancedb.table.LanceTable, "restore", no_space)
            assert_one_line(canopy(docs, index_dir, "index"), index_dir, "no space left")
    done = canopy(docs, index_dir, "index")
    assert done.exit_code == 0, done.output
    assert canopy(docs, index_dir, "status", "--check").exit_code == 0
    clean = tmp_path / "clean"
    build_index(open_workspace(docs, index_dir=clean))
    assert canonical(index_dir) == canonical(clean)


def test_a_read_only_index_folder_is_one_line(docs: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 5: `canopy index` into a read-only folder ended in a raw OSError traceback from
    the writer lock."""
    import filelock

    index_dir = tmp_path / "index"
    build_index(open_workspace(docs, index_dir=index_dir))

    def read_only(self: Any, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, "Read-only file system", str(index_dir / "write.lock"))

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    line = assert_one_line(canopy(docs, index_dir, "index"), index_dir, "read-only")
    assert "writable" in line


def test_a_database_locked_by_another_process_is_one_line(
        docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lock contention that waiting does not end (another program holds a write transaction on
    the database past the busy timeout): one line saying so, not "database is locked"."""
    import canopy.store.store as store_module

    index_dir = tmp_path / "index"
    build_index(open_workspace(docs, index_dir=index_dir))
    (docs / "projects" / "tern.md").unlink()
    monkeypatch.setattr(store_module, "_TIMEOUT_S", 0.2)
    other = sqlite3.connect(index_dir / "canopy.sqlite", isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        assert_one_line(canopy(docs, index_dir, "index"), index_dir, "locked by another process")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert canopy(docs, index_dir, "index").exit_code == 0


def test_the_watcher_retries_a_failed_batch_without_another_change(tmp_path: Path) -> None:
    """A batch that failed (the disk was full) is tried again after a wait, so freeing space
    is enough: the documents need no further edit to be caught up."""
    calls: list[float] = []

    def apply() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise IndexUnwritable("no space left on the disk holding the index folder",
                                  str(tmp_path), "Free space")
        return "ok"

    applied: list[object] = []
    tmp_path.joinpath("docs").mkdir()
    watcher = Watcher(tmp_path / "docs", tmp_path / "index", apply, debounce=0.05, retry_s=0.2,
                      on_applied=lambda paths, result: applied.append(result)).start()
    try:
        watcher.notify(tmp_path / "docs" / "a.md")
        assert wait_until(lambda: applied == ["ok"], timeout=10)
    finally:
        watcher.stop()
    assert len(calls) == 3
    assert calls[2] - calls[1] >= calls[1] - calls[0] >= 0.2  # waits, doubling


def test_a_partial_file_of_a_write_that_never_committed_is_no_damage(docs: Path,
                                                                     tmp_path: Path) -> None:
    """A full disk can stop LanceDB mid-file: the partial data file belongs to a version the
    index never committed (the next writer rolls the table back). It read as "a search
    table's files are truncated ... damaged"; a truncated file of the committed version still
    does (tests/canopy/test_recovery.py)."""
    import uuid

    index_dir = tmp_path / "index"
    build_index(open_workspace(docs, index_dir=index_dir))
    table = index_dir / "lance" / "text_units.lance"
    (table / "data" / f"{uuid.uuid4().hex}.lance").write_bytes(b"LANC" + b"\0" * 500)
    partial_index = table / "_indices" / str(uuid.uuid4())
    partial_index.mkdir(parents=True)
    (partial_index / "part_0_docs.lance").write_bytes(b"\0" * 300)
    assert canopy(docs, index_dir, "status", "--check").exit_code == 0
    (docs / "projects" / "tern.md").unlink()
    done = canopy(docs, index_dir, "index")
    assert done.exit_code == 0, done.output
