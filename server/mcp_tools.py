"""The MCP tools (design §6): Canopy's query engines as read-only tools, each a module-level
function that reaches the server's `Gateway` through its `Context` (`gateway_of`).

What comes back: each tool returns a `CallToolResult` whose `structuredContent` is one of the
models in `canopy.server.results` (declared as the tool's output schema) and whose text content is
a readable rendering of it (`canopy.server.tool_text`). A tool's docstring and argument
annotations are what an agent reads: `canopy_tools` lists them lean (canopy.server.tool_schemas).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Annotated

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.tools import Tool
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field

from canopy.errors import IndexDamaged
from canopy.server import engines
from canopy.server.context import QueryContext
from canopy.server.mcp_gateway import gateway_of
from canopy.server.results import DrillResult, SearchResult
from canopy.server.status import IndexStatus, index_status, status_for_caller
from canopy.server.tool_schemas import lean_input, lean_output
from canopy.server.tool_text import drill_text, search_text, status_text

__all__ = ["DEFAULT_RESPONSE", "READ_ONLY", "TOOL_RESULTS", "basic_search", "canopy_tools",
           "drift_search", "drill_down", "global_search", "index_status_tool", "local_search",
           "search"]

READ_ONLY = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                            open_world_hint=False)

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
# Bounds are checked where they are read (canopy.periods.time_window): the listing stays lean.
SINCE = Annotated[str | None, Field(
    description="Only evidence dated on or after this (ISO date, YYYY-MM or YYYY)")]
UNTIL = Annotated[str | None, Field(
    description="Only evidence dated on or before this (ISO date, YYYY-MM or YYYY)")]
DEFAULT_RESPONSE = "multiple paragraphs"

# Each tool's structuredContent model (its listing publishes a trimmed schema of it).
TOOL_RESULTS: dict[str, type[BaseModel]] = {
    **dict.fromkeys(("search", "global_search", "local_search", "drift_search", "basic_search"),
                    SearchResult),
    "drill_down": DrillResult, "index_status": IndexStatus}


def _result(model: BaseModel, text: str) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=text)],
                          structured_content=model.model_dump(mode="json"))


async def search(
    query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    since: SINCE = None, until: UNTIL = None,
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
    r = await gateway_of(ctx).call("search", ctx, lambda q: engines.routed_search(
        q, query, response_type=response_type, since=since, until=until))
    return _result(r, search_text(r))


async def global_search(
    query: QUERY,
    ctx: Context,
    community_level: LEVEL = None,
    response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    since: SINCE = None,
    until: UNTIL = None,
) -> Annotated[CallToolResult, SearchResult]:
    """Returns an answer about the corpus as a whole, citing the community reports it drew on.

    Use it for themes, summaries, comparisons and "what are the main ..." questions that need
    many documents at once. For a specific person, organization or fact use local_search; when
    a broad question also needs specific detail use drift_search. Questions about change ("how
    did X evolve") are answered period by period, each citation with its `period`.
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
    r = await gateway_of(ctx).call("global_search", ctx, lambda q: engines.global_search(
        q, query, community_level=community_level, response_type=response_type, since=since,
        until=until))
    return _result(r, search_text(r))


async def local_search(
    query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    since: SINCE = None, until: UNTIL = None,
) -> Annotated[CallToolResult, SearchResult]:
    """Returns an answer about specific entities and facts, citing entities, relationships,
    reports and source text units.

    Use it for "who / what / where / how much" questions about named things: it finds the
    entities nearest the question, then their relationships, community reports and the text
    they came from. For corpus-wide themes use global_search; for plain passages basic_search.
    Cost: one LLM call when an LLM is configured; otherwise an extractive answer plus the
    retrieved context. Text units open as canopy://units/<id>. If `truncated` is true, `note`
    names the call that continues."""
    r = await gateway_of(ctx).call("local_search", ctx, lambda q: engines.local_search(
        q, query, response_type=response_type, since=since, until=until))
    return _result(r, search_text(r))


async def drift_search(
    query: QUERY, ctx: Context, response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    since: SINCE = None, until: UNTIL = None,
) -> Annotated[CallToolResult, SearchResult]:
    """Returns an answer to a question that needs both breadth and detail, with citations.

    It starts from the most similar community reports, drafts an intermediate answer and
    follow-up questions, answers those with local search for a bounded depth, then combines
    them. Use it when global_search is too general and local_search too narrow.
    Cost: several times the LLM calls of local_search (one per follow-up, plus primer and
    reduce); progress notifications follow each step; deterministic for a given index.
    If `truncated` is true, `note` names the call that continues."""
    r = await gateway_of(ctx).call("drift_search", ctx, lambda q: engines.drift_search(
        q, query, response_type=response_type, since=since, until=until))
    return _result(r, search_text(r))


async def basic_search(
    query: QUERY,
    ctx: Context,
    k: Annotated[
        int, Field(ge=1, le=100, description="Number of text passages to retrieve")
    ] = 10,
    response_type: RESPONSE_TYPE = DEFAULT_RESPONSE,
    since: SINCE = None,
    until: UNTIL = None,
) -> Annotated[CallToolResult, SearchResult]:
    """Returns an answer from the k most similar source passages, each cited with its document.

    Plain retrieval over text units (vector plus keyword), no graph: use it for point
    questions whose answer sits in one or two passages (a number, a date, a quote), or to find
    where something is written. For relationships or themes prefer local_search or
    global_search. Cost: at most one LLM call; raise k (up to 100) for more passages."""
    r = await gateway_of(ctx).call("basic_search", ctx, lambda q: engines.basic_search(
        q, query, k=k, response_type=response_type, since=since, until=until))
    return _result(r, search_text(r))


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
    about it (type, status, period, verbatim source quote) and the other names it was merged
    from (`aliases`: the rule and the text units supporting each).

    Use it to navigate and verify rather than to answer: with no arguments it lists the
    top-level communities; with community_id (or entity, not both) it opens one community, so
    you can roll up via `parents` or drill into `children`; add finding=N for the text units
    behind finding N. Use it to check the citations of the search tools. No LLM cost.
    Lists show `limit` items from `offset` (a page); `truncated` and `note` say when there
    is more and give the call for the next page."""
    r = await gateway_of(ctx).call("drill_down", ctx, lambda q: engines.drill_down(
        q, community_id=community_id, entity=entity, finding=finding, limit=limit,
        offset=offset))
    return _result(r, drill_text(r))


async def index_status_tool(ctx: Context) -> Annotated[CallToolResult, IndexStatus]:
    """Returns what the index holds: counts of documents, text units, entities, relationships,
    communities by level and reports, the provider, and skipped or failed items.

    Use it first to learn which community levels exist (for global_search) and whether an LLM
    is configured (otherwise answers are extractive). Counts cover what you may see. No cost."""

    gw = gateway_of(ctx)

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

    st = await gateway_of(ctx).call("index_status", None, status)
    return _result(st, status_text(st))


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


def canopy_tools() -> list[Tool]:
    """The seven tools as the server lists them."""
    # One result model for all five searches: its fields are described once, on `search`.
    return [_tool(search, "Search (routed)", SearchResult, described=True, nested=True),
            _tool(global_search, "Global search", SearchResult, described=False),
            _tool(local_search, "Local search", SearchResult, described=False),
            _tool(drift_search, "DRIFT search", SearchResult, described=False),
            _tool(basic_search, "Basic search", SearchResult, described=False),
            _tool(drill_down, "Drill down", DrillResult, described=True),
            _tool(index_status_tool, "Index status", IndexStatus, described=True,
                  name="index_status")]
