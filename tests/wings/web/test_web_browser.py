"""The web view in a real browser: headless Chromium loads /ui/ from `canopy serve --http`,
the script runs, a person's clicks open a community and an entity, and the screenshot shows a
coloured picture. Skipped where chromium is missing, failed instead under REQUIRE_CHROMIUM=1
(CI installs it).

SAVE_WEB_SCREENSHOT=path makes the first test also save its screenshot there: that is how
docs/web-view.png is made.
"""

from __future__ import annotations

import colorsys
import io
import json
import os
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from canopy.server.runtime import build_index, open_workspace
from tests.acl.test_auth import DEMO, HR_FACT, canopy_serve_http, multi_tenant_copy
from tests.conftest import EXAMPLES, offline_env
from tests.wings.web.browser import Browser, require_chromium

WIDTH, HEIGHT = 1440, 900
pytestmark = pytest.mark.usefixtures("chromium")  # skip (or fail) before building any index


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_chromium()


@pytest.fixture(scope="module")
def examples_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`canopy serve --http` (no tokens, loopback) over an indexed copy of examples/docs."""
    root = tmp_path_factory.mktemp("web-examples")
    docs = root / "docs"
    shutil.copytree(EXAMPLES, docs)
    with offline_env():
        build_index(open_workspace(docs))
    with canopy_serve_http(docs, docs / ".canopy", root / "server.log") as url:
        yield url.removesuffix("/mcp")


@pytest.fixture(scope="module")
def tenant_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("web-tenant")
    with offline_env():
        docs = multi_tenant_copy(root)
    with canopy_serve_http(docs, root / "index", root / "server.log") as url:
        yield url.removesuffix("/mcp")


@pytest.fixture
def browser(chromium: str, tmp_path: Path) -> Iterator[Browser]:
    with Browser(chromium, tmp_path / "profile", tmp_path / "chromium.log", WIDTH, HEIGHT) as b:
        yield b


def api(base: str, path: str, token: str | None = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx2.get(base + path, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def all_titles(nodes: list[dict[str, Any]]) -> list[str]:
    return [t for n in nodes for t in [n["title"], *all_titles(n["children"])]]


def hue_bins(png: bytes) -> tuple[tuple[int, int], Counter[int]]:
    """The image's size, and how many clearly coloured pixels fall in each of 12 hue bins."""
    from PIL import Image  # the [heavy] extra's: the default suite collects this module without it

    image = Image.open(io.BytesIO(png)).convert("RGB")
    small = image.resize((image.width // 4, image.height // 4))  # enough to judge colours
    bins: Counter[int] = Counter()
    raw = small.tobytes()
    for i in range(0, len(raw), 3):
        h, s, v = colorsys.rgb_to_hsv(raw[i] / 255, raw[i + 1] / 255, raw[i + 2] / 255)
        if s > 0.35 and v > 0.35:
            bins[int(h * 12) % 12] += 1
    return image.size, bins


def test_the_page_draws_the_hierarchy_and_opens_a_community_and_an_entity(
        browser: Browser, examples_base: str) -> None:
    tree = api(examples_base, "/ui/api/communities")
    browser.goto(examples_base + "/ui/")
    browser.wait_for("document.body.dataset.state === 'ready'")
    dom = browser.evaluate("document.documentElement.outerHTML")
    # Every community is an arc titled with its report title; the roots are listed in full.
    arcs = browser.evaluate("[...document.querySelectorAll('#sunburst path[data-id]')]"
                            ".map(p => p.querySelector('title').textContent.split('\\n')[0])")
    assert sorted(arcs) == sorted(all_titles(tree["roots"])) and len(arcs) == 25
    listed = browser.evaluate("[...document.querySelectorAll('#inside .link')]"
                              ".map(b => b.textContent)")
    assert listed == [r["title"] for r in tree["roots"]]
    assert "all documents (no access policy)" in dom and "107 entities" in dom

    # A click on the largest top-level community's arc (at its label, which lets clicks
    # through) opens its report and graph, and lists its sub-communities.
    first = tree["roots"][0]
    browser.click(f"#sunburst text.arc-label[data-id='{first['id']}']")
    open_community(browser, examples_base, first)
    assert browser.evaluate("location.hash") == f"#c={first['id']}"
    listed = browser.evaluate("[...document.querySelectorAll('#inside .link')]"
                              ".map(b => b.textContent)")
    assert listed == [k["title"] for k in first["children"]]
    # From that list, its largest sub-community; its parent is the way back up.
    child = first["children"][0]
    browser.click("#inside li:first-child .link")
    page = open_community(browser, examples_base, child)
    assert browser.evaluate("[...document.querySelectorAll('#community .crumbs .link')]"
                            ".map(b => b.textContent)") == [first["title"]]
    assert browser.evaluate("document.querySelector('#sunburst path.selected').dataset.id") \
        == child["id"]

    # A click on its best-connected entity opens its description and marked source excerpts.
    hub = page["nodes"][0]
    browser.click(f"#graph circle[data-id='{hub['id']}']")
    browser.wait_for(f"document.querySelector('#entity').dataset.id === {json.dumps(hub['id'])}")
    assert browser.evaluate("document.querySelector('#entity h2').textContent") == hub["name"]
    marks = browser.evaluate("[...document.querySelectorAll('#entity mark')]"
                             ".map(m => m.textContent.toLowerCase())")
    assert marks and set(marks) == {hub["name"].lower()}
    assert browser.evaluate("document.querySelector('#graph circle.selected').dataset.id") \
        == hub["id"]
    assert browser.evaluate("location.hash") == f"#c={child['id']}&e={hub['id']}"

    # The whole tree came in the first answer: no sub-tree was asked for.
    asked = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)"
                             ".filter(u => u.includes('/ui/api/communities'))")
    assert len(asked) == 1 and "root=" not in asked[0]

    png = browser.screenshot()
    size, bins = hue_bins(png)
    assert size == (WIDTH, HEIGHT) and len(png) > 50_000
    # The sunburst's palette, the graph's entity types: many hues, each over a visible area.
    assert len([b for b, n in bins.items() if n >= 150]) >= 4, bins
    if target := os.environ.get("SAVE_WEB_SCREENSHOT"):
        Path(target).write_bytes(png)


