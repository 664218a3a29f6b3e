"""Tool results at the default token budget (design §6). Issue 11 found drill_down(entity=...)
returning 15.6k tokens of text plus ~21k of structured content, where agent hosts warn above
10k. Here the largest results, read through the MCP SDK's client in memory, are counted as an
agent host receives them: the text content plus the structured content (compact JSON, as on
the wire), against the default `[query] result_token_limit`; a result that was cut names the
call for the rest, and that call works."""

from __future__ import annotations

import ast
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from mcp.server import MCPServer

from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import QuerySettings
from canopy.store.export import load_graph
from canopy.tokenizer import get_tokenizer
from tests.conftest import EXAMPLES, offline_env

pytestmark = pytest.mark.anyio

LIMIT = QuerySettings().result_token_limit  # the default: what a user who sets nothing gets


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def examples(examples_index: Path) -> Iterator[CanopyService]:
    with offline_env():
        service = CanopyService(open_workspace(EXAMPLES, index_dir=examples_index))
    assert service.ws.settings.query.result_token_limit == LIMIT
    yield service
    service.close()


def _made_up_corpus(folder: Path, n: int) -> None:
    """`n` short articles about made-up companies and people, each its own small graph: many
    communities, so many report cards (a seeded generator: the same corpus every run)."""
    rng = random.Random(11)
    parts = ["bar", "ven", "tor", "mil", "dra", "kos", "lun", "pem", "rav", "sol", "tan", "vik"]

    def word() -> str:
        return "".join(rng.choice(parts) for _ in range(2)).capitalize()

    folder.mkdir(parents=True)
    for i in range(n):
        a, b = f"{word()} {rng.choice(['Systems', 'Labs', 'Works'])}", f"{word()} Holdings"
        p, q, town = f"Ada {word()}", f"Bram {word()}", f"{word()}burg"
        (folder / f"article_{i:03}.md").write_text(
            f"# {a} and {b}\n\n{p} leads {a} in {town}. {a} buys sensors from {b}. {q} manages "
            f"{b} in {town}. {p} met {q} to renew the contract between {a} and {b}. {b} "
            f"delivered late twice, and {a} audited {b} in {town}.\n", encoding="utf-8")


@pytest.fixture(scope="module")
def many_reports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MCPServer]:
    root = tmp_path_factory.mktemp("many-reports")
    _made_up_corpus(root / "docs", 80)
    with offline_env():
        ws = open_workspace(root / "docs", index_dir=root / "index")
        build_index(ws)
        service = CanopyService(ws)
    yield build_server(service)
    service.close()


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def delivered(result: Any) -> int:
    """A tool result's tokens as the client received it: text content + structured content."""
    tok = get_tokenizer()
    structured = json.dumps(result.structured_content, ensure_ascii=False, separators=(",", ":"))
    return tok.count(_text(result)) + tok.count(structured)


def _calls_in(note: str, tool: str) -> list[dict[str, Any]]:
    """The arguments of each `tool(...)` call a note names."""
    return [{k.arg: ast.literal_eval(k.value) for k in ast.parse(m).body[0].value.keywords}
            for m in re.findall(rf"{tool}\([^()]*\)", note)]  # type: ignore[attr-defined]


async def test_the_largest_results_stay_within_the_default_budget(
        examples: CanopyService) -> None:
    """Drill-downs of the entity with the most sources (whole pages of 100), global search at
    every level and dynamically, and the other engines on wide questions: each within the
    budget, and a cut one says so and names a call for the rest."""
    g = load_graph(examples.store)
    most = max(g.entities.values(), key=lambda e: (len(e.text_unit_ids), e.degree, e.id))
    assert len(most.text_unit_ids) >= 10  # an entity with many sources
    levels = sorted({c.level for c in g.communities.values()})
    themes = "What are the main themes of these documents?"
    calls: list[tuple[str, dict[str, Any]]] = [
        ("drill_down", {"entity": most.name, "limit": 100}),
        ("drill_down", {"entity": most.name}),
        ("drill_down", {"limit": 100}),
        ("global_search", {"query": themes}),
        *[("global_search", {"query": themes, "community_level": lv}) for lv in levels],
        ("local_search", {"query": f"What do the documents say about {most.name}?"}),
        ("drift_search", {"query": "How did the 2024 quality incidents shape the 2025 budget?"}),
        ("basic_search", {"query": "supplier battery cells recall audit budget", "k": 100}),
        ("search", {"query": themes}),
    ]
    cut = []
    async with Client(build_server(examples)) as client:
        for tool, args in calls:
            result = await client.call_tool(tool, args)
            assert not result.is_error, (tool, _text(result))
            assert delivered(result) <= LIMIT, (tool, args, delivered(result))
            structured = result.structured_content
            assert structured is not None
            if structured["truncated"]:
                cut.append(tool)
                note = structured["note"]
                assert note and note in _text(result)  # the agent reads it either way
                assert re.search(r"(drill_down|local_search|basic_search)\(|ask basic_search",
                                 note), note
    assert "drill_down" in cut  # the budget was reached
    # local_search and basic_search size their contexts to what the limit leaves (basic_search's
    # k passages share it as excerpts): delivered whole, not cut
    assert "local_search" not in cut and "basic_search" not in cut


