"""Indexing benchmark: wall time, peak memory, graph sizes and LLM traffic, side by side.

    python benchmarks/index_bench.py                       # every corpus, both modes
    python benchmarks/index_bench.py --corpus carol --mode fake
    python benchmarks/index_bench.py --corpus multihop --articles 50 --mode builtin
    python benchmarks/index_bench.py --profile             # also cProfile each run
    python benchmarks/index_bench.py --corpus carol --mode fake \
        --graphrag-python /work/graphrag-venv/bin/python   # and Microsoft GraphRAG, same fake

Corpora: A Christmas Carol (../shared/eval-data/books) and the MultiHop-RAG news articles
(../shared/eval-data/multihop-rag/corpus.json, written once to a temp folder as one .md per
article). Modes: `builtin` (the offline provider) and `fake` (the test suite's fake
OpenAI-compatible server at zero latency, hosted in its own process so its CPU and memory are not
charged to the run).

Every (corpus, mode) pair is indexed in a fresh Python subprocess, so peak RSS is per run, and then
indexed again in another fresh subprocess against the same index: that no-op rerun must cost ~0 LLM
calls. Results: a markdown table on stdout, JSON in benchmarks/results/index_bench.json.

With `--graphrag-python`, each corpus is also indexed by Microsoft GraphRAG (installed in its own
virtual environment, whose Python is given; benchmarks/graphrag_runner.py runs there) against the
same fake server, right after Canopy's runs of that corpus, and both are printed side by side.

Peak memory: Linux keeps `ru_maxrss` across fork+exec, so a child's figure is at least its parent's
RSS at spawn time. The driver therefore stays small (the fake server does not live in it), and each
run also reports VmHWM from /proc/self/status, which starts again at exec.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_host import FakeHost

REPO = Path(__file__).resolve().parents[1]
EVAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "eval-data"
CAROL_DIR = EVAL_DATA / "books"
MULTIHOP_JSON = EVAL_DATA / "multihop-rag" / "corpus.json"
RESULTS = REPO / "benchmarks" / "results"

FAKE_LLM = {"max_retries": 2, "backoff_s": 0.01, "concurrency": 8}
# stage boundaries, taken from the pipeline's progress callback (the first call of each stage)
STAGES = ["extract", "summarize", "reports", "embed"]
STAGE_LABELS = ["load+chunk", "extract", "merge+summarize+cluster", "reports", "embed+commit"]


# ---- child: one indexing run in a fresh interpreter ------------------------------------------


def child(spec: dict[str, Any]) -> dict[str, Any]:
    import resource

    t_start = time.perf_counter()
    sys.path.insert(0, str(REPO))
    from canopy.server.runtime import build_index, open_workspace

    def rss_mb() -> float:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024

    def hwm_mb() -> float | None:  # this address space's peak only (Linux)
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return None
        m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
        return int(m.group(1)) / 1024 if m else None

    rss_imports = rss_mb()
    overrides: dict[str, Any] = {}
    if spec["base_url"]:
        overrides["llm"] = {"base_url": spec["base_url"], **FAKE_LLM}
    ws = open_workspace(Path(spec["docs"]), index_dir=Path(spec["index_dir"]), **overrides)
    # The libraries a build loads on first use, imported before the timer: GraphRAG's runner
    # times its `graphrag.api` import apart from the build in the same way, so both "wall s"
    # figures are the build alone and "process s" has every import on both sides.
    t_imp = time.perf_counter()
    from canopy.lance import import_lancedb

    import_lancedb()
    if spec["base_url"]:
        from canopy.endpoint import preload_sdk

        preload_sdk()  # openai and its HTTP client (canopy.endpoint imports them on first use)
    imports_s = time.perf_counter() - t_imp

    marks: dict[str, float] = {}
    hwm_marks: dict[str, float | None] = {}  # peak RSS so far, when each stage starts

    def progress(stage: str, total: int):  # type: ignore[no-untyped-def]
        if stage not in marks:
            marks[stage] = time.perf_counter()
            hwm_marks[stage] = hwm_mb()
        return lambda n: None

    profiler = None
    if spec.get("profile"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    t0 = time.perf_counter()
    c0 = time.process_time()
    result = build_index(ws, progress=progress)
    t1 = time.perf_counter()
    cpu = time.process_time() - c0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(spec["profile"])

    hwm_end = hwm_mb()
    bounds = [*(marks.get(s) for s in STAGES), t1]
    hwm_bounds = [*(hwm_marks.get(s) for s in STAGES), hwm_end]
    stages: dict[str, float] = {}
    hwm_after: dict[str, float] = {}  # peak RSS reached by the end of each stage (Linux)
    last = t0
    for label, mark, hwm in zip(STAGE_LABELS, bounds, hwm_bounds, strict=True):
        if mark is None:  # a stage with nothing to do may not call progress
            continue
        stages[label] = round(mark - last, 3)
        if hwm is not None:
            hwm_after[label] = round(hwm, 1)
        last = mark
    return {
        "wall_s": round(t1 - t0, 3),
        "cpu_s": round(cpu, 3),  # this process's CPU (all threads): steadier than wall under load
        "startup_s": round(t0 - t_start, 3),
        "imports_s": round(imports_s, 3),  # provider and vector-store libraries, before t0
        "peak_rss_mb": round(rss_mb(), 1),
        "vm_hwm_mb": None if hwm_end is None else round(hwm_end, 1),
        "rss_after_imports_mb": round(rss_imports, 1),
        "stages_s": stages,
        "peak_rss_after_stage_mb": hwm_after,
        "stats": result.stats,
        "usage": result.usage,
        "failures": len(result.failures),
        "skips": len(result.skips),
        "provider": "openai" if ws.settings.llm.enabled else "builtin",
    }


# ---- the fake endpoint, in its own process -------------------------------------------------------


def zero_latency_fake() -> FakeHost:
    """The fake endpoint at zero latency in its own process (reset, stats, stop)."""
    return FakeHost(_fake_host)


def _fake_host(conn: Any) -> None:
    """Serve FakeOpenAI and answer the driver's commands over a pipe: reset, stats, stop."""
    sys.path.insert(0, str(REPO))
    from tests.fakes.openai_server import FakeOpenAI, _prompt_tokens

    fake = FakeOpenAI(latency=0.0).start()
    conn.send(fake.base_url)
    cpu0 = time.process_time()

    def chat_prompt_tokens() -> dict[str, int]:
        # the fake's own count (a quarter of the messages' characters), the same for both
        # systems: what each one's usage would report from this endpoint
        out: dict[str, int] = {}
        for r in fake.requests:
            if r.task != "embeddings" and r.status == 200:
                out[r.task] = out.get(r.task, 0) + _prompt_tokens(r.task, r.body)
        return dict(sorted(out.items()))

    while True:
        cmd, _ = conn.recv()
        if cmd == "reset":
            fake.reset()
            cpu0 = time.process_time()
            conn.send(None)
        elif cmd == "stats":
            conn.send(
                {
                    "requests": len(fake.requests),
                    "by_task": dict(sorted(fake.calls.items())),
                    "max_in_flight": fake.max_in_flight,
                    "cpu_s": round(time.process_time() - cpu0, 3),
                    "chat_prompt_tokens_by_task": chat_prompt_tokens(),
                }
            )
        else:
            fake.stop()
            conn.send(None)
            return


