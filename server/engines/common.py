"""What every engine shares: argument checks, per-call metering, token budgets, and the cap that
keeps a result under agent-host limits (design §6) with a note naming the next call."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from canopy.errors import InvalidArgument
from canopy.providers.base import ContextBlock, Usage, usage_scope
from canopy.server.context import QueryContext
from canopy.server.results import DrillResult, SearchResult, UsageInfo
from canopy.server.tool_text import drill_text, search_text
from canopy.tokens import Tokenizer, get_tokenizer

__all__ = [
    "NOTHING_FOUND",
    "Meter",
    "check_query",
    "check_response_type",
    "delivered_chars",
    "delivered_tokens",
    "fit_result",
    "metered",
    "pack_blocks",
    "tokenizer",
]

NOTHING_FOUND = (
    "No relevant information was found in the indexed documents for this question. "
    "Try rephrasing it with names or terms that the documents use, or browse the topics with "
    "drill_down()."
)
EMBED_TASK = "embed"  # the embedding client's task name; counted apart from chat calls
_SLACK = 30  # tokens kept free for numbers that change after measuring (usage, note counts)


def tokenizer() -> Tokenizer:
    return get_tokenizer()


def check_query(query: str) -> str:
    q = " ".join((query or "").split())
    if not q:
        raise InvalidArgument("query must not be empty: ask a question in words.")
    return q


def check_response_type(response_type: str) -> str:
    rt = " ".join((response_type or "").split())
    if not rt:
        raise InvalidArgument(
            "response_type must not be empty, e.g. 'multiple paragraphs' or 'a short list'."
        )
    return rt


# ---- metering -------------------------------------------------------------------------------


@dataclass
class Meter:
    """Provider calls, tokens and wall time of one engine call (and only that call)."""

    provider: str
    started: float = field(default_factory=time.perf_counter)
    usage: dict[str, Usage] = field(default_factory=dict)

    def info(self) -> UsageInfo:
        chat = [u for task, u in self.usage.items() if task != EMBED_TASK]
        embed = self.usage.get(EMBED_TASK, Usage())
        return UsageInfo(
            llm_calls=sum(u.calls for u in chat),
            prompt_tokens=sum(u.prompt_tokens for u in chat),
            completion_tokens=sum(u.completion_tokens for u in chat),
            elapsed_ms=round((time.perf_counter() - self.started) * 1000),
            provider=self.provider,
            embedding_calls=embed.calls,
        )


@contextmanager
def metered(ctx: QueryContext) -> Iterator[Meter]:
    """Meter the `with` block: provider calls made by it and by the tasks it starts count; calls
    of concurrent engine calls on the same provider do not (canopy.providers.base.usage_scope)."""
    with usage_scope() as usage:
        yield Meter(provider=ctx.provider.name, usage=usage)


# ---- budgets --------------------------------------------------------------------------------


def block_tokens(block: ContextBlock) -> int:
    """Tokens of a block as render_blocks writes it (its header line and text)."""
    return tokenizer().count(f"[{block.kind} {block.id}] {block.title}\n{block.text}") + 1


def pack_blocks(blocks: list[ContextBlock], budget: int) -> tuple[list[ContextBlock], int]:
    """The leading blocks that fit `budget` tokens, in order, and the tokens they use. If the
    first block alone is too large, its text is cut to fit, so some context always remains."""
    out: list[ContextBlock] = []
    used = 0
    for b in blocks:
        n = block_tokens(b)
        if used + n > budget:
            if not out and budget > 50:
                head = tokenizer().count(f"[{b.kind} {b.id}] {b.title}") + 2
                cut = replace(b, text=tokenizer().truncate(b.text, max(budget - head, 0)) + " …")
                out.append(cut)
                used = block_tokens(cut)
            break
        out.append(b)
        used += n
    return out, used


# ---- result cap -----------------------------------------------------------------------------


def delivered_tokens(result: SearchResult | DrillResult) -> int:
    """Tokens of a result as an MCP client receives it: its text rendering plus its
    structured content (compact JSON, as on the wire). Agent hosts count both against their
    limits, so `[query] result_token_limit` caps the sum."""
    tok = tokenizer()
    return sum(tok.count(part) for part in _delivered(result))


def delivered_chars(result: SearchResult | DrillResult) -> int:
    """Characters of what `delivered_tokens` counts (no tokenizing: for estimates)."""
    return sum(len(part) for part in _delivered(result))


def _delivered(result: SearchResult | DrillResult) -> tuple[str, str]:
    """What a client receives of `result`: its text rendering and its structured content."""
    text = search_text(result) if isinstance(result, SearchResult) else drill_text(result)
    return text, result.model_dump_json()


def fit_result(ctx: QueryContext, result: SearchResult, *, more: str) -> SearchResult:
    """`result` within ctx.settings.result_token_limit tokens, text and structured content
    together (`delivered_tokens`).

    Citations the answer mentions come first. When over the limit the context is cut first, then
    citations (the answer last); `truncated` is set and `note` says what was cut and `more`: the
    exact call that gets the rest."""
    cited = [c for c in result.citations if c.id in result.answer]
    result.citations = cited + [c for c in result.citations if c.id not in result.answer]
    # The text shows the context only for extractive answers: measure as it will be rendered.
    result.usage = result.usage.model_copy(update={"provider": ctx.provider.name})
    limit = ctx.settings.result_token_limit
    tok = tokenizer()
    if delivered_tokens(result) <= limit:
        return result
    n_citations, context_tokens = len(result.citations), tok.count(result.context)
    # The note is written before measuring, in its longest form (context and citations both
    # cut), so the measured size includes it; _SLACK covers the final usage numbers and digits.
    result.truncated = True
    result.note = _note(limit, context_tokens, max(context_tokens - 1, 0), n_citations,
                        max(n_citations - 1, 0), more)

    def room() -> int:  # what context and citations may take
        bare = result.model_copy(update={"context": "", "citations": []})
        return limit - delivered_tokens(bare) - _SLACK

    space = room()
    if space < limit // 4:  # the answer itself is long: keep a quarter for citations and context
        # The answer is in the text and in the structured content: each token cut saves two.
        short = max(tok.count(result.answer) - (limit // 4 - space + 1) // 2 - 5, 0)
        result.answer = tok.truncate(result.answer, short) + " …"
        space = room()
    keep, spent = [], 0
    for c in result.citations:
        n = 2 * (tok.count(c.model_dump_json()) + 1)  # its JSON, and at most as much as a line
        if spent + n > space // 2 and spent + n > space - context_tokens:
            break
        keep.append(c)
        spent += n
    result.citations = keep
    budget = space - spent
    context = result.context
    fits = False  # measured within the limit as it stands (counting is most of a fit's cost)
    for _ in range(8):  # the estimates above are rough: measure, and cut what is still over
        if budget <= 0:
            result.context = ""
            break
        ellipsis = " …" if budget < context_tokens else ""
        result.context = tok.truncate(context, budget) + ellipsis
        over = delivered_tokens(result) + _SLACK - limit
        if over <= 0:
            fits = True
            break
        budget -= over + 10
    while not fits and delivered_tokens(result) + _SLACK > limit and (
            result.citations or result.context):
        if result.citations:  # the context could not absorb it all: the last citations go
            result.citations.pop()
        else:
            result.context = ""
    result.note = _note(limit, context_tokens, tok.count(result.context), n_citations,
                        len(result.citations), more)
    return result


def _note(limit: int, context_was: int, context_now: int, citations_were: int,
          citations_now: int, more: str) -> str:
    cut = []
    if context_now < context_was:
        cut.append(f"context cut from {context_was} to {context_now} tokens")
    if citations_now < citations_were:
        cut.append(f"citations cut from {citations_were} to {citations_now}")
    return (f"Result cut to fit the {limit}-token limit ({'; '.join(cut) or 'answer cut'}). "
            f"For more, {more}")
