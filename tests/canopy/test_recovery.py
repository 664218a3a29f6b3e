"""A damaged index always has a way back (issue "Safety", case 8).

Whatever is damaged - the SQLite database truncated, a search table's file truncated, a table or
the whole search folder deleted - `canopy status` says so in one line with the command that
fixes it, `canopy index` refuses the same way, every MCP tool answers with a clear message
(never a traceback, an internal path, or a silent "no relevant information"), and
`canopy index --full` moves the damage aside and rebuilds from the documents.

The corpus (two folders of the examples) is indexed once per module with the builtin provider;
each test damages its own copy.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from click.testing import CliRunner, Result
from mcp import Client

from canopy.server.cli import main
from canopy.server.mcp_app import build_server
from canopy.server.runtime import open_workspace
from canopy.server.service import CanopyService
from tests.conftest import EXAMPLES

QUESTION = "Which supplier makes the battery cells?"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recovery")
    for name in ("suppliers", "projects"):
        shutil.copytree(EXAMPLES / name, root / "docs" / name)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("CANOPY_INDEX_DIR", raising=False)
        done = CliRunner().invoke(main, ["index", str(root / "docs"), "--index-dir",
                                         str(root / "index")])
    assert done.exit_code == 0, done.output
    return root


@pytest.fixture
def copy(built: Path, tmp_path: Path) -> Path:
    """A private copy of the built corpus and index: tmp_path/docs and tmp_path/index."""
    shutil.copytree(built / "docs", tmp_path / "docs")
    shutil.copytree(built / "index", tmp_path / "index")
    return tmp_path


def canopy(root: Path, *args: str) -> Result:
    return CliRunner().invoke(main, [args[0], str(root / "docs"), "--index-dir",
                                     str(root / "index"), *args[1:]])


async def acanopy(root: Path, *args: str) -> Result:
    """`canopy` from an async test (the CLI runs its own event loop)."""
    return await anyio.to_thread.run_sync(lambda: canopy(root, *args))


_PROGRESS = re.compile(r"^\w+: (\d+ to do|\d+/\d+ \()")  # canopy.server.cli.common's plain progress


def notes(done: Result) -> list[str]:
    """The command's stderr lines other than progress (printed when stderr is no terminal)."""
    return [ln for ln in done.stderr.strip().splitlines() if not _PROGRESS.match(ln)]


def assert_one_line_saying_damaged(done: Result, root: Path) -> None:
    """Exit code 1 and one line: what is wrong and the exact command, no traceback, no path
    inside the index folder."""
    assert done.exit_code == 1, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    # the index folder, and the exact command: with --index-dir, since it is not DOCS/.canopy
    assert f"The index at {root / 'index'} is damaged" in lines[0]
    assert f"canopy index --full {root / 'docs'} --index-dir {root / 'index'}`" in lines[0]
    assert "Traceback" not in done.output and f"{root / 'index'}/" not in done.output
    assert "lance" not in done.output and "sqlite" not in done.output.lower()


def assert_healthy(root: Path) -> None:
    done = canopy(root, "status", "--check")
    assert done.exit_code == 0, done.output
    assert "documents 6" in done.stdout


def text_units_data(root: Path) -> Path:
    files = sorted((root / "index" / "lance" / "text_units.lance" / "data").glob("*.lance"),
                   key=lambda p: p.stat().st_size)
    return files[-1]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def service(copy: Path) -> Iterator[CanopyService]:
    svc = CanopyService(open_workspace(copy / "docs", index_dir=copy / "index"))
    yield svc
    svc.close()


async def tool_texts(svc: CanopyService) -> dict[str, tuple[bool, str]]:
    """(is_error, text) of one call of each search tool and of index_status."""
    calls = {"basic_search": {"query": QUESTION}, "local_search": {"query": QUESTION},
             "global_search": {"query": QUESTION}, "index_status": {}}
    out = {}
    async with Client(build_server(svc)) as client:
        for name, args in calls.items():
            result = await client.call_tool(name, args)
            out[name] = (bool(result.is_error),
                         "\n".join(getattr(b, "text", "") for b in result.content))
    return out


def assert_tools_say_damaged(answers: dict[str, tuple[bool, str]], root: Path) -> None:
    for name, (is_error, text) in answers.items():
        assert is_error, (name, text)
        assert "index is damaged" in text and "canopy index --full" in text, (name, text)
        assert str(root) not in text and "lance" not in text and "Internal error" not in text


# ---- the database -----------------------------------------------------------------------------


