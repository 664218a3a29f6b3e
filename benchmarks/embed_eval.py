"""The builtin embedders against each other: hashing (`[embed] builtin = "hash"`, the default)
and WordLlama's static vectors (`"wordllama"`, `pip install 'canopy-graphrag[static]'`), on the
DEV questions of MultiHop-RAG and MuSiQue, scored as `canopy eval` scores them.

    python benchmarks/embed_eval.py --flip                # both datasets, both embedders
    python benchmarks/embed_eval.py --datasets musique --embedders wordllama --work /tmp/ee

Corpora (written once under --work, default /tmp/canopy-embed-eval):
- multihop-rag: the 609 articles of ../shared/eval-data/multihop-rag/corpus.json, one
  "# {title}\\n\\n{body}" .md each (benchmarks/incremental_bench.py:write_articles); the first
  --limit (200) DEV questions of MultiHopRAG.json;
- musique: the 1,890 paragraphs of ../shared/eval-data/multihop-qa/musique, one
  "# {title}\\n\\n{text}" .md each; its DEV questions (82).
Only DEV questions are ever loaded (canopy.server.wings.eval.retrieval.split_of).

Per dataset and embedder: a full build with the builtin provider in a fresh process (wall time,
the vectors stage's time, the process's peak RSS), then, in another fresh process, the tools
scored by canopy.server.wings.eval.retrieval.evaluate (`canopy eval`'s: local and basic as an MCP
client receives their results) plus `vector`: the vector ranking alone (the search table's
vector search, no full-text), with R@2/5/10, All@10 and each tool's per-question latency (p50,
p90; the query's embedding included, and for local and basic the whole tool call) and the
process's peak RSS. `--flip` also scores local and basic with WordLlama's `lexical` flag
flipped: its ranking fused at full weight (`local:full-weight`, `basic:full-weight`), as the
engines fuse an endpoint's, instead of adding candidates only as the hash embedder's does.

Output: markdown tables on stdout and JSON in benchmarks/results/embed_eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DATA = REPO.parent / "shared" / "eval-data"
DATASETS = {
    "multihop-rag": (DATA / "multihop-rag" / "corpus.json", DATA / "multihop-rag" /
                     "MultiHopRAG.json", "multihop-rag"),
    "musique": (DATA / "multihop-qa" / "musique" / "musique_train_100_corpus.json",
                DATA / "multihop-qa" / "musique" / "musique_train_100.json", "musique"),
}
EMBEDDERS = ("hash", "wordllama")
TOOLS = ("local", "basic", "bm25", "vector")
KS = (2, 5, 10)
RESULTS = REPO / "benchmarks" / "results"


def _slug(i: int, title: str) -> str:
    return f"{i:04d}-" + re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:50] + ".md"


def write_docs(dataset: str, docs: Path) -> None:
    """The corpus as one .md per article / paragraph (once)."""
    if docs.is_dir() and any(docs.glob("*.md")):
        return
    docs.mkdir(parents=True, exist_ok=True)
    corpus = json.loads(DATASETS[dataset][0].read_text(encoding="utf-8"))
    if dataset == "multihop-rag":
        from benchmarks.incremental_bench import write_articles

        write_articles(docs, corpus)
        return
    for i, p in enumerate(corpus):
        (docs / _slug(i, p["title"])).write_text(f"# {p['title']}\n\n{p['text']}",
                                                 encoding="utf-8")


def _env(embedder: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["CANOPY_EMBED__BUILTIN"] = embedder
    env["HF_HUB_OFFLINE"] = "1"  # nothing may be downloaded
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _peak_mb() -> float:
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def _cpu_s() -> float:
    """CPU seconds of this process (all threads): steadier than wall time on a busy machine."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# ---- child processes ---------------------------------------------------------------------------


def child_build(docs: Path, index_dir: Path) -> dict[str, Any]:
    from canopy.server.runtime import build_index, open_workspace

    t0, c0 = time.perf_counter(), _cpu_s()
    result = build_index(open_workspace(docs, index_dir=index_dir), full=True)
    return {"seconds": round(time.perf_counter() - t0, 1), "cpu_s": round(_cpu_s() - c0, 1),
            "vectors_s": result.stats["seconds"].get("vectors"),
            "embedded": result.stats.get("embedded"), "text_units": result.stats["text_units"],
            "entities": result.stats["entities"], "reports": result.stats["reports"],
            "peak_mb": _peak_mb()}


def child_eval(docs: Path, index_dir: Path, questions_path: Path, fmt: str, limit: int | None,
               flip: bool) -> dict[str, Any]:
    import canopy.server.wings.eval.retrieval as ev
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    asked = [q for q in ev.load_questions(questions_path, fmt)
             if ev.split_of(q.text) == "dev"][:limit]
    assert all(ev.split_of(q.text) == "dev" for q in asked)
    service = CanopyService(open_workspace(docs, index_dir=index_dir))
    out: dict[str, Any] = {"questions": len(asked), "tools": {},
                           "embedder": service.embedder.name}
    try:
        scores = [(s.tool, s) for s in ev.evaluate(service, asked, list(TOOLS), list(KS))]
        if flip and service.embedder.name.startswith("builtin-wordllama"):
            lexical = not getattr(service.embedder, "lexical", False)
            service.embedder.lexical = lexical  # type: ignore[attr-defined]
            tag = "lexical" if lexical else "full-weight"
            scores += [(f"{s.tool}:{tag}", s)
                       for s in ev.evaluate(service, asked, ["local", "basic"], list(KS))]
    finally:
        service.close()
    for name, s in scores:  # local and basic as delivered to an MCP client (canopy eval)
        out["tools"][name] = {**{f"R@{k}": s.recall[k] for k in KS}, "All@10": s.all[10],
                              "p50_ms": s.p50_ms, "p90_ms": s.p90_ms}
    out["peak_mb"] = _peak_mb()
    return out


