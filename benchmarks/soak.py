"""Soak benchmark (issue 9, Safety): `canopy serve --watch` under edits and concurrent MCP clients
for minutes on end; the server's memory must level off.

    python benchmarks/soak.py                                   # 100 articles, 16 clients, 10 min
    nice -n 19 python benchmarks/soak.py --minutes 10 --out benchmarks/results/soak.json
    python benchmarks/soak.py --minutes 2 --clients 4 --serve-args='--workers 2'   # quick look

Corpus: the first --articles MultiHop-RAG articles, written as growth_bench.py writes them (one
`.md` per article, `# {title}\\n\\n{body}`), indexed with the builtin provider by
`python -m canopy.server.cli index DOCS --index-dir IDX` from --repo. Then
`python -m canopy.server.cli serve DOCS --index-dir IDX --http --port P --watch [serve args]` runs
as a subprocess of its own (loopback, no token) for --minutes while
  - --clients MCP sessions (the SDK's Streamable HTTP client, as in growth_serve.py) each loop
    over local_search, basic_search (when the server lists it), drill_down (the top-level list,
    then one community of it) and global_search, with DEV questions only
    (int(sha256(q), 16) % 5 != 0; the other fifth is never sent);
  - an editor appends a sentence to the middle paragraph of a random document every
    --edit-every s, adds the next article of growth_bench's stream every --add-every s and
    deletes a random document every --delete-every s, so the watcher applies real updates,
    deletions included. By default the corpus grows (an edited document keeps its sentence, and
    there are two additions per deletion); with --steady it holds its size (an edit takes the
    sentence out of a document that has it, and a deletion follows each addition), so memory that
    grows with the index is not mistaken for memory that leaks;
  - with --probe-edit-every S, one more document (`soak-probe.md`, an article whose title holds
    the word "Quorvexian") is edited every S s, and a prober calls basic_search for it every
    --probe-check-every s in a session of its own: an edited document is served in its old
    version until its new one commits, so every check must find it (a miss is counted with
    its time; the issue-30 run: `--probe-edit-every 3`);
  - every --sample-every s a sampler records the RSS of the server's process tree (psutil when
    installed, else /proc), calls and errors so far, and the generation and document count from
    the index_status tool, and prints a row;
  - with --diagnostics the server runs with CANOPY_DIAGNOSTICS=1 and each sample also keeps its
    GET /debug/memory report (canopy.server.diagnostics: the caches' bytes and entries, live
    stores, connections and table objects, readers' table sets, smaps_rollup, glibc's heap,
    pyarrow's pool), with live objects by type every --objects-every samples; --tracemalloc N
    runs the server with PYTHONTRACEMALLOC=N, and those reports add the lines whose Python
    allocations grew most since the first.
A failed call (exception or isError result) is counted by kind and the first message of each kind
is printed when it happens; "No community ... in this index" from drill_down, when an update
replaced the community a client had just listed, is counted apart as a stale id. Server log lines
with ERROR, CRITICAL, Traceback or "failed" are printed as they appear; "applied ... -> generation"
lines count the updates the watcher applied.

At the end: the RSS at the end of each minute, the least-squares slope of RSS (MB/min) over the
first and the second half of the run and over its last five minutes, calls, errors, p50/p95
latency (overall and by tool), updates applied, probe checks and misses; JSON to --out (rewritten
after every sample, so a stopped run keeps what it measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from growth_bench import (  # beside this script
    CORPUS,
    EDIT_SENTENCE,
    HERE_REPO,
    RESULTS,
    child_env,
    edit_one_paragraph,
    machine,
    materialize,
    write_article,
)
from growth_serve import (
    descendants,
    dev_questions,
    free_port,
    percentile,
    session,
    status_kb,
    wait_for_port,
)

try:
    import psutil
except ImportError:  # /proc is read instead
    psutil = None

TOOLS = ("local_search", "basic_search", "drill_down", "global_search")
STALE = re.compile(r"No community .* in this index")
LOG_APPLIED = re.compile(r"applied (\d+) changed path\(s\) -> generation (\d+)")
LOG_BAD = re.compile(r"ERROR|CRITICAL|Traceback|failed|Exception", re.IGNORECASE)


def log(msg: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- memory of the server's process tree -------------------------------------------------------


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def forked_copy(pid: int) -> bool:
    """Whether `pid` is a fork that has not exec'd yet (its command line is its parent's, as
    while subprocess starts a helper): its resident pages are the parent's, shared copy-on-write,
    so counting them again would double the tree's RSS for one sample."""
    parent = _parent(pid)
    mine = _cmdline(pid)
    return parent is not None and mine is not None and mine == _cmdline(parent)


