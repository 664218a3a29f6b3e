"""Index a folder with Microsoft GraphRAG against an OpenAI-compatible endpoint, measured.

Run by benchmarks/index_bench.py (`--graphrag-python`) with the Python of a separate virtual
environment that has `graphrag` installed; it imports neither Canopy nor anything of this repo,
and none of GraphRAG's code is in this repo.

    /work/graphrag-venv/bin/python benchmarks/graphrag_runner.py \\
        --docs DOCS --root WORK --base-url http://127.0.0.1:PORT/v1 --out result.json

Steps: `graphrag init` into WORK (prompts and a settings.yaml), settings pointed at the endpoint
(chat and embeddings, no API key needed), the input at a copy of DOCS' .txt/.md files, then one
`graphrag.api.build_index` in this process, timed from the call to its return. GraphRAG wraps each
workflow in tracemalloc (graphrag.index.run.profiling) and has no setting to turn that off, so
`tracemalloc.start` is made a no-op here unless `--tracemalloc` (its own overhead is then in the
figures). Output JSON: wall_s, cpu_s, peak RSS (ru_maxrss and VmHWM), import time, per-workflow
errors, and the row counts of the output tables.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

TEXT_SUFFIXES = (".txt", ".md")


def _hwm_mb() -> float | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    m = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(m.group(1)) / 1024 if m else None


def prepare(root: Path, docs: Path, base_url: str, concurrency: int | None,
            chunk: tuple[int, int] | None = None, claims: bool = False) -> int:
    """`graphrag init` into `root`, settings pointed at the endpoint; the documents copied to
    root/input (GraphRAG's text loader reads one file pattern). `claims`: GraphRAG's claim
    extraction (`extract_claims`, off by default) runs too and writes covariates.parquet.
    Returns the documents copied."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "graphrag", "init", "--root", str(root), "--force",
                    "-m", "fake", "-e", "fake-embed"], check=True, stdin=subprocess.DEVNULL,
                   capture_output=True)
    settings_path = root / "settings.yaml"
    settings: dict[str, Any] = yaml.safe_load(settings_path.read_text())
    for group in ("completion_models", "embedding_models"):
        for model in settings[group].values():
            model["api_base"] = base_url
            model["api_key"] = "fake"
            model["retry"] = {"type": "exponential_backoff", "max_retries": 2}
    if concurrency:
        for section in ("extract_graph", "summarize_descriptions", "community_reports",
                        "embed_text"):
            settings.setdefault(section, {})["concurrent_requests"] = concurrency
    # `$$`: GraphRAG substitutes ${ENV} variables in the settings file
    settings["input"] = {"type": "text", "file_pattern": r".*\.(txt|md)$$"}
    settings["vector_store"]["vector_size"] = 64  # the fake endpoint's embedding size
    if chunk:
        settings["chunking"]["size"], settings["chunking"]["overlap"] = chunk
    if claims:
        settings.setdefault("extract_claims", {})["enabled"] = True
    settings_path.write_text(yaml.safe_dump(settings, sort_keys=False))
    (root / ".env").write_text("GRAPHRAG_API_KEY=fake\n")
    inp = root / "input"
    shutil.rmtree(inp, ignore_errors=True)
    inp.mkdir()
    n = 0
    for f in sorted(docs.rglob("*")):
        if f.is_file() and f.suffix in TEXT_SUFFIXES and not any(p.startswith(".") for p in
                                                                f.relative_to(docs).parts):
            dest = inp / f.relative_to(docs)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, dest)
            n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=Path, required=True)
    p.add_argument("--root", type=Path, required=True, help="GraphRAG project folder to create")
    p.add_argument("--base-url", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--concurrency", type=int, default=None,
                   help="concurrent_requests of every LLM step (GraphRAG's default: 25)")
    p.add_argument("--chunk-size", type=int, default=None,
                   help="tokens per text unit (GraphRAG's default: 1200, overlap 100)")
    p.add_argument("--chunk-overlap", type=int, default=100)
    p.add_argument("--claims", action="store_true",
                   help="enable GraphRAG's claim extraction (extract_claims; off by default)")
    p.add_argument("--tracemalloc", action="store_true",
                   help="leave GraphRAG's per-workflow tracemalloc on")
    args = p.parse_args()
    chunk = (args.chunk_size, args.chunk_overlap) if args.chunk_size else None
    n_docs = prepare(args.root, args.docs, args.base_url, args.concurrency, chunk,
                     args.claims)

    # LiteLLM fetches a price table from GitHub at import unless told to use its bundled copy:
    # no network in a benchmark.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if not args.tracemalloc:
        tracemalloc.start = lambda *a, **k: None  # type: ignore[assignment]
    t_imp = time.perf_counter()
    from graphrag.api import build_index  # type: ignore[import-not-found]
    from graphrag.config.load_config import load_config  # type: ignore[import-not-found]

    config = load_config(args.root)
    imports_s = time.perf_counter() - t_imp
    t0 = time.perf_counter()
    c0 = time.process_time()
    results = asyncio.run(build_index(config=config))
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    errors = [f"{r.workflow}: {r.error!r}"[:500] for r in results if r.error is not None]
    tables: dict[str, int] = {}
    import pyarrow.parquet as pq

    for f in sorted((args.root / "output").glob("*.parquet")):
        tables[f.stem] = pq.ParquetFile(f).metadata.num_rows
    args.out.write_text(json.dumps({
        "system": "Microsoft GraphRAG " + _version(),
        "documents_in": n_docs,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "imports_s": round(imports_s, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "vm_hwm_mb": _hwm_mb(),
        "tracemalloc": bool(args.tracemalloc),
        "workflows": [r.workflow for r in results],
        "errors": errors,
        "tables": tables,
        "output_dir": str(args.root / "output"),
    }))


def _version() -> str:
    from importlib.metadata import version

    return version("graphrag")


if __name__ == "__main__":
    main()
