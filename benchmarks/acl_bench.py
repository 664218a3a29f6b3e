"""What access control costs at query time, on the 609-article MultiHop-RAG index.

    python benchmarks/acl_bench.py --index-dir /tmp/mh/idx --docs /tmp/mh/docs
    python benchmarks/acl_bench.py --index-dir /tmp/mh/idx --docs /tmp/mh/docs \
        --queries 5 --reports 20

The index named by --index-dir (built with the builtin provider, e.g. by `canopy index DOCS
--index-dir ...`) is copied into a work folder and never modified. A policy (canopy.toml in the
work folder, passed as --config) labels about 1/3 of the articles `restricted` by a glob on their
file names (default `??[147]-*.md`: article numbers ending in 1, 4 or 7); principal `full` reads
`public` and `restricted`, principal `restricted` reads `public` only. `canopy index` is re-run
on the copy to relabel (no re-extraction, no report regenerated). Then, in this one process:

1. Latency per tool, builtin provider, called through the engines (canopy.server.engines, as the MCP
   tools call them): global_search at level 1 and dynamic, local_search, drift_search,
   basic_search, drill_down (the question's first cited entity; the first cited report),
   index_status (recomputed per call, as the tool does). For `restricted` the first call of each
   tool runs with an empty view cache ("cold": the views it needs are built, tools in the order
   listed, so later tools find views earlier ones built). Then each principal answers the N
   questions twice with every tool: the first pass is a warm-up (for `restricted` it is "first
   use": views are built as questions first need them), the second is measured: p50 / p95 per
   tool and the restricted/full ratio of the p50s, the steady-state overhead of ACL filtering
   and of serving views. The questions are the first N DEV queries of MultiHopRAG.json in file
   order (canopy.server.wings.eval.retrieval.split_of; the held-out fifth is never read).
2. `canopy warm` for `restricted` with the builtin provider, from an empty cache: views per
   kind, seconds; then the same views again from the SQLite cache after a simulated restart
   (the service's view cache forgotten) and from memory: the view-cache hit speedup.
3. The LLM cost of views: M report views (a seeded sample of the communities `restricted` is
   served as views) built through the real openai client against the test suite's fake
   OpenAI-compatible server (zero latency unless --llm-latency): calls per task, prompt and
   completion tokens (the fake's counts: prompt characters / 4), seconds; then those views again
   from the SQLite cache (restart) and from memory.

Output: a markdown table on stdout (progress on stderr), JSON in benchmarks/results/acl_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.multihop import machine
from canopy.acl.access import State
from canopy.llm import ChatClient
from canopy.providers.llm_provider import LLMProvider
from canopy.server import engines
from canopy.server.context import QueryContext
from canopy.server.engines.warm import warm_views
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.server.status import index_status, status_for_caller
from canopy.settings import LLMSettings
from canopy.store.export import load_graph
from tests.fakes.openai_server import FakeOpenAI

QUESTIONS = REPO.parent / "shared" / "eval-data" / "multihop-rag" / "MultiHopRAG.json"


def dev_questions(path: Path, n: int) -> list[str]:
    """The first `n` DEV queries of a MultiHopRAG.json file, in file order (TEST ones skipped)."""
    from canopy.server.wings.eval.retrieval import split_of

    rows = json.loads(path.read_text(encoding="utf-8"))
    return [q for q in (str(r["query"]) for r in rows) if split_of(q) == "dev"][:n]
RESULTS = REPO / "benchmarks" / "results"
POLICY = """[acl]
default = ["public"]

[[acl.rules]]
glob = "{glob}"
labels = ["restricted"]

