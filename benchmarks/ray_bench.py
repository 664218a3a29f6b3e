"""Distributed indexing on Ray (`canopy index --ray local`) against a local build, side by side.

    python benchmarks/ray_bench.py                            # every setup (~8 minutes here)
    python benchmarks/ray_bench.py --articles 10 --latency 0.5 --setups llm-local,llm-ray2

Setups (each a build of the first MultiHop-RAG articles into a fresh index, in a fresh Python
process, one after the other: `--articles` (30) against the LLM, `--builtin-articles` (300)
with the builtin provider, whose build of 30 spends under a second extracting):
- `llm-local`, `llm-ray1`, `llm-ray2`: against the test suite's fake OpenAI server (chat and
  embeddings) with `--latency` seconds a request, in a process of its own; locally, then with
  `--ray local` and `[distributed] workers` 1 and 2 (a cluster of that many CPUs started by the
  writer; the endpoint's requests go through that many Ray actors);
- `builtin-local`, `builtin-ray1`, `builtin-ray2`: the builtin provider (no endpoint), whose
  extraction and embedding batches then run as Ray tasks on 1 or 2 CPUs;
- `sweep`: no build; Ray's overhead a request against the requests in flight (1, 8, 32, 64)
  through 1 and 2 endpoint actors, 128 requests a point.

Figures per setup: build wall (`build_index`, connecting to Ray excluded) and Ray's start-up
(ray.init, the workers' code check, starting the endpoint actors); the writer's CPU and the CPU
of Ray's processes (GCS, raylet, agents, workers and actors, their start-up included: the
writer's descendants, read from /proc once the cluster is up, then at the end of the build);
requests in flight, the client's account (its one AIMD window: time-weighted mean and peak) and
the fake server's (time-weighted mean from its first request to its last reply); Ray's overhead
per endpoint request during the build (from submitting the request to its reply reaching the
writer, less the POST's own time on the worker: dispatch, the actor's queue, the way back), the
time a reply then waits for the writer's busy event loop (a local request waits the same, inside
its own time), and Ray's round trip at rest (a no-op call to an
actor and a no-op task, 300 in a row, after the build); and a digest of the index's entities,
relationships, reports and vectors, which must be the same in every row of a provider.

Results: a markdown table on stdout, JSON in benchmarks/results/ray_bench.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
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

SETUPS = ("llm-local", "llm-ray1", "llm-ray2", "builtin-local", "builtin-ray1", "builtin-ray2",
          "sweep")
ROUND_TRIPS = 300
SWEEP_REQUESTS = 128  # per (workers, in flight) point of the sweep
SWEEP_IN_FLIGHT = (1, 8, 32, 64)


# ---- child: one build in a fresh interpreter ------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.wings.ray import connect_ray
    from canopy.settings import DistributedSettings

    overrides: dict[str, Any] = {}
    if spec["base_url"]:
        overrides = {"llm": {"base_url": spec["base_url"], "model": "fake", "backoff_s": 0.05},
                     "embed": {"base_url": spec["base_url"], "model": "fake-embed"}}
    ws = open_workspace(Path(spec["docs"]), Path(spec["index_dir"]), **overrides)
    out: dict[str, Any] = {"loadavg_before": os.getloadavg()[0]}
    cluster = None
    t0 = time.perf_counter()
    if spec["workers"]:
        cluster = connect_ray("local", DistributedSettings(workers=spec["workers"]))
        out["ray_cpu_start_s"] = _descendants_cpu_s()  # the cluster's own start-up
    out["connect_s"] = round(time.perf_counter() - t0, 2)
    cpu0, t0 = time.process_time(), time.perf_counter()
    result = build_index(ws, ray=cluster)
    out["wall_s"] = round(time.perf_counter() - t0, 2)
    out["writer_cpu_s"] = round(time.process_time() - cpu0, 2)
    out["stats"] = {k: result.stats.get(k) for k in (
        "text_units", "entities", "relationships", "reports", "llm_concurrency", "ray",
        "seconds")}
    out["calls"] = sum(u["calls"] for u in result.usage.values())
    out["failures"] = len(result.failures)
    if cluster is not None:
        out["ray_cpu_s"] = _descendants_cpu_s()  # before anything else runs on the cluster
        out["idle_ms"] = _idle_round_trips()
        cluster.close()
    out["digest"] = _digest(ws.index_dir)
    out["loadavg_after"] = os.getloadavg()[0]
    return out


def sweep(spec: dict[str, Any]) -> dict[str, Any]:
    """Ray's overhead a request against how many are in flight: `SWEEP_REQUESTS` summary-sized
    chat requests through an `EndpointPool` of 1 and 2 actors, k at a time, on a local cluster
    of 2 CPUs (no index build around them)."""
    sys.path.insert(0, str(REPO))
    import asyncio

    import ray

    from canopy.endpoint import EndpointConfig
    from canopy.server.wings.ray.cluster import LOOPBACK_ONLY
    from canopy.server.wings.ray.remote_endpoint import EndpointPool

    os.environ.setdefault(LOOPBACK_ONLY, "0")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             logging_level="WARNING")
    body = json.dumps({"model": "fake", "messages": [
        {"role": "user", "content": "Task: summarize\n" + "A description. " * 100}]}).encode()
    points = []
    try:
        for workers in (1, 2):
            for k in SWEEP_IN_FLIGHT:
                pool = EndpointPool(EndpointConfig(spec["base_url"], "k", 60.0, 64), workers)

                async def run(pool: EndpointPool = pool, k: int = k) -> float:
                    await pool.post("/chat/completions", body)  # actors up, pools warm
                    pool.stats.calls, pool.stats.overhead_s, pool.stats.waited_s = 0, 0.0, 0.0
                    t0 = time.perf_counter()

                    async def lane() -> None:
                        for _ in range(SWEEP_REQUESTS // k):
                            await pool.post("/chat/completions", body)

                    await asyncio.gather(*(lane() for _ in range(k)))
                    return time.perf_counter() - t0

                load = os.getloadavg()[0]
                wall = asyncio.run(run())
                st = pool.stats
                points.append({"workers": workers, "in_flight": k, "requests": st.calls,
                               "overhead_ms": round(1000 * st.overhead_s / st.calls, 2),
                               "writer_wait_ms": round(1000 * st.waited_s / st.calls, 2),
                               "wall_s": round(wall, 2), "loadavg": round(load, 1)})
                pool.close()
    finally:
        ray.shutdown()
    return {"sweep": points}


def _descendants_cpu_s() -> float:
    """CPU seconds of this process's descendants still running: the local cluster's processes
    (GCS, raylet, workers, actors), all started under the writer. Read from /proc, because
    workers that Ray kills at shutdown are not always reaped by a process the writer waits
    for (their time would be missing from RUSAGE_CHILDREN)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    found, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        kids = [p for p, parent in parents.items() if parent == pid and p not in found]
        found.update(kids)
        todo += kids
    return round(sum(times[p] for p in found), 2)


