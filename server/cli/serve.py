"""`canopy serve`: the MCP server over stdio (default) or Streamable HTTP.

Under stdio, stdout is the protocol: everything else (index build progress, logs) goes to stderr.

Who the caller is (design §5): over stdio, `--principal` / CANOPY_PRINCIPAL. Over HTTP, the bearer
token, checked by the verifier the `[auth]` settings describe (a hashed token file, `--tokens`,
and/or JWTs); a request without a valid token gets 401 from the transport. Serving HTTP beyond
loopback with no verifier is refused unless `--insecure-no-auth` says so explicitly.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from canopy.health import index_committed
from canopy.server.cli.common import (
    CONFIG,
    INDEX_DIR,
    check_principal,
    describe_batch,
    index_command,
)

if TYPE_CHECKING:
    from canopy.indexer.watcher import Watcher

__all__ = ["serve"]

log = logging.getLogger(__name__)


@click.command()
@click.argument("docs", required=False,
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@INDEX_DIR
@CONFIG
@click.option("--index-uri", metavar="URI",
              help="Serve the index published at URI (a folder or s3://bucket/prefix, by "
                   "`canopy publish` or index/watch --publish) as a stateless replica: no DOCS; "
                   "follows newer generations, refuses to answer when it cannot confirm it is "
                   "current within [publish] revocation_bound_s.")
@click.option("--http", "use_http", is_flag=True,
              help="Serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio, and the same "
                   "tools as a REST API at /api/v1.")
@click.option("--host", default="127.0.0.1", show_default=True, envvar="CANOPY_HOST",
              help="Interface to listen on with --http.")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(1, 65535),
              envvar="CANOPY_PORT",
              help="Port to listen on with --http.")
@click.option("--principal", envvar="CANOPY_PRINCIPAL",
              help="Who the caller is, as named in the [acl] policy: the stdio client, and every "
                   "HTTP client while no token verification is configured. Ignored without a "
                   "policy.")
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Token file for --http (from `canopy token add`); overrides auth.tokens_file.")
@click.option("--watch", is_flag=True,
              help="Also watch DOCS and apply every change while serving (see `canopy watch`).")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              envvar="CANOPY_WORKERS",
              help="Processes serving --http on one port (stateless sessions when more than one): "
                   "concurrent callers then use every core.")
@click.option("--insecure-no-auth", is_flag=True,
              help="Allow --http on a non-loopback host with no token verification: every client "
                   "then acts as --principal. For trusted networks only.")
def serve(docs: Path | None, index_dir: Path | None, config: Path | None, index_uri: str | None,
          use_http: bool, host: str, port: int, principal: str | None, tokens_file: Path | None,
          watch: bool, workers: int, insecure_no_auth: bool) -> None:
    """Serve the index of DOCS to MCP clients (agents); build the index first if there is none.

    \b
    Examples:
      canopy serve examples/docs                      # stdio, for Claude Desktop / Claude Code
      canopy serve ~/papers --index-dir /tmp/papers-index
      canopy serve examples/docs --http --port 8765   # http://127.0.0.1:8765/mcp, /api/v1
      CANOPY_PRINCIPAL=alice canopy serve team-docs   # answer as alice under the [acl] policy
      canopy serve team-docs --http --host 0.0.0.0 --tokens tokens.jsonl   # bearer tokens
      canopy serve team-docs --watch                  # keep the index current while serving
      canopy serve team-docs --http --workers 2       # two processes behind one port
      canopy serve --http --index-uri s3://bucket/team-docs   # a replica of a published index
    """
    # The HTTP supervisor of several workers serves nothing itself: it imports no engines.
    from canopy.server.http import HttpSpec, run_http
    from canopy.server.http_auth import http_auth, is_loopback
    from canopy.server.runtime import open_workspace

    if tokens_file is not None and not use_http:
        raise click.UsageError("--tokens applies to --http only; "
                               "over stdio the caller is --principal")
    if index_uri is not None:
        if docs is not None or index_dir is not None or watch or workers > 1:
            raise click.UsageError("--index-uri serves a published index: it takes no DOCS, "
                                   "--index-dir, --watch or --workers (run more replicas)")
        from canopy.server.wings import wing_module

        replica = wing_module("publish", "replica", wanted_by="--index-uri")
        replica.serve_replica(index_uri, use_http=use_http, host=host, port=port,
                              principal=principal, tokens_file=tokens_file, config=config,
                              insecure_no_auth=insecure_no_auth)
        return
    if docs is None:
        raise click.UsageError("Missing argument 'DOCS' (or --index-uri URI)")
    ws = open_workspace(docs, index_dir, config)
    verifier, auth_settings = None, None
    if use_http:  # settle who may call before building or opening anything
        verifier, auth_settings = http_auth(ws, config, tokens_file, host, port)
        if verifier is None and not is_loopback(host):
            if not insecure_no_auth:
                raise click.ClickException(
                    f"refusing to serve {docs} on {host} without authentication: set [auth] "
                    "tokens_file or jwt_* in canopy.toml, pass --tokens FILE (see `canopy token "
                    "add`), serve on 127.0.0.1, or pass --insecure-no-auth if every client on "
                    f"this network may read as {principal or 'the local user'}")
            log.warning("serving %s on %s without token verification: every HTTP client acts as %s",
                        docs, host, principal or "the local user")
    if verifier is None:  # the caller is --principal (HTTP callers are named by their tokens)
        check_principal(ws.settings.acl, principal)
    if use_http:  # before printing where it serves, and before any build starts
        _check_port_free(host, port)
    fresh = not index_committed(ws.index_dir)  # none yet, or a first build that never committed
    # A server answers at once, also on a folder with no index: the first build runs behind
    # it (canopy.server.first_build) and the watcher starts once that build has committed.
    watcher = _start_watcher(docs, index_dir, config) if watch and not fresh else None
    holder: list[Watcher] = []  # the watcher, once the first build has committed

    def after_first_build() -> None:
        if watch:
            holder.append(_start_watcher(docs, index_dir, config))

    if fresh:
        click.echo(f"No index at {ws.index_dir} yet: serving now, building it meanwhile "
                   "(tools answer with its progress until it commits).", err=True)
        # "first index of DOCS built" is news, not a warning: an INFO line, shown (as the
        # watcher's are) whatever -v says
        for name in ("canopy.server.first_build", "canopy.server.http"):
            logging.getLogger(name).setLevel(min(logging.INFO,
                                                 logging.getLogger().getEffectiveLevel()))
    try:
        if use_http:
            from canopy.server.http import FirstBuild

            how = "bearer tokens required" if verifier is not None else "no authentication"
            procs = f", {workers} processes" if workers > 1 else ""

            def listening() -> None:  # once the port accepts connections, not before
                click.echo(f"Canopy MCP server for {docs} at http://{host}:{port}/mcp "
                           f"({how}{procs})\nREST API at http://{host}:{port}/api/v1 (OpenAPI: "
                           f"/api/v1/openapi.json)\nWeb view at http://{host}:{port}/ui/",
                           err=True)

            level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
            if level not in ("debug", "info", "warning", "error"):
                level = "warning"
            try:
                run_http(HttpSpec(str(docs), str(index_dir) if index_dir else None,
                                  str(config) if config else None, principal,
                                  str(tokens_file.resolve()) if tokens_file else None, host,
                                  port, level),
                         workers, first=FirstBuild(ws, after_first_build) if fresh else None,
                         on_listening=listening)
            finally:
                for w in holder:
                    w.stop()
            return
        from canopy.server.first_build import ServiceSlot
        from canopy.server.mcp_app import build_server, run_stdio
        from canopy.server.service import CanopyService

        def open_service() -> CanopyService:
            return CanopyService(ws, config=config, warm=True)

        if fresh:
            slot = ServiceSlot(docs=str(docs))

            def then_open() -> CanopyService:
                opened = open_service()
                after_first_build()
                return opened

            slot.build(then_open, ws)
        else:
            slot = ServiceSlot(open_service(), docs=str(docs))
        try:
            run_stdio(build_server(slot, principal_name=principal))
        finally:
            if slot.building:  # the host closed stdin (went away) before the build committed
                click.echo(f"The client went away during the first build of {docs} "
                           f"({slot.progress()}): stopping it. What it saved is kept: "
                           f"`{index_command(docs, index_dir, config)}` (or the next `canopy "
                           "serve`) resumes from there.", err=True)
            slot.close()
            for w in holder:
                w.stop()
    finally:
        if watcher is not None:
            watcher.stop()


def _check_port_free(host: str, port: int) -> None:
    """A one-line error when something already listens on host:port: the server would print
    its URLs and then fail to bind. (A server of the same user that joined the port with
    SO_REUSEPORT is caught too: this probe does not set it.)"""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no obstacle
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise click.ClickException(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}. Stop what listens "
                "there or pass --port N (or CANOPY_PORT)") from None


def _start_watcher(docs: Path, index_dir: Path | None, config: Path | None) -> Watcher:
    """A watcher thread in the serving process: it commits new generations, which the service
    picks up on the next call (readers never wait for it)."""
    from canopy.server.runtime import workspace_watcher

    log.setLevel(logging.INFO)  # one line per applied batch, on stderr
    # catch_up: what changed while no server watched (stopped, or killed) is applied at once
    return workspace_watcher(docs, index_dir, config,
                             on_applied=lambda paths, r: log.info("%s", describe_batch(paths, r))
                             ).start(catch_up=True)
