"""The web view's JSON endpoints (/ui/api/...) and files (/ui/), served by `canopy serve --http`
over a copy of examples/multi-tenant: alice reads public + finance, bob public only, carol
public + hr. The same bearer tokens as MCP; each caller gets only their view. The hierarchy's
bounds (depth, width, reports read) are also checked in process over the examples, whose tree
is three levels deep.
"""

from __future__ import annotations

import asyncio
import json
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from canopy.errors import NotFound
from canopy.model import Report
from canopy.server.context import QueryContext
from canopy.server.engines import drill_down
from canopy.server.service import CanopyService
from canopy.server.wings.web.data import community_page, hierarchy
from canopy.server.wings.web.models import CommunityPage, Hierarchy
from tests.acl.test_auth import (
    DEMO,
    FINANCE_FACTS,
    HR_FACT,
    canopy_serve_http,
    http_client,
    multi_tenant_copy,
)
from tests.conftest import REPO, indexed_examples, offline_env, report_reads


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`canopy serve --http` over an indexed copy of examples/multi-tenant; yields its base URL."""
    root = tmp_path_factory.mktemp("web-api")
    with offline_env():
        docs = multi_tenant_copy(root)
    with canopy_serve_http(docs, root / "index", root / "server.log") as url:
        yield url.removesuffix("/mcp")


def get(base: str, path: str, who: str | None = None, **headers: str) -> httpx2.Response:
    if who is not None:
        headers["Authorization"] = f"Bearer {DEMO[who]}"
    return httpx2.get(base + path, headers=headers, timeout=60)


def tree(base: str, who: str) -> dict[str, Any]:
    response = get(base, "/ui/api/communities", who)
    assert response.status_code == 200, response.text
    return dict(response.json())


def community_ids(nodes: list[dict[str, Any]]) -> list[str]:
    return [i for n in nodes for i in [n["id"], *community_ids(n["children"])]]


def walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for n in nodes for x in [n, *walk(n["children"])]]


def cut(node: dict[str, Any], depth: int) -> dict[str, Any]:
    """A node of a whole tree as an answer `depth` levels deep shows it: deeper lists empty,
    their counts kept, the rest starting at offset 0."""
    kids = node["children"]
    return {**node, "children": [cut(k, depth - 1) for k in kids] if depth > 0 else [],
            "next_offset": 0 if depth <= 0 and kids else None}


def everything_seen(base: str, who: str) -> str:
    """Every JSON answer `who` can reach from the page: the tree, each community, and each
    entity of each community's graph."""
    seen = [get(base, "/ui/api/communities", who).text]
    for cid in community_ids(tree(base, who)["roots"]):
        page = get(base, f"/ui/api/community/{cid}", who)
        assert page.status_code == 200, (who, cid, page.text)
        seen.append(page.text)
        subtree = get(base, f"/ui/api/communities?root={cid}&depth=0", who)
        assert subtree.status_code == 200, (who, cid, subtree.text)
        seen.append(subtree.text)
        for node in page.json()["nodes"]:
            entity = get(base, f"/ui/api/entity/{node['id']}", who)
            assert entity.status_code == 200, (who, node, entity.text)
            seen.append(entity.text)
    return "\n".join(seen)


@pytest.mark.parametrize("path", ["/ui/api/communities", "/ui/api/community/c0-x",
                                  "/ui/api/entity/ent-x"])
