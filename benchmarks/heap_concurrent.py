"""Heap and RSS per update with concurrent callers, in one process (issue 30): a quicker look
than soak.py at what the soak's concurrency adds to heap_per_update.py.

    python benchmarks/heap_concurrent.py                        # 40 updates, 16 callers
    EXP_TRIM_SAMPLE=1 python benchmarks/heap_concurrent.py      # malloc_trim before each row

Indexes the first 100 MultiHop-RAG articles (growth_bench.py's files) through one
`canopy.server.api.Index`, then --updates times: soak.py --steady's edit of a random document
(every fourth update an addition and a deletion), `Index.update()`, and --clients threads that
each make --rounds rounds of local_search, basic_search (k 5) and drill_down with DEV questions.
After each: gc.collect(), then RSS, glibc's heap (mallinfo2: in use, free, arena), resident
anonymous memory by kind (diagnostics.anon_mb), LanceDB's `lancedb-tokio-w` threads and all
threads, and Python's small-object allocator (sys._debugmallocstats: arenas, bytes in
allocated blocks, total). With EXP_TRIM_SAMPLE=1 the row also has RSS before a malloc_trim
made just before it (`rss_pre_trim`), and the rest is measured after it; EXP_NOTRIM=1 stops
the service's own trim at each generation's first call. The build runs in this process, so
LanceDB's thread pool starts larger than a server's. Unlike the soak there is no HTTP layer.

JSON to --out (default benchmarks/results/heap_concurrent.json): the rows and the
least-squares slope per update of RSS and of glibc's heap in use over the second half.
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import os
import random
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from growth_bench import CORPUS, HERE_REPO, RESULTS, machine, materialize
from growth_serve import dev_questions
from heap_per_update import change_corpus
from soak import slope

from canopy.allocator import limit_arenas, release_free
from canopy.server.api import Index
from canopy.server.diagnostics import anon_mb, malloc_mb, smaps_mb

limit_arenas()  # as the CLI does before any command
if os.environ.get("EXP_NOTRIM"):
    import canopy.server.service

    canopy.server.service.release_free = lambda: False  # type: ignore[assignment]


def obstats() -> dict[str, float | None]:
    """Python's small-object allocator: arenas, MB in allocated blocks, MB in all."""
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()

    def field(name: str) -> int | None:
        m = re.search(re.escape(name) + r"\s*=\s*([\d,]+)", text)
        return int(m.group(1).replace(",", "")) if m else None

    return {"ob_arenas": field("# arenas allocated current"),
            "ob_used_mb": round((field("# bytes in allocated blocks") or 0) / 2**20, 1),
            "ob_total_mb": round((field("Total") or 0) / 2**20, 1)}


def threads_by_name() -> dict[str, int]:
    names: collections.Counter[str] = collections.Counter()
    for t in os.listdir("/proc/self/task"):
        try:
            names[Path(f"/proc/self/task/{t}/comm").read_text().strip()] += 1
        except OSError:
            pass
    return dict(names)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "heap_concurrent.json")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="canopy-conc-"))
    docs = work / "docs"
    base = json.loads(Path(CORPUS).read_text(encoding="utf-8"))
    materialize(docs, base, 100)
    index = Index.open(docs, index_dir=work / "index")
    index.update()
    questions = dev_questions()[:40]
    rng = random.Random(0)
    next_article = 100
    rows: list[dict[str, object]] = []
    pool = ThreadPoolExecutor(args.clients)

    def client(seed: int) -> None:
        r = random.Random(seed)
        for _ in range(args.rounds):
            q = r.choice(questions)
            index.local_search(q)
            index.basic_search(q, k=5)
            index.drill_down()

    started = time.time()
    for i in range(args.updates):
        next_article = change_corpus(docs, base, rng, i, next_article)
        t0 = time.perf_counter()
        index.update()
        list(pool.map(client, [i * 100 + c for c in range(args.clients)]))
        gc.collect()
        rss0 = None
        if os.environ.get("EXP_TRIM_SAMPLE"):
            rss0 = smaps_mb().get("Rss")
            release_free()
        h, a, th = malloc_mb(), anon_mb(), threads_by_name()
        row = {"u": i, "rss_pre_trim": rss0, "rss": smaps_mb().get("Rss"),
               "in_use": h.get("in_use_mb"), "free": h.get("free_mb"), "arena": h.get("arena_mb"),
               "heap": a.get("heap"), "le64": a.get("anon_le_64mb"), "gt64": a.get("anon_gt_64mb"),
               "tokio": th.get("lancedb-tokio-w", 0), "thr": sum(th.values()),
               "s": round(time.perf_counter() - t0, 1), **obstats()}
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), file=sys.stderr, flush=True)
    pool.shutdown()
    half = rows[len(rows) // 2:]
    env = {k: v for k, v in os.environ.items()
           if k.startswith(("CANOPY", "MALLOC", "GLIBC", "TOKIO", "LANCE", "EXP"))}
    report = {"machine": machine(HERE_REPO), "env": env, "settings": {
                  k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "rows": rows, "rss_slope": slope([(r["u"], r["rss"]) for r in half]),
              "in_use_slope": slope([(r["u"], r["in_use"]) for r in half]),
              "wall_s": round(time.time() - started)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(json.dumps({k: report[k] for k in ("env", "rss_slope", "in_use_slope", "wall_s")}))


if __name__ == "__main__":
    main()
