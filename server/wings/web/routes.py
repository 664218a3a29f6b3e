"""HTTP routes of the web view: the page and its files under /ui/, its data under /ui/api/.

Who is asking is settled as for the MCP endpoint (canopy.server.mcp_app): with a token verifier, the
bearer token the SDK's authentication middleware verified (the page keeps it in sessionStorage
and sends it as an Authorization header; never in a URL, where logs and history would keep
it); a request without a valid one gets 401. Without a verifier (loopback, or
--insecure-no-auth) the caller is the principal the server was started as. The data then comes
from the same service and caller-scoped reader as the tools (canopy.server.wings.web.data).

The page and its scripts are static and carry no data, so they are served without a token.
On loopback hosts, Host and Origin headers are checked as the SDK checks them for /mcp, so a
web page on another site cannot reach the API through DNS rebinding.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import TypeVar

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from canopy.errors import ConfigError, IndexDamaged, IndexMissing, InvalidArgument, NotFound
from canopy.server import engines
from canopy.server.context import QueryContext
from canopy.server.engines.drill import MAX_OFFSET
from canopy.server.first_build import ServiceSlot
from canopy.server.results import SearchResult, SourceSpan
from canopy.server.service import lane_for
from canopy.server.wings.web.data import (
    DEPTH,
    MAX_DEPTH,
    WIDTH,
    bounded,
    community_page,
    entity_page,
    find_entities,
    hierarchy,
    no_community,
    no_entity,
)
from canopy.server.wings.web.models import Ask, CommunityPage, EntityMatches, Hierarchy

__all__ = ["STATIC_FILES", "WebApi", "web_routes"]

log = logging.getLogger(__name__)
T = TypeVar("T", bound=BaseModel)

# The only files served from server/wings/web/static (a fixed list: no path ever reaches the disk).
STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "d3.min.js": "text/javascript; charset=utf-8",
}
MAX_ID = 300  # longer ids do not exist (and are not looked up)
MAX_BODY = 16_384  # bytes of a question's JSON body
# The query box's modes: the tool each one is (its engine, its lane, its arguments' defaults)
MODES = {"auto": "search", "global": "global_search", "local": "local_search",
         "drift": "drift_search", "basic": "basic_search"}

# No inline script or style, nothing from elsewhere, no framing.
PAGE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; connect-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
# Per-caller data: never stored by a browser or a shared cache.
API_HEADERS = {"Cache-Control": "no-store", "Vary": "Authorization",
               "X-Content-Type-Options": "nosniff"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _static(name: str) -> bytes:
    return resources.files("canopy.server.wings.web").joinpath("static", name).read_bytes()


def _error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers={**API_HEADERS, **headers})


@dataclass
class WebApi:
    """The JSON endpoints over one service slot, for the callers the transport names."""

    slot: ServiceSlot
    index: str  # the documents folder's name, shown in the page's title
    principal: str | None  # the caller when no verifier runs
    auth_required: bool  # a token verifier runs: only a verified token names a caller

    def caller(self) -> str | None:
        token = get_access_token()
        if token is not None:
            return token.subject or token.client_id
        return self.principal

    async def answer(self, request: Request, fn: Callable[[QueryContext], Awaitable[T]],
                     tool: str = "drill_down") -> Response:
        """`fn` for the request's caller (on the lane of `tool`, the tool it stands for), as
        JSON; errors as {"error": message}."""
        if self.auth_required and get_access_token() is None:
            return _error(401, "A valid bearer token is required.",
                          **{"WWW-Authenticate": 'Bearer error="invalid_token"'})
        try:
            result = await self.slot.service.run(self.caller(), fn, lane=lane_for(tool))
        except NotFound as exc:
            return _error(404, str(exc))
        except InvalidArgument as exc:
            return _error(400, str(exc))
        except IndexDamaged as exc:
            log.error("%s: %s", request.url.path, exc)
            return _error(503, f"The index is damaged ({exc.reason}); the operator should run "
                               "`canopy index --full` on the documents folder.")
        except (IndexMissing, ConfigError) as exc:  # first build under way; unreadable policy
            return _error(503, str(exc))
        except Exception:
            log.exception("%s failed", request.url.path)
            return _error(500, "Internal error; see server log.")
        return Response(result.model_dump_json(), media_type="application/json",
                        headers=API_HEADERS)

    async def communities(self, request: Request) -> Response:
        """`?root=ID` (a community; else the top), `depth` (levels below), `offset` (into the
        root's sub-communities or the top-level list), `limit` (per list)."""
        query = request.query_params
        root = query.get("root")
        if root is not None and len(root) > MAX_ID:
            return await self.answer(request, _raise(no_community(root)))

        async def tree(q: QueryContext) -> Hierarchy:
            return await hierarchy(
                q, self.index, root,
                depth=bounded("depth", query.get("depth"), DEPTH, 0, MAX_DEPTH),
                offset=bounded("offset", query.get("offset"), 0, 0, MAX_OFFSET),
                limit=bounded("limit", query.get("limit"), WIDTH, 1, WIDTH))

        return await self.answer(request, tree)

    async def community(self, request: Request) -> Response:
        """`offset` and `limit`: the page of the community's sub-communities, as the
        hierarchy's `?root=ID` takes them."""
        cid = request.path_params["community_id"]
        if len(cid) > MAX_ID:
            return await self.answer(request, _raise(no_community(cid)))
        query = request.query_params

        async def page(q: QueryContext) -> CommunityPage:
            return await community_page(
                q, cid, offset=bounded("offset", query.get("offset"), 0, 0, MAX_OFFSET),
                limit=bounded("limit", query.get("limit"), WIDTH, 1, WIDTH))

        return await self.answer(request, page)

    async def entity(self, request: Request) -> Response:
        eid = request.path_params["entity_id"]
        if len(eid) > MAX_ID:
            return await self.answer(request, _raise(no_entity(eid)))
        return await self.answer(request, lambda q: entity_page(q, eid))


    async def ask(self, request: Request) -> Response:
        """POST {"query", "mode"}: the answer of the tool `mode` stands for (`auto`: `search`,
        whose `route` says which engine answered and why), as that tool's structuredContent."""
        body = await request.body()
        if len(body) > MAX_BODY:
            return _error(413, f"A question is at most {MAX_BODY} bytes of JSON.")
        try:
            asked = Ask.model_validate_json(body)
        except ValidationError as exc:
            where = ", ".join(str(e["loc"][0]) for e in exc.errors() if e["loc"]) or "body"
            return _error(400, f"Expected {{\"query\": \"...\", \"mode\": \"auto|global|local|"
                               f"drift|basic\"}} (invalid: {where}).")
        query = asked.query

        async def run(q: QueryContext) -> SearchResult:
            if asked.mode == "auto":
                return await engines.routed_search(q, query)
            if asked.mode == "global":
                return await engines.global_search(q, query)
            if asked.mode == "local":
                return await engines.local_search(q, query)
            if asked.mode == "drift":
                return await engines.drift_search(q, query)
            return await engines.basic_search(q, query)

        return await self.answer(request, run, MODES[asked.mode])

    async def unit(self, request: Request) -> Response:
        """A cited text unit's passage: its document, span and text, as the caller may read
        it (a hidden unit answers as a missing one)."""
        uid = request.path_params["unit_id"]

        async def span(q: QueryContext) -> SourceSpan:
            return engines.source_span(q, uid[:MAX_ID + 1])

        return await self.answer(request, span)

    async def entities(self, request: Request) -> Response:
        """`?q=NAME`: the graph explorer's search."""
        text = request.query_params.get("q", "")[:MAX_ID]

        async def matches(q: QueryContext) -> EntityMatches:
            return await find_entities(q, text)

        return await self.answer(request, matches)


def _raise(exc: Exception) -> Callable[[QueryContext], Awaitable[BaseModel]]:
    async def fail(q: QueryContext) -> BaseModel:
        raise exc

    return fail


def _guarded(endpoint: Callable[[Request], Awaitable[Response]], host: str
             ) -> Callable[[Request], Awaitable[Response]]:
    """`endpoint` behind the SDK's Host/Origin check when serving on a loopback host; a POST
    must be JSON wherever it is served (no form of another site can send one)."""
    check = TransportSecurityMiddleware(TransportSecuritySettings(
        enable_dns_rebinding_protection=host in LOOPBACK,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]))

    async def guarded(request: Request) -> Response:
        refused = await check.validate_request(request, is_post=request.method == "POST")
        return refused if refused is not None else await endpoint(request)

    return guarded


