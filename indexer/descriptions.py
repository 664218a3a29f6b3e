"""One description per merged element (design §3.4): its only instance description as is, or
a summary of several written by the provider, memoized by its full input so an unchanged
instance set is never summarized twice (the merge itself: canopy.indexer.operations.merging)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from canopy.errors import InvalidOutput
from canopy.indexer.operations.merging import summary_input, summary_key
from canopy.providers.base import Provider, prompt_key
from canopy.store.sources import cache_sources
from canopy.tokenizer import Tokenizer

__all__ = ["BatchDescriber", "Pending", "SummaryMemo", "describe"]


class SummaryMemo(Protocol):
    def cache_get(self, key: str) -> str | None: ...
    def cache_put(self, key: str, response: str) -> None: ...


class BatchDescriber(Protocol):
    """Descriptions of several elements at once, by a provider that computes rather than asks
    (the builtin one over worker processes: canopy.providers.builtin.processes)."""

    batch_size: int

    async def describe_batch(self, items: list[list[str]], *, max_tokens: int) -> list[str]:
        """Each element's description from what the summary input keeps of its descriptions."""
        ...


@dataclass(frozen=True)
class Pending:
    """An element whose description is to be settled: its name, its distinct instance
    descriptions, and the units those come from (the summary request quotes them)."""

    name: str
    descriptions: tuple[str, ...]
    units: tuple[str, ...]


async def describe(
    pending: dict[str, Pending],
    provider: Provider,
    tok: Tokenizer,
    *,
    max_tokens: int,
    memo: SummaryMemo | None,
    concurrency: int,
    on_done: Callable[[], None] | None = None,
    settled: Callable[[dict[str, str]], Awaitable[None]] | None = None,
    batch: BatchDescriber | None = None,
) -> dict[str, str]:
    """One description per element id from `pending`: the only description as is, or a
    summary of several (one provider call each, unless this exact input was summarized
    before; what is cached records the element's units, canopy.store.sources).
    `settled(descriptions)` is awaited once, as soon as the requests are started, with the
    descriptions known without one (most of them: single descriptions, memoized summaries,
    descriptions that fit joined), so the caller can write those while the requests run.
    `batch` (with no `memo`: what it computes is cheaper to compute again) describes the
    elements of several descriptions in batches instead of one call each."""
    sem = asyncio.Semaphore(concurrency)
    out: dict[str, str] = {}

    async def one(element_id: str, name: str, descs: tuple[str, ...], units: tuple[str, ...]
                  ) -> None:
        kept = summary_input(list(descs), tok)
        key = summary_key(provider.name, max_tokens, name, kept, prompt_key(provider, "summarize"))
        text = memo.cache_get(key) if memo else None
        if text is None:
            with cache_sources(units):
                try:
                    async with sem:
                        text = await provider.summarize(name, kept, max_tokens=max_tokens)
                except InvalidOutput:
                    text = ""  # fall back to the joined descriptions below; never fail the index
                if memo and text:
                    memo.cache_put(key, text)
        if on_done:
            on_done()
        out[element_id] = text.strip() or " ".join(kept)

    async def part(chunk: list[tuple[str, tuple[str, ...]]], by: BatchDescriber) -> None:
        got = await by.describe_batch([summary_input(list(descs), tok) for _, descs in chunk],
                                      max_tokens=max_tokens)
        for (element_id, _), text in zip(chunk, got, strict=True):
            out[element_id] = text
            if on_done:
                on_done()

    several = []
    batched: list[tuple[str, tuple[str, ...]]] = []
    for element_id, p in sorted(pending.items()):
        if len(p.descriptions) <= 1:
            out[element_id] = p.descriptions[0] if p.descriptions else ""
        elif batch is not None and memo is None:
            batched.append((element_id, p.descriptions))
        else:
            several.append(asyncio.ensure_future(
                one(element_id, p.name, p.descriptions, p.units)))
    if batch is not None:
        n = batch.batch_size
        several += [asyncio.ensure_future(part(batched[i:i + n], batch))
                    for i in range(0, len(batched), n)]
    try:
        if settled is not None:
            if several:
                # Every task takes its first step before this resumes: those that need no
                # request are done by then, the others wait on their request.
                await asyncio.sleep(0)
            await settled(dict(out))
        await asyncio.gather(*several)
    finally:
        for task in several:
            task.cancel()
    return out
