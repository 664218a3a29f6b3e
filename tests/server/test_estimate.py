"""`canopy index --estimate`: the real pipeline on a sample of the units, scaled to the corpus."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner

from canopy.server.cli import main
from canopy.server.estimate import estimate_build
from canopy.server.runtime import build_index, open_workspace
from tests.conftest import EXAMPLES
from tests.fakes.openai_server import FakeOpenAI

LLM = {"max_retries": 1, "backoff_s": 0.01}


def test_extraction_scales_with_units_and_a_whole_sample_matches_the_build(
        tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for name in ("suppliers", "projects"):
        shutil.copytree(EXAMPLES / name, docs / name)
    with FakeOpenAI() as fake:
        ws = open_workspace(docs, index_dir=tmp_path / "idx", llm={"base_url": fake.base_url,
                                                                   **LLM})
        part = estimate_build(ws, sample=3, price_in=1.0, price_out=2.0)
        assert part.sample_units == 3 and part.units > 3
        by_task = {t.task: t for t in part.tasks}
        assert by_task["extract"].sample_calls == 3
        # both samples' calls are billed: the whole one's, and the half one's before it
        assert part.spent_calls > sum(t.sample_calls for t in part.tasks)
        assert by_task["extract"].calls == part.units  # one extraction call per unit
        assert part.cost is not None and part.cost > 0
        assert abs(part.cost - (part.prompt_tokens + 2 * part.completion_tokens) / 1e6) < 1e-6
        assert not (tmp_path / "idx").exists()  # the sample's index was thrown away
        whole = estimate_build(ws, sample=1000)
        real = build_index(ws)
    assert whole.sample_units == whole.units == real.stats["text_units"]
    for t in whole.tasks:  # every unit built: the estimate is the build, task by task
        assert t.calls == real.usage[t.task]["calls"], t.task


def test_with_no_endpoint_the_estimate_says_the_build_costs_nothing(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["index", str(EXAMPLES), "--index-dir", str(tmp_path / "i"),
                                     "--estimate"])
    assert done.exit_code == 0, done.output
    assert "text units" in done.output and "makes no calls" in done.output
    assert not (tmp_path / "i" / "canopy.sqlite").exists()


def test_the_cli_prints_calls_tokens_and_cost_by_task(tmp_path: Path,
                                                      monkeypatch) -> None:  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    with FakeOpenAI() as fake:
        monkeypatch.setenv("CANOPY_LLM_BASE_URL", fake.base_url)
        monkeypatch.setenv("CANOPY_LLM__PRICE_INPUT_PER_MTOK", "0.15")
        monkeypatch.setenv("CANOPY_LLM__PRICE_OUTPUT_PER_MTOK", "0.60")
        done = CliRunner().invoke(main, ["index", str(docs), "--estimate", "--sample", "2"])
    assert done.exit_code == 0, done.output
    for word in ("extract", "report", "total", "cost", "wall time about"):
        assert word in done.output, done.output
    assert not (docs / ".canopy" / "canopy.sqlite").exists()

