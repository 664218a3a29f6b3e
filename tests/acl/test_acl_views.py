"""Per-caller views (design §2, "fallback views"; canopy.acl.views, canopy.acl.reader).

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

import canopy.acl.view_cache
from canopy.acl.access import State
from canopy.errors import EndpointUnavailable, InvalidArgument, NotFound
from canopy.ids import entity_key
from canopy.llm import ChatClient
from canopy.providers.builtin import BuiltinProvider
from canopy.providers.llm_provider import LLMProvider
from canopy.server import engines
from canopy.server.cli import main
from canopy.server.context import QueryContext
from canopy.server.engines.warm import warm_views
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import LLMSettings
from canopy.store.export import Graph, load_graph
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
    """A private copy of the index (its view cache starts empty)."""
    docs, index_dir = corpus
    shutil.copytree(index_dir, tmp_path / "index")
    svc = CanopyService(open_workspace(docs, index_dir=tmp_path / "index"))
    yield svc
    svc.close()


@pytest.fixture
def graph(service: CanopyService) -> Graph:
    return load_graph(service.store)


def ask(svc: CanopyService, who: str | None, fn: Any) -> Any:
    """`fn(ctx)` as `who`, on the service's event loops (as the MCP tools run)."""
    return run(svc.run(who, fn))


def readable(svc: CanopyService, who: str, g: Graph) -> set[str]:
    async def units(ctx: QueryContext) -> set[str]:
        acl = ctx.reader._snap.unit_acl(g.units)
        return {u for u, a in acl.items() if a in ctx.caller.readable}
    return ask(svc, who, units)


def states(svc: CanopyService, who: str, kind: str, ids: Any) -> dict[str, State]:
    async def get(ctx: QueryContext) -> dict[str, State]:
        return getattr(ctx.reader, f"{kind}_states")(ids)
    return ask(svc, who, get)


def served(svc: CanopyService, who: str, kind: str, ids: Any) -> dict[str, Any]:
    async def get(ctx: QueryContext) -> dict[str, Any]:
        return await getattr(ctx.reader, kind)(ids)
    return ask(svc, who, get)


def mixed_entity(svc: CanopyService, g: Graph, *, several: bool) -> str:
    """An entity with instances in readable and unreadable units; with several distinct visible
    descriptions or exactly one."""
    vis = readable(svc, "staff", g)
    for e in sorted(g.entities.values(), key=lambda e: e.id):
        units = [u for u in e.text_unit_ids if u in vis]
        if not units or len(units) == len(e.text_unit_ids):
            continue
        rows = svc.store.writer.execute(
            "SELECT DISTINCT description FROM entity_instances WHERE key = ? AND unit_id IN "
            "(SELECT value FROM json_each(?))",
            (entity_key(e.name), json.dumps(units)),
        ).fetchall()
        if (len({r[0] for r in rows if r[0]}) > 1) == several:
            return e.id
    raise AssertionError("no such entity in the example corpus")


def view_community(svc: CanopyService, g: Graph, who: str = "staff") -> str:
    got = states(svc, who, "community", g.communities)
    return min(c for c, s in got.items() if s == State.VIEW)


# ---- the fast path ------------------------------------------------------------------------------


def test_a_caller_who_reads_everything_gets_the_canonical_artifacts_with_no_view_work(
    service, graph
):
    async def everything(ctx: QueryContext) -> tuple[bool, dict[str, Any], dict[str, Any]]:
        return (ctx.reader.trivial, await ctx.reader.reports(graph.communities),
                await ctx.reader.entities(graph.entities))

    trivial, reports, entities = ask(service, "admin", everything)
    assert trivial
    assert reports == graph.reports and entities == graph.entities
    ask(service, "admin", lambda c: engines.drill_down(c, limit=100))
    assert not service.view_cache.stats and service.store.view_counts() == {}


