"""The `canopy` group itself (its commands, `--version`, `python -m canopy.server.cli`) and the
index and status commands in process.

The other commands are tested where their subject is: query in test_engines, serve and demo in
test_mcp_server and test_auth, token in test_auth, warm in test_acl_views, `python -m
canopy.server.cli index` in a subprocess in test_incremental, and the wings' commands (eval,
export, import-graphrag, publish) under tests/wings/, where they skip without their extras."""

from __future__ import annotations

import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from canopy.server.cli import main
from canopy.server.cli.common import DISTRIBUTION, canopy_version
from tests.conftest import EXAMPLES, REPO
from tests.fakes.openai_server import FakeOpenAI

COMMANDS = {"demo", "eval", "export", "import-graphrag", "index", "init", "mcp-config", "prompts",
            "publish", "query", "serve", "status", "tidy", "token", "warm", "watch"}


def _pyproject_version() -> str:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION
    return str(project["version"])


def test_the_group_has_every_command() -> None:
    """The core's commands and the wings' (canopy.server.wings.COMMANDS), all listed."""
    assert set(main.list_commands(click.Context(main))) == COMMANDS
    done = CliRunner().invoke(main, ["--help"])
    assert done.exit_code == 0, done.output
    for name in COMMANDS:
        assert f"  {name} " in done.output


def test_version_prints_the_installed_distribution() -> None:
    try:
        expected = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:  # a checkout on PYTHONPATH, not installed
        expected = _pyproject_version()
    done = CliRunner().invoke(main, ["--version"])
    assert done.exit_code == 0, done.output
    assert done.output == f"canopy, version {expected}\n"


def test_version_falls_back_to_pyproject_when_not_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert canopy_version() == _pyproject_version()


