"""Growth benchmark (issue 14): how Canopy's indexing and serving costs grow with the corpus.

    python benchmarks/growth_bench.py                                  # 100, 609, 1,827, 10,000
    python benchmarks/growth_bench.py --sizes 100,609,1827 --fake      # plus the fake-LLM build
    python benchmarks/growth_bench.py --sizes 609 --only build,updates # indexing only
    python benchmarks/growth_bench.py --repo /path/to/old/checkout     # measure another checkout

Corpora: the 609 MultiHop-RAG articles (../shared/eval-data/multihop-rag/corpus.json), repeated.
Article i of the stream is article i % 609 of copy k = i // 609; copy k >= 1 has every capitalised
word suffixed with a syllable naming the copy ("Apple" -> "Applebe" in copy 1, "Applebi" in copy
2), so each copy's entities stay apart from the other copies'. Function words, honorifics, days
and months keep their spelling (_NOT_NAMES). The suffix is letters only: the builtin embedder
splits digits from letters, so "Apple3" would share a "3" token across copies. One .md per
article, `# {title}\\n\\n{body}`, named by stream position: deterministic.

Per size, every step runs in a fresh Python subprocess, so its peak memory is its own:
  build      full build (builtin provider)
  updates    then on that index: +1 article (stream article n), a one-paragraph edit (article
             n // 2), delete one article (n // 3), a no-op rerun
  fake       (--fake, at --fake-size only) the full build against the test suite's fake OpenAI
             server at zero latency, hosted in a process of its own, into a separate index
  serve      `python -m canopy.server.cli serve DOCS --index-dir IDX --http` from --repo, driven by
  the
             MCP SDK's Streamable HTTP client in a subprocess (benchmarks/growth_serve.py): start
             to handshake, first local_search, server RSS, p50/p95 of local/basic/global search
  concurrency  16 concurrent HTTP clients mixing local_search, basic_search and drill_down vs
             one client, on the same server, in alternating windows (--conc-rounds)

The driver imports nothing but the standard library: Linux carries ru_maxrss over fork+exec, so a
child's ru_maxrss is at least the driver's RSS. Each step also reports VmHWM, which restarts at
exec. Results: a markdown table on stdout (progress on stderr), JSON in
benchmarks/results/growth_bench.json (or --out); `--render A.json B.json` prints saved runs again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from growth_report import STEP_LABELS, UPDATE_STEPS, merge, render  # beside this script

SCRIPT = Path(__file__).resolve()
HERE_REPO = SCRIPT.parents[1]
EVAL_DATA = HERE_REPO.parent / "shared" / "eval-data" / "multihop-rag"
CORPUS = EVAL_DATA / "corpus.json"
RESULTS = HERE_REPO / "benchmarks" / "results"

PHASES = ("build", "updates", "fake", "serve", "concurrency")
FAKE_LLM = {"max_retries": 2, "backoff_s": 0.01}  # concurrency stays at the checkout's default
EDIT_SENTENCE = " A correction was appended to this paragraph by the editors."

# copy k's suffix: k written in base 70 with consonant-vowel syllables ("be", "bi", ... "zu")
_SYLLABLES = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
_CAPITALISED = re.compile(r"\b[A-Z][A-Za-z]*")
# Capitalised words that are never names keep their spelling in every copy: suffixed, each
# copy's "The" or "Monday" would become a name of its own in every article of that copy.
_NOT_NAMES = frozenset("""
    A An The This That These Those It Its He She They We I You His Her Their Our My Your Him Them
    In On At For From By With Of To As Into Over Under About After Before Since During Until
    And But Or Nor So If When While Because Although Though Unless Whether Than Then Now
    Not No Yes There Here What Who Whom Whose Which Why How Where All Some Many Most More Any
    Each Every Both Few Several Such Other Another One Two Three Also However Meanwhile Still Yet
    Today Yesterday Tomorrow Is Was Are Were Be Been Has Have Had Do Does Did Will Would Can
    Could Should May Might Must Shall Let Just Even Only Instead Last Next First New
    Mr Mrs Ms Dr Prof St Jr Sr
    Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April June
    July August September October November December
    """.split())


# ---- corpus ------------------------------------------------------------------------------------


def copy_suffix(k: int) -> str:
    """The syllables that mark copy k (empty for the original, copy 0): k in base 70."""
    out = ""
    while k:
        k, r = divmod(k, len(_SYLLABLES))
        out = _SYLLABLES[r] + out
    return out


def article(base: list[dict[str, str]], i: int) -> tuple[str, str]:
    """(title, body) of article i of the repeated corpus."""
    k, j = divmod(i, len(base))
    title, body = base[j]["title"], base[j]["body"]
    suffix = copy_suffix(k)
    if not suffix:
        return title, body
    def mark(m: re.Match[str]) -> str:
        word = m.group(0)
        return word if word in _NOT_NAMES else word + suffix

    return _CAPITALISED.sub(mark, title), _CAPITALISED.sub(mark, body)


def article_path(docs: Path, i: int, title: str) -> Path:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60].rstrip("-") or "article"
    return docs / f"{i:05d}-{slug}.md"


def write_article(docs: Path, base: list[dict[str, str]], i: int) -> Path:
    title, body = article(base, i)
    path = article_path(docs, i, title)
    path.write_text(f"# {title}\n\n{body}\n", encoding="utf-8")
    return path


def materialize(docs: Path, base: list[dict[str, str]], n: int) -> list[Path]:
    """Articles 0..n-1 of the stream in a fresh folder."""
    shutil.rmtree(docs, ignore_errors=True)
    docs.mkdir(parents=True)
    return [write_article(docs, base, i) for i in range(n)]


def edit_one_paragraph(path: Path) -> None:
    """Append a sentence to the middle paragraph of the body (the title is paragraph 0)."""
    paras = path.read_text(encoding="utf-8").split("\n\n")
    k = max(1, len(paras) // 2) if len(paras) > 1 else 0
    paras[k] = paras[k].rstrip("\n") + EDIT_SENTENCE + ("\n" if paras[k].endswith("\n") else "")
    path.write_text("\n\n".join(paras), encoding="utf-8")


# ---- children: each runs in a fresh interpreter ------------------------------------------------


def mem_mb() -> dict[str, float | None]:
    """This process's ru_maxrss and VmHWM/VmRSS (Linux), in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out: dict[str, float | None] = {"ru_maxrss_mb": round(peak / 1024, 1),
                                    "vm_hwm_mb": None, "vm_rss_mb": None}
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return out
    for key, field in (("vm_hwm_mb", "VmHWM"), ("vm_rss_mb", "VmRSS")):
        m = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
        out[key] = round(int(m.group(1)) / 1024, 1) if m else None
    return out


