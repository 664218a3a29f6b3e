"""The MCP server (design §6): Canopy's query engines as read-only tools
(canopy.server.mcp_tools), plus resources for community reports and source text.

Who is asking: over Streamable HTTP with a token verifier, the verified bearer token's subject (or
client id); otherwise the principal fixed at start-up (`canopy serve --principal`). Never a tool
argument or a header. Each call builds its own `QueryContext` for that principal, so every engine
sees only what the caller may see. The server's lifespan context is the `Gateway` that does this
and translates errors for the agent (canopy.server.mcp_gateway).
"""

from __future__ import annotations

import logging
import textwrap
from importlib.metadata import PackageNotFoundError, version
from typing import Literal, get_args

from mcp.server import MCPServer
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver.exceptions import ResourceError
from pydantic import BaseModel, Field

from canopy.errors import InvalidArgument
from canopy.server import engines
from canopy.server.context import QueryContext
from canopy.server.engines.drill import REPORT_CHILDREN
from canopy.server.first_build import ServiceSlot
from canopy.server.mcp_gateway import (
    CanopyServer,
    FailureKind,
    Gateway,
    ResourceFailure,
    ToolFailure,
    damaged_message,
)
from canopy.server.mcp_tools import READ_ONLY, TOOL_RESULTS, canopy_tools
from canopy.server.results import CommunityCard
from canopy.server.service import CanopyService
from canopy.server.tool_text import span_text
from canopy.tokenizer import get_tokenizer

__all__ = ["READ_ONLY", "TOOL_RESULTS", "FailureKind", "ResourceFailure", "ToolFailure",
           "build_server", "damaged_message", "report_pages", "run_stdio"]

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_LOG_LEVELS: dict[str, LogLevel] = {name: name for name in get_args(LogLevel)}

INSTRUCTIONS = """\
Canopy answers questions about one indexed folder of documents with a GraphRAG index: entities and
relationships extracted from the text, grouped into a hierarchy of communities, each with a report.
Pick the tool by the question: global_search for corpus-wide themes and summaries; local_search
for specific entities and facts; drift_search when a question needs both (costs more LLM calls);
basic_search for plain passage retrieval; search when you would rather not choose (it routes to
basic, local or global and says why); drill_down to browse the hierarchy, check a citation or
read source text. Citations carry ids: report ids go to drill_down(community_id=...), text units
open as canopy://units/<id>. index_status says what the index holds."""


def _version() -> str:
    try:
        return version("canopy-graphrag")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "0"


def build_server(
    service: CanopyService | ServiceSlot,
    *,
    principal_name: str | None = None,
    auth: TokenVerifier | None = None,
    auth_settings: AuthSettings | None = None,
    host: str = "127.0.0.1",
    port: int = 8765,
) -> MCPServer:
    """The Canopy MCP server over one opened index (or a slot that opens it after a first build,
    `canopy.server.first_build`).

    `principal_name` is the caller over stdio (and over HTTP when `auth` is None). `auth` verifies
    HTTP bearer tokens; its `AccessToken.subject` (or `client_id`) names the caller's principal.
    `auth_settings` defaults to this server as its own resource at http://host:port/mcp.
    """
    if auth is not None and auth_settings is None:
        base = f"http://{host}:{port}"
        auth_settings = AuthSettings(issuer_url=base, resource_server_url=f"{base}/mcp",
                                     validate_token_resource=False)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    slot = service if isinstance(service, ServiceSlot) else ServiceSlot(service)
    gw = Gateway(slot, principal_name)
    server = CanopyServer(
        gw,
        "canopy",
        title="Canopy",
        instructions=INSTRUCTIONS,
        version=_version(),
        token_verifier=auth,
        auth=auth_settings if auth is not None else None,
        log_level=_LOG_LEVELS.get(level, "WARNING"),
        tools=canopy_tools(),
    )
    _add_resources(server, gw)
    return server


