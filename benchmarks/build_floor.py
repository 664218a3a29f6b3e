"""Build wall time beside its scheduling floor, with the in-flight count over time (issue 35).

    nice -n 10 python benchmarks/build_floor.py                      # 30 articles, 500 ms
    nice -n 10 python benchmarks/build_floor.py --articles 10 --latency 0.2 \\
        --graphrag-python /work/graphrag-venv/bin/python              # and Microsoft GraphRAG
    python benchmarks/build_floor.py --load 6 --graphrag-python ...   # beside 6 busy processes

Builds the first N MultiHop-RAG articles (../shared/eval-data/multihop-rag/corpus.json) in a fresh
subprocess and a fresh index, chat and embeddings both sent to the test suite's fake OpenAI server
(tests/fakes/openai_server.py, hosted in its own process by benchmarks/fake_host.py) with a fixed
latency per request, Canopy's default concurrency settings otherwise. With `--graphrag-python`,
Microsoft GraphRAG (benchmarks/graphrag_runner.py, tracemalloc off) then indexes the same
articles against the same fake server in the same run.

Printed: Canopy's wall (the `build_index` call alone, as index_bench.py times it, with the
libraries it imports lazily -- the openai SDK, LanceDB -- imported before the timer, as
graphrag_runner.py imports graphrag.api before GraphRAG's; each system's import time is printed
beside its wall), its floor, wall
/ floor, and a per-second timeline of requests in flight; GraphRAG's wall and Canopy / GraphRAG.

The floor, from the fake server's record of what the run did:

    floor = (chat + embedding requests) / W x latency + rounds x latency

- W is the configured window: `[llm] concurrency` (the adaptive window's ceiling, 64 by default).
  Embeddings have their own smaller ceiling (`[embed] concurrency`), printed beside it; the floor
  counts them against W, as the single window of the scheduler issue 35 asks for would.
- rounds is the longest chain of requests that must follow one another, each worth a latency
  however wide the window:
  * per text unit: its extract request, then its glean rounds, then its resolve request. The
    glean round of a request is read from its conversation (1 + 2 x round messages: the extract
    exchange and each earlier glean exchange), the deepest seen counts; resolve counts 1 when the
    run made any resolve request;
  * summaries: 1 when any summarize request was made (each element's summary is one call on its
    merged descriptions, after extraction);
  * reports: the levels that got a report in this run, bottom-up (a parent's context may take its
    children's reports). Levels are the build's `communities_by_level`; a fresh build writes a
    report for every community, and the script checks reports_generated == communities;
  * embeddings: 1 when any embedding request was made (texts exist only once written).
  Retries and refused requests are counted as requests (the fake refuses none here).

The timeline is computed from each request's arrival and reply times as the fake server recorded
them (one clock, CLOCK_MONOTONIC, shared by the processes), not by polling: per second since the
build started, the most requests worked on at once and the requests that arrived, by task
(extract, glean, resolve, summarize, report, embed; GraphRAG's prompts are told apart by the fake in
the same way). The driver only waits on its children, so its CPU stays negligible.

Results: a markdown table on stdout, JSON in benchmarks/results/build_floor.json (or --out).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_host import REPO, FakeHost, serve_with_latency
from index_bench import (
    RESULTS,
    machine,
    materialize_multihop,
    run_graphrag,
    run_script_child,
    write_report,
)

__all__ = ["Span", "dependency_rounds", "floor_s", "label_of", "timeline"]

# The fake's task names (Canopy's schema names, GraphRAG's prompts) to the timeline's labels.
LABELS = {
    "extract": "extract", "graphrag_extract": "extract",
    "glean": "glean", "graphrag_glean": "glean", "graphrag_loop": "glean",
    "resolve": "resolve",
    "summarize": "summarize", "graphrag_summarize": "summarize",
    "report": "report", "graphrag_report": "report",
    "embeddings": "embed",
}
ORDER = ["extract", "glean", "resolve", "summarize", "report", "embed", "other"]

Span = tuple[str, float, float, int]  # (task, arrival, reply, messages in the conversation)


def label_of(task: str) -> str:
    return LABELS.get(task, "other")


# ---- the build's side (a fresh interpreter) ------------------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO))
    t_imp = time.perf_counter()
    from canopy.endpoint import preload_sdk
    from canopy.lance import import_lancedb
    from canopy.server.runtime import build_index, open_workspace

    # The libraries the build uses, imported before the timer starts, as graphrag_runner.py
    # imports graphrag.api before its own (Canopy imports them lazily, inside the build).
    preload_sdk()
    import_lancedb()
    imports_s = time.perf_counter() - t_imp
    ws = open_workspace(Path(spec["docs"]), index_dir=Path(spec["index_dir"]),
                        llm={"base_url": spec["base_url"]},
                        embed={"base_url": spec["base_url"], "dims": 64})
    t0, m0 = time.perf_counter(), time.monotonic()
    result = build_index(ws)
    wall = time.perf_counter() - t0
    return {
        "wall_s": round(wall, 3),
        "imports_s": round(imports_s, 3),
        "t0_monotonic": m0,
        "window": ws.settings.llm.concurrency,
        "embed_window": ws.settings.embed.concurrency,
        "stats": result.stats,
        "failures": len(result.failures),
    }


# ---- the floor -----------------------------------------------------------------------------------


def dependency_rounds(spans: list[Span], stats: dict[str, Any]) -> dict[str, int]:
    """The longest chain of requests that must follow one another, by part (module docstring)."""
    labels = [label_of(s[0]) for s in spans]
    glean = max(((s[3] - 1) // 2 for s, lab in zip(spans, labels, strict=True)
                 if lab == "glean" and s[0] == "glean"), default=0)
    if glean == 0 and "glean" in labels:  # GraphRAG's glean turns: count them per conversation
        glean = max((s[3] - 1) // 2 for s, lab in zip(spans, labels, strict=True)
                    if lab == "glean")
    levels = [lv for lv, n in (stats.get("communities_by_level") or {}).items() if n]
    return {
        "extract": int("extract" in labels),
        "glean": glean,
        "resolve": int("resolve" in labels),
        "summarize": int("summarize" in labels),
        "report": len(levels) if "report" in labels else 0,
        "embed": int("embed" in labels),
    }


def floor_s(requests: int, window: int, rounds: int, latency: float) -> float:
    return requests / window * latency + rounds * latency


def timeline(spans: list[Span], t0: float, end: float) -> list[dict[str, Any]]:
    """Per second from t0: the most requests in flight at once and the arrivals by label."""
    seconds = max(1, int(end - t0) + 1)
    rows: list[dict[str, Any]] = [{"s": i, "max_in_flight": 0, "started": {}}
                                  for i in range(seconds)]
    events = sorted([(a, 1) for _, a, _, _ in spans] + [(f, -1) for _, _, f, _ in spans],
                    key=lambda e: (e[0], e[1]))  # a reply before an arrival at the same instant
    level = 0
    for t, step in events:
        level += step
        i = min(max(int(t - t0), 0), seconds - 1)
        rows[i]["max_in_flight"] = max(rows[i]["max_in_flight"], level)
    # a second with no event still has whatever was in flight across it
    level = 0
    j = 0
    for i in range(seconds):
        while j < len(events) and events[j][0] < t0 + i:
            level += events[j][1]
            j += 1
        rows[i]["max_in_flight"] = max(rows[i]["max_in_flight"], level)
    for task, arrival, _, _ in spans:
        i = min(max(int(arrival - t0), 0), seconds - 1)
        started = rows[i]["started"]
        started[label_of(task)] = started.get(label_of(task), 0) + 1
    return rows


def by_label(spans: list[Span]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in spans:
        counts[label_of(s[0])] = counts.get(label_of(s[0]), 0) + 1
    return {k: counts[k] for k in ORDER if k in counts}


# ---- driver --------------------------------------------------------------------------------------


def _burn() -> None:  # pragma: no cover - a CPU burner process for --load
    while True:
        pass


def bench(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="canopy-build-floor-"))
    docs = work / "docs"
    n = materialize_multihop(docs, args.articles)
    fake = FakeHost(serve_with_latency, args.latency)
    report: dict[str, Any] = {"machine": machine(), "articles": n, "latency_s": args.latency,
                              "load_processes": args.load}
    ctx = multiprocessing.get_context("spawn")
    burners = [ctx.Process(target=_burn, daemon=True, name="cpu-burner")
               for _ in range(args.load)]
    for b in burners:
        b.start()
    try:
        fake.call("reset")
        load = [round(os.getloadavg()[0], 2)]
        print(f"[build_floor] Canopy, {n} articles at {args.latency * 1000:.0f} ms ...",
              file=sys.stderr, flush=True)
        ours = run_script_child(__file__, {"docs": str(docs), "index_dir": str(work / "index"),
                                           "base_url": fake.base_url}, "canopy")
        load.append(round(os.getloadavg()[0], 2))
        spans: list[Span] = fake.call("spans")
        rounds = dependency_rounds(spans, ours["stats"])
        chat = sum(1 for s in spans if label_of(s[0]) != "embed")
        embed = len(spans) - chat
        fl = floor_s(len(spans), ours["window"], sum(rounds.values()), args.latency)
        stats = ours["stats"]
        report["canopy"] = {
            "wall_s": ours["wall_s"], "imports_s": ours["imports_s"],
            "process_s": ours["process_s"], "requests": len(spans), "chat_requests": chat,
            "embedding_requests": embed,
            "requests_by_task": by_label(spans), "window": ours["window"],
            "embed_window": ours["embed_window"], "rounds": rounds,
            "rounds_total": sum(rounds.values()), "floor_s": round(fl, 3),
            "wall_over_floor": round(ours["wall_s"] / fl, 3),
            "reports_cover_communities": stats.get("reports_generated") == stats.get(
                "communities"),
            "failures": ours["failures"], "loadavg_1m": load,
            "text_units": stats.get("text_units"), "stats_seconds": stats.get("seconds"),
            "llm_concurrency": stats.get("llm_concurrency"),
            "timeline": timeline(spans, ours["t0_monotonic"],
                                 ours["t0_monotonic"] + ours["wall_s"]),
        }
        if args.graphrag_python:
            fake.call("reset")
            print("[build_floor] Microsoft GraphRAG, same articles and fake ...", file=sys.stderr,
                  flush=True)
            load = [round(os.getloadavg()[0], 2)]
            gr = run_graphrag(argparse.Namespace(graphrag_python=args.graphrag_python,
                                                 graphrag_tracemalloc=False),
                              docs, work / "graphrag", fake.base_url)
            load.append(round(os.getloadavg()[0], 2))
            gspans: list[Span] = fake.call("spans")
            report["graphrag"] = {
                "system": gr["system"], "wall_s": gr["wall_s"],
                "imports_s": gr.get("imports_s"), "process_s": gr["process_s"],
                "requests": len(gspans), "requests_by_task": by_label(gspans),
                "errors": gr["errors"], "loadavg_1m": load,
                "peak_in_flight": max((r["max_in_flight"] for r in timeline(
                    gspans, min((s[1] for s in gspans), default=0.0),
                    max((s[2] for s in gspans), default=0.0))), default=0),
            }
            report["canopy_over_graphrag_wall"] = round(ours["wall_s"] / gr["wall_s"], 3)
    finally:
        for b in burners:
            b.terminate()
        fake.stop()
        shutil.rmtree(work, ignore_errors=True)
    return report


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _tasks(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items()) or "-"


def render(report: dict[str, Any]) -> str:
    m, c = report["machine"], report["canopy"]
    r = c["rounds"]
    lines = [
        f"## Build floor: {report['articles']} MultiHop-RAG articles, fake endpoint at "
        f"{report['latency_s'] * 1000:.0f} ms ({m['date']}, commit {m['commit']}, "
        f"{m['cpus']} CPUs" + (f", {report['load_processes']} CPU-burning processes beside it"
                               if report.get("load_processes") else "") + ")",
        "",
        "| system | wall s | imports s | floor s | wall / floor | requests (chat + embed) "
        "| window | rounds | requests by task | load 1m before/after |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| Canopy | {c['wall_s']:.2f} | {_secs(c.get('imports_s'))} | {c['floor_s']:.2f} "
        f"| {c['wall_over_floor']:.2f} "
        f"| {c['requests']} ({c['chat_requests']} + {c['embedding_requests']}) "
        f"| {c['window']} (embed {c['embed_window']}) "
        f"| {c['rounds_total']} = " + " + ".join(f"{k} {v}" for k, v in r.items()) +
        f" | {_tasks(c['requests_by_task'])} | {'/'.join(map(str, c['loadavg_1m']))} |",
    ]
    g = report.get("graphrag")
    if g:
        lines.append(
            f"| {g['system']} | {g['wall_s']:.2f} | {_secs(g.get('imports_s'))} | - | - "
            f"| {g['requests']} "
            f"| {g['peak_in_flight']} seen | - | {_tasks(g['requests_by_task'])} "
            f"| {'/'.join(map(str, g['loadavg_1m']))} |")
        lines += ["", f"Canopy / GraphRAG wall: **{report['canopy_over_graphrag_wall']:.3f}**"]
        if g["errors"]:
            lines.append(f"GraphRAG reported errors: {'; '.join(g['errors'])}")
    if not c["reports_cover_communities"]:
        lines.append("Note: not every community got a report; report rounds count all levels.")
    lines += ["", "Canopy's requests in flight, per second of the build (max in flight; arrivals "
              "by task):", "", "| s | max | started |", "|---|---|---|"]
    lines += [f"| {row['s']} | {row['max_in_flight']} | {_tasks(row['started'])} |"
              for row in c["timeline"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--articles", type=int, default=30, metavar="N",
                   help="the first N MultiHop-RAG articles (default 30)")
    p.add_argument("--latency", type=float, default=0.5,
                   help="seconds the fake endpoint takes per request (default 0.5)")
    p.add_argument("--graphrag-python", type=Path, default=None, metavar="PYTHON",
                   help="also index the same articles with Microsoft GraphRAG run by this Python "
                   "(a virtual environment with graphrag installed), same fake, same run")
    p.add_argument("--load", type=int, default=0, metavar="N",
                   help="run N CPU-burning processes (busy loops, normal priority) beside both "
                   "builds: the machine under load (default 0)")
    p.add_argument("--out", type=Path, default=RESULTS / "build_floor.json")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        import json

        Path(args._out).write_text(json.dumps(child(json.loads(args._child))))
        return
    if args.articles < 1 or args.latency <= 0:
        p.error("--articles must be at least 1 and --latency above 0")
    if args.graphrag_python is not None and not args.graphrag_python.is_file():
        p.error(f"--graphrag-python: no such file: {args.graphrag_python}")
    report = bench(args)
    write_report(report, args.out, render(report))


if __name__ == "__main__":
    main()
