"""How many text units the chunker makes, how full they are, and how many an edit changes
(issue 35, "fewer, fuller calls"), for one or more checkouts side by side.

    python benchmarks/chunk_units.py                               # this checkout
    python benchmarks/chunk_units.py --repo . --repo /tmp/old-main  # two chunkers, one run

For each checkout (`--repo`, a folder holding canopy's sources; each is run in a child process
with that folder first on sys.path), at 1,200/100 tokens:
- the units of the first `--articles` MultiHop-RAG articles (written as the benchmarks write
  them: `# title`, a blank line, the body), beside the windows Microsoft GraphRAG's token splitter
  makes of the same text (1,200 tokens with 100 of overlap: a window every 1,100 tokens; 277 for
  the first 100 articles in its own run, `benchmarks/build_floor.py`), and the units' mean tokens;
- A Christmas Carol's units;
- edit locality: `--edits` times, one paragraph of over 120 characters (seeded choice) of A
  Christmas Carol, or of a MultiHop-RAG article of more than one unit, gets a clause inserted in
  its middle; printed is how many unit ids the edited text has that the original had not (the
  units an update extracts again), as a mean and a distribution.

JSON to --out (default benchmarks/results/chunk_units.json).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = REPO.parent / "shared" / "eval-data"
NEWS = SHARED / "multihop-rag" / "corpus.json"
CAROL = SHARED / "books" / "christmas_carol_pg24022.txt"
CLAUSE = " (an inserted clause, written for this benchmark) "


def _measure(articles: int, edits: int, seed: int) -> dict[str, Any]:
    from canopy.indexer.operations.chunking import chunk_document
    from canopy.tokenizer import get_tokenizer

    tok = get_tokenizer()
    docs = [f"# {a['title']}\n\n{a['body']}\n"
            for a in json.loads(NEWS.read_text(encoding="utf-8"))[:articles]]
    carol = CAROL.read_text(encoding="utf-8")

    def ids(text: str) -> list[str]:
        return [u.id for u in chunk_document("doc", text, tok, max_tokens=1200, overlap=100)]

    units = [u for i, d in enumerate(docs)
             for u in chunk_document(f"doc-{i}", d, tok, max_tokens=1200, overlap=100)]
    windows = sum(max(1, -(-(tok.count(d) - 100) // 1100)) for d in docs)
    rng = random.Random(seed)

    def locality(texts: list[str]) -> list[int]:
        changed = []
        for _ in range(edits):
            text = rng.choice(texts)
            paras = text.split("\n\n")
            i = rng.choice([k for k, p in enumerate(paras) if len(p) > 120])
            mid = len(paras[i]) // 2
            paras[i] = paras[i][:mid] + CLAUSE + paras[i][mid:]
            changed.append(len(set(ids("\n\n".join(paras))) - set(ids(text))))
        return changed

    multi = [d for d in docs if len(ids(d)) > 1]
    out: dict[str, Any] = {
        "articles": len(docs), "units": len(units), "fixed_windows": windows,
        "units_per_window": round(len(units) / windows, 3),
        "mean_unit_tokens": round(statistics.mean(u.n_tokens for u in units), 1),
        "carol_units": len(ids(carol))}
    for name, texts in (("carol", [carol]), ("multihop", multi)):
        changed = locality(texts)
        out[f"{name}_edit_changed_mean"] = round(statistics.mean(changed), 3)
        out[f"{name}_edit_changed"] = dict(sorted(Counter(changed).items()))
    return out


def _commit(repo: Path) -> str:
    run = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--", "indexer"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return (run.stdout.strip() or "?") + ("+dirty" if dirty else "")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repo", type=Path, action="append",
                   help="a checkout to measure (repeat; default: this one)")
    p.add_argument("--articles", type=int, default=100)
    p.add_argument("--edits", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE / "results" / "chunk_units.json")
    p.add_argument("--_child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child:
        print(json.dumps(_measure(args.articles, args.edits, args.seed)))
        return
    rows = []
    for repo in [r.resolve() for r in (args.repo or [REPO])]:
        code = (f"import runpy, sys; sys.path.insert(0, {str(repo)!r}); "
                f"sys.argv = ['chunk_units', '--_child', '--articles', '{args.articles}', "
                f"'--edits', '{args.edits}', '--seed', '{args.seed}']; "
                f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             check=True, cwd=repo)
        row = {"repo": str(repo), "commit": _commit(repo), **json.loads(run.stdout)}
        rows.append(row)
        print(f"{row['commit']}: {row['units']} units of {row['articles']} articles "
              f"({row['fixed_windows']} fixed 1,200/100 windows, {row['units_per_window']}x), "
              f"{row['mean_unit_tokens']} tokens each; A Christmas Carol {row['carol_units']}; "
              f"an edit changes {row['carol_edit_changed_mean']} units of the Carol "
              f"{row['carol_edit_changed']}, {row['multihop_edit_changed_mean']} of an article "
              f"{row['multihop_edit_changed']}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "python benchmarks/chunk_units.py " + " ".join(
            argv if argv is not None else sys.argv[1:]), "rows": rows}, indent=2) + "\n",
        encoding="utf-8")


if __name__ == "__main__":
    main()