def tree_rss(pid: int) -> tuple[float, dict[int, float]]:
    """(total MB, MB by pid) over the server and every process below it, but forks that have not
    exec'd yet (`forked_copy`)."""
    by_pid: dict[int, float] = {}
    if psutil is not None:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return 0.0, {}
        for p in procs:
            if p.pid != pid and forked_copy(p.pid):
                continue
            try:
                by_pid[p.pid] = p.memory_info().rss / 2**20
            except psutil.NoSuchProcess:
                pass
    else:
        for p in descendants(pid):
            if p != pid and forked_copy(p):
                continue
            kb = status_kb(p, "VmRSS")
            if kb:
                by_pid[p] = kb / 1024
    return round(sum(by_pid.values()), 1), {p: round(mb, 1) for p, mb in by_pid.items()}


def proc_details(pids: list[int]) -> dict[str, Any]:
    """Over `pids` (Linux /proc; zeros elsewhere): threads, open file descriptors, anonymous and
    file-backed RSS (MB), and threads by name with digits dropped ("canopy-call_3" ->
    "canopy-call_"), to tell a growing pool from a leak."""
    out: dict[str, Any] = {"threads": 0, "fds": 0, "rss_anon_mb": 0.0, "rss_file_mb": 0.0}
    names: dict[str, int] = {}
    for p in pids:
        out["threads"] += status_kb(p, "Threads")  # the field's number, whatever its unit
        out["rss_anon_mb"] += status_kb(p, "RssAnon") / 1024
        out["rss_file_mb"] += status_kb(p, "RssFile") / 1024
        try:
            out["fds"] += len(os.listdir(f"/proc/{p}/fd"))
            for task in os.listdir(f"/proc/{p}/task"):
                name = re.sub(r"\d+", "", Path(f"/proc/{p}/task/{task}/comm").read_text().strip())
                names[name] = names.get(name, 0) + 1
        except OSError:
            pass
    out["rss_anon_mb"] = round(out["rss_anon_mb"], 1)
    out["rss_file_mb"] = round(out["rss_file_mb"], 1)
    out["threads_by_name"] = dict(sorted(names.items(), key=lambda kv: -kv[1]))
    return out


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minutes, MB) points, in MB/min."""
    if len(points) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    return round(sum((x - mx) * (y - my) for x, y in points) / sxx, 2)


def slope_se(points: list[tuple[float, float]]) -> float | None:
    """Standard error of `slope(points)` (MB/min): RSS swings by tens of MB between samples
    with the calls in flight, so one run's slope is good to about this much."""
    n = len(points)
    if n < 3:
        return None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if not sxx:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - b * (x - mx)) ** 2 for x, y in points)
    return round(math.sqrt(residual / (n - 2) / sxx), 2)


def diagnostics_slopes(samples: list[dict[str, Any]], since_min: float) -> dict[str, float | None]:
    """With --diagnostics: slopes (MB/min) from `since_min` on of what the server reports - each
    cache's bytes, glibc's heap in use, anonymous RSS by mapping kind, each malloc arena's system,
    free and small-free bytes (malloc_info), pymalloc's arenas and blocks - to tell what of RSS's
    slope grows."""
    series: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        d = s.get("diagnostics") or {}
        if s["t_s"] / 60 < since_min or "caches" not in d:
            continue
        t = s["t_s"] / 60
        for name, c in d["caches"].items():
            series.setdefault(f"{name}_mb", []).append((t, c["bytes"] / 2**20))
        if d.get("malloc"):
            series.setdefault("glibc_in_use_mb", []).append((t, d["malloc"]["in_use_mb"]))
        if d.get("smaps_mb"):
            series.setdefault("anonymous_mb", []).append((t, d["smaps_mb"].get("Anonymous", 0)))
        if d.get("anon_mb"):  # the main arena's resident ([heap]) and the rest by mapping size
            for kind, mb in d["anon_mb"].items():
                series.setdefault(f"resident_{kind}_mb", []).append((t, mb))
        arenas = d.get("malloc_arenas") or {}
        for a in arenas.get("arenas", []):  # malloc_info: each arena's system and free bytes
            for key in ("system_mb", "free_mb", "small_free_mb"):
                series.setdefault(f"arena{a['nr']}_{key}", []).append((t, a[key]))
        if arenas.get("heaps_rss_mb") is not None:  # the non-main arenas' resident heaps
            series.setdefault("arena_heaps_rss_mb", []).append((t, arenas["heaps_rss_mb"]))
        for key in ("arenas_mb", "allocated_mb", "available_mb", "unused_pools_mb"):
            if key in (d.get("pymalloc") or {}):  # Python's small-object allocator
                series.setdefault(f"pymalloc_{key}", []).append((t, d["pymalloc"][key]))
        if "traced_mb" in d:  # --tracemalloc: Python's own allocations
            series.setdefault("traced_mb", []).append((t, d["traced_mb"]))
    return {name: slope(points) for name, points in sorted(series.items())}


