"""Basic search: plain retrieval-augmented answering over text units (design §6), the baseline
the paper compares against and the quickest way to a specific fact stated in one passage.

Hybrid search fuses full-text (BM25) and vector rankings; with the builtin embedder, which is
lexical, the vector ranking gets a small weight (canopy.server.engines.evidence.vector_weight)."""

from __future__ import annotations

from canopy.errors import InvalidArgument
from canopy.providers.base import ContextBlock, render_blocks
from canopy.server.context import QueryContext
from canopy.server.engines.cards import block_citation
from canopy.server.engines.common import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    pack_blocks,
)
from canopy.server.engines.evidence import vector_weight
from canopy.server.engines.local_engine import unit_block
from canopy.server.results import RouteInfo, SearchResult

__all__ = ["MAX_K", "basic_context", "basic_search"]

MAX_K = 100


async def basic_search(
    ctx: QueryContext, query: str, *, k: int = 10, response_type: str = "multiple paragraphs",
    route: RouteInfo | None = None,
) -> SearchResult:
    """Answer from the k text units most similar to the question (hybrid vector + BM25).
    `route`: why the `search` tool chose this engine, carried by the result (and counted in
    its size)."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidArgument(f"k must be an integer from 1 to {MAX_K} (text units to retrieve).")
    with metered(ctx) as meter:
        await ctx.report_progress(0, 2, "basic search: retrieving passages")
        blocks = await basic_context(ctx, query, k=k)
        await ctx.report_progress(1, 2, f"basic search: answering from {len(blocks)} passages")
        if blocks:
            answer = await ctx.provider.answer(query, blocks, response_type=response_type)
        else:
            answer = NOTHING_FOUND
        await ctx.report_progress(2, 2, "basic search: done")
        result = SearchResult(method="basic", query=query, answer=answer,
                              citations=[block_citation(b) for b in blocks],
                              context=render_blocks(blocks), route=route)
        result = fit_result(ctx, result, more=(
            f"call basic_search with k={max(1, len(blocks) // 2)} or a narrower question, or "
            "local_search for the entities involved."))
        result.usage = meter.info()
        return result


async def basic_context(ctx: QueryContext, query: str, *, k: int) -> list[ContextBlock]:
    """The k best text units for `query` (servable ones), as many as fit the context budget."""
    vector = await ctx.reader.embed(query)
    hits = await ctx.reader.search("text_units", vector=vector, text=query, k=k,
                                   vector_weight=vector_weight(ctx))
    units = ctx.reader.units(h.id for h in hits)
    blocks, _ = pack_blocks([unit_block(*units[h.id]) for h in hits if h.id in units],
                            ctx.settings.local_context_tokens)
    return blocks
