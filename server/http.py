"""Streamable HTTP serving, in one process or several behind one port.

One process serves sessions as the MCP SDK does (stateful Streamable HTTP). With `workers > 1`,
uvicorn's process manager starts that many worker processes, each listening on a socket of its
own on the one port (SO_REUSEPORT on Linux: the kernel spreads new connections over them;
elsewhere they share uvicorn's socket) and opening the index itself from the `HttpSpec` passed
in the environment; sessions are then stateless (any worker answers any request), which lets
CPU-bound retrieval of concurrent callers run on every core. Engine calls run on event loops of
their own inside each process, global and DRIFT search on a separate one
(canopy.server.service), so a slow global search never stalls a drill_down.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import uvicorn

from canopy.health import index_committed

if TYPE_CHECKING:
    from mcp.server import MCPServer
    from starlette.applications import Starlette

    from canopy.server.first_build import ServiceSlot
    from canopy.server.runtime import Workspace

__all__ = ["MCP_PATH", "SPEC_ENV", "HttpSpec", "create_app", "mount_beside_mcp", "run_http",
           "serve_in_process", "stateless_app"]

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"
SPEC_ENV = "CANOPY_HTTP_SPEC"  # the spec a worker process builds its server from
READY_ENV = "CANOPY_HTTP_READY"  # a folder where each worker process marks itself open
READY_TIMEOUT_S = 120.0


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


@dataclass(frozen=True)
class FirstBuild:
    """A folder's first build, to run behind a server that already listens; `after()` runs
    once it has committed (the watcher of `serve --watch` starts there)."""

    ws: Workspace
    after: Callable[[], None]

    def start_detached(self) -> None:
        """Build on a daemon thread of this process (the supervisor of several workers)."""
        def run() -> None:
            from canopy.server.runtime import build_index

            try:
                result = build_index(self.ws)
            except Exception:  # the workers keep answering "building"; the log says why
                log.exception("the first index build of %s failed", self.ws.docs_dir)
                return
            log.info("first index of %s built: %d documents in %.1f s", self.ws.docs_dir,
                        result.stats.get("documents", 0), result.elapsed_s)
            self.after()

        threading.Thread(target=run, daemon=True, name="canopy-first-build").start()


def build(spec: HttpSpec, *, first: FirstBuild | None = None) -> tuple[MCPServer, ServiceSlot]:
    """The MCP server of `spec` and the slot of the service it serves (to close on shutdown).
    With no committed index yet, `first` is built in this process behind the server; without
    it the build runs elsewhere (the supervisor) and the slot opens once it commits."""
    from canopy.server.first_build import ServiceSlot
    from canopy.server.http_auth import http_auth
    from canopy.server.mcp_app import build_server
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    docs, config = Path(spec.docs), Path(spec.config) if spec.config else None
    ws = open_workspace(docs, Path(spec.index_dir) if spec.index_dir else None, config)
    verifier, auth_settings = http_auth(ws, config, Path(spec.tokens_file) if spec.tokens_file
                                        else None, spec.host, spec.port)

    def open_service() -> CanopyService:
        return CanopyService(ws, config=config, cache_share=spec.processes, warm=True)

    if index_committed(ws.index_dir):
        slot = ServiceSlot(open_service(), docs=spec.docs)
    elif first is not None:
        slot = ServiceSlot(docs=spec.docs)

        def then_open() -> CanopyService:
            opened = open_service()
            first.after()
            return opened

        slot.build(then_open, ws)
    else:
        slot = ServiceSlot.once_built(open_service, ws.index_dir, spec.docs)
    server = build_server(slot, principal_name=spec.principal, auth=verifier,
                          auth_settings=auth_settings, host=spec.host, port=spec.port)
    mount_beside_mcp(server, slot, docs=spec.docs, principal=spec.principal,
                     auth_required=verifier is not None, host=spec.host)
    return server, slot


def mount_beside_mcp(server: MCPServer, slot: ServiceSlot, *, docs: str, principal: str | None,
                     auth_required: bool, host: str) -> None:
    """What every Canopy HTTP server serves beside /mcp (one process, its workers, a replica):
    the REST wing's API at /api/v1 (the same tools as JSON endpoints) and the web wing's view
    at /ui/, and with CANOPY_DIAGNOSTICS=1 on a loopback host the memory report at
    /debug/memory (canopy.server.diagnostics). `docs`: the name the web view shows for the
    index."""
    from canopy.server.diagnostics import mount_diagnostics
    from canopy.server.wings import wing_module

    mount_diagnostics(server, slot, host)
    wing_module("rest", "endpoints").mount_rest(server, host)
    wing_module("web").mount_web(server, slot, docs=docs, principal=principal,
                                 auth_required=auth_required, host=host)


def stateless_app(server: MCPServer, host: str) -> Starlette:
    """The Streamable HTTP app with stateless sessions (several workers, replicas: any process
    answers any request). Such a server has no session a GET could open a stream of
    server-initiated messages for, so a GET of /mcp is answered at once with 405 (the answer
    the MCP transport specifies for a server that offers no such stream) instead of a stream
    held open with nothing ever to send; the bearer-token check still comes first."""
    from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
    from starlette.routing import Route

    app = server.streamable_http_app(streamable_http_path=MCP_PATH, stateless_http=True,
                                     host=host)
    for route in app.router.routes:
        if isinstance(route, Route) and route.path == MCP_PATH:
            if isinstance(route.app, RequireAuthMiddleware):
                route.app.app = _NoStreamAtGet(route.app.app)
            else:
                route.app = _NoStreamAtGet(route.app)
            return app
    raise RuntimeError(f"the MCP SDK's app has no {MCP_PATH} route")  # a changed SDK


class _NoStreamAtGet:
    """An ASGI app answering GET with 405 (stateless_app) and passing the rest to `app`."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        from starlette.responses import JSONResponse

        body = {"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": "Method Not Allowed: this server keeps no sessions, so it "
            "offers no stream at GET; send each request with POST"}}
        await JSONResponse(body, status_code=405, headers={"Allow": "POST"})(scope, receive, send)