@pytest.mark.parametrize("headers", [
    pytest.param({}, id="no-token"),
    pytest.param({"Authorization": "Bearer cnpy_demo_alice_wrong"}, id="wrong-token"),
    pytest.param({"Authorization": DEMO["alice"]}, id="token-without-bearer"),
    pytest.param({"X-Canopy-Principal": "alice"}, id="principal-header"),
])
def test_the_api_needs_a_valid_bearer_token(base: str, path: str,
                                            headers: dict[str, str]) -> None:
    response = get(base, path, **headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert response.json() == {"error": "A valid bearer token is required."}
    assert response.headers["cache-control"] == "no-store"


def test_the_page_and_its_files_are_served_without_a_token_and_nothing_else_is(base: str) -> None:
    page = get(base, "/ui/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, media in [("app.js", "text/javascript"), ("app.css", "text/css"),
                        ("d3.min.js", "text/javascript")]:
        got = get(base, f"/ui/static/{name}")
        assert got.status_code == 200 and got.headers["content-type"].startswith(media), name
        assert f"/ui/static/{name}" in page.text
    assert "d3js.org v7" in get(base, "/ui/static/d3.min.js").text[:200]
    for path in ["/ui/static/index.html", "/ui/static/..%2F..%2Fhttp.py", "/ui/static/%2e%2e",
                 "/ui/static/d3-LICENSE.txt"]:
        assert get(base, path).status_code == 404, path
    redirect = httpx2.get(base + "/ui", timeout=30)
    assert redirect.status_code == 307 and redirect.headers["location"] == "/ui/"


def test_a_foreign_host_header_is_refused_on_loopback(base: str) -> None:
    """DNS rebinding: a page of another site resolved to 127.0.0.1 cannot read the API."""
    assert get(base, "/ui/api/communities", "bob", Host="evil.example:80").status_code == 421
    assert get(base, "/ui/api/communities", "bob",
               Origin="http://evil.example").status_code == 403


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
@pytest.mark.parametrize("who", ["alice", "bob", "carol"])
async def test_counts_are_the_callers_own_as_index_status_gives_them(base: str,
                                                                     who: str) -> None:
    """The tree's totals are the caller's: what index_status (MCP) tells the same caller."""
    async with http_client(base + "/mcp", DEMO[who]) as client:
        status = (await client.call_tool("index_status", {})).structured_content
    got = tree(base, who)
    assert got["caller"] == who
    assert got["entities"] == status["entities"]
    assert got["communities"] == len(community_ids(got["roots"])) == status["reports"]
    for node in got["roots"]:  # a parent's members cover its sub-communities'
        assert node["size"] >= sum(k["size"] for k in node["children"])
    # A small index's whole tree is in the first answer: nothing is cut.
    assert got["next_offset"] is None and got["roots_count"] == len(got["roots"])
    assert all(n["next_offset"] is None and n["children_count"] == len(n["children"])
               for n in walk(got["roots"]))


def test_a_hidden_community_answers_exactly_like_a_missing_one(base: str) -> None:
    carol, bob = tree(base, "carol"), tree(base, "bob")
    hidden = sorted(set(community_ids(carol["roots"])) - set(community_ids(bob["roots"])))
    assert hidden, "carol's hr-only community should be hidden from bob"
    for cid in hidden:
        assert get(base, f"/ui/api/community/{cid}", "carol").status_code == 200
        seen = get(base, f"/ui/api/community/{cid}", "bob")
        fake = cid[:-3] + ("000" if not cid.endswith("000") else "111")
        missing = get(base, f"/ui/api/community/{fake}", "bob")
        assert seen.status_code == missing.status_code == 404
        assert seen.json() == {"error": f"No community {cid!r} in this index."}
        assert missing.json() == {"error": f"No community {fake!r} in this index."}
        assert dict(seen.headers) | {"content-length": "", "date": ""} == \
            dict(missing.headers) | {"content-length": "", "date": ""}
        # Its members are hidden too, and answer like missing entities.
        for node in get(base, f"/ui/api/community/{cid}", "carol").json()["nodes"]:
            got = get(base, f"/ui/api/entity/{node['id']}", "bob")
            assert got.status_code == 404
            assert got.json() == {"error": f"No entity {node['id']!r} in this index."}


def test_nothing_a_restricted_caller_can_reach_carries_what_they_may_not_read(base: str) -> None:
    seen = {who: everything_seen(base, who) for who in ("alice", "bob", "carol")}
    assert HR_FACT in seen["carol"] or "Juniper" in seen["carol"]  # the check can fail
    assert any(fact in seen["alice"] for fact in FINANCE_FACTS)
    for who in ("alice", "bob"):
        assert HR_FACT not in seen[who] and "Juniper" not in seen[who], who
        assert "Halvorsen" not in seen[who] and "hr/retention_plan_2025.md" not in seen[who]
    for who in ("bob", "carol"):
        assert not any(fact in seen[who] for fact in FINANCE_FACTS), who
        assert "restricted/finance" not in seen[who], who


def test_a_community_page_draws_members_and_the_edges_among_them(base: str) -> None:
    root = tree(base, "alice")["roots"][0]
    page = get(base, f"/ui/api/community/{root['id']}", "alice").json()
    assert page["community"]["title"] == root["title"]
    assert page["members"] == root["size"] and 0 < len(page["nodes"]) <= page["members"]
    drawn = {n["id"] for n in page["nodes"]}
    assert page["edges"] and all(e["source"] in drawn and e["target"] in drawn
                                 for e in page["edges"])
    assert [c["id"] for c in page["children"]] == [k["id"] for k in root["children"]]
    child = get(base, f"/ui/api/community/{root['children'][0]['id']}", "alice").json()
    assert [p["id"] for p in child["parents"]] == [root["id"]]


def test_an_entity_page_marks_its_mentions_in_source_excerpts(base: str) -> None:
    root = tree(base, "carol")["roots"][0]
    node = get(base, f"/ui/api/community/{root['id']}", "carol").json()["nodes"][0]
    page = get(base, f"/ui/api/entity/{node['id']}", "carol").json()
    name = page["entity"]["name"]
    assert name == node["name"] and page["entity"]["description"]
    assert root["id"] in [c["id"] for c in page["communities"]]
    assert 0 < len(page["sources"]) <= page["n_sources"]
    marked = [s["text"][a:b] for s in page["sources"] for a, b in s["marks"]]
    assert marked and all(m.lower() == name.lower() for m in marked)
    assert page["n_relationships"] == page["entity"]["degree"] >= len(page["relationships"])
    assert all(r["entity_id"] != node["id"] for r in page["relationships"])


def test_a_wide_list_comes_in_pages_with_its_count_and_next_offset(base: str) -> None:
    whole = tree(base, "alice")
    roots: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:  # the top-level list, two at a time
        page = get(base, f"/ui/api/communities?limit=2&offset={offset}", "alice").json()
        assert page["roots_count"] == whole["roots_count"] and 0 < len(page["roots"]) <= 2
        assert page["entities"] == whole["entities"]
        assert all(len(n["children"]) <= 2 for n in walk(page["roots"]))
        roots += page["roots"]
        offset = page["next_offset"]
    assert [r["id"] for r in roots] == [r["id"] for r in whole["roots"]]
    wide = [r for r in roots if r["children_count"] > 2]
    assert wide and all(r["next_offset"] == 2 and len(r["children"]) == 2 for r in wide)
    for node in whole["roots"]:  # each community's sub-communities, one at a time
        kids: list[dict[str, Any]] = []
        offset = 0
        while offset is not None:
            page = get(base, f"/ui/api/communities?root={node['id']}&limit=1&offset={offset}",
                       "alice").json()
            [got] = page["roots"]
            assert got["id"] == node["id"] and got["children_count"] == node["children_count"]
            kids += got["children"]
            offset = got["next_offset"]
        assert kids == node["children"]


def test_a_subtree_is_what_the_whole_tree_holds_below_its_root(base: str) -> None:
    whole = tree(base, "carol")
    for node in walk(whole["roots"]):
        got = get(base, f"/ui/api/communities?root={node['id']}", "carol").json()
        assert got["root"] == node["id"] and got["roots"] == [node]
        assert got["entities"] == node["size"] and got["communities"] is None
        top = get(base, f"/ui/api/communities?root={node['id']}&depth=0", "carol").json()
        assert top["roots"] == [cut(node, 0)] and top["depth"] == 0


def test_each_caller_counts_only_the_sub_communities_they_see(base: str) -> None:
    carol, bob = tree(base, "carol"), tree(base, "bob")
    shallow = {who: {n["id"]: n for n in get(base, "/ui/api/communities?depth=0", who)
                     .json()["roots"]} for who in ("carol", "bob")}
    for who, whole in (("carol", carol), ("bob", bob)):
        assert shallow[who] == {n["id"]: cut(n, 0) for n in whole["roots"]}
    # Positive control: carol's hr-only community is a sub-community bob does not count.
    fewer = [c for c in shallow["bob"]
             if shallow["bob"][c]["children_count"] < shallow["carol"][c]["children_count"]]
    assert fewer


def test_a_hidden_root_answers_exactly_like_an_unknown_one(base: str) -> None:
    carol, bob = tree(base, "carol"), tree(base, "bob")
    hidden = sorted(set(community_ids(carol["roots"])) - set(community_ids(bob["roots"])))
    assert hidden
    for cid in hidden:
        assert get(base, f"/ui/api/communities?root={cid}", "carol").status_code == 200
        fake = cid[:-3] + ("000" if not cid.endswith("000") else "111")
        seen = get(base, f"/ui/api/communities?root={cid}&depth=1", "bob")
        missing = get(base, f"/ui/api/communities?root={fake}&depth=1", "bob")
        assert seen.status_code == missing.status_code == 404
        assert seen.json() == get(base, f"/ui/api/community/{cid}", "bob").json() == \
            {"error": f"No community {cid!r} in this index."}
        assert missing.json() == {"error": f"No community {fake!r} in this index."}
        assert dict(seen.headers) | {"content-length": "", "date": ""} == \
            dict(missing.headers) | {"content-length": "", "date": ""}
    assert get(base, "/ui/api/communities?root=" + "c" * 5000, "bob").status_code == 404


def test_a_community_page_lists_its_sub_communities_in_pages_as_the_tree_does(base: str) -> None:
    """`?offset=N&limit=N` page a community's sub-communities as the tree's `?root=ID` does,
    with the same count and next offset; each caller counts only what they see."""
    counts: dict[str, dict[str, int]] = {}
    for who in ("alice", "bob", "carol"):
        nodes = walk(tree(base, who)["roots"])
        counts[who] = {n["id"]: n["children_count"] for n in nodes}
        for node in (n for n in nodes if n["children_count"]):
            path = f"/ui/api/community/{node['id']}"
            whole = get(base, path, who).json()  # a small index: one page holds them all
            assert whole["children"] == get(base, path + "?offset=0&limit=200", who).json()[
                "children"]
            assert [k["id"] for k in whole["children"]] == [k["id"] for k in node["children"]]
            assert whole["children_count"] == node["children_count"]
            assert whole["next_offset"] is None
            kids: list[str] = []
            offset: int | None = 0
            while offset is not None:  # one at a time
                page = get(base, f"{path}?limit=1&offset={offset}", who).json()
                assert page["children_count"] == node["children_count"]
                assert len(page["children"]) == 1 and page["community"] == whole["community"]
                kids += [k["id"] for k in page["children"]]
                offset = page["next_offset"]
            assert kids == [k["id"] for k in node["children"]]
            past = get(base, f"{path}?offset={node['children_count']}", who).json()
            assert past["children"] == [] and past["next_offset"] is None
    # Positive control: carol's hr-only community is a sub-community bob does not count.
    assert any(counts["bob"][c] < counts["carol"][c] for c in counts["bob"])
    root = next(iter(counts["bob"]))
    for query, error in (("offset=-3", "offset must be an integer from 0 to 1000000."),
                         ("limit=0", "limit must be an integer from 1 to 200."),
                         ("limit=201", "limit must be an integer from 1 to 200.")):
        got = get(base, f"/ui/api/community/{root}?{query}", "bob")
        assert got.status_code == 400 and got.json() == {"error": error}


@pytest.mark.parametrize(("query", "error"), [
    ("depth=5", "depth must be an integer from 0 to 4."),
    ("depth=-1", "depth must be an integer from 0 to 4."),
    ("depth=two", "depth must be an integer from 0 to 4."),
    ("limit=0", "limit must be an integer from 1 to 200."),
    ("limit=201", "limit must be an integer from 1 to 200."),
    ("offset=-3", "offset must be an integer from 0 to 1000000."),
])
def test_a_bound_out_of_range_is_refused(base: str, query: str, error: str) -> None:
    got = get(base, f"/ui/api/communities?{query}", "bob")
    assert got.status_code == 400 and got.json() == {"error": error}


# ---- the bounds in process, over the examples (three levels; admin reads all, eve little) ---


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanopyService]:
    from tests.server.engines.test_engines import POLICY

    svc = CanopyService(indexed_examples(tmp_path_factory.mktemp("web-tree"), POLICY))
    yield svc
    svc.close()


