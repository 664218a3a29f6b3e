"""The core's side of the wings (canopy.server.wings): every wing has its folder, its extra and
its tests; the CLI offers the wings' commands and options, and where a wing's extra is missing
they say what to install instead of failing on an import; the servers import no wing they do
not serve."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from canopy.server.cli import main
from canopy.server.wings import COMMANDS, WINGS, missing_libraries, wing_module
from tests.conftest import REPO, require_wing


def _extras() -> dict[str, list[str]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return project["optional-dependencies"]


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match is not None, requirement
    return match.group().lower().replace("-", "_")


@pytest.mark.parametrize("wing", sorted(WINGS))
def test_every_wing_has_its_folder_its_extra_and_its_tests(wing: str) -> None:
    """The wing's libraries are exactly what its extra installs (an empty extra: it needs
    nothing beyond the core), and [test] installs every wing's extra but Ray's (heavy)."""
    assert (REPO / "server" / "wings" / wing / "__init__.py").is_file()
    assert list((REPO / "tests" / "wings" / wing).glob("test_*.py"))
    extras = _extras()
    assert {_name(r) for r in extras[wing]} == set(WINGS[wing].libraries)
    tested = {e for r in extras["test"] if r.startswith("canopy-graphrag[")
              for e in r[len("canopy-graphrag["):-1].split(",")}
    assert tested == set(WINGS) - {"ray"}
    assert "canopy-graphrag[ray]" in extras["heavy"]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_wing_command_is_the_command_the_group_runs(command: str) -> None:
    wing, target = COMMANDS[command]
    require_wing(wing)  # without its extra the command is listed but not loaded (tests below)
    module, _, attribute = target.partition(":")
    found = getattr(wing_module(wing, module), attribute)
    assert isinstance(found, click.Command) and found.name == command
    assert main.get_command(click.Context(main), command) is found


def test_a_missing_extra_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from canopy.errors import ConfigError

    monkeypatch.setitem(sys.modules, "obstore", None)  # `import obstore` raises ImportError
    assert missing_libraries("publish") == ["obstore"]
    with pytest.raises(ConfigError) as raised:
        wing_module("publish", "publishing", wanted_by="--publish")
    assert str(raised.value) == ("--publish needs the [publish] extra, which is not installed "
                                 "here (obstore is missing): pip install 'obstore>=0.12'")


def _without(monkeypatch: pytest.MonkeyPatch, *libraries: str) -> None:
    for library in libraries:
        monkeypatch.setitem(sys.modules, library, None)


def test_without_ray_installed_the_option_says_how_to_get_it(
        example_docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "ray")
    result = CliRunner().invoke(main, ["index", str(example_docs), "--ray", "auto"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "Error: --ray needs the [ray] extra, which is not installed here (ray is missing): "
        "pip install 'ray[client]>=2.60'"]
    assert not (example_docs / ".canopy").exists()  # asked before anything is built


@pytest.mark.parametrize(("argv", "wanted_by"), [
    (["index", "{docs}", "--publish", "{tmp}/published"], "--publish / [publish] uri"),
    (["watch", "{docs}", "--publish", "{tmp}/published"], "--publish / [publish] uri"),
    (["publish", "{docs}", "--to", "{tmp}/published"], "canopy publish"),
    (["serve", "--index-uri", "{tmp}/published"], "--index-uri"),
])
def test_without_the_publish_extra_each_way_in_says_how_to_get_it(
        argv: list[str], wanted_by: str, example_docs: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "obstore")
    argv = [a.format(docs=example_docs, tmp=tmp_path) for a in argv]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1] == (
        f"Error: {wanted_by} needs the [publish] extra, which is not installed here (obstore is "
        "missing): pip install 'obstore>=0.12'")
    assert not (example_docs / ".canopy").exists()
    assert not (tmp_path / "published").exists()


def test_without_the_eval_extra_eval_is_listed_and_says_how_to_get_it(
        example_docs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _without(monkeypatch, "bm25s")
    listed = CliRunner().invoke(main, ["--help"])
    assert listed.exit_code == 0 and "  eval " in listed.output
    assert "needs the [eval] extra" in listed.output
    result = CliRunner().invoke(main, ["eval", str(example_docs), "--limit", "1"])
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "Error: canopy eval needs the [eval] extra, which is not installed here (bm25s is "
        "missing): pip install 'bm25s>=0.2'"]


def test_the_servers_import_no_wing_but_the_http_mounts() -> None:
    """The stdio MCP server, `canopy serve` and `canopy index` (with a Ray address configured)
    load no wing when imported, nor Ray: nothing of a wing can print on the stdio channel, and
    the core runs where no wing's extra is installed."""
    code = ("import sys\n"
            "import canopy.server.stdio, canopy.server.mcp_app, canopy.server.http, "
            "canopy.server.service, canopy.server.runtime, canopy.server.api\n"
            "import canopy.server.cli, canopy.server.cli.serve, canopy.server.cli.index\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith("
            "('ray.', 'canopy.server.wings.'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "CANOPY_DISTRIBUTED__RAY_ADDRESS": "auto"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
