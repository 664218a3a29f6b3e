"""Index folder growth per edit: the bundled example corpus, then N one-paragraph edits, each
followed by an incremental `build_index`, with the fake OpenAI-compatible LLM (so the response
cache grows as it would with a real endpoint).

Prints a markdown table: folder size (SQLite file + WAL + search tables) after the build and
after each edit, and the mean growth per edit over the second half of the edits (the first
ones also pay for index structures created once).

    python benchmarks/edit_growth.py [--edits 20] [--keep-versions-s 600] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from canopy.server.runtime import build_index, open_workspace
from tests.fakes.openai_server import FakeOpenAI

EXAMPLES = REPO / "examples" / "docs"
TARGETS = ("projects/kestrel.md", "projects/tern.md", "suppliers/helio_cells.md",
           "events/tern_recall.md", "overview.md")


def folder_bytes(index_dir: Path) -> dict[str, int]:
    """Bytes on disk by part: the SQLite database, its WAL, and the search tables."""
    def size(p: Path) -> int:
        if p.is_file():
            return p.stat().st_size
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.exists() else 0

    return {"sqlite": size(index_dir / "canopy.sqlite"),
            "wal": size(index_dir / "canopy.sqlite-wal"), "lance": size(index_dir / "lance")}


def edit(docs: Path, i: int) -> None:
    """Append one new paragraph to one of a few documents, in turn."""
    path = docs / TARGETS[i % len(TARGETS)]
    paragraph = (f"\n\nUpdate {i}: Marguerite Vasquez-{i} of Northwind Analytics reviewed batch "
                 f"{1000 + i} with the Kestrel team in Lisbon and found {i + 3} open issues.\n")
    path.write_text(path.read_text(encoding="utf-8") + paragraph, encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--edits", type=int, default=20)
    ap.add_argument("--keep-versions-s", type=float, default=None,
                    help="[storage] keep_versions_s for the runs (default: the setting's default)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    for key in list(os.environ):
        if key.startswith(("CANOPY_", "OPENAI_")):
            del os.environ[key]
    tmp = Path(tempfile.mkdtemp(prefix="canopy-edit-growth-"))
    docs, index_dir = tmp / "docs", tmp / "index"
    shutil.copytree(EXAMPLES, docs)
    overrides: dict = {"extract": {"max_gleanings": 0}}
    if args.keep_versions_s is not None:
        overrides["storage"] = {"keep_versions_s": args.keep_versions_s}
    rows = []
    with FakeOpenAI() as fake:
        overrides["llm"] = {"base_url": fake.base_url, "max_retries": 1, "backoff_s": 0.01}
        for step in range(args.edits + 1):
            if step:
                edit(docs, step)
            started = time.perf_counter()
            build_index(open_workspace(docs, index_dir=index_dir, **overrides))
            sizes = folder_bytes(index_dir)
            rows.append({"step": step, "seconds": round(time.perf_counter() - started, 2), **sizes,
                         "total": sum(sizes.values())})
            print(f"step {step}: {rows[-1]}", file=sys.stderr)
    half = rows[len(rows) // 2:]
    per_edit = (half[-1]["total"] - half[0]["total"]) / max(1, len(half) - 1)
    print("| step | s | sqlite KB | wal KB | lance KB | total KB |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['step']} | {r['seconds']} | {r['sqlite'] // 1024} | {r['wal'] // 1024} | "
              f"{r['lance'] // 1024} | {r['total'] // 1024} |")
    print(f"\nmean growth per edit (second half): {per_edit / 1024:.0f} KB; "
          f"total after the build {rows[0]['total'] // 1024} KB, after {args.edits} edits "
          f"{rows[-1]['total'] // 1024} KB")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "per_edit_bytes": per_edit}, indent=2))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
