"""LLM concurrency benchmark: how busy an index build keeps a slow endpoint, side by side.

    python benchmarks/llm_concurrency_bench.py                    # 30 articles, 500 ms, all setups
    python benchmarks/llm_concurrency_bench.py --articles 10 --latency 0.2 --setups adaptive,fixed8

Builds the first N MultiHop-RAG articles (../shared/eval-data/multihop-rag/corpus.json) against
the test suite's fake OpenAI-compatible server with a fixed latency per request, once per setup,
each in a fresh subprocess and a fresh index:

- `adaptive`: default settings (adaptive window from 8 up to 64);
- `fixed8`: `concurrency = 8, adaptive = false` (the old default);
- `fixed25`: `concurrency = 25, adaptive = false` (Microsoft GraphRAG's default);
- `quota`: default settings against a server that refuses (429, Retry-After 0.5 s) any request
  arriving while `--quota` requests are being worked on;
- `quota-fixed25`: the same server with a fixed 25 in flight.

Figures: wall time of the build, the server's time-weighted mean and peak of requests worked on
at once from its first request to its last reply (that is, once extraction starts), refusals,
and what the client's limiter reports (mean, peak, final window, 429s, backoffs, pause time).
Results: a markdown table on stdout, JSON in benchmarks/results/llm_concurrency_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_host import FakeHost, serve_with_latency
from index_bench import (
    REPO,
    RESULTS,
    machine,
    materialize_multihop,
    run_script_child,
    write_report,
)

SETUPS: dict[str, dict[str, Any]] = {
    "adaptive": {"llm": {}, "quota": False},
    "fixed8": {"llm": {"concurrency": 8, "adaptive": False}, "quota": False},
    "fixed25": {"llm": {"concurrency": 25, "adaptive": False}, "quota": False},
    "quota": {"llm": {}, "quota": True},
    "quota-fixed25": {"llm": {"concurrency": 25, "adaptive": False}, "quota": True},
}
BASE_LLM = {"max_retries": 8, "backoff_s": 0.05}


# ---- child: one build in a fresh interpreter ----------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from canopy.errors import CanopyError
    from canopy.server.runtime import build_index, open_workspace

    llm = {"base_url": spec["base_url"], **spec["llm"]}
    ws = open_workspace(Path(spec["docs"]), index_dir=Path(spec["index_dir"]), llm=llm)
    t0 = time.perf_counter()
    try:
        result = build_index(ws)
    except CanopyError as exc:
        return {"wall_s": round(time.perf_counter() - t0, 3), "error": str(exc)[:300]}
    return {
        "wall_s": round(time.perf_counter() - t0, 3),
        "failures": len(result.failures),
        "calls": sum(u["calls"] for u in result.usage.values()),
        "limiter": result.stats.get("llm_concurrency"),
        "units": result.stats["text_units"],
        "reports": result.stats["reports"],
    }


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return run_script_child(__file__, spec, spec["setup"])


# ---- driver -------------------------------------------------------------------------------------


def bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="canopy-llm-bench-"))
    n = materialize_multihop(work / "docs", args.articles)
    fake = FakeHost(serve_with_latency, args.latency)
    runs = []
    try:
        for name in args.setups.split(","):
            setup = SETUPS[name]
            quota = (args.quota, 0.5) if setup["quota"] else (None, 0.05)
            fake.call("reset", quota)
            print(f"[llm_concurrency_bench] {name} ...", file=sys.stderr, flush=True)
            load_before = os.getloadavg()[0]
            data = run_child({
                "setup": name, "docs": str(work / "docs"), "index_dir": str(work / f"idx-{name}"),
                "base_url": fake.base_url, "llm": {**BASE_LLM, **setup["llm"]},
            })
            data["server"] = fake.call("stats")
            data["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            runs.append({"setup": name, "llm": setup["llm"], "quota": quota[0], **data})
            print(f"[llm_concurrency_bench] {name}: {data['wall_s']:.1f} s", file=sys.stderr,
                  flush=True)
    finally:
        fake.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"machine": machine(), "articles": n, "latency_s": args.latency, "runs": runs}


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"## LLM concurrency: {report['articles']} MultiHop-RAG articles, fake LLM at "
        f"{report['latency_s'] * 1000:.0f} ms per request ({m['date']}, commit {m['commit']}, "
        f"{m['cpus']} CPUs)",
        "",
        "| setup | wall s | server: mean in flight | server: peak | requests (refused) "
        "| client: mean / peak / final window | 429s | backoffs | paused s | failures |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["runs"]:
        s = r["server"]
        lim = r.get("limiter") or {}
        quota = f" (quota {r['quota']})" if r.get("quota") else ""
        client = (f"{lim.get('mean_in_flight', 0):.1f} / {lim.get('peak_in_flight', 0)} / "
                  f"{lim.get('window', 0):g}" if lim else "-")
        failures = r.get("error") or r.get("failures", 0)
        lines.append(
            f"| {r['setup']}{quota} | {r['wall_s']:.1f} | {s['mean']:.1f} | {s['peak']:.0f} "
            f"| {s['requests']} ({s['refused']}) | {client} | {lim.get('throttled', '-')} "
            f"| {lim.get('backoffs', '-')} | {lim.get('paused_s', '-')} | {failures} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--articles", type=int, default=30)
    p.add_argument("--latency", type=float, default=0.5, help="seconds per request")
    p.add_argument("--quota", type=int, default=12, help="requests the `quota` server works on")
    p.add_argument("--setups", default=",".join(SETUPS), help=f"of: {', '.join(SETUPS)}")
    p.add_argument("--out", type=Path, default=RESULTS / "llm_concurrency_bench.json")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        Path(args._out).write_text(json.dumps(child(json.loads(args._child))))
        return
    unknown = set(args.setups.split(",")) - set(SETUPS)
    if unknown:
        p.error(f"unknown setups {sorted(unknown)}")
    report = bench(args)
    write_report(report, args.out, render(report))


if __name__ == "__main__":
    main()
