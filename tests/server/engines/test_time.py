"""Time as an axis (issue 31, "Time"): each document's time and its source, `since` / `until` on
every search tool (the REST API's in tests/wings/rest/test_rest_time.py), and global search's
period-by-period answer to questions about change.

The corpus is a DEV subset of MultiHop-RAG's dated news (September to December 2023), written
as Markdown with front matter as a team's exported articles carry it; the articles of
September sit under archive/, which only the `editor` may read, so for the `intern` that month
does not exist: no count, citation or period shows it. Indexed once with the builtin provider;
the change question runs with the builtin provider and with an LLM endpoint (the suite's fake).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client

from canopy.errors import ConfigError, InvalidArgument
from canopy.indexer.doc_time import document_time, stated_date
from canopy.llm import ChatClient
from canopy.model import Document, Finding, Report, TextUnit
from canopy.periods import period_granularity, period_of, time_window
from canopy.providers.base import MapPoint
from canopy.providers.llm_provider import LLMProvider
from canopy.server.context import QueryContext
from canopy.server.engines import global_search
from canopy.server.engines.change_questions import change_question
from canopy.server.engines.global_change import period_citations, period_evidence
from canopy.server.engines.router import choose_route
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.server.wings.eval.retrieval import split_of
from canopy.settings import LLMSettings, TimeRule, TimeSettings, load_settings
from tests.conftest import NEWS, offline_env, require_shared
from tests.fakes.openai_server import FakeOpenAI

pytestmark = pytest.mark.anyio

PER_MONTH = 9  # articles a month: the OpenAI ones first (at most 4), then the month's earliest
EVOLUTION = "How did OpenAI's situation evolve from September to December 2023?"
POLICY = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "archive/**"
labels = ["archive"]

[acl.principals]
editor = ["staff", "archive"]
intern = ["staff"]
"""
WINDOW = {"since": "2023-11", "until": "2023-11-30"}
SEARCHES: list[tuple[str, dict[str, Any]]] = [
    ("search", {"query": "What did the OpenAI board do?"}),
    ("global_search", {"query": "What are the main themes?"}),
    ("local_search", {"query": "What happened to Sam Altman at OpenAI?"}),
    ("drift_search", {"query": "What happened at OpenAI and who was involved?"}),
    ("basic_search", {"query": "OpenAI board", "k": 20}),
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def dev_articles() -> list[dict[str, str]]:
    """The subset: DEV articles (their titles hashed as questions are, split_of)
    of September to December 2023, PER_MONTH a month."""
    articles = json.loads(require_shared(NEWS).read_text(encoding="utf-8"))
    dev = sorted((a for a in articles if split_of(a["title"]) == "dev"
                  and "2023-09" <= a["published_at"][:7] <= "2023-12"),
                 key=lambda a: (a["published_at"], a["title"]))
    out: list[dict[str, str]] = []
    for month in ("2023-09", "2023-10", "2023-11", "2023-12"):
        of_month = [a for a in dev if a["published_at"][:7] == month]
        topical = [a for a in of_month if "OpenAI" in a["body"]][:4]
        out += topical + [a for a in of_month if a not in topical][:PER_MONTH - len(topical)]
    return out


def write_corpus(docs: Path, articles: list[dict[str, str]]) -> dict[str, str]:
    """The articles as Markdown with front matter (September's under archive/); returns each
    path's publication date."""
    dates: dict[str, str] = {}
    for i, a in enumerate(articles):
        day = a["published_at"][:10]
        folder = "archive" if day < "2023-10" else "news"
        slug = re.sub(r"[^a-z0-9]+", "-", a["title"].lower()).strip("-")[:50]
        path = f"{folder}/{i:02d}-{slug}.md"
        head = yaml.safe_dump({"title": a["title"], "source": a["source"],
                               "published": dt.date.fromisoformat(day),
                               "category": a["category"]}, sort_keys=False, allow_unicode=True)
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        (docs / path).write_text(f"---\n{head}---\n# {a['title']}\n\n{a['body']}",
                                 encoding="utf-8")
        dates[path] = day
    return dates


@pytest.fixture(scope="module")
def news(tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[CanopyService, dict[str, str]]]:
    docs = tmp_path_factory.mktemp("dated-news")
    dates = write_corpus(docs, dev_articles())
    (docs / "canopy.toml").write_text(POLICY, encoding="utf-8")
    with offline_env():
        ws = open_workspace(docs, index_dir=docs.parent / f"{docs.name}-index")
        build_index(ws)
        svc = CanopyService(ws)
    yield svc, dates
    svc.close()


def paths_in(result: Any) -> set[str]:
    """Document paths a result names anywhere (citations, context, answer)."""
    return set(re.findall(r"(?:archive|news)/\d\d-[a-z0-9-]+\.md", json.dumps(result)))


# ---- document time: pure ---------------------------------------------------------------------


def test_front_matter_wins_then_a_rule_then_the_text_then_the_file_time() -> None:
    rules = TimeSettings(rules=[TimeRule(glob="minutes/**", date=dt.date(2020, 5, 1))])
    mtime = int(dt.datetime(2024, 3, 2, tzinfo=dt.UTC).timestamp() * 1e9)
    text = "Posted on 6 October 2023. Last reviewed 2024-01-01."
    dated = [
        document_time("minutes/a.md", (("published", "November 27, 2023"),), text, mtime, rules),
        document_time("minutes/a.md", (), text, mtime, rules),
        document_time("notes/a.md", (), text, mtime, rules),
        document_time("notes/a.md", (), "No date here.", mtime, rules),
        document_time("notes/a.md", (), "No date here.", 0, rules),
    ]
    assert [(d.time, d.source) for d in dated] == [
        ("2023-11-27", "front_matter:published"), ("2020-05-01", "rule:minutes/**"),
        ("2023-10-06", "text"), ("2024-03-02", "mtime"), ("", "")]


def test_a_pattern_rule_reads_the_date_from_the_path_and_needs_a_year_group() -> None:
    rules = TimeSettings(rules=[TimeRule(
        glob="**/*.md", pattern=r"(?P<year>\d{4})-(?P<month>\d{2})(?:-(?P<day>\d{2}))?")])
    assert document_time("board/2023-07-minutes.md", (), "", 0, rules).time == "2023-07-01"
    assert document_time("board/2023-07-19.md", (), "", 0, rules).time == "2023-07-19"
    with pytest.raises(ValueError, match="year"):
        TimeRule(glob="**", pattern=r"(?P<month>\d{2})")
    with pytest.raises(ValueError, match="either date or pattern"):
        TimeRule(glob="**")


def test_time_rules_load_from_canopy_toml_and_a_bad_one_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "canopy.toml").write_text(
        "[time]\ntext_chars = 0\n[[time.rules]]\nglob = 'minutes/**'\n"
        "pattern = '(?P<year>\\d{4})-(?P<month>\\d{2})'\n[[time.rules]]\nglob = 'old/**'\n"
        "date = 2020-05-01\n", encoding="utf-8")
    settings = load_settings(tmp_path)
    assert settings.time.text_chars == 0
    assert [(r.glob, r.date) for r in settings.time.rules] == [
        ("minutes/**", None), ("old/**", dt.date(2020, 5, 1))]
    (tmp_path / "canopy.toml").write_text(
        "[[time.rules]]\nglob = 'a/**'\ndate = 2020-05-01\npattern = '(?P<year>\\d{4})'\n",
        encoding="utf-8")
    with pytest.raises(ConfigError, match="give either date or pattern") as raised:
        load_settings(tmp_path)
    assert "\n" not in str(raised.value)


