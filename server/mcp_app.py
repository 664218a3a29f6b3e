"""The MCP server (design §6): Canopy's query engines as read-only tools, plus resources for
community reports and source text.

Who is asking: over Streamable HTTP with a token verifier, the verified bearer token's subject (or
client id); otherwise the principal fixed at start-up (`canopy serve --principal`). Never a tool
argument or a header. Each call builds its own `QueryContext` for that principal, so every engine
sees only what the caller may see.

What comes back: each tool returns a `CallToolResult` whose `structuredContent` is one of the
models in `canopy.server.results` (declared as the tool's output schema) and whose text content is a
readable rendering of it (`canopy.server.tool_text`).

Errors: `InvalidArgument`, `NotFound`, `IndexMissing`, `ConfigError` and an unavailable endpoint
become `ToolError`s carrying their message, which is written for the agent (a hidden id reads
exactly like a missing one). `IndexDamaged` becomes a fixed message with its reason (no paths):
the index is damaged and the operator should rebuild it. Other provider failures get a fixed
message. Anything else is logged with its traceback on stderr and reaches the agent as
"Internal error in <tool>; see server log": raw exception text never leaves the server.
"""

from __future__ import annotations

import inspect
import logging
import textwrap
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Literal, TypeVar, get_args

from mcp.server import MCPServer
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from canopy.errors import (
    ConfigError,
    EndpointUnavailable,
    IndexDamaged,
    IndexMissing,
    IndexUnwritable,
    InvalidArgument,
    NotFound,
    ProviderError,
)
from canopy.server import engines
from canopy.server.context import QueryContext
from canopy.server.engines.drill import REPORT_CHILDREN
from canopy.server.first_build import ServiceSlot
from canopy.server.results import CommunityCard, DrillResult, SearchResult
from canopy.server.service import CanopyService, lane_for
from canopy.server.status import IndexStatus, index_status, status_for_caller
from canopy.server.tool_schemas import lean_input, lean_output
from canopy.server.tool_text import drill_text, search_text, span_text, status_text
from canopy.tokens import get_tokenizer

__all__ = ["READ_ONLY", "TOOL_RESULTS", "FailureKind", "ToolFailure", "build_server",
           "damaged_message", "report_pages", "run_stdio"]

log = logging.getLogger(__name__)

T = TypeVar("T")

LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
_LOG_LEVELS: dict[str, LogLevel] = {name: name for name in get_args(LogLevel)}

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)

# Errors whose message is written for the agent and safe to forward as is.
_FORWARDED = (InvalidArgument, NotFound, IndexMissing, ConfigError, EndpointUnavailable)

FailureKind = Literal["invalid_argument", "not_found", "unavailable", "llm_failed", "internal"]


class ToolFailure(ToolError):
    """A tool's refusal, carrying what kind of failure it is: MCP clients read the message only;
    the REST wing's API answers with the status code the kind implies."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


class ResourceFailure(ResourceError):
    """A resource read's refusal with its kind, as `ToolFailure` (the REST API's status)."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.kind: FailureKind = kind


def _kind(exc: Exception) -> FailureKind:
    if isinstance(exc, InvalidArgument):
        return "invalid_argument"
    if isinstance(exc, NotFound):
        return "not_found"
    if isinstance(exc, EndpointUnavailable):
        return "llm_failed"
    return "unavailable"  # IndexMissing (a first build runs) or an unreadable policy

INSTRUCTIONS = """\
Canopy answers questions about one indexed folder of documents with a GraphRAG index: entities and
relationships extracted from the text, grouped into a hierarchy of communities, each with a report.
Pick the tool by the question: global_search for corpus-wide themes and summaries; local_search
for specific entities and facts; drift_search when a question needs both (costs more LLM calls);
basic_search for plain passage retrieval; search when you would rather not choose (it routes to
basic, local or global and says why); drill_down to browse the hierarchy, check a citation or
read source text. Citations carry ids: report ids go to drill_down(community_id=...), text units
open as canopy://units/<id>. index_status says what the index holds."""

QUERY = Annotated[str, Field(
    min_length=1, max_length=4000,
    description="The question, in natural language (any language the documents use)")]
RESPONSE_TYPE = Annotated[str, Field(
    min_length=1, max_length=200,
    description="Desired form of the answer, e.g. 'multiple paragraphs', 'single paragraph', "
                "'bullet list', 'one sentence'")]
LEVEL = Annotated[int | None, Field(
    ge=0, le=10,
    description="Hierarchy level of the reports to read: 0 = a few broad communities, higher = "
                "more and narrower ones (index_status lists the levels). Omit for dynamic "
                "selection, which descends only into communities relevant to the question")]
