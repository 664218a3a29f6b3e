"""Every table of figures in README.md and docs/*.md is rendered from a results file that names
its commit and command (benchmarks/render_tables.py): a figure edited by hand, a results file
changed without re-rendering, or a table of figures written outside a rendered block fails here.

What counts as a table of figures (render_tables.figure_tables_outside_blocks): a markdown table
outside fenced blocks with a body cell that is only numbers and units ("0.556 / 0.775 / 0.880",
"3.40 s", "1.81x"), or whose header names a measure ("figure", "R@10", "latency", "MB"...) over
cells holding numbers outside code. Tables of names, settings, modules or prose are not.

A measured figure is not written in a sentence either (render_tables.prose_figures): a number with
a unit of time, size, rate, share or ratio, or a score beside its name, outside code, tables and
rendered blocks, is either a setting or a bound ("default 30 s", "every 2 s", "at most 16 MB",
"`load_timeout_s` (300 s"), one of the phrases of NOT_MEASURED below, or a figure to render or to
point to its table or its benchmark's command instead."""

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
    prose_figures,
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


# ---- figures in prose ---------------------------------------------------------------------------

# Figures in the docs' sentences that no run measured, each with why: a constant of the code, the
# default of an option, the setup of a run or of an example. A figure is let through only where it
# stands inside one of these phrases (their spaces match line breaks too); every phrase must still
# be in the docs.
NOT_MEASURED = {
    "cuts it to 70%": "the limiter's window on a 429, 503 or timeout (_OVERLOAD_FACTOR, "
                      "canopy/limiter.py)",
    "shrinks to 70%": "the same constant, in docs/providers.md",
    "64 KiB runs": "a run length the spread table compares pages with, not a result",
    "1 MiB runs": "the same, the other run length",
    "1 MiB chunks": "the same run lengths, as content-addressed chunks",
    "64 KiB chunks": "the same",
    "120 s after the switch": "how long a replica keeps a superseded generation open (_DRAIN_S, "
                              "server/wings/publish/replica.py)",
    "15 s after its object store": "when the example's call was made, the setup of the example",
    "the watcher's debounce, 1 s": "`canopy watch --debounce`'s default",
    "for 5 minutes": "how long replica_watch.py's run lasts, its setup",
    "Ray's 30 s of retries": "Ray's own default, which Canopy's shorter check replaces",
    "95% interval": "the bootstrap interval's confidence level, a parameter",
    "doubling to 5 minutes": "the cap of the retry backoff after a failed write",
    "reads 100%": "the progress display's end, not a measurement",
    "held to 8 MB": "LanceDB's metadata cache bound (METADATA_CACHE_MAX, canopy/vectors.py)",
}

# Pages whose prose figures another change is moving out (issue 33): skipped while they hold
# some, and to be dropped from here once they hold none (the test then fails to say so).
PENDING: dict[str, str] = {}


def _prose_figures(page: Path) -> list[tuple[int, str]]:
    found = prose_figures(page.read_text(encoding="utf-8"), tuple(NOT_MEASURED))
    return [(line, figure) for line, figure, phrase in found if not phrase]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_measured_figure_is_written_in_a_sentence(page: Path) -> None:
    found = _prose_figures(page)
    if page.name in PENDING:
        assert found, f"{page.name} holds no figure in prose any more: drop it from PENDING"
        pytest.skip(f"{page.name}: {PENDING[page.name]}")
    assert found == [], (
        f"{page.name}: measured figures in prose at (line, figure) {found}: render them from "
        "benchmarks/results in a `<!-- table: NAME -->` block, or point to the table or the "
        "benchmark's command instead (a setting or a bound: see NOT_MEASURED)")


def test_every_phrase_let_through_is_still_in_the_docs() -> None:
    used = {phrase for page in PAGES
            for *_, phrase in prose_figures(page.read_text(encoding="utf-8"),
                                            tuple(NOT_MEASURED)) if phrase}
    assert sorted(set(NOT_MEASURED) - used) == []


def test_a_figure_written_in_prose_is_found() -> None:
    text = ("A restart took 0.358 s, checking 86.8 MB;\nthe slope was 7.6 ± 1.6 MB/min, "
            "60.9-69.3 s after\nthe manifest, 4.9x slower, 29 and 18 times cheaper, 7.5% of "
            "pages,\nprecision 0.929, lower by 0.07 R@10.\n\n"
            "Settings: the bound (default 30 s), polled every 2 s, at most 16 MB a generation,\n"
            "retried after 5 s, under 1 MB of code, `load_timeout_s` (300 s), 1 s of quiet by "
            "default,\na bound of 1 MB/min; 429s; `took 5.2 s`; 3,500 tokens; 17 documents.\n\n"
            "```\nIndexed 17 documents in 5.2 s\n```\n"
            "| step | wall |\n|---|---|\n| build | 2.2 s |\n"
            "<!-- table: figures -->\nbuild 2.2 s\n<!-- /table -->\n"
            "It stays at 70% of the window.\n")
    found = prose_figures(text, ("at 70% of",))
    assert [(line, figure) for line, figure, phrase in found if not phrase] == [
        (1, "0.358 s"), (1, "86.8 MB"), (2, "7.6 ± 1.6 MB/min"), (2, "60.9-69.3 s"), (3, "4.9x"),
        (3, "18 times"), (3, "7.5%"), (4, "precision 0.929"), (4, "0.07 R@10")]
    assert [(line, phrase) for line, _, phrase in found if phrase] == [(19, "at 70% of")]