# ---- what the run counts ------------------------------------------------------------------------


def exc_text(exc: BaseException) -> str:
    """`Type: message` of an exception, of the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500]


class Tally:
    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.calls = 0
        self.latencies: dict[str, list[float]] = {}
        self.errors = 0
        self.kinds: dict[str, dict[str, Any]] = {}
        self.stale = 0
        self.stale_first: str | None = None
        self.in_flight = 0
        self.max_ms = 0.0
        self.max_call: str | None = None

    def ok(self, tool: str, ms: float) -> None:
        self.calls += 1
        self.latencies.setdefault(tool, []).append(ms)
        if ms > self.max_ms:
            self.max_ms, self.max_call = ms, f"{tool} at {time.monotonic() - self.t0:.0f} s"

    def error(self, kind: str, message: str) -> None:
        self.errors += 1
        entry = self.kinds.setdefault(kind, {"count": 0, "first_message": message,
                                             "first_at_s": round(time.monotonic() - self.t0, 1)})
        entry["count"] += 1
        if entry["count"] == 1:
            log(f"ERROR {kind}: {message}")

    def stale_id(self, message: str) -> None:
        self.stale += 1
        if self.stale_first is None:
            self.stale_first = message
            log(f"stale drill_down id (counted apart from errors): {message}")

    @staticmethod
    def mark(exc: BaseException) -> None:
        try:
            exc.soak_counted = True  # type: ignore[attr-defined]
        except AttributeError:
            pass

    @staticmethod
    def counted(exc: BaseException) -> bool:
        """Whether `exc` (or, for a group, each exception in it) was counted by call()."""
        if isinstance(exc, BaseExceptionGroup):
            return all(Tally.counted(e) for e in exc.exceptions)
        return bool(getattr(exc, "soak_counted", False))

    def all_latencies(self) -> list[float]:
        return [ms for v in self.latencies.values() for ms in v]


def result_text(result: Any) -> str:
    return " ".join(getattr(c, "text", "") for c in (result.content or []))[:500]


# ---- clients, editor, server log ----------------------------------------------------------------


async def call(client: Any, tool: str, args: dict[str, Any], tally: Tally) -> Any:
    """One tool call, counted; returns the structured content, or None after an isError result.
    An exception is counted and raised again (the caller opens a new session)."""
    tally.in_flight += 1
    t0 = time.perf_counter()
    try:
        result = await client.call_tool(tool, args)
    except Exception as exc:
        tally.error(f"{tool}: {type(exc).__name__}", exc_text(exc))
        tally.mark(exc)
        raise
    finally:
        tally.in_flight -= 1
    ms = (time.perf_counter() - t0) * 1000
    if result.is_error:
        text = result_text(result)
        if tool == "drill_down" and STALE.search(text):
            tally.stale_id(text)
        else:
            tally.error(f"{tool}: isError", text)
        return None
    tally.ok(tool, ms)
    return result.structured_content or {}


async def client_loop(i: int, url: str, tools: list[str], questions: list[str],
                      timeout: float, stop: asyncio.Event, tally: Tally, seed: int) -> None:
    """One session calling the tools in turn until `stop`; a new session after an exception."""
    rng = random.Random(seed * 1000 + i)
    j = i  # clients start at different tools
    communities: list[str] = []
    while not stop.is_set():
        try:
            async with session(url, timeout) as client:
                while not stop.is_set():
                    tool = tools[j % len(tools)]
                    j += 1
                    if tool == "drill_down":
                        if communities:  # one community of the list fetched last time
                            await call(client, tool, {"community_id": rng.choice(communities)},
                                       tally)
                            communities = []
                        else:
                            out = await call(client, tool, {"limit": 20}, tally)
                            communities = [c["id"] for c in (out or {}).get("children", [])]
                    else:
                        await call(client, tool, {"query": rng.choice(questions)}, tally)
        except Exception as exc:  # noqa: BLE001 - counted (by call() or here), then a new session
            if not tally.counted(exc):
                tally.error("session", exc_text(exc))
            await asyncio.sleep(1.0)


class Editor:
    """Edits, adds and deletes documents on a schedule (times from the start of the load)."""

    def __init__(self, docs: Path, base: list[dict[str, str]], first_new: int,
                 args: argparse.Namespace) -> None:
        self.docs, self.base, self.next_article = docs, base, first_new
        self.args = args
        self.rng = random.Random(args.seed)
        self.done = {"edits": 0, "adds": 0, "deletes": 0, "probe_edits": 0}
        self.failures: list[str] = []

    def files(self) -> list[Path]:
        return sorted(self.docs.glob("*.md"))

    def step(self, what: str) -> None:
        try:
            edit = toggle_sentence if self.args.steady else edit_one_paragraph
            if what == "probe_edits":
                edit(self.docs / PROBE)
            elif what == "edits":
                edit(self.rng.choice([f for f in self.files() if f.name != PROBE]))
            elif what == "adds":
                write_article(self.docs, self.base, self.next_article)
                self.next_article += 1
            else:
                self.rng.choice([f for f in self.files() if f.name != PROBE]).unlink()
            self.done[what] += 1
        except Exception as exc:  # noqa: BLE001 - the editor's own fault: shown, the run goes on
            self.failures.append(f"{what}: {exc_text(exc)}")
            log(f"editor failed ({what}): {exc_text(exc)}")

    async def run(self, stop: asyncio.Event) -> None:
        t0 = time.monotonic()
        every = {"edits": self.args.edit_every, "adds": self.args.add_every,
                 "deletes": self.args.delete_every}
        if self.args.probe_edit_every:
            every["probe_edits"] = self.args.probe_edit_every
        due = dict(every)
        if self.args.steady:  # a deletion half a period after each addition: the count holds
            every["deletes"] = every["adds"]
            due["deletes"] = every["adds"] * 1.5
        while not stop.is_set():
            now = time.monotonic() - t0
            for what, t in due.items():
                if now >= t:
                    self.step(what)
                    due[what] += every[what]
            wait = max(0.0, min(due.values()) - (time.monotonic() - t0))
            try:
                await asyncio.wait_for(stop.wait(), timeout=wait)
            except TimeoutError:
                pass


def toggle_sentence(path: Path) -> None:
    """--steady's edit: growth_bench's sentence appended to the middle paragraph when it is not
    there, taken out when it is, so an edited document changes every time and never grows."""
    text = path.read_text(encoding="utf-8")
    if EDIT_SENTENCE in text:
        path.write_text(text.replace(EDIT_SENTENCE, "", 1), encoding="utf-8")
    else:
        edit_one_paragraph(path)


PROBE = "soak-probe.md"
PROBE_WORD = "Quorvexian"


def write_probe(docs: Path, base: list[dict[str, str]], i: int) -> Path:
    """The probe document: article `i`'s text under a title holding PROBE_WORD."""
    title, body = base[i]["title"], base[i]["body"]
    path = docs / PROBE
    path.write_text(f"# {PROBE_WORD} probe: {title}\n\n{body}\n", encoding="utf-8")
    return path


