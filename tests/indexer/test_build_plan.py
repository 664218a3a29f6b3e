"""`canopy index` says its plan up front (units, extraction and gleaning calls), projects the
rest of the build from its first units, and ends with the calls it really made, by task."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from canopy.indexer.forecast import ExtractionPlan, Forecast, Projection, checkpoint, summaries
from canopy.model import EntityInstance, Extraction, RelationshipInstance
from canopy.server.cli import main
from canopy.server.cli.build_plan import plan_line, projection_line
from canopy.settings import Settings
from tests.conftest import EXAMPLES
from tests.fakes.openai_server import FakeOpenAI

PLAN = re.compile(r"^plan: (\d+) text units to extract with fake-model: (\d+) extraction calls "
                  r"\+ (\d+) to (\d+) gleaning calls .* requests; summaries and reports follow",
                  re.MULTILINE)
PROJECTION = re.compile(r"^projection from the first (\d+) of (\d+) units: about (\d+) extraction "
                        r"\+ (\d+) gleaning \+ (\d+) name-confirmation \+ ([\d,]+) summary \+ "
                        r"([\d,]+) report calls, about "
                        r"([\d,]+) in all; at [\d.]+ calls/s so far, extraction has about \S+ left "
                        r"\(the later stages print their own time left\)$", re.MULTILINE)


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def test_the_plan_is_what_extraction_requests_and_the_projection_is_near_the_real_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import canopy.indexer.forecast

    # The projection waits for the estimate's sample (40 units): on this 17-unit corpus, 8
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES, docs)
    monkeypatch.setattr(canopy.indexer.forecast, "DEFAULT_SAMPLE", 8)
    index = ["index", str(docs), "--index-dir", str(tmp_path / "idx")]
    with FakeOpenAI() as fake:
        monkeypatch.setenv("CANOPY_LLM_BASE_URL", fake.base_url)
        monkeypatch.setenv("CANOPY_LLM_MODEL", "fake-model")
        monkeypatch.setenv("CANOPY_EXTRACT__MAX_GLEANINGS", "2")
        estimate = CliRunner().invoke(main, [*index, "--estimate", "--sample", "8", "--json"])
        assert estimate.exit_code == 0, estimate.output
        estimated = {t["task"]: t["calls"] for t in json.loads(estimate.stdout)["tasks"]}
        fake.reset()
        first = CliRunner().invoke(main, [*index, "--json"])
        assert first.exit_code == 0, first.output
        usage = json.loads(first.stdout)["llm_usage"]
        stats = json.loads(first.stdout)["stats"]
        asked = {task: fake.count(task) for task in ("extract", "glean")}

        plan = PLAN.search(first.stderr)
        assert plan, first.stderr
        units, extract, glean_low, glean_high = map(int, plan.groups())
        assert units == stats["text_units"] == stats["units_extracted"] == 17
        assert extract == usage["extract"]["calls"] == asked["extract"] == units
        assert (glean_low, glean_high) == (units, 2 * units)  # 1 to max_gleanings passes each
        assert glean_low <= usage["glean"]["calls"] == asked["glean"] <= glean_high
        # said before the first request: ahead of the extraction progress lines
        assert first.stderr.index("plan: ") < first.stderr.index("extract: 17 to do")
        # the merge stage says what it merges, and that it is done
        merge = re.search(r"^merge: (\d+) to do$", first.stderr, re.MULTILINE)
        assert merge and f"merge: {merge[1]}/{merge[1]} (100%)" in first.stderr
        assert "summarize:" not in first.stderr

        projection = PROJECTION.search(first.stderr)
        assert projection, first.stderr
        sample, total, p_extract, p_glean, p_resolve, p_summ, p_report, p_all = map(
            _number, projection.groups())
        assert (sample, total) == (checkpoint(17), 17) == (8, 17)  # a real projection
        assert p_extract == units == estimated["extract"]
        assert abs(p_glean - usage["glean"]["calls"]) <= units // 4
        # the estimate's method on the estimate's sample: the same summaries; reports within
        # 30% (the sample's communities are counted from its extractions, where the estimate
        # builds them: 45 against 41 here, which the power law widens to 81 against 63; the
        # build made 66); the total within 10%
        assert p_summ == estimated["summarize"]
        assert abs(p_report - estimated["report"]) <= max(2, estimated["report"] * 3 // 10)
        assert abs(p_all - sum(estimated.values())) <= sum(estimated.values()) // 10
        # a projection from 8 units: the right order of magnitude, not the count
        for projected, real in ((p_summ, usage["summarize"]["calls"]),
                                (p_report, usage["report"]["calls"])):
            assert real / 2 <= projected <= real * 2, (projected, real)
        # names' open pairs: at most one confirmation per unit, as the build asked
        assert p_resolve <= units and usage.get("resolve", {}).get("calls", 0) <= units
        assert p_all == p_extract + p_glean + p_resolve + p_summ + p_report
        assert json.loads(first.stdout)["plan"]["extract_calls"] == extract

        # An update: the plan covers the units the edit changed, and the summary's last line
        # says the calls made by task beside the plan.
        with (docs / "overview.md").open("a", encoding="utf-8") as f:
            f.write("\n\nIngrid Solvang joined the board of Northwind Robotics in 2025.\n")
        fake.reset()
        second = CliRunner().invoke(main, index)
        assert second.exit_code == 0, second.output
    plan = PLAN.search(second.stderr)
    assert plan, second.stderr
    units = int(plan.group(1))
    last = second.stdout.rstrip("\n").splitlines()[-1]
    made = re.fullmatch(r"  LLM calls [\d,]+ by task: extract (\d+), glean (\d+), "
                        r"(?:resolve \d+, )?summarize \d+, "
                        r"report \d+(?:; [\d,]+ more answered from the cache)? "
                        r"\(planned: extract (\d+), glean (\d+)-(\d+)"
                        r"(; projected: about [\d,]+ in all)?\)", last)
    assert made, last
    extract, glean, planned, low, high = map(int, made.groups()[:5])
    assert 0 < units == extract == planned == fake.count("extract")
    assert low <= glean == fake.count("glean") <= high
    if made.group(6):  # an update's projection says it is rougher
        assert "an update" in second.stderr


def test_the_builtin_provider_prints_no_plan_and_no_call_count(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["index", str(EXAMPLES / "suppliers"), "--index-dir",
                                     str(tmp_path / "idx")])
    assert done.exit_code == 0, done.output
    assert "plan:" not in done.stderr and "projection" not in done.stderr
    assert "LLM calls" not in done.stdout
    assert "provider: builtin (offline)" in done.stdout


def _extraction(uid: str, names: list[str], desc: str) -> Extraction:
    ents = tuple(EntityInstance(n, "organization", f"{n} {desc}") for n in names)
    pairs = zip(names, names[1:], strict=False)
    rels = tuple(RelationshipInstance(a, b, f"{a}-{b} {desc}") for a, b in pairs)
    return Extraction(uid, ents, rels, passes=2)


def test_summaries_count_elements_with_several_distinct_descriptions() -> None:
    one = _extraction("u1", ["Helio Cells", "Bluewater"], "supplies")
    same = _extraction("u2", ["HELIO CELLS", "Bluewater"], "supplies")
    other = _extraction("u3", ["Helio Cells", "Bluewater", "Kestrel"], "ships")
    assert summaries([one]) == 0
    # "HELIO CELLS" merges with "Helio Cells", and its description (and its relationship's)
    # differs in case: two elements with two distinct descriptions each
    assert summaries([one, same]) == 2
    # Helio Cells, Bluewater and their relationship now have two descriptions each
    assert summaries([one, other]) == 3
    # an LLM provider leaves descriptions that fit the summary budget joined: no call
    assert summaries([one, other], lambda descs: len(" ".join(descs)) < 40) == 1


def test_the_projection_waits_for_the_estimate_s_sample_in_feed_order() -> None:
    assert [checkpoint(n) for n in (1, 5, 18, 40, 100, 10_000)] == [1, 5, 18, 40, 40, 40]
    events: list[object] = []
    ids = [f"u{i:02d}" for i in range(90)]
    clock = iter([0.0, 10.0, 10.0])
    # a summary budget of 20 tokens: the units' descriptions of A, B and A-B (20 in each half
    # of the sample) do not fit it joined, so each of them is a summary call
    forecast = Forecast(ids, Settings(llm={"base_url": "http://x", "model": "m"},
                                      extract={"summary_max_tokens": 20}), dict,
                        events.append, clock=lambda: next(clock))
    forecast.start()
    assert events == [ExtractionPlan(90, 1, "m")]
    for uid in reversed(ids[20:60]):  # the sample is u00-u39: half of it, and later units
        forecast.finished(uid, _extraction(uid, ["A", "B"], uid))
    assert len(events) == 1
    for uid in ids[:20]:  # the rest of the sample
        forecast.finished(uid, _extraction(uid, ["A", "B"], uid))
    assert len(events) == 2 and isinstance(events[1], Projection)
    p = events[1]
    assert (p.sample_units, p.units, p.calls["extract"], p.calls["glean"]) == (40, 90, 90, 90)
    # A, B and A-B have several descriptions in both halves: no growth to fit, so the flattest
    # power law the estimate allows (exponent 0.5) scales them
    assert p.calls["summarize"] == round(3 * (90 / 40) ** 0.5)
    assert p.eta_s is None  # no request went out (usage is empty): no time left to say
    forecast.finished("u89", None)
    assert len(events) == 2  # said once


def test_the_projection_scales_by_tokens_as_the_estimate_does() -> None:
    """Units of unequal length: the sample's share of the build is its share of the tokens."""
    events: list[object] = []
    ids = [f"u{i:02d}" for i in range(4)]
    tokens = {"u00": 100, "u01": 100, "u02": 600, "u03": 1200}
    # descriptions of 20 words against a summary budget of 20 tokens: several never fit joined
    forecast = Forecast(ids, Settings(llm={"base_url": "http://x", "model": "m"},
                                      extract={"summary_max_tokens": 20}), dict,
                        events.append, tokens=tokens)
    one, two = "one " * 20, "two " * 20
    forecast.start()
    # with 4 units the sample is all of them: measured on u00 (the half) and on all four
    forecast.finished("u00", _extraction("u00", ["A", "B"], one))
    forecast.finished("u01", _extraction("u01", ["A", "B"], two))
    forecast.finished("u02", _extraction("u02", ["C"], "three"))
    forecast.finished("u03", _extraction("u03", ["D"], "four"))
    p = events[1]
    assert isinstance(p, Projection) and p.calls["summarize"] == 3 == summaries(
        [_extraction("u00", ["A", "B"], one), _extraction("u01", ["A", "B"], two)])


def test_the_plan_line_gives_exact_extraction_and_a_gleaning_range() -> None:
    assert "10 extraction calls + no gleaning = 10 requests" in plan_line(
        ExtractionPlan(10, 0, "m"))
    assert "10 gleaning calls (1 pass per unit) = 20 requests" in plan_line(
        ExtractionPlan(10, 1, "m"))
    assert "10 to 30 gleaning calls (up to 3 passes" in plan_line(ExtractionPlan(10, 3, "m"))


def test_the_time_left_is_the_extraction_stage_s_at_its_own_pace() -> None:
    """Summary and report calls are not timed at extraction's pace (a short summary is not a
    long extraction): the time left counts the extraction and gleaning calls still to go."""
    p = Projection(sample_units=8, units=18, calls={"extract": 18, "glean": 18, "summarize": 900,
                                                    "report": 50},
                   calls_made=16, rate=8.0, elapsed_s=2.0, fresh=True)
    assert p.eta_s == (36 - 16) / 8.0
    assert "extraction has about 2s left" in projection_line(p)
