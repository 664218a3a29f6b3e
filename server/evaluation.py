"""Retrieval evaluation (`canopy eval`): which documents each tool retrieves for questions whose
supporting documents are known, scored as R@k, Hits@k and All@k.

Question sets: a generic JSONL file (`{"question": ..., "gold": [document path or title, ...]}`
per line), MultiHop-RAG's `MultiHopRAG.json` (gold: the titles of each query's evidence; null
queries, which have none, are left out) and the MuSiQue/HippoRAG format (gold: the titles of the
supporting paragraphs). Gold entries name documents by path (relative to the folder) or by title.

Split: a question is TEST when int(sha256(question), 16) % 5 == 0, else DEV. Tune on DEV only;
TEST is for a final, rare look (this project never runs it: it is evaluated elsewhere).

Metrics, per tool over the questions: the tool's text units in rank order become a ranked list
of distinct documents; R@k is the mean share of a question's gold documents in the first k,
Hits@k the share of questions with at least one in the first k, All@k the share with all.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from canopy.errors import ConfigError
from canopy.server.context import QueryContext

__all__ = ["FORMATS", "TOOLS", "EvalQuestion", "ToolScore", "evaluate", "load_questions",
           "split_of", "unit_ranking"]

FORMATS = ("jsonl", "multihop-rag", "musique")
TOOLS = ("local", "basic", "bm25")
_DEPTH = 50  # documents ranked per question at most (k beyond it counts nothing more)


@dataclass(frozen=True)
class EvalQuestion:
    text: str
    gold: tuple[str, ...]  # document paths or titles


@dataclass
class ToolScore:
    tool: str
    questions: int
    recall: dict[int, float] = field(default_factory=dict)
    hits: dict[int, float] = field(default_factory=dict)
    all: dict[int, float] = field(default_factory=dict)
    ms_per_question: float = 0.0
    unmatched_gold: int = 0  # gold entries naming no document of the index


def split_of(question: str) -> str:
    """'test' for int(sha256(question), 16) % 5 == 0, else 'dev'."""
    return "test" if int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16) % 5 == 0 \
        else "dev"


def load_questions(path: Path, fmt: str) -> list[EvalQuestion]:
    """The questions of `path` in `fmt` (one of FORMATS), in file order; ConfigError for a file
    that is not of that format."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if fmt == "jsonl":
            rows = [json.loads(line) for line in text.splitlines() if line.strip()]
            return [EvalQuestion(str(r["question"]), tuple(str(g) for g in r["gold"]))
                    for r in rows]
        data = json.loads(text)
        if fmt == "multihop-rag":
            return [EvalQuestion(q["query"], tuple(dict.fromkeys(e["title"]
                                                                 for e in q["evidence_list"])))
                    for q in data if q["evidence_list"]]
        if fmt == "musique":
            return [EvalQuestion(q["question"], tuple(dict.fromkeys(
                p["title"] for p in q["paragraphs"] if p.get("is_supporting"))))
                    for q in data]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"{path}: not a {fmt} question file ({type(exc).__name__}: "
                          f"{exc})") from None
    raise ConfigError(f"unknown question format {fmt!r}: use one of {', '.join(FORMATS)}")


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip().casefold()


class _DocumentMatcher:
    """Gold entries -> document ids, by path or by title (titles shortened at indexing match
    the gold title they begin)."""

    def __init__(self, documents: Iterable[tuple[str, str, str]]) -> None:
        self.by_path: dict[str, str] = {}
        self.by_title: dict[str, list[str]] = {}
        for doc_id, path, title in documents:
            self.by_path[path] = doc_id
            self.by_title.setdefault(_norm(title), []).append(doc_id)

    def ids(self, gold: str) -> list[str]:
        if gold in self.by_path:
            return [self.by_path[gold]]
        key = _norm(gold)
        if key in self.by_title:
            return self.by_title[key]
        return [d for t, ds in self.by_title.items() if len(t) >= 60 and key.startswith(t)
                for d in ds]


def unit_ranking(ctx: QueryContext, tool: str) -> Callable[[str], list[str]]:
    """question -> the tool's text-unit ids in rank order."""
    from canopy.server.engines.basic_engine import basic_context
    from canopy.server.engines.local_engine import build_local_context

    if tool == "local":
        budget = ctx.settings.local_context_tokens

        def local(q: str) -> list[str]:
            blocks = asyncio.run(build_local_context(ctx, q, budget=budget)).blocks
            return [b.id for b in blocks if b.kind == "text_unit"]
        return local
    if tool == "basic":
        return lambda q: [b.id for b in asyncio.run(basic_context(ctx, q, k=10))]
    if tool == "bm25":  # the full-text index alone: the floor a graph tool should beat
        return lambda q: [h.id for h in asyncio.run(
            ctx.reader.search("text_units", vector=None, text=q, k=_DEPTH))]
    raise ConfigError(f"unknown tool {tool!r}: use one of {', '.join(TOOLS)}")


def evaluate(ctx: QueryContext, questions: list[EvalQuestion], tools: list[str],
             ks: list[int], progress: Callable[[str], None] = lambda _: None,
             ) -> list[ToolScore]:
    """Each tool's scores over `questions` (documents the caller may read only)."""
    rankers = {t: unit_ranking(ctx, t) for t in tools}
    reader = ctx.reader
    docs = reader.documents()
    matcher = _DocumentMatcher((d.id, d.path, d.title) for d in docs)
    gold_ids = [[matcher.ids(g) for g in q.gold] for q in questions]
    unmatched = sum(1 for gs in gold_ids for ids in gs if not ids)
    out = []
    for tool, rank in rankers.items():
        score = ToolScore(tool, len(questions), unmatched_gold=unmatched)
        totals = {k: [0.0, 0, 0] for k in ks}
        began = time.perf_counter()
        for i, (q, gold) in enumerate(zip(questions, gold_ids, strict=True)):
            units = reader.units(rank(q.text))
            ranked = list(dict.fromkeys(doc.id for _, doc in units.values()))[:_DEPTH]
            for k in ks:
                top = set(ranked[:k])
                found = sum(1 for ids in gold if top & set(ids))
                totals[k][0] += found / len(gold) if gold else 0.0
                totals[k][1] += found > 0
                totals[k][2] += bool(gold) and found == len(gold)
            if (i + 1) % 25 == 0:
                progress(f"{tool}: {i + 1}/{len(questions)} questions")
        n = max(1, len(questions))
        score.ms_per_question = round((time.perf_counter() - began) * 1000 / n, 1)
        for k, (r, h, a) in totals.items():
            score.recall[k], score.hits[k], score.all[k] = (round(r / n, 4), round(h / n, 4),
                                                            round(a / n, 4))
        out.append(score)
    return out
