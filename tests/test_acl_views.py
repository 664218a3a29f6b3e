"""Per-caller views (design §2, "fallback views"; acl.views, server.engines.serving).

The example corpus under a policy: suppliers/ is readable with label `supply` only. `staff`
reads everything else, `buyer` reads suppliers/ only, `admin` reads everything. Artifacts that
draw on both are served to staff and buyer as views derived from what each can read.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from mcp import Client

import acl.view_cache
import acl.views
from acl.view_cache import ViewsPending
from acl.views import FULL, NONE, VIEW
from canopy.errors import EndpointUnavailable, InvalidArgument, NotFound
from canopy.ids import normalize_name
from canopy.llm import ChatClient
from canopy.providers.builtin import BuiltinProvider
from canopy.providers.llm import LLMProvider
from canopy.settings import LLMSettings
from server import engines
from server.cli import main
from server.engines.serving import (
    caller_views_of,
    community_card,
    ensure_views,
    forget_caller_views,
    run_with_views,
    servable_entity,
    servable_relationship,
    servable_report,
    warm_views,
)
from server.mcp_app import build_server
from server.runtime import build_index, open_workspace
from server.service import CanopyService, QueryContext
from tests.conftest import EXAMPLES

POLICY = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "suppliers/**"
labels = ["supply"]

[acl.principals]
admin = ["staff", "supply"]
staff = ["staff"]
staff2 = ["staff"]
buyer = ["supply"]
"""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def served(ctx: QueryContext, hook: Any, artifact_id: str) -> Any:
    return run(run_with_views(ctx, lambda c: hook(c, artifact_id)))