def test_a_date_the_text_states_late_does_not_date_it_and_impossible_dates_are_skipped() -> None:
    late = "x " * 300 + "on 6 October 2023"
    assert document_time("a.md", (), late, 0, TimeSettings()).source == ""
    assert stated_date("filed 31 February 2023, published March 3, 2023") == dt.date(2023, 3, 3)


def test_since_and_until_name_whole_months_and_years_and_refuse_empty_windows() -> None:
    assert time_window("2023-10", "2023") == time_window("2023-10-01", "2023-12-31")
    assert time_window(None, None) is None
    w = time_window("2023-11", "2023-11")
    assert w is not None and w.holds("2023-11-30") and not w.holds("2023-12-01")
    assert not w.holds("")  # an undated unit is in no window
    for since, until in (("2023-13", None), ("yesterday", None), ("2023-12", "2023-11")):
        with pytest.raises(InvalidArgument):
            time_window(since, until)


def test_periods_are_the_finest_cut_of_the_dates_into_at_most_twelve() -> None:
    monthly = [f"{y}-{m:02d}-15" for y in (2021, 2022, 2023) for m in range(1, 13)]
    assert period_granularity(["2023-09-02", "2023-12-30"]) == "month"
    assert period_granularity(monthly) == "quarter"  # 36 months, 12 quarters
    assert period_granularity(monthly + ["2020-06-01"]) == "year"
    assert period_granularity([f"{y}-01-01" for y in range(1950, 2024)]) == "decade"
    assert period_of("2023-11-02", "quarter") == "2023-Q4"


