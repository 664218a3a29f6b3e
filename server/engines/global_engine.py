"""Global search: map-reduce over community reports (Edge et al. 2024 §2.2; design §6).

1. Reports: those standing for one level (`level_partition`: the communities at L plus the
   childless shallower ones, the paper's C0..C3), or chosen dynamically: rate every top
   community (report digests, several per call), keep the relevant ones and rate their
   children, keeping a child in place of its parent (GraphRAG's dynamic community selection,
   `keep_parent=False`). Rating calls to an endpoint are bounded per question (`[query]
   dynamic_max_rating_calls`); past the bound the candidates most similar to the question are
   the ones rated. When nothing is rated relevant, the best-rated reports are read anyway (one
   map call's worth) and the coverage says so: a question always gets an answer from the
   reports that came closest. Every result carries its coverage: per level, what was
   considered, rated, found relevant and read, and what the ratings cost (calls, prompt tokens).
2. Map: reports shuffled with a fixed seed, packed into token-budgeted batches; one concurrent
   map call per batch returns points scored 0-100.
3. Reduce: zero-score points are dropped; the best points fill the reduce context; one call
   writes the answer. When nothing scores above zero the answer says so without a reduce call.

A question about change over time (canopy.server.engines.change_questions) is answered period
by period instead (canopy.server.engines.global_change): the selected communities' evidence is
cut into periods, each period is mapped and reduced on its own, and the answer and citations
follow the periods in time order. `since` / `until` restrict every question to the evidence of
that window (budget.within_window).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TypeVar

from canopy.errors import InvalidArgument, InvalidOutput
from canopy.model import Document, Report, TextUnit
from canopy.providers.base import MapOut, MapPoint, usage_scope
from canopy.server.context import QueryContext
from canopy.server.engines.budget import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    tokenizer,
    within_window,
)
from canopy.server.engines.change_questions import change_question
from canopy.server.engines.evidence import excerpt, vector_weight
from canopy.server.engines.global_change import (
    PERIOD_POINTS,
    UNIT_EXCERPT_TOKENS,
    PeriodEvidence,
    period_citations,
    period_evidence,
)
from canopy.server.results import Citation, Coverage, LevelCoverage, RouteInfo, SearchResult

__all__ = [
    "RELEVANCE_THRESHOLD",
    "global_search",
    "map_batches",
    "reports_at_level",
    "select_reports",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

RELEVANCE_THRESHOLD = 5  # a report rated at least this (0-10) is relevant to the query
DYNAMIC_FALLBACK_MAX_LEVEL = 2  # when no root is relevant, rate whole levels down to this one


class _Tally:
    """Coverage counts as selection and map go: per level, calls, and what rating cost."""

    def __init__(self, selection: str) -> None:
        self.selection = selection
        self.levels: dict[int, LevelCoverage] = {}
        self.rating_calls = self.map_calls = self.unrated = self.unmapped = 0
        self.rating_prompt_tokens = 0
        self.rating_bound: int | None = None  # set when the bound left candidates unrated
        self.note: str | None = None

    def at(self, level: int) -> LevelCoverage:
        return self.levels.setdefault(level, LevelCoverage(level=level))

    def coverage(self) -> Coverage:
        return Coverage(selection=self.selection,
                        levels=[self.levels[k] for k in sorted(self.levels)],
                        rating_calls=self.rating_calls, map_calls=self.map_calls,
                        rating_prompt_tokens=self.rating_prompt_tokens,
                        rating_bound=self.rating_bound, unrated=self.unrated,
                        unmapped=self.unmapped, note=self.note)


async def global_search(
    ctx: QueryContext,
    query: str,
    *,
    community_level: int | None = None,
    response_type: str = "multiple paragraphs",
    route: RouteInfo | None = None,
    since: str | None = None,
    until: str | None = None,
) -> SearchResult:
    """Answer a question about the whole corpus from community reports (map-reduce).

    `community_level` None means ctx.settings.community_level, and dynamic selection when that
    is None too. `route`, `since`, `until`: as basic_search's."""
    query = check_query(query)
    response_type = check_response_type(response_type)
    within_window(ctx, since, until)
    change = change_question(query)
    level = community_level if community_level is not None else ctx.settings.community_level
    with metered(ctx) as meter:
        if level is not None:
            tally = _Tally("level")
            reports = await reports_at_level(ctx, level)
            for r in reports:
                tally.at(r.level).considered += 1
        else:
            tally = _Tally("dynamic")
            reports = await select_reports(ctx, query, tally)
        if change is not None:
            answer, citations, context = await _by_period(ctx, query, reports, response_type,
                                                          tally, change)
        else:
            answer, citations, context = await _whole(ctx, query, reports, response_type, tally)
        result = SearchResult(method="global", query=query, answer=answer, citations=citations,
                              context=context, community_level=level,
                              coverage=tally.coverage(), route=route)
        first = repr(citations[0].id) if citations else "'<report id>'"
        result = fit_result(ctx, result, more=(
            f"call drill_down(community_id={first}) to read a cited report in full, or ask "
            "global_search a narrower question."))
        result.usage = meter.info()
        return result


