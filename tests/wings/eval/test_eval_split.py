"""The DEV/TEST split, pinned to its definition: a question is TEST when
int(sha256(question.encode("utf-8")).hexdigest(), 16) % 5 == 0, else DEV
(server/wings/eval/retrieval.py, the eval data's SOURCES.md). The expected splits below were
computed once from that definition, outside canopy, and are written as literals (the residue mod
5 beside each), so a change to `split_of` (another residue, `!= 0`, another hash or encoding,
stripping or lowercasing the question) fails here instead of silently moving questions between
the parts. Questions are copied from MultiHop-RAG (MultiHopRAG.json) and MuSiQue
(musique_train_100.json), plus edge cases.

Every benchmark reads its questions through that one function, and acl_bench reads DEV only.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from canopy.server.wings.eval.retrieval import split_of
from tests.conftest import REPO, SHARED, require_shared

TEST_QUESTIONS = (  # residue 0
    # MultiHop-RAG
    "After The Age reported on Travis Kelce's Super Bowl victories, did Yardbarker's coverage "
    "maintain consistency regarding Travis Kelce's performance expectations?",
    "Which company, as reported by both TechCrunch and The Verge, has spent billions to maintain "
    "its default search engine status on various platforms and is also accused of harming news "
    "publishers\u2019 revenue through its business practices?",  # U+2019: bytes of UTF-8 hashed
    # MuSiQue
    "Who is the spouse of Big Eye's main director?",
    "In the country that Jim\u00e9nez is a part, what percentage of Spanish Wikipedia edits were "
    "from there?",
    # edge cases: the question is hashed as written (no stripping, no case folding)
    "Who was the first president of Damerjog's country? ",  # DEV without the trailing space
    "who is the CEO?",  # DEV as "Who is the CEO?"
)

DEV_QUESTIONS = (
    # MultiHop-RAG
    "Did Engadget report a discount on the 13.6-inch MacBook Air before The Verge reported a "
    "discount on Samsung Galaxy Buds 2?",  # 1
    "Does the TechCrunch article report on new hiring at Starz, while the Engadget article "
    "discusses layoffs within the entire video game industry?",  # 2
    "Does the TechCrunch article report on layoffs at Starz, while the Engadget article "
    "discusses layoffs within the entire video game industry?",  # 3
    "Do the TechCrunch and Seeking Alpha articles agree on the trend of companies' spending on "
    "cybersecurity, or do they present differing views on this matter?",  # 4
    "Does the 'Fortune' article suggest that Beyonc\u00e9's 'Renaissance' concert film was less "
    "financially successful than Taylor Swift's 'The Eras Tour' mentioned in 'The Independent "
    "- Life and Style'?",  # 1 (0 if its UTF-8 bytes were read as Latin-1)
    # MuSiQue
    "What country was the author of Brand a citizen of?",  # 1
    "Who is the wife of Kim Jong-chul?",  # 2
    "Who is the sibling of the performer of Decade?",  # 3
    "Of what church is the Diocese of the birthplace of Meehan Bonnar?",  # 4
    "When was the astronomical clock built in the city where Karel Purkyn\u011b died?",  # 1
    # edge cases
    "Who was the first president of Damerjog's country?",  # 1
    "Who is the CEO?",  # 1
    "",  # 4
)


@pytest.mark.parametrize("question", TEST_QUESTIONS)
def test_split_of_is_test_for_residue_zero(question: str) -> None:
    assert split_of(question) == "test"


@pytest.mark.parametrize("question", DEV_QUESTIONS)
def test_split_of_is_dev_otherwise(question: str) -> None:
    assert split_of(question) == "dev"


def test_split_sizes_of_multihop_rag_are_the_documented_ones() -> None:
    """SOURCES.md: 2,045 DEV queries, 511 held out (of 2,556, null queries included)."""
    rows = json.loads(require_shared(SHARED / "multihop-rag" / "MultiHopRAG.json")
                      .read_text(encoding="utf-8"))
    splits = [split_of(q["query"]) for q in rows]
    assert (splits.count("dev"), splits.count("test")) == (2045, 511)


def _mod_five(tree: ast.AST) -> list[int]:
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod)
            and isinstance(node.right, ast.Constant) and node.right.value == 5]


def test_no_benchmark_computes_the_split_itself() -> None:
    """A hand-written copy of the rule drifts from it unseen: benchmarks call split_of."""
    copies = {str(p.relative_to(REPO)): lines
              for p in sorted((REPO / "benchmarks").glob("*.py"))
              if (lines := _mod_five(ast.parse(p.read_text(encoding="utf-8"))))}
    assert copies == {}


def test_acl_bench_reads_dev_questions_only(tmp_path: Path) -> None:
    from benchmarks.acl_bench import dev_questions

    questions = [*TEST_QUESTIONS[:2], DEV_QUESTIONS[0], TEST_QUESTIONS[2], *DEV_QUESTIONS[1:4]]
    path = tmp_path / "MultiHopRAG.json"
    path.write_text(json.dumps([{"query": q, "evidence_list": []} for q in questions]),
                    encoding="utf-8")
    assert dev_questions(path, 3) == list(DEV_QUESTIONS[:3])  # file order, TEST skipped
    assert dev_questions(path, 100) == list(DEV_QUESTIONS[:4])
    real = dev_questions(require_shared(SHARED / "multihop-rag" / "MultiHopRAG.json"), 10**6)
    assert len(real) == 2045 and not set(real) & set(TEST_QUESTIONS)