def test_a_restricted_caller_gets_canonical_artifacts_it_can_read_fully(service, graph):
    got = states(service, "staff", "entity", graph.entities)
    full = [e for e, s in got.items() if s == State.FULL]
    partial = [e for e, s in got.items() if s == State.VIEW]
    assert full and partial
    entities = served(service, "staff", "entities", [*full, *partial])
    for eid in full:
        e, canonical = entities[eid], graph.entities[eid]
        assert (e.name, e.description, e.text_unit_ids) == (
            canonical.name, canonical.description, canonical.text_unit_ids)
        assert e.degree <= canonical.degree  # hidden edges not counted
    assert any(entities[e].degree < graph.entities[e].degree for e in partial)
    communities = states(service, "staff", "community", graph.communities)
    canonical = [c for c, s in communities.items() if s == State.FULL]
    assert canonical
    reports = served(service, "staff", "reports", canonical)
    assert all(reports[c] == graph.reports[c] for c in canonical)


# ---- what views are -----------------------------------------------------------------------------


def test_an_entity_view_is_its_visible_instances_one_description_as_is(service, graph):
    provider = Counting()
    service.use_provider(provider)
    eid = mixed_entity(service, graph, several=False)
    view = served(service, "staff", "entities", [eid])[eid]
    canonical = graph.entities[eid]
    assert view != canonical and not provider.calls  # one description: no provider call
    assert set(view.text_unit_ids) == {u for u in canonical.text_unit_ids
                                       if u in readable(service, "staff", graph)}
    rows = service.store.writer.execute(
        "SELECT DISTINCT description FROM entity_instances WHERE key = ? AND unit_id IN "
        "(SELECT value FROM json_each(?))",
        (entity_key(canonical.name), json.dumps(view.text_unit_ids))).fetchall()
    assert {r[0] for r in rows} == {view.description}


def test_an_entity_view_with_several_descriptions_is_summarized_by_the_provider(service, graph):
    provider = Counting()
    service.use_provider(provider)
    eid = mixed_entity(service, graph, several=True)
    view = served(service, "staff", "entities", [eid])[eid]
    assert provider.calls == Counter(summarize=1)
    assert view.description and view.description != graph.entities[eid].description
    assert set(view.text_unit_ids) <= readable(service, "staff", graph)


def test_an_entity_with_no_visible_instance_does_not_exist_for_the_caller(service, graph):
    vis = readable(service, "staff", graph)
    hidden = next(e for e in graph.entities.values() if not vis & set(e.text_unit_ids))
    assert served(service, "staff", "entities", [hidden.id]) == {}
    messages = []
    for name in (hidden.name, "Nobody Suchname"):
        with pytest.raises(NotFound) as err:
            ask(service, "staff", lambda c, n=name: engines.drill_down(c, entity=n))
        messages.append(str(err.value).replace(repr(name), "<x>"))
    assert messages[0] == messages[1]


def test_a_relationship_view_needs_both_endpoints_and_keeps_visible_instances(service, graph):
    vis = readable(service, "staff", graph)
    ents = states(service, "staff", "entity", graph.entities)
    rels = states(service, "staff", "relationship", graph.relationships)
    dangling = [r for r in graph.relationships.values() if vis & set(r.text_unit_ids)
                and not (ents[r.source] and ents[r.target])]
    assert all(rels[r.id] == State.NONE for r in dangling)
    views = [r for r, s in rels.items() if s == State.VIEW]
    assert views
    got = served(service, "staff", "relationships", views)
    for rid in views:
        want = graph.relationships[rid]
        assert set(got[rid].text_unit_ids) == {u for u in want.text_unit_ids if u in vis}
        assert 0 < got[rid].weight <= want.weight


def test_a_report_view_is_rewritten_from_the_visible_part_of_its_community(service, graph):
    provider = Counting()
    service.use_provider(provider)
    cid = view_community(service, graph)
    canonical = graph.reports[cid]
    view = served(service, "staff", "reports", [cid])[cid]
    assert provider.calls["report"] >= 1
    assert (
        view != canonical and view.community_id == cid and view.fingerprint == canonical.fingerprint
    )
    vis = readable(service, "staff", graph)
    assert view.text_unit_ids and set(view.text_unit_ids) <= vis
    ents = states(service, "staff", "entity", graph.entities)
    for f in view.findings:
        assert all(ents[e] for e in f.entity_ids) and set(f.text_unit_ids) <= vis
    members = graph.communities[cid].entity_ids
    drilled = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid, limit=100))
    assert drilled.community.title == view.title
    assert drilled.community.size == sum(1 for e in members if ents[e]) < len(members)
    assert {e.id for e in drilled.entities} <= {e for e in members if ents[e]}