class Counting(BuiltinProvider):
    """The builtin provider under its own name (its own views), counting the calls that views
    make, optionally slowed down, or down (every call raising EndpointUnavailable)."""

    name = "counting"

    def __init__(self, delay: float = 0.0, *, down: bool = False) -> None:
        super().__init__()
        self.delay = delay
        self.down = down
        self.calls: Counter[str] = Counter()

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        self.calls["summarize"] += 1
        await asyncio.sleep(self.delay)
        if self.down:
            raise EndpointUnavailable("down (test)")
        return await super().summarize(name, descriptions, max_tokens=max_tokens)

    async def report(self, context: Any, *, max_tokens: int) -> Any:
        self.calls["report"] += 1
        await asyncio.sleep(self.delay)
        if self.down:
            raise EndpointUnavailable("down (test)")
        return await super().report(context, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("views")
    docs = root / "docs"
    shutil.copytree(EXAMPLES, docs)
    (docs / "canopy.toml").write_text(POLICY, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in __import__("os").environ if k.startswith(("CANOPY_", "OPENAI_"))]:
            mp.delenv(key)
        build_index(open_workspace(docs, index_dir=root / "index"))
    return docs, root / "index"


@pytest.fixture
def service(corpus: tuple[Path, Path], tmp_path: Path) -> Iterator[CanopyService]:
    """A private copy of the index (its view cache starts empty) and no views in memory."""
    docs, index_dir = corpus
    shutil.copytree(index_dir, tmp_path / "index")
    forget_caller_views()
    svc = CanopyService(open_workspace(docs, index_dir=tmp_path / "index"))
    yield svc
    svc.close()
    forget_caller_views()


def ctx_for(svc: CanopyService, who: str | None, provider: Any = None) -> QueryContext:
    ctx = svc.context(svc.principal(who))
    if provider is not None:
        ctx = QueryContext(ctx.view, ctx.vis, provider, ctx.settings)
    return ctx


def mixed_entity(ctx: QueryContext, *, several: bool) -> str:
    """An entity with instances in readable and unreadable units; with several distinct visible
    descriptions or exactly one."""
    readable = ctx.vis.readable_units
    store_ex = None
    for e in sorted(ctx.view.graph.entities.values(), key=lambda e: e.id):
        vis = [u for u in e.text_unit_ids if u in readable]
        if not vis or len(vis) == len(e.text_unit_ids):
            continue
        if store_ex is None:
            store_ex = caller_views_of(ctx).book.store
        descs = {i.description.strip() for ex in store_ex.extractions_of(vis).values()
                 for i in ex.entities if normalize_name(i.name) == normalize_name(e.name)}
        if (len(descs) > 1) == several:
            return e.id
    raise AssertionError("no such entity in the example corpus")


def view_community(ctx: QueryContext) -> str:
    cv = caller_views_of(ctx)
    return min(c for c in ctx.view.graph.communities if cv.community_state(c) == VIEW)


# ---- the fast path ------------------------------------------------------------------------------


def test_a_caller_who_reads_everything_gets_the_canonical_artifacts_with_no_view_work(service):
    ctx = ctx_for(service, "admin")
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    assert cv.trivial
    assert all(servable_report(ctx, c) is g.reports[c] for c in g.reports)
    assert all(servable_entity(ctx, e) is g.entities[e] for e in g.entities)
    run(engines.drill_down(ctx, limit=100))
    assert cv._book is None  # the view cache was never even opened


def test_a_restricted_caller_gets_canonical_artifacts_it_can_read_fully(service):
    ctx = ctx_for(service, "staff")
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    full = [e for e in g.entities if cv.entity_state(e) == FULL]
    assert full
    for eid in full:
        e = servable_entity(ctx, eid)
        assert (e.name, e.description, e.text_unit_ids) == (
            g.entities[eid].name, g.entities[eid].description, g.entities[eid].text_unit_ids)
        assert e.degree == cv.degree(eid) <= g.entities[eid].degree  # hidden edges not counted
    partial = [e for e in g.entities if cv.entity_state(e) == VIEW]
    assert any(served(ctx, servable_entity, e).degree < g.entities[e].degree for e in partial)
    canonical = [c for c in g.reports if cv.community_state(c) == FULL]
    assert canonical and all(servable_report(ctx, c) is g.reports[c] for c in canonical)


# ---- what views are -----------------------------------------------------------------------------


def test_an_entity_view_is_its_visible_instances_one_description_as_is(service):
    ctx = ctx_for(service, "staff")
    eid = mixed_entity(ctx, several=False)
    canonical = ctx.view.graph.entities[eid]
    view = servable_entity(ctx, eid)  # one description: built at once, with no provider call
    assert view is not None and view is not canonical
    assert set(view.text_unit_ids) == {u for u in canonical.text_unit_ids if u in ctx.vis.readable_units}
    exs = service.store.extractions_of(view.text_unit_ids)
    descs = {i.description.strip() for ex in exs.values() for i in ex.entities
             if normalize_name(i.name) == normalize_name(canonical.name)}
    assert descs == {view.description}


def test_an_entity_view_with_several_descriptions_is_summarized_by_the_provider(service):
    provider = Counting()
    ctx = ctx_for(service, "staff", provider)
    eid = mixed_entity(ctx, several=True)
    with pytest.raises(ViewsPending):
        servable_entity(ctx, eid)  # outside a view-aware call, a view to build is an error
    view = served(ctx, servable_entity, eid)
    assert provider.calls == Counter(summarize=1)
    assert view.description and view.description != ctx.view.graph.entities[eid].description
    assert set(view.text_unit_ids) <= ctx.vis.readable_units


def test_an_entity_with_no_visible_instance_does_not_exist_for_the_caller(service):
    ctx = ctx_for(service, "staff")
    readable = ctx.vis.readable_units
    hidden = next(e for e in ctx.view.graph.entities.values() if not readable & set(e.text_unit_ids))
    assert servable_entity(ctx, hidden.id) is None
    messages = []
    for name in (hidden.name, "Nobody Suchname"):
        with pytest.raises(NotFound) as err:
            run(engines.drill_down(ctx, entity=name))
        messages.append(str(err.value).replace(repr(name), "<x>"))
    assert messages[0] == messages[1]


def test_a_relationship_view_needs_both_endpoints_and_keeps_visible_instances(service):
    ctx = ctx_for(service, "staff")
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    readable = ctx.vis.readable_units
    dangling = [r for r in g.relationships.values() if readable & set(r.text_unit_ids)
                and not (cv.entity_state(r.source) and cv.entity_state(r.target))]
    assert all(served(ctx, servable_relationship, r.id) is None for r in dangling)
    views = [r for r in g.relationships if cv.relationship_state(r) == VIEW]
    assert views
    for rid in views:
        view = served(ctx, servable_relationship, rid)
        assert set(view.text_unit_ids) == {u for u in g.relationships[rid].text_unit_ids if u in readable}
        assert 0 < view.weight <= g.relationships[rid].weight


def test_a_report_view_is_rewritten_from_the_visible_part_of_its_community(service):
    provider = Counting()
    ctx = ctx_for(service, "staff", provider)
    cid = view_community(ctx)
    canonical = ctx.view.graph.reports[cid]
    view = served(ctx, servable_report, cid)
    assert provider.calls["report"] >= 1
    assert view is not canonical and view.community_id == cid and view.fingerprint == canonical.fingerprint
    assert view.text_unit_ids and set(view.text_unit_ids) <= ctx.vis.readable_units
    cv = caller_views_of(ctx)
    for f in view.findings:
        assert all(cv.entity_state(e) for e in f.entity_ids)
        assert set(f.text_unit_ids) <= ctx.vis.readable_units
    members = ctx.view.graph.communities[cid].entity_ids
    assert community_card(ctx, view).size == sum(1 for e in members if cv.entity_state(e)) < len(members)
    drilled = run(engines.drill_down(ctx, community_id=cid, limit=100))
    assert drilled.community.title == view.title
    assert {e.id for e in drilled.entities} <= {e for e in members if cv.entity_state(e)}


def test_a_community_with_no_visible_member_is_hidden_like_a_missing_one(service):
    ctx = ctx_for(service, "buyer")  # reads suppliers/ only
    cv = caller_views_of(ctx)
    hidden = min(c for c in ctx.view.graph.communities if cv.community_state(c) == NONE)
    messages = []
    for cid in (hidden, "c1-0123456789"):
        with pytest.raises(NotFound) as err:
            run(engines.drill_down(ctx, community_id=cid))
        messages.append(str(err.value).replace(repr(cid), "<x>"))
    assert messages[0] == messages[1]


def test_sync_navigation_runs_inside_run_with_views(service):
    ctx = ctx_for(service, "staff")
    cid = view_community(ctx)
    with pytest.raises(ViewsPending):
        engines.report_markdown(ctx, cid)
    markdown = run(run_with_views(ctx, lambda c: engines.report_markdown(c, cid)))
    assert markdown.startswith(f"# {served(ctx, servable_report, cid).title}")
    cards = run(run_with_views(ctx, engines.list_servable_reports))
    cv = caller_views_of(ctx)
    assert {c.id for c in cards} == {c for c in ctx.view.graph.communities if cv.community_state(c)}


# ---- caching -----------------------------------------------------------------------------------


def test_a_view_is_built_once_under_concurrent_calls_then_served_from_the_cache(service):
    provider = Counting(delay=0.05)
    ctx = ctx_for(service, "staff", provider)
    cid = view_community(ctx)

    async def five() -> list[Any]:
        return await asyncio.gather(*(engines.drill_down(ctx, community_id=cid) for _ in range(5)))

    results = run(five())
    assert len({r.community.title for r in results}) == 1
    built = Counter(provider.calls)
    assert built["report"] >= 1
    cv = caller_views_of(ctx)
    needed_reports = 1 + sum(1 for k in ctx.view.graph.communities[cid].children
                             if cv.community_state(k) == VIEW)
    assert built["report"] <= needed_reports  # each view once, not once per call
    run(engines.drill_down(ctx, community_id=cid))
    assert provider.calls == built  # from memory

    forget_caller_views()  # a restart: memory gone, the SQLite cache stays
    again = ctx_for(service, "staff", provider)
    assert run(engines.drill_down(again, community_id=cid)).community.title == results[0].community.title
    assert provider.calls == built

    twin = ctx_for(service, "staff2", provider)  # the same visible units: the same views
    run(engines.drill_down(twin, community_id=cid))
    assert provider.calls == built


def test_callers_who_see_different_units_get_different_views(service):
    staff, buyer = ctx_for(service, "staff"), ctx_for(service, "buyer")
    cs, cb = caller_views_of(staff), caller_views_of(buyer)
    both = [c for c in staff.view.graph.communities
            if cs.community_state(c) == VIEW and cb.community_state(c) == VIEW]
    assert both
    cid = both[0]
    assert cs._key("report", cid, "builtin") != cb._key("report", cid, "builtin")
    a, b = served(staff, servable_report, cid), served(buyer, servable_report, cid)
    assert not set(a.text_unit_ids) & set(b.text_unit_ids)


def test_building_views_never_shows_in_a_results_usage(service):
    """A view's cost would betray that the caller's artifacts have hidden parts."""
    provider = Counting()
    ctx = ctx_for(service, "staff", provider)
    result = run(engines.drill_down(ctx, community_id=view_community(ctx)))
    assert sum(provider.calls.values()) >= 1 and result.usage.llm_calls == 0
    before = Counter(provider.calls)
    cold = run(engines.global_search(ctx, "What are the main risks?", community_level=1))
    assert provider.calls["report"] > before["report"]  # views built during this call ...
    warm = run(engines.global_search(ctx, "What are the main risks?", community_level=1))
    assert cold.usage.llm_calls == warm.usage.llm_calls  # ... are not in its usage


def test_ensure_views_builds_up_front_and_skips_canonical_and_hidden_ids(service):
    provider = Counting()
    ctx = ctx_for(service, "staff", provider)
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    canonical = [c for c in g.communities if cv.community_state(c) == FULL]
    run(ensure_views(ctx, reports=[*canonical, "c1-0123456789"]))
    assert not provider.calls
    cid = view_community(ctx)
    run(ensure_views(ctx, reports=[cid]))
    assert provider.calls["report"] >= 1
    assert servable_report(ctx, cid) is not None  # no net needed now


# ---- tools, status and warm ------------------------------------------------------------------------


def test_index_status_counts_what_the_caller_is_served(service):
    async def status(who: str) -> dict[str, Any]:
        async with Client(build_server(service, principal_name=who)) as client:
            return (await client.call_tool("index_status", {})).structured_content

    staff = run(status("staff"))
    ctx = ctx_for(service, "staff")
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    assert staff["entities"] == sum(1 for e in g.entities if cv.entity_state(e))
    assert staff["relationships"] == sum(1 for r in g.relationships if cv.relationship_state(r))
    assert staff["reports"] == sum(1 for c in g.communities if cv.community_state(c))
    assert staff["entities"] < len(g.entities)
    admin = run(status("admin"))
    assert admin["entities"] == len(g.entities) and admin["last_run"]


def test_the_level_bound_is_the_callers(service):
    ctx = ctx_for(service, "buyer")
    cv = caller_views_of(ctx)
    g = ctx.view.graph
    top = max(c.level for c in g.communities.values() if any(cv.entity_state(e) for e in c.entity_ids))
    with pytest.raises(InvalidArgument, match=f"from 0 \\(broadest\\) to {top} "):
        run(engines.global_search(ctx, "What are the risks?", community_level=top + 1))
    assert run(engines.global_search(ctx, "What are the risks?", community_level=top)).answer


def test_canopy_warm_prebuilds_the_views_of_every_principal(service, corpus):
    docs, _ = corpus
    args = ["warm", str(docs), "--index-dir", str(service.ws.index_dir), "--json"]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    rows = {r["principal"]: r for r in json.loads(first.stdout)["principals"]}
    assert set(rows) == {"admin", "buyer", "staff", "staff2"}
    assert rows["admin"]["report_views"] == 0 and rows["staff"]["report_views"] > 0
    assert rows["staff"]["usage"]["report"]["calls"] == rows["staff"]["built"]["report"]
    assert rows["staff2"]["usage"].get("report") is None  # same units as staff: all cached
    again = CliRunner().invoke(main, [*args[:-1], "--principal", "staff"])
    assert again.exit_code == 0 and "provider calls 0" in again.stdout
    forget_caller_views()  # after a restart, from the SQLite cache
    assert run(warm_views(ctx_for(service, "staff")))["usage"] == {}


def test_views_through_an_openai_compatible_endpoint(service, fake_openai):
    client = ChatClient(LLMSettings(base_url=fake_openai.base_url, model="fake", max_retries=0),
                        backoff_base=0.01)
    ctx = ctx_for(service, "staff", LLMProvider(client))
    cid = view_community(ctx)
    result = run(engines.drill_down(ctx, community_id=cid))
    assert fake_openai.count("report") >= 1 and result.usage.llm_calls == 0
    sent = len(fake_openai.requests)
    assert run(engines.drill_down(ctx, community_id=cid)).community.title == result.community.title
    assert len(fake_openai.requests) == sent
    cv = caller_views_of(ctx)  # views are per provider: the builtin one is another entry
    assert cv._key("report", cid, "openai:fake") != cv._key("report", cid, "builtin")


def test_during_an_endpoint_outage_views_are_written_offline_and_not_kept(service, monkeypatch):
    """Navigation keeps working for restricted callers while the endpoint is down: views are
    written by the offline provider, served for a short while, never stored; once the endpoint
    is back they are written by it."""
    down = Counting(down=True)
    ctx = ctx_for(service, "staff", down)
    cid = view_community(ctx)
    offline = run(engines.drill_down(ctx, community_id=cid))
    assert down.calls["report"] >= 1 and offline.community.id == cid
    assert service.store.view_counts().get("report", 0) == 0
    assert run(engines.drill_down(ctx, community_id=cid)).community.title == offline.community.title
    monkeypatch.setattr(acl.view_cache, "PROVISIONAL_S", 0.0)  # what was written offline expires
    up = Counting()
    again = run(engines.drill_down(ctx_for(service, "staff", up), community_id=cid))
    assert up.calls["report"] >= 1 and again.community.id == cid
    assert service.store.view_counts().get("report", 0) >= 1
