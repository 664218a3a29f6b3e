"""Retrieval quality on MultiHop-RAG: evidence-article Hits@4 / Hits@10 of local_search's context
against basic_search's and against plain BM25 / vector / hybrid retrieval over text units.

    python benchmarks/retrieval_eval.py                          # DEV questions, every system
    python benchmarks/retrieval_eval.py --limit 200              # quick look
    python benchmarks/retrieval_eval.py --index-dir /tmp/mh/idx  # reuse an index (built if missing)

Corpus and index: the 609 MultiHop-RAG articles (../shared/eval-data/multihop-rag/corpus.json),
one .md per article, "# {title}\\n\\n{body}" (benchmarks/incremental_bench.py:write_articles;
with --front-matter, the article's source, author, date and category open it as YAML front
matter, which Canopy puts in every unit's header), indexed with the builtin offline provider and
the builtin embedder. Without --index-dir the index is built into a temp folder (~1 min) and
removed afterwards.

Questions: MultiHopRAG.json, 2,556 queries. Split by a hash of the query text: DEV is every query
with int(sha256(query).hexdigest(), 16) % 5 != 0 (2,045 queries). Only DEV is ever run: the rest
is evaluated outside the team, so this script cannot load it. Null queries (empty evidence_list)
are skipped: they have no evidence.

Metric (per system and query):
1. take the text units the system returns, in rank order: for the tools, exactly the
   `text_unit` blocks of the context they build, in the order the tool renders them into
   `context` (their `citations` list puts the units the answer mentions first, so it is not a
   ranking); the context-building functions are called directly, without answer generation;
2. map each unit to its article (unit -> document -> corpus article, by the file's number
   prefix, since document titles are cut at 120 characters) and dedupe, keeping the first
   occurrence: a ranked list of articles;
3. Hits@k = |evidence articles ∩ top-k articles| / |evidence articles| (evidence articles = the
   distinct titles of the query's evidence_list), averaged over queries; All@k = the fraction
   of queries with every evidence article in the top k.

Systems (same index, same builtin embeddings):
- `bm25`, `vector`: LanceDB full-text (BM25) or vector search alone over text units (each unit
  is indexed as "{document title}\\n{unit text}", indexer/embeddings.py), top 50 units;
- `hybrid`: both fused by reciprocal rank fusion with equal weights (VectorStore.search), top 50;
- `hybrid_weighted`: the same with the vector ranking weighted LEXICAL_VECTOR_WEIGHT (0.1), as
  basic_search now does with the builtin (lexical) embedder;
- `basic_search`: the units basic_search (default k=10) puts into its context
  (basic_engine.basic_context: k units packed into ctx.settings.local_context_tokens);
- `local_ranking`: local_search's text-unit ranking (evidence.rank_units) before the budget;
- `minilm`, `bm25_minilm`, `local_minilm` (only with --minilm-model): a sentence-transformers
  model's ranking of the units alone, fused with bm25 (the issue's "BM25 + MiniLM" reference
  setup), and fused with local_ranking, by equal-weight reciprocal rank fusion;
- `local_search`: the text units of local_search's context (build_local_context with
  ctx.settings.local_context_tokens, 8000 by default).
`articles` in the table is the mean number of distinct articles a system returns: the context's
for the tools, the ranking depth's for the others.
Reference (the issue): naive chunk retrieval reaches Hits@10 0.832 (BM25 + MiniLM fused) and
0.858 (BM25 over chunks carrying their article title).

Output: a markdown table on stdout (progress on stderr) and JSON in
benchmarks/results/retrieval_eval.json (per split and system: hits@4, hits@10, all@4, all@10,
mean articles and tokens in context, ms per query).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVAL_DATA = REPO.parent / "shared" / "eval-data" / "multihop-rag"
CORPUS = EVAL_DATA / "corpus.json"
QUESTIONS = EVAL_DATA / "MultiHopRAG.json"
RESULTS = REPO / "benchmarks" / "results"
DEPTH = 50  # units retrieved by the bm25 / vector / hybrid rankings
REFERENCE = {"BM25 + MiniLM fused (issue)": 0.832, "BM25 over titled chunks (issue)": 0.858}


# ---- data, split, index ---------------------------------------------------------------------


def is_dev(query: str) -> bool:
    from canopy.server.evaluation import split_of

    return split_of(query) == "dev"


def load_questions(split: str = "dev") -> list[dict[str, Any]]:
    """The DEV questions that have evidence (the only split there is to load)."""
    if split != "dev":
        raise ValueError("only DEV questions are evaluated here; the rest is held out")
    data = json.loads(QUESTIONS.read_text(encoding="utf-8"))
    return [q for q in data if q["evidence_list"] and is_dev(q["query"])]


def _clean_env() -> None:
    for key in list(os.environ):
        if key.startswith(("CANOPY_", "OPENAI_")):
            del os.environ[key]


@contextmanager
def multihop_index(
    index_dir: Path | None, front_matter: bool = False
) -> Iterator[tuple[Path, Path]]:
    """(docs folder, index folder) of the 609-article builtin index: `index_dir` if it holds
    one (its docs folder is taken from the index), else built there, or in a temp folder that
    is removed afterwards."""
    _clean_env()
    from benchmarks.incremental_bench import write_articles
    from canopy.server.runtime import build_index, open_workspace

    tmp = None
    if index_dir is None:
        tmp = Path(tempfile.mkdtemp(prefix="canopy-mh-"))
        index_dir = tmp / "idx"
    index_dir = index_dir.resolve()
    docs = _docs_of(index_dir) or index_dir.parent / (index_dir.name + "-docs")
    try:
        if not (index_dir / "canopy.sqlite").exists() or not docs.is_dir():
            articles = json.loads(CORPUS.read_text(encoding="utf-8"))
            docs.mkdir(parents=True, exist_ok=True)
            if not any(docs.glob("*.md")):
                write_articles(docs, articles, front_matter=front_matter)
            print(f"building the index of {len(articles)} articles in {index_dir} …",
                  file=sys.stderr)
            t0 = time.perf_counter()
            result = build_index(open_workspace(docs, index_dir=index_dir), full=True)
            print(f"  built in {time.perf_counter() - t0:.0f} s: {result.stats['text_units']} "
                  "text units", file=sys.stderr)
        yield docs, index_dir
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _docs_of(index_dir: Path) -> Path | None:
    """The documents folder an existing index was built from (recorded in its store)."""
    import sqlite3

    db = index_dir / "canopy.sqlite"
    if not db.exists():
        return None
    with sqlite3.connect(db) as con:
        row = con.execute("SELECT value FROM meta WHERE key = 'docs_dir'").fetchone()
    return Path(row[0]) if row and Path(row[0]).is_dir() else None


def open_context(docs: Path, index_dir: Path):  # type: ignore[no-untyped-def]
    """A CanopyService over the index and an unrestricted QueryContext of the builtin provider."""
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    service = CanopyService(open_workspace(docs, index_dir=index_dir))
    # One snapshot for the whole evaluation (the index does not change meanwhile).
    return service, service.context(None).__enter__()


def article_of_units(ctx) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """unit id -> corpus article title (documents are "NNN-slug.md", NNN = corpus index)."""
    from canopy.store.export import load_graph

    g = load_graph(ctx.reader.views.store)
    articles = json.loads(CORPUS.read_text(encoding="utf-8"))
    title_of_doc: dict[str, str] = {}
    for d in g.documents.values():
        m = re.match(r"(\d+)-", Path(d.path).name)
        title_of_doc[d.id] = articles[int(m.group(1))]["title"] if m else d.title
    return {u.id: title_of_doc[u.document_id] for u in g.units.values()}


# ---- the systems ------------------------------------------------------------------------------


def _table_ranking(ctx, query: str, mode: str) -> list[str]:  # type: ignore[no-untyped-def]
    from canopy.vectors import _WORD

    table = ctx.reader._vectors.tables["text_units"]
    if mode == "vector":
        vector = ctx.reader.embedder.embed_sync([query])[0]
        q = table.search(vector, query_type="vector").limit(DEPTH).select(["id", "_distance"])
    else:
        q = table.search(" ".join(_WORD.findall(query)), query_type="fts").limit(DEPTH)
        q = q.select(["id", "_score"])
    return [r["id"] for r in q.to_list()]


def system_units(ctx, name: str) -> Callable[[str], list[str]]:  # type: ignore[no-untyped-def]
    """query -> the system's text-unit ids in rank order."""
    from canopy.server.engines.evidence import LEXICAL_VECTOR_WEIGHT, rank_units
    from canopy.server.evaluation import unit_ranking

    if name in ("bm25", "vector"):
        return lambda q: _table_ranking(ctx, q, name)
    if name in ("hybrid", "hybrid_weighted"):
        weight = 1.0 if name == "hybrid" else LEXICAL_VECTOR_WEIGHT

        def hybrid(q: str) -> list[str]:
            vector = ctx.reader.embedder.embed_sync([q])[0]
            return [h.id for h in asyncio.run(ctx.reader.search(
                "text_units", vector=vector, text=q, k=DEPTH, vector_weight=weight))]
        return hybrid
    if name == "basic_search":  # the tool's context, default k (canopy eval's `basic`)
        return unit_ranking(ctx, "basic")
    if name == "local_ranking":
        def ranking(q: str) -> list[str]:
            return asyncio.run(rank_units(ctx, q, ctx.reader.embedder.embed_sync([q])[0]))
        return ranking
    if name in MINILM_SYSTEMS:
        from canopy.vectors import rrf

        minilm = _MINILM[0]
        if name == "minilm":
            return minilm.ranking
        other = system_units(ctx, "bm25" if name == "bm25_minilm" else "local_ranking")
        return lambda q: [h.id for h in rrf(other(q), minilm.ranking(q))]
    if name == "local_search":  # the units of the tool's context (canopy eval's `local`)
        return unit_ranking(ctx, "local")
    raise ValueError(name)


