"""Global search: map-reduce over community reports (Edge et al. 2024 §2.2; design §6).

1. Reports: those standing for one level (`level_partition`: the communities at L plus the
   childless shallower ones, the paper's C0..C3), or chosen dynamically: rate every top
   community (report digests, several per call), keep the relevant ones and rate their
   children, keeping a child in place of its parent (GraphRAG's dynamic community selection,
   `keep_parent=False`). Every result carries its coverage: per level, what was considered,
   rated, found relevant and read.
2. Map: reports shuffled with a fixed seed, packed into token-budgeted batches; one concurrent
   map call per batch returns points scored 0-100.
3. Reduce: zero-score points are dropped; the best points fill the reduce context; one call
   writes the answer. When nothing scores above zero the answer says so without a reduce call.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TypeVar

from canopy.errors import InvalidArgument, InvalidOutput
from canopy.model import Report
from canopy.providers.base import MapOut, MapPoint
from canopy.server.context import QueryContext
from canopy.server.engines.common import (
    NOTHING_FOUND,
    check_query,
    check_response_type,
    fit_result,
    metered,
    tokenizer,
)
from canopy.server.engines.evidence import vector_weight
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
    """Coverage counts as selection and map go: per level, and calls."""

    def __init__(self, selection: str) -> None:
        self.selection = selection
        self.levels: dict[int, LevelCoverage] = {}
        self.rating_calls = self.map_calls = self.unrated = self.unmapped = 0

    def at(self, level: int) -> LevelCoverage:
        return self.levels.setdefault(level, LevelCoverage(level=level))

    def coverage(self) -> Coverage:
        return Coverage(selection=self.selection,
                        levels=[self.levels[k] for k in sorted(self.levels)],
                        rating_calls=self.rating_calls, map_calls=self.map_calls,
                        unrated=self.unrated, unmapped=self.unmapped)


async def global_search(
    ctx: QueryContext,
    query: str,
    *,
    community_level: int | None = None,
    response_type: str = "multiple paragraphs",
    route: RouteInfo | None = None,
) -> SearchResult:
    """Answer a question about the whole corpus from community reports (map-reduce).

    `community_level` None means ctx.settings.community_level, and dynamic selection when that
    is None too. `route`: as basic_search's."""
    query = check_query(query)
    response_type = check_response_type(response_type)
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
        result = SearchResult(method="global", query=query, answer=answer, citations=citations,
                              context=context, community_level=level,
                              coverage=tally.coverage(), route=route)
        first = repr(citations[0].id) if citations else "'<report id>'"
        result = fit_result(ctx, result, more=(
            f"call drill_down(community_id={first}) to read a cited report in full, or ask "
            "global_search a narrower question."))
        result.usage = meter.info()
        return result


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
    words: only `[query] dynamic_max_rated` caps the ratings, and then the candidates least
    similar to the question are the ones left (counted in the coverage)."""
    tally = tally or _Tally("dynamic")
    reader = ctx.reader
    relevant: dict[str, Report] = {}
    parent_of: dict[str, str] = {}
    queue = reader.roots()
    rated: set[str] = set()
    rank: dict[str, int] | None = None
    level = 0
    while queue:
        for row in reader.community_rows(queue).values():
            tally.at(row.level).considered += 1
        room = max(0, ctx.settings.dynamic_max_rated - len(rated))
        if len(queue) > room:
            rank = rank if rank is not None else await _similarity_rank(ctx, query)
            queue = sorted(queue, key=lambda cid: (rank.get(cid, len(rank)), cid))
            tally.unrated += len(queue) - room
            queue = queue[:room]
        served = await reader.reports(queue)
        reports = [served[cid] for cid in queue if cid in served]
        rated.update(r.community_id for r in reports)
        scores = await _rate(ctx, query, reports, tally)
        queue = []
        relevant_now = [r.community_id for r, score in zip(reports, scores, strict=True)
                        if score is not None and score >= RELEVANCE_THRESHOLD]
        children = reader.child_ids(relevant_now)
        for report, score in zip(reports, scores, strict=True):
            if score is None:
                continue
            tally.at(report.level).rated += 1
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
        if not queue and not relevant and level <= DYNAMIC_FALLBACK_MAX_LEVEL:
            queue = [c for c in reader.level_partition(level) if c not in rated]
    return sorted(relevant.values(), key=lambda r: r.community_id)


async def _rate(ctx: QueryContext, query: str, reports: list[Report], tally: _Tally
                ) -> list[int | None]:
    """Each report's 0-10 rating, several reports per call (`[query] rate_batch_tokens` of their
    digests: title, summary, findings' headlines), calls run concurrently; None where a call
    failed (skipped, counted)."""
    tok = tokenizer()
    batches = _packed(list(range(len(reports))), ctx.settings.rate_batch_tokens,
                      lambda i: tok.count(f"[Report {reports[i].community_id}] "
                                          f"{reports[i].digest()}") + 2)
    total = len(reports)
    done = 0

    async def one(batch: list[int]) -> list[int | None]:
        nonlocal done
        try:
            scores: list[int | None] = list(
                await ctx.provider.rate(query, [reports[i] for i in batch]))
        except InvalidOutput as exc:  # one unreadable rating call must not sink the search
            log.warning("a rating call of %d reports failed: %s", len(batch), exc)
            tally.unrated += len(batch)
            scores = [None] * len(batch)
        done += len(batch)
        await ctx.report_progress(done, total, f"rating community reports ({done}/{total})")
        return scores

    tally.rating_calls += len(batches)
    out: list[int | None] = [None] * total
    for batch, scores in zip(batches, await asyncio.gather(*(one(b) for b in batches)),
                             strict=True):
        for i, score in zip(batch, scores, strict=True):
            out[i] = score
    return out


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


def _best_points(points: list[MapPoint], budget: int) -> tuple[list[MapPoint], str]:
    """Non-zero points, best first (stable), while they fit the reduce budget; and their text."""
    ranked = sorted((p for p in points if p.score > 0), key=lambda p: -p.score)
    tok = tokenizer()
    kept: list[MapPoint] = []
    parts: list[str] = []
    used = 0
    for p in ranked:
        text = f"----- Analyst point {len(kept) + 1} (importance {p.score}) -----\n{p.description}"
        n = tok.count(text) + 2
        if used + n > budget:
            break
        kept.append(p)
        parts.append(text)
        used += n
    return kept, "\n\n".join(parts)