def _report(cid: str, units: tuple[str, ...], rating: float = 5.0, level: int = 1) -> Report:
    return Report(cid, level, cid, "", rating, "", (Finding("f", "e", (), (), units),), units, cid)


def test_a_units_evidence_goes_to_one_period_and_one_community_per_question() -> None:
    """A nested pair of communities shares units: each unit is read once per period, by the
    better-rated community; periods are by the units' documents, and a period cites its own
    reports and units only."""
    docs = {m: Document(f"d{m}", f"news/{m}.md", "h", f"Title {m}", 1, (), (), f"2023-{m}-15",
                        "front_matter:published") for m in ("09", "10")}
    units = {f"u{m}{i}": (TextUnit(f"u{m}{i}", f"d{m}", i, f"OpenAI text {m}", 3, 0, 1), docs[m])
             for m in ("09", "10") for i in range(2)}
    parent = _report("c0", ("u090", "u091", "u100"), rating=7, level=0)
    child = _report("c1", ("u090", "u101"), rating=7, level=1)
    evidence = period_evidence("OpenAI?", [parent, child], units, lambda u, d: u.text)
    assert evidence.periods == ["2023-09", "2023-10"]
    read = {p: {r.community_id: r.text_unit_ids for r in rs} for p, rs in evidence.reports.items()}
    assert read == {"2023-09": {"c1": ("u090",), "c0": ("u091",)},
                    "2023-10": {"c1": ("u101",), "c0": ("u100",)}}
    cited = period_citations("2023-10", [MapPoint(description="x", score=50,
                                                  report_ids=["c0", "c9"])], evidence)
    assert [(c.kind, c.id, c.period) for c in cited] == [
        ("report", "c0", "2023-10"), ("text_unit", "u100", "2023-10")]


CHANGE = ["How did the antitrust case against Google evolve?", "What changed since June?",
          "How has Tesla's market share changed over the past year?",
          "What was the trend in interest rates between October and December?",
          "How did coverage of OpenAI shift from September to December 2023?",
          "What has changed since the recall?", "What is the timeline of the Tern recall?"]
NOT_CHANGE = ["What are the main themes?", "Who leads Project Kestrel?",
              "How many packs were recalled?", "What changes does the bill propose?",
              "How does the BMS work?", "What did the article say about growth?",
              "Did the Fed raise rates in November?"]


@pytest.mark.parametrize("question", CHANGE)
def test_a_question_about_change_is_recognised_by_its_grammar(question: str) -> None:
    assert change_question(question) is not None


@pytest.mark.parametrize("question", NOT_CHANGE)
def test_other_questions_are_not_questions_about_change(question: str) -> None:
    assert change_question(question) is None


# ---- the index and the tools ------------------------------------------------------------------


