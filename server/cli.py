"""`canopy` command line: index, status, query, serve, watch, demo.

Progress goes to stderr; stdout carries results only (and is the MCP protocol under `serve`)."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

import click

from canopy.errors import CanopyError

__all__ = ["main"]

DOCS = click.argument("docs", type=click.Path(exists=True, file_okay=False, path_type=Path))
INDEX_DIR = click.option("--index-dir", type=click.Path(file_okay=False, path_type=Path), envvar="CANOPY_INDEX_DIR",
                         help="Index folder (default: DOCS/.canopy). Use it when DOCS is read-only.")
CONFIG = click.option("--config", type=click.Path(dir_okay=False, path_type=Path), envvar="CANOPY_CONFIG",
                      help="Settings file (default: DOCS/canopy.toml if present).")


def tqdm_progress(stage: str, total: int) -> Callable[[int], None]:
    from tqdm import tqdm

    if total <= 0:
        return lambda n: None
    bar = tqdm(total=total, desc=f"{stage:>9}", unit="it", file=sys.stderr, leave=False,
               disable=not sys.stderr.isatty())

    def advance(n: int) -> None:
        bar.update(n)
        if bar.n >= total:
            bar.close()

    return advance


class _Group(click.Group):
    """Canopy errors become one clear line and exit code 1, with no traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CanopyError as exc:
            raise click.ClickException(str(exc)) from exc


@click.group(cls=_Group)
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
def main(verbose: int) -> None:
    """Canopy: an incremental, permission-aware GraphRAG server for LLM agents."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


@main.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--full", is_flag=True, help="Rebuild from scratch instead of updating incrementally.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
def index(docs: Path, index_dir: Path | None, config: Path | None, full: bool, as_json: bool) -> None:
    """Build or update the GraphRAG index of DOCS.

    \b
    Examples:
      canopy index examples/docs
      canopy index ~/papers --index-dir /tmp/papers-index
      CANOPY_LLM_BASE_URL=http://localhost:11434/v1 CANOPY_LLM_MODEL=qwen2.5 canopy index docs/
    """
    from server.runtime import build_index, open_workspace

    ws = open_workspace(docs, index_dir, config)
    result = build_index(ws, full=full, progress=tqdm_progress)
    if as_json:
        click.echo(json.dumps({"generation": result.generation, "elapsed_s": round(result.elapsed_s, 3),
                               "stats": result.stats, "llm_usage": result.usage,
                               "skipped": [s.__dict__ for s in result.skips],
                               "failures": [f.__dict__ for f in result.failures]}, indent=2))
        return
    s = result.stats
    provider = "builtin (offline)" if not ws.settings.llm.enabled else f"openai-compatible {ws.settings.llm.model}"
    click.echo(f"Indexed {s['documents']} documents into {ws.index_dir} in {result.elapsed_s:.1f}s "
               f"(generation {result.generation}, provider: {provider})")
    click.echo(f"  text units {s['text_units']} ({s['units_extracted']} extracted, {s['units_failed']} failed)")
    click.echo(f"  entities {s['entities']}, relationships {s['relationships']}, claims {s['claims']}")
    click.echo(f"  communities {s['communities']} by level {s['communities_by_level']}")
    click.echo(f"  reports {s['reports']} ({s['reports_generated']} generated, {s['reports_reused']} reused)")
    calls = sum(u["calls"] for u in result.usage.values())
    if calls:
        click.echo(f"  LLM calls {calls}: " + ", ".join(f"{t} {u['calls']}" for t, u in result.usage.items()))
    if isinstance(s.get("llm_concurrency"), dict):
        from server.status import ConcurrencyInfo, concurrency_line

        click.echo(f"  {concurrency_line(ConcurrencyInfo.model_validate(s['llm_concurrency']))}")
    for skip in result.skips:
        click.echo(f"  skipped {skip.path}: {skip.reason}")
    for f in result.failures:
        click.echo(f"  failed {f.task} {f.unit_id}: {f.error}")


@main.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def status(docs: Path, index_dir: Path | None, config: Path | None, as_json: bool) -> None:
    """Show what the index of DOCS holds: counts, levels, skips, failures, provider, LLM usage."""
    from server.runtime import open_workspace
    from server.status import concurrency_line, index_status

    ws = open_workspace(docs, index_dir, config)
    store = ws.store(must_exist=True)
    try:
        st = index_status(store)
    finally:
        store.close()
    if as_json:
        click.echo(st.model_dump_json(indent=2))
        return
    configured = "builtin (offline, no LLM endpoint configured)" if st.provider == "builtin" else st.provider
    click.echo(f"Index {st.index_dir} (generation {st.generation})")
    click.echo(f"  provider: {configured}; embeddings: {st.embedder}")
    click.echo(f"  documents {st.documents}, text units {st.text_units}")
    click.echo(f"  entities {st.entities}, relationships {st.relationships}, claims {st.claims}")
    click.echo(f"  communities {st.communities} by level {st.communities_by_level}, reports {st.reports}")
    for task, u in st.llm_usage.items():
        click.echo(f"  llm {task}: {u.get('calls', 0)} calls ({u.get('cached', 0)} cached), "
                   f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} completion tokens")
    if st.llm_concurrency is not None:
        click.echo(f"  {concurrency_line(st.llm_concurrency)}")
    for s in st.skipped:
        click.echo(f"  skipped {s.path}: {s.reason}")
    for f in st.failures:
        click.echo(f"  failed {f.task} {f.id}: {f.error}")


# Command groups live in their own modules and register themselves on `main`.
from server import cli_watch  # noqa: E402,F401
from server import cli_demo, cli_serve  # noqa: E402,F401  (register `demo` and `serve` on `main`)
from server import cli_query  # noqa: E402,F401  (registers `query`)
from server import cli_warm  # noqa: E402,F401  (registers `warm`)

if __name__ == "__main__":  # `python -m server.cli`: run the group the command modules registered on
    from server.cli import main as registered_main

    registered_main()
