"""The serving rule at query time (design §2), and the cards and citations built from it.

> An artifact is served to a caller only if every text unit it was derived from is live and
> readable by that caller.

Every engine reads the graph through the `servable_*` hooks below and nothing else, so the rule
is applied in one place. A hook answers None for a hidden artifact exactly as for a missing one.

Views (design §2, "fallback views"; acl.views): when a canonical entity, relationship or report
is not servable to the caller but part of its provenance is, the hooks serve the caller's *view*
of it, derived only from live units the caller can read. The hooks stay synchronous:

- Existence (`*_exists`, and `servable_tops`/`root_ids`) is decided from provenance alone, with
  no provider call; use it wherever only "is it there?" or a count matters.
- Content (`servable_entity`, `servable_relationship`, `servable_report`) returns the canonical
  artifact, or a view already built (memory or the SQLite view cache). A view not built yet is
  recorded as pending and the hook answers None for now.
- `run_with_views(ctx, fn)` runs a call with pending-recording on; when the call recorded
  pending views, they are built (provider calls, single-flight per view) and the call is run
  again, until nothing is pending. The public engines are wrapped in it (server.engines), as are
  the MCP tools and resources. `ensure_views(ctx, ...)` builds known needs up front, and
  `settle_views(ctx)` ends a pass early, before a provider call would use incomplete context.
- Fast path: a caller who reads every live unit of a generation whose artifacts are all live
  (the unrestricted caller outside a revocation) gets the canonical artifacts with no view work.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from acl.view_cache import ViewBook, ViewParams, book_for, call_scope, collecting, pending_views
from acl.views import VIEW, CallerViews, caller_views, forget_views
from canopy.errors import InvalidOutput
from canopy.model import Claim, Community, Entity, Relationship, Report, TextUnit
from canopy.providers import base as _provider_base
from canopy.providers.base import ContextBlock, Provider, Usage, usage_scope
from canopy.tokens import get_tokenizer
from indexer.reports import _Sizes, _to_report, build_report_context
from server.results import (
    Citation,
    CommunityCard,
    EntityCard,
    FindingCard,
    RelationshipCard,
    SourceSpan,
)
from server.service import QueryContext

__all__ = [
    "block_citation",
    "caller_views_of",
    "community_card",
    "community_exists",
    "ensure_views",
    "entity_card",
    "entity_exists",
    "entity_name",
    "finding_card",
    "forget_caller_views",
    "relationship_card",
    "relationship_exists",
    "report_exists",
    "root_ids",
    "run_with_views",
    "servable_claim",
    "servable_entity",
    "servable_relationship",
    "servable_report",
    "servable_tops",
    "servable_unit",
    "settle_views",
    "span_of",
    "warm_views",
    "with_views",
]

T = TypeVar("T")
log = logging.getLogger(__name__)
MAX_PASSES = 8  # a call needs one more pass per level of views it discovers; 2 is typical


# ---- the caller's views -----------------------------------------------------------------------


async def write_report_view(
    community: Community,
    communities: dict[str, Community],
    entities: dict[str, Entity],
    relationships: dict[str, Relationship],
    claims: dict[str, Claim],
    child_reports: Callable[[], Awaitable[dict[str, Report]]],
    provider: Provider,
    params: ViewParams,
) -> Report:
    """acl.views.ReportWriter with the indexer's context rules (indexer.reports): elements by
    prominence, child reports substituted, largest first, when the elements do not fit."""
    tok = _MemoTokenizer(get_tokenizer())
    sizes = _Sizes(tok, entities, relationships)  # type: ignore[arg-type]
    budget = params.report_context_tokens
    total = sum(sizes.of(e) for e in community.entity_ids) + sum(
        sizes.of(r) for r in community.relationship_ids)
    children = await child_reports() if community.children and total > budget else {}
    context = build_report_context(community, communities, entities, relationships, claims,
                                   children, sizes, tok, budget)  # type: ignore[arg-type]
    tokens = tok.count(context.render())
    try:
        out = await provider.report(context, max_tokens=params.report_max_tokens)
    except InvalidOutput:  # a view must exist whenever its community does: extractive fallback
        from canopy.providers.builtin import BuiltinProvider

        out = await BuiltinProvider().report(context, max_tokens=params.report_max_tokens)
    return _to_report(community, context, out, tokens)


class _MemoTokenizer:
    """Token counts of short texts remembered across views: writing many report views counts
    the same element descriptions again and again."""

    _memo: ClassVar[dict[str, int]] = {}
    _MAX = 200_000

    def __init__(self, tok: Any) -> None:
        self.tok = tok

    def count(self, text: str) -> int:
        if len(text) > 2000:
            return int(self.tok.count(text))
        n = self._memo.get(text)
        if n is None:
            if len(self._memo) >= self._MAX:
                self._memo.clear()
            n = self._memo[text] = int(self.tok.count(text))
        return n

    def __getattr__(self, name: str) -> Any:
        return getattr(self.tok, name)


def _book(view: Any) -> ViewBook:
    return book_for(Path(view.vectors.path).parent, write_report_view)


_BY_VIS: dict[int, tuple[weakref.ref[Any], weakref.ref[Any], CallerViews]] = {}


def caller_views_of(ctx: QueryContext) -> CallerViews:
    """The caller's CallerViews (memoized per Visibility object, so hooks stay cheap)."""
    key = id(ctx.vis)
    hit = _BY_VIS.get(key)
    if hit is not None and hit[0]() is ctx.vis and hit[1]() is ctx.view:
        return hit[2]
    view = ctx.view
    cv = caller_views(view, ctx.vis.readable_units, lambda: _book(view))
    _BY_VIS[key] = (weakref.ref(ctx.vis, lambda _r, k=key: _BY_VIS.pop(k, None)),
                    weakref.ref(view), cv)
    return cv