def answer(service: CanopyService, who: str, root: str | None = None,
           **bounds: int) -> tuple[Hierarchy, list[str]]:
    """`who`'s hierarchy answer, and the communities whose reports it read."""
    read: list[str] = []
    with service.context(who) as ctx, pytest.MonkeyPatch.context() as patch:
        reports = ctx.reader.reports

        async def counted(ids: Iterable[str]) -> dict[str, Report]:
            ids = list(ids)
            read.extend(ids)
            return await reports(ids)

        patch.setattr(ctx.reader, "reports", counted)
        got = asyncio.run(hierarchy(ctx, "docs", root, **bounds))
    return got, read


def dumped(got: Hierarchy) -> list[dict[str, Any]]:
    return [n.model_dump() for n in got.roots]


def test_an_answer_stops_at_its_depth_and_reads_only_the_reports_it_holds(
        service: CanopyService) -> None:
    whole, _ = answer(service, "admin", depth=4)
    full = dumped(whole)
    assert max(n["level"] for n in walk(full)) == 2  # three levels: depth 1 cuts something
    assert all(n["children_count"] == len(n["children"]) for n in walk(full))
    for depth in range(4):
        got, read = answer(service, "admin", depth=depth)
        assert dumped(got) == [cut(n, depth) for n in full], depth
        assert sorted(read) == sorted(community_ids(dumped(got))), depth
    top, read = answer(service, "admin", depth=0)
    assert len(read) == len(top.roots) == 8 < whole.communities == 25  # not every report
    assert top.communities == whole.communities and top.entities == whole.entities
    for node in walk(full):
        got, read = answer(service, "admin", node["id"], depth=1)
        assert dumped(got) == [cut(node, 1)] and got.entities == node["size"]
        assert sorted(read) == sorted(community_ids(dumped(got)))


