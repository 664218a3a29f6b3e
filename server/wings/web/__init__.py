"""The web view of `canopy serve --http` (/ui/): the caller's community hierarchy as a zoomable
sunburst, a community's report and entity graph, an entity's description and source excerpts.

`mount_web` adds its routes to the MCP server's HTTP app, next to /mcp and behind the same
bearer-token authentication; the data comes through the same service and caller-scoped reader
as the MCP tools (canopy.server.wings.web.data). The page is static HTML, CSS and JavaScript with d3
(vendored, ISC licence) from server/wings/web/static: no build step, nothing fetched from elsewhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from canopy.server.first_build import ServiceSlot

__all__ = ["mount_web"]


def mount_web(server: MCPServer, slot: ServiceSlot, *, docs: str, principal: str | None,
              auth_required: bool, host: str) -> None:
    """Serve the web view from `server`'s Streamable HTTP app: the page at /ui/, its data at
    /ui/api/ for the caller the transport identifies (`principal` when no verifier runs)."""
    from canopy.server.wings.web.routes import WebApi, web_routes

    api = WebApi(slot, Path(docs).resolve().name, principal, auth_required)
    for route in web_routes(api, host):
        server.custom_route(route.path, methods=sorted(route.methods or {"GET"}))(route.endpoint)
