"""Where a serving process's CPU goes under load, by thread kind: Python's threads (the event
loop and the call threads) against LanceDB's (its tokio runtime and CPU pool).

    python benchmarks/serve_threads.py URL SERVER_PID [--clients 1,16] [--seconds 25]

URL is a running `canopy serve --http` (e.g. http://127.0.0.1:8765/mcp) and SERVER_PID its
process (its worker processes are found as its children). For each client count the script
drives the growth benchmark's mix (growth_serve.load: local_search, basic_search and
drill_down over DEV questions of MultiHop-RAG) and samples /proc of every thread of the server
tree meanwhile. Printed per client count: calls/s, then per thread name the cores used (user,
system) and minor page faults per second, and per call the milliseconds of CPU. The driver's
own CPU is printed too: it shares the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import growth_serve as g  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def tree(root: int) -> list[int]:
    pids = [root]
    for pid in pids:
        try:
            pids += [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except OSError:
            pass
    return pids


def threads(pids: list[int]) -> dict[tuple[int, str], tuple[str, int, int, int]]:
    """(pid, tid) -> (thread name, utime ticks, stime ticks, minor faults)."""
    out = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            f = stat[stat.rindex(")") + 2:].split()
            out[(pid, tid)] = (name, int(f[11]), int(f[12]), int(f[7]))
    return out


async def drive(url: str, clients: int, seconds: float) -> dict:
    questions = g.dev_questions()
    async with g.session(url, 60) as client:
        communities = await g.root_communities(client)
    return await g.load(url, clients, seconds, questions[1:], communities, 60)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url")
    p.add_argument("server_pid", type=int)
    p.add_argument("--clients", default="1,16")
    p.add_argument("--seconds", type=float, default=25.0)
    args = p.parse_args()
    for clients in (int(c) for c in args.clients.split(",")):
        pids = tree(args.server_pid)
        before: dict = {}
        after: dict = {}
        done = threading.Event()

        def sample(before: dict = before, after: dict = after, done: threading.Event = done,
                   pids: list[int] = pids) -> None:
            time.sleep(1.0)  # sessions opened; the load has started
            before.update(threads(pids), t=time.monotonic())
            done.wait()
            after.update(threads(pids), t=time.monotonic())

        sampler = threading.Thread(target=sample)
        sampler.start()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        result = asyncio.run(drive(args.url, clients, args.seconds))
        done.set()
        sampler.join()
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        elapsed = after.pop("t") - before.pop("t")
        by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        for key, (name, user, system, faults) in after.items():
            _, u0, s0, f0 = before.get(key, (name, 0, 0, 0))
            by_name[name][0] += (user - u0) / TICK / elapsed
            by_name[name][1] += (system - s0) / TICK / elapsed
            by_name[name][2] += (faults - f0) / elapsed
        rate = result["calls_per_s"] or 0.0
        driver = (r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime) / result["elapsed_s"]
        print(f"{clients} client(s): {rate:.2f} calls/s, {result['errors']} errors, "
              f"driver {driver:.2f} cores")
        print(f"  {'thread':<18} {'user':>6} {'system':>7} {'faults/s':>9} {'CPU ms/call':>12}")
        for name, (user, system, faults) in sorted(by_name.items(), key=lambda kv: -sum(kv[1][:2])):
            if user + system < 0.005:
                continue
            per_call = 1000 * (user + system) / rate if rate else float("nan")
            print(f"  {name:<18} {user:>6.3f} {system:>7.3f} {faults:>9.0f} {per_call:>12.1f}")


if __name__ == "__main__":
    main()
