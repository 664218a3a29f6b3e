"""The REST API beside MCP: every tool of the MCP server as `POST /api/v1/<tool>`, plus
`GET /api/v1/status` and the OpenAPI document at `GET /api/v1/openapi.json`.

No second copy of anything: a request's JSON body is the tool's arguments, handed to the MCP
server's own `call_tool` (the same argument model validates it, the same `Gateway` names the
caller and builds its view, the same engines answer), and the response body is the
`structuredContent` an MCP client receives. The OpenAPI document is generated from the server's
own tool list (the JSON schemas the SDK derives from the tools' signatures and result models),
so it cannot drift from the tools.

Who the caller is: the same bearer-token check as /mcp. The SDK's authentication middleware runs
for the whole app, so the routes here are wrapped in its `RequireAuthMiddleware` (401, with the
same body and WWW-Authenticate header as /mcp, before any tool runs) and the tools read the
verified token exactly as over MCP. Host/Origin checks (DNS-rebinding protection on loopback
hosts) and the JSON content type of POSTs follow the SDK's transport rules for /mcp, which
also keeps a browser page on another origin from posting here.

Errors: the body is `ApiError`, whose `message` is the text an MCP client reads in the error
result of the same call; the status comes from the kind of failure (`ToolFailure.kind`), with
422 for arguments the schema rejects. A hidden item answers exactly like a missing one (404,
same text), because the same engines raise the same `NotFound`.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from mcp.server import MCPServer
from mcp.server.auth.middleware.bearer_auth import RequireAuthMiddleware
from mcp.server.auth.routes import build_resource_metadata_url
from mcp.server.mcpserver.exceptions import (
    ResourceError,
    ResourceNotFoundError,
    ToolError,
    UnexpectedResourceError,
    UnexpectedToolError,
)
from mcp.server.transport_security import (
    DEFAULT_MAX_REQUEST_BODY_SIZE,
    RequestBodyLimitMiddleware,
    TransportSecurityMiddleware,
    TransportSecuritySettings,
)
from mcp.types import CallToolResult, Tool
from pydantic import BaseModel, Field, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from canopy.server.mcp_app import TOOL_RESULTS, FailureKind, ResourceFailure, ToolFailure

__all__ = ["API_PREFIX", "ApiError", "mount_rest", "openapi_document"]

log = logging.getLogger(__name__)

API_PREFIX = "/api/v1"
STATUS_TOOL = "index_status"  # GET /api/v1/status answers as this tool
RESOURCE_ROUTE = "resource"  # GET /api/v1/resource?uri=canopy://... reads an MCP resource

ErrorCode = Literal["invalid_request", "invalid_argument", "not_found", "unavailable",
                    "llm_failed", "internal"]

_STATUS: dict[FailureKind, int] = {
    "invalid_argument": 400, "not_found": 404, "unavailable": 503, "llm_failed": 502,
    "internal": 500,
}


class ApiError(BaseModel):
    """The body of every REST error but 401."""

    error: ErrorCode = Field(description=(
        "invalid_request: the body is not a JSON object; invalid_argument: an argument the tool "
        "refuses (422: the schema rejects it; 400: the tool does); not_found: no such item "
        "among those you may see; unavailable: the index is being built or is damaged, or the "
        "access policy cannot be read (503); llm_failed: the language model endpoint failed "
        "(502); internal: see the server log (500)"))
    message: str = Field(description="What went wrong: the same text the MCP tool gives")


class AuthError(BaseModel):
    """The body of a 401 (the MCP transport's own, as on /mcp): never says why."""

    error: str = Field(description="invalid_token")
    error_description: str


@dataclass
class _Api:
    """The MCP server's tools over REST; `tools` and `openapi` are read on the first request
    (the tool list is the server's, complete once `build_server` returned)."""

    server: MCPServer
    security: TransportSecurityMiddleware
    tools: dict[str, Tool] = field(default_factory=dict)
    openapi: dict[str, Any] | None = None

    async def tool_list(self) -> dict[str, Tool]:
        if not self.tools:
            self.tools = {t.name: t for t in await self.server.list_tools()}
        return self.tools

    async def call(self, name: str, arguments: dict[str, Any]) -> Response:
        try:
            result = await self.server.call_tool(name, arguments)
        except UnexpectedToolError:  # the SDK's own crash wrapper: its text is generic
            log.exception("REST %s raised an unexpected exception", name)
            return _error(500, "internal", f"Internal error in {name}; see server log")
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValidationError):
                # Field names only in the log: the rejected values are the caller's data.
                log.info("REST %s rejected arguments: %r", name,
                         sorted({".".join(map(str, e["loc"])) for e in cause.errors()}))
                return _error(422, "invalid_argument", str(exc))
            kind: FailureKind = cause.kind if isinstance(cause, ToolFailure) else "internal"
            log.info("REST %s failed: %r", name, str(exc))
            return _error(_STATUS[kind], kind, str(exc))
        if not isinstance(result, CallToolResult) or result.structured_content is None:
            log.error("REST %s: the tool returned no structured result", name)
            return _error(500, "internal", f"Internal error in {name}; see server log")
        return JSONResponse(result.structured_content)

    async def read(self, uri: str) -> Response:
        """A `canopy://` resource, as an MCP client reads it (its text, its MIME type)."""
        try:
            result = await self.server.read_resource(uri)
        except ResourceNotFoundError as exc:  # hidden reads like absent (the engines' NotFound)
            return _error(404, "not_found", str(exc))
        except ResourceFailure as exc:
            return _error(_STATUS[exc.kind], exc.kind, str(exc))
        except ResourceError as exc:  # a template's own refusal (a malformed page number)
            return _error(400, "invalid_argument", str(exc))
        except UnexpectedResourceError:
            log.exception("REST resource %r raised an unexpected exception", uri)
            return _error(500, "internal", "Internal error reading the resource; see server log")
        contents = list(result) if not isinstance(result, BaseModel) else []
        if len(contents) != 1:
            log.error("REST resource %r: %d contents", uri, len(contents))
            return _error(500, "internal", "Internal error reading the resource; see server log")
        body = contents[0].content
        return Response(body, media_type=contents[0].mime_type or "text/plain")