def open_community(browser: Browser, base: str, node: dict[str, Any]) -> Any:
    """Wait until the community panel shows `node`; check its title and graph against the API."""
    browser.wait_for("document.querySelector('#community').dataset.id === "
                     + json.dumps(node["id"]))
    page = api(base, f"/ui/api/community/{node['id']}")
    assert browser.evaluate("document.querySelector('#community h2').textContent") == node["title"]
    drawn = browser.evaluate("[...document.querySelectorAll('#graph circle')]"
                             ".map(c => c.dataset.id)")
    assert sorted(drawn) == sorted(n["id"] for n in page["nodes"]) and drawn
    assert browser.evaluate("document.querySelectorAll('#graph line').length") == len(page["edges"])
    return page


ARC_IDS = "[...document.querySelectorAll('#sunburst path[data-id]')].map(p => p.dataset.id)"
ASKED = ("performance.getEntriesByType('resource').map(e => e.name)"
         ".filter(u => u.includes('/ui/api/communities'))")


def test_a_click_on_a_cut_off_community_loads_and_draws_its_sub_communities(
        browser: Browser, examples_base: str) -> None:
    """With ?depth=1 the first answer stops above the examples' deepest level; a click on a
    community whose sub-communities were cut off asks for its sub-tree and draws it."""
    top = api(examples_base, "/ui/api/communities?depth=1")
    browser.goto(examples_base + "/ui/?depth=1")
    browser.wait_for("document.body.dataset.state === 'ready'")
    assert sorted(browser.evaluate(ARC_IDS)) == sorted(c["id"] for c in _walk(top["roots"]))
    cut = [k for r in top["roots"] for k in r["children"]
           if k["children_count"] and not k["children"]]
    assert cut, "depth=1 should cut the examples' third level off"
    node = max(cut, key=lambda k: k["size"])
    sub = api(examples_base, f"/ui/api/communities?root={node['id']}&depth=1")["roots"][0]
    assert sub["children"] and len(sub["children"]) == node["children_count"]
    assert not any(c["id"] in browser.evaluate(ARC_IDS) for c in sub["children"])

    browser.click(f"#sunburst text.arc-label[data-id='{node['id']}']")
    open_community(browser, examples_base, node)
    kids = [k["id"] for k in sub["children"]]
    browser.wait_for(f"{json.dumps(kids)}.every(id => "
                     "document.querySelector(`#sunburst path[data-id='${id}']`))")
    assert sorted(browser.evaluate(ARC_IDS)) == \
        sorted([c["id"] for c in _walk(top["roots"])] + [c["id"] for c in _walk(sub["children"])])
    # Drawn as arcs one can see and titled from the API, listed inside the opened community.
    for kid in sub["children"]:
        arc = f"document.querySelector(\"#sunburst path[data-id='{kid['id']}']\")"
        browser.wait_for(f"{arc}.getAttribute('fill-opacity') === '1'")
        assert browser.evaluate(f"{arc}.querySelector('title').textContent.split('\\n')[0]") \
            == kid["title"]
    listed = browser.evaluate("[...document.querySelectorAll('#inside .link')]"
                              ".map(b => b.textContent)")
    assert sorted(listed) == sorted(k["title"] for k in sub["children"])
    assert any(f"root={node['id']}" in u for u in browser.evaluate(ASKED))

    # A link to a community below what the first answer holds loads the way down to it.
    deep = sub["children"][0]
    browser.goto(f"{examples_base}/ui/?depth=0#c={deep['id']}")
    browser.wait_for("document.body.dataset.state === 'ready'")
    open_community(browser, examples_base, deep)
    browser.wait_for("(document.querySelector('#sunburst path.selected') || {dataset: {}})"
                     f".dataset.id === {json.dumps(deep['id'])}")
    # One sub-tree per community on the way down (its root, then its parent), no more.
    below = [u for u in browser.evaluate(ASKED) if "root=" in u]
    assert [u.split("root=")[1].split("&")[0] for u in below] == \
        [c["id"] for c in api(examples_base, f"/ui/api/community/{deep['id']}")["parents"]]


