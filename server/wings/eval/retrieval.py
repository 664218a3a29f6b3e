"""Retrieval evaluation (`canopy eval`): which documents each tool delivers for questions whose
supporting documents are known, scored as R@k, Hits@k and All@k.

What is scored is what an agent receives. `local` and `basic` call local_search and
basic_search through the MCP SDK's client (in memory, the caller's principal, the tools' default
arguments, the index's `[query]` settings, so at the default `result_token_limit` unless the
index sets another), and read the documents the result cites, in the order it cites them, after
the result was fitted to its limit. `local-ranking` is local_search's text-unit ranking before
the result is assembled (what earlier versions scored), labelled as such: the difference between
it and `local` is what assembly loses. The baselines: `bm25`, plain BM25 (k1 1.2, b 0.75, English
stop words, no stemming; the bm25s library) over the same passages the index holds, each under its
document's header (title and metadata); `fts` and `vector`, the index's own full-text and vector
searches alone.

Question sets: a generic JSONL file (`{"question": ..., "gold": [document path or title, ...]}`
per line), MultiHop-RAG's `MultiHopRAG.json` (gold: the titles of each query's evidence; null
queries, which have none, are left out) and the MuSiQue/HippoRAG format (gold: the titles of the
supporting paragraphs). Gold entries name documents by path (relative to the folder) or by title.

Split: a question is TEST when int(sha256(question), 16) % 5 == 0, else DEV. Tune on DEV only;
TEST is for a final, rare look (this project never runs it: it is evaluated elsewhere). The split
applies to the benchmark formats; a user's own JSONL file is scored whole unless asked.

Metrics, per tool over the questions, from the ranked list of distinct documents a tool returns:
- R@k: the mean share of a question's gold documents among the first k;
- Hits@k: the share of questions with at least one gold document among the first k;
- All@k: the share of questions with every gold document among the first k;
- bridge R@k: the share of *bridge* gold documents among the first k, over all questions (a
  gold document is a bridge when the question does not name it: its title, without a trailing
  parenthetical, does not occur in the question as whole words). The second hop of a multi-hop
  question is a bridge: what a graph should add over word matching.
Delivered tools also report the median number of distinct documents a result cites, the median
tokens it delivers (text plus structured content, as counted against the limit) and the share of
results that were cut to fit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import statistics
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canopy.errors import ConfigError
from canopy.ids import normalize_name
from canopy.server.context import QueryContext

if TYPE_CHECKING:
    from canopy.server.service import CanopyService

__all__ = ["DELIVERED", "FORMATS", "TOOLS", "EvalQuestion", "ToolScore", "as_dict",
           "bridge_gold", "default_split", "details", "evaluate", "load_questions", "score_table",
           "split_of"]

FORMATS = ("jsonl", "multihop-rag", "musique")
DELIVERED = {"local": "local_search", "basic": "basic_search"}  # tool -> the MCP tool it calls
TOOLS = ("local", "basic", "bm25", "local-ranking", "fts", "vector")
LABELS = {
    "local": "local_search, as delivered",
    "basic": "basic_search, as delivered",
    "bm25": "BM25 over the same passages",
    "local-ranking": "local_search's ranking before assembly",
    "fts": "the index's full-text search",
    "vector": "the index's vector search",
}
_DEPTH = 50  # documents ranked per question at most (k beyond it counts nothing more)


@dataclass(frozen=True)
class EvalQuestion:
    text: str
    gold: tuple[str, ...]  # document paths or titles


@dataclass
class ToolScore:
    tool: str
    questions: int
    label: str = ""
    recall: dict[int, float] = field(default_factory=dict)
    hits: dict[int, float] = field(default_factory=dict)
    all: dict[int, float] = field(default_factory=dict)
    bridge_recall: dict[int, float] = field(default_factory=dict)
    bridge_gold: int = 0  # gold documents the questions do not name
    ms_per_question: float = 0.0
    p50_ms: float = 0.0  # per-question latency, as the caller waits for it
    p90_ms: float = 0.0
    unmatched_gold: int = 0  # gold entries naming no document of the index
    # delivered tools only: what a result carries
    median_documents: float | None = None
    median_tokens: float | None = None
    truncated: float | None = None  # share of results cut to fit the limit
    # per question, the paths of the first documents returned (for --details)
    ranked_paths: list[list[str]] = field(default_factory=list, repr=False)


def split_of(question: str) -> str:
    """'test' for int(sha256(question), 16) % 5 == 0, else 'dev'."""
    return "test" if int(hashlib.sha256(question.encode("utf-8")).hexdigest(), 16) % 5 == 0 \
        else "dev"


def default_split(fmt: str) -> str:
    """'dev' for the benchmark formats (tune on DEV only), 'all' for a user's own JSONL file:
    its questions are not a benchmark with a held-out part."""
    return "all" if fmt == "jsonl" else "dev"


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


_PARENTHETICAL = re.compile(r"\s*\([^()]*\)\s*$")


def bridge_gold(question: str, title: str) -> bool:
    """True when `question` does not name the document titled `title`: the title (without a
    trailing parenthetical such as "(novel)") does not occur in it as whole words, after name
    normalization (case, accents, punctuation)."""
    name = normalize_name(_PARENTHETICAL.sub("", title))
    if not name:
        return True
    return f" {name} " not in f" {normalize_name(question)} "


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


@dataclass
class _Delivered:
    documents: list[str]  # document ids, in the order the result first cites them
    tokens: int
    truncated: bool


Ranker = Callable[[str], Awaitable[_Delivered]]


def _bm25(ctx: QueryContext) -> Ranker:
    """Plain BM25 over every passage the caller may read, each under its document's header
    (title, and front-matter metadata when there is any) as the index holds it: the floor a
    graph tool should beat."""
    try:
        import bm25s
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # its progress is not ours
    except ImportError:
        raise ConfigError("the bm25 baseline needs the bm25s package: pip install "
                          "'bm25s>=0.2' (the [eval] extra), or leave bm25 out of --tools") from None
    unit_docs: list[str] = []
    texts: list[str] = []
    for batch in ctx.reader.iter_units():
        for unit, doc in batch:
            unit_docs.append(doc.id)
            texts.append(f"{doc.header()}\n{unit.text}")
    model = bm25s.BM25(k1=1.2, b=0.75)
    if texts:
        model.index(bm25s.tokenize(texts, stopwords="en", show_progress=False),
                    show_progress=False)

    async def rank(q: str) -> _Delivered:
        if not texts:
            return _Delivered([], 0, False)
        query = bm25s.tokenize([q], stopwords="en", return_ids=False, show_progress=False)
        found, scores = model.retrieve(query, k=min(_DEPTH * 4, len(texts)),
                                       show_progress=False)
        ranked = [unit_docs[i] for i, s in zip(found[0], scores[0], strict=True) if s > 0]
        return _Delivered(list(dict.fromkeys(ranked)), 0, False)
    return rank


def _units_to_docs(ctx: QueryContext, unit_ids: list[str]) -> list[str]:
    units = ctx.reader.units(unit_ids)
    return list(dict.fromkeys(units[u][1].id for u in unit_ids if u in units))


def _ranking(ctx: QueryContext, tool: str) -> Ranker:
    from canopy.server.engines.local_engine import local_unit_ranking

    if tool == "local-ranking":
        async def local(q: str) -> _Delivered:
            return _Delivered(_units_to_docs(ctx, await local_unit_ranking(ctx, q)), 0, False)
        return local
    if tool == "fts":
        async def fts(q: str) -> _Delivered:
            hits = await ctx.reader.search("text_units", vector=None, text=q, k=_DEPTH * 2)
            return _Delivered(_units_to_docs(ctx, [h.id for h in hits]), 0, False)
        return fts
    if tool == "vector":
        async def vector(q: str) -> _Delivered:
            hits = await ctx.reader.search("text_units", vector=await ctx.reader.embed(q),
                                           text=None, k=_DEPTH * 2)
            return _Delivered(_units_to_docs(ctx, [h.id for h in hits]), 0, False)
        return vector
    if tool == "bm25":
        return _bm25(ctx)
    raise ConfigError(f"unknown tool {tool!r}: use one of {', '.join(TOOLS)}")


def _check_tools(tools: list[str]) -> None:
    for t in tools:
        if t not in TOOLS:
            raise ConfigError(f"unknown tool {t!r}: use one of {', '.join(TOOLS)}")


async def _score_all(service: CanopyService, principal: str | None,
                     questions: list[EvalQuestion], tools: list[str], ks: list[int],
                     progress: Callable[[str], None]) -> list[ToolScore]:
    from mcp import Client

    from canopy.server.engines.budget import delivered_tokens
    from canopy.server.mcp_app import build_server
    from canopy.server.results import SearchResult

    with service.context(principal) as ctx:
        docs = ctx.reader.documents()
        rankers = {t: _ranking(ctx, t) for t in tools if t not in DELIVERED}
        matcher = _DocumentMatcher((d.id, d.path, d.title) for d in docs)
        title_of = {d.id: d.title for d in docs}
        by_path = {d.path: d.id for d in docs}
        gold_ids = [[matcher.ids(g) for g in q.gold] for q in questions]
        unmatched = sum(1 for gs in gold_ids for ids in gs if not ids)
        bridges = [[bool(ids) and all(bridge_gold(q.text, title_of[i]) for i in ids)
                    for ids in gs] for q, gs in zip(questions, gold_ids, strict=True)]
        out = []
        async with Client(build_server(service, principal_name=principal)) as client:
            for tool in tools:
                if tool in DELIVERED:
                    name = DELIVERED[tool]

                    async def call(q: str, name: str = name) -> _Delivered:
                        r = await client.call_tool(name, {"query": q})
                        if r.is_error or r.structured_content is None:
                            text = " ".join(getattr(c, "text", "") for c in r.content)
                            raise ConfigError(f"{name} failed on {q!r}: {text}")
                        result = SearchResult.model_validate(r.structured_content)
                        cited = [by_path[c.document] for c in result.citations
                                 if c.document in by_path]
                        return _Delivered(list(dict.fromkeys(cited)), delivered_tokens(result),
                                          result.truncated)
                    rank: Ranker = call
                else:
                    rank = rankers[tool]
                out.append(await _score(tool, rank, questions, gold_ids, bridges, ks, unmatched,
                                        by_path, progress))
    return out


async def _score(tool: str, rank: Ranker, questions: list[EvalQuestion],
                 gold_ids: list[list[list[str]]], bridges: list[list[bool]], ks: list[int],
                 unmatched: int, by_path: dict[str, str],
                 progress: Callable[[str], None]) -> ToolScore:
    score = ToolScore(tool, len(questions), label=LABELS[tool], unmatched_gold=unmatched)
    path_of = {d: p for p, d in by_path.items()}
    totals = {k: [0.0, 0, 0, 0] for k in ks}  # recall, hits, all, bridge found
    n_bridge = 0
    n_docs: list[int] = []
    tokens: list[int] = []
    cut = 0
    began = time.perf_counter()
    waits: list[float] = []
    for i, (q, gold, bridge) in enumerate(zip(questions, gold_ids, bridges, strict=True)):
        t0 = time.perf_counter()
        got = await rank(q.text)
        waits.append((time.perf_counter() - t0) * 1000)
        ranked = got.documents[:_DEPTH]
        score.ranked_paths.append([path_of.get(d, d) for d in ranked[:max(ks)]])
        n_docs.append(len(got.documents))
        tokens.append(got.tokens)
        cut += got.truncated
        n_bridge += sum(bridge)
        for k in ks:
            top = set(ranked[:k])
            hit = [bool(top & set(ids)) for ids in gold]
            found = sum(hit)
            totals[k][0] += found / len(gold) if gold else 0.0
            totals[k][1] += found > 0
            totals[k][2] += bool(gold) and found == len(gold)
            totals[k][3] += sum(h for h, b in zip(hit, bridge, strict=True) if b)
        if (i + 1) % 25 == 0:
            progress(f"{tool}: {i + 1}/{len(questions)} questions")
    n = max(1, len(questions))
    score.ms_per_question = round((time.perf_counter() - began) * 1000 / n, 1)
    if waits:
        waits.sort()
        score.p50_ms = round(statistics.median(waits), 1)
        score.p90_ms = round(waits[int(0.9 * (len(waits) - 1))], 1)
    score.bridge_gold = n_bridge
    for k, (r, h, a, b) in totals.items():
        score.recall[k], score.hits[k], score.all[k] = (round(r / n, 4), round(h / n, 4),
                                                        round(a / n, 4))
        score.bridge_recall[k] = round(b / n_bridge, 4) if n_bridge else 0.0
    if tool in DELIVERED and questions:
        score.median_documents = statistics.median(n_docs)
        score.median_tokens = statistics.median(tokens)
        score.truncated = round(cut / n, 4)
    return score


def evaluate(service: CanopyService, questions: list[EvalQuestion], tools: list[str],
             ks: list[int], *, principal: str | None = None,
             progress: Callable[[str], None] = lambda _: None) -> list[ToolScore]:
    """Each tool's scores over `questions`, as `principal` (documents they may read only)."""
    _check_tools(tools)
    return asyncio.run(_score_all(service, principal, questions, tools, ks, progress))