def test_the_budget_cuts_the_deepest_lists_and_says_where_they_go_on(
        service: CanopyService) -> None:
    whole = dumped(answer(service, "admin", depth=4)[0])
    got, read = answer(service, "admin", depth=2, budget=10)
    nodes = walk(dumped(got))
    assert len(nodes) == len(read) == 10
    assert [n["id"] for n in dumped(got)] == [n["id"] for n in whole]  # the top level first
    first = dumped(got)[0]
    assert len(first["children"]) == 2 < first["children_count"] == 3
    assert first["next_offset"] == 2
    assert all(n["children"] == [] and n["next_offset"] == 0
               for n in dumped(got)[1:] if n["children_count"])
    rest, _ = answer(service, "admin", first["id"], depth=1, offset=2)
    assert [k["id"] for k in dumped(rest)[0]["children"]] == \
        [k["id"] for k in whole[0]["children"][2:]]


def test_a_restricted_callers_counts_are_their_own(service: CanopyService) -> None:
    admin = dumped(answer(service, "admin", depth=4)[0])
    eve = dumped(answer(service, "eve", depth=4)[0])
    for who, full in (("admin", admin), ("eve", eve)):
        got = dumped(answer(service, who, depth=0)[0])
        assert got == [cut(n, 0) for n in full], who
        for node in walk(full):
            assert dumped(answer(service, who, node["id"], depth=0)[0]) == [cut(node, 0)]
    count = {who: {n["id"]: n["children_count"] for n in walk(full)}
             for who, full in (("admin", admin), ("eve", eve))}
    assert any(count["eve"][c] < count["admin"][c] for c in count["eve"])  # positive control
    assert set(count["eve"]) < set(count["admin"])
    for cid in sorted(set(count["admin"]) - set(count["eve"])):
        with pytest.raises(NotFound) as seen:
            answer(service, "eve", cid)
        with pytest.raises(NotFound) as missing:
            answer(service, "eve", cid[:-3] + "000")
        assert str(seen.value) == str(missing.value).replace(cid[:-3] + "000", cid)