def test_a_community_with_no_visible_member_is_hidden_like_a_missing_one(service, graph):
    got = states(service, "buyer", "community", graph.communities)  # buyer reads suppliers/ only
    hidden = min(c for c, s in got.items() if s == State.NONE)
    messages = []
    for cid in (hidden, "c1-0123456789"):
        with pytest.raises(NotFound) as err:
            ask(service, "buyer", lambda c, i=cid: engines.drill_down(c, community_id=i))
        messages.append(str(err.value).replace(repr(cid), "<x>"))
    assert messages[0] == messages[1]


def test_navigation_serves_views_in_markdown_and_listings(service, graph):
    cid = view_community(service, graph)
    view = served(service, "staff", "reports", [cid])[cid]
    markdown = ask(service, "staff", lambda c: engines.report_markdown(c, cid))
    assert markdown.startswith(f"# {view.title}")
    cards = ask(service, "staff", engines.list_servable_reports)
    got = states(service, "staff", "community", graph.communities)
    assert {c.id for c in cards} == {c for c, s in got.items() if s}


# ---- caching -----------------------------------------------------------------------------------


def test_a_view_is_built_once_under_concurrent_calls_then_served_from_the_cache(service, graph):
    provider = Counting(delay=0.05)
    service.use_provider(provider)
    cid = view_community(service, graph)

    async def five() -> list[Any]:
        return await asyncio.gather(*(service.run("staff", lambda c: engines.drill_down(
            c, community_id=cid)) for _ in range(5)))

    results = run(five())
    assert len({r.community.title for r in results}) == 1
    built = Counter(provider.calls)
    assert built["report"] >= 1
    kids = states(service, "staff", "community", graph.communities[cid].children)
    assert built["report"] <= 1 + sum(1 for s in kids.values() if s == State.VIEW)
    ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert provider.calls == built  # from memory

    service.view_cache.forget()  # a restart: memory gone, the SQLite cache stays
    again = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert again.community.title == results[0].community.title and provider.calls == built
    ask(service, "staff2", lambda c: engines.drill_down(c, community_id=cid))  # same units
    assert provider.calls == built


def test_callers_who_see_different_units_get_different_views(service, graph):
    staff = states(service, "staff", "community", graph.communities)
    buyer = states(service, "buyer", "community", graph.communities)
    both = [c for c in graph.communities if staff[c] == State.VIEW and buyer[c] == State.VIEW]
    assert both
    a = served(service, "staff", "reports", both[:1])[both[0]]
    b = served(service, "buyer", "reports", both[:1])[both[0]]
    assert not set(a.text_unit_ids) & set(b.text_unit_ids)
    assert service.store.view_counts()["report"] >= 2


def test_building_views_never_shows_in_a_results_usage(service, graph):
    """A view's cost would betray that the caller's artifacts have hidden parts."""
    provider = Counting()
    service.use_provider(provider)
    cid = view_community(service, graph)
    result = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert sum(provider.calls.values()) >= 1 and result.usage.llm_calls == 0
    before = Counter(provider.calls)
    cold = ask(service, "staff", lambda c: engines.global_search(c, "What are the main risks?",
                                                                 community_level=1))
    assert provider.calls["report"] > before["report"]  # views built during this call ...
    warm = ask(service, "staff", lambda c: engines.global_search(c, "What are the main risks?",
                                                                 community_level=1))
    assert cold.usage.llm_calls == warm.usage.llm_calls  # ... are not in its usage


def test_canonical_hidden_and_unknown_ids_cost_no_view_work(service, graph):
    provider = Counting()
    service.use_provider(provider)
    got = states(service, "staff", "community", graph.communities)
    canonical = [c for c, s in got.items() if s == State.FULL]
    hidden = [c for c, s in got.items() if s == State.NONE]
    reports = served(service, "staff", "reports", [*canonical, *hidden, "c1-0123456789"])
    assert set(reports) == set(canonical) and not provider.calls


# ---- tools, status and warm ----------------------------------------------------------------------