def score_table(scores: list[ToolScore], ks: list[int]) -> list[str]:
    """The scores as markdown lines: one row per tool, then what delivered results carry."""
    head = " | ".join(f"R@{k} | Hits@{k} | All@{k}" for k in ks)
    bridge = " | ".join(f"bridge R@{k}" for k in ks)
    lines = [f"| tool | {head} | {bridge} | ms/question |",
             "|---|" + "---|" * (4 * len(ks) + 1)]
    for s in scores:
        cells = " | ".join(f"{s.recall[k]:.3f} | {s.hits[k]:.3f} | {s.all[k]:.3f}" for k in ks)
        bcells = " | ".join(f"{s.bridge_recall[k]:.3f}" for k in ks)
        lines.append(f"| {s.label or s.tool} | {cells} | {bcells} | {s.ms_per_question:.0f} |")
    delivered = [s for s in scores if s.median_documents is not None]
    for s in delivered:
        lines.append(f"{s.label}: a median result cites {s.median_documents:g} documents in "
                     f"{s.median_tokens:g} tokens; {s.truncated:.0%} of results were cut to fit "
                     "the limit.")
    if scores:
        lines.append(f"Bridge gold documents (not named by their question): "
                     f"{scores[0].bridge_gold}.")
    return lines


def as_dict(score: ToolScore) -> dict[str, Any]:
    """The score as JSON-ready data (without the per-question rankings)."""
    from dataclasses import asdict

    out = asdict(score)
    out.pop("ranked_paths")
    return out


def details(questions: list[EvalQuestion], scores: list[ToolScore]) -> Iterator[str]:
    """One JSON line per question: its text, gold entries, split and each tool's first
    documents (paths), for looking at what a tool missed."""
    for i, q in enumerate(questions):
        yield json.dumps({"question": q.text, "gold": list(q.gold), "split": split_of(q.text),
                          **{s.tool: s.ranked_paths[i] for s in scores}}, ensure_ascii=False)
