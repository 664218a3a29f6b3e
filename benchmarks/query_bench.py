"""Query latency and LLM traffic of the MCP tools on the 609-article MultiHop-RAG index.

    python benchmarks/query_bench.py                            # both modes, every tool
    python benchmarks/query_bench.py --index-dir /tmp/mh/idx    # reuse an index (built if missing)
    python benchmarks/query_bench.py --mode builtin --queries 10

The index is the builtin-provider index of benchmarks/retrieval_eval.py (built into a temp folder,
~1 min, unless --index-dir names one). Questions: the first N DEV questions with evidence
(retrieval_eval.load_questions("dev"), in file order); the same questions for every tool.

Modes, over the same index and the same builtin embeddings:
- `builtin`: the offline provider (retrieval plus extractive answers, no model calls);
- `fake`: the test suite's fake OpenAI-compatible server (tests/fakes/openai_server.py) at zero
  latency, in this process, behind the real client:
  LLMProvider(ChatClient(LLMSettings(base_url=fake.base_url, max_retries=1), cache=None)).
  Its latency is the engine's own overhead plus HTTP and JSON handling of every call; token
  counts are the fake's (prompt characters / 4), a proxy for a real model's.

Per tool (global_search with dynamic community selection, local_search, drift_search,
basic_search, drill_down) and mode: wall-clock latency p50 / p95 / max of each call (one warm-up
call per tool first, not counted), and LLM calls, prompt and completion tokens per query (means,
from SearchResult.usage, which counts only that call's traffic). drill_down is asked for the
question's first named entity (the entity local_search puts first); it calls no model.

Output: a markdown table on stdout (progress on stderr) and JSON in
benchmarks/results/query_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.retrieval_eval import (
    RESULTS,
    load_questions,
    machine,
    multihop_index,
    open_context,
)

TOOLS = ("global", "local", "drift", "basic", "drill_down")


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil
    return ordered[int(rank) - 1]


def tool_call(name: str) -> Callable[[Any, str], Awaitable[Any]]:
    from canopy.server.engines import (
        basic_search,
        drift_search,
        drill_down,
        global_search,
        local_search,
    )
    from canopy.server.engines.local_engine import named_entities

    async def drill(ctx: Any, query: str) -> Any:
        ids = named_entities(ctx, query)
        name = ctx.reader.entity_rows(ids[:1])[ids[0]].entity.name if ids else None
        return await drill_down(ctx, entity=name) if name else await drill_down(ctx)

    return {
        "global": lambda ctx, q: global_search(ctx, q),
        "local": lambda ctx, q: local_search(ctx, q),
        "drift": lambda ctx, q: drift_search(ctx, q),
        "basic": lambda ctx, q: basic_search(ctx, q),
        "drill_down": drill,
    }[name]


async def measure(ctx: Any, tool: str, queries: list[str]) -> dict[str, Any]:
    call = tool_call(tool)
    await call(ctx, queries[0])  # warm-up: first-use costs (tables, tokenizer, connections)
    latencies: list[float] = []
    usage = {"llm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for i, q in enumerate(queries):
        t0 = time.perf_counter()
        result = await call(ctx, q)
        latencies.append((time.perf_counter() - t0) * 1000)
        for key in usage:
            usage[key] += getattr(result.usage, key)
        print(f"    {tool} {i + 1}/{len(queries)}: {latencies[-1]:.0f} ms, "
              f"{result.usage.llm_calls} calls", file=sys.stderr)
    n = len(queries)
    return {
        "queries": n,
        "p50_ms": round(percentile(latencies, 50), 1),
        "p95_ms": round(percentile(latencies, 95), 1),
        "max_ms": round(max(latencies), 1),
        "mean_ms": round(statistics.fmean(latencies), 1),
        "llm_calls_per_query": round(usage["llm_calls"] / n, 2),
        "prompt_tokens_per_query": round(usage["prompt_tokens"] / n),
        "completion_tokens_per_query": round(usage["completion_tokens"] / n),
    }


def fake_context(ctx: Any, base_url: str) -> Any:
    from canopy.llm import ChatClient
    from canopy.providers.llm_provider import LLMProvider
    from canopy.server.context import QueryContext
    from canopy.settings import LLMSettings

    provider = LLMProvider(ChatClient(LLMSettings(base_url=base_url, max_retries=1), cache=None))
    return QueryContext(ctx.reader, provider, ctx.settings, caches=ctx.caches)


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| tool | mode | queries | p50 ms | p95 ms | max ms | LLM calls/q | prompt tok/q | "
             + "completion tok/q |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['tool']} | {r['mode']} | {r['queries']} | {r['p50_ms']:.0f} | "
                     f"{r['p95_ms']:.0f} | {r['max_ms']:.0f} | {r['llm_calls_per_query']} | "
                     f"{r['prompt_tokens_per_query']} | {r['completion_tokens_per_query']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="reuse (or build into) this index folder; default: a temp folder")
    ap.add_argument("--mode", choices=["builtin", "fake", "all"], default="all")
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of "
                    + ", ".join(TOOLS))
    ap.add_argument("--queries", type=int, default=40, help="DEV questions per tool")
    ap.add_argument("--drift-queries", type=int, default=20, help="DEV questions for drift")
    ap.add_argument("--global-queries", type=int, default=20,
                    help="DEV questions for global (dynamic selection rates every root: slow)")
    ap.add_argument("--out", type=Path, default=RESULTS / "query_bench.json")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    modes = ["builtin", "fake"] if args.mode == "all" else [args.mode]
    questions = [q["query"] for q in load_questions("dev")]

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with multihop_index(args.index_dir) as (docs, index_dir):
        service, ctx = open_context(docs, index_dir)
        for mode in modes:
            fake = None
            if mode == "fake":
                from tests.fakes.openai_server import FakeOpenAI

                fake = FakeOpenAI(latency=0.0).start()
                mode_ctx = fake_context(ctx, fake.base_url)
            else:
                mode_ctx = ctx
            try:
                for tool in tools:
                    n = {"drift": args.drift_queries, "global": args.global_queries}.get(
                        tool, args.queries)
                    print(f"{mode} / {tool}: {n} questions", file=sys.stderr)
                    before = len(fake.requests) if fake else 0
                    row = asyncio.run(measure(mode_ctx, tool, questions[:n]))
                    if fake is not None:
                        row["fake_requests_incl_warmup"] = len(fake.requests) - before
                    rows.append({"tool": tool, "mode": mode, **row})
            finally:
                if fake is not None:
                    fake.stop()
        service.close()
    seconds = round(time.perf_counter() - t0, 1)
    print(table(rows))
    report = {"machine": machine(), "seconds": seconds,
              "settings": {"queries": args.queries, "drift_queries": args.drift_queries,
                           "global_queries": args.global_queries,
                           "query_settings": ctx.settings.model_dump()},
              "runs": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"\n{seconds} s; JSON written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