def create_app() -> Starlette:
    """uvicorn's app factory in a worker process: the stateless app of the spec in SPEC_ENV."""
    from canopy.allocator import limit_arenas

    limit_arenas()  # a worker is a fresh interpreter: the CLI's cap is not inherited
    spec = HttpSpec(**json.loads(os.environ[SPEC_ENV]))
    logging.basicConfig(level=spec.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    server, _ = build(spec)
    wait_for_siblings(os.environ.get(READY_ENV), spec.processes)
    return stateless_app(server, spec.host)


def wait_for_siblings(folder: str | None, processes: int,
                      timeout: float = READY_TIMEOUT_S) -> None:
    """Mark this worker process open in `folder`, then wait until all `processes` are (or
    `timeout` passes). Workers open the index at once on the same cores: one that answered while
    another was still opening gave the first caller a slow first answer (10,000 articles: 1.6 s
    against 0.65 s for one process); so none accepts a connection before all have opened. A
    worker uvicorn restarts finds its siblings marked and does not wait."""
    if not folder or processes <= 1:
        return
    Path(folder, str(os.getpid())).touch()
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < processes and time.monotonic() < deadline:
        time.sleep(0.05)


class _WorkersConfig(uvicorn.Config):
    def bind_socket(self) -> socket.socket:
        return no_delay_listener(super().bind_socket())


class _Announcing(uvicorn.Server):
    """uvicorn's server, telling `on_listening()` once its socket listens (not before: a
    "listening at" line printed earlier sent clients to a port that refused them)."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[], None] | None) -> None:
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and self.on_listening is not None:
            self.on_listening()


def serve_in_process(server: MCPServer, host: str, port: int, *,
                     on_listening: Callable[[], None] | None = None) -> None:
    """Streamable HTTP at http://host:port/mcp (DNS-rebinding protection on for loopback hosts),
    as the SDK's `server.run("streamable-http")` serves it; `on_listening()` runs once the port
    accepts connections."""
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    config = uvicorn.Config(app, host=host, port=port,
                            log_level=server.settings.log_level.lower())
    _Announcing(config, on_listening).run()


def _announce_when_accepting(host: str, port: int, on_listening: Callable[[], None]) -> None:
    """Call `on_listening()` from a thread once a connection to the port succeeds (the workers
    listen only once every one of them has opened the index: `wait_for_siblings`; the
    supervisor's own socket holds the port but never listens, and `serve` checked that nothing
    else did, so what answers is a worker)."""
    probe = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)

    def wait() -> None:
        while True:
            try:
                with socket.create_connection((probe, port), timeout=1.0):
                    break
            except OSError:
                time.sleep(0.05)
        on_listening()

    threading.Thread(target=wait, daemon=True, name="canopy-listening").start()


def run_http(spec: HttpSpec, workers: int, *, first: FirstBuild | None = None,
             on_listening: Callable[[], None] | None = None) -> None:
    """Serve until interrupted: in this process (one worker), or in `workers` processes.
    `first`: the folder has no index yet; it is built on a thread of this process while
    the server answers (each worker's slot opens once the build commits). `on_listening()`:
    called once the port accepts connections."""
    if workers <= 1:
        server, slot = build(spec, first=first)
        try:
            serve_in_process(server, spec.host, spec.port, on_listening=on_listening)
        finally:
            slot.close()
        return
    if first is not None and not index_committed(first.ws.index_dir):
        first.start_detached()
    os.environ[SPEC_ENV] = json.dumps(asdict(replace(spec, processes=workers)))
    ready = os.environ[READY_ENV] = tempfile.mkdtemp(prefix="canopy-workers-")
    config = _WorkersConfig("canopy.server.http:create_app", factory=True, host=spec.host,
                            port=spec.port, workers=workers, log_level=spec.log_level)
    if on_listening is not None:  # serve checked the port is free: what answers is a worker
        _announce_when_accepting(spec.host, spec.port, on_listening)
    try:
        _supervise(config)
    except KeyboardInterrupt:
        pass
    finally:
        shutil.rmtree(ready, ignore_errors=True)


def no_delay_listener(sock: socket.socket) -> socket.socket:
    """`sock` (a listening TCP socket) with Nagle's algorithm off, which the connections it
    accepts inherit. uvicorn opens the socket its worker processes share with protocol number
    0, and asyncio turns Nagle off only on connections of sockets opened as IPPROTO_TCP: each
    answer of a worker then waited for the client's delayed ACK, 40 ms a call (200 articles,
    one client: 8 calls/s with two workers against 18 with one process)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


_S = TypeVar("_S", bound=socket.socket)


class _ReusePortSocket(socket.socket):
    """The supervisor's socket, bound (holding the port) but never listening: each worker
    process it is handed to gets a listening socket of its own on the same address instead
    (SO_REUSEPORT, `_worker_listener`), and the kernel spreads new connections over the workers'
    sockets by their addresses. On one shared socket the worker that happened to be accepting
    took a burst of new connections whole: clients that reconnected together (after the
    server's 5 s keep-alive) could all land on one process while the other idled (16 clients
    at 10,000 articles, `--workers 2`: windows with one process at 1.5 cores and the other at
    0; benchmarks/README.md, "16 clients at 10,000 articles")."""


def _port_sharing(sock: _S) -> _S:
    """`sock` before it binds, joining the port's other SO_REUSEPORT sockets (Linux admits only
    sockets of the same user to the group)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return sock


def _worker_listener(family: int, address: tuple[Any, ...]) -> socket.socket:
    sock = _port_sharing(socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP))
    sock.bind(address)
    return no_delay_listener(sock)


def _reduce_reuse_port(sock: _ReusePortSocket) -> tuple[Callable[..., socket.socket],
                                                        tuple[Any, ...]]:
    return _worker_listener, (sock.family, sock.getsockname())


def _bind(config: uvicorn.Config) -> socket.socket:
    """The socket the workers are handed: one they each replace by a listener of their own
    where SO_REUSEPORT balances connections (Linux), else uvicorn's shared one."""
    if (sys.platform != "linux" or not hasattr(socket, "SO_REUSEPORT") or config.uds
            or config.fd is not None):
        return config.bind_socket()
    from multiprocessing.reduction import ForkingPickler

    ForkingPickler.register(_ReusePortSocket, _reduce_reuse_port)
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = _port_sharing(_ReusePortSocket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP))
    try:
        sock.bind((config.host, config.port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen on {config.host}:{config.port}: {exc.strerror}") from None
    return sock


def _supervise(config: uvicorn.Config) -> None:
    """What `uvicorn.run` does for several workers, each on a listening socket of its own."""
    from uvicorn.supervisors import Multiprocess

    sock = _bind(config)
    if "target" in inspect.signature(Multiprocess).parameters:  # uvicorn 0.50 and older
        Multiprocess(config, target=uvicorn.Server(config).run,  # type: ignore[call-arg]
                     sockets=[sock]).run()
    else:
        Multiprocess(config, sockets=[sock]).run()