def _error(status: int, code: ErrorCode, message: str) -> JSONResponse:
    return JSONResponse(ApiError(error=code, message=message).model_dump(), status_code=status)


class _Endpoint:
    """One REST route as an ASGI app (so the SDK's auth and body-limit middleware can wrap it).
    `tool`: the tool it calls; None takes it from the path (`{tool}`); "" serves the OpenAPI
    document."""

    def __init__(self, api: _Api, tool: str | None) -> None:
        self.api = api
        self.tool = tool

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        body = await request.body() if request.method == "POST" else b""
        # The SDK's Host/Origin checks, and its JSON content type for a POST with a body (a
        # POST with none is a call with no arguments: the schema lets the body be omitted).
        refused = await self.api.security.validate_request(request, is_post=bool(body.strip()))
        if refused is not None:
            response: Response = _error(refused.status_code, "invalid_request",
                                        bytes(refused.body).decode("utf-8", "replace"))
        else:
            response = await self.respond(request, body)
        await response(scope, receive, send)

    async def respond(self, request: Request, body: bytes) -> Response:
        tools = await self.api.tool_list()
        if self.tool == "":
            if self.api.openapi is None:
                self.api.openapi = openapi_document(
                    list(tools.values()), version=self.api.server.version,
                    bearer=self.api.server.settings.auth is not None)
            return JSONResponse(self.api.openapi)
        if self.tool == RESOURCE_ROUTE:
            uri = request.query_params.get("uri", "")
            if not uri:
                return _error(400, "invalid_request", "give the resource as ?uri=canopy://...")
            return await self.api.read(uri)
        name = self.tool or str(request.path_params.get("tool", ""))
        if request.method in ("GET", "HEAD"):
            return await self.api.call(name, {})
        if name in _GET_ONLY:  # a POST to a GET route reaches {tool}: answer as the route would
            refusal = _error(405, "invalid_request", f"{name} answers GET only")
            refusal.headers["Allow"] = "GET, HEAD"
            return refusal
        if name not in tools:
            return _error(404, "not_found", f"Unknown tool: {name}")  # the SDK's words
        try:
            arguments = json.loads(body) if body.strip() else {}
        except RecursionError:  # nested deeper than the parser's stack (issue 30, finding 6)
            return _error(400, "invalid_request",
                          f"the request body is nested too deeply: the arguments of {name} "
                          "are a flat JSON object")
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            return _error(400, "invalid_request",
                          f"the request body must be a JSON object: the arguments of {name}")
        return await self.api.call(name, arguments)