class Prober:
    """Checks, in a session of its own, that the probe document is always served."""

    def __init__(self, every: float) -> None:
        self.every = every
        self.checks = 0
        self.misses: list[float] = []
        self.errors: list[str] = []

    async def run(self, url: str, timeout: float, stop: asyncio.Event, t0: float) -> None:
        while not stop.is_set():
            try:
                async with session(url, timeout) as client:
                    while not stop.is_set():
                        result = await client.call_tool(
                            "basic_search", {"query": f"{PROBE_WORD} probe", "k": 5})
                        t = round(time.monotonic() - t0, 1)
                        self.checks += 1
                        found = [c for c in (result.structured_content or {}).get("citations", [])
                                 if c.get("document") == PROBE]
                        if result.is_error or not found:
                            self.misses.append(t)
                            log(f"probe document missing at {t} s: {result_text(result)[:200]}")
                        try:
                            await asyncio.wait_for(stop.wait(), timeout=self.every)
                        except TimeoutError:
                            pass
            except Exception as exc:  # noqa: BLE001 - counted, then a new session
                self.errors.append(exc_text(exc))
                log(f"prober: {exc_text(exc)}")
                await asyncio.sleep(1.0)


class ServerLog:
    """Reads the server's log as it grows: updates applied, and lines that report trouble."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.applied: list[dict[str, int]] = []
        self.bad: list[str] = []
        self.partial = ""

    def poll(self, t: float) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            return
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self.partial = lines.pop()
        for line in lines:
            m = LOG_APPLIED.search(line)
            if m:
                self.applied.append({"paths": int(m.group(1)), "generation": int(m.group(2)),
                                     "at_s": round(t)})
            elif LOG_BAD.search(line):
                self.bad.append(line[:400])
                if len(self.bad) <= 20:
                    log(f"server log: {line[:400]}")
                elif len(self.bad) == 21:
                    log("server log: more trouble lines; see the log file and the JSON")


# ---- the run ------------------------------------------------------------------------------------


async def status(client: Any, timeout: float) -> dict[str, Any]:
    try:
        result = await asyncio.wait_for(client.call_tool("index_status", {}), timeout)
    except Exception as exc:  # noqa: BLE001 - the sampler counts it as an error
        return {"error": exc_text(exc)}
    if result.is_error:
        return {"error": result_text(result)}
    s = result.structured_content or {}
    return {"generation": s.get("generation"), "documents": s.get("documents")}


def diagnostics(port: int, objects: bool, timeout: float) -> dict[str, Any]:
    """The server's GET /debug/memory report (canopy.server.diagnostics), or {"error": ...}."""
    url = f"http://127.0.0.1:{port}/debug/memory" + ("?objects=1" if objects else "")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            report: dict[str, Any] = json.loads(answer.read())
            return report
    except Exception as exc:  # noqa: BLE001 - kept in the sample, the run goes on
        return {"error": exc_text(exc)}