def test_each_document_records_its_time_and_its_source(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, dates = news
    store = svc.ws.store(must_exist=True)
    try:
        with store.snapshot() as snap:
            rows = {r.document.path: r.document for r in snap.all_documents().values()}
    finally:
        store.close()
    assert {p: (d.time, d.time_source) for p, d in rows.items()} == {
        p: (day, "front_matter:published") for p, day in dates.items()}


async def test_a_unit_resource_shows_its_documents_date_and_its_source(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, dates = news
    async with Client(build_server(svc, principal_name="intern")) as client:
        found = await client.call_tool("basic_search", {"query": "OpenAI", "k": 1})
        unit = next(c for c in found.structured_content["citations"] if c["kind"] == "text_unit")
        text = (await client.read_resource(f"canopy://units/{unit['id']}")).contents[0].text
    assert f"dated {dates[unit['document']]} (front matter: published)" in text


@pytest.mark.parametrize(("tool", "args"), SEARCHES, ids=[t for t, _ in SEARCHES])
async def test_every_search_tool_cites_only_evidence_of_its_window(
        news: tuple[CanopyService, dict[str, str]], tool: str, args: dict[str, Any]) -> None:
    """No document of another month is named anywhere in the result; a cited report has
    evidence from the window (read without one), and so do cited entities."""
    svc, dates = news
    inside = {p for p, d in dates.items() if "2023-11-01" <= d <= "2023-11-30"}
    async with Client(build_server(svc, principal_name="editor")) as client:
        whole = await client.call_tool(tool, args)
        windowed = await client.call_tool(tool, {**args, **WINDOW})
    assert not windowed.is_error, windowed.content
    result = windowed.structured_content
    assert result["citations"]
    assert paths_in(result) <= inside, paths_in(result) - inside
    unwindowed = paths_in(whole.structured_content)
    assert not unwindowed or unwindowed - inside  # the window, not the question, did it
    with svc.context("editor") as ctx:
        reports = await ctx.reader.reports(c["id"] for c in result["citations"]
                                           if c["kind"] == "report")
        entities = ctx.reader.entity_rows(c["id"] for c in result["citations"]
                                          if c["kind"] == "entity")
        units = [u for r in reports.values() for f in r.findings for u in f.text_unit_ids]
        units += [u for e in entities.values() for u in e.entity.text_unit_ids]
        times = ctx.reader.unit_times(units)
    for r in reports.values():
        assert any(times[u][:7] == "2023-11" for f in r.findings for u in f.text_unit_ids)
    for e in entities.values():
        assert any(times[u][:7] == "2023-11" for u in e.entity.text_unit_ids)
    if result["method"] == "global":  # its evidence is the cited reports
        assert reports
    else:
        assert paths_in(result)


async def test_an_unreadable_since_is_the_agents_error(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, _ = news
    async with Client(build_server(svc, principal_name="intern")) as client:
        bad = await client.call_tool("local_search", {"query": "OpenAI", "since": "Tuesday"})
    assert bad.is_error and "since must be an ISO date" in bad.content[0].text  # type: ignore[union-attr]


# ---- questions about change ----------------------------------------------------------------------


def check_periods(result: Any, dates: dict[str, str], periods: list[str]) -> None:
    """Citations come period by period, earliest first; every unit cited in a period is from a
    document of that period; the answer has one section per period, in the same order."""
    cited = [c for c in result.citations if c.period is not None]
    assert [c.period for c in cited] == sorted(c.period for c in cited)
    assert sorted({c.period for c in cited}) == periods
    for c in cited:
        if c.kind == "text_unit":
            assert dates[c.document][:7] == c.period, (c.document, c.period)
    for period in periods:  # each period cites a report and its period's sources
        kinds = {c.kind for c in cited if c.period == period}
        assert kinds == {"report", "text_unit"}, period
    heads = re.findall(r"^## (\d{4}\S*)$", result.answer, re.M)
    assert heads == periods


async def test_an_evolution_question_is_answered_period_by_period_offline(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, dates = news
    assert split_of(EVOLUTION) == "dev"
    with svc.context("editor") as ctx:
        result = await global_search(ctx, EVOLUTION)
    check_periods(result, dates, ["2023-09", "2023-10", "2023-11", "2023-12"])
    assert "answered by month over 4 periods" in (result.coverage.note or "")


async def test_a_caller_who_cannot_read_a_month_gets_no_trace_of_it(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, dates = news
    with svc.context("intern") as ctx:
        result = await global_search(ctx, EVOLUTION)
    check_periods(result, dates, ["2023-10", "2023-11", "2023-12"])
    dump = result.model_dump_json()
    assert "2023-09" not in dump and "archive/" not in dump
    assert "over 3 periods, 2023-10 to 2023-12" in (result.coverage.note or "")


async def test_an_evolution_question_with_an_llm_maps_and_reduces_each_period(
        news: tuple[CanopyService, dict[str, str]], fake_openai: FakeOpenAI) -> None:
    svc, dates = news
    client = ChatClient(LLMSettings(base_url=fake_openai.base_url, model="fake"),
                        backoff_base=0.01)
    with svc.context("editor") as ctx:
        llm = QueryContext(ctx.reader, LLMProvider(client), ctx.settings)
        result = await global_search(llm, EVOLUTION, community_level=0)
    periods = sorted({c.period for c in result.citations if c.period})
    assert fake_openai.count("reduce") == len(re.findall(r"^## 2023", result.answer, re.M)) >= 2
    check_periods(result, dates, periods)
    maps = [r for r in fake_openai.requests if r.task == "map"]
    for request in maps:  # what a period's map reads is from that period only
        body = json.dumps(request.body)
        months = set(re.findall(r"\((2023-\d\d)-\d\d\)", body))
        assert len(months) == 1, months


async def test_the_router_sends_questions_about_change_to_global_search(
        news: tuple[CanopyService, dict[str, str]]) -> None:
    svc, _ = news
    with svc.context("intern") as ctx:
        change = await choose_route(ctx, EVOLUTION)
        point = await choose_route(ctx, "Who is the CEO of OpenAI?")
    assert change.engine == "global" and "changed over time" in change.reason
    assert point.engine != "global"