SYSTEMS = ("bm25", "vector", "hybrid", "hybrid_weighted", "basic_search", "local_ranking",
           "local_search")
MINILM_SYSTEMS = ("minilm", "bm25_minilm", "local_minilm")


class MiniLM:
    """A sentence-transformers model (e.g. all-MiniLM-L6-v2) over the index's text units, each
    embedded as it is indexed ("{header}\\n{text}"; the model truncates at its max_seq_length).
    Unit vectors are cached beside the index. Needs `pip install sentence-transformers` (and a
    CPU torch); the model folder is given with --minilm-model."""

    def __init__(self, ctx, model_dir: Path, cache: Path) -> None:  # type: ignore[no-untyped-def]
        import numpy as np
        from sentence_transformers import SentenceTransformer

        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.model = SentenceTransformer(str(model_dir), device="cpu")
        from canopy.store.export import load_graph

        g = load_graph(ctx.reader.views.store)
        self.ids = sorted(g.units)
        key = hashlib.sha256(("\n".join(self.ids) + str(model_dir)).encode()).hexdigest()[:16]
        path = cache / f"minilm-units-{key}.npy"
        if path.exists():
            self.units = np.load(path)
        else:
            print(f"embedding {len(self.ids)} units with {model_dir} …", file=sys.stderr)
            texts = [f"{g.documents[g.units[u].document_id].header()}\n{g.units[u].text}"
                     for u in self.ids]
            self.units = self.model.encode(texts, batch_size=32, normalize_embeddings=True)
            np.save(path, self.units)

    def ranking(self, query: str, k: int = DEPTH) -> list[str]:
        import numpy as np

        q = self.model.encode([query], normalize_embeddings=True)[0]
        return [self.ids[i] for i in np.argsort(-(self.units @ q))[:k]]


