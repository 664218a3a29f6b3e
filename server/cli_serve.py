"""`canopy serve`: the MCP server over stdio (default) or Streamable HTTP.

Under stdio, stdout is the protocol: everything else (index build progress, logs) goes to stderr.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path

import click

from server.cli import CONFIG, DOCS, INDEX_DIR, main, tqdm_progress

__all__ = ["serve"]

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@main.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--http", "use_http", is_flag=True,
              help="Serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="CANOPY_HOST",
              help="Interface to listen on with --http.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535), envvar="CANOPY_PORT",
              help="Port to listen on with --http.")
@click.option("--principal", envvar="CANOPY_PRINCIPAL",
              help="Who the caller is, as named in the [acl] policy: the stdio client, and every HTTP "
                   "client while no token verification is configured. Ignored without a policy.")
def serve(docs: Path, index_dir: Path | None, config: Path | None, use_http: bool, host: str, port: int,
          principal: str | None) -> None:
    """Serve the index of DOCS to MCP clients (agents); build the index first if there is none.

    \b
    Examples:
      canopy serve examples/docs                      # stdio, for Claude Desktop / Claude Code
      canopy serve ~/papers --index-dir /tmp/papers-index
      canopy serve examples/docs --http --port 8765   # http://127.0.0.1:8765/mcp
      CANOPY_PRINCIPAL=alice canopy serve team-docs   # answer as alice under the [acl] policy
    """
    from server.mcp_app import build_server, run_http, run_stdio
    from server.runtime import build_index, open_workspace
    from server.service import CanopyService

    ws = open_workspace(docs, index_dir, config)
    if not (ws.index_dir / "canopy.sqlite").exists():
        click.echo(f"No index at {ws.index_dir} yet: building it first.", err=True)
        result = build_index(ws, progress=tqdm_progress)
        click.echo(f"Indexed {result.stats['documents']} documents in {result.elapsed_s:.1f}s.", err=True)
    service = CanopyService(ws)
    try:
        server = build_server(service, principal_name=principal, host=host, port=port)
        if use_http:
            if not _is_loopback(host):
                log.warning("serving %s on %s without token verification: every HTTP client acts as %s",
                            docs, host, principal or "the local user")
            click.echo(f"Canopy MCP server for {docs} at http://{host}:{port}/mcp", err=True)
            run_http(server, host, port)
        else:
            run_stdio(server)
    finally:
        service.close()