# ---- driver ------------------------------------------------------------------------------------


def slug(text: str, limit: int = 60) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:limit].rstrip("-") or "article"


def materialize_multihop(dest: Path, n: int | None) -> int:
    articles = json.loads(MULTIHOP_JSON.read_text(encoding="utf-8"))
    if n is not None:
        articles = articles[:n]
    dest.mkdir(parents=True, exist_ok=True)
    for i, a in enumerate(articles):
        (dest / f"{i:04d}-{slug(a['title'])}.md").write_text(
            f"# {a['title']}\n\n{a['body']}\n", encoding="utf-8"
        )
    return len(articles)


def child_env() -> dict[str, str]:
    """The caller's environment without endpoint settings: each mode configures its own."""
    drop = ("CANOPY_", "OPENAI_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def run_script_child(script: str, spec: dict[str, Any], label: str) -> dict[str, Any]:
    """Run `script --_child SPEC` in a fresh interpreter and return the JSON it wrote, with the
    subprocess's wall time as `process_s` (start-up and imports included)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as fh:
        out = Path(fh.name)
    try:
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, str(Path(script).resolve()), "--_child", json.dumps(spec),
             "--_out", str(out)],
            cwd=REPO, env=child_env(), capture_output=True, text=True, check=False)
        elapsed = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"run {label} failed (exit {proc.returncode}):\n"
                               f"{proc.stderr[-4000:]}")
        data = dict(json.loads(out.read_text()))
    finally:
        out.unlink(missing_ok=True)
    data["process_s"] = round(elapsed, 3)
    return data


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    return run_script_child(__file__, spec, spec["label"])


def write_report(report: dict[str, Any], out: Path, rendered: str) -> None:
    """The JSON to `out`, the markdown table to stdout, the JSON's path to stderr."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(rendered)
    print(f"\nJSON: {out}", file=sys.stderr)


def profile_summary(path: Path, top: int = 15) -> dict[str, list[dict[str, Any]]]:
    """Top functions by self time (anywhere), and by cumulative time among the project's own."""
    import pstats

    st = pstats.Stats(str(path))
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        where = func if file == "~" else f"{_short(file)}:{line}:{func}"
        own = file.startswith(str(REPO) + os.sep)
        rows.append(
            {
                "where": where,
                "own": own,
                "tottime_s": round(tt, 3),
                "cumtime_s": round(ct, 3),
                "calls": nc,
            }
        )
    by_self = sorted(rows, key=lambda r: r["tottime_s"], reverse=True)[:top]
    by_cum = sorted((r for r in rows if r["own"]), key=lambda r: r["cumtime_s"], reverse=True)[:top]
    return {"self": by_self, "cumulative_own": by_cum}


def _short(file: str) -> str:
    for root in (
        str(REPO) + os.sep,
        "site-packages" + os.sep,
        os.path.dirname(os.__file__) + os.sep,
    ):
        if root in file:
            return file.split(root, 1)[1]
    return file


def bench(args: argparse.Namespace) -> dict[str, Any]:
    corpora = ["carol", "multihop"] if args.corpus == "all" else [args.corpus]
    modes = ["builtin", "fake"] if args.mode == "all" else [args.mode]
    work = Path(tempfile.mkdtemp(prefix="canopy-index-bench-"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    docs: dict[str, Path] = {}
    names: dict[str, str] = {}
    sizes: dict[str, str] = {}  # in .prof file names, so a quick run does not overwrite a full one
    for corpus in corpora:
        if corpus == "carol":
            docs[corpus], names[corpus], sizes[corpus] = CAROL_DIR, "A Christmas Carol", ""
        else:
            n = materialize_multihop(work / "multihop-docs", args.articles)
            docs[corpus], names[corpus] = work / "multihop-docs", f"MultiHop-RAG ({n} articles)"
            sizes[corpus] = str(n)

    fake = zero_latency_fake() if "fake" in modes else None
    runs: list[dict[str, Any]] = []
    graphrag_runs: list[dict[str, Any]] = []
    try:
        for corpus in corpora:
            for mode in modes:
                index_dir = work / f"index-{corpus}-{mode}"
                for run in ("build", "rerun"):
                    label = f"{corpus}/{mode}/{run}"
                    print(f"[index_bench] {label} ...", file=sys.stderr, flush=True)
                    spec: dict[str, Any] = {
                        "label": label,
                        "docs": str(docs[corpus]),
                        "index_dir": str(index_dir),
                        "base_url": fake.base_url if fake and mode == "fake" else None,
                    }
                    if args.profile:
                        spec["profile"] = str(
                            RESULTS / f"index_bench-{corpus}{sizes[corpus]}-{mode}-{run}.prof"
                        )
                    if fake is not None:
                        fake.call("reset")
                    load_before = os.getloadavg()[0]
                    data = run_child(spec)
                    # other processes on the machine skew timings: keep the 1-min load average
                    data["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                    if fake is not None and mode == "fake":
                        st = fake.call("stats")
                        data["fake_requests"] = st["requests"]
                        data["fake_requests_by_task"] = st["by_task"]
                        data["fake_max_in_flight"] = st["max_in_flight"]
                        data["fake_server_cpu_s"] = st["cpu_s"]
                        data["fake_chat_prompt_tokens_by_task"] = st[
                            "chat_prompt_tokens_by_task"]
                        data["fake_chat_prompt_tokens"] = sum(
                            st["chat_prompt_tokens_by_task"].values())
                    if args.profile:
                        data["profile_top"] = profile_summary(Path(spec["profile"]))
                        data["profile_file"] = spec["profile"]
                    units = data["stats"].get("text_units", 0)
                    data["units_per_s"] = (
                        round(units / data["wall_s"], 2) if data["wall_s"] else None
                    )
                    runs.append(
                        {
                            "corpus": corpus,
                            "corpus_name": names[corpus],
                            "mode": mode,
                            "run": run,
                            **data,
                        }
                    )
                    print(
                        f"[index_bench] {label}: {data['wall_s']:.2f} s, "
                        f"{data['peak_rss_mb']:.0f} MB",
                        file=sys.stderr,
                        flush=True,
                    )
            if args.graphrag_python and fake is not None:
                print(f"[index_bench] {corpus}/graphrag ...", file=sys.stderr, flush=True)
                fake.call("reset")
                load_before = os.getloadavg()[0]
                gr = run_graphrag(args, docs[corpus], work / f"graphrag-{corpus}", fake.base_url)
                st = fake.call("stats")
                gr.update(corpus=corpus, corpus_name=names[corpus],
                          loadavg_1m=[round(load_before, 2), round(os.getloadavg()[0], 2)],
                          fake_requests=st["requests"], fake_requests_by_task=st["by_task"],
                          fake_max_in_flight=st["max_in_flight"], fake_server_cpu_s=st["cpu_s"],
                          fake_chat_prompt_tokens_by_task=st["chat_prompt_tokens_by_task"],
                          fake_chat_prompt_tokens=sum(st["chat_prompt_tokens_by_task"].values()))
                graphrag_runs.append(gr)
                print(f"[index_bench] {corpus}/graphrag: {gr['wall_s']:.2f} s, "
                      f"{gr['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    finally:
        if fake is not None:
            fake.stop()
        if args.keep:
            print(f"[index_bench] kept index folders under {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "machine": machine(),
        "settings": {"fake_llm": FAKE_LLM, "articles": args.articles},
        "runs": runs,
        "graphrag": side_by_side(runs, graphrag_runs),
    }


def run_graphrag(args: argparse.Namespace, docs: Path, root: Path, base_url: str) -> dict[str, Any]:
    """Index `docs` with Microsoft GraphRAG (benchmarks/graphrag_runner.py, in the Python of
    GraphRAG's own virtual environment) against the fake endpoint at `base_url`."""
    out = root.with_suffix(".json")
    cmd = [str(args.graphrag_python), str(Path(__file__).with_name("graphrag_runner.py")),
           "--docs", str(docs), "--root", str(root), "--base-url", base_url, "--out", str(out)]
    if args.graphrag_tracemalloc:
        cmd.append("--tracemalloc")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"GraphRAG failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    data["process_s"] = round(elapsed, 3)
    return data


def _count(v: int | None) -> str:
    return "-" if v is None else f"{v:,}"


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def side_by_side(
    runs: list[dict[str, Any]], graphrag: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Canopy's fake-mode build of each corpus beside GraphRAG's, with ratios (Canopy/GraphRAG)."""
    out = []
    for gr in graphrag:
        ours = next((r for r in runs if r["corpus"] == gr["corpus"] and r["mode"] == "fake"
                     and r["run"] == "build"), None)
        if ours is None:
            continue
        pairs = {"wall_s": ("wall_s", "wall_s"), "cpu_s": ("cpu_s", "cpu_s"),
                 "imports_s": ("imports_s", "imports_s"),
                 "process_s": ("process_s", "process_s"),
                 "peak_rss_mb": ("peak_rss_mb", "peak_rss_mb"),
                 "requests": ("fake_requests", "fake_requests"),
                 "chat_prompt_tokens": ("fake_chat_prompt_tokens", "fake_chat_prompt_tokens")}
        ratios = {k: round(ours[a] / gr[b], 4) for k, (a, b) in pairs.items()
                  if gr.get(b) and ours.get(a) is not None}
        out.append({"corpus": gr["corpus"], "corpus_name": gr["corpus_name"], "canopy": {
            "wall_s": ours["wall_s"], "cpu_s": ours["cpu_s"], "process_s": ours["process_s"],
            "imports_s": ours.get("imports_s"),
            "peak_rss_mb": ours["peak_rss_mb"], "requests": ours.get("fake_requests"),
            "requests_by_task": ours.get("fake_requests_by_task"),
            "chat_prompt_tokens": ours.get("fake_chat_prompt_tokens"),
            "chat_prompt_tokens_by_task": ours.get("fake_chat_prompt_tokens_by_task"),
            "loadavg_1m": ours.get("loadavg_1m")}, "graphrag": gr, "ratio_canopy_over_graphrag":
            ratios})
    return out


def machine() -> dict[str, Any]:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain"], cwd=REPO, capture_output=True, text=True, check=False
    )
    diff = subprocess.run(["git", "diff", "HEAD"], cwd=REPO, capture_output=True, check=False)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "commit": commit.stdout.strip() + ("+dirty" if dirty.stdout.strip() else ""),
        "tracked_diff_sha256": hashlib.sha256(diff.stdout).hexdigest()[:12]
        if diff.stdout
        else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# ---- output ------------------------------------------------------------------------------------


def _calls(usage: dict[str, dict[str, int]]) -> str:
    if not usage:
        return "0"
    parts = [
        f"{t} {u['calls']}" + (f" (+{u['cached']} cached)" if u.get("cached") else "")
        for t, u in usage.items()
    ]
    return f"{sum(u['calls'] for u in usage.values())}: " + ", ".join(parts)


def _tokens(usage: dict[str, dict[str, int]]) -> str:
    total_p = sum(u["prompt_tokens"] for u in usage.values())
    total_c = sum(u["completion_tokens"] for u in usage.values())
    if not total_p and not total_c:
        return "0"
    parts = [f"{t} {u['prompt_tokens'] + u['completion_tokens']:,}" for t, u in usage.items()]
    return f"{total_p:,} in / {total_c:,} out ({', '.join(parts)})"


def _biggest_growth(after: dict[str, float], start: float) -> str | None:
    """The stage that raised peak RSS the most, with how much."""
    best, last = None, start
    for label in STAGE_LABELS:
        if label in after:
            grow = after[label] - last
            if best is None or grow > best[1]:
                best = (label, grow)
            last = after[label]
    return f"+{best[1]:.0f} in {best[0]}" if best else None


def _by_task(counts: dict[str, int] | None) -> str:
    return ", ".join(f"{t} {n}" for t, n in (counts or {}).items()) or "-"


def render(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        (
            f"## Canopy indexing benchmark ({m['date']}, commit {m['commit']}, "
            f"Python {m['python']}, {m['cpus']} CPUs)"
        ),
        "",
    ]
    lines += [
        (
            "| corpus | mode | run | wall s | process s | units/s | peak RSS MB | docs | units "
            "| entities | rels | communities (by level) | reports | provider calls by task "
            "| tokens | fake reqs |"
        ),
        "|" + "---|" * 16,
    ]
    for r in report["runs"]:
        s = r["stats"]
        levels = "/".join(
            str(v)
            for _, v in sorted(s.get("communities_by_level", {}).items(), key=lambda kv: int(kv[0]))
        )
        lines.append(
            f"| {r['corpus_name']} | {r['mode']} | {r['run']} | {r['wall_s']:.2f} "
            f"| {r['process_s']:.2f} | {r['units_per_s']:.1f} | {r['peak_rss_mb']:.0f} "
            f"| {s['documents']} | {s['text_units']} | {s['entities']} | {s['relationships']} "
            f"| {s['communities']} ({levels}) | {s['reports']} "
            f"| {_calls(r['usage'])} | {_tokens(r['usage'])} | {r.get('fake_requests', '-')} |"
        )
    lines += [
        "",
        "Stage times (s), from the pipeline's progress callbacks:",
        "",
        "| corpus | mode | run | "
        + " | ".join(STAGE_LABELS)
        + " | RSS after imports MB | VmHWM MB (largest rise) | fake server CPU s "
        "| load avg before/after |",
        "|" + "---|" * (7 + len(STAGE_LABELS)),
    ]
    for r in report["runs"]:
        cells = " | ".join(
            f"{r['stages_s'][k]:.2f}" if k in r["stages_s"] else "-" for k in STAGE_LABELS
        )
        hwm = "-" if r.get("vm_hwm_mb") is None else f"{r['vm_hwm_mb']:.0f}"
        grew = _biggest_growth(r.get("peak_rss_after_stage_mb", {}), r["rss_after_imports_mb"])
        if grew:
            hwm += f" ({grew})"
        cpu = f"{r['fake_server_cpu_s']:.1f}" if "fake_server_cpu_s" in r else "-"
        lines.append(
            f"| {r['corpus_name']} | {r['mode']} | {r['run']} | {cells} "
            f"| {r['rss_after_imports_mb']:.0f} | {hwm} | {cpu} "
            f"| {'/'.join(str(x) for x in r.get('loadavg_1m', [])) or '-'} |"
        )
    if not report.get("graphrag"):
        lines += ["", "Microsoft GraphRAG is not compared in this run: add --graphrag-python "
                  "PYTHON (benchmarks/README.md) to index the same corpus with it against the "
                  "same fake."]
    for pair in report.get("graphrag", []):
        c, g, x = pair["canopy"], pair["graphrag"], pair["ratio_canopy_over_graphrag"]
        tm = "on" if g["tracemalloc"] else "off"
        lines += [
            "",
            f"{pair['corpus_name']}, same fake endpoint at zero latency, measured in this run "
            f"(Canopy: fake mode, build; {g['system']}: tracemalloc {tm}):",
            "",
            "| system | wall s | CPU s | imports s (not in wall) | process s | peak RSS MB "
            "| requests | chat prompt tokens | requests by task | load avg before/after |",
            "|---|---|---|---|---|---|---|---|---|---|",
            f"| Canopy | {c['wall_s']:.2f} | {c['cpu_s']:.2f} | {_secs(c.get('imports_s'))} "
            f"| {c['process_s']:.2f} "
            f"| {c['peak_rss_mb']:.0f} | {c['requests']} | {_count(c.get('chat_prompt_tokens'))} "
            f"| {_by_task(c['requests_by_task'])} "
            f"| {'/'.join(str(v) for v in c.get('loadavg_1m') or [])} |",
            f"| {g['system']} | {g['wall_s']:.2f} | {g['cpu_s']:.2f} "
            f"| {_secs(g.get('imports_s'))} | {g['process_s']:.2f} "
            f"| {g['peak_rss_mb']:.0f} | {g['fake_requests']} "
            f"| {_count(g.get('fake_chat_prompt_tokens'))} "
            f"| {_by_task(g['fake_requests_by_task'])} "
            f"| {'/'.join(str(v) for v in g['loadavg_1m'])} |",
            "| Canopy / GraphRAG | " + " | ".join(
                f"{x[k]:.3f}" if k in x else "-"
                for k in ("wall_s", "cpu_s", "imports_s", "process_s", "peak_rss_mb", "requests",
                          "chat_prompt_tokens"))
            + " | | |",
        ]
        if c.get("chat_prompt_tokens_by_task") and g.get("fake_chat_prompt_tokens_by_task"):
            lines += ["", "Chat prompt tokens by task (the fake's count, a quarter of the "
                      "messages' characters): Canopy "
                      f"{_by_task(c['chat_prompt_tokens_by_task'])}; {g['system']} "
                      f"{_by_task(g['fake_chat_prompt_tokens_by_task'])}."]
        if g["errors"]:
            lines.append(f"GraphRAG reported errors: {'; '.join(g['errors'])}")
    profiled = [r for r in report["runs"] if r.get("profile_top")]
    for r in profiled:
        for kind, title in (
            ("self", "self time, any code"),
            ("cumulative_own", "cumulative time, Canopy code"),
        ):
            lines += [
                "",
                f"Top by {title}: {r['corpus_name']} / {r['mode']} / {r['run']} "
                f"({r['profile_file']}):",
                "",
                "| where | self s | cumulative s | calls |",
                "|---|---|---|---|",
            ]
            lines += [
                f"| `{h['where']}` | {h['tottime_s']:.2f} | {h['cumtime_s']:.2f} | {h['calls']} |"
                for h in r["profile_top"][kind][:10]
            ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--corpus", choices=["carol", "multihop", "all"], default="all")
    p.add_argument("--mode", choices=["builtin", "fake", "all"], default="all")
    p.add_argument(
        "--articles",
        type=int,
        default=None,
        metavar="N",
        help="MultiHop-RAG: only the first N articles",
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temp folder with the materialized corpus and indexes",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="cProfile each run; .prof files go to benchmarks/results/",
    )
    p.add_argument(
        "--out", type=Path, default=RESULTS / "index_bench.json", help="JSON results file"
    )
    p.add_argument(
        "--graphrag-python",
        type=Path,
        default=None,
        metavar="PYTHON",
        help="also index each corpus with Microsoft GraphRAG, run by this Python (a virtual "
        "environment with graphrag installed), against the same fake endpoint (needs --mode "
        "fake or all)",
    )
    p.add_argument(
        "--graphrag-tracemalloc",
        action="store_true",
        help="leave GraphRAG's per-workflow tracemalloc on (off by default: its best time)",
    )
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        Path(args._out).write_text(json.dumps(child(json.loads(args._child))))
        return
    if args.articles is not None and args.articles < 1:
        p.error("--articles must be at least 1")
    if args.graphrag_python is not None:
        if args.mode == "builtin":
            p.error("--graphrag-python needs the fake endpoint: --mode fake (or all)")
        if not Path(args.graphrag_python).is_file():
            p.error(f"--graphrag-python: no such file: {args.graphrag_python}")
    report = bench(args)
    write_report(report, args.out, render(report))


if __name__ == "__main__":
    main()