def test_a_list_cut_at_its_limit_shows_more_on_request(browser: Browser,
                                                      examples_base: str) -> None:
    """With ?limit=3 each list comes three at a time; "Show more" draws the next three."""
    whole = api(examples_base, "/ui/api/communities")["roots"]
    first = api(examples_base, "/ui/api/communities?limit=3")
    assert first["roots_count"] == len(whole) > 6 and first["next_offset"] == 3
    browser.goto(examples_base + "/ui/?limit=3")
    browser.wait_for("document.body.dataset.state === 'ready'")
    assert sorted(browser.evaluate(ARC_IDS)) == sorted(c["id"] for c in _walk(first["roots"]))
    more = "document.getElementById('inside-more')"
    assert browser.evaluate(f"{more}.hidden") is False
    assert browser.evaluate(f"{more}.textContent") == f"Show more ({len(whole) - 3} not drawn)"
    browser.click("#inside-more")
    browser.wait_for("document.querySelectorAll('#inside .link').length === 6")
    second = api(examples_base, "/ui/api/communities?limit=3&offset=3")
    assert sorted(browser.evaluate(ARC_IDS)) == \
        sorted(c["id"] for c in _walk(first["roots"] + second["roots"]))
    assert sorted(browser.evaluate("[...document.querySelectorAll('#inside .link')]"
                                   ".map(b => b.textContent)")) == \
        sorted(r["title"] for r in whole[:6])