def test_index_status_counts_what_the_caller_is_served(service, graph):
    async def status(who: str) -> dict[str, Any]:
        async with Client(build_server(service, principal_name=who)) as client:
            return (await client.call_tool("index_status", {})).structured_content

    staff = run(status("staff"))
    ents = states(service, "staff", "entity", graph.entities)
    rels = states(service, "staff", "relationship", graph.relationships)
    comms = states(service, "staff", "community", graph.communities)
    assert staff["entities"] == sum(1 for s in ents.values() if s) < len(graph.entities)
    assert staff["relationships"] == sum(1 for s in rels.values() if s)
    assert staff["reports"] == sum(1 for s in comms.values() if s)
    admin = run(status("admin"))
    assert admin["entities"] == len(graph.entities) and admin["last_run"]


def test_the_level_bound_is_the_callers(service, graph):
    vis = readable(service, "buyer", graph)
    top = max(c.level for c in graph.communities.values()
              if any(vis & set(graph.entities[e].text_unit_ids) for e in c.entity_ids))
    with pytest.raises(InvalidArgument, match=f"from 0 \\(broadest\\) to {top} "):
        ask(service, "buyer", lambda c: engines.global_search(c, "What are the risks?",
                                                              community_level=top + 1))
    assert ask(service, "buyer", lambda c: engines.global_search(c, "What are the risks?",
                                                                 community_level=top)).answer


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
    service.view_cache.forget()  # after a restart, from the SQLite cache
    assert ask(service, "staff", warm_views)["usage"] == {}


def test_views_through_an_openai_compatible_endpoint(service, graph, fake_openai):
    client = ChatClient(LLMSettings(base_url=fake_openai.base_url, model="fake", max_retries=0),
                        backoff_base=0.01)
    service.use_provider(LLMProvider(client))
    cid = view_community(service, graph)
    result = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert fake_openai.count("report") >= 1 and result.usage.llm_calls == 0
    sent = len(fake_openai.requests)
    again = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert again.community.title == result.community.title and len(fake_openai.requests) == sent


def test_during_an_endpoint_outage_views_are_written_offline_and_not_kept(service, graph,
                                                                          monkeypatch):
    """Navigation keeps working for restricted callers while the endpoint is down: views are
    written by the offline provider, served for a short while, never stored; once the endpoint
    is back they are written by it."""
    down = Counting(down=True)
    service.use_provider(down)
    cid = view_community(service, graph)
    offline = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert down.calls["report"] >= 1 and offline.community.id == cid
    assert service.store.view_counts().get("report", 0) == 0
    again = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert again.community.title == offline.community.title
    # what was written offline expires
    monkeypatch.setattr(canopy.acl.view_cache, "PROVISIONAL_S", 0.0)
    up = Counting()
    service.use_provider(up)
    back = ask(service, "staff", lambda c: engines.drill_down(c, community_id=cid))
    assert up.calls["report"] >= 1 and back.community.id == cid
    assert service.store.view_counts().get("report", 0) >= 1


def test_views_held_in_memory_stay_within_their_byte_budget(service, graph):
    """Issue 9, case 7: the views a server keeps in memory are bounded in bytes, not entries; what
    leaves memory is read back from the index's SQLite cache, not built again."""
    budget = 4096
    service.view_cache.memory_bytes = budget
    provider = Counting()
    service.use_provider(provider)
    peak = 0
    for who in ("staff", "buyer"):
        warmed = ask(service, who, lambda c: warm_views(c))
        assert warmed["report_views"] + warmed["entity_views"] > 3
        peak = max(peak, service.view_cache.memory_used)
    assert 0 < peak <= budget
    built = Counter(provider.calls)
    for who in ("staff", "buyer"):
        ask(service, who, lambda c: warm_views(c))
        assert service.view_cache.memory_used <= budget
    assert provider.calls == built  # evicted views came back from SQLite
    assert service.view_cache.stats["db_hits"] > 0


def test_engine_caches_hold_at_most_their_byte_budget() -> None:
    from canopy.server.context import BoundedCache

    cache = BoundedCache(1000)
    for i in range(50):
        cache.put(i, f"value {i}", 90)
        assert cache.size <= 1000
    assert cache.get(0) is None and cache.get(49) == "value 49"  # least recently used went
    cache.get(45)
    cache.put("big", "x", 200)
    assert cache.get(45) is not None and cache.size <= 1000