def print_header() -> None:
    print("| min | t s | RSS MB | anon / file MB | calls | errors | calls/s (last interval) | "
          "in flight | generation | documents | updates applied | threads | fds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)


def print_row(s: dict[str, Any]) -> None:
    print(f"| {s['t_s'] / 60:.1f} | {s['t_s']:.0f} | {s['rss_mb']:.1f} | "
          f"{s['rss_anon_mb']:.0f} / {s['rss_file_mb']:.0f} | {s['calls']} | "
          f"{s['errors']} | {s['calls_per_s']} | {s['in_flight']} | {s.get('generation', '-')} | "
          f"{s.get('documents', '-')} | {s['updates_applied']} | {s['threads']} | {s['fds']} |",
          flush=True)


async def soak(args: argparse.Namespace, proc: subprocess.Popen[bytes], url: str, port: int,
               docs: Path, base: list[dict[str, str]], server_log: ServerLog,
               report: dict[str, Any], save: Any) -> None:
    timeout = args.call_timeout
    questions = dev_questions()
    await wait_for_port(port, proc, 300)
    async with session(url, timeout) as control:
        listed = [t.name for t in (await control.list_tools()).tools]
        tools = [t for t in TOOLS if t in listed]
        report["tools_listed"], report["tools_used"] = listed, tools
        log(f"server tools: {', '.join(listed)}; clients call {', '.join(tools)}")
        t0 = time.monotonic()
        tally = Tally(t0)
        stop = asyncio.Event()
        editor = Editor(docs, base, args.articles, args)
        samples: list[dict[str, Any]] = report["samples"]

        async def sample(phase: str) -> None:
            t = time.monotonic() - t0
            server_log.poll(t)
            rss, by_pid = tree_rss(proc.pid)
            details = proc_details(list(by_pid))
            prev = samples[-1] if samples else None
            dt = t - prev["t_s"] if prev else 0
            row = {"t_s": round(t, 1), "phase": phase, "rss_mb": rss,
                   "rss_by_pid_mb": {str(p): mb for p, mb in by_pid.items()},
                   "main_hwm_mb": round(status_kb(proc.pid, "VmHWM") / 1024, 1),
                   **details,
                   "calls": tally.calls, "errors": tally.errors, "stale_ids": tally.stale,
                   "calls_per_s": round((tally.calls - prev["calls"]) / dt, 1) if dt else None,
                   "in_flight": tally.in_flight, "updates_applied": len(server_log.applied),
                   **editor.done, **await status(control, timeout)}
            if "error" in row:
                tally.error("index_status (sampler)", row["error"])
            if args.diagnostics:
                objects = bool(args.objects_every) and len(samples) % args.objects_every == 0
                row["diagnostics"] = await asyncio.to_thread(diagnostics, port, objects, 30.0)
            samples.append(row)
            print_row(row)
            save()

        print_header()
        await sample("start")
        workers = [asyncio.create_task(client_loop(i, url, tools, questions, timeout, stop,
                                                   tally, args.seed)) for i in range(args.clients)]
        edits = asyncio.create_task(editor.run(stop))
        prober = Prober(args.probe_check_every)
        probing = (asyncio.create_task(prober.run(url, timeout, stop, t0))
                   if args.probe_edit_every else None)
        end = t0 + args.minutes * 60
        next_t = t0 + args.sample_every
        while next_t <= end + 1e-6:
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
            if proc.poll() is not None:
                tally.error("server", f"server process exited with {proc.returncode}")
                break
            await sample("load")
            next_t += args.sample_every
        stop.set()
        await edits
        if probing is not None:
            await probing
        _, pending = await asyncio.wait(workers, timeout=timeout + 10)
        for task in pending:  # a client still waiting after the call timeout: a stall
            task.cancel()
        if pending:
            tally.error("stall", f"{len(pending)} client(s) still in a call {timeout + 10:.0f} s "
                                 "after the end")
        await asyncio.gather(*pending, return_exceptions=True)
        await asyncio.sleep(args.settle)  # let the watcher apply the last changes
        await sample("after load")
    report["tally"] = tally
    report["editor"] = editor
    report["prober"] = prober


def summarize(report: dict[str, Any], args: argparse.Namespace,
              server_log: ServerLog) -> dict[str, Any]:
    samples = [s for s in report["samples"] if s["phase"] in ("start", "load")]
    tally: Tally = report.pop("tally")
    editor: Editor = report.pop("editor")
    prober: Prober = report.pop("prober")
    per_minute = []
    for m in range(1, int(args.minutes) + 1):
        at = [s for s in samples if s["t_s"] <= m * 60 + 1]
        if at:
            per_minute.append({"minute": m, "rss_mb": at[-1]["rss_mb"], "calls": at[-1]["calls"],
                               "errors": at[-1]["errors"]})
    half = args.minutes * 30
    points = [(s["t_s"] / 60, s["rss_mb"]) for s in samples]
    first = [p for p in points if p[0] * 60 <= half + 1]
    second = [p for p in points if p[0] * 60 >= half - 1]
    lat = tally.all_latencies()
    rss = [s["rss_mb"] for s in samples]
    last_gen = next((s.get("generation") for s in reversed(report["samples"])
                     if s.get("generation") is not None), None)
    summary = {
        "rss_start_mb": rss[0] if rss else None, "rss_end_mb": rss[-1] if rss else None,
        "rss_max_mb": max(rss) if rss else None,
        "rss_after_load_mb": report["samples"][-1]["rss_mb"] if report["samples"] else None,
        "rss_per_minute": per_minute,
        "slope_first_half_mb_per_min": slope(first),
        "slope_second_half_mb_per_min": slope(second),
        "slope_after_minute_1_mb_per_min": slope([p for p in points if p[0] >= 1 - 1 / 60]),
        "slope_last_5_min_mb_per_min": slope([p for p in points
                                              if p[0] >= args.minutes - 5 - 1 / 60]),
        "slope_last_5_min_se_mb_per_min": slope_se([p for p in points
                                                    if p[0] >= args.minutes - 5 - 1 / 60]),
        "diagnostics_slopes_last_5_min_mb_per_min": diagnostics_slopes(
            samples, args.minutes - 5 - 1 / 60) if args.diagnostics else None,
        "rss_growth_last_5_min_mb": (round(rss[-1] - next(
            s["rss_mb"] for s in samples if s["t_s"] >= (args.minutes - 5) * 60 - 1), 1)
            if rss and args.minutes >= 5 else None),
        "probe_checks": prober.checks, "probe_misses": len(prober.misses),
        "probe_miss_times_s": prober.misses[:50], "probe_errors": prober.errors[:20],
        "threads_start_end": [samples[0]["threads"], samples[-1]["threads"]] if samples else None,
        "fds_start_end": [samples[0]["fds"], samples[-1]["fds"]] if samples else None,
        "threads_by_name_end": samples[-1]["threads_by_name"] if samples else None,
        "calls": tally.calls, "errors": tally.errors,
        "error_kinds": tally.kinds, "stale_drill_ids": tally.stale,
        "stale_first_message": tally.stale_first,
        "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
        "max_ms": round(tally.max_ms, 1), "slowest_call": tally.max_call,
        "by_tool": {t: {"calls": len(v), "p50_ms": percentile(v, 50),
                        "p95_ms": percentile(v, 95), "max_ms": round(max(v), 1)}
                    for t, v in tally.latencies.items()},
        "edits": editor.done, "editor_failures": editor.failures,
        "updates_applied": len(server_log.applied),
        "paths_applied": sum(a["paths"] for a in server_log.applied),
        "generation_start": report["samples"][0].get("generation") if report["samples"] else None,
        "generation_end": last_gen,
        "server_log_trouble": server_log.bad[:200],
        "server_log_trouble_lines": len(server_log.bad),
        "stall_intervals": [s["t_s"] for s in samples[1:] if s["calls_per_s"] == 0],
    }
    return summary


def print_summary(s: dict[str, Any], args: argparse.Namespace) -> None:
    print("\nRSS (MB) of the server's process tree at the end of each minute:\n")
    print("| minute | " + " | ".join(str(m["minute"]) for m in s["rss_per_minute"]) + " |")
    print("|---|" + "---|" * len(s["rss_per_minute"]))
    print("| RSS MB | " + " | ".join(f"{m['rss_mb']:.0f}" for m in s["rss_per_minute"]) + " |")
    f, g = s["slope_first_half_mb_per_min"], s["slope_second_half_mb_per_min"]
    print(f"\nstart {s['rss_start_mb']} MB, max {s['rss_max_mb']} MB, end of load "
          f"{s['rss_end_mb']} MB, after the clients stopped {s['rss_after_load_mb']} MB")
    print(f"slope of RSS: first half {f} MB/min, second half {g} MB/min (minute 1 to the end: "
          f"{s['slope_after_minute_1_mb_per_min']} MB/min); threads {s['threads_start_end']}, "
          f"open fds {s['fds_start_end']} (start, end of load)")
    print(f"last five minutes: slope {s['slope_last_5_min_mb_per_min']} ± "
          f"{s['slope_last_5_min_se_mb_per_min']} MB/min, "
          f"{s['rss_growth_last_5_min_mb']} MB from their first sample to the last")
    if s["diagnostics_slopes_last_5_min_mb_per_min"]:
        print(f"of which (slopes, MB/min, last five minutes): "
              f"{s['diagnostics_slopes_last_5_min_mb_per_min']}")
    if args.probe_edit_every:
        print(f"probe document: {s['probe_checks']} checks, {s['probe_misses']} missing "
              f"({s['probe_miss_times_s']}), {len(s['probe_errors'])} prober errors, "
              f"{s['edits']['probe_edits']} probe edits")
    print(f"threads by name at the end of the load: {s['threads_by_name_end']}")
    print(f"calls {s['calls']} ok, {s['errors']} errors, {s['stale_drill_ids']} stale drill_down "
          f"ids; p50 {s['p50_ms']} ms, p95 {s['p95_ms']} ms, slowest {s['max_ms']} ms "
          f"({s['slowest_call']})")
    for tool, v in s["by_tool"].items():
        print(f"  {tool}: {v['calls']} calls, p50 {v['p50_ms']} ms, p95 {v['p95_ms']} ms, "
              f"max {v['max_ms']} ms")
    for kind, e in s["error_kinds"].items():
        print(f"  error {kind}: {e['count']}x, first at {e['first_at_s']} s: {e['first_message']}")
    d = s["edits"]
    print(f"editor: {d['edits']} edits, {d['adds']} adds, {d['deletes']} deletes; watcher: "
          f"{s['updates_applied']} updates applied ({s['paths_applied']} paths), generation "
          f"{s['generation_start']} -> {s['generation_end']}")
    if s["server_log_trouble_lines"]:
        print(f"server log: {s['server_log_trouble_lines']} line(s) reporting trouble (JSON: "
              "server_log_trouble)")
    if s["stall_intervals"]:
        print(f"intervals with no completed call (stalls) ending at: {s['stall_intervals']} s")


# ---- entry point --------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--articles", type=int, default=100, help="first N MultiHop-RAG articles")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--edit-every", type=float, default=20.0, help="seconds between edits")
    p.add_argument("--add-every", type=float, default=60.0, help="seconds between new articles")
    p.add_argument("--delete-every", type=float, default=120.0, help="seconds between deletions")
    p.add_argument("--steady", action="store_true",
                   help="a corpus that holds its size: each edit appends the sentence or takes it "
                        "out again, and a deletion follows each addition (--delete-every is "
                        "then --add-every)")
    p.add_argument("--probe-edit-every", type=float, default=0.0,
                   help="seconds between edits of the probe document (0: no probe)")
    p.add_argument("--probe-check-every", type=float, default=1.0,
                   help="seconds between checks that the probe document is served")
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--serve-args", default="",
                   help="extra `serve` flags: --serve-args='--workers 2'")
    p.add_argument("--call-timeout", type=float, default=120.0, help="seconds per MCP call")
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds after the clients stop before the last sample")
    p.add_argument("--diagnostics", action="store_true",
                   help="serve with CANOPY_DIAGNOSTICS=1 and keep its /debug/memory report in "
                        "each sample")
    p.add_argument("--objects-every", type=int, default=0,
                   help="with --diagnostics: live objects by type every N samples (0: never; "
                        "the heap walk can disturb the calls running meanwhile)")
    p.add_argument("--tracemalloc", type=int, default=0,
                   help="serve with PYTHONTRACEMALLOC=N (frames; 0: off)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repo", type=Path, default=HERE_REPO,
                   help="checkout whose server is run (default: this script's)")
    p.add_argument("--keep", action="store_true", help="keep the corpus, index and server log")
    p.add_argument("--out", type=Path, default=RESULTS / "soak.json")
    return p.parse_args(argv)


