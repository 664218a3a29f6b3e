"""Fingerprints and reports of the communities the change touched, each once the communities
under it are written (canopy.indexer.operations.report_order.report_plan).

A community is recomputed when its members or place changed, a member entity or claim changed,
a relationship inside it changed, a revocation left it stale, its report failed before, or a
child of it was recomputed. Its fingerprint decides its report: unchanged, the report is kept
(its ACL classes refreshed); else a report with that fingerprint is reused from anywhere in the
committed generation (a renumbered community); else it is written. Communities are loaded and
written a chunk at a time, so memory holds one chunk's elements, however large the index.

A community whose elements cannot fit the report budget, and whose children's reports overflow it
too, is written from those reports alone (`reports_only`, canopy.indexer.operations.report_context):
its fingerprint, ACL classes and report come from its children, and its members' descriptions and
its relationships are never read (its members' token sizes may be, to know their elements do not
fit). At 10,000 articles the top levels hold communities of 20,000 entities and 60,000
relationships; an edit under one of them no longer reads them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from canopy.errors import EndpointUnavailable, ProviderError
from canopy.ids import content_hash
from canopy.indexer.operations.report_context import (
    MIN_ELEMENT_TOKENS,
    CommunityContent,
    ElementSizes,
    fingerprint,
    reports_only,
    reports_only_context,
    reports_only_fingerprint,
)
from canopy.indexer.operations.report_order import ReportChunk, report_batches, report_plan
from canopy.indexer.operations.staleness import (
    CommunityChange,
    Lineage,
    ReportFate,
    communities_touched,
    report_fate,
    stale_communities,
    with_ancestors,
)
from canopy.indexer.report_writer import report_from_context, write_report
from canopy.indexer.stages.build import Build
from canopy.indexer.stages.communities import HierarchyDelta
from canopy.indexer.stages.graph import GraphDelta
from canopy.model import Community, Report, UnitFailure
from canopy.providers.base import prompt_key
from canopy.store import CommunityRow, EntityRow, Gate, RelationshipRow, ReportRow
from canopy.tasks import side_by_side

__all__ = ["ReportOutcome", "stage_reports"]

log = logging.getLogger(__name__)

_CHUNK = 256  # communities per chunk
# Members per chunk: top levels hold the whole graph in a few hundred communities, so a chunk of
# them would read every entity and relationship at once. One community larger than this is a
# chunk of its own: memory follows the largest community, not the corpus.
_CHUNK_MEMBERS = 20_000


class _Rows:
    """Entity and relationship rows the stage reads, kept across its chunks and levels (a member
    is read once, not once per level above it), within a bound."""

    def __init__(self, b: Build, limit: int = 40_000) -> None:
        self.b = b
        self.limit = limit
        self.entities: dict[str, EntityRow] = {}
        self.relationships: dict[str, RelationshipRow] = {}

    def _get(self, cache: dict[str, Any], fetch: Any, ids: Iterable[str]) -> dict[str, Any]:
        ids = set(ids)
        missing = ids - cache.keys()
        if missing:
            if len(cache) + len(missing) > self.limit:
                cache.clear()
            cache.update(fetch(missing))
        return {i: cache[i] for i in ids if i in cache}

    def entity_rows(self, ids: Iterable[str]) -> dict[str, EntityRow]:
        return self._get(self.entities, self.b.reads.entities, ids)

    def relationship_rows(self, ids: Iterable[str]) -> dict[str, RelationshipRow]:
        return self._get(self.relationships, self.b.reads.relationships, ids)


@dataclass
class ReportOutcome:
    generated: int = 0
    reused: int = 0
    failures: list[UnitFailure] = field(default_factory=list)
    communities: int = 0  # recomputed


def _stale(b: Build, g: GraphDelta, h: HierarchyDelta,
           retry: Iterable[str]) -> dict[int, set[str]]:
    """Communities to recompute, by level (canopy.indexer.operations.staleness)."""
    reads = b.reads
    if b.full or h.replaced_all:
        levels = reads.community_levels()
        return stale_communities(CommunityChange(everything=True), {},
                                 {cid: Lineage(level, None) for cid, level in levels.items()})
    written = reads.relationships(g.relationships)
    old = b.committed.relationships(g.removed_relationships | g.relationships)
    edges = frozenset((r.relationship.source, r.relationship.target)
                      for r in [*written.values(), *old.values()])
    change = CommunityChange(
        placed=frozenset(h.written | set(h.root_stats)),
        entities=frozenset(g.entities | g.claim_subjects), edges=edges,
        stale=frozenset(b.committed.stale_ids("communities")), retry=frozenset(retry))
    chains = reads.memberships(change.entities | {e for pair in edges for e in pair})
    touched = communities_touched(change, chains)
    lineage = {cid: Lineage(row.level, row.parent)
               for cid, row in reads.community_lineage(touched).items()}
    return with_ancestors(touched, lineage)


async def stage_reports(b: Build, g: GraphDelta, h: HierarchyDelta,
                        retry: Iterable[str]) -> ReportOutcome:
    stale = _stale(b, g, h, retry)
    out = ReportOutcome()
    total = sum(len(v) for v in stale.values())
    advance = b.progress("reports", total)
    sizes = b.sizes
    sem = asyncio.Semaphore(b.concurrency)
    rows = _Rows(b)
    every = {cid for ids in stale.values() for cid in ids}
    lineage: dict[str, str | None] = {}
    members: dict[str, int] = {}
    for part in report_batches(sorted(every), _CHUNK * 16):
        for cid, row in b.reads.communities(part).items():
            lineage[cid], members[cid] = row.parent, row.n_members
    # With an endpoint, chunks of about a window each, so that a parent's chunk starts while
    # other chunks of its children's height are still being written; offline (one report at a
    # time on the CPU) the largest chunks, which read the store least often.
    size = min(_CHUNK, max(16, b.concurrency)) if b.settings.llm.enabled else _CHUNK

    async def write(chunk: ReportChunk) -> None:
        await _chunk(b, h, list(chunk.ids), sizes, sem, out, rows)
        advance(len(chunk.ids))
        out.communities += len(chunk.ids)

    plan = report_plan(stale, lineage, members, size, _CHUNK_MEMBERS)
    if b.computes_here:
        # Chunks one after another (each after the chunks it comes after: they are earlier in
        # the plan), and their reports one at a time with a turn of the event loop between them
        # (`_write`), so that the search rows written meanwhile (SearchRows.start_early) move
        # on. Gathered, a chunk's reports would all be computed in one turn; chunks side by side
        # would each hold their rows at once (the row cache overflows).
        for chunk in plan:
            await write(chunk)
    else:
        await _in_plan_order(plan, members, write, _CHUNK_MEMBERS)
    return out


async def _in_plan_order(plan: list[ReportChunk], members: dict[str, int],
                         write: Callable[[ReportChunk], Awaitable[None]], limit: int) -> None:
    """`write` every chunk of the plan as soon as the chunks it comes after are written, with
    the chunks in progress holding at most `limit` members together. The first failure is
    raised as it is and cancels the chunks still running or waiting."""
    done = [asyncio.Event() for _ in plan]
    budget = _MemberBudget(limit)

    async def run(i: int, chunk: ReportChunk) -> None:
        for j in chunk.after:
            await done[j].wait()
        async with budget.held(sum(members.get(cid, 0) for cid in chunk.ids)):
            await write(chunk)
        done[i].set()

    await side_by_side(run(i, chunk) for i, chunk in enumerate(plan))


class _MemberBudget:
    """Chunks in progress at once hold at most `limit` members together (a chunk larger than
    that runs alone), so concurrent chunks keep the stage's memory bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._cv = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def held(self, n: int) -> AsyncIterator[None]:
        async with self._cv:
            await self._cv.wait_for(lambda: self.used == 0 or self.used + n <= self.limit)
            self.used += n
        try:
            yield
        finally:
            async with self._cv:
                self.used -= n
                self._cv.notify_all()