def page_and_reads(service: CanopyService, who: str, cid: str,
                   **bounds: int) -> tuple[CommunityPage, list[list[str]]]:
    """`who`'s page of community `cid`, and the ids of each read of reports it made."""
    with service.context(who) as ctx, report_reads(ctx.reader) as reads:
        return asyncio.run(community_page(ctx, cid, **bounds)), reads


def ancestors(ctx: QueryContext, cid: str) -> list[str]:
    """Community `cid`'s ancestors in the index, root first (hidden ones too)."""
    chain: list[str] = []
    parent = ctx.reader.community_rows([cid])[cid].parent
    while parent is not None:
        chain.insert(0, parent)
        parent = ctx.reader.community_rows([parent])[parent].parent
    return chain


def test_a_community_page_reads_only_its_page_of_sub_communities_in_drill_downs_order(
        service: CanopyService) -> None:
    """A top community at 10k articles has ~960 sub-communities: the page lists those from
    `offset` (at most `limit`) in drill_down's order and reads only their reports (besides its
    own and its ancestors'); its count is drill_down's total for the same caller."""
    totals: dict[str, dict[str, int]] = {}
    for who in ("admin", "eve"):
        totals[who] = {}
        for node in walk(dumped(answer(service, who, depth=4)[0])):
            cid = node["id"]
            with service.context(who) as ctx:
                ctx.settings = ctx.settings.model_copy(update={"result_token_limit": 30_000})
                every = [k.id for k in asyncio.run(drill_down(ctx, community_id=cid,
                                                              limit=100)).children]
                chain = ancestors(ctx, cid)
                asyncio.run(community_page(ctx, cid))  # builds eve's views first (they read)
            assert every == [k["id"] for k in node["children"]]
            totals[who][cid] = len(every)
            for limit in (1, 2):
                for offset in range(len(every) + 1):
                    page, reads = page_and_reads(service, who, cid, offset=offset, limit=limit)
                    want = every[offset:offset + limit]
                    assert [k.id for k in page.children] == want, (who, cid, offset, limit)
                    assert page.children_count == len(every) == node["children_count"]
                    rest = offset + limit if offset + limit < len(every) else None
                    assert page.next_offset == rest
                    assert sorted(reads) == sorted([[cid], want, chain]), (who, cid, reads)
    # Positive controls: some lists take pages; eve's counts leave out hidden sub-communities.
    assert any(n > 1 for n in totals["admin"].values())
    assert any(totals["eve"][c] < totals["admin"][c] for c in totals["eve"])