def forget_caller_views() -> None:
    """Forget every view held in memory (the SQLite view cache stays), as a restart would."""
    _BY_VIS.clear()
    forget_views()


def _trivial(ctx: QueryContext) -> CallerViews | None:
    cv = caller_views_of(ctx)
    return None if cv.trivial else cv


@contextmanager
def _own_usage() -> Iterator[dict[str, Usage]]:
    """Provider calls made inside count here only, not towards the enclosing call's usage.

    Building a view is shared, cached work, and its cost would betray that the caller's
    artifacts have hidden parts (design §2: no count that betrays them): a result's `usage`
    never includes it. The provider's own totals (and `canopy warm`) do."""
    token = _provider_base._SCOPES.set(())  # the one place that detaches
    try:
        with usage_scope() as usage:
            yield usage
    finally:
        _provider_base._SCOPES.reset(token)


async def _build(cv: CallerViews, wanted: Iterable[tuple[str, str]], provider: Provider) -> None:
    wanted = sorted(set(wanted))
    with _own_usage() as usage:
        await cv.build(wanted, provider)
    if usage:
        log.debug("built %d views: %s", len(wanted),
                  {task: u.as_dict() for task, u in sorted(usage.items())})


async def run_with_views(ctx: QueryContext, fn: Callable[[QueryContext], Any]) -> Any:
    """`fn(ctx)` (sync or async) with the caller's views: pass after pass, building the views a
    pass found missing, until one pass needs nothing new."""
    if pending_views() is not None or caller_views_of(ctx).trivial:  # nested, or nothing to view
        out = fn(ctx)
        return await out if inspect.isawaitable(out) else out
    cv = caller_views_of(ctx)
    with call_scope():
        for _ in range(MAX_PASSES):
            with collecting() as pending:
                try:
                    out = fn(ctx)
                    result = await out if inspect.isawaitable(out) else out
                    error: BaseException | None = None
                except Exception as exc:  # noqa: BLE001 - a pass that met a missing view may fail
                    result, error = None, exc
            if not pending:
                if error is not None:
                    raise error
                return result
            await _build(cv, pending, ctx.provider)
    raise RuntimeError(f"views still pending after {MAX_PASSES} passes")


