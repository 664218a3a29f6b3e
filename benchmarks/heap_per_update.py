"""Heap growth per update in one process, without a server (issue 30): a quicker look than
soak.py at what a generation leaves behind.

    python benchmarks/heap_per_update.py                       # 30 updates, 8 rounds of calls each
    python benchmarks/heap_per_update.py --calls 0             # the updates alone (writer side)
    python benchmarks/heap_per_update.py --updates 12 --trace  # and what Python allocated (slow)

Indexes the first --articles MultiHop-RAG articles (growth_bench.py's files) with the builtin
provider through one `canopy.server.api.Index`, then --updates times: the same steady edit as
`soak.py --steady` (a random document gets growth_bench's sentence, or loses it), every fourth
update an addition and a deletion, `Index.update()`, then --calls rounds of local_search,
basic_search (k 5) and drill_down with DEV questions (int(sha256(q), 16) % 5 != 0), and one
global_search. After each update and its calls: `gc.collect()`, then glibc's heap in use
(mallinfo2, canopy.server.diagnostics.malloc_mb) beside the process's RSS and its anonymous
memory by kind (diagnostics.anon_mb). Printed: the figure per update and the
least-squares slope per update over the second half. With --trace, tracemalloc (6 frames) runs
from the fifth update and the lines whose allocations grew most between the seventh and the last
are printed (each traced update is about ten times slower).

JSON to --out (default benchmarks/results/heap_per_update.json).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from growth_bench import CORPUS, HERE_REPO, RESULTS, machine, materialize, write_article
from growth_serve import dev_questions
from soak import slope, toggle_sentence

from canopy.server.api import Index
from canopy.server.diagnostics import anon_mb, malloc_mb, smaps_mb


def _caches_mb(index: Index) -> dict[str, float]:
    """What the service's caches say they hold (diagnostics.cache_report), in MB."""
    from canopy.server.diagnostics import cache_report

    return {f"{name}_mb": round(entry["bytes"] / 2**20, 2)
            for name, entry in cache_report(index._opened()).items()}


def change_corpus(docs: Path, base: list[dict[str, str]], rng: random.Random, i: int,
                  next_article: int) -> int:
    """Update i's edits: a sentence toggled in a random article and, every fourth update, an
    article added and another deleted. Returns the number of the next article to add."""
    files = sorted(docs.glob("*.md"))
    toggle_sentence(rng.choice(files))
    if i % 4 == 0:
        write_article(docs, base, next_article)
        next_article += 1
        rng.choice(files).unlink()
    return next_article


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="canopy-heap-"))
    docs = work / "docs"
    base = json.loads(Path(CORPUS).read_text(encoding="utf-8"))
    materialize(docs, base, args.articles)
    index = Index.open(docs, index_dir=work / "index")
    index.update()
    questions = dev_questions()[:40]
    rng = random.Random(args.seed)
    next_article = args.articles
    rows: list[dict[str, Any]] = []
    snaps: dict[int, tracemalloc.Snapshot] = {}
    for i in range(args.updates):
        next_article = change_corpus(docs, base, rng, i, next_article)
        t0 = time.perf_counter()
        index.update()
        for j in range(args.calls):
            q = rng.choice(questions)
            index.local_search(q)
            index.basic_search(q, k=5)
            index.drill_down()
            if j == 0:
                index.global_search(q)
        gc.collect()
        heap = malloc_mb()
        anon = anon_mb()
        row = {"update": i, "in_use_mb": heap.get("in_use_mb"), "arena_mb": heap.get("arena_mb"),
               "rss_mb": smaps_mb().get("Rss"), "anon_mb": round(sum(anon.values()), 1),
               "anon_le_64mb": anon.get("anon_le_64mb"), "heap_mb": anon.get("heap"),
               "threads": threading.active_count(), **_caches_mb(index),
               "seconds": round(time.perf_counter() - t0, 2)}
        if tracemalloc.is_tracing():
            row["traced_mb"] = round(tracemalloc.get_traced_memory()[0] / 2**20, 2)
        rows.append(row)
        print(" ".join(f"{k} {v}" for k, v in row.items()), file=sys.stderr, flush=True)
        if args.trace and i == 4:
            tracemalloc.start(6)
        if args.trace and i in (6, args.updates - 1):
            snaps[i] = tracemalloc.take_snapshot()
    half = rows[len(rows) // 2:]
    report: dict[str, Any] = {
        "machine": machine(HERE_REPO), "settings": {k: str(v) if isinstance(v, Path) else v
                                           for k, v in vars(args).items()},
        "rows": rows,
        "slope_mb_per_update_second_half": slope(
            [(r["update"], r["in_use_mb"]) for r in half if r["in_use_mb"] is not None]),
        "rss_slope_mb_per_update_second_half": slope(
            [(r["update"], r["rss_mb"]) for r in half if r["rss_mb"] is not None])}
    if len(snaps) == 2:
        diff = snaps[max(snaps)].compare_to(snaps[min(snaps)], "traceback")
        report["traced_growth"] = [
            {"kb": round(d.size_diff / 1024, 1), "count": d.count_diff,
             "traceback": d.traceback.format()} for d in diff[:15]]
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--articles", type=int, default=100)
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--calls", type=int, default=8, help="rounds of calls after each update")
    p.add_argument("--trace", action="store_true", help="tracemalloc from the fifth update")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=RESULTS / "heap_per_update.json")
    args = p.parse_args()
    report = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"heap in use per update (glibc, MB), second half: "
          f"{report['slope_mb_per_update_second_half']} per update; "
          f"{report['rows'][0]['in_use_mb']} -> {report['rows'][-1]['in_use_mb']} MB")
    for g in report.get("traced_growth", []):
        print(f"{g['kb']:>8} KB {g['count']:>7}  {g['traceback'][-2].strip()}")
    print(f"JSON: {args.out}")


if __name__ == "__main__":
    main()