_MINILM: list[MiniLM] = []


# ---- scoring ------------------------------------------------------------------------------------


def ranked_articles(unit_ids: list[str], article: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(article[u] for u in unit_ids if u in article))


def score(questions: list[dict[str, Any]], rankings: list[list[str]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for k in (4, 10):
        hits, full = 0.0, 0
        for q, ranking in zip(questions, rankings, strict=True):
            evidence = {e["title"] for e in q["evidence_list"]}
            found = len(evidence & set(ranking[:k]))
            hits += found / len(evidence)
            full += found == len(evidence)
        out[f"hits@{k}"] = round(hits / len(questions), 4)
        out[f"all@{k}"] = round(full / len(questions), 4)
    out["articles"] = round(sum(len(r) for r in rankings) / len(rankings), 1)
    return out


def evaluate(ctx: Any, questions: list[dict[str, Any]], systems: list[str],
             article: dict[str, str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for name in systems:
        run = system_units(ctx, name)
        rankings, t0 = [], time.perf_counter()
        for i, q in enumerate(questions):
            rankings.append(ranked_articles(run(q["query"]), article))
            if (i + 1) % 200 == 0:
                print(f"  {name}: {i + 1}/{len(questions)}", file=sys.stderr)
        ms = (time.perf_counter() - t0) * 1000 / max(len(questions), 1)
        results[name] = {**score(questions, rankings), "ms_per_query": round(ms, 1)}
        by_type: dict[str, list[int]] = {}
        for i, q in enumerate(questions):
            by_type.setdefault(q["question_type"], []).append(i)
        results[name]["by_type"] = {
            t: score([questions[i] for i in ix], [rankings[i] for i in ix])["hits@10"]
            for t, ix in sorted(by_type.items())}
        print(f"  {name}: {results[name]}", file=sys.stderr)
    return results


def table(split: str, n: int, results: dict[str, dict[str, Any]]) -> str:
    lines = [f"\n**{split}** ({n} questions with evidence)\n",
             "| system | Hits@4 | Hits@10 | All@4 | All@10 | articles in context | ms/query |",
             "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['hits@4']:.3f} | {r['hits@10']:.3f} | {r['all@4']:.3f} | "
                     f"{r['all@10']:.3f} | {r['articles']} | {r['ms_per_query']} |")
    for label, value in REFERENCE.items():
        lines.append(f"| {label} | | {value:.3f} | | | | |")
    types = sorted({t for r in results.values() for t in r["by_type"]})
    lines += ["", "Hits@10 by question type:", "",
              "| system | " + " | ".join(types) + " |", "|---|" + "---|" * len(types)]
    for name, r in results.items():
        lines.append(f"| {name} | " + " | ".join(f"{r['by_type'].get(t, 0):.3f}" for t in types)
                     + " |")
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "commit": git("rev-parse", "--short", "HEAD")
            + ("+dirty" if git("status", "--porcelain") else ""),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="reuse (or build into) this index folder; default: a temp folder")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of "
                    + ", ".join(SYSTEMS))
    ap.add_argument(
        "--front-matter",
        action="store_true",
        help="write each article with its corpus metadata (source, author, date, category) "
        "as YAML front matter; default: title and body only, as in the issue's references",
    )
    ap.add_argument("--minilm-model", type=Path, default=None,
                    help="a sentence-transformers model folder (e.g. all-MiniLM-L6-v2) for the "
                    "systems " + ", ".join(MINILM_SYSTEMS)
                    + " (needs sentence-transformers installed)")
    ap.add_argument("--limit", type=int, default=None, help="first N DEV questions")
    ap.add_argument("--out", type=Path, default=None, help="default: benchmarks/results/"
                    "retrieval_eval.json (retrieval_eval_front_matter.json with --front-matter)")
    args = ap.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    splits = ["dev"]
    if args.out is None:
        args.out = RESULTS / ("retrieval_eval_front_matter.json" if args.front_matter
                              else "retrieval_eval.json")

    t0 = time.perf_counter()
    report: dict[str, Any] = {"machine": machine(), "splits": {}}
    with multihop_index(args.index_dir, args.front_matter) as (docs, index_dir):
        service, ctx = open_context(docs, index_dir)
        article = article_of_units(ctx)
        if any(s in MINILM_SYSTEMS for s in systems):
            if args.minilm_model is None:
                ap.error("the minilm systems need --minilm-model DIR")
            _MINILM.append(MiniLM(ctx, args.minilm_model, index_dir))
        for split in splits:
            questions = load_questions(split)[: args.limit]
            print(f"{split}: {len(questions)} questions", file=sys.stderr)
            results = evaluate(ctx, questions, systems, article)
            report["splits"][split] = {"questions": len(questions), "systems": results}
            print(table(split, len(questions), results))
        service.close()
    report["settings"] = {"local_context_tokens": ctx.settings.local_context_tokens,
                          "front_matter": args.front_matter,
                          "depth": DEPTH, "limit": args.limit}
    report["reference_hits@10"] = REFERENCE
    report["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    print(f"\n{report['seconds']} s; JSON written to {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