def _add_resources(server: MCPServer, gw: Gateway) -> None:

    @server.resource("canopy://reports/{community_id}", name="report", title="Community report",
                     mime_type="text/markdown",
                     description="A community report as markdown: title, summary, rating, "
                                 f"parent, its first {REPORT_CHILDREN} sub-communities (a note "
                                 "names the drill_down call that pages through the rest), "
                                 "findings with their source text unit ids")
    async def report(community_id: str) -> str:
        return await gw.read(f"canopy://reports/{community_id}",
                             lambda q: engines.report_markdown(q, community_id))

    @server.resource("canopy://units/{unit_id}", name="text_unit", title="Source text unit",
                     mime_type="text/plain",
                     description="The source text of a text unit, with its document path and span")
    async def unit(unit_id: str) -> str:
        async def span(q: QueryContext) -> str:
            return span_text(engines.source_span(q, unit_id))

        return await gw.read(f"canopy://units/{unit_id}", span)

    async def page_of_reports(page: int) -> str:
        async def listing(q: QueryContext) -> str:
            cards = await engines.list_servable_reports(q)
            pages = report_pages(cards, q.settings.result_token_limit)
            if not 1 <= page <= len(pages):
                raise InvalidArgument(f"page must be from 1 to {len(pages)}")
            nxt = f"canopy://reports/page/{page + 1}" if page < len(pages) else None
            return _CardList(reports=pages[page - 1], total=len(cards), page=page,
                             pages=len(pages), next=nxt).model_dump_json(indent=1)
        uri = "canopy://reports" if page == 1 else f"canopy://reports/page/{page}"
        return await gw.read(uri, listing)

    @server.resource(
        "canopy://reports",
        name="reports",
        title="Community reports",
        mime_type="application/json",
        description=f"The community reports you may read, broadest first, up to {REPORTS_PAGE} a "
        "page (fewer when their summaries would pass the result token limit): id, level, title, "
        "summary, rating, size; `next` is the next page's URI. Open one as "
        "canopy://reports/<id>",
    )
    async def reports() -> str:
        return await page_of_reports(1)

    @server.resource("canopy://reports/page/{page}", name="reports_page",
                     title="Community reports, one page", mime_type="application/json",
                     description="Page N of canopy://reports (its `next` names the following)")
    async def reports_page(page: str) -> str:
        if not page.isdigit():
            raise ResourceError("page must be a positive integer")
        return await page_of_reports(int(page))


REPORTS_PAGE = 100  # community cards per page of canopy://reports at most
_PAGE_FRAME = 60  # tokens of a page's own fields (total, page, pages, next) and brackets


def report_pages(cards: list[CommunityCard], limit: int) -> list[list[CommunityCard]]:
    """`cards` in pages of at most REPORTS_PAGE cards and `limit` tokens as the resource writes
    them, in order (page 1 is never empty, so an index without reports has one page). Pages
    follow from the cards alone, so page N is the same whichever page is read first. A card is
    counted alone, indented as in the page and followed by its comma; 2% covers the tokens that
    its edges share with its neighbours'."""
    tok = get_tokenizer()
    room = limit * 98 // 100 - _PAGE_FRAME
    pages: list[list[CommunityCard]] = [[]]
    used = 0
    for card in cards:
        n = tok.count(textwrap.indent(card.model_dump_json(indent=1), "  ") + ",\n")
        if pages[-1] and (used + n > room or len(pages[-1]) == REPORTS_PAGE):
            pages.append([])
            used = 0
        pages[-1].append(card)
        used += n
    return pages


class _CardList(BaseModel):
    reports: list[CommunityCard]
    total: int = Field(description="Reports you may read, over every page")
    page: int
    pages: int
    next: str | None = Field(None, description="URI of the next page, if any")


def run_stdio(server: MCPServer) -> None:
    """MCP over stdio; every malformed request gets a JSON-RPC error (`canopy.server.stdio`)."""
    import anyio

    from canopy.server.stdio import serve_stdio

    anyio.run(serve_stdio, server)
