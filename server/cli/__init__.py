"""`canopy` command line: index, status, query, warm, serve, watch, token, demo, init, tidy,
prompts, mcp-config; and the wings' commands (eval, export, import-graphrag, publish), which
the group loads from the wing when one is asked for (canopy.server.wings.COMMANDS).

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
from canopy.errors import ConfigError
from canopy.server.cli import (
    demo,
    index,
    init,
    mcp_config,
    prompts,
    query,
    serve,
    tidy,
    tokens,
    warm,
    watch,
)
from canopy.server.cli.common import CanopyGroup, canopy_version
from canopy.server.wings import COMMANDS, WINGS, wing_module

__all__ = ["main"]


class _WithWings(CanopyGroup):
    """The group of the core's commands and the wings' (COMMANDS), a wing's imported only when
    it is asked for. A wing whose extra is missing still lists its command: running it says
    what to install."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in COMMANDS:
            return command
        wing, target = COMMANDS[cmd_name]
        module, _, attribute = target.partition(":")
        try:
            found = getattr(wing_module(wing, module, wanted_by=f"canopy {cmd_name}"), attribute)
        except ConfigError as exc:
            return _missing(cmd_name, wing, str(exc))
        assert isinstance(found, click.Command), target
        return found


def _missing(name: str, wing: str, why: str) -> click.Command:
    """A stand-in for wing `wing`'s command `name`, which fails with `why` (what to install)."""
    def fail() -> None:
        raise click.ClickException(why)

    return click.Command(name, callback=fail, context_settings={"ignore_unknown_options": True,
                                                                "allow_extra_args": True},
                         help=f"{WINGS[wing].feature}: needs the [{wing}] extra (not installed).")


@click.group(cls=_WithWings)
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
                 tokens.token, demo.demo, init.init, tidy.tidy, prompts.prompts,
                 mcp_config.mcp_config):
    main.add_command(_command)
del _command