DEFAULT_RESPONSE = "multiple paragraphs"

# Each tool's structuredContent model (its listing publishes a trimmed schema of it).
TOOL_RESULTS: dict[str, type[BaseModel]] = {
    **dict.fromkeys(("search", "global_search", "local_search", "drift_search", "basic_search"),
                    SearchResult),
    "drill_down": DrillResult, "index_status": IndexStatus}


def _version() -> str:
    try:
        return version("canopy-graphrag")
    except PackageNotFoundError:  # running from a checkout that is not installed
        return "0"


def damaged_message(exc: IndexDamaged) -> str:
    """What an agent reads when the index is damaged: no paths, and who can fix it."""
    return (f"The Canopy index is damaged ({exc.reason}), so no tool can answer until it is "
            "rebuilt. Tell the operator to run `canopy index --full` on the documents folder.")


def unwritable_message(exc: IndexUnwritable) -> str:
    """What an agent reads when the index folder cannot be used (a full disk, a read-only
    folder): the problem without its path (the server log has it), and who can fix it."""
    return (f"Canopy cannot use its index right now ({exc.problem}). Tell the operator: the "
            "server log names the folder and what to do.")


def _result(model: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=model.model_dump(mode="json"))


class _Progress:
    """Forwards engine progress as MCP progress notifications, whose value must always increase.

    Engines count each phase from zero (rate reports, map, reduce); a count that goes back starts
    a new phase, which continues one step above the last value sent. The message names the phase.
    """

    def __init__(self, mcp_ctx: Context) -> None:
        self.mcp_ctx = mcp_ctx
        self.base = 0.0
        self.done = 0.0
        self.last: float | None = None

    async def __call__(self, done: float, total: float | None, message: str) -> None:
        if self.last is not None and done < self.done:
            self.base = self.last + 1 - done
        self.done = done
        value = self.base + done
        if self.last is not None and value <= self.last:
            return
        self.last = value
        try:
            await self.mcp_ctx.report_progress(
                value, None if total is None else self.base + total, message
            )
        except Exception:  # a vanished client must not fail the query
            log.debug("progress notification not delivered", exc_info=True)


class _Gateway:
    """Identity, per-call QueryContext and error translation, shared by every tool and resource."""

    def __init__(self, slot: ServiceSlot, principal_name: str | None) -> None:
        self.slot = slot
        self.principal_name = principal_name

    @property
    def service(self) -> CanopyService:
        """The opened service; IndexMissing (forwarded to the agent) during a first build."""
        return self.slot.service

    def caller(self) -> str | None:
        """The verified HTTP caller when a token verifier ran, else the start-up principal."""
        token = get_access_token()
        if token is not None:
            return token.subject or token.client_id
        return self.principal_name

    async def call(self, tool: str, mcp_ctx: Context | None,
                   fn: Callable[[QueryContext], Awaitable[T]]) -> T:
        """`fn` on one of the service's event loops (its lane chosen by `tool`), for the
        transport's caller."""
        progress = _Progress(mcp_ctx) if mcp_ctx is not None else None
        try:
            service = self.service
            return await service.run(self.caller(), fn, progress, lane_for(tool))
        except IndexDamaged as exc:
            log.error("%s: %s", tool, exc)
            raise ToolFailure(damaged_message(exc), "unavailable") from None
        except IndexUnwritable as exc:  # the log names the folder; the agent is told the kind
            log.error("%s: %s", tool, exc)
            raise ToolFailure(unwritable_message(exc), "unavailable") from None
        except _FORWARDED as exc:
            raise ToolFailure(str(exc), _kind(exc)) from None
        except ProviderError:  # its text may quote model output: keep it in the log
            log.exception("%s failed", tool)
            raise ToolFailure(f"The language model endpoint failed during {tool}; see server "
                              "log. drill_down and the canopy:// resources work without it.",
                              "llm_failed") from None
        except Exception:
            log.exception("%s failed", tool)
            raise ToolFailure(f"Internal error in {tool}; see server log", "internal") from None

    async def read(self, uri: str, fn: Callable[[QueryContext], Awaitable[str]]) -> str:
        try:
            return await self.service.run(self.caller(), fn)
        except IndexDamaged as exc:
            log.error("reading %s: %s", uri, exc)
            raise ResourceFailure(damaged_message(exc), "unavailable") from None
        except IndexUnwritable as exc:
            log.error("reading %s: %s", uri, exc)
            raise ResourceFailure(unwritable_message(exc), "unavailable") from None
        except NotFound as exc:
            raise ResourceNotFoundError(str(exc)) from None
        except _FORWARDED as exc:
            raise ResourceFailure(str(exc), _kind(exc)) from None
        except Exception:
            log.exception("reading %s failed", uri)
            raise ResourceFailure(f"Internal error reading {uri}; see server log",
                                  "internal") from None


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
    gw = _Gateway(slot, principal_name)
    server = MCPServer(
        "canopy",
        title="Canopy",
        instructions=INSTRUCTIONS,
        version=_version(),
        token_verifier=auth,
        auth=auth_settings if auth is not None else None,
        log_level=_LOG_LEVELS.get(level, "WARNING"),
        tools=_search_tools(gw) + _navigation_tools(gw),
    )
    _add_resources(server, gw)
    return server