def test_a_communitys_list_of_sub_communities_shows_more_on_request(
        browser: Browser, examples_base: str) -> None:
    """With ?limit=2 a community's page lists two of its sub-communities; "Show more" asks its
    page for the next ones and lists them after."""
    node = next(n for n in _walk(api(examples_base, "/ui/api/communities")["roots"])
                if n["children_count"] > 2)
    path = f"/ui/api/community/{node['id']}"
    first = api(examples_base, path + "?limit=2")
    assert first["next_offset"] == 2 and first["children_count"] == node["children_count"]
    browser.goto(f"{examples_base}/ui/?limit=2#c={node['id']}")
    open_community(browser, examples_base, node)
    listed = "[...document.querySelectorAll('#children .link')].map(b => b.textContent)"
    assert browser.evaluate(listed) == [k["title"] for k in first["children"]]
    more = "document.getElementById('children-more')"
    assert browser.evaluate(f"{more}.hidden") is False
    left = node["children_count"] - 2
    assert browser.evaluate(f"{more}.textContent") == f"Show more ({left} not listed)"
    browser.click("#children-more")
    browser.wait_for(f"document.querySelectorAll('#children .link').length === "
                     f"{min(4, node['children_count'])}")
    second = api(examples_base, path + "?limit=2&offset=2")
    assert browser.evaluate(listed) == [k["title"] for k in first["children"] +
                                        second["children"]]
    assert browser.evaluate(f"{more}.hidden") is (second["next_offset"] is None)
    assert any(u.endswith("?limit=2&offset=2") for u in browser.evaluate(
        "performance.getEntriesByType('resource').map(e => e.name)"))


def test_a_restricted_caller_signs_in_with_a_token_and_sees_only_their_view(
        browser: Browser, tenant_base: str) -> None:
    browser.goto(tenant_base + "/ui/")
    browser.wait_for("document.body.dataset.state === 'login'")
    assert browser.evaluate("document.getElementById('main').hidden") is True
    browser.click("#token")
    browser.type_text(DEMO["bob"])
    browser.click("#login button[type=submit]")
    browser.wait_for("document.body.dataset.state === 'ready'")
    assert browser.evaluate("document.getElementById('who').textContent") == "viewing as bob"
    bob = api(tenant_base, "/ui/api/communities", DEMO["bob"])
    carol = api(tenant_base, "/ui/api/communities", DEMO["carol"])
    arcs = browser.evaluate("[...document.querySelectorAll('#sunburst path[data-id]')]"
                            ".map(p => p.dataset.id)")
    hidden = {c["id"] for c in _walk(carol["roots"])} - {c["id"] for c in _walk(bob["roots"])}
    assert hidden and sorted(arcs) == sorted(c["id"] for c in _walk(bob["roots"]))
    dom = browser.evaluate("document.documentElement.outerHTML")
    assert HR_FACT not in dom and "Juniper" not in dom

    # A link to carol's hr-only community reads exactly like one to a community that is not there.
    cid = sorted(hidden)[0]
    browser.goto(f"{tenant_base}/ui/#c={cid}")
    browser.wait_for("document.body.dataset.state === 'ready'")
    shown = browser.wait_for("(document.querySelector('#community .error') || {}).textContent")
    assert shown == f"No community {cid!r} in this index."
    # The token stayed in this tab's sessionStorage and went out only as a header.
    assert browser.evaluate("sessionStorage.getItem('canopy-token')") == DEMO["bob"]
    urls = browser.evaluate("performance.getEntriesByType('resource').map(e => e.name)")
    assert urls and not any(DEMO["bob"] in u for u in urls)

    browser.click("#forget")
    browser.wait_for("document.body.dataset.state === 'login'")
    assert browser.evaluate("sessionStorage.getItem('canopy-token')") is None


def _walk(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x for n in nodes for x in [n, *_walk(n["children"])]]


