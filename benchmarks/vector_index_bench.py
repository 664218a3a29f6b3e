"""Vector index of the search tables: IVF_FLAT with sqrt(rows) partitions and LanceDB's 20
probes (before) against IVF_SQ with ~2,000-row partitions probing 60% of them and re-ranking
by exact distances (canopy.vectors, now), side by side on one index, as built and after a
tidy.

    python benchmarks/vector_index_bench.py INDEX_DIR [--queries 60] [--embedder hash|wordllama]
        [--cache-mb 38] [--tables entities,text_units,reports] [--shares 0.1,0.3]

INDEX_DIR is an index folder (DOCS/.canopy, or a growth benchmark's SIZE/index) whose tables have
at least VECTOR_INDEX_MIN rows; 10,000 articles give 37,579 / 397,514 / 57,461 rows. For each
table the ids and vectors are copied into a scratch LanceDB folder (the index is only read).
Each configuration is trained on all rows but 0.5% (a full build), then the 0.5% are added (an
update: searched unindexed) and measured ("built"), then folded in by LanceDB's optimize, as
Canopy's tidy does after an update ("after a tidy"). Queries are DEV questions of MultiHop-RAG
(int(sha256(q), 16) % 5 != 0), embedded as the table was. With `--embedder wordllama` the rows'
texts and the questions are embedded anew by the builtin semantic embedder instead, for a
second kind of vector (clustered, unlike signed hashing).

Printed per table and configuration: recall of the exact top 20 (a flat scan over all rows),
CPU and wall milliseconds per search with LanceDB's index cache at `--cache-mb` (a server's
share of [query] cache_mb = 256: 77 MB with one process, 38 MB each with `--workers 2`) after a
warm-up of as many searches, and the rows one search compares (LanceDB's plan metrics). The
CPU includes the page faults of partitions read anew for each search. `--shares` adds IVF_SQ
rows probing those shares of its partitions.
"""

from __future__ import annotations

import argparse
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from growth_serve import dev_questions  # noqa: E402

import canopy.vectors as vectors  # noqa: E402
from canopy.lance import import_lancedb  # noqa: E402
from canopy.vectors import VECTOR_INDEX_MIN, probes  # noqa: E402

K = 20


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def embedder(kind: str, dims: int) -> Any:
    if kind == "wordllama":
        from canopy.providers.builtin.static import WordLlamaEmbedder

        return WordLlamaEmbedder()
    from canopy.providers.builtin import HashEmbedder

    return HashEmbedder(dims)


def copy_table(source: Any, db: Any, name: str, kind: str, emb: Any) -> Any:
    """ids and vectors of `source` in a new table (vectors re-embedded from text for wordllama)."""
    import pyarrow as pa

    columns = ["id", "vector"] if kind == "hash" else ["id", "text"]
    out = None
    for batch in source.search().limit(None).select(columns).to_batches(20_000):
        if kind == "hash":
            part = pa.table({"id": batch["id"], "vector": batch["vector"]})
        else:
            vectors = emb.embed_sync(batch["text"].to_pylist())
            flat = pa.array(vectors.reshape(-1))
            part = pa.table({"id": batch["id"],
                             "vector": pa.FixedSizeListArray.from_arrays(flat, vectors.shape[1])})
        if out is None:
            out = db.create_table(name, part)
        else:
            out.add(part)
    return out


def fresh_table(t: Any, held: Any) -> None:
    """The table as a full build leaves it: all rows but the held-out update, compacted."""
    t.delete(f"id IN ({', '.join(repr(i) for i in held['id'].to_pylist())})")
    t.optimize()


def compared(t: Any, v: np.ndarray, nprobes: int | None) -> int:
    """Rows one search compares (LanceDB's plan metrics, every delta and unindexed row)."""
    q = t.search(v, query_type="vector").limit(K).select(["id", "_distance"])
    if nprobes:
        q = q.nprobes(nprobes)
    plan = q.analyze_plan()
    total = 0.0
    for value, unit in re.findall(r"index_comparisons=([0-9.]+)( ?K)?", plan):
        total += float(value) * (1000 if unit.strip() == "K" else 1)
    return int(total + sum(int(x) for x in re.findall(r"LanceScan:.*?output_rows=(\d+)", plan)))


