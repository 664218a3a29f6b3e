"""`canopy eval` on a file of questions with gold documents (server/wings/eval/eval_cli.py)
and the benchmarks' question files it reads (retrieval.load_questions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from canopy.errors import ConfigError
from canopy.server.cli import main
from canopy.server.wings.eval.retrieval import load_questions, split_of


def test_eval_scores_each_tool_on_questions_with_gold_documents(
        example_docs: Path, tmp_path: Path) -> None:
    index_dir = tmp_path / "idx"
    runner = CliRunner()
    assert runner.invoke(main, ["index", str(example_docs), "--index-dir",
                                str(index_dir)]).exit_code == 0
    rows = [
        {"question": "How many Tern T2 battery packs were recalled?",
         "gold": ["events/tern_recall.md"]},
        {"question": "Which company makes the Tern battery cells, and on which line?",
         "gold": ["supplier profile:  helio cells ltd"]},  # by title (case and spaces aside)
        {"question": "Who is the project lead of Project Kestrel?",
         "gold": ["projects/kestrel.md", "no/such/file.md"]},
    ]
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    out = runner.invoke(main, ["eval", str(example_docs), str(questions), "--index-dir",
                               str(index_dir), "--split", "all", "--k", "1,5", "--json"])
    assert out.exit_code == 0, out.output
    report = json.loads(out.output[out.output.index("{"):])
    assert report["questions"] == 3
    scores = {s["tool"]: s for s in report["scores"]}
    assert set(scores) == {"local", "basic", "bm25"}
    for s in scores.values():
        assert s["unmatched_gold"] == 1  # no/such/file.md
        assert 0 < s["recall"]["5"] <= 1 and s["hits"]["5"] >= s["recall"]["5"]
        assert s["all"]["5"] <= 0.6667  # the third question's gold can never be complete
        assert s["recall"]["1"] <= s["recall"]["5"]
    # a user's own file is scored whole by default (it is no benchmark with a held-out part)
    table = runner.invoke(main, ["eval", str(example_docs), str(questions), "--index-dir",
                                 str(index_dir), "--tools", "bm25"])
    assert table.exit_code == 0 and "3 all questions" in table.output
    assert "| BM25 over the same passages |" in table.output
    dev = [r for r in rows if split_of(r["question"]) == "dev"]
    table = runner.invoke(main, ["eval", str(example_docs), str(questions), "--index-dir",
                                 str(index_dir), "--tools", "bm25", "--split", "dev"])
    assert table.exit_code == 0 and f"{len(dev)} dev questions" in table.output


def test_eval_loads_multihop_rag_and_musique_gold_titles(tmp_path: Path) -> None:
    mh = tmp_path / "mh.json"
    mh.write_text(json.dumps([
        {"query": "Q1?", "evidence_list": [{"title": "A"}, {"title": "B"}, {"title": "A"}]},
        {"query": "Q2?", "evidence_list": []}]), encoding="utf-8")  # a null query: left out
    assert [(q.text, q.gold) for q in load_questions(mh, "multihop-rag")] == [("Q1?", ("A", "B"))]
    mu = tmp_path / "mu.json"
    mu.write_text(json.dumps([{"question": "Q?", "paragraphs": [
        {"title": "X", "is_supporting": True}, {"title": "Y", "is_supporting": False},
        {"title": "Z", "is_supporting": True}]}]), encoding="utf-8")
    assert [q.gold for q in load_questions(mu, "musique")] == [("X", "Z")]
    with pytest.raises(ConfigError, match="not a musique question file"):
        load_questions(mh, "musique")
