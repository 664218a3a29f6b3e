"""`canopy eval` scores what an agent receives (issue 29): the documents a tool's result cites,
in its order, after the result was fitted to its limit, read through the MCP SDK's client; the
ranking before assembly is a separate, labelled tool."""

from __future__ import annotations

import asyncio
import json

import pytest
from mcp import Client

from canopy.server.mcp_app import build_server
from canopy.server.service import CanopyService
from canopy.server.wings.eval.retrieval import (
    EvalQuestion,
    bridge_gold,
    details,
    evaluate,
    score_table,
)

QUESTIONS = [
    EvalQuestion("Which supplier makes the battery cells?", ("suppliers/helio_cells.md",)),
    EvalQuestion("How many Tern T2 battery packs were recalled?", ("events/tern_recall.md",)),
    EvalQuestion("Who leads Project Kestrel, and which supplier does the project depend on?",
                 ("projects/kestrel.md", "suppliers/helio_cells.md")),
]


def _cited_documents(examples_service: CanopyService, tool: str, query: str) -> list[str]:
    async def call() -> list[str]:
        async with Client(build_server(examples_service)) as client:
            r = await client.call_tool(tool, {"query": query})
        assert r.structured_content is not None
        return list(dict.fromkeys(c["document"] for c in r.structured_content["citations"]
                                  if c.get("document")))
    return asyncio.run(call())


def test_delivered_tools_score_the_documents_the_mcp_result_cites_in_its_order(
        examples_service: CanopyService) -> None:
    scores = {s.tool: s
              for s in evaluate(examples_service, QUESTIONS, ["local", "basic"], [1, 5, 10])}
    for tool, name in (("local", "local_search"), ("basic", "basic_search")):
        for q, ranked in zip(QUESTIONS, scores[tool].ranked_paths, strict=True):
            assert ranked == _cited_documents(examples_service, name, q.text)[:10]
        assert scores[tool].median_documents is not None and scores[tool].truncated == 0


def test_a_smaller_result_limit_delivers_fewer_documents_and_scores_what_it_delivers(
        examples_service: CanopyService, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is part of what is scored: at 2,000 tokens a result carries fewer documents,
    and the score is computed from those, not from the ranking the engine started from."""
    whole = evaluate(examples_service, QUESTIONS, ["local", "local-ranking"], [10])
    monkeypatch.setattr(examples_service.ws.settings.query, "result_token_limit", 2000)
    small = evaluate(examples_service, QUESTIONS, ["local", "local-ranking"], [10])
    assert small[0].median_documents is not None and whole[0].median_documents is not None
    assert small[0].median_documents < whole[0].median_documents
    assert small[1].ranked_paths == whole[1].ranked_paths  # the ranking itself is unchanged
    for q, ranked in zip(QUESTIONS, small[0].ranked_paths, strict=True):
        assert ranked == _cited_documents(examples_service, "local_search", q.text)[:10]
        assert ranked == [p for p in ranked if p in whole[1].ranked_paths[QUESTIONS.index(q)]]


def test_the_table_labels_what_each_row_measures_and_details_name_the_documents(
        examples_service: CanopyService) -> None:
    scores = evaluate(examples_service, QUESTIONS, ["local", "bm25", "local-ranking"], [2, 5])
    table = "\n".join(score_table(scores, [2, 5]))
    assert "| local_search, as delivered |" in table
    assert "| local_search's ranking before assembly |" in table
    assert "| BM25 over the same passages |" in table
    assert "bridge R@2" in table and "a median result cites" in table
    rows = [json.loads(line) for line in details(QUESTIONS, scores)]
    assert [r["question"] for r in rows] == [q.text for q in QUESTIONS]
    assert all(len(r["bm25"]) <= 5 and r["bm25"] for r in rows)
    bm25 = next(s for s in scores if s.tool == "bm25")
    assert bm25.recall[5] > 0  # the baseline finds the supplier profile


def test_a_bridge_gold_document_is_one_the_question_does_not_name() -> None:
    assert not bridge_gold("What did Helio Cells Ltd make?", "Helio Cells Ltd")
    assert not bridge_gold("Where was Tallow Street written?", "Tallow Street (novel)")
    assert not bridge_gold("Who founded ZÜRICH Re?", "Zurich Re")  # names normalized
    assert bridge_gold("Who founded the maker of the Tern cells?", "Helio Cells Ltd")
    assert bridge_gold("Who was Lothair II's mother?", "Ermengarde of Tours")
    assert bridge_gold("What is the capital of Georgia?", "Georgian")  # whole words only