def stop_server(proc: subprocess.Popen[bytes]) -> tuple[int | None, list[int]]:
    """Stop the server as Ctrl-C would (click then prints "Aborted!" and exits 1); its exit code
    and the processes of its tree still alive 5 s after it exited."""
    tree = descendants(proc.pid) if proc.poll() is None else [proc.pid]
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)  # as Ctrl-C: uvicorn and the watcher shut down
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            log("server did not stop within 30 s of SIGINT: killing its process group")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    time.sleep(5)
    alive = [p for p in tree if p != proc.pid and Path(f"/proc/{p}").exists()]
    if alive:
        log(f"processes of the server still alive after it exited: {alive}")
    return proc.returncode, alive


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.repo = args.repo.resolve()
    base = json.loads(CORPUS.read_text(encoding="utf-8"))
    work = Path(tempfile.mkdtemp(prefix="canopy-soak-"))
    docs, index_dir, log_path = work / "docs", work / "index", work / "server.log"
    report: dict[str, Any] = {
        "machine": {**machine(args.repo), "psutil": psutil is not None,
                    "nice": os.getpriority(os.PRIO_PROCESS, 0),
                    # allocator settings the server inherits (glibc's and CPython's)
                    "allocator_env": {k: v for k, v in os.environ.items()
                                      if k.startswith(("MALLOC_", "GLIBC_TUNABLES", "PYTHONMALLOC",
                                                       "ARROW_DEFAULT_MEMORY_POOL"))}},
        "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}},
        "samples": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        args.out.write_text(json.dumps({k: v for k, v in report.items()
                                        if k not in ("tally", "editor", "prober")}, indent=2))

    materialize(docs, base, args.articles)
    if args.probe_edit_every:  # an article the stream of additions never reaches
        write_probe(docs, base, len(base) - 1)
    env = child_env(args.repo)
    log(f"indexing {args.articles} articles (builtin provider) in {work}")
    t = time.perf_counter()
    built = subprocess.run([sys.executable, "-m", "canopy.server.cli", "index", str(docs),
                            "--index-dir", str(index_dir)], cwd=args.repo, env=env,
                           capture_output=True, text=True, check=False)
    report["index_s"] = round(time.perf_counter() - t, 1)
    if built.returncode != 0:
        raise SystemExit(f"canopy index failed ({built.returncode}):\n{built.stderr[-3000:]}")
    log(f"indexed in {report['index_s']} s")
    if args.diagnostics:
        env["CANOPY_DIAGNOSTICS"] = "1"
    if args.tracemalloc:
        env["PYTHONTRACEMALLOC"] = str(args.tracemalloc)
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    argv_ = [sys.executable, "-m", "canopy.server.cli", "serve", str(docs), "--index-dir",
             str(index_dir), "--http", "--port", str(port), "--watch",
             *shlex.split(args.serve_args)]
    report["server_argv"] = argv_[1:]
    server_log = ServerLog(log_path)
    with open(log_path, "wb") as out:
        proc = subprocess.Popen(argv_, cwd=args.repo, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    log(f"server pid {proc.pid} at {url}: {args.clients} clients for {args.minutes} min")
    try:
        asyncio.run(soak(args, proc, url, port, docs, base, server_log, report, save))
    finally:
        report["server_exit_code"], report["server_orphans"] = stop_server(proc)
        server_log.poll(0)
        if "tally" in report:
            report["summary"] = summarize(report, args, server_log)
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
        report["server_log_tail"] = log_path.read_text(errors="replace")[-4000:]
        save()
        if args.keep:
            log(f"kept corpus, index and server log under {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if "summary" in report:
        print_summary(report["summary"], args)
    log(f"server exit code {report['server_exit_code']}; JSON: {args.out}")


if __name__ == "__main__":
    main()
