"""`canopy demo`: index the bundled example corpus and call every tool through a real MCP client.

The server runs as `canopy serve` in a subprocess and the demo talks to it over stdio with the MCP
SDK's client, exactly as an agent host would. It runs offline (builtin provider) unless an LLM
endpoint is configured in the environment.
"""

from __future__ import annotations

import asyncio
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import click

import canopy
from canopy.server.cli.common import INDEX_DIR, STARTED, tqdm_progress

__all__ = ["EXAMPLE_DOCS", "demo"]

def _example_docs() -> Path:
    """The bundled corpus: the checkout's examples/docs, or, in an install without a checkout
    (`pip install .`, pipx), the copy the wheel puts under the environment's data path."""
    checkout = Path(canopy.__file__).resolve().parents[1] / "examples" / "docs"
    if checkout.is_dir():
        return checkout
    return Path(sysconfig.get_path("data")) / "share" / "canopy-graphrag" / "examples" / "docs"


EXAMPLE_DOCS = _example_docs()
TRIM = 900

# (tool, arguments) in the order the demo calls them; drill_down's arguments come from an earlier
# answer's citations.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("index_status", {}),
    ("global_search", {"query": "What are the main risks across the supply chain?"}),
    ("local_search", {"query": "Who leads Project Kestrel?"}),
    ("drift_search", {"query": "How did the 2024 quality incidents shape the 2025 budget?"}),
    ("basic_search", {"query": "How many Tern packs were recalled?", "k": 5}),
    ("search", {"query": "Which problems do the suppliers cause again and again?"}),
    ("drill_down", {}),
]


def _trim(text: str, full: bool) -> str:
    text = text.strip()
    if full or len(text) <= TRIM:
        return text
    more = len(text) - TRIM
    return text[:TRIM].rstrip() + f"\n… ({more} more characters; --full shows everything)"


def _text(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def _server_params(docs: Path, index_dir: Path) -> Any:
    from mcp import StdioServerParameters

    env = {k: v for k, v in os.environ.items() if k.startswith(("CANOPY_", "OPENAI_"))}
    root = str(Path(canopy.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return StdioServerParameters(command=sys.executable, env=env,
                                 args=["-m", "canopy.server.cli", "serve", str(docs),
                                       "--index-dir", str(index_dir)])


async def _drive(docs: Path, index_dir: Path, full: bool, began: float) -> None:
    """Call every tool; `began`: when the demo started (perf_counter), for its total time."""
    from mcp import Client

    echo = click.echo
    started = time.perf_counter()
    async with Client(_server_params(docs, index_dir)) as client:
        tools = (await client.list_tools()).tools
        echo(f"Connected to `canopy serve` over stdio in {time.perf_counter() - started:.1f}s. "
             f"Tools ({len(tools)}):")
        for tool in tools:
            first = (tool.description or "").strip().splitlines()[0]
            echo(f"  {tool.name:<14} {first}")

        notes: list[str] = []

        async def progress(progress: float, total: float | None, message: str | None) -> None:
            notes.append(message or f"{progress:g}")  # parameter names as in mcp's ProgressFnT

        cited_report = cited_unit = None
        for name, args in CALLS:
            if name == "drill_down" and cited_report:
                args = {"community_id": cited_report, "limit": 5}
            shown = ", ".join(f"{k}={v!r}" for k, v in args.items())
            echo(f"\n── {name}({shown}) " + "─" * max(0, 60 - len(name) - len(shown)))
            t0 = time.perf_counter()
            notes.clear()
            result = await client.call_tool(name, args, progress_callback=progress)
            echo(_trim(_text(result), full))
            seen = f", {len(notes)} progress notifications (last: {notes[-1]!r})" if notes else ""
            outcome = "error" if result.is_error else "ok"
            echo(f"    [{outcome}, {time.perf_counter() - t0:.2f}s{seen}]")
            for c in (result.structured_content or {}).get("citations", []):
                if c["kind"] == "report" and cited_report is None:
                    cited_report = c["id"]
                if c["kind"] == "text_unit" and cited_unit is None:
                    cited_unit = c["id"]

        resources = await client.list_resource_templates()
        echo("\nResource templates: "
             + ", ".join(t.uri_template for t in resources.resource_templates))
        if cited_unit:
            uri = f"canopy://units/{cited_unit}"
            echo(f"\n── read {uri} " + "─" * 30)
            res = await client.read_resource(uri)
            echo(_trim("\n".join(getattr(c, "text", "") for c in res.contents), full))
    now = time.perf_counter()
    echo(f"\nDone in {now - began:.1f}s ({started - began:.1f}s indexing, {now - started:.1f}s "
         "serving over MCP). Next: docs/agents.md shows how to add Canopy to your agent.")


@click.command()
@click.option("--docs", type=click.Path(exists=True, file_okay=False, path_type=Path),
              default=EXAMPLE_DOCS,
              show_default="the bundled examples/docs", help="Documents folder to index and query.")
@INDEX_DIR
@click.option("--full", is_flag=True, help="Print whole tool results instead of their first lines.")
def demo(docs: Path, index_dir: Path | None, full: bool) -> None:
    """Index the example corpus and call every MCP tool through a real MCP client over stdio.

    The index goes to a temporary folder (deleted afterwards) unless --index-dir is given, so a
    read-only checkout works. Offline by default: no LLM endpoint or key needed.

    \b
    Examples:
      canopy demo
      canopy demo --full
      CANOPY_LLM_BASE_URL=http://localhost:11434/v1 CANOPY_LLM_MODEL=qwen2.5 canopy demo
    """
    began = STARTED  # the run's start as the user saw it, imports included
    from canopy.server.runtime import build_index, open_workspace

    with tempfile.TemporaryDirectory(prefix="canopy-demo-") as tmp:
        ws = open_workspace(docs, index_dir or Path(tmp) / "index")
        t0 = time.perf_counter()
        result = build_index(ws, progress=tqdm_progress)
        s = result.stats
        click.echo(f"Indexed {s['documents']} documents of {docs} into {ws.index_dir} in "
                   f"{time.perf_counter() - t0:.1f}s: {s['entities']} entities, "
                   f"{s['relationships']} relationships, {s['communities']} communities with "
                   "reports.")
        asyncio.run(_drive(docs, ws.index_dir, full, began))