def with_views(engine: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Wrap an async engine `engine(ctx, ...)` in run_with_views."""

    @wraps(engine)
    async def wrapped(ctx: QueryContext, *args: Any, **kwargs: Any) -> T:
        return await run_with_views(ctx, lambda c: engine(c, *args, **kwargs))

    return wrapped


async def ensure_views(ctx: QueryContext, *, reports: Iterable[str] = (),
                       entities: Iterable[str] = (), relationships: Iterable[str] = ()) -> None:
    """Build (or load) the caller's views of these artifacts now; canonical, hidden and
    unknown ids cost nothing (nor do views, in the enclosing call's usage: see _own_usage)."""
    cv = _trivial(ctx)
    if cv is None:
        return
    wanted = [("report", c) for c in reports if cv.community_state(c) == VIEW]
    wanted += [("entity", e) for e in entities if cv.entity_state(e) == VIEW]
    wanted += [("relationship", r) for r in relationships if cv.relationship_state(r) == VIEW]
    if wanted:
        await _build(cv, wanted, ctx.provider)


async def warm_views(ctx: QueryContext, kinds: Iterable[str] = ("report", "entity", "relationship"),
                     ) -> dict[str, Any]:
    """Build every view of these kinds the caller is served (`canopy warm`): what was needed,
    how many were built now (the rest came from the cache) and the provider calls it took."""
    import time

    cv = caller_views_of(ctx)
    kinds = tuple(kinds)
    wanted = [] if cv.trivial else cv.needed(kinds)
    out: dict[str, Any] = {f"{k}_views": sum(1 for w in wanted if w[0] == k) for k in kinds}
    if cv.trivial:
        out.update(built={}, usage={}, seconds=0.0)
        return out
    before = dict(cv.book.stats)
    started = time.perf_counter()
    with _own_usage() as usage:
        await cv.build(wanted, ctx.provider)
    out["built"] = {k.removeprefix("built_"): n - before.get(k, 0) for k, n in cv.book.stats.items()
                    if k.startswith("built_") and n - before.get(k, 0)}
    out["offline"] = cv.book.stats["provisional"] - before.get("provisional", 0)
    out["usage"] = {task: u.as_dict() for task, u in sorted(usage.items())}
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out


class _Restart(Exception):
    """A pass ends early: views it needs are pending (caught by run_with_views)."""


async def settle_views(ctx: QueryContext) -> None:
    """End this pass now if it found views missing, before its results are used (e.g. sent to
    the provider); run_with_views builds them and runs the call again."""
    pending = pending_views()
    if pending:
        raise _Restart


# ---- the hooks ------------------------------------------------------------------------------


def servable_report(ctx: QueryContext, community_id: str) -> Report | None:
    """The community's report as the caller may read it: the canonical report when it is
    current (its fingerprint matches the community's) and derived only from live units the
    caller can read; else the caller's view of the community, if any of it is visible."""
    cv = _trivial(ctx)
    if cv is not None:
        return cv.report(community_id, ctx.provider)
    graph = ctx.view.graph
    report = graph.reports.get(community_id)
    community = graph.communities.get(community_id)
    if report is None or community is None or report.fingerprint != community.fingerprint:
        return None
    return report if ctx.vis.can_see(report.text_unit_ids) else None


def report_exists(ctx: QueryContext, community_id: str) -> bool:
    """servable_report(...) is not None, decided without building a view."""
    cv = _trivial(ctx)
    if cv is not None:
        return cv.community_state(community_id) != 0
    return servable_report(ctx, community_id) is not None


def community_exists(ctx: QueryContext, community_id: str) -> bool:
    """The community has a member the caller can see (whether or not it has a report)."""
    cv = _trivial(ctx)
    if cv is None:
        return community_id in ctx.view.graph.communities
    c = ctx.view.graph.communities.get(community_id)
    return c is not None and any(cv.entity_state(e) for e in c.entity_ids)


def servable_entity(ctx: QueryContext, entity_id: str) -> Entity | None:
    cv = _trivial(ctx)
    if cv is not None:
        return cv.entity(entity_id, ctx.provider)
    entity = ctx.view.graph.entities.get(entity_id)
    return entity if entity is not None and ctx.vis.can_see(entity.text_unit_ids) else None


def entity_exists(ctx: QueryContext, entity_id: str) -> bool:
    cv = _trivial(ctx)
    if cv is not None:
        return cv.entity_state(entity_id) != 0
    return servable_entity(ctx, entity_id) is not None


def entity_name(ctx: QueryContext, entity_id: str) -> str:
    """The name the caller is shown for a servable entity ('' if it is not servable)."""
    entity = servable_entity(ctx, entity_id)
    return entity.name if entity is not None else ""


def servable_relationship(ctx: QueryContext, relationship_id: str) -> Relationship | None:
    """A relationship is shown with its endpoints' names, so both endpoints must be servable."""
    cv = _trivial(ctx)
    if cv is not None:
        return cv.relationship(relationship_id, ctx.provider)
    rel = ctx.view.graph.relationships.get(relationship_id)
    if rel is None or not ctx.vis.can_see(rel.text_unit_ids):
        return None
    if servable_entity(ctx, rel.source) is None or servable_entity(ctx, rel.target) is None:
        return None
    return rel


def relationship_exists(ctx: QueryContext, relationship_id: str) -> bool:
    cv = _trivial(ctx)
    if cv is not None:
        return cv.relationship_state(relationship_id) != 0
    return servable_relationship(ctx, relationship_id) is not None


def servable_claim(ctx: QueryContext, claim_id: str) -> Claim | None:
    """Claims are per unit (no views): servable when their unit is, and their subject (and
    entity object) exist for the caller."""
    claim = ctx.view.graph.claims.get(claim_id)
    if claim is None:
        return None
    cv = _trivial(ctx)
    if cv is not None:
        return claim if cv.claim_visible(claim) else None
    if not ctx.vis.can_see(claim.text_unit_ids) or servable_entity(ctx, claim.subject) is None:
        return None
    obj = claim.object
    if obj and obj in ctx.view.graph.entities and servable_entity(ctx, obj) is None:
        return None
    return claim


def servable_unit(ctx: QueryContext, unit_id: str) -> TextUnit | None:
    unit = ctx.view.units.get(unit_id)
    if unit is None or ctx.view.document_of(unit_id) is None or not ctx.vis.can_see([unit_id]):
        return None
    return unit


def servable_tops(ctx: QueryContext, community_ids: Iterable[str]) -> list[str]:
    """The given communities where servable, else their nearest servable descendants.

    A report covers a subset of its community's units, so a hidden parent may have visible
    children; they take its place, and navigation never dead-ends at a hidden node. (With
    views a community with a visible member is servable, so this only skips communities whose
    report is missing.) Decided without building views."""
    out: list[str] = []
    stack = sorted(community_ids, reverse=True)
    communities = ctx.view.graph.communities
    while stack:
        cid = stack.pop()
        if report_exists(ctx, cid):
            out.append(cid)
        elif cid in communities:
            stack.extend(reversed(communities[cid].children))
    return out


def root_ids(ctx: QueryContext) -> list[str]:
    """The tops of the caller's servable hierarchy: level-0 communities, or where hidden, their
    servable descendants."""
    roots = [c.id for c in ctx.view.graph.communities.values() if c.parent is None]
    return servable_tops(ctx, roots)


# ---- cards and citations --------------------------------------------------------------------


def community_card(ctx: QueryContext, report: Report) -> CommunityCard:
    community: Community = ctx.view.graph.communities[report.community_id]
    size = sum(1 for e in community.entity_ids if entity_exists(ctx, e))
    return CommunityCard(id=report.community_id, level=report.level, title=report.title,
                         summary=report.summary, rating=report.rating, size=size)


def finding_card(ctx: QueryContext, index: int, report: Report) -> FindingCard:
    f = report.findings[index]
    return FindingCard(
        summary=f.summary, explanation=f.explanation,
        entity_ids=[e for e in f.entity_ids if entity_exists(ctx, e)],
        relationship_ids=[r for r in f.relationship_ids if relationship_exists(ctx, r)],
        text_unit_ids=[u for u in f.text_unit_ids if servable_unit(ctx, u) is not None],
    )


def entity_card(entity: Entity) -> EntityCard:
    return EntityCard(id=entity.id, name=entity.name, type=entity.type,
                      description=entity.description, degree=entity.degree)


def relationship_card(ctx: QueryContext, rel: Relationship) -> RelationshipCard:
    """Only for servable relationships (whose endpoints are servable): the endpoints' names
    are those the caller is shown (views' names where the entity is a view)."""
    return RelationshipCard(id=rel.id, source=entity_name(ctx, rel.source),
                            target=entity_name(ctx, rel.target), description=rel.description,
                            weight=rel.weight)


def span_of(ctx: QueryContext, unit: TextUnit) -> SourceSpan:
    """The unit's own span of its document: `text` is document[char_start:char_end] (a unit's
    text starts with an overlap prefix from the previous unit, which is not part of the span)."""
    doc = ctx.view.document_of(unit.id)
    assert doc is not None  # servable units have a document
    own = unit.char_end - unit.char_start
    text = unit.text[len(unit.text) - own:] if 0 < own <= len(unit.text) else unit.text
    return SourceSpan(text_unit_id=unit.id, document=doc.path, char_start=unit.char_start,
                      char_end=unit.char_end, text=text, metadata=dict(doc.metadata))


def block_citation(block: ContextBlock) -> Citation:
    return Citation(kind=block.kind, id=block.id, title=block.title,
                    document=block.source or None)
