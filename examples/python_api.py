"""Canopy's Python API (canopy.server.api.Index) on the bundled example corpus, offline: the builtin
provider needs no LLM, key or network. Run it from a checkout or an install:

    python examples/python_api.py            # index in a temporary folder
    python examples/python_api.py /tmp/idx   # or in one you keep (updates are incremental)

Each call below is one of the MCP tools (or `canopy index` / `canopy export`) run in-process;
results are the tools' pydantic models.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from canopy.server.api import Index

DOCS = Path(__file__).resolve().parent / "docs"


def first_point(answer: str) -> str:
    """The answer's first point (an extractive answer opens with a line saying it is one)."""
    lines = [ln for ln in answer.splitlines() if ln.strip()]
    points = [ln for ln in lines if ln.startswith("- ")] or lines
    return points[0][:240] if points else ""


def main(index_dir: Path) -> None:
    with Index.open(DOCS, index_dir=index_dir) as index:
        run = index.update()
        s = run.stats
        print(f"update: generation {run.generation}, {s['documents']} documents, "
              f"{s['entities']} entities, {s['relationships']} relationships, "
              f"{s['communities']} communities, in {run.elapsed_s:.1f}s")

        status = index.status()
        print(f"status: provider {status.provider}, levels {status.communities_by_level}")

        local = index.local_search("Which supplier makes the battery cells for the Kestrel?")
        print(f"\nlocal_search ({local.usage.provider}, {local.usage.elapsed_ms} ms):")
        print(" ", first_point(local.answer))
        for c in local.citations[:3]:
            print(f"  [{c.kind} {c.id}] {c.title}")

        overview = index.global_search("What are the main risks across the supply chain?")
        print(f"\nglobal_search: {overview.coverage.line() if overview.coverage else ''}")
        print(" ", first_point(overview.answer))

        basic = index.basic_search("How large is the 2025 budget?", k=3)
        print(f"\nbasic_search: {len(basic.citations)} citations, first from "
              f"{next((c.document for c in basic.citations if c.document), None)}")

        drift = index.drift_search("How did the Tern recall change the supplier plans?")
        print(f"drift_search: {len(drift.citations)} citations")

        roots = index.drill_down()
        top = roots.children[0]
        print(f"\ndrill_down: {len(roots.children)} top-level communities; "
              f"first {top.id} {top.title!r} ({top.size} entities)")
        inside = index.drill_down(community_id=top.id, limit=3)
        print("  members:", ", ".join(e.name for e in inside.entities))

        exported = index.export(index_dir.parent / f"{index_dir.name}-export", overwrite=True)
        print(f"\nexport ({exported.format}) to {exported.out_dir}:")
        print(" ", ", ".join(f"{table} {n}" for table, n in exported.rows.items()))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp) / "index")
