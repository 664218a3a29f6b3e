"""Retrieval as the agent receives it, on the DEV questions of MultiHop-RAG and MuSiQue:
local_search and basic_search as an MCP client gets their results, beside plain BM25 and
local_search's ranking before assembly (canopy.server.wings.eval.retrieval, what `canopy eval`
runs).

    python benchmarks/retrieval_eval.py                              # every data set, all DEV
    python benchmarks/retrieval_eval.py --datasets musique --limit 50
    python benchmarks/retrieval_eval.py --work /tmp/canopy-retrieval  # reuse corpora and indexes

Data sets (written once under --work as one .md file per article or paragraph, then indexed
with the builtin provider and embedder, default settings):
- `musique`: the 1,890 paragraphs of ../shared/eval-data/multihop-qa/musique, "# {title}\\n\\n
  {text}" each; its DEV questions (82 of 100), gold = the supporting paragraphs' titles;
- `multihop-rag`: the 609 articles of ../shared/eval-data/multihop-rag/corpus.json, "# {title}
  \\n\\n{body}" each (benchmarks/incremental_bench.py:write_articles); DEV questions with
  evidence (1,802), gold = the evidence articles' titles;
- `multihop-rag-fm`: the same articles opening with their corpus metadata (source, author,
  date, category, url) as YAML front matter, the way exported articles usually carry it.
Only DEV questions are ever loaded (canopy.server.wings.eval.retrieval.split_of): the rest is
evaluated outside the team.

Scores per tool: R@k (mean share of a question's gold documents among the first k distinct
documents), Hits@k (any), All@k (all), bridge R@k (gold documents the question does not name),
at k = 2, 5, 10, and what a delivered result carries (median documents and tokens, share cut).

Output: markdown tables on stdout (progress on stderr) and JSON in
benchmarks/results/retrieval_eval.json (the commit, the command, and per data set the scores).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The shared MultiHop-RAG helpers, re-exported for the benchmarks that import them from here.
from benchmarks.multihop import (  # noqa: F401
    RESULTS,
    _clean_env,
    load_questions,
    machine,
    multihop_index,
    open_context,
)

DATA = REPO.parent / "shared" / "eval-data"
DATASETS: dict[str, tuple[Path, Path, str, bool]] = {  # corpus, questions, format, front matter
    "musique": (DATA / "multihop-qa" / "musique" / "musique_train_100_corpus.json",
                DATA / "multihop-qa" / "musique" / "musique_train_100.json", "musique", False),
    "multihop-rag": (DATA / "multihop-rag" / "corpus.json",
                     DATA / "multihop-rag" / "MultiHopRAG.json", "multihop-rag", False),
    "multihop-rag-fm": (DATA / "multihop-rag" / "corpus.json",
                        DATA / "multihop-rag" / "MultiHopRAG.json", "multihop-rag", True),
}
TOOLS = "local,basic,bm25,local-ranking"
KS = [2, 5, 10]
RESULTS_FILE = RESULTS / "retrieval_eval.json"


def write_corpus(name: str, docs: Path) -> None:
    """The data set's documents as .md files (once)."""
    if docs.is_dir() and any(docs.glob("*.md")):
        return
    from benchmarks.embed_eval import _slug
    from benchmarks.incremental_bench import write_articles

    corpus_path, _, _, front_matter = DATASETS[name]
    corpus = json.loads(corpus_path.read_text(encoding="utf-8"))
    docs.mkdir(parents=True, exist_ok=True)
    if name.startswith("multihop-rag"):
        write_articles(docs, corpus, front_matter=front_matter)
        return
    for i, p in enumerate(corpus):
        (docs / _slug(i, p["title"])).write_text(f"# {p['title']}\n\n{p['text']}",
                                                 encoding="utf-8")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def build(docs: Path, index_dir: Path) -> None:
    """The builtin index of `docs` (once), by the CLI in a fresh process."""
    if (index_dir / "canopy.sqlite").exists():
        return
    print(f"indexing {docs} into {index_dir} …", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "canopy.server.cli", "index", str(docs),
                    "--index-dir", str(index_dir)], env=_env(), check=True,
                   stdout=subprocess.DEVNULL)


def evaluate(name: str, docs: Path, index_dir: Path, tools: list[str], limit: int | None
             ) -> dict[str, Any]:
    for key in [k for k in os.environ if k.startswith(("CANOPY_", "OPENAI_"))]:
        del os.environ[key]
    import canopy.server.wings.eval.retrieval as ev
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    _, questions_path, fmt, _ = DATASETS[name]
    asked = [q for q in ev.load_questions(questions_path, fmt)
             if ev.split_of(q.text) == "dev"][:limit]
    service = CanopyService(open_workspace(docs, index_dir=index_dir))
    try:
        began = time.perf_counter()
        scores = ev.evaluate(service, asked, tools, KS,
                             progress=lambda m: print(f"{name}: {m}", file=sys.stderr))
        return {"questions": len(asked), "provider": service.provider.name,
                "embedder": service.embedder.name,
                "result_token_limit": service.ws.settings.query.result_token_limit,
                "seconds": round(time.perf_counter() - began, 1),
                "table": ev.score_table(scores, KS),
                "scores": [ev.as_dict(s) for s in scores]}
    finally:
        service.close()


def _commit() -> str:
    out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "canopy",
                            "server", "indexer", "acl", "prompts"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return out.stdout.strip() + ("+changes" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--tools", default=TOOLS)
    parser.add_argument("--limit", type=int, default=None, help="first N DEV questions only")
    parser.add_argument("--work", type=Path, default=Path("/tmp/canopy-retrieval"))
    parser.add_argument("--out", type=Path, default=RESULTS_FILE)
    args = parser.parse_args()
    names = [n.strip() for n in args.datasets.split(",") if n.strip()]
    unknown = set(names) - set(DATASETS)
    if unknown:
        raise SystemExit(f"unknown data sets {sorted(unknown)}: use {', '.join(DATASETS)}")
    run = {"commit": _commit(), "date": time.strftime("%Y-%m-%d"),
           "command": "python benchmarks/retrieval_eval.py " + " ".join(sys.argv[1:]),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
    # A run of some data sets updates theirs and keeps the others' (each names its own run).
    report: dict[str, Any] = {"datasets": {}}
    if args.out.exists():
        report = json.loads(args.out.read_text(encoding="utf-8"))
    for name in names:
        docs, index_dir = args.work / name, args.work / f"{name}-index"
        write_corpus(name, docs)
        build(docs, index_dir)
        result = evaluate(name, docs, index_dir, args.tools.split(","), args.limit)
        report["datasets"][name] = {**run, **result}
        print(f"\n{name}: {result['questions']} DEV questions, provider {result['provider']}, "
              f"results fitted to {result['result_token_limit']} tokens")
        print("\n".join(result["table"]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)  # written after each data set
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        print(f"\nwrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