def _tool(fn: Callable[..., Awaitable[CallToolResult]], title: str, output: type[BaseModel], *,
          described: bool, nested: bool = False, name: str | None = None) -> Tool:
    """`fn` as a read-only tool whose listing is lean (canopy.server.tool_schemas): its docstring
    dedented, its argument schema without titles, its output schema trimmed. Results are still
    validated against the whole `output` model before they leave."""
    tool = Tool.from_function(fn, name=name, title=title, annotations=READ_ONLY,
                              description=inspect.cleandoc(fn.__doc__ or ""))
    tool.parameters = lean_input(tool.parameters)
    tool.fn_metadata.output_schema = lean_output(output, described=described, nested=nested)
    return tool


def _search_tools(gw: _Gateway) -> list[Tool]:
    async def search(
        query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Returns an answer with citations from the engine that suits the question, and
        `route`: which engine answered (basic, local or global) and why.

        Use it when you do not want to choose: questions about the collection as a whole
        (themes, trends, what recurs) go to global_search, questions naming people,
        organizations or things of the index, or joining several facts, to local_search, and
        point questions (a number, a date, a place) to basic_search. The route is a
        classification, not a guarantee: if `route.reason` misreads the question, call the
        explicit tool instead (drift_search is never chosen; call it yourself).
        Cost: that of the engine chosen, plus one short classification call when an LLM is
        configured (offline rules otherwise: entity names of the index, the question's wording).
        If `truncated` is true, `note` names the call that continues."""
        r = await gw.call("search", ctx, lambda q: engines.routed_search(
            q, query, response_type=response_type))
        return _result(r, search_text(r))

    async def global_search(
        query: QUERY,
        ctx: Context,
        community_level: LEVEL = None,
        response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Returns an answer about the corpus as a whole, citing the community reports it drew on.

        Use it for themes, summaries, comparisons and "what are the main ..." questions that need
        many documents at once. For a specific person, organization or fact use local_search; when
        a broad question also needs specific detail use drift_search.
        Cost with an LLM: dynamic selection rates every top-level community, then the children
        of relevant ones, several report digests per rating call (a fixed community_level skips
        the ratings), then one map call per batch of selected reports (run concurrently) and one
        reduce call; progress notifications follow each phase. `coverage` says, per level, how
        many communities were considered, rated, found relevant and read, what rating cost
        (calls, prompt tokens; bounded per question), whether any were left out (a rating
        budget or a failed call), and in `note` when none was rated relevant and the best-rated
        were read anyway. Without an LLM the answer is extractive and
        the retrieved report text comes with it.
        Cited report ids open with drill_down(community_id=...). If `truncated` is true, `note`
        names the call that continues."""
        r = await gw.call("global_search", ctx, lambda q: engines.global_search(
            q, query, community_level=community_level, response_type=response_type))
        return _result(r, search_text(r))

    async def local_search(
        query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Returns an answer about specific entities and facts, citing entities, relationships,
        reports and source text units.

        Use it for "who / what / where / how much" questions about named things: it finds the
        entities nearest the question, then their relationships, community reports and the text
        they came from. For corpus-wide themes use global_search; for plain passages basic_search.
        Cost: one LLM call when an LLM is configured; otherwise an extractive answer plus the
        retrieved context. Text units open as canopy://units/<id>. If `truncated` is true, `note`
        names the call that continues."""
        r = await gw.call("local_search", ctx, lambda q: engines.local_search(
            q, query, response_type=response_type))
        return _result(r, search_text(r))

    async def drift_search(
        query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Returns an answer to a question that needs both breadth and detail, with citations.

        It starts from the most similar community reports, drafts an intermediate answer and
        follow-up questions, answers those with local search for a bounded depth, then combines
        them. Use it when global_search is too general and local_search too narrow.
        Cost: several times the LLM calls of local_search (one per follow-up, plus primer and
        reduce); progress notifications follow each step; deterministic for a given index.
        If `truncated` is true, `note` names the call that continues."""
        r = await gw.call("drift_search", ctx, lambda q: engines.drift_search(
            q, query, response_type=response_type))
        return _result(r, search_text(r))

    async def basic_search(
        query: QUERY,
        ctx: Context,
        k: Annotated[
            int, Field(ge=1, le=100, description="Number of text passages to retrieve")
        ] = 10,
        response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    ) -> Annotated[CallToolResult, SearchResult]:
        """Returns an answer from the k most similar source passages, each cited with its document.

        Plain retrieval over text units (vector plus keyword), no graph: use it for point
        questions whose answer sits in one or two passages (a number, a date, a quote), or to find
        where something is written. For relationships or themes prefer local_search or
        global_search. Cost: at most one LLM call; raise k (up to 100) for more passages."""
        r = await gw.call("basic_search", ctx, lambda q: engines.basic_search(
            q, query, k=k, response_type=response_type))
        return _result(r, search_text(r))

    # One result model for all five: its fields are described once, on `search`.
    return [_tool(search, "Search (routed)", SearchResult, described=True, nested=True),
            _tool(global_search, "Global search", SearchResult, described=False),
            _tool(local_search, "Local search", SearchResult, described=False),
            _tool(drift_search, "DRIFT search", SearchResult, described=False),
            _tool(basic_search, "Basic search", SearchResult, described=False)]


def _navigation_tools(gw: _Gateway) -> list[Tool]:
    async def drill_down(
        ctx: Context,
        community_id: Annotated[
            str | None,
            Field(
                max_length=200,
                description="A community (report) id, from a citation or an earlier drill_down",
            ),
        ] = None,
        entity: Annotated[
            str | None,
            Field(
                max_length=300,
                description="An entity name or id: opens the deepest community it belongs to",
            ),
        ] = None,
        finding: Annotated[
            int | None,
            Field(
                ge=0,
                le=1000,
                description="With community_id or entity: index of one finding (0 = first), to get "
                "the source text behind it",
            ),
        ] = None,
        limit: Annotated[
            int,
            Field(
                ge=1,
                le=100,
                description="Most entities, relationships, claims, children and sources to list",
            ),
        ] = 10,
        offset: Annotated[
            int,
            Field(
                ge=0,
                le=1_000_000,
                description="Items to skip in each list: the next page starts at offset+limit",
            ),
        ] = 0,
    ) -> Annotated[CallToolResult, DrillResult]:
        """Returns one point of the community hierarchy: a community's report, findings, parents,
        children, member entities, relationships and source text; for an entity, also the claims
        about it (type, status, period, verbatim source quote).

        Use it to navigate and verify rather than to answer: with no arguments it lists the
        top-level communities; with community_id (or entity, not both) it opens one community, so
        you can roll up via `parents` or drill into `children`; add finding=N for the text units
        behind finding N. Use it to check the citations of the search tools. No LLM cost.
        Lists show `limit` items from `offset` (a page); `truncated` and `note` say when there
        is more and give the call for the next page."""
        r = await gw.call("drill_down", ctx, lambda q: engines.drill_down(
            q, community_id=community_id, entity=entity, finding=finding, limit=limit,
            offset=offset))
        return _result(r, drill_text(r))

    async def index_status_tool() -> Annotated[CallToolResult, IndexStatus]:
        """Returns what the index holds: counts of documents, text units, entities, relationships,
        communities by level and reports, the provider, and skipped or failed items.

        Use it first to learn which community levels exist (for global_search) and whether an LLM
        is configured (otherwise answers are extractive). Counts cover what you may see. No cost."""

        async def status(q: QueryContext) -> IndexStatus:
            damage = gw.service.search_damage()  # milliseconds: files looked at, not opened
            if damage is not None:
                raise IndexDamaged(damage)
            policy = gw.service.ws.policy
            principal = q.caller.principal
            return status_for_caller(
                index_status(gw.service.store),
                q,
                lambda path: policy.readable(policy.labels_for(path), principal),
            )

        st = await gw.call("index_status", None, status)
        return _result(st, status_text(st))

    return [_tool(drill_down, "Drill down", DrillResult, described=True),
            _tool(index_status_tool, "Index status", IndexStatus, described=True,
                  name="index_status")]


def _add_resources(server: MCPServer, gw: _Gateway) -> None:

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
