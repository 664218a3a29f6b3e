"""`canopy query`: ask the index of a folder a question from the command line.

The same engines as the MCP tools, for one caller: the principal named by --principal or
CANOPY_PRINCIPAL (with no ACL policy in the config, everyone reads everything)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR, check_principal

if TYPE_CHECKING:
    from canopy.server.context import QueryContext
    from canopy.server.results import SearchResult

__all__ = ["query"]

METHODS = ("auto", "global", "local", "drift", "basic")
log = logging.getLogger("canopy.query")


@click.command()
@DOCS
@click.argument("question")
@click.option("--method", "-m", type=click.Choice(METHODS), default="global", show_default=True,
              help="global: themes across the whole corpus (community reports, map-reduce); "
                   "local: specific entities and their neighbourhood; drift: both, a global primer "
                   "refined by local follow-ups; basic: plain passage retrieval; auto: classify "
                   "the question and route it to basic, local or global (the `search` tool), "
                   "printing which and why.")
@click.option("--level", type=click.IntRange(min=0), default=None,
              help="Community level for --method global (0 = broadest); "
                   "default: dynamic selection.")
@click.option("--json", "as_json", is_flag=True, help="Print the full SearchResult as JSON.")
@click.option("--principal", envvar="CANOPY_PRINCIPAL", default=None,
              help="Whose permissions apply (a principal of the config's [acl] policy).")
@INDEX_DIR
@CONFIG
def query(docs: Path, question: str, method: str, level: int | None, as_json: bool,
          principal: str | None, index_dir: Path | None, config: Path | None) -> None:
    """Answer QUESTION from the index of DOCS, with citations.

    \b
    Examples:
      canopy query examples/docs "What are the main risks across the supply chain?"
      canopy query examples/docs -m local "Which supplier makes the battery cells?"
      canopy query examples/docs -m global --level 1 --json "What themes run through the projects?"
      canopy query examples/docs -m auto "How many battery packs were recalled?"
      CANOPY_PRINCIPAL=alice canopy query docs/ -m drift "How did the recall change the budget?"
    """
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    if level is not None and method != "global":
        raise click.UsageError("--level applies to --method global only.")
    ws = open_workspace(docs, index_dir, config)
    check_principal(ws.settings.acl, principal)
    service = CanopyService(ws)
    try:
        with service.context(principal, progress=_log_progress) as ctx:
            result = asyncio.run(_search(ctx, method, question, level))
    finally:
        service.close()
    if as_json:
        click.echo(result.model_dump_json(indent=2))
        return
    click.echo(result.answer.strip())
    if result.citations:
        click.echo("\nSources:")
        for c in result.citations:
            where = f" ({c.document})" if c.document else ""
            click.echo(f"  [{c.kind} {c.id}] {c.title}{where}")
    if result.coverage is not None:
        click.echo(f"\nCoverage: {result.coverage.line()}")
    if result.route is not None:
        click.echo(f"\nRouted to {result.route.engine}_search ({result.route.how()}): "
                   f"{result.route.reason}")
    if result.note:
        click.echo(f"\nNote: {result.note}")
    u = result.usage
    click.echo(f"[{result.method} search, provider {u.provider}: {u.llm_calls} calls, "
               f"{u.prompt_tokens}+{u.completion_tokens} tokens, {u.elapsed_ms} ms]", err=True)


async def _search(ctx: QueryContext, method: str, question: str, level: int | None) -> SearchResult:
    from canopy.server import engines

    if method == "auto":
        return await engines.routed_search(ctx, question)
    if method == "global":
        return await engines.global_search(ctx, question, community_level=level)
    search = {"local": engines.local_search, "drift": engines.drift_search,
              "basic": engines.basic_search}[method]
    return await search(ctx, question)


async def _log_progress(done: float, total: float | None, message: str) -> None:
    """Progress goes to the log (stderr; shown with -v)."""
    log.info("%s", message)
