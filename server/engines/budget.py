"""An engine call's budget, which every engine shares: the tokens of context its result can carry
(`context_budget`, `pack_blocks`, `fit_context`), the cap that keeps the result under
agent-host limits (design §6) with a note naming the next call (`fit_result`), and the metering
of the provider calls and tokens it spent (`metered`); beside them, the argument checks every
engine makes first (`check_query`, `check_response_type`, `within_window`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from canopy.errors import InvalidArgument
from canopy.periods import TimeWindow, time_window
from canopy.providers.base import ContextBlock, Usage, render_blocks, usage_scope
from canopy.server.context import QueryContext
from canopy.server.engines.cards import block_citation
from canopy.server.results import Citation, DrillResult, SearchResult, UsageInfo
from canopy.server.tool_text import drill_text, search_text
from canopy.tokenizer import Tokenizer, get_tokenizer

__all__ = [
    "within_window",
    "CUT_ORDER",
    "NOTHING_FOUND",
    "Meter",
    "check_query",
    "check_response_type",
    "citations_of",
    "context_budget",
    "fit_context",
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


def within_window(ctx: QueryContext, since: str | None, until: str | None) -> TimeWindow | None:
    """The window `since` / `until` name (canopy.periods.time_window; InvalidArgument when
    unreadable), set on the request's reader: from here on the call reads only evidence from
    text units whose time falls in it, after the permission filter."""
    window = time_window(since, until)
    ctx.reader.within(window)
    return window


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


# Cut order of a search result's context blocks (design §6: the head of a ranking is never what
# a result cuts): the tail of the least question-specific kinds goes first, the ranked text units
# last, and the first block of each kind stays until nothing else is left.
CUT_ORDER = ("relationship", "claim", "entity", "report", "text_unit")
CITED_KINDS = ("text_unit", "entity", "report")  # relationships and claims: ids in the context
# What a search result carries beside its context, for sizing the context (context_budget):
ANSWER_RESERVE = 700  # tokens of answer, delivered twice (text and structured content)
CITATION_RATE = 0.35  # citation tokens (JSON and text line) per context token, measured
FRAME_TOKENS = 350  # the result's other fields, usage, route and note lines, JSON keys


def context_budget(ctx: QueryContext, *, configured: int | None) -> int:
    """Tokens of context a search result can carry within `[query] result_token_limit`
    beside its answer and citations, or `configured` when set (a larger one is then cut to
    fit, and the result says so). The context is delivered in the structured content and,
    without an LLM, again in the text (up to tool_text.CONTEXT_CHARS characters, about a
    quarter as many tokens)."""
    if configured is not None:
        return configured
    from canopy.server.tool_text import CONTEXT_CHARS

    limit = ctx.settings.result_token_limit
    text_copy = CONTEXT_CHARS // 4 if ctx.provider.name == "builtin" else 0
    room = limit - FRAME_TOKENS - 2 * ANSWER_RESERVE - text_copy - _SLACK
    return max(500, int(room / (1 + CITATION_RATE)))


def citations_of(blocks: list[ContextBlock]) -> list[Citation]:
    """The citations of a context: its text units in rank order (each with its document), then
    its entities and reports (drill_down handles). Relationships and claims are cited by the
    ids the context shows them under: no tool opens them on their own."""
    return [block_citation(b) for kind in CITED_KINDS for b in blocks if b.kind == kind]


def fit_result(ctx: QueryContext, result: SearchResult, *, more: str,
               blocks: list[ContextBlock] | None = None, prefix: str = "",
               left_out: str = "") -> SearchResult:
    """`result` within ctx.settings.result_token_limit tokens, text and structured content
    together (`delivered_tokens`).

    With `blocks` (the context the engine assembled, in delivered order) the context is
    `prefix` + their rendering and the citations are `citations_of(blocks)`; when over the
    limit, whole blocks go in CUT_ORDER, so what remains is still a ranking's head. Without
    blocks (global search), or when no block is left to cut, the answer is cut to a quarter of
    the limit, then the context from its end, then the last citations. `truncated` is set and
    `note` says what was cut and `more`: the exact call that gets the rest. `left_out`: what
    the engine itself left out to fit (e.g. "12 of the 100 passages asked for"), which makes the
    result truncated however it measures."""
    result.usage = result.usage.model_copy(update={"provider": ctx.provider.name})
    if blocks is not None:
        result.context = _render(prefix, blocks)
        result.citations = citations_of(blocks)
    limit = ctx.settings.result_token_limit
    if left_out:
        result.truncated = True
        result.note = _note(limit, 0, 0, 0, 0, more, left_out)
    total = delivered_tokens(result)
    if total <= limit:
        return result
    tok = tokenizer()
    n_citations, context_tokens = len(result.citations), tok.count(result.context)
    # The note is written before measuring, in its longest form (context and citations both
    # cut), so the measured size includes it; _SLACK covers the final usage numbers and digits.
    result.truncated = True
    result.note = _note(limit, context_tokens, max(context_tokens - 1, 0), n_citations,
                        max(n_citations - 1, 0), more, left_out)
    if blocks:
        _, total = _cut_blocks(result, blocks, prefix, total, limit)
    if total + _SLACK > limit:
        _cut_text(result, limit)
    result.note = _note(limit, context_tokens, tok.count(result.context), n_citations,
                        len(result.citations), more, left_out)
    return result


def _render(prefix: str, blocks: list[ContextBlock]) -> str:
    body = render_blocks(blocks)
    return f"{prefix}\n\n{body}" if prefix and body else prefix or body


def _cut_order(blocks: list[ContextBlock]) -> list[int]:
    """Indices of `blocks` in the order they go: per CUT_ORDER kind from the last, the first
    block of each kind kept back until the very end (the ranked units' head last of all)."""
    firsts: list[int] = []
    order: list[int] = []
    for kind in CUT_ORDER:
        of_kind = [i for i, b in enumerate(blocks) if b.kind == kind]
        if of_kind:
            firsts.append(of_kind[0])
            order += reversed(of_kind[1:])
    order += [i for i, b in enumerate(blocks) if b.kind not in CUT_ORDER and i not in firsts]
    return order + firsts[:-1]  # the first unit (or the last kind's first block) stays


def fit_context(ctx: QueryContext, result: SearchResult, blocks: list[ContextBlock], *,
                prefix: str = "", answer_tokens: int = ANSWER_RESERVE) -> list[ContextBlock]:
    """The blocks (whole, in CUT_ORDER) that `result`, its answer not yet written, delivers
    within `[query] result_token_limit` beside an answer of `answer_tokens`: what an engine
    answers from, so that the answer and the context the agent receives are the same."""
    limit = ctx.settings.result_token_limit - 2 * answer_tokens  # in the text and the JSON
    trial = result.model_copy(update={"answer": "", "usage": result.usage.model_copy(
        update={"provider": ctx.provider.name})})
    trial.context = _render(prefix, blocks)
    trial.citations = citations_of(blocks)
    total = delivered_tokens(trial)
    if total + _SLACK <= limit:
        return blocks
    return _cut_blocks(trial, blocks, prefix, total, limit)[0]


def _cut_blocks(result: SearchResult, blocks: list[ContextBlock], prefix: str, total: int,
                limit: int) -> tuple[list[ContextBlock], int]:
    """Drop blocks of `result`'s context in cut order until it measures within `limit`: each
    round removes what its estimate (a block's context tokens and its citation's) says is over,
    then measures once. Returns the blocks kept and the last measure."""
    tok = tokenizer()
    from canopy.server.tool_text import citation_line

    cited = {c.id: c for c in result.citations}

    def saving(b: ContextBlock) -> int:
        n = block_tokens(b)
        c = cited.get(b.id)
        if c is not None:
            n += tok.count(c.model_dump_json()) + tok.count(citation_line(c)) + 1
        return n

    order = _cut_order(blocks)
    gone: set[int] = set()
    kept = blocks
    over = total + _SLACK - limit
    while over > 0 and len(gone) < len(order):
        for i in order:
            if i in gone:
                continue
            gone.add(i)
            over -= saving(blocks[i])
            if over <= 0:
                break
        kept = [b for i, b in enumerate(blocks) if i not in gone]
        result.context = _render(prefix, kept)
        result.citations = citations_of(kept)
        total = delivered_tokens(result)
        over = total + _SLACK - limit
    return kept, total


def _cut_text(result: SearchResult, limit: int) -> None:
    """The answer to a quarter of the limit when it is long, then the context from its end,
    then the last citations, until `result` fits (no block structure left to cut by)."""
    tok = tokenizer()
    context_tokens = tok.count(result.context)

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


def _note(limit: int, context_was: int, context_now: int, citations_were: int,
          citations_now: int, more: str, left_out: str = "") -> str:
    cut = [left_out] if left_out else []
    if context_now < context_was:
        cut.append(f"context cut from {context_was} to {context_now} tokens")
    if citations_now < citations_were:
        cut.append(f"citations cut from {citations_were} to {citations_now}")
    return (f"Result cut to fit the {limit}-token limit ({'; '.join(cut) or 'answer cut'}). "
            f"For more, {more}")
