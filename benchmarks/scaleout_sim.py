"""Scale-out simulation: N indexing workers sharing one rate-limited LLM endpoint (issue 13).

    python benchmarks/scaleout_sim.py                         # 30 articles, workers 1,2,4,8,16
    python benchmarks/scaleout_sim.py --articles 16 --workers 1,4,16
    python benchmarks/scaleout_sim.py --mode ceiling          # one build, N x the ceiling

The endpoint is the test suite's fake OpenAI server (`tests/fakes/openai_server.py`) in a process
of its own, with a latency per request and a tokens-per-minute budget (`--tpm`) enforced over
short fixed windows (`--window`, OpenAI's "60,000 requests/minute may be enforced as 1,000
requests/second"): once a window's tokens are spent it answers 429 with the time left in it.

What a "worker" is here (`--mode`):
- `processes` (default): N `build_index` runs in N fresh processes, each over its own shard of
  the articles (article i goes to shard i % N) into its own index, each with its own ChatClient
  and AIMD window whose ceiling is `--per-worker` requests in flight. This is N machines (or N
  `canopy index` jobs, or N Ray workers) sharing one API key's budget, the case where rate
  limits bite: N independent clients, none of which knows what the others send.
- `ceiling`: one build over all the articles whose window's ceiling is N x `--per-worker`: one
  client fanning out N times wider (what a Ray fan-out with one shared limiter would send).

The per-worker ceiling stands for what one worker sustains; on this 2-core machine the indexer's
own CPU, not the endpoint, bounds one process near ~80 requests/s at zero latency, so the
defaults keep every row well below that and let the endpoint's budget be the limit that binds.
Children import Canopy first and start together on a signal, so `build wall` (first start to
last finish, one system-wide monotonic clock) excludes interpreter start-up.

Figures per row: build wall; requests the server answered and refused (429); the server's
time-weighted mean and peak of requests in flight; the clients' own account
(`ChatClient.concurrency()` via `IndexResult.stats["llm_concurrency"]`: 429s, window cuts,
seconds paused on Retry-After, final windows); tokens the server answered, achieved tokens/min
over the server's busy span and as a share of the limit; failed units.
Results: a markdown table on stdout, JSON in benchmarks/results/scaleout_sim.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_host import FakeHost
from index_bench import REPO, RESULTS, child_env, machine, materialize_multihop, write_report

# Retries as the defaults (5), quick first backoff: a 429 here always carries a Retry-After.
BASE_LLM: dict[str, Any] = {"max_retries": 5, "backoff_s": 0.05}


# ---- child: one worker's build in a fresh interpreter ----------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    import lancedb  # noqa: F401  (imported before the start signal, as the rest of Canopy)

    from canopy.errors import CanopyError
    from canopy.server.runtime import build_index, open_workspace

    llm = {"base_url": spec["base_url"], **spec["llm"]}
    ws = open_workspace(Path(spec["docs"]), index_dir=Path(spec["index_dir"]), llm=llm)
    print("ready", flush=True)
    sys.stdin.readline()  # the start signal
    start = time.monotonic()
    try:
        result = build_index(ws)
    except CanopyError as exc:
        return {"start": start, "end": time.monotonic(), "error": str(exc)[:300]}
    usage = result.usage.values()
    return {
        "start": start,
        "end": time.monotonic(),
        "failures": len(result.failures),
        "failure_errors": sorted({f"{f.task}: {f.error[:200]}" for f in result.failures}),
        "calls": sum(u["calls"] for u in usage),
        "tokens": sum(u["prompt_tokens"] + u["completion_tokens"] for u in usage),
        "units": result.stats["text_units"],
        "limiter": result.stats.get("llm_concurrency"),
    }


# ---- the fake endpoint, in its own process ---------------------------------------------------


def _fake_host(conn: Any) -> None:
    sys.path.insert(0, str(REPO))
    from tests.fakes.openai_server import FakeOpenAI

    fake = FakeOpenAI().start()
    conn.send(fake.base_url)
    while True:
        cmd, arg = conn.recv()
        if cmd == "reset":
            fake.reset()
            fake.latency, fake.tpm, fake.rate_window_s = arg
            conn.send(None)
        elif cmd == "stats":
            answered = [r for r in fake.requests if r.status == 200]
            conn.send({
                "requests": len(fake.requests),
                "answered": len(answered),
                "rate_limited": fake.rate_limited,
                "tokens": fake.tokens_served(),
                **fake.in_flight_stats(),
            })
        else:
            fake.stop()
            conn.send(None)
            return


# ---- driver ----------------------------------------------------------------------------------


def shard(src: Path, dest: Path, n: int) -> list[Path]:
    """Article i of `src` into shard i % n (round robin keeps the shards' sizes within one)."""
    folders = [dest / f"shard{k:02d}" for k in range(n)]
    for folder in folders:
        folder.mkdir(parents=True)
    for i, path in enumerate(sorted(src.iterdir())):
        shutil.copy(path, folders[i % n] / path.name)
    return folders


def run_workers(specs: list[dict[str, Any]], work: Path, start: Any) -> list[dict[str, Any]]:
    """Start one child per spec, wait until all are ready, call `start()`, release them."""
    procs, outs = [], []
    for i, spec in enumerate(specs):
        out = work / f"out{i}.json"
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(spec),
             "--_out", str(out)],
            cwd=REPO, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
        ))
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"a worker did not start: {proc.communicate()[1][-3000:]}")
        start()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc, out in zip(procs, outs, strict=True):
            _, err = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"a worker failed:\n{err[-4000:]}")
            results.append(json.loads(out.read_text()))
        return results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()


