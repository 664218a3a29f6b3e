"""The MultiHop-RAG corpus and its DEV questions as the benchmarks share them: the 609 articles
indexed with the builtin provider (built once into a folder, or a temp folder), the DEV questions
with evidence, an unrestricted query context, and what a results file records of the machine."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EVAL_DATA = REPO.parent / "shared" / "eval-data" / "multihop-rag"
CORPUS = EVAL_DATA / "corpus.json"
QUESTIONS = EVAL_DATA / "MultiHopRAG.json"
RESULTS = REPO / "benchmarks" / "results"

__all__ = ["CORPUS", "QUESTIONS", "RESULTS", "load_questions", "machine", "multihop_index",
           "open_context"]


def is_dev(query: str) -> bool:
    from canopy.server.wings.eval.retrieval import split_of

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


def machine() -> dict[str, Any]:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              check=False).stdout.strip()

    return {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "commit": git("rev-parse", "--short", "HEAD")
            + ("+dirty" if git("status", "--porcelain") else ""),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
