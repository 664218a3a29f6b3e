"""LanceDB's synchronous API against its asynchronous one, for the searches a server's call
threads run: CPU and throughput per search, side by side in one run.

    python benchmarks/lance_query_path.py INDEX_DIR [--threads 1,4] [--seconds 12]

INDEX_DIR is a built index (e.g. a growth benchmark's DIR/10000/index). Each of `threads`
threads loops over one step like a local_search's: some Python work (a dict loop of about
5 ms), two full-text searches and one vector search of the `text_units` table, as
`canopy.vectors.VectorReader.search` asks them (limit 30; the vector search with the reader's
probes and refine factor). `sync` runs the searches through the synchronous table, whose every
query and result batch passes through LanceDB's background event loop thread; `async` awaits
the asynchronous table on the thread's own event loop, as the server does. Printed per mode
and thread count: steps/s, cores busy (this process) and CPU per step.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from canopy.vectors import _REFINE, probes  # noqa: E402

WORDS = ["president election campaign", "market stock shares", "football season coach",
         "phone launch price", "court trial judge", "storm flood damage"]


def python_work() -> int:
    d: dict[int, int] = {}
    for i in range(60_000):
        d[i % 997] = d.get(i % 991, 0) + i
    return len(d)


def sync_steps(path: str, i: int, deadline: float, done: list[int]) -> None:
    import lancedb

    t: Any = lancedb.connect(path).open_table("text_units")
    dims, n = t.schema.field("vector").type.list_size, probes(t.count_rows())
    rng = np.random.default_rng(i)
    while time.perf_counter() < deadline:
        python_work()
        for w in (WORDS[done[i] % len(WORDS)], WORDS[(done[i] + 1) % len(WORDS)]):
            t.search(w, query_type="fts").limit(30).select(["id", "_score"]).to_list()
        (t.search(rng.random(dims, dtype=np.float32), query_type="vector").limit(30)
         .select(["id", "_distance"]).nprobes(n).refine_factor(_REFINE).to_list())
        done[i] += 1


def async_steps(path: str, i: int, deadline: float, done: list[int]) -> None:
    import lancedb

    async def run() -> None:
        t: Any = await (await lancedb.connect_async(path)).open_table("text_units")
        dims = (await t.schema()).field("vector").type.list_size
        n = probes(await t.count_rows())
        rng = np.random.default_rng(i)
        while time.perf_counter() < deadline:
            python_work()
            for w in (WORDS[done[i] % len(WORDS)], WORDS[(done[i] + 1) % len(WORDS)]):
                await t.query().nearest_to_text(w).limit(30).select(["id", "_score"]).to_arrow()
            await (t.query().nearest_to(rng.random(dims, dtype=np.float32)).limit(30)
                   .nprobes(n).refine_factor(_REFINE).select(["id", "_distance"]).to_arrow())
            done[i] += 1

    asyncio.new_event_loop().run_until_complete(run())


def measure(mode: str, path: str, threads: int, seconds: float) -> str:
    steps = sync_steps if mode == "sync" else async_steps
    steps(path, 0, time.perf_counter() + 2, [0])  # warm: open the table, load its indexes
    done = [0] * threads
    c0, t0 = time.process_time(), time.perf_counter()
    workers = [threading.Thread(target=steps, args=(path, i, t0 + seconds, done))
               for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed, cpu, n = time.perf_counter() - t0, time.process_time() - c0, sum(done)
    return (f"{mode:5s} {threads} thread(s): {n / elapsed:6.1f} steps/s, {cpu / elapsed:.2f} "
            f"cores, {1000 * cpu / max(1, n):5.1f} ms CPU per step")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("index_dir", type=Path)
    p.add_argument("--threads", default="1,4")
    p.add_argument("--seconds", type=float, default=12.0)
    args = p.parse_args()
    path = str(args.index_dir / "lance")
    for threads in (int(x) for x in args.threads.split(",")):
        for mode in ("sync", "async", "sync", "async"):  # alternating: the machine drifts
            print(measure(mode, path, threads, args.seconds), flush=True)


if __name__ == "__main__":
    main()