def one_row(args: argparse.Namespace, fake: FakeHost, docs: Path, work: Path, n: int
            ) -> dict[str, Any]:
    row_dir = work / f"w{n}"
    if args.mode == "processes":
        folders = shard(docs, row_dir / "docs", n)
        ceiling = args.per_worker
    else:
        folders = [docs]
        ceiling = n * args.per_worker
    llm = {**BASE_LLM, "concurrency": ceiling, "initial_concurrency": ceiling}
    specs = [
        {"docs": str(f), "index_dir": str(row_dir / f"idx{k}"), "base_url": fake.base_url,
         "llm": llm}
        for k, f in enumerate(folders)
    ]
    budget = int(args.tpm * args.window / 60)
    results = run_workers(specs, row_dir,
                          lambda: fake.call("reset", (args.latency, budget, args.window)))
    server = fake.call("stats")
    shutil.rmtree(row_dir, ignore_errors=True)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    limiters = [r.get("limiter") or {} for r in results]
    span = server["span_s"] or wall
    return {
        "workers": n,
        "ceiling_per_client": ceiling,
        "wall_s": round(wall, 2),
        "server": server,
        "achieved_tpm": round(server["tokens"] / span * 60) if span else 0,
        "client_429s": sum(lim.get("throttled", 0) for lim in limiters),
        "client_backoffs": sum(lim.get("backoffs", 0) for lim in limiters),
        "client_paused_s": round(sum(lim.get("paused_s", 0.0) for lim in limiters), 2),
        "client_peak_sum": sum(lim.get("peak_in_flight", 0) for lim in limiters),
        "final_windows": [lim.get("window") for lim in limiters],
        "failures": sum(r.get("failures", 0) for r in results),
        "failure_errors": sorted({e for r in results for e in r.get("failure_errors", [])}),
        "errors": [r["error"] for r in results if "error" in r],
        "units": sum(r.get("units", 0) for r in results),
    }


def bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="canopy-scaleout-"))
    n_articles = materialize_multihop(work / "docs", args.articles)
    fake = FakeHost(_fake_host)
    rows = []
    try:
        for n in [int(w) for w in args.workers.split(",")]:
            print(f"[scaleout_sim] {n} worker(s) ...", file=sys.stderr, flush=True)
            row = one_row(args, fake, work / "docs", work, n)
            rows.append(row)
            print(f"[scaleout_sim] {n}: {row['wall_s']:.1f} s, {row['server']['rate_limited']} "
                  f"429s", file=sys.stderr, flush=True)
    finally:
        fake.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "machine": machine(), "articles": n_articles, "mode": args.mode,
        "latency_s": args.latency, "tpm": args.tpm, "window_s": args.window,
        "per_worker": args.per_worker, "rows": rows,
    }


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"## Scale-out simulation ({report['mode']}): {report['articles']} MultiHop-RAG "
        f"articles, fake LLM at {report['latency_s'] * 1000:.0f} ms, limit "
        f"{report['tpm']:,} tokens/min enforced per {report['window_s']:g} s, ceiling "
        f"{report['per_worker']} in flight per worker ({m['date']}, commit {m['commit']}, "
        f"{m['cpus']} CPUs)",
        "",
        "| workers | build wall s | requests answered (429s) | server mean / peak in flight "
        "| client 429s / window cuts / paused s | tokens | achieved tokens/min | of limit "
        "| failures |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        s = r["server"]
        failures = "; ".join(r["errors"]) or str(r["failures"])
        lines.append(
            f"| {r['workers']} | {r['wall_s']:.1f} | {s['answered']:,} ({s['rate_limited']:,}) "
            f"| {s['mean']:.1f} / {s['peak']:.0f} | {r['client_429s']} / {r['client_backoffs']} "
            f"/ {r['client_paused_s']:.1f} | {s['tokens']:,} | {r['achieved_tpm']:,} "
            f"| {r['achieved_tpm'] / report['tpm']:.0%} | {failures} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--articles", type=int, default=30)
    p.add_argument("--workers", default="1,2,4,8,16", help="worker counts, one row each")
    p.add_argument("--mode", choices=("processes", "ceiling"), default="processes")
    p.add_argument("--per-worker", type=int, default=4, help="requests in flight per worker")
    p.add_argument("--latency", type=float, default=0.3, help="seconds per request")
    p.add_argument("--tpm", type=int, default=5_000_000, help="the endpoint's tokens/minute")
    p.add_argument("--window", type=float, default=1.0, help="seconds per rate window")
    p.add_argument("--out", type=Path, default=RESULTS / "scaleout_sim.json")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        Path(args._out).write_text(json.dumps(child(json.loads(args._child))))
        return
    report = bench(args)
    write_report(report, args.out, render(report))


if __name__ == "__main__":
    main()