# What a report is written from: the community's elements, or (a community too large for them)
# the children's reports chosen by canopy.indexer.operations.report_context.reports_only.
_Source = CommunityContent | list[Report]


async def _chunk(b: Build, h: HierarchyDelta, ids: list[str], sizes: ElementSizes,
                 sem: asyncio.Semaphore, out: ReportOutcome, cache: _Rows) -> None:
    reads = b.reads
    prompt = prompt_key(b.provider, "report")  # a replaced report template rewrites reports
    rows = reads.communities(ids)
    children = reads.children(ids)
    child_rows = reads.communities({c for cs in children.values() for c in cs})
    alone = _reports_alone(b, rows, children, child_rows, sizes, cache)
    full = [cid for cid in ids if cid not in alone]
    members = reads.members(full)
    entity_rows = cache.entity_rows({e for es in members.values() for e in es})
    among = reads.relationships_among(full)
    rel_rows = cache.relationship_rows({r for rs in among.values() for r in rs})
    claims_by_subject: dict[str, list[Any]] = defaultdict(list)
    for cl in reads.claims_of(entity_rows):
        claims_by_subject[cl.claim.subject].append(cl)
    committed_reports = b.committed.reports(ids)
    staged: list[tuple[Any, ...]] = []
    pending: list[tuple[Community, _Source]] = []
    for cid in ids:
        row = rows.get(cid)
        if row is None:
            continue
        kids = children.get(cid, [])
        source: _Source
        if cid in alone:
            child_fps, source = alone[cid]
            fp = reports_only_fingerprint(row.level, child_fps, prompt)
            kid_gates = [child_rows[k].gate for k in kids if k in child_rows]
            gate = Gate(frozenset(a for g in kid_gates for a in g.acl),
                        content_hash("children", *sorted(g.sig for g in kid_gates)), False)
            n_members = row.n_members
            community = Community(cid, row.level, row.parent, tuple(kids), (), (), fp)
        else:
            mine = members.get(cid, [])
            ents = [entity_rows[e] for e in mine if e in entity_rows]
            rels = [rel_rows[r] for r in among.get(cid, []) if r in rel_rows]
            claims = [c for e in mine for c in claims_by_subject.get(e, [])]
            fp = fingerprint(row.level, (e.hash for e in ents), (r.hash for r in rels),
                             (c.hash for c in claims),
                             (child_rows[k].fingerprint for k in kids if k in child_rows),
                             prompt)
            gate = Gate(frozenset(a for e in ents for a in e.gate.acl),
                        content_hash(*sorted(e.gate.sig for e in ents)), False)
            n_members = len(mine)
            community = Community(cid, row.level, row.parent, tuple(kids), tuple(mine),
                                  tuple(r.relationship.id for r in rels), fp)
            source = CommunityContent(community, {e.entity.id: e.entity for e in ents},
                                      {r.relationship.id: r.relationship for r in rels},
                                      sorted((c.claim for c in claims), key=lambda c: c.id), {})
        w_in, d_tot = h.root_stats.get(cid, (row.w_in, row.d_tot))
        staged.append(CommunityRow(cid, row.level, row.parent, n_members, len(kids), fp, gate,
                                   w_in, d_tot).values())
        old = committed_reports.get(cid)
        if report_fate(fp, old.report.fingerprint if old else None, ()) is ReportFate.KEEP:
            assert old is not None
            _keep(b, old, replace(old.report, level=row.level))
            out.reused += 1
        else:
            pending.append((community, source))
    b.staging.put("communities", staged)
    by_fp = b.committed.reports_by_fingerprint(c.fingerprint for c, _ in pending)
    to_write = []
    for c, source in pending:
        # not KEEP (above): REUSE when another community's committed report had this fingerprint
        if report_fate(c.fingerprint, None, by_fp) is ReportFate.REUSE:
            found = by_fp[c.fingerprint]
            _keep(b, None, replace(found.report, community_id=c.id, level=c.level))
            out.reused += 1
        else:
            to_write.append((c, source))
    contents = [s for _, s in to_write if isinstance(s, CommunityContent)]
    # Sizes of the elements, read where an earlier run counted them (a large community's
    # elements are mostly unchanged), counted here otherwise and remembered.
    keys = {e: f"{b.tok.name}:{entity_rows[e].hash}"
            for c in contents for e in c.entities if not sizes.known(e)}
    keys.update({r: f"{b.tok.name}:{rel_rows[r].hash}"
                 for c in contents for r in c.relationships if not sizes.known(r)})
    if keys:
        stored = b.store.element_tokens(keys.values())
        sizes.seed({i: stored[k] for i, k in keys.items() if k in stored})
    if to_write:
        await _write(b, to_write, sizes, sem, out)
    if keys:
        b.store.element_tokens_put({keys[i]: n for i, n in sizes.fresh(keys).items()})


