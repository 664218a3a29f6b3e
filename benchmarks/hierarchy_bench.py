"""The top of the community hierarchy: how many top-level communities a corpus gets with the
bound (canopy.indexer.operations.grouping) and without it, side by side in one run, and what
updates cost.

    python benchmarks/hierarchy_bench.py                           # 609 articles, both modes
    python benchmarks/hierarchy_bench.py --mode builtin --articles 200
    python benchmarks/hierarchy_bench.py --mode fake --no-updates

For each mode (`builtin`: the offline provider; `fake`: the test suite's fake OpenAI-compatible
server at zero latency, in this process, behind the real `openai` client), all but the last of
the first N MultiHop-RAG articles (one .md each, as benchmarks/index_bench.py writes them) are
indexed twice: with the default bound (`[communities] max_top_level = 0`, i.e. the larger of
max_cluster_size and the square root of the text units) and unbounded (`max_top_level` set past
any corpus: the clustering as it was before the bound). Then each index is updated in turn: the
last article added, one paragraph of the first article edited, the second article deleted.

Printed per mode and setting: text units, the bound, top-level communities, communities per
level, the level partitions C0..Cn (communities at a level plus childless shallower ones),
children per top-level community, the communities stage's seconds; per update: wall seconds,
the communities stage's seconds, communities recomputed, reports generated, fake LLM requests,
top-level communities after. JSON in benchmarks/results/hierarchy_bench.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.index_bench import FAKE_LLM, materialize_multihop, slug
from benchmarks.retrieval_eval import RESULTS, machine

UNBOUNDED = 10**9  # a max_top_level no corpus reaches: every candidate stays at the top
SETTINGS = {"bounded": 0, "unbounded": UNBOUNDED}


def shape(index_dir: Path) -> dict[str, Any]:
    """Top-level communities, communities per level, level partitions and top fan-out."""
    db = sqlite3.connect(f"file:{index_dir / 'canopy.sqlite'}?mode=ro", uri=True)
    try:
        by_level = dict(db.execute("SELECT level, COUNT(*) FROM communities GROUP BY level"))
        partitions = {level: db.execute(
            "SELECT COUNT(*) FROM communities WHERE level = ? OR (level < ? AND n_children = 0)",
            (level, level)).fetchone()[0] for level in sorted(by_level)}
        tops = db.execute("SELECT n_members, n_children FROM communities WHERE parent IS NULL"
                          ).fetchall()
        units = db.execute("SELECT COUNT(*) FROM text_units").fetchone()[0]
    finally:
        db.close()
    kids = sorted(k for _, k in tops)
    return {"text_units": units, "top": len(tops), "by_level": by_level,
            "partitions": partitions, "top_children_median": statistics.median(kids or [0]),
            "top_children_max": max(kids or [0]), "largest_top": max((n for n, _ in tops),
                                                                    default=0)}


def updates(docs: Path, last: Path) -> Iterator[str]:
    """The update steps, each applied to `docs` before the generator yields its name."""
    shutil.copy(last, docs / last.name)
    yield "add 1 article"
    first = sorted(docs.glob("*.md"))[0]
    paras = first.read_text(encoding="utf-8").split("\n\n")
    paras[len(paras) // 2] += " An editor added this sentence about the Federal Reserve."
    first.write_text("\n\n".join(paras), encoding="utf-8")
    yield "edit 1 paragraph"
    sorted(docs.glob("*.md"))[1].unlink()
    yield "delete 1 article"


def run(mode: str, setting: str, corpus: Path, last: Path, work: Path, base_url: str | None,
        fake: Any, with_updates: bool) -> dict[str, Any]:
    from canopy.server.runtime import build_index, open_workspace

    docs, index = work / f"{mode}-{setting}-docs", work / f"{mode}-{setting}-index"
    shutil.copytree(corpus, docs)
    llm = {"base_url": base_url, **FAKE_LLM} if base_url else {}
    ws = open_workspace(docs, index_dir=index, llm=llm,
                        communities={"max_top_level": SETTINGS[setting]})
    t0 = time.perf_counter()
    built = build_index(ws, full=True)
    out: dict[str, Any] = {"mode": mode, "setting": setting,
                           "build_s": round(time.perf_counter() - t0, 1),
                           "communities_s": built.stats["seconds"]["communities"],
                           **shape(index), "updates": []}
    print(f"{mode}/{setting}: built in {out['build_s']} s, {out['top']} top-level",
          file=sys.stderr)
    if not with_updates:
        return out
    for name in updates(docs, last):
        before = len(fake.requests) if fake is not None else 0
        t0 = time.perf_counter()
        r = build_index(ws)
        out["updates"].append({
            "step": name, "wall_s": round(time.perf_counter() - t0, 2),
            "communities_s": r.stats["seconds"].get("communities", 0.0),
            "communities_recomputed": r.stats.get("communities_recomputed", 0),
            "reports_generated": r.stats.get("reports_generated", 0),
            "llm_requests": len(fake.requests) - before if fake is not None else None,
            "top": shape(index)["top"]})
        print(f"  {name}: {out['updates'][-1]}", file=sys.stderr)
    return out


def bench(args: argparse.Namespace) -> list[dict[str, Any]]:
    from tests.fakes.openai_server import FakeOpenAI

    for key in [k for k in os.environ if k.startswith(("CANOPY_", "OPENAI_"))]:
        del os.environ[key]  # each run configures its own endpoint
    rows = []
    with tempfile.TemporaryDirectory(prefix="canopy-hier-") as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        n = materialize_multihop(corpus, args.articles)
        last = sorted(corpus.glob("*.md"))[-1]
        held = work / last.name
        shutil.move(last, held)  # indexed by the "add 1 article" update
        print(f"{n} articles; the last, {slug(held.stem)}, is added by the first update",
              file=sys.stderr)
        for mode in (["builtin", "fake"] if args.mode == "all" else [args.mode]):
            with (FakeOpenAI(latency=0.0) if mode == "fake"
                  else contextlib.nullcontext()) as fake:
                for setting in SETTINGS:
                    rows.append(run(mode, setting, corpus, held, work,
                                    fake.base_url if fake is not None else None, fake,
                                    args.updates))
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    lines = ["## Top of the community hierarchy", "",
             "| mode | setting | text units | top-level | communities per level | level "
             "partitions C0..Cn | children per top (median / max) | largest top | build s | "
             "communities stage s |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per_level = " / ".join(str(r["by_level"][k]) for k in sorted(r["by_level"]))
        parts = " / ".join(str(r["partitions"][k]) for k in sorted(r["partitions"]))
        lines.append(f"| {r['mode']} | {r['setting']} | {r['text_units']} | {r['top']} | "
                     f"{per_level} | {parts} | {r['top_children_median']} / "
                     f"{r['top_children_max']} | {r['largest_top']} | {r['build_s']} | "
                     f"{r['communities_s']} |")
    if any(r["updates"] for r in rows):
        lines += ["", "| mode | setting | update | wall s | communities stage s | communities "
                  "recomputed | reports generated | LLM requests | top-level after |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            for u in r["updates"]:
                req = "-" if u["llm_requests"] is None else u["llm_requests"]
                lines.append(f"| {r['mode']} | {r['setting']} | {u['step']} | {u['wall_s']} | "
                             f"{u['communities_s']} | {u['communities_recomputed']} | "
                             f"{u['reports_generated']} | {req} | {u['top']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=["builtin", "fake", "all"], default="all")
    ap.add_argument("--articles", type=int, default=None,
                    help="the first N MultiHop-RAG articles (default: all 609)")
    ap.add_argument("--no-updates", dest="updates", action="store_false",
                    help="skip the add / edit / delete updates")
    ap.add_argument("--out", type=Path, default=RESULTS / "hierarchy_bench.json")
    args = ap.parse_args()
    rows = bench(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine(), "settings": {
        "mode": args.mode, "articles": args.articles, "updates": args.updates}, "runs": rows},
        indent=1), encoding="utf-8")
    print(render(rows))


if __name__ == "__main__":
    main()