_GET_ONLY = ("status", "openapi.json", "resource")


def mount_rest(server: MCPServer, host: str) -> None:
    """Add the REST routes to `server`'s HTTP app (both `server.run("streamable-http")` and
    `server.streamable_http_app()` include them). `host`: the interface served, which decides
    the DNS-rebinding protection as it does for /mcp."""
    api = _Api(server, TransportSecurityMiddleware(_transport_security(host)))
    auth = server.settings.auth

    def guarded(app: ASGIApp) -> ASGIApp:
        app = RequestBodyLimitMiddleware(app, DEFAULT_MAX_REQUEST_BODY_SIZE)
        if auth is None:
            return app
        metadata = (build_resource_metadata_url(auth.resource_server_url)
                    if auth.resource_server_url else None)
        return cast(ASGIApp, RequireAuthMiddleware(app, auth.required_scopes or [], metadata))

    def route(path: str, methods: list[str], app: ASGIApp) -> None:
        # custom_route registers a Starlette Route; an endpoint that is not a function is an
        # ASGI app to Starlette, which lets the SDK's RequireAuthMiddleware guard it.
        server.custom_route(path, methods=methods, include_in_schema=False)(cast(Any, app))

    # Fixed paths first: a POST to them falls through to {tool} (and meets "Unknown tool").
    route(f"{API_PREFIX}/status", ["GET"], guarded(_Endpoint(api, STATUS_TOOL)))
    route(f"{API_PREFIX}/openapi.json", ["GET"], guarded(_Endpoint(api, "")))
    route(f"{API_PREFIX}/{RESOURCE_ROUTE}", ["GET"], guarded(_Endpoint(api, RESOURCE_ROUTE)))
    route(API_PREFIX + "/{tool}", ["POST"], guarded(_Endpoint(api, None)))