def index_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One build_index() of the checkout at spec['repo'] (its code, not this script's)."""
    t_start = time.perf_counter()
    sys.path.insert(0, spec["repo"])
    from canopy.server.runtime import build_index, open_workspace

    floor = mem_mb()
    overrides: dict[str, Any] = {}
    if spec.get("base_url"):
        overrides["llm"] = {"base_url": spec["base_url"], **FAKE_LLM}
    ws = open_workspace(Path(spec["docs"]), index_dir=Path(spec["index_dir"]), **overrides)
    background = spec.get("background_tidy", False)
    t0 = time.perf_counter()
    try:  # an update as `canopy index` runs it: the tidy is left to a background process
        result = build_index(ws, tidy=not background)
    except TypeError:  # a checkout from before the background tidy: it tidies inline
        background = False
        result = build_index(ws)
    wall = time.perf_counter() - t0
    mem = mem_mb()
    tidy: dict[str, Any] = {}
    if background:  # what the background `canopy tidy` then does, timed on its own
        from canopy.server.runtime import maintain_index

        before = _meta(ws.index_dir, "lance_tidied_at")
        t1 = time.perf_counter()
        maintain_index(ws)
        tidy = {"tidy_s": round(time.perf_counter() - t1, 3),
                "tidy_periodic": _meta(ws.index_dir, "lance_tidied_at") != before,
                "tidy_peak_mb": mem_mb()["vm_hwm_mb"]}
    keys = ("documents", "text_units", "entities", "relationships", "communities", "reports",
            "units_extracted", "reports_generated")
    return {
        "wall_s": round(wall, 3),
        "startup_s": round(t0 - t_start, 3),
        "peak_mb": mem["vm_hwm_mb"] or mem["ru_maxrss_mb"],
        **mem,
        "rss_after_imports_mb": floor["vm_rss_mb"],
        "stats": {k: result.stats[k] for k in keys if k in result.stats},
        "stage_s": result.stats.get("seconds", {}),  # where an update's time went
        "stage_peak_mb": result.stats.get("peak_mb", {}),
        "llm_calls": sum(int(u.get("calls", 0)) for u in result.usage.values()),
        "failures": len(result.failures),
        "llm_concurrency": ws.settings.llm.concurrency if ws.settings.llm.enabled else None,
        **tidy,
    }


def _meta(index_dir: Path, key: str) -> str | None:
    import sqlite3

    db = sqlite3.connect(index_dir / "canopy.sqlite")
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None
    finally:
        db.close()


def fake_child(repo: str) -> None:
    """Host the fake OpenAI server; print its URL, then answer `stats` lines until `stop`/EOF."""
    sys.path.insert(0, repo)
    from tests.fakes.openai_server import FakeOpenAI

    fake = FakeOpenAI(latency=0.0).start()
    print(fake.base_url, flush=True)
    cpu0 = time.process_time()
    for line in sys.stdin:
        if line.strip() != "stats":
            break
        print(json.dumps({"requests": len(fake.requests), "max_in_flight": fake.max_in_flight,
                          "cpu_s": round(time.process_time() - cpu0, 3)}), flush=True)
    fake.stop()


# ---- running children --------------------------------------------------------------------------


def child_env(repo: Path) -> dict[str, str]:
    """The caller's environment without endpoint settings, importing from `repo` first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["PYTHONPATH"] = str(repo)
    return env


def run_child(argv: list[str], repo: Path, timeout: float, out: Path) -> dict[str, Any]:
    """Run a child (its own process group, killed whole on timeout); its JSON from `out`.

    A child that times out or fails still returns what it wrote so far, with `status`."""
    out.unlink(missing_ok=True)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=repo, env=child_env(repo), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        status = "timeout"
    data: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    data.update(status=status, process_s=round(time.perf_counter() - t0, 3),
                loadavg_1m=[round(load0, 2), round(os.getloadavg()[0], 2)])
    if status == "failed":
        data["error"] = err[-3000:]
        print(f"[growth] child failed:\n{err[-3000:]}", file=sys.stderr)
    return data


def index_step(spec: dict[str, Any], timeout: float, work: Path) -> dict[str, Any]:
    out = work / "child.json"
    argv = [sys.executable, str(SCRIPT), "--_child", json.dumps(spec), "--_out", str(out)]
    return run_child(argv, Path(spec["repo"]), timeout, out)


class FakeHost:
    """The fake OpenAI server in a process of its own, so the driver stays small."""

    def __init__(self, repo: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(SCRIPT), "--_fake", str(repo)],
                                     cwd=repo, env=child_env(repo), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.base_url = self.proc.stdout.readline().strip()

    def stats(self) -> dict[str, Any]:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return dict(json.loads(self.proc.stdout.readline()))

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---- driver ------------------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[growth {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def describe(label: str, r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"{label}: {r.get('status')} after {r.get('process_s', 0):.0f} s"
    tidy = (f"; then background tidy {r['tidy_s']:.2f} s"
            f"{' (periodic)' if r.get('tidy_periodic') else ''}" if "tidy_s" in r else "")
    return f"{label}: {r['wall_s']:.2f} s, peak {r['peak_mb']:.0f} MB{tidy}"


def index_steps(n: int, base: list[dict[str, str]], args: argparse.Namespace,
                phases: set[str], size_dir: Path) -> dict[str, dict[str, Any]]:
    """Full build, then +1 / edit / delete / no-op on that index (and the fake build)."""
    docs, index_dir = size_dir / "docs", size_dir / "index"
    reused = args.reuse is not None
    files = (sorted(docs.glob("*.md"))[:n] if reused else materialize(docs, base, n))
    spec = {"repo": str(args.repo), "docs": str(docs), "index_dir": str(index_dir)}
    steps: dict[str, dict[str, Any]] = {}
    if "fake" in phases and n == args.fake_size:
        steps["fake"] = fake_build(spec, args, size_dir)
    if not phases & {"build", "updates", "serve", "concurrency"}:
        return steps  # the others need an index: the full build is measured on the way
    if reused:  # an index a --keep run left: the code under test first brings it up to date
        log(f"{n}: reusing {size_dir} (full build not measured); catching up")
        steps["build"] = {**index_step(spec, args.build_timeout, size_dir), "reused": True}
        log(describe(f"{n} catch-up run", steps["build"]))
    else:
        log(f"{n}: full build")
        steps["build"] = index_step(spec, args.build_timeout, size_dir)
        log(describe(f"{n} full build", steps["build"]))
    if "updates" not in phases or steps["build"]["status"] != "ok":
        return steps
    # the next article of the stream: after n in a fresh folder; after the highest number a
    # reused folder holds (an earlier run's +1 article is there already)
    after = 1 + max((int(p.name[:5]) for p in docs.glob("*.md") if p.name[:5].isdigit()),
                    default=n - 1)
    changes: dict[str, Callable[[], object]] = {
        "add": lambda: write_article(docs, base, after),
        "edit": lambda: edit_one_paragraph(files[n // 2]),
        "delete": lambda: files[n // 3].unlink(),
        "noop": lambda: None,
    }
    for step in UPDATE_STEPS:
        if any(steps[s]["status"] != "ok" for s in steps if s in UPDATE_STEPS):
            steps[step] = {"status": "skipped (an earlier step did not finish)"}
            continue
        changes[step]()
        log(f"{n}: {STEP_LABELS[step]}")
        steps[step] = index_step({**spec, "background_tidy": True}, args.step_timeout, size_dir)
        log(describe(f"{n} {STEP_LABELS[step]}", steps[step]))
    return steps


def fake_build(spec: dict[str, Any], args: argparse.Namespace, size_dir: Path) -> dict[str, Any]:
    fake_index = size_dir / "index-fake"
    shutil.rmtree(fake_index, ignore_errors=True)
    host = FakeHost(args.repo)
    try:
        log(f"fake-LLM full build at {host.base_url}")
        r = index_step({**spec, "index_dir": str(fake_index), "base_url": host.base_url},
                       args.build_timeout, size_dir)
        st = host.stats()
        r.update(fake_requests=st["requests"], fake_max_in_flight=st["max_in_flight"],
                 fake_server_cpu_s=st["cpu_s"])
    finally:
        host.stop()
        shutil.rmtree(fake_index, ignore_errors=True)
    log(describe("fake-LLM full build", r))
    return r


def serve_step(n: int, args: argparse.Namespace, phases: set[str],
               size_dir: Path) -> dict[str, Any]:
    spec = {
        "repo": str(args.repo), "docs": str(size_dir / "docs"),
        "index_dir": str(size_dir / "index"), "serve_args": shlex.split(args.serve_args),
        "log": str(size_dir / "server.log"), "queries": args.queries,
        "global_queries": args.global_queries, "global_level": args.global_level,
        "tool_budget_s": args.tool_budget, "serve": "serve" in phases,
        "concurrency": "concurrency" in phases, "clients": args.clients,
        "conc_seconds": args.conc_seconds, "conc_rounds": args.conc_rounds,
        "call_timeout_s": args.call_timeout,
    }
    out = size_dir / "serve.json"
    argv = [sys.executable, str(SCRIPT.with_name("growth_serve.py")), json.dumps(spec), str(out)]
    log(f"{n}: serve ({', '.join(p for p in ('serve', 'concurrency') if p in phases)})")
    r = run_child(argv, args.repo, args.serve_timeout, out)
    server_log = size_dir / "server.log"
    if r["status"] != "ok" and server_log.exists():
        r["server_log_tail"] = server_log.read_text(errors="replace")[-3000:]
        print(f"[growth] server log:\n{r['server_log_tail']}", file=sys.stderr)
    log(f"{n} serve: {r.get('status')}, handshake {r.get('handshake_s', '-')} s, "
        f"first query {r.get('first_query_ms', '-')} ms")
    return r


def measure_size(n: int, base: list[dict[str, str]], args: argparse.Namespace,
                 phases: set[str], work: Path) -> dict[str, Any]:
    size_dir = args.reuse if args.reuse is not None else work / str(n)
    size_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    row: dict[str, Any] = {"articles": n, "steps": index_steps(n, base, args, phases, size_dir)}
    build = row["steps"].get("build", {"status": "ok"})  # a fake-only run builds nothing
    built = build["status"] == "ok" and (size_dir / "index" / "canopy.sqlite").exists()
    if phases & {"serve", "concurrency"}:
        row["serve"] = (serve_step(n, args, phases, size_dir) if built
                        else {"status": "skipped (no complete index)"})
    row["seconds"] = round(time.perf_counter() - t0, 1)
    if not args.keep and args.reuse is None:
        shutil.rmtree(size_dir, ignore_errors=True)
    return row


def git(repo: Path, *argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=repo, capture_output=True, text=True,
                          check=False).stdout.strip()


def machine(repo: Path) -> dict[str, Any]:
    return {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpus": os.cpu_count(), "repo": str(repo),
        "commit": git(repo, "rev-parse", "--short", "HEAD")
        + ("+dirty" if git(repo, "status", "--porcelain", "--untracked-files=no") else ""),
        "bench_commit": git(HERE_REPO, "rev-parse", "--short", "HEAD"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


# ---- entry point -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="100,609,1827,10000", help="article counts, comma-separated")
    p.add_argument("--repo", type=Path, default=HERE_REPO,
                   help="checkout whose code is measured (default: this script's)")
    p.add_argument("--only", default=",".join(p for p in PHASES if p != "fake"),
                   help=f"phases to run, from {', '.join(PHASES)}")
    p.add_argument("--skip-serve", action="store_true", help="skip serve and concurrency")
    p.add_argument("--fake", action="store_true", help="add the fake-LLM build at --fake-size")
    p.add_argument("--fake-size", type=int, default=1827)
    p.add_argument(
        "--serve-args", default="", help="extra `serve` flags: --serve-args='--workers 2'"
    )
    p.add_argument("--queries", type=int, default=30, help="DEV questions for local and basic")
    p.add_argument("--global-queries", type=int, default=10, help="DEV questions for global")
    p.add_argument("--global-level", type=int, default=None,
                   help="fixed community level for global_search (default: dynamic)")
    p.add_argument("--tool-budget", type=float, default=120.0,
                   help="seconds per tool's query series; fewer questions when exceeded")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--conc-seconds", type=float, default=30.0,
                   help="seconds of load for one client, and as long for --clients")
    p.add_argument("--conc-rounds", type=int, default=3,
                   help="alternating windows the seconds are split into (one client, then "
                        "--clients, and again), so that the machine's slower and faster spells "
                        "fall on both alike")
    p.add_argument("--call-timeout", type=float, default=300.0, help="seconds per MCP call")
    p.add_argument("--build-timeout", type=float, default=1800.0)
    p.add_argument("--step-timeout", type=float, default=900.0, help="+1/edit/delete/no-op each")
    p.add_argument("--serve-timeout", type=float, default=1800.0,
                   help="the whole serve + concurrency phase of one size")
    p.add_argument("--keep", action="store_true", help="keep corpora and indexes (path printed)")
    p.add_argument("--reuse", type=Path, default=None,
                   help="a size folder a --keep run left (DIR/docs, DIR/index): measure updates "
                        "and serving on it, one size only; the full build is not re-measured")
    p.add_argument("--out", type=Path, default=RESULTS / "growth_bench.json")
    p.add_argument("--render", nargs="+", type=Path, metavar="JSON",
                   help="print the tables of saved results (several: merged by size); run nothing")
    p.add_argument("--_child", help=argparse.SUPPRESS)
    p.add_argument("--_out", help=argparse.SUPPRESS)
    p.add_argument("--_fake", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def chosen_phases(args: argparse.Namespace) -> set[str]:
    phases = {x.strip() for x in args.only.split(",") if x.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s) in --only: {', '.join(sorted(unknown))}")
    if args.fake:
        phases.add("fake")
    if args.skip_serve:
        phases -= {"serve", "concurrency"}
    return phases


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._child:
        Path(args._out).write_text(json.dumps(index_child(json.loads(args._child))))
        return
    if args._fake:
        fake_child(args._fake)
        return
    if args.render:
        print(render(merge([json.loads(p.read_text()) for p in args.render])))
        return
    args.repo = args.repo.resolve()
    phases = chosen_phases(args)
    sizes = [int(x) for x in args.sizes.split(",") if x.strip()]
    if args.reuse is not None and len(sizes) != 1:
        raise SystemExit("--reuse measures one size: give --sizes N")
    base = json.loads(CORPUS.read_text(encoding="utf-8"))
    work = Path(tempfile.mkdtemp(prefix="canopy-growth-"))
    report: dict[str, Any] = {"machine": machine(args.repo), "rows": [], "settings": {
        **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
           if not k.startswith("_")},
        "repo": str(args.repo), "out": str(args.out), "phases": sorted(phases),
        "fake_llm": FAKE_LLM}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    try:
        for n in sizes:
            report["rows"].append(measure_size(n, base, args, phases, work))
            args.out.write_text(json.dumps(report, indent=2))  # partial results survive a stop
    finally:
        if args.keep:
            log(f"kept corpora and indexes under {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    args.out.write_text(json.dumps(report, indent=2))
    print(render(report))
    log(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
