"""Answer evaluation (server/wings/eval/answers.py, `canopy eval --answers`) against the fake
endpoint.

The judge's verdicts must be mapped back through the position swap: a judge that always picks
the answer shown first must score both methods 0.5, and a position-blind judge that prefers one
method's answers must score it 1.0 whichever side it was shown on. Unreadable verdicts are
counted, never raised.
"""

from __future__ import annotations

import asyncio
import math
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from canopy.errors import ConfigError
from canopy.llm import ChatClient
from canopy.server.cli import main
from canopy.server.runtime import build_index, open_workspace
from canopy.server.wings.eval.answers import (
    CRITERIA,
    EvalQuestion,
    Judgment,
    check_methods,
    generate_questions,
    judge_all,
    read_questions,
    score,
)
from canopy.server.wings.eval.eval_cli import NO_LLM
from canopy.settings import LLMSettings
from tests.conftest import EXAMPLES, offline_env
from tests.fakes.openai_server import FakeOpenAI

QUESTIONS = [EvalQuestion(f"What are the main themes of part {i}?") for i in range(6)]
# Method A's answers are longer, more varied and cite more; B's are short and direct.
LONG = [f"Part {i} covers suppliers, recalls, budgets and people in detail [Data: Reports (1)] "
        f"and projects, risks and partners [Data: Reports (2)]." for i in range(6)]
SHORT = [f"Part {i}: suppliers." for i in range(6)]


def client_for(fake: FakeOpenAI) -> ChatClient:
    return ChatClient(LLMSettings(base_url=fake.base_url, model="fake"), backoff_base=0.01)


def judged(fake: FakeOpenAI, a: list[str], b: list[str], repeats: int = 2) -> list[Judgment]:
    return asyncio.run(judge_all(client_for(fake), QUESTIONS, a, b, repeats=repeats))


def by_criterion(fake: FakeOpenAI, a: list[str], b: list[str]) -> dict[str, float]:
    return {c.criterion: c.win_rate for c in score(judged(fake, a, b))}


class TestPositionSwapping:
    def test_a_judge_that_always_picks_the_first_answer_scores_one_half(
            self, fake_openai: FakeOpenAI) -> None:
        for _ in range(len(QUESTIONS) * len(CRITERIA) * 2 * 2):
            fake_openai.enqueue("judge", {"reasoning": "The first is better.", "winner": 1})
        scores = score(judged(fake_openai, LONG, SHORT))
        assert [c.win_rate for c in scores] == [0.5] * 4
        assert all(c.first_chosen == 1.0 and c.malformed == 0 for c in scores)

    def test_a_position_blind_judge_credits_the_method_not_the_position(
            self, fake_openai: FakeOpenAI) -> None:
        rates = by_criterion(fake_openai, LONG, SHORT)
        assert rates == {"comprehensiveness": 1.0, "diversity": 1.0, "empowerment": 1.0,
                         "directness": 0.0}
        swapped = by_criterion(fake_openai, SHORT, LONG)
        assert swapped == {c: 1.0 - r for c, r in rates.items()}

    def test_every_pair_is_judged_in_both_orders_for_every_repeat(
            self, fake_openai: FakeOpenAI) -> None:
        js = judged(fake_openai, LONG, SHORT, repeats=3)
        assert len(js) == len(QUESTIONS) * len(CRITERIA) * 3 * 2
        keys = {(j.question, j.criterion, j.repeat) for j in js}
        assert all(sum(1 for j in js if (j.question, j.criterion, j.repeat) == k) == 2
                   and {j.a_first for j in js if (j.question, j.criterion, j.repeat) == k}
                   == {True, False} for k in keys)
        prompts = {r.body["messages"][0]["content"] for r in fake_openai.requests}
        assert len(prompts) == len(js)  # each repeat is its own request, not a cache hit