def _idle_round_trips() -> dict[str, float]:
    """Ray's own cost of one call at rest: a no-op actor method and a no-op task, in a row."""
    import ray

    @ray.remote(num_cpus=0)
    class Echo:
        def ping(self) -> None:
            return None

    @ray.remote(num_cpus=0)
    def noop() -> None:
        return None

    echo = Echo.remote()  # type: ignore[attr-defined]
    ray.get(echo.ping.remote())
    ray.get(noop.remote())
    out = {}
    for name, call in (("actor_call", lambda: echo.ping.remote()), ("task", noop.remote)):
        t0 = time.perf_counter()
        for _ in range(ROUND_TRIPS):
            ray.get(call())
        out[name] = round(1000 * (time.perf_counter() - t0) / ROUND_TRIPS, 3)
    ray.kill(echo)
    return out


def _digest(index_dir: Path) -> str:
    """sha256 of what must not depend on where the work ran."""
    db = sqlite3.connect(f"file:{index_dir / 'canopy.sqlite'}?mode=ro", uri=True)
    try:
        h = hashlib.sha256()
        for query in ("SELECT id, name, type, description FROM entities ORDER BY id",
                      "SELECT * FROM relationships ORDER BY 1",
                      "SELECT * FROM reports ORDER BY 1",
                      "SELECT key, vector FROM embeddings ORDER BY key"):
            for row in db.execute(query):
                h.update(repr(row).encode())
        return h.hexdigest()[:12]
    finally:
        db.close()


# ---- driver ------------------------------------------------------------------------------------


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return run_script_child(__file__, spec, spec["label"])


def bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    docs = {"llm": work / "docs", "builtin": work / "docs-builtin", "sweep": work / "docs"}
    n = materialize_multihop(docs["llm"], args.articles)
    n_builtin = materialize_multihop(docs["builtin"], args.builtin_articles)
    fake = FakeHost(serve_with_latency, args.latency) if any(
        s.startswith(("llm", "sweep")) for s in args.setups) else None
    rows = []
    sweep_points: list[dict[str, Any]] = []
    try:
        for label in args.setups:
            provider, _, where = label.partition("-")
            workers = 0 if where in ("local", "") else int(where.removeprefix("ray"))
            if fake is not None:
                fake.call("reset")
            spec = {"label": label, "docs": str(docs[provider]), "index_dir": str(work / label),
                    "base_url": fake.base_url if provider in ("llm", "sweep") else None,
                    "workers": workers}
            print(f"{label} ...", file=sys.stderr, flush=True)
            if label == "sweep":
                sweep_points = run_child({**spec, "sweep": True})["sweep"]
                continue
            row = {"setup": label, "provider": provider, "workers": workers,
                   **run_child(spec)}
            if provider == "llm" and fake is not None:
                row["server"] = fake.call("stats")
            rows.append(row)
            shutil.rmtree(work / label, ignore_errors=True)
    finally:
        if fake is not None:
            fake.stop()
        shutil.rmtree(work, ignore_errors=True)
    return {"machine": machine(), "articles": n, "builtin_articles": n_builtin,
            "latency_s": args.latency, "rows": rows, "sweep": sweep_points}


def render(report: dict[str, Any]) -> str:
    lines = [f"MultiHop-RAG articles: {report['articles']} against the fake endpoint at "
             f"{report['latency_s']} s a request, {report['builtin_articles']} with the builtin "
             f"provider; {report['machine']['cpus']} CPUs, commit {report['machine']['commit']}",
             "", "| setup | wall s | extract s | Ray start-up s | writer CPU s | Ray CPU s "
             "(start-up + build) | "
             "requests | client in flight mean / peak | server in flight mean / peak | "
             "Ray overhead ms a request (build) | writer's loop busy ms a request | "
             "Ray round trip ms at rest (actor / task) | index digest | load 1 min |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["rows"]:
        ray = r["stats"].get("ray") or {}
        lim = r["stats"].get("llm_concurrency") or {}
        server = r.get("server") or {}
        idle = r.get("idle_ms") or {}
        lines.append(
            f"| {r['setup']} | {r['wall_s']} | {(r['stats'].get('seconds') or {}).get('extract')} "
            f"| {ray.get('startup_s', '-') if ray else '-'} "
            f"| {r['writer_cpu_s']} | {_ray_cpu(r)} | "
            f"{server.get('requests', '-') if server else '-'} | "
            f"{_pair(lim.get('mean_in_flight'), lim.get('peak_in_flight'))} | "
            f"{_pair(_round(server.get('mean')), _int(server.get('peak')))} | "
            f"{ray.get('overhead_ms_per_call', '-') if ray.get('endpoint_calls') else '-'} | "
            f"{ray.get('writer_wait_ms_per_call', '-') if ray.get('endpoint_calls') else '-'} | "
            f"{_pair(idle.get('actor_call'), idle.get('task'))} | {r['digest']} | "
            f"{r['loadavg_before']:.1f}-{r['loadavg_after']:.1f} |")
    if report.get("sweep"):
        lines += ["", f"Ray's overhead a request against requests in flight ({SWEEP_REQUESTS} "
                  f"requests a point, fake at {report['latency_s']} s, local cluster of 2 CPUs):",
                  "", "| actors | in flight | overhead ms a request | writer's loop busy ms | "
                  "wall s | load 1 min |", "|---|---|---|---|---|---|"]
        lines += [f"| {p['workers']} | {p['in_flight']} | {p['overhead_ms']} | "
                  f"{p['writer_wait_ms']} | {p['wall_s']} | {p['loadavg']} |"
                  for p in report["sweep"]]
    return "\n".join(lines)


def _ray_cpu(row: dict[str, Any]) -> str:
    if "ray_cpu_s" not in row:
        return "-"
    start = row["ray_cpu_start_s"]
    return f"{start} + {round(row['ray_cpu_s'] - start, 2)}"


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def _pair(a: Any, b: Any) -> str:
    return "-" if a is None and b is None else f"{a} / {b}"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--articles", type=int, default=30,
                   help="the first N MultiHop-RAG articles, against the LLM (default 30)")
    p.add_argument("--builtin-articles", type=int, default=300,
                   help="the first N MultiHop-RAG articles, builtin provider (default 300)")
    p.add_argument("--latency", type=float, default=0.3,
                   help="seconds the fake endpoint takes a request (default 0.3)")
    p.add_argument("--setups", type=lambda s: s.split(","), default=list(SETUPS),
                   help=f"comma-separated, of {', '.join(SETUPS)}")
    p.add_argument("--out", type=Path, default=RESULTS / "ray_bench.json")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        spec = json.loads(args._child)
        Path(args._out).write_text(json.dumps(sweep(spec) if spec.get("sweep") else child(spec)))
        return
    unknown = set(args.setups) - set(SETUPS)
    if unknown:
        p.error(f"unknown setups {sorted(unknown)}; choose from {', '.join(SETUPS)}")
    report = bench(args)
    write_report(report, args.out, render(report))


if __name__ == "__main__":
    main()