async def test_a_cut_drill_down_names_the_exact_call_for_each_lists_next_page(
        examples: CanopyService) -> None:
    """drill_down(entity=..., limit=100) cannot fit 100 of everything: every list shows the
    same number of items, and the calls its note names return the items that follow."""
    g = load_graph(examples.store)
    most = max(g.entities.values(), key=lambda e: (len(e.text_unit_ids), e.degree, e.id))
    async with Client(build_server(examples)) as client:
        first = (await client.call_tool("drill_down", {"entity": most.name, "limit": 100}))
        page = first.structured_content
        assert page is not None and page["truncated"]
        follow = _calls_in(page["note"], "drill_down")
        assert follow and all(args["offset"] == args["limit"] < 100 for args in follow)
        mine = next(args for args in follow if args.get("entity") == most.name)
        nxt = await client.call_tool("drill_down", mine)
        assert delivered(nxt) <= LIMIT
        second = nxt.structured_content
        assert second is not None
    for field in ("relationships", "sources"):
        shown = [json.dumps(x, sort_keys=True) for x in page[field]]
        assert len(shown) == mine["limit"]
        assert second[field] and not set(shown) & {json.dumps(x, sort_keys=True)
                                                   for x in second[field]}, field


async def test_the_cut_keeps_the_most_items_that_fit_whatever_the_character_estimate(
        examples: CanopyService, monkeypatch: pytest.MonkeyPatch) -> None:
    """drill_down's cut estimates from characters, then counts tokens: the estimate decides only
    how many counts it takes, never how many items are kept. An estimate claiming everything
    fits, or nothing does, gives the same result; the real one needs fewer token counts."""
    from canopy.server.engines import drill

    g = load_graph(examples.store)
    most = max(g.entities.values(), key=lambda e: (len(e.text_unit_ids), e.degree, e.id))
    args = {"entity": most.name, "limit": 100}
    counts = [0]
    measured: list[str] = []
    real_count = drill.delivered_tokens

    def counted(result: Any) -> int:
        counts[0] += 1
        measured.append(result.model_dump_json())
        return real_count(result)

    monkeypatch.setattr(drill, "delivered_tokens", counted)
    results = []
    for estimate in (None, lambda _: 1, lambda _: 10**9):
        if estimate is not None:
            monkeypatch.setattr(drill, "delivered_chars", estimate)
        counts[0] = 0
        measured.clear()
        async with Client(build_server(examples)) as client:
            result = await client.call_tool("drill_down", args)
        assert not result.is_error and delivered(result) <= LIMIT
        assert len(set(measured)) == len(measured)  # no state was counted twice
        content = dict(result.structured_content or {})
        content.pop("usage")  # its elapsed time differs from call to call
        results.append((content, counts[0]))
    (page, real_counts), *others = results
    assert page is not None and page["truncated"]
    kept = len(page["relationships"])
    assert 1 < kept < 100
    for other, _ in others:
        assert other == page
    assert real_counts < min(n for _, n in others)  # the estimate saves counts


async def test_a_cut_search_result_is_measured_only_until_it_fits(
        examples: CanopyService, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a context budget set larger than the limit holds, fit_result cuts whole blocks: it
    counts the whole result once, then once per round of cuts until one fits, and never counts
    a result it has just measured again. What it cuts is the ranking's tail: the passages it
    delivers are the first ones of the uncut result, in order."""
    from canopy.server.engines import budget

    measured: list[str] = []
    real_count = budget.delivered_tokens

    def counted(result: Any) -> int:
        measured.append(result.model_dump_json())
        return real_count(result)

    args = {"query": "supplier battery cells recall audit budget", "k": 100}
    monkeypatch.setattr(examples.ws.settings.query, "local_context_tokens", 20_000)
    monkeypatch.setattr(examples.ws.settings.query, "result_token_limit", 100_000)
    async with Client(build_server(examples)) as client:
        whole = (await client.call_tool("basic_search", args)).structured_content
    # a limit below what the configured context needs (the examples' units are short, so
    # their excerpts at 20,000 / 100 tokens each are nearly whole)
    monkeypatch.setattr(examples.ws.settings.query, "result_token_limit", LIMIT // 2)
    monkeypatch.setattr(budget, "delivered_tokens", counted)
    async with Client(build_server(examples)) as client:
        result = await client.call_tool("basic_search", args)
    page = result.structured_content
    assert whole is not None and not whole["truncated"]
    assert page is not None and page["truncated"] and delivered(result) <= LIMIT // 2
    assert 2 <= len(measured) <= 4  # the whole result, then a round of cuts or two
    assert len(set(measured)) == len(measured)  # no state was counted twice
    kept = [c["id"] for c in page["citations"]]
    assert 1 < len(kept) < len(whole["citations"])
    assert kept == [c["id"] for c in whole["citations"]][:len(kept)]  # the head, in order


async def test_the_reports_resource_pages_within_the_default_budget(
        many_reports: MCPServer) -> None:
    """A corpus with more report cards than one budget holds: every page within it, each
    naming the next, every report listed once."""
    tok = get_tokenizer()
    seen: list[str] = []
    pages = []
    uri: str | None = "canopy://reports"
    async with Client(many_reports) as client:
        while uri is not None:
            text = (await client.read_resource(uri)).contents[0].text  # type: ignore[union-attr]
            assert tok.count(text) <= LIMIT, (uri, tok.count(text))
            page = json.loads(text)
            pages.append(page)
            seen += [card["id"] for card in page["reports"]]
            uri = page["next"]
    assert len(pages) == pages[0]["pages"] > 1
    assert len(seen) == len(set(seen)) == pages[0]["total"]
