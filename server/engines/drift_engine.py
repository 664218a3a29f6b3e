"""DRIFT search: a global primer, then local follow-ups (design §6; Microsoft's DRIFT search).

1. Primer: a hypothetical answer to the question (HyDE) is embedded and matched, with the
   question's own words, against the community reports; the best ones give an intermediate
   answer, its score and follow-up questions.
2. Follow-ups: for `drift_depth` rounds, the `drift_breadth` best open follow-ups (by the score
   of the answer that raised them, then in the order they were raised: no random choice) are
   answered concurrently from their local-search context, each raising follow-ups of its own.
3. Reduce: the intermediate answers, as scored points, are reduced to the final answer.
Deterministic for a given index, provider and settings.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from canopy.ids import normalize_name
from canopy.providers.base import ContextBlock, DriftOut, MapPoint
from canopy.server.context import QueryContext
from canopy.server.engines.budget import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    pack_blocks,
    within_window,
)
from canopy.server.engines.evidence import excerpt_text, vector_weight
from canopy.server.engines.local_engine import build_local_context, report_block
from canopy.server.results import SearchResult

__all__ = ["PRIMER_REPORTS", "drift_search"]

PRIMER_REPORTS = 5  # reports the primer reads
STEP_TOKENS = 8000  # context of each step when [query] local_context_tokens is not set
STEPS_SHARE = 0.15  # of the result limit, for the steps' own answers (the rest: their sources)


@dataclass
class _Step:
    question: str
    depth: int
    answer: str = ""
    score: int = 0
    blocks: list[ContextBlock] = field(default_factory=list)
    follow_ups: list[str] = field(default_factory=list)

    def take(self, out: DriftOut) -> None:
        self.answer, self.score, self.follow_ups = (
            out.intermediate_answer, out.score, out.follow_up_queries)


async def drift_search(
    ctx: QueryContext, query: str, *, response_type: str = "multiple paragraphs",
    since: str | None = None, until: str | None = None,
) -> SearchResult:
    """Answer a question that needs both the big picture and specific details; `since` /
    `until` as basic_search's."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    within_window(ctx, since, until)
    depth, breadth = ctx.settings.drift_depth, ctx.settings.drift_breadth
    total = 2 + depth * breadth  # primer, follow-ups (at most), reduce
    with metered(ctx) as meter:
        await ctx.report_progress(0, total, "drift: primer over the most similar community reports")
        steps = [await _primer(ctx, query)]
        done = 1
        raised = len(steps[0].follow_ups)
        await ctx.report_progress(done, total, f"drift: primer raised {raised} follow-ups")
        asked = {normalize_name(query)}
        for level in range(1, depth + 1):
            chosen = _next_questions(steps, asked, breadth)
            if not chosen:
                break

            async def follow(question: str, level: int = level) -> _Step:
                nonlocal done
                step = await _follow_up(ctx, question, level)
                done += 1
                await ctx.report_progress(done, total,
                                          f"drift: depth {level}: answered {question!r}")
                return step

            steps += await asyncio.gather(*(follow(q) for q in chosen))
        points = [MapPoint(description=s.answer, score=max(0, min(100, s.score)),
                           report_ids=[b.id for b in s.blocks if b.kind == "report"])
                  for s in steps if s.answer.strip()]
        if any(p.score > 0 for p in points):
            answer = await ctx.provider.reduce(query, points, response_type=response_type)
        else:
            answer = NOTHING_FOUND
        await ctx.report_progress(total, total, "drift: done")

        blocks = _cited_first(answer, [b for s in steps for b in s.blocks])
        result = SearchResult(method="drift", query=query, answer=answer)
        result = fit_result(ctx, result, blocks=blocks, prefix=_steps_text(ctx, steps),
                            more=_more(steps, asked))
        result.usage = meter.info()
        return result


async def _primer(ctx: QueryContext, query: str) -> _Step:
    hypothetical = await ctx.provider.hyde(query)
    vector = await ctx.reader.embed(hypothetical or query)
    hits = await ctx.reader.search("reports", vector=vector, text=query, k=PRIMER_REPORTS,
                                   vector_weight=vector_weight(ctx))
    served = await ctx.reader.reports(h.id for h in hits)
    reports = [served[h.id] for h in hits if h.id in served]
    blocks, _ = pack_blocks([report_block(r) for r in reports], _step_budget(ctx))
    step = _Step(query, 0, blocks=blocks)
    if blocks:
        step.take(await ctx.provider.drift(query, blocks))
    return step


async def _follow_up(ctx: QueryContext, question: str, depth: int) -> _Step:
    local = await build_local_context(ctx, question, budget=_step_budget(ctx))
    step = _Step(question, depth, blocks=local.blocks)
    if local.blocks:
        step.take(await ctx.provider.drift(question, local.blocks))
    return step


def _open_questions(steps: list[_Step], asked: set[str]) -> list[str]:
    """Follow-ups not yet asked: those raised by better-scored answers first, then earlier."""
    ranked = sorted(((-s.score, i, j, q) for i, s in enumerate(steps)
                     for j, q in enumerate(s.follow_ups) if q.strip()))
    out: list[str] = []
    seen = set(asked)
    for *_, q in ranked:
        key = normalize_name(q)
        if key and key not in seen:
            seen.add(key)
            out.append(q.strip())
    return out


def _next_questions(steps: list[_Step], asked: set[str], breadth: int) -> list[str]:
    """The `breadth` best open follow-ups, added to `asked` (normalized) so that no later
    round asks them again."""
    chosen = _open_questions(steps, asked)[:breadth]
    asked.update(normalize_name(q) for q in chosen)
    return chosen


def _step_budget(ctx: QueryContext) -> int:
    """Context tokens of one DRIFT step: the steps' contexts are not delivered whole (their
    union is fitted to the result limit), so a step reads as much as a full local context."""
    return ctx.settings.local_context_tokens or STEP_TOKENS


def _cited_first(answer: str, blocks: list[ContextBlock]) -> list[ContextBlock]:
    """The steps' blocks, each once: those the answer cites first, in the order it cites them,
    then the rest in step order. Whole blocks are cut from the end of each kind, so what the
    answer rests on is what the agent keeps longest."""
    unique = list({(b.kind, b.id): b for b in blocks}.values())
    cited = {b.id: at for b in unique if (at := answer.find(b.id)) >= 0}
    return sorted(unique, key=lambda b: (b.id not in cited, cited.get(b.id, 0)))


def _steps_text(ctx: QueryContext, steps: list[_Step]) -> str:
    """Each step's question and answer, the answers cut to their best-matching sentences so
    that all steps together take at most STEPS_SHARE of the result limit: the final answer
    already combines them, and the rest of the limit is the sources'."""
    per_step = int(ctx.settings.result_token_limit * STEPS_SHARE) // max(len(steps), 1)
    parts = []
    for s in steps:
        head = "Primer" if s.depth == 0 else f"Follow-up (depth {s.depth})"
        text = excerpt_text(ctx, s.answer, s.question, per_step)
        parts.append(f"----- {head}: {s.question} (score {s.score}) -----\n{text}")
    return "\n\n".join(parts)


def _more(steps: list[_Step], asked: set[str]) -> str:
    open_ = _open_questions(steps, asked)
    if open_:
        return f"call local_search(query={open_[0]!r}) to follow the next open question."
    reports = [b.id for s in steps for b in s.blocks if b.kind == "report"]
    if reports:
        return f"call drill_down(community_id={reports[0]!r}) to read a cited report in full."
    return "ask drift_search a narrower question."