async def _whole(ctx: QueryContext, query: str, reports: list[Report], response_type: str,
                 tally: _Tally) -> tuple[str, list[Citation], str]:
    """(answer, citations, context) of one map over `reports` and one reduce."""
    points = await _map(ctx, query, reports, response_type, tally) if reports else []
    kept, context = _best_points(points, ctx.settings.reduce_tokens)
    if kept:
        await ctx.report_progress(0, 1, "reduce: writing the answer")
        answer = await ctx.provider.reduce(query, kept, response_type=response_type)
        await ctx.report_progress(1, 1, "reduce: done")
    else:
        answer = NOTHING_FOUND
    cited = list(dict.fromkeys(rid for p in kept for rid in p.report_ids))
    titles = {r.community_id: r.title for r in reports}
    citations = [Citation(kind="report", id=rid, title=titles[rid]) for rid in cited
                 if rid in titles]
    return answer, citations, context


MIN_PERIOD_REDUCE_TOKENS = 600  # a period's share of the reduce budget at least


async def _by_period(ctx: QueryContext, query: str, reports: list[Report], response_type: str,
                     tally: _Tally, change: str) -> tuple[str, list[Citation], str]:
    """(answer, citations, context) of a question about change: one map and one reduce per
    period of the selected communities' evidence, joined earliest period first."""
    own = {u for r in reports for f in r.findings for u in f.text_unit_ids}
    own |= {u for r in reports for u in r.text_unit_ids}
    units = ctx.reader.units(sorted(own))  # servable and in the window only

    def cut(unit: TextUnit, doc: Document) -> str:
        return excerpt(ctx, unit, doc, query, UNIT_EXCERPT_TOKENS)

    evidence: PeriodEvidence = period_evidence(query, reports, units, cut)
    periods = evidence.periods
    tally.note = (f"a question about change ({change}): answered by {evidence.granularity} "
                  f"over {len(periods)} period{'s' if len(periods) != 1 else ''}"
                  + (f", {periods[0]} to {periods[-1]}" if periods else "")
                  + "; each period's points come from that period's sources")
    if not periods:
        return NOTHING_FOUND, [], ""
    budget = max(MIN_PERIOD_REDUCE_TOKENS, ctx.settings.reduce_tokens // len(periods))
    kept_by_period: dict[str, tuple[list[MapPoint], str]] = {}
    for period in periods:  # map calls of one period run concurrently; periods in turn
        points = await _map(ctx, query, evidence.reports[period], response_type, tally)
        kept, context = _best_points(points, budget, most=PERIOD_POINTS)
        if kept:
            kept_by_period[period] = (kept, context)
    if not kept_by_period:
        return NOTHING_FOUND, [], ""
    order = sorted(kept_by_period)
    await ctx.report_progress(0, len(order), "reduce: writing the answer period by period")
    answers = await asyncio.gather(*(ctx.provider.reduce(
        query, kept_by_period[p][0], response_type=response_type) for p in order))
    await ctx.report_progress(len(order), len(order), "reduce: done")
    answer = "\n\n".join(f"## {p}\n{a.strip()}" for p, a in zip(order, answers, strict=True))
    context = "\n\n".join(f"===== {p} =====\n{kept_by_period[p][1]}" for p in order)
    citations = [c for p in order for c in period_citations(p, kept_by_period[p][0], evidence)]
    return answer, citations, context


async def reports_at_level(ctx: QueryContext, level: int) -> list[Report]:
    """The servable reports standing for `level` (communities at it plus childless shallower)."""
    _check_level(ctx, level)
    ids = ctx.reader.level_partition(level)
    served = await ctx.reader.reports(ids)
    return [served[c] for c in ids if c in served]


def _check_level(ctx: QueryContext, level: int) -> None:
    # The caller's deepest level: levels made only of hidden communities do not exist for them.
    top = ctx.reader.deepest_level()
    if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= top:
        raise InvalidArgument(
            f"community_level must be an integer from 0 (broadest) to {top} (most specific) "
            "in this index, or omitted for dynamic selection."
        )


async def select_reports(ctx: QueryContext, query: str, tally: _Tally | None = None
                         ) -> list[Report]:
    """Dynamic community selection: rate every top community of the caller's hierarchy (their
    digests, several per call), descend into relevant reports' children; a relevant child
    replaces its parent. If no top is relevant, whole levels are rated, down to
    DYNAMIC_FALLBACK_MAX_LEVEL, until something is. Nothing is left out for want of shared
    words: only `[query] dynamic_max_rated` (reports) and, for a provider that calls an
    endpoint, `[query] dynamic_max_rating_calls` cap the ratings, and then the candidates least
    similar to the question are the ones left (counted in the coverage). If nothing is rated
    relevant, the best-rated reports are returned anyway (`_best_rated`, noted)."""
    tally = tally or _Tally("dynamic")
    reader = ctx.reader
    relevant: dict[str, Report] = {}
    parent_of: dict[str, str] = {}
    scored: list[tuple[Report, int]] = []  # every report rated, with its rating
    queue = reader.roots()
    tops = list(queue)
    rated: set[str] = set()
    rank: dict[str, int] | None = None
    # The builtin provider's ratings cost nothing: only calls to an endpoint are bounded.
    max_calls = ctx.settings.dynamic_max_rating_calls
    bounded = ctx.provider.concurrency() is not None
    level = 0
    while queue:
        for row in reader.community_rows(queue).values():
            tally.at(row.level).considered += 1
        served = await reader.reports(queue)
        reports = [served[cid] for cid in queue if cid in served]
        room = max(0, ctx.settings.dynamic_max_rated - len(rated))
        calls_left = max_calls - tally.rating_calls if bounded else None
        batches = _rating_batches(ctx, reports)
        if len(reports) > room or (calls_left is not None and len(batches) > calls_left):
            rank = rank if rank is not None else await _similarity_rank(ctx, query)
            reports = sorted(reports, key=lambda r: (rank.get(r.community_id, len(rank)),
                                                     r.community_id))[:room]
            batches = _rating_batches(ctx, reports)
            if calls_left is not None and len(batches) > calls_left:
                batches = batches[:calls_left]
                tally.rating_bound = max_calls
            kept = sum(len(b) for b in batches)
            tally.unrated += len(served) - kept
            reports = [r for b in batches for r in b]
        rated.update(r.community_id for r in reports)
        scores = await _rate(ctx, query, batches, tally)
        queue = []
        relevant_now = [r.community_id for r, score in zip(reports, scores, strict=True)
                        if score is not None and score >= RELEVANCE_THRESHOLD]
        children = reader.child_ids(relevant_now)
        for report, score in zip(reports, scores, strict=True):
            if score is None:
                continue
            tally.at(report.level).rated += 1
            scored.append((report, score))
            if score < RELEVANCE_THRESHOLD:
                continue
            tally.at(report.level).relevant += 1
            cid = report.community_id
            relevant[cid] = report
            relevant.pop(parent_of.get(cid, ""), None)
            for child in reader.servable_tops(children.get(cid, [])):
                if child not in rated:
                    parent_of[child] = cid
                    queue.append(child)
        level += 1
        spent = bounded and tally.rating_calls >= max_calls
        if not queue and not relevant and level <= DYNAMIC_FALLBACK_MAX_LEVEL and not spent:
            queue = [c for c in reader.level_partition(level) if c not in rated]
    if not relevant:
        return await _best_rated(ctx, scored, tops, tally)
    return sorted(relevant.values(), key=lambda r: r.community_id)


async def _best_rated(ctx: QueryContext, scored: list[tuple[Report, int]], tops: list[str],
                      tally: _Tally) -> list[Report]:
    """When no report reached RELEVANCE_THRESHOLD: the best-rated ones (or, if every rating
    failed, the top communities), best first and broader first at equal ratings, then by their
    own importance rating; never a report together with one above or below it; as many as one
    map call holds (`[query] map_batch_tokens`, at least one). The coverage notes it."""
    none_rated = not scored
    if none_rated:
        served = await ctx.reader.reports(tops)
        scored = [(served[c], 0) for c in tops if c in served]
        if not scored:
            return []
    order = sorted(scored, key=lambda rs: (-rs[1], rs[0].level, -rs[0].rating,
                                           rs[0].community_id))
    lines = _lineages(ctx, [r.community_id for r, _ in order])
    chosen: list[Report] = []
    taken: set[str] = set()
    used = 0
    for report, _ in order:
        line = lines[report.community_id]
        if taken & line:
            continue  # an ancestor or a descendant is already read
        n = _map_tokens(report)
        if chosen and used + n > ctx.settings.map_batch_tokens:
            break
        chosen.append(report)
        taken.add(report.community_id)
        used += n
    rating = "no rating succeeded" if none_rated else f"the best rating was {order[0][1]}"
    tally.note = (f"no community was rated relevant ({RELEVANCE_THRESHOLD} of 10 or more; "
                  f"{rating}): the {len(chosen)} best-rated report"
                  f"{'s were' if len(chosen) != 1 else ' was'} read anyway")
    return sorted(chosen, key=lambda r: r.community_id)


def _lineages(ctx: QueryContext, ids: list[str]) -> dict[str, set[str]]:
    """Each community's ancestors and itself, and the ids in `ids` below it: the communities a
    reading of it overlaps."""
    parent: dict[str, str | None] = {}
    todo = set(ids)
    while todo:
        rows = ctx.reader.community_rows(todo)
        parent.update({c: getattr(rows.get(c), "parent", None) for c in todo})
        todo = {p for p in parent.values() if p is not None and p not in parent}
    out: dict[str, set[str]] = {}
    for cid in ids:
        line = {cid}
        up = parent.get(cid)
        while up is not None:
            line.add(up)
            up = parent.get(up)
        out[cid] = line
    for cid in ids:  # descendants among `ids`: their lineage holds cid
        for other in ids:
            if other != cid and cid in out[other]:
                out[cid].add(other)
    return out


def _rating_batches(ctx: QueryContext, reports: list[Report]) -> list[list[Report]]:
    """`reports` in order, packed into rating calls of `[query] rate_batch_tokens` of their
    digests (title, summary, findings' headlines)."""
    tok = tokenizer()
    return _packed(reports, ctx.settings.rate_batch_tokens,
                   lambda r: tok.count(f"[Report {r.community_id}] {r.digest()}") + 2)


async def _rate(ctx: QueryContext, query: str, batches: list[list[Report]], tally: _Tally
                ) -> list[int | None]:
    """Each report's 0-10 rating, in batch order, one call per batch, calls run concurrently;
    None where a call failed (skipped, counted). Their prompt tokens go to the tally."""
    total = sum(len(b) for b in batches)
    done = 0

    async def one(batch: list[Report]) -> list[int | None]:
        nonlocal done
        with usage_scope() as usage:
            try:
                scores: list[int | None] = list(await ctx.provider.rate(query, batch))
            except InvalidOutput as exc:  # one unreadable rating call must not sink the search
                log.warning("a rating call of %d reports failed: %s", len(batch), exc)
                tally.unrated += len(batch)
                scores = [None] * len(batch)
        tally.rating_prompt_tokens += sum(u.prompt_tokens for u in usage.values())
        done += len(batch)
        await ctx.report_progress(done, total, f"rating community reports ({done}/{total})")
        return scores

    tally.rating_calls += len(batches)
    outcomes = await asyncio.gather(*(one(b) for b in batches))
    return [score for scores in outcomes for score in scores]


async def _similarity_rank(ctx: QueryContext, query: str) -> dict[str, int]:
    """Rank of each report by hybrid (vector + BM25) similarity to the query, prefiltered to
    what the caller may see; reports outside the shortlist rank after all of it."""
    vector = await ctx.reader.embed(query)
    hits = await ctx.reader.search("reports", vector=vector, text=query,
                                   k=ctx.settings.dynamic_max_rated,
                                   vector_weight=vector_weight(ctx))
    return {h.id: i for i, h in enumerate(hits)}


def map_batches(reports: list[Report], *, seed: int, batch_tokens: int) -> list[list[Report]]:
    """Reports in a seeded shuffle, packed greedily into batches of at most `batch_tokens`
    (a report larger than that travels alone)."""
    order = sorted(reports, key=lambda r: r.community_id)
    random.Random(seed).shuffle(order)
    return _packed(order, batch_tokens, _map_tokens)


def _packed(items: list[T], budget: int, cost: Callable[[T], int]) -> list[list[T]]:
    """`items` in order, packed greedily into batches costing at most `budget` (an item that
    costs more travels alone): the map's report batches and the ratings' digest batches."""
    batches: list[list[T]] = []
    current: list[T] = []
    used = 0
    for item in items:
        n = cost(item)
        if current and used + n > budget:
            batches.append(current)
            current, used = [], 0
        current.append(item)
        used += n
    if current:
        batches.append(current)
    return batches


def _map_tokens(report: Report) -> int:
    """Tokens one report takes in a map batch."""
    return tokenizer().count(f"[Report {report.community_id}] {report.full_text()}") + 2


async def _map(
    ctx: QueryContext, query: str, reports: list[Report], response_type: str, tally: _Tally
) -> list[MapPoint]:
    batches = map_batches(reports, seed=ctx.settings.seed,
                          batch_tokens=ctx.settings.map_batch_tokens)
    total = len(batches)
    tally.map_calls += total
    done = 0
    await ctx.report_progress(0, total, f"map: {len(reports)} reports in {total} batches")

    async def one(batch: list[Report]) -> MapOut:
        nonlocal done
        try:
            return await ctx.provider.map(query, batch, response_type=response_type)
        finally:
            done += 1
            await ctx.report_progress(done, total, f"map: {done}/{total} batches answered")

    outcomes = await asyncio.gather(*(one(b) for b in batches), return_exceptions=True)
    points: list[MapPoint] = []
    failures: list[BaseException] = []
    for batch, out in zip(batches, outcomes, strict=True):
        if isinstance(out, BaseException):
            if not isinstance(out, InvalidOutput):
                raise out
            log.warning("a global-search map batch failed and is skipped: %s", out)
            failures.append(out)
            tally.unmapped += len(batch)
            continue
        for r in batch:
            tally.at(r.level).mapped += 1
        ids = {r.community_id for r in batch}
        points += [p.model_copy(update={"report_ids": [i for i in p.report_ids if i in ids]})
                   for p in out.points]
    if failures and len(failures) == len(batches):
        raise failures[0]
    return points


def _best_points(points: list[MapPoint], budget: int, most: int | None = None
                 ) -> tuple[list[MapPoint], str]:
    """Non-zero points, best first (stable), while they fit the reduce budget (and number at
    most `most`); and their text."""
    ranked = sorted((p for p in points if p.score > 0), key=lambda p: -p.score)
    tok = tokenizer()
    kept: list[MapPoint] = []
    parts: list[str] = []
    used = 0
    for p in ranked:
        text = f"----- Analyst point {len(kept) + 1} (importance {p.score}) -----\n{p.description}"
        n = tok.count(text) + 2
        if used + n > budget or (most is not None and len(kept) >= most):
            break
        kept.append(p)
        parts.append(text)
        used += n
    return kept, "\n\n".join(parts)
