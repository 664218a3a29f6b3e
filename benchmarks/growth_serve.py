"""Serving half of growth_bench.py: one `canopy serve --http` process, driven over MCP.

    python benchmarks/growth_serve.py SPEC_JSON OUT_JSON     # run by growth_bench.py, not by hand

Starts `python -m canopy.server.cli serve DOCS --index-dir IDX --http --port P [serve_args]` from
the checkout spec["repo"] (loopback: no token), then measures with the MCP SDK's Streamable HTTP
client: time from process start to the completed handshake, the first local_search after it,
the server's RSS, p50/p95 of local, basic and global search over DEV questions, and throughput of
`clients` concurrent sessions mixing local_search, basic_search and drill_down against one session
(in alternating windows: `compare`).

It runs in its own process so that the MCP SDK never enters the driver (whose RSS would otherwise
raise every later child's ru_maxrss), and writes OUT_JSON after every phase, so a run stopped by
the driver's timeout still reports what it measured. RSS is the server's process tree (VmRSS of
the server and its descendants, so `--workers N` servers count whole; pages two processes share
count twice) and, beside it, the tree's PSS (each shared page counted once); VmHWM is the main
process's.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's canopy (split_of)

QUESTIONS = Path(__file__).resolve().parents[2] / "shared" / "eval-data" / "multihop-rag" \
    / "MultiHopRAG.json"
MIX = ("local_search", "basic_search", "drill_down")


def dev_questions() -> list[str]:
    """DEV questions with evidence, in file order (canopy.server.wings.eval.retrieval.split_of,
    the one definition of the split; the held-out fifth is never read)."""
    from canopy.server.wings.eval.retrieval import split_of

    data = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    return [q["query"] for q in data if q["evidence_list"] and split_of(q["query"]) == "dev"]


def percentile(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))
    return round(ordered[int(rank) - 1], 1)


# ---- the server process ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def status_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def descendants(pid: int) -> list[int]:
    """pid and every process below it (read from /proc/*/stat)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = [pid], [pid]
    while frontier:
        frontier = [c for c, p in parent.items() if p in frontier]
        tree += frontier
    return tree


def cpu_seconds(pid: int) -> float:
    """User and system CPU the process has used."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_rss_mb(pid: int) -> float:
    return round(sum(status_kb(p, "VmRSS") for p in descendants(pid)) / 1024, 1)


def pss_kb(pid: int) -> int:
    """The process's proportional set size: its private pages plus its share of pages it
    shares (libraries, the page cache's mapped files), so a tree's sum counts each page once."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_mb(pid: int) -> float:
    return round(sum(pss_kb(p) for p in descendants(pid)) / 1024, 1)


async def wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"nothing listening on port {port}")


@asynccontextmanager
async def session(url: str, timeout: float) -> AsyncIterator[Client]:
    """An initialized MCP session over Streamable HTTP (the handshake is done on entry)."""
    async with (httpx2.AsyncClient(timeout=timeout) as http,
                Client(streamable_http_client(url, http_client=http),
                       read_timeout_seconds=timeout) as client):
        yield client


# ---- measurements ------------------------------------------------------------------------------


async def timed_call(client: Client, tool: str, args: dict[str, Any]) -> tuple[float, bool, Any]:
    """(milliseconds, is_error, structured content) of one tool call."""
    t0 = time.perf_counter()
    result = await client.call_tool(tool, args)
    return (time.perf_counter() - t0) * 1000, bool(result.is_error), result.structured_content


def tool_args(tool: str, question: str, level: int | None) -> dict[str, Any]:
    if tool == "global_search" and level is not None:
        return {"query": question, "community_level": level}
    return {"query": question}


async def tool_series(client: Client, tool: str, questions: list[str], first: str,
                      level: int | None, budget_s: float) -> dict[str, Any]:
    """The first call, then p50/p95 over `questions` (fewer once `budget_s` has passed)."""
    if tool == "local_search":
        first_ms = None  # the first local_search is the run's first query, measured by the caller
    else:
        first_ms, _, _ = await timed_call(client, tool, tool_args(tool, first, level))
    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + budget_s
    for q in questions:
        if time.monotonic() > deadline:
            break
        ms, err, _ = await timed_call(client, tool, tool_args(tool, q, level))
        latencies.append(ms)
        errors += err
    print(f"[serve] {tool}: {len(latencies)} calls, p50 {percentile(latencies, 50)} ms",
          file=sys.stderr, flush=True)
    return {"first_ms": None if first_ms is None else round(first_ms, 1), "n": len(latencies),
            "p50_ms": percentile(latencies, 50), "p95_ms": percentile(latencies, 95),
            "max_ms": round(max(latencies), 1) if latencies else None, "errors": errors}


def mixed_call(i: int, j: int, questions: list[str],
               communities: list[str]) -> tuple[str, dict[str, Any]]:
    """Call j of client i: tools in turn, questions and communities spread over clients."""
    tool = MIX[(i + j) % len(MIX)]
    if tool == "drill_down":
        return tool, ({"community_id": communities[(i * 5 + j) % len(communities)]}
                      if communities else {})
    return tool, {"query": questions[(i * 37 + j) % len(questions)]}


class _Phase:
    """One client count's sessions and what its windows measured, summed over rounds."""

    def __init__(self, sessions: list[Client], server: int | None = None) -> None:
        self.sessions = sessions
        self.server = server  # the server's pid: its processes' CPU is sampled per window
        self.cores: list[list[float]] = []  # per window, cores each server process used
        self.next_call = [0] * len(sessions)  # a client's calls go on where its last window ended
        self.latencies: list[float] = []
        self.by_tool: dict[str, list[float]] = {t: [] for t in MIX}
        self.errors: list[str] = []
        self.elapsed = 0.0
        self.windows: list[float] = []  # calls/s of each window

    async def window(self, seconds: float, questions: list[str], communities: list[str]) -> None:
        """Every client calls in a loop until `seconds` have passed (calls in flight then end)."""
        calls = len(self.latencies)

        async def worker(i: int, client: Client, deadline: float) -> None:
            while time.perf_counter() < deadline:
                tool, args = mixed_call(i, self.next_call[i], questions, communities)
                self.next_call[i] += 1
                try:
                    ms, err, _ = await timed_call(client, tool, args)
                except Exception as exc:  # a failed call counts as an error; the client goes on
                    self.errors.append(type(exc).__name__)
                    await asyncio.sleep(0.1)
                    continue
                if err:
                    self.errors.append(f"{tool}: isError")
                else:
                    self.latencies.append(ms)
                    self.by_tool[tool].append(ms)

        pids = descendants(self.server) if self.server is not None else []
        cpu0 = [cpu_seconds(p) for p in pids]
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(i, c, t0 + seconds) for i, c in enumerate(self.sessions)))
        elapsed = time.perf_counter() - t0
        self.elapsed += elapsed
        self.windows.append(round((len(self.latencies) - calls) / elapsed, 2))
        if pids:  # processes that used no CPU (a supervisor, a resource tracker) left out
            used = [(cpu_seconds(p) - c) / elapsed for p, c in zip(pids, cpu0, strict=True)]
            self.cores.append([round(u, 2) for u in used if u >= 0.01])

    def summary(self) -> dict[str, Any]:
        lat, elapsed = self.latencies, self.elapsed
        print(f"[serve] {len(self.sessions)} client(s): {len(lat)} calls in {elapsed:.1f} s, "
              f"{len(self.errors)} errors", file=sys.stderr, flush=True)
        return {"clients": len(self.sessions), "calls": len(lat), "elapsed_s": round(elapsed, 2),
                "calls_per_s": round(len(lat) / elapsed, 2) if elapsed else None,
                "windows_calls_per_s": self.windows,
                "windows_server_cores": self.cores,
                "p50_ms": percentile(lat, 50), "p95_ms": percentile(lat, 95),
                "errors": len(self.errors), "error_kinds": sorted(set(self.errors)),
                "by_tool": {t: {"calls": len(v), "p50_ms": percentile(v, 50),
                                "p95_ms": percentile(v, 95)} for t, v in self.by_tool.items()}}


async def load(url: str, clients: int, seconds: float, questions: list[str],
               communities: list[str], timeout: float) -> dict[str, Any]:
    """`clients` sessions (opened first), each calling in a loop until `seconds` have passed."""
    async with AsyncExitStack() as stack:
        phase = _Phase([await stack.enter_async_context(session(url, timeout))
                        for _ in range(clients)])
        await phase.window(seconds, questions, communities)
    return phase.summary()


async def compare(url: str, clients: int, seconds: float, rounds: int, questions: list[str],
                  communities: list[str], timeout: float,
                  server: int | None = None) -> dict[str, Any]:
    """One client against `clients`, `seconds` of load each, in `rounds` alternating windows
    (one client, then `clients`, and again): a 2-core machine shared with other work speeds up
    and slows down by 10-20% within minutes, and alternating windows give both client counts
    the same share of each spell. Sessions are opened once. `server`: its pid, to record the
    cores each of its processes used in each window (how calls spread over workers)."""
    async with AsyncExitStack() as stack:
        one = _Phase([await stack.enter_async_context(session(url, timeout))], server)
        many = _Phase([await stack.enter_async_context(session(url, timeout))
                       for _ in range(clients)], server)
        for _ in range(rounds):
            for phase in (one, many):
                await phase.window(seconds / rounds, questions, communities)
    a, b = one.summary(), many.summary()
    ratio = (b["calls_per_s"] / a["calls_per_s"]
             if a["calls_per_s"] and b["calls_per_s"] is not None else None)
    return {"1": a, "many": b, "ratio": None if ratio is None else round(ratio, 3),
            "rounds": rounds}


async def root_communities(client: Client) -> list[str]:
    _, _, content = await timed_call(client, "drill_down", {"limit": 100})
    return [c["id"] for c in (content or {}).get("children", [])]


# ---- the run -----------------------------------------------------------------------------------


async def measure(spec: dict[str, Any], proc: subprocess.Popen[bytes], t_start: float, url: str,
                  port: int, save: Any) -> None:
    rec: dict[str, Any] = {}
    timeout = float(spec["call_timeout_s"])
    questions = dev_questions()
    await wait_for_port(port, proc, timeout)
    async with session(url, timeout) as client:
        rec["handshake_s"] = round(time.perf_counter() - t_start, 3)
        ms, err, _ = await timed_call(client, "local_search", {"query": questions[0]})
        rec.update(first_query_ms=round(ms, 1), first_query_error=err,
                   rss_after_first_mb=tree_rss_mb(proc.pid),
                   pss_after_first_mb=tree_pss_mb(proc.pid))
        save(rec)
        if spec["serve"]:
            rec["tools"] = {}
            for tool in ("local_search", "basic_search", "global_search"):
                n = spec["global_queries"] if tool == "global_search" else spec["queries"]
                rec["tools"][tool] = await tool_series(
                    client, tool, questions[1:1 + n], questions[0], spec["global_level"],
                    spec["tool_budget_s"])
                save(rec)
            rec["tools"]["local_search"]["first_ms"] = rec["first_query_ms"]
            rec["rss_after_queries_mb"] = tree_rss_mb(proc.pid)
            save(rec)
        communities = await root_communities(client) if spec["concurrency"] else []
    if spec["concurrency"]:
        rec["concurrency"] = await compare(url, spec["clients"], spec["conc_seconds"],
                                           spec.get("conc_rounds", 1), questions[1:],
                                           communities, timeout, proc.pid)
        rec["concurrency"]["drill_down_communities"] = len(communities)
        rec["rss_after_concurrency_mb"] = tree_rss_mb(proc.pid)
        rec["pss_after_concurrency_mb"] = tree_pss_mb(proc.pid)
    rec["server_hwm_mb"] = round(status_kb(proc.pid, "VmHWM") / 1024, 1)
    save(rec)


def main() -> None:
    spec, out = json.loads(sys.argv[1]), Path(sys.argv[2])
    port = free_port()
    url = f"http://127.0.0.1:{port}/mcp"
    argv = [sys.executable, "-m", "canopy.server.cli", "serve", spec["docs"], "--index-dir",
            spec["index_dir"], "--http", "--port", str(port), *spec["serve_args"]]
    saved: dict[str, Any] = {"server_argv": argv[1:]}

    def save(rec: dict[str, Any]) -> None:
        saved.update(rec)
        out.write_text(json.dumps(saved))

    with open(spec["log"], "wb") as server_log:
        t_start = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=spec["repo"], stdout=server_log,
                                stderr=subprocess.STDOUT)
        try:
            asyncio.run(measure(spec, proc, t_start, url, port, save))
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
