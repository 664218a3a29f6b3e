"""The documentation covers the program: every command of the `canopy` group and every section
and key of the one settings model is documented, so adding one without a word for users fails
here (issue 11: `canopy warm` and `[reports]` had none)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import click
import pytest
from pydantic import BaseModel

from canopy.server.cli import main
from canopy.settings import Settings
from tests.conftest import REPO

README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))


def _documentation() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in (README, *DOCS))


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, command in sorted(group.commands.items()):
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
    """README's table of settings sections: one row per section of canopy/settings.py, naming
    every key in it, so that a new section or key shows up there."""
    rows = [line for line in README.read_text(encoding="utf-8").splitlines()
            if line.startswith(f"| `[{section}]` |")]
    assert len(rows) == 1, f"README.md has no row for [{section}] in its table of sections"
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


# A path of this repository as the docs cite it: `tests/test_links.py`, server/runtime.py. Under
# docs/ only the pages and images (elsewhere "docs" is the user's folder: docs/canopy.toml).
_CITED = re.compile(r"(?<![\w/.~-])((?:tests|benchmarks|server|canopy|indexer|acl|prompts|"
                    r"examples|\.ci)/[\w./-]*\w|docs/[\w-]+\.(?:md|png))")


def test_every_file_the_docs_cite_exists() -> None:
    """What README.md and docs/*.md point to as evidence (a test, a benchmark, a module) is
    there: a renamed or deleted file would leave a claim without its proof."""
    cited = set(_CITED.findall(_documentation()))
    assert len(cited) > 50  # the pattern still finds the citations
    assert sorted(p for p in cited if not (REPO / p).exists()) == []


def test_the_platform_note_names_the_modes_the_link_tests_run() -> None:
    """README's "Platforms" table says tests/test_links.py runs every test in a "descriptors"
    and a "checked paths" mode (the walk Windows takes); that is what its fixture runs."""
    readme = README.read_text(encoding="utf-8")
    source = (REPO / "tests" / "test_links.py").read_text(encoding="utf-8")
    assert '("descriptors" mode)' in readme and '("checked paths" mode' in readme
    assert 'params=["descriptors", "checked paths"]' in source