[acl.principals]
full = ["public", "restricted"]
restricted = ["public"]
"""
PRINCIPALS = ("full", "restricted")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return ordered[int(rank) - 1]


# ---- the tools -----------------------------------------------------------------------------------


class Targets:
    """Per principal and question: the drill_down targets (first cited entity and report)."""

    def __init__(self) -> None:
        self.entity: dict[tuple[str, str], str] = {}
        self.report: dict[tuple[str, str], str] = {}


def tools(
    service: CanopyService, targets: Targets
) -> dict[str, Callable[[QueryContext, str, str], Awaitable[Any]]]:
    async def global1(ctx: QueryContext, who: str, q: str) -> Any:
        r = await engines.global_search(ctx, q, community_level=1)
        if r.citations:
            targets.report[(who, q)] = r.citations[0].id
        return r

    async def local(ctx: QueryContext, who: str, q: str) -> Any:
        r = await engines.local_search(ctx, q)
        first = next((c for c in r.citations if c.kind == "entity"), None)
        if first is not None:
            targets.entity[(who, q)] = first.id
        return r

    async def drill_entity(ctx: QueryContext, who: str, q: str) -> Any:
        return await engines.drill_down(ctx, entity=targets.entity[(who, q)])

    async def drill_report(ctx: QueryContext, who: str, q: str) -> Any:
        return await engines.drill_down(ctx, community_id=targets.report[(who, q)])

    async def status(ctx: QueryContext, who: str, q: str) -> Any:
        policy = service.ws.policy
        principal = ctx.caller.principal
        return status_for_caller(index_status(service.store), ctx,
                                 lambda path: policy.readable(policy.labels_for(path), principal))

    return {
        "global_search (level 1)": global1,
        "global_search (dynamic)": lambda c, w, q: engines.global_search(c, q),
        "local_search": local,
        "drift_search": lambda c, w, q: engines.drift_search(c, q),
        "basic_search": lambda c, w, q: engines.basic_search(c, q),
        "drill_down (entity)": drill_entity,
        "drill_down (community)": drill_report,
        "index_status": status,
    }


async def timed(fn: Callable[[], Awaitable[Any]]) -> float:
    t0 = time.perf_counter()
    await fn()
    return (time.perf_counter() - t0) * 1000


def latency(service: CanopyService, questions: list[str]) -> dict[str, Any]:
    """Per tool: the restricted caller's first call with an empty view cache (`cold_ms`), its
    first pass over the questions (`first_ms`: views built as they are first needed), then, for
    both principals, a second pass over the same questions (`ms`: steady state)."""
    targets = Targets()
    table = tools(service, targets)
    out: dict[str, Any] = {"cold_ms": {}, "first_ms": {}, "ms": {}}
    def call(fn: Any, who: str, q: str) -> Callable[[], Awaitable[Any]]:
        return lambda: service.run(who, lambda c: fn(c, who, q))

    log("latency: cold first call per tool (restricted, empty view cache)")
    for name, fn in table.items():
        out["cold_ms"][name] = asyncio.run(timed(call(fn, "restricted", questions[0])))
        log(f"  {name}: {out['cold_ms'][name]:.0f} ms")

    def one_pass(who: str) -> dict[str, list[float]]:
        ms: dict[str, list[float]] = {}
        for q in questions:  # tools in table order, so drill_down finds its targets
            for name, fn in table.items():
                if (name.startswith("drill_down (entity") and (who, q) not in targets.entity) or \
                        (name.startswith("drill_down (comm") and (who, q) not in targets.report):
                    continue
                ms.setdefault(name, []).append(asyncio.run(timed(call(fn, who, q))))
        return ms

    for who in PRINCIPALS:
        first = one_pass(who)
        if who == "restricted":
            out["first_ms"] = first
        for name, runs in one_pass(who).items():
            out["ms"].setdefault(name, {})[who] = runs
            first_pass = (f" (first pass p50 {percentile(first[name], 50):.0f})"
                          if who == "restricted" else "")
            log(f"  {who} {name}: p50 {percentile(runs, 50):.0f} ms over {len(runs)}" + first_pass)
    return out


# ---- view cost -----------------------------------------------------------------------------------


def clear_view_cache(service: CanopyService | None, index_dir: Path) -> None:
    if service is not None:
        service.view_cache.forget()
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    with db:
        db.execute("DELETE FROM acl_views")
    db.close()


def warm_cost(service: CanopyService, index_dir: Path) -> dict[str, Any]:
    clear_view_cache(service, index_dir)
    out: dict[str, Any] = {}
    for phase in ("cold", "sqlite", "memory"):
        if phase == "sqlite":
            service.view_cache.forget()
        t0 = time.perf_counter()
        figures = asyncio.run(service.run("restricted", warm_views))
        figures["wall_s"] = round(time.perf_counter() - t0, 6)
        out[phase] = figures
        log(f"warm ({phase}): {figures['wall_s']} s, built {figures['built']}")
    return out


def llm_cost(service: CanopyService, index_dir: Path, n_reports: int, latency_s: float,
             seed: int) -> dict[str, Any]:
    clear_view_cache(service, index_dir)
    g = load_graph(service.store)
    with FakeOpenAI(latency=latency_s) as fake:
        client = ChatClient(LLMSettings(base_url=fake.base_url, model="fake", max_retries=1,
                                        concurrency=8), cache=None, backoff_base=0.01)
        service.use_provider(LLMProvider(client))

        async def states(ctx: QueryContext) -> dict[str, State]:
            return ctx.reader.community_states(g.communities)

        found = asyncio.run(service.run("restricted", states))
        candidates = sorted(c for c, st in found.items() if st == State.VIEW)
        chosen = sorted(random.Random(seed).sample(candidates, min(n_reports, len(candidates))))
        levels: dict[str, int] = {}
        for c in chosen:
            key = str(g.communities[c].level)
            levels[key] = levels.get(key, 0) + 1
        out: dict[str, Any] = {"reports": len(chosen), "by_level": levels, "latency_s": latency_s,
                               "candidates": len(candidates)}

        async def build(ctx: QueryContext) -> dict[str, Any]:
            await ctx.reader.reports(chosen)
            return ctx.reader.view_usage

        for phase in ("cold", "sqlite", "memory"):
            if phase == "sqlite":
                service.view_cache.forget()
            before = len(fake.requests)
            t0 = time.perf_counter()
            usage = asyncio.run(service.run("restricted", build))
            wall = time.perf_counter() - t0
            out[phase] = {
                "wall_s": round(wall, 6), "http_requests": len(fake.requests) - before,
                "calls": {t: u.calls for t, u in sorted(usage.items()) if u.calls},
                "prompt_tokens": sum(u.prompt_tokens for u in usage.values()),
                "completion_tokens": sum(u.completion_tokens for u in usage.values()),
            }
            log(f"llm views ({phase}): {out[phase]}")
    return out


# ---- main ----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--index-dir", type=Path, required=True, help="builtin index of --docs (copied)"
    )
    ap.add_argument("--docs", type=Path, required=True, help="the documents folder it indexes")
    ap.add_argument("--work", type=Path, default=None, help="work folder (default: a temp folder)")
    ap.add_argument("--glob", default="??[147]-*.md", help="files labelled `restricted`")
    ap.add_argument("--queries", type=int, default=10, help="DEV MultiHop-RAG questions per tool")
    ap.add_argument("--reports", type=int, default=50, help="report views built with the fake LLM")
    ap.add_argument("--llm-latency", type=float, default=0.0, help="fake LLM seconds per request")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "acl_bench.json")
    args = ap.parse_args()
    for key in [k for k in os.environ if k.startswith(("CANOPY_", "OPENAI_"))]:
        del os.environ[key]
    questions = dev_questions(QUESTIONS, args.queries)

    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="acl-bench-")
        work = Path(tmp.name)
    else:
        work = args.work
        work.mkdir(parents=True, exist_ok=True)
    try:
        index_dir = work / "index"
        if index_dir.exists():
            shutil.rmtree(index_dir)
        log(f"copying {args.index_dir} -> {index_dir}")
        shutil.copytree(args.index_dir, index_dir, ignore=shutil.ignore_patterns("write.lock"))
        config = work / "canopy.toml"
        config.write_text(POLICY.format(glob=args.glob), encoding="utf-8")
        ws = open_workspace(args.docs, index_dir, config)
        labelled = sum(
            1 for p in args.docs.iterdir() if ws.policy.labels_for(p.name) == ("restricted",)
        )
        log(f"relabelling: {labelled} files match {args.glob!r}")
        t0 = time.perf_counter()
        relabel = build_index(ws)
        relabel_s = time.perf_counter() - t0
        assert relabel.stats["units_extracted"] == 0, relabel.stats
        clear_view_cache(None, index_dir)
        service = CanopyService(open_workspace(args.docs, index_dir, config))
        try:
            g = load_graph(service.store)

            async def count(ctx: QueryContext) -> dict[str, dict[str, int]]:
                ents = ctx.reader.entity_states(g.entities).values()
                reps = ctx.reader.community_states(g.communities).values()
                return {kind: {"canonical": sum(s == State.FULL for s in states),
                               "view": sum(s == State.VIEW for s in states),
                               "hidden": sum(s == State.NONE for s in states)}
                        for kind, states in (("entities", list(ents)), ("reports", list(reps)))}

            shape = {"documents": len(g.documents), "restricted_documents": labelled,
                     "entities": len(g.entities), "relationships": len(g.relationships),
                     "communities": len(g.communities),
                     "restricted_caller": asyncio.run(service.run("restricted", count))}
            log(f"shape: {shape}")
            lat = latency(service, questions)
            warm = warm_cost(service, index_dir)
            llm = llm_cost(service, index_dir, args.reports, args.llm_latency, args.seed)
        finally:
            service.close()
    finally:
        if tmp is not None:
            tmp.cleanup()

    rows = []
    for name, by in lat["ms"].items():
        f, r = by["full"], by["restricted"]
        first = lat["first_ms"][name]
        rows.append({"tool": name, "n": len(r),
                     "full_p50": percentile(f, 50), "full_p95": percentile(f, 95),
                     "restricted_p50": percentile(r, 50), "restricted_p95": percentile(r, 95),
                     "ratio_p50": percentile(r, 50) / max(percentile(f, 50), 1e-9),
                     "restricted_first_p50": percentile(first, 50),
                     "restricted_first_p95": percentile(first, 95),
                     "restricted_cold_ms": lat["cold_ms"][name]})
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
              "relabel_s": round(relabel_s, 2), "shape": shape, "latency": rows,
              "latency_raw_ms": lat, "warm": warm, "llm_views": llm}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2), encoding="utf-8")
    print(report(result))
    log(f"wrote {args.out}")


def _speedup(slow: float, fast: float) -> str:
    return f"{slow / fast:,.0f}x" if fast > 0 else "n/a"


def _secs(s: float) -> str:
    return f"{s:.2f} s" if s >= 0.1 else f"{s * 1000:.1f} ms"


def report(r: dict[str, Any]) -> str:
    s = r["shape"]
    rc = s["restricted_caller"]
    head = ("| tool | n | full p50 | full p95 | restricted p50 | restricted p95 | p50 ratio "
            "| restricted first use p50 / p95 | restricted cold call |")
    lines = [
        (f"MultiHop-RAG index: {s['documents']} documents ({s['restricted_documents']} labelled "
         f"`restricted`), {s['entities']} entities, {s['relationships']} relationships, "
         f"{s['communities']} communities; relabel (re-run of canopy index) {r['relabel_s']} s."),
        f"Caller `restricted`: entities {rc['entities']}; reports {rc['reports']}.",
        "",
        ("Latency in ms, builtin provider. p50/p95: second pass over the questions (views "
         "built); first use: the restricted caller's first pass (views built as first needed); "
         "cold call: its very first call of the tool, on an empty view cache."),
        "",
        head,
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in r["latency"]:
        lines.append(
            f"| {row['tool']} | {row['n']} | {row['full_p50']:.0f} | {row['full_p95']:.0f} "
            f"| {row['restricted_p50']:.0f} | {row['restricted_p95']:.0f} "
            f"| {row['ratio_p50']:.2f} | {row['restricted_first_p50']:.0f} / "
            f"{row['restricted_first_p95']:.0f} | {row['restricted_cold_ms']:.0f} |"
        )
    w = r["warm"]
    views = ", ".join(f"{v} {k.removesuffix('_views')}" for k, v in w["cold"].items()
                      if k.endswith("_views"))
    lines += [
        "",
        (f"`canopy warm` (builtin), caller `restricted`, views: {views}. From an empty cache "
         f"{_secs(w['cold']['wall_s'])}; after a restart, from the SQLite cache "
         f"{_secs(w['sqlite']['wall_s'])} ({_speedup(w['cold']['wall_s'], w['sqlite']['wall_s'])}; "
         "views with one visible description are rebuilt, not stored); from memory "
         f"{_secs(w['memory']['wall_s'])} "
         f"({_speedup(w['cold']['wall_s'], w['memory']['wall_s'])})."),
    ]
    m = r["llm_views"]
    c = m["cold"]
    per = max(m["reports"], 1)
    lines += [
        "",
        (f"Report views with the fake OpenAI LLM: {m['reports']} of the {m['candidates']} "
         f"communities `restricted` is served as views (by level {m['by_level']}), fake latency "
         f"{m['latency_s']} s per request, concurrency 8:"),
        "",
        "| phase | wall | HTTP requests | calls by task | prompt tokens | completion tokens |",
        "|---|---|---|---|---|---|",
    ]
    for phase in ("cold", "sqlite", "memory"):
        p = m[phase]
        lines.append(
            f"| {phase} | {_secs(p['wall_s'])} | {p['http_requests']} | {p['calls'] or '-'} "
            f"| {p['prompt_tokens']} | {p['completion_tokens']} |"
        )
    lines += [
        "",
        (f"Per report view, cold: {c['http_requests'] / per:.1f} requests, "
         f"{c['prompt_tokens'] / per:.0f} prompt + {c['completion_tokens'] / per:.0f} completion "
         f"tokens. Cache hits: {_speedup(c['wall_s'], m['sqlite']['wall_s'])} faster from SQLite, "
         f"{_speedup(c['wall_s'], m['memory']['wall_s'])} from memory."),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