def test_an_overlong_id_is_not_looked_up(base: str) -> None:
    cid = "c" * 5000
    got = get(base, f"/ui/api/community/{cid}", "alice")
    assert got.status_code == 404
    assert json.loads(got.text)["error"].startswith("No community 'ccc")


def test_the_wheel_carries_every_static_file() -> None:
    """`pip install .` ships server/wings/web/static as package data; a file the routes serve but
    pyproject's patterns miss would be absent from an installed server."""
    from glob import glob

    from canopy.server.wings.web.routes import STATIC_FILES

    package = REPO / "server" / "wings" / "web"
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-data"]["canopy.server.wings.web"]
    shipped = {Path(p).resolve() for pattern in data for p in glob(str(package / pattern))}
    static = {p.resolve() for p in (package / "static").iterdir()}
    assert {package / "static" / n for n in [*STATIC_FILES, "index.html", "d3-LICENSE.txt"]} \
        <= static == shipped


# ---- the query box, cited passages and entity search ----------------------------------------


def ask(base: str, who: str | None, body: Any, **headers: str) -> httpx2.Response:
    if who is not None:
        headers["Authorization"] = f"Bearer {DEMO[who]}"
    headers.setdefault("Content-Type", "application/json")
    return httpx2.post(base + "/ui/api/ask", content=json.dumps(body), headers=headers,
                       timeout=120)