def _sign_in(browser: Browser, base: str, token: str) -> None:
    browser.goto(base + "/ui/")
    browser.wait_for("document.body.dataset.state === 'login'")
    browser.click("#token")
    browser.type_text(token)
    browser.click("#login button[type=submit]")
    browser.wait_for("document.body.dataset.state === 'ready'")


def _ask(browser: Browser, question: str, mode: str) -> dict[str, Any]:
    """Types `question` into the query box, picks `mode`, asks, and reads what the page shows."""
    browser.click("#question")
    browser.evaluate("document.getElementById('question').value = ''")
    browser.type_text(question)
    browser.evaluate(f"document.getElementById('mode').value = {json.dumps(mode)}")
    browser.click("#ask-form button[type=submit]")
    browser.wait_for("document.getElementById('answer').dataset.state === 'answered'", 120)
    return browser.evaluate(
        "({route: document.getElementById('route').textContent,"
        " answer: document.getElementById('answer-text').textContent,"
        " citations: [...document.querySelectorAll('#citations li[data-kind]')].map(li =>"
        "   ({kind: li.dataset.kind, id: li.dataset.id,"
        "     label: li.querySelector('button').textContent}))})")


FINANCE_FACTS = ("11.07", "64.8")  # written only in restricted/finance/


def test_the_query_box_answers_bob_and_alice_each_from_what_they_may_read(
        chromium: str, tenant_base: str, tmp_path: Path) -> None:
    """The same question typed as bob (staff) and as alice (staff, finance): alice's answer
    and citations draw on restricted/finance/, bob's never do; a cited passage opens in the
    page; the router's choice is shown."""
    question = "What was the revenue in 2024, and what is the 2025 budget?"
    seen: dict[str, dict[str, Any]] = {}
    for who in ("alice", "bob"):
        with Browser(chromium, tmp_path / who, tmp_path / f"{who}.log", WIDTH, HEIGHT) as b:
            _sign_in(b, tenant_base, DEMO[who])
            routed = _ask(b, question, "auto")
            assert routed["route"].startswith("Routed to "), routed["route"]
            assert "by rules" in routed["route"]  # no LLM configured: the offline router
            seen[who] = shown = _ask(b, question, "basic")
            assert shown["route"].startswith("basic_search")
            # a cited passage opens in the page, with its document named
            unit = next(c for c in shown["citations"] if c["kind"] == "text_unit")
            b.click(f"#citations li[data-id='{unit['id']}'] button")
            passage = b.wait_for("!document.getElementById('passage').hidden && "
                                 "document.querySelector('#passage blockquote') && "
                                 "document.getElementById('passage').textContent")
            assert passage.startswith(unit["label"])
            # entity search in the graph explorer lists only what this caller can see
            b.click("#entity-query")
            b.type_text("Tern")
            b.click("#entity-search button[type=submit]")
            b.wait_for("document.getElementById('entity-search').dataset.state === 'found'")
            names = b.evaluate("[...document.querySelectorAll('#entity-matches .match button')]"
                               ".map(x => x.textContent)")
            assert names and all("tern" in n.lower() for n in names[:1]), names
            b.click("#entity-matches .match button")
            b.wait_for("!!document.querySelector('#entity h2')")
            assert b.evaluate("document.querySelector('#entity h2').textContent") == names[0]
    alice, bob = seen["alice"], seen["bob"]
    documents = {who: {c["label"] for c in seen[who]["citations"] if c["kind"] == "text_unit"}
                 for who in seen}
    assert any(d.startswith("restricted/finance/") for d in documents["alice"]), documents
    assert not any(d.startswith("restricted/") for d in documents["bob"]), documents
    assert any(f in alice["answer"] for f in FINANCE_FACTS), alice["answer"]
    assert not any(f in bob["answer"] for f in FINANCE_FACTS), bob["answer"]
    assert not any(f in json.dumps(bob) for f in FINANCE_FACTS)
