"""Every table of figures in README.md and docs/*.md is rendered from a results file that names
its commit and command (benchmarks/render_tables.py): a figure edited by hand, a results file
changed without re-rendering, or a table of figures written outside a rendered block fails here.

What counts as a table of figures (render_tables.figure_tables_outside_blocks): a markdown table
outside fenced blocks with a body cell that is only numbers and units ("0.556 / 0.775 / 0.880",
"3.40 s", "1.81x"), or whose header names a measure ("figure", "R@10", "latency", "MB"...) over
cells holding numbers outside code. Tables of names, settings, modules or prose are not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.render_tables import (
    RESULTS,
    blocks,
    figure_tables_outside_blocks,
    is_figure,
    markdown,
    pages,
    rendered,
    stale_blocks,
    table_for,
)
from tests.conftest import REPO

PAGES = pages(REPO)


def test_the_docs_hold_rendered_tables() -> None:
    """README's figures and the retrieval table at least: the blocks are found."""
    names = {m["name"] for page in PAGES for m in blocks(page.read_text(encoding="utf-8"))}
    assert {"figures", "retrieval_eval"} <= names, names


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_rendered_block_is_what_its_results_file_renders(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert stale_blocks(text) == [], (
        f"{page.name}: re-render with `python benchmarks/render_tables.py`")
    assert rendered(text) == text


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_table_of_figures_stands_outside_a_rendered_block(page: Path) -> None:
    lines = figure_tables_outside_blocks(page.read_text(encoding="utf-8"))
    assert lines == [], (
        f"{page.name}: tables of figures at lines {lines} are not rendered from "
        "benchmarks/results (put them in a `<!-- table: NAME -->` block)")


def test_every_table_names_the_commit_and_command_of_its_run() -> None:
    for page in PAGES:
        for match in blocks(page.read_text(encoding="utf-8")):
            table = table_for(match["name"])
            assert table.runs and all(r.commit and r.command for r in table.runs), match["name"]
            assert all(f"commit {r.commit}, `{r.command}`" in match["body"] for r in table.runs)


def test_a_changed_results_file_makes_its_block_stale(tmp_path: Path) -> None:
    """The check compares figures, not just layout: one score changed in the JSON is caught."""
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "figures" not in stale_blocks(readme, results)
    path = results / "retrieval_eval.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    local = next(s for s in data["datasets"]["multihop-rag"]["scores"] if s["tool"] == "local")
    local["recall"]["10"] = 0.123
    path.write_text(json.dumps(data), encoding="utf-8")
    assert "figures" in stale_blocks(readme, results)
    assert "| 0.123 / " in markdown(table_for("figures", results))


def test_a_results_file_without_commit_or_command_backs_no_table(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results)
    path = results / "router_eval_1a596b2.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    del data["command"]
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match="names no commit or no command"):
        table_for("router_eval", results)


def test_a_transcribed_table_must_say_where_it_was_recorded(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps({
        "commit": "abc1234", "command": "python benchmarks/x.py",
        "tables": {"a": {"header": ["n", "s"], "rows": [["1", "2.0 s"]]}}}), encoding="utf-8")
    with pytest.raises(ValueError, match="where its figures were recorded"):
        table_for("t/a", tmp_path)


def test_a_hand_written_table_of_figures_is_found() -> None:
    text = ("Intro.\n\n| what | R@10 |\n|---|---|\n| local | 0.880 |\n\n"
            "| what | figure |\n|---|---|\n| build | 2.2 s, 331 MB peak |\n\n"
            "```\n| printed | 1.0 |\n|---|---|\n| x | 2.0 |\n```\n"
            "| section | keys |\n|---|---|\n| `[llm]` | `base_url`, `timeout_s` (120 s) |\n")
    assert figure_tables_outside_blocks(text) == [3, 7]


def test_figure_cells() -> None:
    figures = ["0.556 / 0.775 / 0.880", "3.40 s / 2.51 s", "348 -> 407; 0.13", "**1.81x**",
               "12,487", "37,578 (measured)"]
    words = ["filelock 4.3.1", "`[llm]`", "per request (120 s), retries", "level 0", ""]
    assert all(map(is_figure, figures)) and not any(map(is_figure, words))