def test_the_query_box_answers_each_caller_from_what_they_may_read(base: str) -> None:
    question = "What was the revenue in 2024, and what is the 2025 budget?"
    answers = {}
    for who in ("alice", "bob"):
        r = ask(base, who, {"query": question, "mode": "basic"})
        assert r.status_code == 200, r.text
        assert r.headers["cache-control"] == "no-store"
        answers[who] = r.json()
    docs = {who: {c["document"] for c in a["citations"] if c["kind"] == "text_unit"}
            for who, a in answers.items()}
    assert any(d.startswith("restricted/finance/") for d in docs["alice"])
    assert not any(d.startswith("restricted/") for d in docs["bob"])
    assert "11.07" not in json.dumps(answers["bob"])
    routed = ask(base, "bob", {"query": question}).json()  # mode auto: the router's choice
    assert routed["route"]["engine"] in ("basic", "local", "global") and routed["route"]["reason"]


def test_a_cited_passage_opens_for_its_reader_and_is_missing_for_everyone_else(base: str) -> None:
    alice = ask(base, "alice", {"query": "What is the 2025 budget?", "mode": "basic"}).json()
    unit = next(c["id"] for c in alice["citations"] if c["kind"] == "text_unit"
                and c["document"].startswith("restricted/finance/"))
    shown = get(base, f"/ui/api/unit/{unit}", "alice")
    assert shown.status_code == 200 and shown.json()["document"].startswith("restricted/")
    hidden, missing = get(base, f"/ui/api/unit/{unit}", "bob"), get(
        base, "/ui/api/unit/tu-0000000000000000", "bob")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"].replace(unit, "X") == missing.json()["error"].replace(
        "tu-0000000000000000", "X")


def test_entity_search_lists_only_entities_the_caller_can_see(base: str) -> None:
    found = get(base, "/ui/api/entities?q=Juniper", "carol").json()  # hr/ only
    assert any("juniper" in e["name"].lower() for e in found["entities"]), found
    assert get(base, "/ui/api/entities?q=Juniper", "bob").json()["entities"] == []
    assert get(base, "/ui/api/entities?q=", "bob").json()["entities"] == []


def test_a_question_must_be_json_with_a_known_mode(base: str) -> None:
    assert ask(base, "bob", {"query": "x", "mode": "psychic"}).status_code == 400
    assert ask(base, "bob", {"mode": "auto"}).status_code == 400
    assert ask(base, "bob", {"query": "x"}, **{"Content-Type": "text/plain"}).status_code == 400
    assert ask(base, None, {"query": "x"}).status_code == 401
    too_long = ask(base, "bob", {"query": "x" * 20_000})
    assert too_long.status_code == 413
