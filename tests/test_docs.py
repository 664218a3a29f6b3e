"""The documentation covers the program: every command of the `canopy` group and every section
and key of the one settings model is documented, so adding one without a word for users fails
here (issue 11: `canopy warm` and `[reports]` had none)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from pydantic import BaseModel

from canopy.server.cli import main
from canopy.settings import Settings
from tests.conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
CONFIGURATION = REPO / "docs" / "configuration.md"  # the table of settings sections
DEVELOPMENT = REPO / "docs" / "development.md"  # the platforms table


def _documentation() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (README, *DOCS))


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command of `group` (the wings' too, which the group loads when asked), and theirs."""
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*prefix, name)
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))


SECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation for name, field in Settings.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}


def test_every_field_of_the_settings_model_is_a_section() -> None:
    assert set(SECTIONS) == set(Settings.model_fields)


@pytest.mark.parametrize("command", [" ".join(c) for c in _commands(main)])
def test_every_command_is_shown_in_the_readme_or_docs(command: str) -> None:
    """`canopy <command>` (sub-commands too: `canopy token revoke`) in a command line or prose."""
    assert re.search(rf"\bcanopy {re.escape(command)}\b", _documentation()), (
        f"`canopy {command}` is not documented in README.md or docs/*.md")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_settings_section_has_a_row_naming_all_its_keys(section: str) -> None:
    """docs/configuration.md's table of settings sections: one row per section of
    canopy/settings.py, naming every key in it, so that a new section or key shows up there."""
    rows = [line for line in CONFIGURATION.read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `[{section}]` |")]
    assert len(rows) == 1, (
        f"docs/configuration.md has no row for [{section}] in its table of sections")
    model = SECTIONS[section]
    named = set(re.findall(r"`([a-z_0-9]+)`", rows[0].split("|")[-2]))
    assert named == set(model.model_fields), (
        f"[{section}]: the row names {sorted(named)}, the model has {sorted(model.model_fields)}")


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_setting_says_what_it_does(section: str) -> None:
    """`canopy init` writes each key's description beside its default: none may be blank."""
    model = SECTIONS[section]
    blank = [name for name, field in model.model_fields.items() if not field.description]
    assert not blank, f"[{section}] keys without a description: {blank}"


# A path of this repository as the docs cite it: `tests/indexer/test_links.py`,
# server/runtime.py. Under docs/ only the pages and images (elsewhere "docs" is the user's
# folder: docs/canopy.toml).
_CITED = re.compile(r"(?<![\w/.~-])((?:tests|benchmarks|server|canopy|indexer|acl|prompts|"
                    r"examples|\.ci)/[\w./-]*\w|docs/[\w-]+\.(?:md|png))")


def test_every_file_the_docs_cite_exists() -> None:
    """What README.md and docs/*.md point to as evidence (a test, a benchmark, a module) is
    there: a renamed or deleted file would leave a claim without its proof."""
    cited = set(_CITED.findall(_documentation()))
    assert len(cited) > 50  # the pattern still finds the citations
    assert sorted(p for p in cited if not (REPO / p).exists()) == []


README_MAX_LINES = 250  # issue 33: a page a newcomer reads; the rest lives under docs/


def test_the_readme_is_a_page_a_newcomer_reads() -> None:
    """README.md says what Canopy is, how to use it on a folder and where the rest lives, in at
    most README_MAX_LINES lines: a topic that grows it past them has a page of its own in docs/
    (issue 33: the README had grown to 1,257 lines of mostly benchmark history)."""
    lines = len(README.read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, more than {README_MAX_LINES}: move a topic to docs/")


def test_the_platform_note_names_the_modes_the_link_tests_run() -> None:
    """docs/development.md's "Platforms" table says tests/indexer/test_links.py runs every test
    in a "descriptors" and a "checked paths" mode (the walk Windows takes); that is what its
    fixture runs."""
    note = DEVELOPMENT.read_text(encoding="utf-8")
    source = (REPO / "tests" / "indexer" / "test_links.py").read_text(encoding="utf-8")
    assert '("descriptors" mode)' in note and '("checked paths" mode' in note
    assert 'params=["descriptors", "checked paths"]' in source


# ---- documented outputs are what the program prints ------------------------------------------

DOCUMENTED_INDEX = "/tmp/canopy-idx"  # the index folder docs/agents.md's commands name
_USAGE_LINE = re.compile(r"^\[\w+ search, provider .* ms\]$")  # a timing: differs run to run


def _fenced_blocks(text: str) -> list[str]:
    """The fenced blocks of a markdown page, dedented (blocks inside list items are indented)."""
    return [textwrap.dedent(m.group(2)) for m in
            re.finditer(r"^( *)```[a-z]*\n(.*?)^\1```", text, re.MULTILINE | re.DOTALL)]


def _documented_queries() -> list[tuple[str, list[str]]]:
    """(command, the output lines shown) for each `canopy query` on the examples in
    docs/agents.md; lines left out are marked "…" and are not compared."""
    out: list[tuple[str, list[str]]] = []
    for block in _fenced_blocks((REPO / "docs" / "agents.md").read_text(encoding="utf-8")):
        for chunk in re.split(r"^(?=\$ )", block, flags=re.MULTILINE):
            command, _, shown = chunk.partition("\n")
            if command.startswith(f"$ canopy query examples/docs --index-dir {DOCUMENTED_INDEX}"):
                out.append((command[2:], [line for line in shown.splitlines()
                                          if line.strip() and line != "…"]))
    return out


def test_the_documented_queries_are_found() -> None:
    assert len(_documented_queries()) >= 7


@pytest.mark.parametrize(("command", "shown"), _documented_queries(),
                         ids=lambda v: v[:60] if isinstance(v, str) else None)
def test_each_documented_query_prints_what_docs_agents_md_shows(
        command: str, shown: list[str], examples_index: Path) -> None:
    """docs/agents.md's example answers (builtin provider) are what `canopy query` prints on
    the examples: every line shown is a line of its output, timings aside."""
    args = shlex.split(command.split(" | ")[0])[1:]  # `| grep ...` only selects lines
    args[args.index(DOCUMENTED_INDEX)] = str(examples_index)
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 0, done.output
    printed = set(done.stdout.splitlines())
    missing = [line for line in shown if not _USAGE_LINE.match(line) and line not in printed]
    assert not missing, (missing, done.stdout[-3000:])


def test_the_documented_settings_error_is_what_canopy_index_prints(tmp_path: Path) -> None:
    """The documented one-line error for a `[chunkin]` typo, printed by `canopy index`."""
    shown = next(line for line in _documentation().splitlines()
                 if line.startswith("Error: docs/canopy.toml: unknown key [chunkin]"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "canopy.toml").write_text("[chunkin]\nchunk_tokens = 600\n", encoding="utf-8")
    done = CliRunner().invoke(main, ["index", str(docs)])
    assert done.exit_code != 0
    assert done.output.strip() == shown.replace("docs/canopy.toml", str(docs / "canopy.toml"))


def _blocks_with_place(text: str) -> Iterator[tuple[int, str, str]]:
    """(offset, language, body) of each fenced block (a fence inside a block is its text)."""
    offset, opened = 0, None
    body: list[str] = []
    for line in text.splitlines(keepends=True):
        fence = re.match(r"^( *)```(\S*)\s*$", line)
        if fence and opened is None:
            opened, body = (offset, fence.group(1), fence.group(2)), []
        elif fence and opened is not None and fence.group(1) == opened[1] and not fence.group(2):
            yield opened[0], opened[2], textwrap.dedent("".join(body))
            opened = None
        elif opened is not None:
            body.append(line)
        offset += len(line)


_LABEL = re.compile(r"builtin|offline|\bfake\b|no provider involved", re.IGNORECASE)


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_printed_output_says_which_provider_printed_it(page: Path) -> None:
    """A block without a language is a program's output (diagrams say `text`, code its
    language): the paragraph before it names the provider that printed it, the builtin one
    (offline) or the suite's fake endpoint (not a language model), or says none was involved,
    so no reader takes an offline or fake answer for a model's."""
    text = page.read_text(encoding="utf-8")
    unlabelled = [text[:start].count("\n") + 1 for start, language, _ in _blocks_with_place(text)
                  if not language and not _LABEL.search(text[max(0, start - 800):start])]
    assert not unlabelled, f"{page.name}: output blocks without a provider at lines {unlabelled}"


def _example_headings() -> set[str]:
    """The headings of the example corpus's own files (`# Project Tern: Battery Pack`)."""
    return {line.strip() for path in (REPO / "examples").rglob("*.md")
            for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_no_example_file_text_is_a_heading_of_the_docs(page: Path) -> None:
    """A document of the examples quoted in the docs sits in a fenced block: outside one, its
    `# Project Tern: Battery Pack` would read as a heading of the page itself."""
    examples = _example_headings()
    assert "# Project Tern: Battery Pack" in examples
    stray, fence = [], None
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        opening = re.match(r"^( *)```(\S*)\s*$", line)
        if opening and fence is None:
            fence = opening.group(1)
        elif opening and fence is not None and opening.group(1) == fence and not opening.group(2):
            fence = None
        elif fence is None and line.strip() in examples:
            stray.append(number)
    assert not stray, f"{page.name}: example text as a heading at lines {stray}"


# A run's own numbers: timings ("in 11.6s", "37.0s (17.2s indexing"), its index and corpus paths.
_RUN_SPECIFIC = [(re.compile(r"\d+(?:\.\d+)?s\b"), "<t>"),
                 (re.compile(r"into \S+ in"), "into <index> in"),
                 (re.compile(r"documents of \S+ into"), "documents of <docs> into")]


def _masked(line: str) -> str:
    for pattern, mask in _RUN_SPECIFIC:
        line = pattern.sub(mask, line)
    return line


def _readme_demo_output() -> list[str]:
    """The lines of README's `canopy demo` output block ("…" marks lines left out)."""
    readme = README.read_text(encoding="utf-8")
    block = next(body for _, language, body in _blocks_with_place(readme)
                 if not language and body.startswith("Indexed "))
    return [line for line in block.splitlines() if line.strip() and line != "…"]


def test_the_readme_demo_output_is_what_canopy_demo_prints(
        examples_index: Path, tmp_path: Path) -> None:
    """README's quick start quotes `canopy demo` (builtin provider): each line it shows is a line
    the demo prints, timings and paths aside, so the first thing a newcomer runs matches the
    page they read it on."""
    shutil.copytree(examples_index, tmp_path / "index")  # the demo updates it (a no-op here)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "canopy.server.cli", "demo", "--index-dir", str(tmp_path / "index")],
        cwd=tmp_path, env=env, capture_output=True, text=True, encoding="utf-8", timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    printed = {_masked(line) for line in done.stdout.splitlines()}
    shown = _readme_demo_output()
    assert len(shown) >= 5
    missing = [line for line in shown if _masked(line) not in printed]
    assert not missing, (missing, done.stdout[:3000])