def _transport_security(host: str) -> TransportSecuritySettings | None:
    """What the SDK's streamable_http_app applies to /mcp for `host` (protection on loopback)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        return TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    return None


# ---- the OpenAPI document ------------------------------------------------------------------


def openapi_document(tools: list[Tool], *, version: str, bearer: bool) -> dict[str, Any]:
    """OpenAPI 3.1 for `tools` as served by `mount_rest`: each request body is the tool's MCP
    input schema, each 200 body its result model's whole schema (the MCP listing publishes a
    trimmed one, canopy.server.tool_schemas); the models they share (`$defs`) become
    components, so a client generator sees one SearchResult, not five."""
    schemas: dict[str, Any] = {}

    def component(name: str, schema: dict[str, Any]) -> dict[str, str]:
        schema = dict(schema)
        for sub, definition in schema.pop("$defs", {}).items():
            _add(schemas, sub, _rewrite_refs(definition))
        _add(schemas, name, _rewrite_refs(schema))
        return {"$ref": f"#/components/schemas/{name}"}

    errors = component("ApiError", ApiError.model_json_schema())
    unauthorized = component("AuthError", AuthError.model_json_schema())

    def responses(ok: dict[str, str] | None, codes: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if ok is not None:
            out["200"] = {"description": "The tool's structured result (MCP structuredContent)",
                          "content": {"application/json": {"schema": ok}}}
        for code in codes:
            out[str(code)] = {"description": _CODES[code],
                              "content": {"application/json": {"schema": errors}}}
        if bearer:
            out["401"] = {"description": "No valid bearer token (the reason is never given)",
                          "content": {"application/json": {"schema": unauthorized}}}
        return out

    paths: dict[str, Any] = {}
    for tool in sorted(tools, key=lambda t: t.name):
        arguments = component(f"{tool.name}_arguments", tool.input_schema)
        model = TOOL_RESULTS.get(tool.name)
        result = (component(model.__name__, model.model_json_schema())
                  if model is not None else None)
        operation = {
            "operationId": tool.name,
            "summary": tool.title or tool.name,
            "description": tool.description or "",
            "tags": ["tools"],
            "requestBody": {
                "required": bool(tool.input_schema.get("required")),
                "content": {"application/json": {"schema": arguments}},
            },
            "responses": responses(result, [400, 404, 422, 500, 502, 503]),
        }
        paths[f"{API_PREFIX}/{tool.name}"] = {"post": operation}
        if tool.name == STATUS_TOOL:
            paths[f"{API_PREFIX}/status"] = {"get": {
                "operationId": "status", "summary": tool.title or tool.name,
                "description": f"The same as POST {API_PREFIX}/{STATUS_TOOL} with no arguments.",
                "tags": ["tools"], "responses": responses(result, [500, 503])}}
    paths[f"{API_PREFIX}/{RESOURCE_ROUTE}"] = {"get": {
        "operationId": "read_resource", "summary": "Read a canopy:// resource",
        "description": ("The resource an MCP client reads at `uri`: canopy://reports (the report "
                        "cards you may read, paged), canopy://reports/<id> (a report as "
                        "markdown), canopy://units/<id> (a cited text unit's source text)."),
        "tags": ["resources"],
        "parameters": [{"name": "uri", "in": "query", "required": True,
                        "schema": {"type": "string"},
                        "description": "A canopy:// URI, as tools cite them"}],
        "responses": responses(None, [400, 404, 500, 503]) | {"200": {
            "description": "The resource's text, with its MIME type",
            "content": {mime: {"schema": {"type": "string"}} for mime in
                        ("text/markdown", "text/plain", "application/json")}}}}}
    paths[f"{API_PREFIX}/openapi.json"] = {"get": {
        "operationId": "openapi", "summary": "This document", "tags": ["meta"],
        "responses": responses(None, []) | {"200": {
            "description": "The OpenAPI document",
            "content": {"application/json": {"schema": {"type": "object"}}}}}}}
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Canopy REST API", "version": version, "description": (
            "The Canopy MCP server's tools as JSON endpoints: POST the tool's arguments, get "
            "the structured result an MCP client gets. Errors carry the MCP tool's message.")},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
    }
    if bearer:
        doc["components"]["securitySchemes"] = {"bearer": {
            "type": "http", "scheme": "bearer",
            "description": "A token from `canopy token add`, or a JWT as [auth] configures"}}
        doc["security"] = [{"bearer": []}]
    return doc


_CODES = {
    400: "The tool refused an argument, or the body is not a JSON object",
    404: "Not found among what you may see (a hidden item answers the same)",
    422: "The arguments do not match the tool's schema",
    500: "Internal error (details in the server log only)",
    502: "The language model endpoint failed",
    503: "The index is being built or is damaged, or the access policy cannot be read",
}


def _add(schemas: dict[str, Any], name: str, schema: Any) -> None:
    if name in schemas and schemas[name] != schema:  # two models of one name: never silently
        raise ValueError(f"two different JSON schemas are both named {name!r}")
    schemas[name] = schema


def _rewrite_refs(node: Any) -> Any:
    """pydantic's local `#/$defs/X` references, pointed at the document's components."""
    if isinstance(node, dict):
        return {k: (v.replace("#/$defs/", "#/components/schemas/")
                    if k == "$ref" and isinstance(v, str) else _rewrite_refs(v))
                for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node
