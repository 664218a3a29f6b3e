"""Global search: what it reads of the corpus and what it costs, dynamic selection against fixed
levels, side by side in one run.

    python benchmarks/global_bench.py                          # both parts
    python benchmarks/global_bench.py --part fake --articles 100 --questions 20
    python benchmarks/global_bench.py --part offline --index-dir /tmp/mh/idx

Part `fake`: the first N MultiHop-RAG articles (default 100, one .md each, as
benchmarks/index_bench.py writes them) indexed against the test suite's fake OpenAI-compatible
server at zero latency (tests/fakes/openai_server.py, in this process, behind the real `openai`
client); then every question is asked with dynamic selection and at each fixed level. Questions:
the first N DEV MultiHop-RAG questions (int(sha256(q), 16) % 5 != 0; never the others) and two
sensemaking questions. Printed per mode: LLM calls and prompt tokens per question (the fake counts
prompt characters / 4), and for dynamic selection whether every top-level community the caller
may read was considered. Reference: Microsoft GraphRAG 3.3.0's dynamic selection on the same 100
articles with a zero-latency mock, 966k prompt tokens per question (measured by the project).

Part `offline`: the 609-article builtin index of benchmarks/retrieval_eval.py; the sensemaking
questions with the builtin provider: how many different top-level communities the answer's
citations fall under, and the coverage line.

Output: markdown on stdout (progress on stderr), JSON in benchmarks/results/global_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.index_bench import FAKE_LLM, materialize_multihop
from benchmarks.retrieval_eval import (
    RESULTS,
    load_questions,
    machine,
    multihop_index,
    open_context,
)

SENSEMAKING = ("What are the main themes?", "What are the top 5 topics of these documents?")
GRAPHRAG_DYNAMIC_PROMPT_TOKENS = 966_000  # per question, 100 articles, zero-latency mock


def root_of(ctx: Any, community_id: str) -> str:
    """The top-level community above `community_id` (itself for a root)."""
    cid = community_id
    while True:
        row = ctx.reader.community_rows([cid]).get(cid)
        if row is None or row.parent is None:
            return cid
        cid = row.parent


async def ask(ctx: Any, question: str, level: int | None) -> dict[str, Any]:
    from canopy.server.engines import global_search

    t0 = time.perf_counter()
    r = await global_search(ctx, question, community_level=level)
    cov = r.coverage
    assert cov is not None
    roots = {root_of(ctx, c.id) for c in r.citations}
    return {
        "question": question, "level": level, "ms": round((time.perf_counter() - t0) * 1000),
        "llm_calls": r.usage.llm_calls, "prompt_tokens": r.usage.prompt_tokens,
        "completion_tokens": r.usage.completion_tokens, "citations": len(r.citations),
        "cited_roots": len(roots), "coverage": cov.model_dump(), "coverage_line": cov.line(),
        "top_considered": cov.levels[0].considered if cov.levels and cov.levels[0].level == 0
        else 0,
        "answered": bool(r.citations),
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "questions": len(rows),
        "llm_calls_per_q": round(statistics.fmean(r["llm_calls"] for r in rows), 1),
        "prompt_tokens_per_q": round(statistics.fmean(r["prompt_tokens"] for r in rows)),
        "max_prompt_tokens": max(r["prompt_tokens"] for r in rows),
        "p50_ms": round(statistics.median(r["ms"] for r in rows)),
        "answered": sum(r["answered"] for r in rows),
        "cited_roots_mean": round(statistics.fmean(r["cited_roots"] for r in rows), 1),
    }


def part_fake(args: argparse.Namespace) -> dict[str, Any]:
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.service import CanopyService
    from tests.fakes.openai_server import FakeOpenAI

    out: dict[str, Any] = {"articles": args.articles}
    with tempfile.TemporaryDirectory(prefix="canopy-global-") as tmp, \
            FakeOpenAI(latency=0.0) as fake:
        docs, index = Path(tmp) / "docs", Path(tmp) / "index"
        materialize_multihop(docs, args.articles)
        ws = open_workspace(docs, index_dir=index, llm={"base_url": fake.base_url, **FAKE_LLM})
        t0 = time.perf_counter()
        built = build_index(ws, full=True)
        out["build_s"] = round(time.perf_counter() - t0, 1)
        out["communities"] = built.stats.get("communities")
        print(f"built {args.articles} articles in {out['build_s']} s", file=sys.stderr)
        service = CanopyService(ws)
        try:
            with service.context(None) as ctx:
                roots = len(ctx.reader.roots())
                levels = list(range(ctx.reader.deepest_level() + 1))
                out["roots"] = roots
                questions = [q["query"] for q in load_questions("dev")[:args.questions]]
                questions += list(SENSEMAKING)
                modes: dict[str, list[dict[str, Any]]] = {}
                if args.levels is not None:
                    levels = [lv for lv in levels if lv in args.levels]
                for mode in ["dynamic", *(f"level {lv}" for lv in levels)]:
                    level = None if mode == "dynamic" else int(mode.split()[1])
                    rows = []
                    for i, q in enumerate(questions):
                        rows.append(asyncio.run(ask(ctx, q, level)))
                        print(f"  {mode} {i + 1}/{len(questions)}: {rows[-1]['llm_calls']} "
                              f"calls, {rows[-1]['prompt_tokens']} prompt tokens",
                              file=sys.stderr)
                    modes[mode] = rows
                out["modes"] = {m: summarize(rows) for m, rows in modes.items()}
                out["every_top_considered"] = all(
                    r["top_considered"] == roots for r in modes["dynamic"])
                out["rows"] = modes
        finally:
            service.close()
    return out


def part_offline(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with multihop_index(args.index_dir) as (docs, index):
        service, ctx = open_context(docs, index)
        try:
            out["roots"] = len(ctx.reader.roots())
            out["rows"] = [asyncio.run(ask(ctx, q, None)) for q in SENSEMAKING]
        finally:
            service.close()
    return out


def render(report: dict[str, Any]) -> str:
    lines = ["## Global search coverage and cost", "",
             f"Run: {report['machine']['date']}, commit {report['machine'].get('commit', '?')}",
             ""]
    fake = report.get("fake")
    if fake:
        lines += [f"Fake LLM, {fake['articles']} MultiHop-RAG articles: {fake['communities']} "
                  f"communities, {fake['roots']} top-level; every top-level community considered "
                  f"by dynamic selection for every question: {fake['every_top_considered']}", "",
                  "| mode | questions | LLM calls/q | prompt tokens/q | max prompt tokens | "
                  "vs GraphRAG dynamic (966k/q) | answered | cited top-level communities/q | "
                  "p50 ms |", "|---|---|---|---|---|---|---|---|---|"]
        for mode, s in fake["modes"].items():
            ratio = s["prompt_tokens_per_q"] / GRAPHRAG_DYNAMIC_PROMPT_TOKENS
            lines.append(f"| {mode} | {s['questions']} | {s['llm_calls_per_q']} | "
                         f"{s['prompt_tokens_per_q']:,} | {s['max_prompt_tokens']:,} | "
                         f"{ratio:.3f} | {s['answered']} | {s['cited_roots_mean']} | "
                         f"{s['p50_ms']} |")
        lines.append("")
    offline = report.get("offline")
    if offline:
        lines += [f"Builtin provider, 609 articles ({offline['roots']} top-level communities):",
                  "", "| question | ms | citations | different top-level communities cited | "
                  "coverage |", "|---|---|---|---|---|"]
        for r in offline["rows"]:
            lines.append(f"| {r['question']} | {r['ms']} | {r['citations']} | "
                         f"{r['cited_roots']} | {r['coverage_line']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["fake", "offline", "all"], default="all")
    ap.add_argument("--articles", type=int, default=100)
    ap.add_argument("--questions", type=int, default=20, help="DEV MultiHop-RAG questions")
    ap.add_argument("--levels", type=lambda v: [int(x) for x in v.split(",")], default=None,
                    help="fixed levels to compare, comma-separated (default: every level)")
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="the 609-article builtin index (built there if missing)")
    ap.add_argument("--out", type=Path, default=RESULTS / "global_bench.json")
    args = ap.parse_args()
    report: dict[str, Any] = {"machine": machine(), "settings": vars(args) | {
        "index_dir": str(args.index_dir), "out": str(args.out)}}
    if args.part in ("fake", "all"):
        report["fake"] = part_fake(args)
    if args.part in ("offline", "all"):
        report["offline"] = part_offline(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(render(report))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
