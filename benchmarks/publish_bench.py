"""Published generations on an S3-compatible server (issue 13, items 1-2): what a publish and a
replica's switch cost, and the two designs not chosen, measured side by side.

On moto's S3 server on 127.0.0.1 (started here), with N MultiHop-RAG articles indexed by the
builtin provider:
1. publish the first generation, then after each of three one-article changes and an
   incremental update a generation more: an edit (a paragraph added to the first article), a
   deletion (the second), an addition (an article held back): time, files and bytes uploaded
   (content-addressed: unchanged files are not sent), and of those the database's (its
   changed pages and page map, canopy.server.wings.publish.pagestore: the page records written,
   of them the live pages a compaction moved, the blocks of page entries written, the root's size),
   next to how the change spread over the database file: the share of its 4 KiB pages, and
   of runs of 16 and 256 pages (64 KiB, 1 MiB: what content-addressed chunks of the file
   would be), that differ from the generation before;
2. a replica's local copy of each generation
   (`canopy.server.wings.publish.replica_cache.materialize`): time and bytes downloaded;
3. not chosen, the writer's LanceDB living on the object store: the indexer's writes to the
   three search tables (create, add in batches of 5,000, full-text index; then an update's
   delete + add of 20 rows), locally and on S3;
4. not chosen, replicas reading the Lance tables in place: hybrid searches (vector + BM25, as
   the engines run them) against local files and against the same tables on S3.

    python benchmarks/publish_bench.py                 # 100 articles
    python benchmarks/publish_bench.py --articles 300
    python benchmarks/publish_bench.py --repo ../main  # another checkout's publishing

A real object store answers each request in 10-100 ms where moto on loopback takes about 1 ms,
so (3) and (4) understate what the object store costs, and (1) and (2) are dominated by bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.index_bench import RESULTS, machine, materialize_multihop  # noqa: E402
from tests.net import free_port  # noqa: E402

STEPS = ("first generation", "after a one-article edit", "after a one-article deletion",
         "after a one-article addition")
QUERIES = ["election results", "stock market rally", "artificial intelligence regulation",
           "football transfer", "interest rates inflation", "cryptocurrency fraud trial",
           "climate summit", "smartphone launch", "merger acquisition", "court ruling appeal"]


def lance_writes(db: Any, source: Any, table_names: list[str]) -> float:
    """The indexer's writes to the search tables, replayed into `db`; seconds."""
    began = time.perf_counter()
    for name in table_names:
        rows = source.open_table(name).to_arrow()
        t = db.create_table(name, schema=rows.schema)
        for i in range(0, rows.num_rows, 5000):
            t.add(rows.slice(i, 5000))
        t.create_fts_index("text", replace=True)
        ids = rows.column("id").to_pylist()[:20]
        t.delete("id IN (" + ", ".join(f"'{i}'" for i in ids) + ")")
        t.add(rows.slice(0, 20))
    return time.perf_counter() - began


def search_ms(db: Any, embedder: Any, table_names: list[str]) -> float:
    """Median ms of one hybrid search per table per query (the engines' VectorReader)."""
    import asyncio

    from canopy.vectors import VectorReader

    reader = VectorReader({name: db.open_table(name) for name in table_names})
    vectors = asyncio.run(embedder.embed(QUERIES))
    took = []

    async def run() -> None:  # the reader's searches are coroutines (one event loop)
        for q, vec in zip(QUERIES, vectors, strict=True):
            for name in table_names:
                began = time.perf_counter()
                await reader.search(name, vector=vec, text=q, k=10)
                took.append((time.perf_counter() - began) * 1000)

    asyncio.run(run())
    return statistics.median(took)