def test_a_truncated_database_is_refused_in_one_line_and_rebuilt_by_index_full(copy: Path) -> None:
    db = copy / "index" / "canopy.sqlite"
    with db.open("r+b") as fh:
        fh.truncate(db.stat().st_size // 2)
    assert_one_line_saying_damaged(canopy(copy, "status"), copy)
    assert_one_line_saying_damaged(canopy(copy, "index"), copy)
    assert_one_line_saying_damaged(canopy(copy, "query", QUESTION), copy)

    done = canopy(copy, "index", "--full")
    assert done.exit_code == 0, done.output
    note = notes(done)
    assert len(note) == 1 and "damaged" in note[0] and "moved the damaged files" in note[0]
    aside = sorted((copy / "index").glob("damaged-*"))
    assert len(aside) == 1
    assert (aside[0] / "canopy.sqlite").exists() and (aside[0] / "lance").is_dir()
    assert_healthy(copy)
    answer = canopy(copy, "query", QUESTION, "-m", "basic")
    assert answer.exit_code == 0, answer.output
    assert "Helio Cells" in answer.stdout
    # The folder set aside is inside the index folder, which is never indexed.
    again = canopy(copy, "index", "--json")
    assert json.loads(again.stdout)["stats"].get("noop") is True


def test_an_empty_database_file_is_damage_not_a_new_empty_index(copy: Path) -> None:
    (copy / "index" / "canopy.sqlite").write_bytes(b"")
    assert_one_line_saying_damaged(canopy(copy, "status"), copy)
    assert_one_line_saying_damaged(canopy(copy, "index"), copy)
    assert canopy(copy, "index", "--full").exit_code == 0
    assert_healthy(copy)


# ---- the search tables ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_truncated_search_table_is_reported_refused_and_healed(
        copy: Path, service: CanopyService) -> None:
    data = text_units_data(copy)
    with data.open("r+b") as fh:
        fh.truncate(data.stat().st_size // 2)
    assert_one_line_saying_damaged(canopy(copy, "status"), copy)
    assert_one_line_saying_damaged(canopy(copy, "index"), copy)
    answers = await tool_texts(service)
    # Global search reads reports, whose table is intact: it may still answer.
    answers.pop("global_search")
    assert_tools_say_damaged(answers, copy)

    done = await acanopy(copy, "index", "--full")
    assert done.exit_code == 0, done.output
    assert "search table" in done.stderr and len(notes(done)) == 1
    aside = next((copy / "index").glob("damaged-*"))
    assert (aside / "lance").is_dir() and not (aside / "canopy.sqlite").exists()  # caches kept
    assert_healthy(copy)
    healed = CanopyService(open_workspace(copy / "docs", index_dir=copy / "index"))
    try:
        answers = await tool_texts(healed)
    finally:
        healed.close()
    assert not any(is_error for is_error, _ in answers.values()), answers
    assert "Helio Cells" in answers["basic_search"][1]


@pytest.mark.anyio
async def test_a_deleted_search_folder_is_never_answered_as_no_relevant_information(
        copy: Path, service: CanopyService) -> None:
    shutil.rmtree(copy / "index" / "lance")
    answers = await tool_texts(service)
    assert_tools_say_damaged(answers, copy)
    assert not any("No relevant information" in text for _, text in answers.values())
    assert_one_line_saying_damaged(canopy(copy, "status"), copy)
    assert (await acanopy(copy, "index", "--full")).exit_code == 0
    assert_healthy(copy)


def test_a_deleted_table_is_reported_and_refused_then_healed(copy: Path) -> None:
    shutil.rmtree(copy / "index" / "lance" / "entities.lance")
    assert_one_line_saying_damaged(canopy(copy, "status"), copy)
    assert_one_line_saying_damaged(canopy(copy, "index"), copy)
    assert canopy(copy, "index", "--full").exit_code == 0
    assert_healthy(copy)


def test_status_check_finds_tables_that_disagree_with_the_database(copy: Path) -> None:
    """A table rolled back to an older version still opens; only its row count betrays it."""
    db = sqlite3.connect(copy / "index" / "canopy.sqlite")
    versions = json.loads(db.execute("SELECT value FROM meta WHERE key='lance_versions'")
                          .fetchone()[0])
    # Version 1 is the empty table as first created; old versions are kept for a while
    # (keep_versions_s), so it is still there.
    manifests = copy / "index" / "lance" / "text_units.lance" / "_versions"
    assert (manifests / f"{(1 << 64) - 2}.manifest").is_file()
    versions["text_units"] = 1
    with db:
        db.execute("UPDATE meta SET value=? WHERE key='lance_versions'", (json.dumps(versions),))
    db.close()
    assert canopy(copy, "status").exit_code == 0  # the files are all there
    assert_one_line_saying_damaged(canopy(copy, "status", "--check"), copy)