class TestScores:
    def test_ties_count_half_and_malformed_verdicts_are_counted_and_left_out(self) -> None:
        js = [Judgment(0, "directness", 1, True, "A"), Judgment(0, "directness", 1, False, "tie"),
              Judgment(1, "directness", 1, True, None), Judgment(1, "directness", 1, False, "B")]
        (c,) = score(js)
        assert (c.a_wins, c.b_wins, c.ties, c.malformed, c.questions) == (1, 1, 1, 1, 2)
        assert c.per_question == [0.75, 0.0] and c.win_rate == 0.375
        assert c.ci_low <= c.win_rate <= c.ci_high

    def test_the_interval_is_seeded_and_narrows_with_more_questions(self) -> None:
        def judgments(n: int) -> list[Judgment]:
            return [Judgment(i, "diversity", 1, True, "A" if i % 3 else "B") for i in range(n)]

        few, many = score(judgments(9))[0], score(judgments(90))[0]
        assert score(judgments(9))[0].ci_low == few.ci_low  # same seed, same interval
        assert many.ci_high - many.ci_low < few.ci_high - few.ci_low

    def test_unreadable_verdicts_from_the_endpoint_do_not_stop_the_run(
            self, fake_openai: FakeOpenAI) -> None:
        fake_openai.malformed_next(4)  # two judgments, each answered and repaired badly
        js = asyncio.run(judge_all(client_for(fake_openai), QUESTIONS[:1], LONG[:1], SHORT[:1],
                                   repeats=1, criteria=["directness"]))
        (c,) = score(js)
        assert c.malformed == 2 and c.questions == 0 and math.isnan(c.win_rate)


def test_questions_are_personas_times_tasks_times_questions(fake_openai: FakeOpenAI) -> None:
    description, qs = asyncio.run(generate_questions(
        client_for(fake_openai), "- Helio Cells: a supplier\n- Kestrel: a robot", personas=3,
        tasks=2, questions=2))
    assert description.startswith("A collection about Helio Cells")
    assert len(qs) == 12 and len({(q.persona, q.task) for q in qs}) == 6
    assert fake_openai.count("persona_tasks") == 3 and fake_openai.count("questions") == 6


def test_a_question_file_may_be_plain_lines_or_json_lines(tmp_path: Path) -> None:
    plain = tmp_path / "q.txt"
    plain.write_text('What recurs?\n\n{"question": "Which trends?", "gold": []}\n', "utf-8")
    assert read_questions(plain) == ["What recurs?", "Which trends?"]


def test_methods_are_two_different_known_ones() -> None:
    assert check_methods(["global:1", "basic"]) == ["global:1", "basic"]
    for bad in (["global"], ["local", "local"], ["global", "magic"], ["local:1", "basic"]):
        with pytest.raises(ConfigError):
            check_methods(bad)


@pytest.fixture(scope="module")
def example_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = tmp_path_factory.mktemp("answers") / "docs"
    shutil.copytree(EXAMPLES, docs)
    with offline_env():
        build_index(open_workspace(docs))
    return docs


def test_without_an_llm_the_cli_says_answers_need_an_endpoint(example_index: Path) -> None:
    done = CliRunner().invoke(main, ["eval", str(example_index), "--answers"])
    assert done.exit_code == 1 and done.output == f"Error: {NO_LLM}\n"


def test_the_cli_prints_win_rates_per_criterion_against_the_fake_endpoint(
        example_index: Path, fake_openai: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANOPY_LLM_BASE_URL", fake_openai.base_url)
    monkeypatch.setenv("CANOPY_LLM_MODEL", "fake")
    done = CliRunner().invoke(main, ["eval", str(example_index), "--answers", "--methods",
                                     "global,basic", "--personas", "2", "--tasks", "1",
                                     "--questions", "1", "--repeats", "1"])
    assert done.exit_code == 0, done.output
    assert "global (A) vs basic (B) on 2 questions" in done.output
    for criterion in CRITERIA:
        assert f"| {criterion} |" in done.output
    assert fake_openai.count("judge") == 2 * len(CRITERIA) * 2
    assert "LLM usage:" in done.output and "judge 16" in done.output