def _reports_alone(b: Build, rows: dict[str, CommunityRow], children: dict[str, list[str]],
                   child_rows: dict[str, CommunityRow], sizes: ElementSizes,
                   cache: _Rows) -> dict[str, tuple[list[str], list[Report]]]:
    """The communities among `rows` written from their children's reports alone, each with the
    fingerprints of all its children's reports and the reports chosen to write it from:
    communities whose children's reports overflow the budget
    (canopy.indexer.operations.report_context.reports_only)
    and whose elements cannot fit it either. The latter is certain from the member count alone for
    the largest; for the others the members' token sizes decide (stored by content hash,
    counted here when missing), read without their descriptions."""
    budget = b.settings.reports.max_context_tokens
    parents = [cid for cid in rows if children.get(cid)]
    if not parents:
        return {}
    got = b.reads.reports({k for cid in parents for k in children[cid]})
    out: dict[str, tuple[list[str], list[Report]]] = {}
    probe: list[str] = []
    for cid in parents:
        subs = {k: got[k].report for k in children[cid] if k in got}
        members = {k: child_rows[k].n_members for k in subs if k in child_rows}
        chosen = reports_only(subs, members, b.tok, budget)
        if chosen is None:
            continue
        out[cid] = ([r.fingerprint for r in subs.values()], chosen)
        if rows[cid].n_members * MIN_ELEMENT_TOKENS <= budget:
            probe.append(cid)
    if probe:
        members_of = b.reads.members(probe)
        hashes = b.reads.entity_hashes({e for es in members_of.values() for e in es})
        keys = {e: f"{b.tok.name}:{h}" for e, h in hashes.items() if not sizes.known(e)}
        stored = b.store.element_tokens(keys.values())
        sizes.seed({e: stored[k] for e, k in keys.items() if k in stored})
        unknown = [e for e in keys if not sizes.known(e)]
        for row in cache.entity_rows(unknown).values():
            sizes.entity(row.entity)
        for cid in probe:
            tokens = sum(sizes.get(e) or MIN_ELEMENT_TOKENS for e in members_of.get(cid, ()))
            if tokens <= budget:  # the elements may fit: written from them, as any other
                del out[cid]
    return out