async def _page(request: Request) -> Response:
    return Response(_static("index.html"), media_type="text/html; charset=utf-8",
                    headers=PAGE_HEADERS)


async def _file(request: Request) -> Response:
    name = request.path_params["name"]
    media = STATIC_FILES.get(name)
    if media is None:
        return Response("Not found", status_code=404, media_type="text/plain")
    return Response(_static(name), media_type=media,
                    headers={**PAGE_HEADERS, "Cache-Control": "no-cache"})


async def _to_page(request: Request) -> Response:
    return RedirectResponse("/ui/", status_code=307)


def web_routes(api: WebApi, host: str) -> list[Route]:
    """The routes of the page, its files and its API."""
    def route(path: str, endpoint: Callable[[Request], Awaitable[Response]],
              method: str = "GET") -> Route:
        return Route(path, _guarded(endpoint, host), methods=[method])

    return [
        route("/ui", _to_page),
        route("/ui/", _page),
        route("/ui/static/{name}", _file),
        route("/ui/api/communities", api.communities),
        route("/ui/api/community/{community_id:path}", api.community),
        route("/ui/api/entity/{entity_id:path}", api.entity),
        route("/ui/api/entities", api.entities),
        route("/ui/api/unit/{unit_id:path}", api.unit),
        route("/ui/api/ask", api.ask, "POST"),
    ]
