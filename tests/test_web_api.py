"""The web view's JSON endpoints (/ui/api/...) and files (/ui/), served by `canopy serve --http`
over a copy of examples/multi-tenant: alice reads public + finance, bob public only, carol
public + hr. The same bearer tokens as MCP; each caller gets only their view.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.conftest import REPO, offline_env
from tests.test_auth import (
    DEMO,
    FINANCE_FACTS,
    HR_FACT,
    canopy_serve_http,
    http_client,
    multi_tenant_copy,
)


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


def everything_seen(base: str, who: str) -> str:
    """Every JSON answer `who` can reach from the page: the tree, each community, and each
    entity of each community's graph."""
    seen = [get(base, "/ui/api/communities", who).text]
    for cid in community_ids(tree(base, who)["roots"]):
        page = get(base, f"/ui/api/community/{cid}", who)
        assert page.status_code == 200, (who, cid, page.text)
        seen.append(page.text)
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


def test_an_overlong_id_is_not_looked_up(base: str) -> None:
    cid = "c" * 5000
    got = get(base, f"/ui/api/community/{cid}", "alice")
    assert got.status_code == 404
    assert json.loads(got.text)["error"].startswith("No community 'ccc")


def test_the_wheel_carries_every_static_file() -> None:
    """`pip install .` ships server/web/static as package data; a file the routes serve but
    pyproject's patterns miss would be absent from an installed server."""
    from glob import glob

    from canopy.server.web.routes import STATIC_FILES

    package = REPO / "server" / "web"
    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))[
        "tool"]["setuptools"]["package-data"]["canopy.server.web"]
    shipped = {Path(p).resolve() for pattern in data for p in glob(str(package / pattern))}
    static = {p.resolve() for p in (package / "static").iterdir()}
    assert {package / "static" / n for n in [*STATIC_FILES, "index.html", "d3-LICENSE.txt"]} \
        <= static == shipped