def test_python_dash_m_runs_the_cli() -> None:
    """Tests and `canopy demo` spawn the server as `python -m canopy.server.cli`."""
    out = subprocess.run([sys.executable, "-m", "canopy.server.cli", "--version"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("canopy, version ")
    usage = subprocess.run([sys.executable, "-m", "canopy.server.cli", "token", "--help"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 0, usage.stderr
    assert "Manage the bearer tokens of HTTP callers" in usage.stdout


def test_index_then_status(example_docs: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "index"
    runner = CliRunner()
    built = runner.invoke(main, ["index", str(example_docs), "--index-dir", str(index_dir),
                                 "--json"])
    assert built.exit_code == 0, built.output
    run = json.loads(built.stdout)
    assert run["generation"] == 1 and run["stats"]["documents"] > 0
    assert run["failures"] == []

    shown = runner.invoke(main, ["status", str(example_docs), "--index-dir", str(index_dir)])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.startswith(f"Index {index_dir} (generation 1)\n")
    assert f"documents {run['stats']['documents']}, " in shown.stdout
    assert "provider: builtin (offline, no LLM endpoint configured)" in shown.stdout


def test_a_canopy_error_is_one_line_without_traceback(example_docs: Path, tmp_path: Path) -> None:
    """No index yet: `status` raises a CanopyError, which the group turns into exit code 1."""
    done = CliRunner().invoke(main, ["status", str(example_docs), "--index-dir",
                                     str(tmp_path / "none")])
    assert done.exit_code == 1
    assert done.output.startswith("Error: ") and "Traceback" not in done.output


def _policy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    (docs / "hr").mkdir(parents=True)
    (docs / "hr" / "pay.md").write_text("# Pay\n\nMaren Holt sets the pay bands.\n", "utf-8")
    (docs / "canopy.toml").write_text(
        "[acl]\ndefault = []\n[[acl.rules]]\nglob = 'hr/**'\nlabels = ['hr']\n"
        "[acl.principals]\nalice = ['hr']\nbob = []\n", encoding="utf-8")
    return docs


def test_an_unknown_or_missing_principal_is_an_error_at_start_not_an_empty_answer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CANOPY_PRINCIPAL", raising=False)
    docs = _policy_docs(tmp_path)
    runner = CliRunner()
    assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    ask = ["query", str(docs), "-m", "basic", "Who sets the pay bands?"]
    typo = runner.invoke(main, [*ask, "--principal", "alcie"])
    assert typo.exit_code != 0 and typo.output.strip() == (
        "Error: unknown principal 'alcie'; did you mean 'alice'? "
        "([acl.principals] names: alice, bob)")
    missing = runner.invoke(main, ask)
    assert missing.exit_code != 0 and "name the caller with --principal" in missing.output
    served = runner.invoke(main, [*ask, "--principal", "alice"])
    assert served.exit_code == 0 and "Maren Holt" in served.output
    nothing = runner.invoke(main, [*ask, "--principal", "bob"])  # known, no grants: allowed
    assert nothing.exit_code == 0 and "Maren Holt" not in nothing.output


def test_an_http_caller_the_policy_does_not_know_is_logged_once_and_sees_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.service import CanopyService

    docs = _policy_docs(tmp_path)
    ws = open_workspace(docs)
    build_index(ws)
    service = CanopyService(ws)
    try:
        with caplog.at_level("WARNING", logger="canopy.server.service"):
            for _ in range(2):
                with service.context("mallory") as ctx:
                    assert ctx.reader.caller.readable == frozenset()
            with service.context("bob"):
                pass
    finally:
        service.close()
    warned = [r.getMessage() for r in caplog.records if "not a principal" in r.getMessage()]
    assert len(warned) == 1 and "'mallory'" in warned[0]


def test_status_names_the_file_types_that_were_not_indexed(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "src").mkdir(parents=True)
    (docs / "a.md").write_text("# A\n\nWren Castell builds kilns.\n", encoding="utf-8")
    for name in ("src/x.py", "src/y.py", "notes.rst", "data.json", ".hidden", "Makefile"):
        (docs / name).write_text("x", encoding="utf-8")
    runner = CliRunner()
    assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    status = runner.invoke(main, ["status", str(docs)])
    assert status.exit_code == 0
    assert ("  not indexed (type not in [input] extensions): .py 2, (none) 1, .json 1, .rst 1"
            in status.output.splitlines())
    (docs / "src" / "y.py").unlink()  # nothing else changed: a no-op run still updates the count
    assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    status = runner.invoke(main, ["status", str(docs), "--json"])
    assert json.loads(status.output)["ignored_types"] == {
        "(none)": 1, ".json": 1, ".py": 1, ".rst": 1}


def test_a_restricted_caller_is_not_told_what_types_the_folder_holds(tmp_path: Path) -> None:
    """Counts over the whole folder would speak of folders the caller cannot read; a caller who
    reads every document gets them."""
    import asyncio

    from mcp import Client

    from canopy.server.mcp_app import build_server
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.service import CanopyService

    docs = _policy_docs(tmp_path)
    (docs / "hr" / "salaries.xlsx").write_bytes(b"x")
    ws = open_workspace(docs)
    build_index(ws)
    service = CanopyService(ws)

    async def ignored_types(who: str) -> dict[str, int]:
        async with Client(build_server(service, principal_name=who)) as client:
            status = await client.call_tool("index_status", {})
            return dict(status.structured_content["ignored_types"])

    try:
        assert asyncio.run(ignored_types("bob")) == {}
        assert asyncio.run(ignored_types("alice")) == {".xlsx": 1}
    finally:
        service.close()


def test_ctrl_c_says_what_was_kept_and_how_to_resume(
        example_docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import canopy.server.runtime
    from canopy.health import DB_NAME

    runner = CliRunner()
    index_dir = tmp_path / "idx"
    real = canopy.server.runtime.build_index

    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    config = tmp_path / "settings.toml"
    config.write_text("[chunking]\nchunk_tokens = 600\n", encoding="utf-8")
    monkeypatch.setattr(canopy.server.runtime, "build_index", interrupted)
    given = ["index", str(example_docs), "--index-dir", str(index_dir), "--config", str(config)]
    first = runner.invoke(main, given)
    assert first.exit_code == 1
    resume = f"canopy index {example_docs} --index-dir {index_dir} --config {config}"
    assert first.output.strip() == (
        "Error: interrupted: no index has been committed yet. Extractions and LLM responses "
        f"finished so far are saved; `{resume}` resumes without redoing them.")
    # the hint, followed as printed, builds the index the interrupted run was building
    monkeypatch.setattr(canopy.server.runtime, "build_index", real)
    hinted = shlex.split(resume)[1:]
    assert hinted == given and runner.invoke(main, hinted).exit_code == 0
    assert (index_dir / DB_NAME).exists() and not (example_docs / ".canopy").exists()
    monkeypatch.setattr(canopy.server.runtime, "build_index", interrupted)
    again = runner.invoke(main, given)
    assert "the index still answers from generation 1, its last commit" in again.output


def test_status_shows_the_last_runs_llm_usage_and_the_total_of_every_run(
        example_docs: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    index = ["index", str(example_docs), "--index-dir", str(tmp_path / "idx")]
    first = json.loads(runner.invoke(main, [*index, "--json"]).stdout)["llm_usage"]
    with (example_docs / "overview.md").open("a", encoding="utf-8") as f:
        f.write("\n\nIngrid Solvang joined the board of Northwind Robotics in 2025.\n")
    second = json.loads(runner.invoke(main, [*index, "--json"]).stdout)["llm_usage"]
    out = runner.invoke(main, ["status", str(example_docs), "--index-dir", str(tmp_path / "idx"),
                               "--json"])
    st = json.loads(out.output)
    last, total = st["llm_usage"]["extract"], st["llm_usage_total"]["extract"]
    assert 0 < last["calls"] < total["calls"]  # the edit re-extracted a unit or two
    assert last == second["extract"]
    assert total["calls"] == first["extract"]["calls"] + second["extract"]["calls"]
    text = runner.invoke(main, ["status", str(example_docs), "--index-dir",
                                str(tmp_path / "idx")]).output
    assert "  LLM usage, last run:" in text and "  LLM usage, all runs:" in text


def test_a_writer_that_waits_for_the_lock_says_so(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    import threading
    import time

    from canopy.indexer.index_writer import writer_lock

    held, release = threading.Event(), threading.Event()

    def other_writer() -> None:
        with writer_lock(tmp_path):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=other_writer)
    thread.start()
    assert held.wait(10)
    threading.Timer(0.3, release.set).start()
    began = time.monotonic()
    with caplog.at_level("WARNING", logger="canopy.indexer.index_writer"), writer_lock(tmp_path):
        waited = time.monotonic() - began
    thread.join()
    messages = [r.getMessage() for r in caplog.records]
    assert waited >= 0.25  # it did wait for the other writer
    assert any("is updating" in m and "waiting for it to finish" in m for m in messages)
    assert any(m.startswith("the other writer finished after") for m in messages)
    caplog.clear()
    with caplog.at_level("WARNING", logger="canopy.indexer.index_writer"), writer_lock(tmp_path):
        pass
    assert not caplog.records  # a free lock is taken in silence


def test_progress_without_a_terminal_is_plain_lines_with_rate_and_time_left(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import canopy.server.cli.common as common

    clock = iter([0.0, 1.0, 20.0, 21.0, 40.0])
    monkeypatch.setattr(common.time, "monotonic", lambda: next(clock))
    advance = common.tqdm_progress("extract", 400)
    advance(1)  # 1 s in: too soon for a line
    advance(99)  # 20 s in: 100 done, 5/s, 300 left at that rate: one minute
    advance(100)  # 21 s: too soon
    advance(200)  # done: always said
    err = capsys.readouterr().err.splitlines()
    assert err == ["extract: 400 to do",
                   "extract: 100/400 (25%), 5.0/s, about 1m00s left",
                   "extract: 400/400 (100%), 10.0/s"]


def test_status_of_an_interrupted_first_build_says_how_to_resume(example_docs: Path,
                                                                 tmp_path: Path) -> None:
    from canopy.server.runtime import open_workspace

    index_dir = tmp_path / "idx"
    store = open_workspace(example_docs, index_dir).store()  # created, nothing committed
    store.start_run()
    store.close()
    out = CliRunner().invoke(main, ["status", str(example_docs), "--index-dir", str(index_dir)])
    assert out.exit_code == 0
    assert out.output.strip() == (
        f"Index {index_dir}: nothing committed yet. A first build that was interrupted resumes "
        f"with `canopy index {example_docs} --index-dir {index_dir}`, keeping the extractions "
        "it saved.")


def test_every_file_of_the_example_corpus_is_in_the_wheel() -> None:
    """`pip install .` (no checkout) ships examples/docs as data files, which `canopy demo`
    then finds; a folder added to the corpus but not to pyproject would be missing there."""
    from glob import glob

    files = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["data-files"]
    shipped = {Path(p).resolve() for patterns in files.values() for pattern in patterns
               for p in glob(str(REPO / pattern))}
    corpus = {p.resolve() for p in (REPO / "examples" / "docs").rglob("*") if p.is_file()}
    assert corpus and corpus <= shipped
    for target, patterns in files.items():  # each folder lands at its own place
        assert all(Path(target).parts[-1] == Path(p).parent.name for p in patterns), target


def test_an_index_embedded_by_an_endpoint_is_served_only_with_that_embedder(
        tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Queries of an index whose vectors came from another embedder get a one-line error
    naming both and the way out (not a traceback); `canopy index` then re-embeds, and the
    same query answers."""
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    runner = CliRunner()
    with FakeOpenAI() as fake:
        monkeypatch.setenv("CANOPY_EMBED_BASE_URL", fake.base_url)
        monkeypatch.setenv("CANOPY_EMBED_MODEL", "fake-embed")
        assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    monkeypatch.delenv("CANOPY_EMBED_BASE_URL")
    monkeypatch.delenv("CANOPY_EMBED_MODEL")
    query = ["query", str(docs), "-m", "local", "Who makes the cells?"]
    refused = runner.invoke(main, query)
    assert refused.exit_code != 0 and "Traceback" not in refused.output
    assert "openai:fake-embed" in refused.output and "canopy index" in refused.output
    assert runner.invoke(main, ["index", str(docs)]).exit_code == 0
    answered = runner.invoke(main, query)
    assert answered.exit_code == 0 and "Helio Cells" in answered.output


def test_index_full_after_an_embedder_of_another_width_rebuilds_and_search_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-hour failure: after changing the embedder to one of another width, `canopy
    index --full` stopped with "cannot cast FixedSizeList(64) to FixedSizeList(384)". Here the
    hashing embedder builds at 64 dimensions, then the settings say 384: an MCP tool call (as
    an agent host makes it) answers with the one-line mismatch, not an internal error; `index
    --full` rebuilds; then the CLI and the tool both search the 384-dimension vectors."""
    import asyncio

    from mcp import Client

    from canopy.server.mcp_app import build_server
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    runner = CliRunner()
    monkeypatch.setenv("CANOPY_EMBED__DIMS", "64")
    built = runner.invoke(main, ["index", str(docs)])
    assert built.exit_code == 0, built.output
    monkeypatch.setenv("CANOPY_EMBED__DIMS", "384")
    question = {"query": "Who makes the battery cells?"}

    async def ask() -> tuple[bool, str]:
        service = CanopyService(open_workspace(docs))
        try:
            async with Client(build_server(service)) as client:
                result = await client.call_tool("local_search", question)
        finally:
            service.close()
        return result.is_error, "\n".join(getattr(c, "text", "") for c in result.content)

    refused, text = asyncio.run(ask())
    assert refused and "Internal error" not in text, text
    assert "builtin-hash-64" in text and "builtin-hash-384" in text and "canopy index" in text
    rebuilt = runner.invoke(main, ["index", "--full", str(docs)])
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "FixedSizeList" not in rebuilt.output
    answered = runner.invoke(main, ["query", str(docs), "-m", "local", question["query"]])
    assert answered.exit_code == 0 and "Helio Cells" in answered.output, answered.output
    refused, text = asyncio.run(ask())
    assert not refused and "Helio Cells" in text, text
    import lancedb

    lance = lancedb.connect(str(docs / ".canopy" / "lance"))
    for name in lance.list_tables().tables:  # every table holds the new width
        assert lance.open_table(name).schema.field("vector").type.list_size == 384, name


def test_serve_on_a_busy_port_says_so_in_one_line_before_printing_any_url(
        example_docs: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = CliRunner().invoke(main, ["serve", str(example_docs), "--index-dir",
                                         str(tmp_path / "idx"), "--http", "--port", str(port)])
    assert done.exit_code == 1
    assert done.output.splitlines() == [
        f"Error: cannot listen on 127.0.0.1:{port}: Address already in use. Stop what listens "
        "there or pass --port N (or CANOPY_PORT)"]
    assert not (tmp_path / "idx").exists()  # nothing was built for a server that cannot start


def test_extraction_progress_never_reads_done_before_the_endpoint_cannot_be_reached(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.net import free_port

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    monkeypatch.setenv("CANOPY_LLM_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")  # nobody
    monkeypatch.setenv("CANOPY_LLM__MAX_RETRIES", "0")
    done = CliRunner().invoke(main, ["index", str(docs), "--index-dir", str(tmp_path / "idx")])
    assert done.exit_code == 1
    assert "cannot be reached" in done.output.splitlines()[-1]
    units = int(re.search(r"^extract: (\d+) to do$", done.stderr, re.M)[1])  # type: ignore[index]
    assert f"extract: {units}/{units}" not in done.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_http_says_where_it_listens_once_the_port_accepts(
        examples_index: Path, tmp_path: Path, workers: int) -> None:
    """Issue 30, finding 8: `serve --http` printed its address before the port accepted
    connections (while the service was still opening the index), so a client started on that
    line was refused. The line now comes once the port accepts: a connection made the moment
    it appears succeeds."""
    import os
    import socket

    from tests.net import free_port

    index = tmp_path / "index"
    shutil.copytree(examples_index, index)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "canopy.server.cli", "serve", str(EXAMPLES), "--index-dir",
         str(index), "--http", "--port", str(port), "--workers", str(workers)],
        cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("Canopy MCP server for"):
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    pass  # accepted at once
                assert f"http://127.0.0.1:{port}/mcp" in line
                break
        else:
            pytest.fail(f"serve exited ({proc.wait()}) without saying where it listens")
    finally:
        proc.terminate()
        proc.wait(20)
