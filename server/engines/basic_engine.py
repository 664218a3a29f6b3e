"""Basic search: plain retrieval-augmented answering over text units (design §6), the baseline
the paper compares against and the quickest way to a specific fact stated in one passage.

Passages are ranked by what each states of the question, as local search ranks its text units
but without the graph (canopy.server.engines.evidence.rank_units): candidates from full-text
search for the question and its clauses and from vector search, scored by BM25, question bigrams
and the best sentence window; with a semantic embedder the vector ranking is fused in, with the
builtin one (lexical) it only adds candidates. Measured as delivered with `canopy eval`."""

from __future__ import annotations

from canopy.errors import InvalidArgument
from canopy.providers.base import ContextBlock
from canopy.server.context import QueryContext
from canopy.server.engines.budget import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    context_budget,
    fit_context,
    fit_result,
    metered,
    pack_blocks,
    within_window,
)
from canopy.server.engines.evidence import rank_units
from canopy.server.engines.local_engine import MIN_EXCERPT_TOKENS, excerpt_block
from canopy.server.results import RouteInfo, SearchResult

__all__ = ["MAX_K", "basic_context", "basic_passages", "basic_search"]

MAX_K = 100


async def basic_search(
    ctx: QueryContext, query: str, *, k: int = 10, response_type: str = "multiple paragraphs",
    route: RouteInfo | None = None, since: str | None = None, until: str | None = None,
) -> SearchResult:
    """Answer from the k text units most similar to the question (hybrid vector + BM25).
    `route`: why the `search` tool chose this engine, carried by the result (and counted in
    its size). `since` / `until`: only passages from that time (budget.within_window)."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    within_window(ctx, since, until)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidArgument(f"k must be an integer from 1 to {MAX_K} (text units to retrieve).")
    with metered(ctx) as meter:
        await ctx.report_progress(0, 2, "basic search: retrieving passages")
        blocks, available = await basic_passages(ctx, query, k=k)
        result = SearchResult(method="basic", query=query, answer="", route=route)
        if ctx.settings.local_context_tokens is None:  # answer from what is delivered whole
            blocks = fit_context(ctx, result, blocks)
        await ctx.report_progress(1, 2, f"basic search: answering from {len(blocks)} passages")
        if blocks:
            answer = await ctx.provider.answer(query, blocks, response_type=response_type)
        else:
            answer = NOTHING_FOUND
        await ctx.report_progress(2, 2, "basic search: done")
        result.answer = answer
        short = len(blocks) < min(k, available)
        left_out = f"{len(blocks)} of the {k} passages asked for" if short else ""
        result = fit_result(ctx, result, blocks=blocks, left_out=left_out, more=(
            f"ask basic_search a narrower question (k={max(1, len(blocks))} passages fit), or "
            "local_search for the entities involved; a cited passage opens whole as "
            "canopy://units/<id>."))
        result.usage = meter.info()
        return result


async def basic_context(ctx: QueryContext, query: str, *, k: int) -> list[ContextBlock]:
    """The k best text units for `query` (servable ones), as many as fit the context budget."""
    return (await basic_passages(ctx, query, k=k))[0]


async def basic_passages(ctx: QueryContext, query: str, *, k: int
                         ) -> tuple[list[ContextBlock], int]:
    """basic_context, and how many of the k were found (more than the blocks when not all fit):
    units ranked by what each passage itself states of the question (evidence.rank_units
    without the graph), fused with the vector ranking when the embedder is semantic."""
    vector = await ctx.reader.embed(query)
    ranked = await rank_units(ctx, query, vector, graph=False)
    units = ctx.reader.units(ranked[:k])
    budget = context_budget(ctx, configured=ctx.settings.local_context_tokens)
    share = max(MIN_EXCERPT_TOKENS, budget // k)  # k passages share the budget, excerpted
    blocks, _ = pack_blocks([excerpt_block(ctx, *units[u], query, share)
                             for u in ranked[:k] if u in units], budget)
    return blocks, len(units)