def _keep(b: Build, committed: ReportRow | None, report: Report) -> None:
    """Stage `report` (an existing one, perhaps renumbered) with its ACL classes recomputed;
    nothing when it is exactly the committed row, unless this is a full build (which commits
    over emptied tables, so a row it does not stage is lost)."""
    acl = b.reads.unit_acl(report.text_unit_ids)
    row = ReportRow(report, Gate(frozenset(acl.values()), "", False))
    if committed is None or b.full or committed.values() != row.values():
        b.staging.put("reports", [row.values()])


async def _write(b: Build, items: list[tuple[Community, _Source]], sizes: ElementSizes,
                 sem: asyncio.Semaphore, out: ReportOutcome) -> None:
    r = b.settings.reports
    written: list[Report] = []

    def child_reports(content: CommunityContent) -> Callable[[], Awaitable[dict[str, Report]]]:
        c = content.community
        kids = list(c.children)

        async def read() -> dict[str, Report]:
            got = b.reads.reports(kids)
            members = b.reads.members(kids)
            kid_of = {e: k for k, es in members.items() for e in es}
            inside: dict[str, list[str]] = defaultdict(list)  # one pass over the relationships
            for i, rel in content.relationships.items():
                k = kid_of.get(rel.source)
                if k is not None and kid_of.get(rel.target) == k:
                    inside[k].append(i)
            for k in kids:
                if k in members:
                    content.children[k] = Community(k, c.level + 1, c.id, (), tuple(members[k]),
                                                    tuple(inside.get(k, ())))
            return {k: v.report for k, v in got.items()}

        return read

    async def one(c: Community, source: _Source) -> None:
        try:
            async with sem:
                if isinstance(source, CommunityContent):
                    report = await write_report(source, child_reports(source), b.provider, sizes,
                                                context_tokens=r.max_context_tokens,
                                                max_tokens=r.max_report_tokens)
                else:
                    report = await report_from_context(c, reports_only_context(c, source),
                                                       b.provider, sizes,
                                                       max_tokens=r.max_report_tokens)
        except EndpointUnavailable as exc:
            unavailable.append(exc)
            out.failures.append(UnitFailure(c.id, "report", str(exc)[:300]))
            return
        except ProviderError as exc:  # invalid output after repair, or a refused request
            out.failures.append(UnitFailure(c.id, "report", str(exc)[:300]))
            return
        written.append(report)

    unavailable: list[EndpointUnavailable] = []
    if b.computes_here:  # one at a time, a turn of the loop between them (stage_reports)
        for c, source in items:
            await one(c, source)
            await asyncio.sleep(0)
    else:
        await asyncio.gather(*(one(c, source) for c, source in items))
    if unavailable and not written:
        raise unavailable[0]  # the endpoint is down: stop rather than commit reportless communities
    for report in sorted(written, key=lambda r: r.community_id):
        acl = b.reads.unit_acl(report.text_unit_ids)
        gate = Gate(frozenset(acl.values()), "", False)
        b.staging.put("reports", [ReportRow(report, gate).values()])
    b.ahead.submit("reports", (r.community_id for r in written))
    out.generated += len(written)