def child_throughput(docs: Path) -> dict[str, Any]:
    """CPU seconds each builtin embedder takes over the corpus's files (one text each), in one
    process, after loading: the embedding cost alone, apart from the rest of a build."""
    from canopy.providers.builtin import HashEmbedder
    from canopy.providers.builtin.static import WordLlamaEmbedder

    texts = [p.read_text(encoding="utf-8") for p in sorted(docs.glob("*.md"))]
    out: dict[str, Any] = {"texts": len(texts), "mb": round(sum(map(len, texts)) / 1e6, 1)}
    for name, make in (("hash", HashEmbedder), ("wordllama", WordLlamaEmbedder)):
        c0 = time.process_time()
        embedder = make()
        loaded = time.process_time()
        for start in range(0, len(texts), 512):
            embedder.embed_sync(texts[start:start + 512])
        out[name] = {"load_cpu_s": round(loaded - c0, 2),
                     "embed_cpu_s": round(time.process_time() - loaded, 2)}
    return out


# ---- the driver ------------------------------------------------------------------------------


def _child(args: list[str], embedder: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, *args], env=_env(embedder),
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"child {args[:2]} failed")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: dict[str, Any]) -> str:
    lines = ["| dataset | embedder | tool | R@2 | R@5 | R@10 | All@10 | p50 ms | p90 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for dataset, by_embedder in results.items():
        for embedder, r in by_embedder.items():
            for tool, s in r["eval"]["tools"].items():
                lines.append(f"| {dataset} | {embedder} | {tool} | {s['R@2']:.3f} | "
                             f"{s['R@5']:.3f} | {s['R@10']:.3f} | {s['All@10']:.3f} | "
                             f"{s['p50_ms']} | {s['p90_ms']} |")
    lines += ["", "| dataset | embedder | build s | build CPU s | vectors stage s | "
              "build peak MB | query process peak MB |", "|---|---|---|---|---|---|---|"]
    for dataset, by_embedder in results.items():
        for embedder, r in by_embedder.items():
            b = r["build"]
            lines.append(f"| {dataset} | {embedder} | {b['seconds']} | {b['cpu_s']} | "
                         f"{b['vectors_s']} | "
                         f"{b['peak_mb']} | {r['eval']['peak_mb']} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child-build":
        print(json.dumps(child_build(Path(sys.argv[2]), Path(sys.argv[3]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-throughput":
        print(json.dumps(child_throughput(Path(sys.argv[2]))))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--child-eval":
        _, _, docs, index_dir, questions, fmt, limit, lexical = sys.argv
        print(json.dumps(child_eval(Path(docs), Path(index_dir), Path(questions), fmt,
                                    int(limit) or None, lexical == "1")))
        return
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/canopy-embed-eval"))
    ap.add_argument("--datasets", default=",".join(DATASETS))
    ap.add_argument("--embedders", default=",".join(EMBEDDERS))
    ap.add_argument("--limit", type=int, default=200, help="first N DEV questions (0: all)")
    ap.add_argument("--rebuild", action="store_true", help="build even if an index exists")
    ap.add_argument("--flip", action="store_true",
                    help="also score local and basic with WordLlama's `lexical` flag flipped "
                    "(full-weight fusion of its ranking instead of candidates / weight 0.1)")
    ap.add_argument("--no-eval", action="store_true",
                    help="only the embedding-alone CPU times (and the table of saved results)")
    ap.add_argument("--out", type=Path, default=RESULTS / "embed_eval.json")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    throughput: dict[str, Any] = {}
    if args.out.exists():
        saved = json.loads(args.out.read_text(encoding="utf-8"))
        results, throughput = saved.get("results", {}), saved.get("throughput", {})
    for dataset in args.datasets.split(","):
        _, questions, fmt = DATASETS[dataset]
        docs = args.work / dataset / "docs"
        write_docs(dataset, docs)
        throughput[dataset] = _child(["--child-throughput", str(docs)], "hash")
        print(f"{dataset}: embedding alone {throughput[dataset]}", file=sys.stderr)
        if args.no_eval:
            continue
        for embedder in args.embedders.split(","):
            index_dir = args.work / dataset / f"index-{embedder}"
            entry = results.setdefault(dataset, {}).setdefault(embedder, {})
            if args.rebuild or not (index_dir / "canopy.sqlite").exists() or "build" not in entry:
                print(f"{dataset}/{embedder}: building …", file=sys.stderr)
                entry["build"] = _child(["--child-build", str(docs), str(index_dir)], embedder)
                print(f"  {entry['build']}", file=sys.stderr)
            print(f"{dataset}/{embedder}: evaluating …", file=sys.stderr)
            entry["eval"] = _child(["--child-eval", str(docs), str(index_dir), str(questions),
                                    fmt, str(args.limit), "1" if args.flip else "0"],
                                   embedder)
            print(f"  {entry['eval']}", file=sys.stderr)
            _save(args.out, results, throughput)
    _save(args.out, results, throughput)
    print(table(results))
    for dataset, t in throughput.items():
        print(f"\n{dataset}: {t['texts']} files ({t['mb']} MB) embedded alone, CPU s: "
              + ", ".join(f"{e} {t[e]['embed_cpu_s']} (load {t[e]['load_cpu_s']})"
                          for e in EMBEDDERS))


def _save(out: Path, results: dict[str, Any], throughput: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"results": results, "throughput": throughput,
                               "cpus": os.cpu_count(), "date": time.strftime("%Y-%m-%d")},
                              indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