def measure(t: Any, queries: np.ndarray, exact: list[list[str]], nprobes: int | None,
            refine: int | None = None) -> dict:
    def search(v: np.ndarray) -> list[str]:
        q = t.search(v, query_type="vector").limit(K).select(["id", "_distance"])
        if nprobes:
            q = q.nprobes(nprobes)
        if refine:
            q = q.refine_factor(refine)
        return [r["id"] for r in q.to_list()]

    for v in queries:  # warm-up: the cache holds what it can
        search(v)
    w0, c0 = time.perf_counter(), cpu_s()
    recall = [len(set(search(v)) & set(ex)) / len(ex) for v, ex in zip(queries, exact, strict=True)]
    n = len(queries)
    return {"recall": float(np.mean(recall)), "wall_ms": 1000 * (time.perf_counter() - w0) / n,
            "cpu_ms": 1000 * (cpu_s() - c0) / n, "compared": compared(t, queries[0], nprobes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("index_dir", type=Path)
    p.add_argument("--queries", type=int, default=60)
    p.add_argument("--embedder", choices=("hash", "wordllama"), default="hash")
    p.add_argument("--cache-mb", type=int, default=38, help="LanceDB index cache (MB)")
    p.add_argument("--tables", default="entities,text_units,reports")
    p.add_argument("--refine-off", action="store_true",
                   help="also measure IVF_SQ without re-ranking by exact distances")
    p.add_argument("--shares", default="",
                   help="also probe these shares of IVF_SQ's partitions, e.g. 0.2,0.3")
    args = p.parse_args()
    lancedb = import_lancedb()
    from lancedb.index import IvfFlat, IvfSq

    source_db = lancedb.connect(str(args.index_dir / "lance"))
    questions = dev_questions()[:args.queries]
    scratch = Path(tempfile.mkdtemp(prefix="canopy-vecbench-"))
    print(f"{args.embedder} vectors, {len(questions)} DEV questions, index cache "
          f"{args.cache_mb} MB, top {K}")
    print(f"{'table':<11} {'rows':>8} {'index, probes, when':<38} {'build s':>7} {'recall':>6} "
          f"{'cpu ms':>7} {'wall ms':>7} {'compared':>9}")
    try:
        for name in args.tables.split(","):
            source = source_db.open_table(name)
            dims = source.schema.field("vector").type.list_size
            emb = embedder(args.embedder, dims)
            work = lancedb.connect(str(scratch / name))
            t = copy_table(source, work, name, args.embedder, emb)
            rows = t.count_rows()
            if rows < VECTOR_INDEX_MIN:
                print(f"{name:<11} {rows:>8} below VECTOR_INDEX_MIN: searched flat")
                continue
            queries = np.asarray(emb.embed_sync(questions), dtype=np.float32)
            update = max(1, rows // 200)  # one update's worth: the last 0.5% of the rows
            held = t.take_offsets(list(range(rows - update, rows))).select(
                ["id", "vector"]).to_arrow()
            exact = [[r["id"] for r in t.search(v).limit(K).select(["id", "_distance"])
                      .bypass_vector_index().to_list()] for v in queries]
            shares = [float(x) for x in args.shares.split(",") if x]
            sqrt_partitions = max(16, int(rows ** 0.5))
            for kind in ("IVF_FLAT", "IVF_SQ"):
                fresh_table(t, held)
                t0 = time.perf_counter()
                if kind == "IVF_FLAT":  # before: sqrt(rows) partitions, LanceDB's probes
                    t.create_index("vector", config=IvfFlat(distance_type="l2",
                                                            num_partitions=sqrt_partitions),
                                   name="v", replace=True)
                    counts: list[tuple[int | None, int | None]] = [(None, None)]
                else:  # now: canopy.vectors' partitions and probes
                    t.create_index("vector", config=IvfSq(
                        distance_type="l2", target_partition_size=vectors._PARTITION_ROWS),
                        name="v", replace=True)
                    partitions = max(1, rows // vectors._PARTITION_ROWS)
                    counts = [(probes(rows), vectors._REFINE)] + [
                        (n, r) for n in sorted({probes(rows)} | {
                            max(20, round(share * partitions)) for share in shares})
                        for r in ({None, vectors._REFINE} if args.refine_off else {None})
                        if (n, r) != (probes(rows), vectors._REFINE)]
                built = time.perf_counter() - t0
                t.add(held)  # an update: 0.5% of the rows, unindexed until the tidy
                for when in ("built", "after a tidy"):
                    if when != "built":
                        t.optimize()  # the tidy's: folds the added rows into the index
                    for nprobes, refine in counts:
                        cache = args.cache_mb << 20
                        session = lancedb.Session(index_cache_size_bytes=cache,
                                                  metadata_cache_size_bytes=cache // 3)
                        opened = lancedb.connect(str(scratch / name),
                                                 session=session).open_table(name)
                        m = measure(opened, queries, exact, nprobes, refine)
                        probed = "LanceDB's probes" if nprobes is None else f"{nprobes} probes"
                        if refine:
                            probed += f" x{refine}"
                        label = f"{kind}, {probed}, {when}"
                        print(f"{name:<11} {rows:>8} {label:<38} {built:>7.1f} "
                              f"{m['recall']:>6.3f} {m['cpu_ms']:>7.1f} {m['wall_ms']:>7.1f} "
                              f"{m['compared']:>9}", flush=True)
                        built = 0.0
                t.drop_index("v")
            shutil.rmtree(scratch / name, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