def spread(before: Path, after: Path) -> dict[str, float]:
    """Shares of `after`'s 4 KiB pages, and of its runs of 16 and 256 of them, that differ
    from `before` (two staged databases, page for page), and the pages that differ."""
    size = 4096
    a, b = before.read_bytes(), after.read_bytes()
    pages = -(-len(b) // size)
    changed = [i for i in range(pages) if a[i * size:(i + 1) * size] != b[i * size:(i + 1) * size]]
    shares: dict[str, float] = {
        f"{run * 4}_kib": round(len({i // run for i in changed}) / -(-pages // run), 3)
        for run in (1, 16, 256)}
    shares["pages"] = len(changed)
    return shares


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--articles", type=int, default=100)
    ap.add_argument("--repo", type=Path, default=None,
                    help="measure the publishing of this checkout (default: this one)")
    ap.add_argument("--out", type=Path, default=RESULTS / "publish_bench.json")
    args = ap.parse_args()
    if args.repo is not None:
        sys.path.insert(0, str(args.repo.resolve()))
    for key in [k for k in os.environ if k.startswith(("CANOPY_", "OPENAI_"))]:
        del os.environ[key]
    os.environ["CANOPY_STORAGE__TIDY"] = "inline"

    import logging

    import boto3
    import lancedb
    from moto.server import ThreadedMotoServer

    from canopy.providers import make_embedder
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.wings.publish.location import open_location
    from canopy.server.wings.publish.publishing import publish_index
    from canopy.server.wings.publish.replica_cache import materialize
    from canopy.server.wings.publish.snapshot import stage_snapshot
    from canopy.server.wings.publish.writer import newest_manifest

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    port = free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    endpoint = f"http://127.0.0.1:{port}"
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1", AWS_ENDPOINT_URL=endpoint)
    boto3.client("s3").create_bucket(Bucket="bench")
    work = Path(tempfile.mkdtemp(prefix="publish-bench-"))
    out: dict[str, Any] = {"articles": args.articles, "machine": machine(),
                           "repo": str(args.repo or Path(__file__).resolve().parents[1])}
    try:
        docs = work / "docs"
        materialize_multihop(docs, args.articles + 1)
        added = sorted(docs.glob("*.md"))[-1]  # held back for the third generation
        later = added.read_text(encoding="utf-8")
        added.unlink()
        ws = open_workspace(docs, work / "index")
        began = time.perf_counter()
        build_index(ws)
        out["build_s"] = round(time.perf_counter() - began, 2)
        print(f"built {args.articles} articles in {out['build_s']} s", file=sys.stderr)
        uri = "s3://bench/idx"
        location = open_location(uri)
        edited, deleted = sorted(docs.glob("*.md"))[:2]
        changes = [lambda: None,
                   lambda: edited.write_text(edited.read_text(encoding="utf-8")
                                             + "\n\nA paragraph added later.\n",
                                             encoding="utf-8"),
                   deleted.unlink, lambda: added.write_text(later, encoding="utf-8")]
        results, manifests, staged, database_mb, root_kb = [], [], [], [], []
        sizes = {o.path: o.size for o in location.list("blobs")}
        for step, change in enumerate(changes):
            if step:
                change()
                began = time.perf_counter()
                build_index(ws)
                out.setdefault("update_s", []).append(round(time.perf_counter() - began, 2))
            staged.append(stage_snapshot(ws.index_dir, work / f"staged-{step}").folder
                          / "canopy.sqlite")
            results.append(publish_index(ws, uri))
            manifests.append(newest_manifest(location))
            # The database's blobs this publish stored (any checkout's layout: whole file,
            # page patch, or packs and page map).
            now = {o.path: o.size for o in location.list("blobs")}
            ref = manifests[-1].files["canopy.sqlite"]
            database_mb.append(round(sum(n for path, n in now.items() if path not in sizes
                                         and path.rsplit("/", 1)[-1] in ref.blobs()) / 1e6, 2))
            root = getattr(ref, "pages", None)  # the page map's root (this checkout)
            root_kb.append(round(now[f"blobs/{root}"] / 1e3, 1) if root else None)
            sizes = now
        assert all(m is not None for m in manifests)
        cache = work / "replica"
        loads = []
        for m in manifests:
            began = time.perf_counter()
            _, got = materialize(location, m, cache)
            loads.append((time.perf_counter() - began, got))
        # A restart on that cache: nothing to download, every cached file read and checked.
        began = time.perf_counter()
        _, again = materialize(location, manifests[-1], cache)
        out["replica_reopen_s"] = round(time.perf_counter() - began, 3)
        checked = [cache / "databases" / f.sha256 for f in manifests[-1].files.values()
                   if getattr(f, "pages", None)]  # assembled from pages (this checkout)
        checked += [cache / "blobs" / b for f in manifests[-1].files.values()
                    for b in (f.cached_blobs() if hasattr(f, "cached_blobs") else f.blobs())]
        out["replica_reopen_checked_mb"] = round(sum(p.stat().st_size for p in checked) / 1e6, 2)
        assert again == 0
        out["publish"] = []
        for i, (name, r, (load, got)) in enumerate(zip(STEPS, results, loads, strict=True)):
            row = {"what": name, "publish_s": round(r.elapsed_s, 3), "files": r.files,
                   "uploaded_files": r.uploaded_files,
                   "uploaded_mb": round(r.uploaded_bytes / 1e6, 2),
                   "total_mb": round(r.total_bytes / 1e6, 2), "replica_load_s": round(load, 3),
                   "replica_download_mb": round(got / 1e6, 2),
                   "database_mb": round(staged[i].stat().st_size / 1e6, 2),
                   "database_uploaded_mb": database_mb[i]}
            # How the database went: pages written (this checkout) or whole / patch (before).
            for key in ("database", "database_pages", "database_written",
                        "database_blocks_written"):
                if hasattr(r, key):
                    row[key] = getattr(r, key)
            if root_kb[i] is not None:
                row["database_root_kb"] = root_kb[i]
            if i:
                row["changed"] = spread(staged[i - 1], staged[i])
            out["publish"].append(row)

        # The designs not chosen: Lance on the object store, for the writer and for readers.
        source = lancedb.connect(str(ws.index_dir / "lance"))
        names = sorted(source.list_tables().tables)
        storage = {"aws_endpoint": endpoint, "aws_access_key_id": "bench",
                   "aws_secret_access_key": "bench", "aws_region": "us-east-1",
                   "allow_http": "true"}
        local_db = lancedb.connect(str(work / "lance-local"))
        s3_db = lancedb.connect("s3://bench/lance-direct", storage_options=storage)
        out["writer_lance_local_s"] = round(lance_writes(local_db, source, names), 2)
        out["writer_lance_s3_s"] = round(lance_writes(s3_db, source, names), 2)
        embedder = make_embedder(ws.settings)
        out["search_local_ms"] = round(search_ms(local_db, embedder, names), 2)
        out["search_s3_ms"] = round(search_ms(s3_db, embedder, names), 2)
    finally:
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)

    print(f"Published generations on moto S3 (127.0.0.1), {args.articles} MultiHop-RAG articles, "
          f"builtin provider (build {out['build_s']} s, updates {out['update_s']} s; "
          f"{out['repo']})\n")
    print("| publish | database | database uploaded | files | uploaded | of | publish s | "
          "replica download | replica load s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for p in out["publish"]:
        how = (f"{p['database_written']:,} of {p['database_pages']:,} pages"
               if "database_written" in p else p.get("database", "?"))
        print(f"| {p['what']} | {how} | {p['database_uploaded_mb']} MB | {p['files']} | "
              f"{p['uploaded_files']} files, "
              f"{p['uploaded_mb']} MB | {p['total_mb']} MB | {p['publish_s']} | "
              f"{p['replica_download_mb']} MB | {p['replica_load_s']} |")
    if all("database_blocks_written" in p for p in out["publish"]):
        print("\n| publish | pages changed | page records written | of them moved by compaction "
              "| blocks of 32 page entries written | root |")
        print("|---|---|---|---|---|---|")
        for i, p in enumerate(out["publish"]):
            changed = p["changed"]["pages"] if i else p["database_pages"]
            print(f"| {p['what']} | {changed:,} | {p['database_written']:,} | "
                  f"{p['database_written'] - changed:,} | {p['database_blocks_written']:,} | "
                  f"{p['database_root_kb']} kB |")
    print("\n| change | database | pages changed | 64 KiB runs changed | 1 MiB runs changed |")
    print("|---|---|---|---|---|")
    for p in out["publish"][1:]:
        c = p["changed"]
        print(f"| {p['what'].removeprefix('after ')} | {p['database_mb']} MB | "
              f"{c['4_kib']:.1%} | {c['64_kib']:.1%} | {c['1024_kib']:.1%} |")
    print(f"\nA replica reopening the last generation from its cache (a restart): "
          f"{out['replica_reopen_s']} s, checking the {out['replica_reopen_checked_mb']} MB of "
          "cached files it opens against the manifest")
    print("\n| not chosen | local files | on S3 | ratio |")
    print("|---|---|---|---|")
    print(f"| writer: search-table writes of a build + an update (s) | "
          f"{out['writer_lance_local_s']} | {out['writer_lance_s3_s']} | "
          f"{out['writer_lance_s3_s'] / max(out['writer_lance_local_s'], 1e-9):.1f}x |")
    ratio = out["search_s3_ms"] / max(out["search_local_ms"], 1e-9)
    print(f"| replica: one hybrid search, median (ms) | {out['search_local_ms']} | "
          f"{out['search_s3_ms']} | {ratio:.1f}x |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
