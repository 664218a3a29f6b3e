"""`canopy` command line: index, status, query, export, import-graphrag, warm, serve, watch,
publish, token, demo, prompts, mcp-config.

Progress goes to stderr; stdout carries results only (and is the MCP protocol under `serve`).

One module per command (index and status share one); what they share is in `common`. This
module assembles the group from them, and they never import it back (no cycle). Heavy imports
stay inside the commands: `canopy serve` over stdio should start fast.
"""

from __future__ import annotations

import logging
import sys

import click

from canopy.allocator import limit_arenas
from canopy.server.cli import (
    demo,
    evaluate,
    export,
    import_graphrag,
    index,
    init,
    mcp_config,
    prompts,
    publish,
    query,
    serve,
    tidy,
    tokens,
    warm,
    watch,
)
from canopy.server.cli.common import CanopyGroup, canopy_version

__all__ = ["main"]


@click.group(cls=CanopyGroup)
@click.option("-v", "--verbose", count=True, help="More logging on stderr (-vv for debug).")
@click.version_option(canopy_version(), "--version", prog_name="canopy",
                      help="Show the installed Canopy version and exit.")
def main(verbose: int) -> None:
    """Canopy: an incremental, permission-aware GraphRAG server for LLM agents."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    limit_arenas()  # before any command starts threads (canopy.allocator)


for _command in (index.index, index.status, query.query, warm.warm, serve.serve, watch.watch,
                 tokens.token, demo.demo, evaluate.eval_command, init.init, tidy.tidy,
                 export.export, import_graphrag.import_graphrag, prompts.prompts,
                 publish.publish, mcp_config.mcp_config):
    main.add_command(_command)
del _command
