"""The one report writer: a community report written by a provider from the context that
canopy.indexer.operations.report_context assembles (Edge et al. 2024 §2.1.5). The indexer calls
it for canonical reports, the per-caller views (canopy.acl.views) for a community's visible part.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from canopy.errors import InvalidOutput
from canopy.indexer.operations.report_context import (
    CommunityContent,
    ElementSizes,
    build_report_context,
    context_units,
    to_report,
)
from canopy.model import Community, Report
from canopy.providers.base import Provider, ReportContext, ReportOut
from canopy.store.sources import cache_sources

__all__ = ["report_from_context", "write_report"]


async def write_report(
    content: CommunityContent,
    child_reports: Callable[[], Awaitable[dict[str, Report]]],
    provider: Provider,
    sizes: ElementSizes,
    *,
    context_tokens: int,
    max_tokens: int,
    fallback: Provider | None = None,
) -> Report:
    """A report of `content`. `child_reports()` is awaited only when the elements do not fit
    the budget (sub-report substitution needs the children's reports). Raises InvalidOutput
    when the provider's output stays invalid, unless `fallback` (e.g. the offline provider,
    for views that must exist whenever their community does) writes it instead."""
    c = content.community
    total = sum(sizes.entity(e) for e in content.entities.values()) + sum(
        sizes.relationship(r) for r in content.relationships.values())
    children = await child_reports() if c.children and total > context_tokens else {}
    ctx = build_report_context(content, children, sizes, context_tokens)
    return await report_from_context(c, ctx, provider, sizes, max_tokens=max_tokens,
                                     fallback=fallback)


async def report_from_context(c: Community, ctx: ReportContext, provider: Provider,
                              sizes: ElementSizes, *, max_tokens: int,
                              fallback: Provider | None = None) -> Report:
    """The report of community `c` written by `provider` from `ctx` (see `write_report`)."""
    tokens = sizes.context(ctx)
    with cache_sources(context_units(ctx)):  # the request quotes what these units gave
        try:
            out: ReportOut = await provider.report(ctx, max_tokens=max_tokens)
        except InvalidOutput:
            if fallback is None:
                raise
            out = await fallback.report(ctx, max_tokens=max_tokens)
    return to_report(c, ctx, out, tokens)
