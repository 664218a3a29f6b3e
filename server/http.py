"""Streamable HTTP serving, in one process or several behind one port.

One process serves sessions as the MCP SDK does (stateful Streamable HTTP). With `workers > 1`,
uvicorn's process manager starts that many worker processes on one listening socket (the kernel
spreads connections among them), each opening the index itself from the `HttpSpec` passed in the
environment; sessions are then stateless (any worker answers any request), which lets CPU-bound
retrieval of concurrent callers run on every core. Engine calls also run on worker threads
inside each process (server.service), so a slow global search never stalls a drill_down.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from starlette.applications import Starlette

__all__ = ["SPEC_ENV", "HttpSpec", "create_app", "run_http", "serve_in_process"]

log = logging.getLogger(__name__)

SPEC_ENV = "CANOPY_HTTP_SPEC"  # the spec a worker process builds its server from


@dataclass(frozen=True)
class HttpSpec:
    """Everything a worker process needs to open the index and serve it (JSON in SPEC_ENV)."""

    docs: str
    index_dir: str | None
    config: str | None
    principal: str | None
    tokens_file: str | None
    host: str
    port: int
    log_level: str = "warning"
    processes: int = 1  # worker processes sharing the cache budget ([query] cache_mb)


def build(spec: HttpSpec) -> tuple[MCPServer, Any]:
    """The MCP server of `spec` and the service it serves (to close on shutdown)."""
    from server.cli.serve import http_auth
    from server.mcp_app import build_server
    from server.runtime import open_workspace
    from server.service import CanopyService

    docs, config = Path(spec.docs), Path(spec.config) if spec.config else None
    ws = open_workspace(docs, Path(spec.index_dir) if spec.index_dir else None, config)
    verifier, auth_settings = http_auth(ws, config, Path(spec.tokens_file) if spec.tokens_file
                                        else None, spec.host, spec.port)
    service = CanopyService(ws, config=config, cache_share=spec.processes, warm=True)
    server = build_server(service, principal_name=spec.principal, auth=verifier,
                          auth_settings=auth_settings, host=spec.host, port=spec.port)
    return server, service


def create_app() -> Starlette:
    """uvicorn's app factory in a worker process: the stateless app of the spec in SPEC_ENV."""
    spec = HttpSpec(**json.loads(os.environ[SPEC_ENV]))
    logging.basicConfig(level=spec.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    server, _ = build(spec)
    return server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True,
                                      host=spec.host)


def serve_in_process(server: MCPServer, host: str, port: int) -> None:
    """Streamable HTTP at http://host:port/mcp (DNS-rebinding protection on for loopback hosts)."""
    server.run("streamable-http", host=host, port=port, streamable_http_path="/mcp")


def run_http(spec: HttpSpec, workers: int) -> None:
    """Serve until interrupted: in this process (one worker), or in `workers` processes."""
    import uvicorn

    if workers <= 1:
        server, service = build(spec)
        try:
            serve_in_process(server, spec.host, spec.port)
        finally:
            service.close()
        return
    os.environ[SPEC_ENV] = json.dumps(asdict(replace(spec, processes=workers)))
    uvicorn.run("server.http:create_app", factory=True, host=spec.host, port=spec.port,
                workers=workers, log_level=spec.log_level)
