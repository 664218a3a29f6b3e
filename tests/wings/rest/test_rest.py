"""The REST API beside MCP (canopy.server.wings.rest.endpoints), over real HTTP: `canopy serve
--http` in a subprocess over a copy of examples/multi-tenant (alice reads public + finance, bob
public only) with one planted finance-only document, so a hidden entity exists for bob.

Every tool answers over REST exactly as over MCP for the same caller; the same bearer tokens
gate it; a hidden item answers like a missing one; a bad argument gets the MCP tool's message;
the OpenAPI document is valid, matches the tools, and schemathesis finds nothing against it.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
import uvicorn
from mcp import Client
from mcp.server import MCPServer
from openapi_spec_validator import validate

from canopy.server.first_build import ServiceSlot
from canopy.server.mcp_app import TOOL_RESULTS, build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.server.wings.rest.endpoints import API_PREFIX, mount_rest
from tests.acl.test_auth import (
    DEMO,
    DOCUMENTS,
    FINANCE_FACTS,
    FINANCE_QUESTION,
    MULTI,
    canopy_serve_http,
    http_client,
    text_of,
)
from tests.conftest import offline_env, require_heavy
from tests.net import free_port, wait_for_port

pytestmark = pytest.mark.anyio

CANARY = "Zephyrine Capital Partners"  # named only in the planted finance document
CANARY_DOC = """# Bridge loan from Zephyrine Capital Partners

Zephyrine Capital Partners lent Northwind Robotics EUR 3.2 million in March 2025. Sofia Brandt
negotiated the loan with Zephyrine Capital Partners; Zephyrine Capital Partners holds a pledge
on the Antwerp service hub.
"""
MISSING = "Nobody Of That Name"

# One call per tool: (tool, arguments). A tool added to the MCP server without a line here
# fails test_every_tool_answers_over_rest_as_over_mcp.
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("search", {"query": FINANCE_QUESTION}),
    ("global_search", {"query": "What are the main themes?", "community_level": 0}),
    ("local_search", {"query": "What does the 2025 budget give Project Tern?"}),
    ("drift_search", {"query": "How did the Tern recall change supplier policy?"}),
    ("basic_search", {"query": FINANCE_QUESTION, "k": 20}),
    ("drill_down", {}),
    ("drill_down", {"entity": "Antwerp", "limit": 5}),
    ("index_status", {}),
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def multi_tenant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """examples/multi-tenant plus the canary document, indexed: (docs, index folder)."""
    root = tmp_path_factory.mktemp("rest")
    shutil.copytree(MULTI, root / "multi-tenant", ignore=shutil.ignore_patterns(".canopy"))
    docs = root / "multi-tenant" / "docs"
    (docs / "restricted" / "finance" / "bridge_loan.md").write_text(CANARY_DOC, encoding="utf-8")
    with offline_env():
        build_index(open_workspace(docs, index_dir=root / "index"))
    return docs, root / "index"


@pytest.fixture(scope="module")
def server_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the `served` server writes its log."""
    return tmp_path_factory.mktemp("rest-log") / "server.log"


@pytest.fixture(scope="module")
def served(multi_tenant: tuple[Path, Path], server_log: Path) -> Iterator[str]:
    """`canopy serve --http` with the example's bearer tokens; yields the base URL."""
    docs, index_dir = multi_tenant
    with offline_env(), canopy_serve_http(docs, index_dir, server_log) as url:
        yield url.removesuffix("/mcp")


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {DEMO[who]}"}


async def rest(base: str, tool: str, args: dict[str, Any] | None, who: str | None = None,
               **headers: str) -> httpx2.Response:
    """POST /api/v1/<tool> with `args` as its JSON body (GET when `args` is None)."""
    auth = bearer(who) if who else {}
    async with httpx2.AsyncClient(timeout=120) as http:
        if args is None:
            return await http.get(f"{base}{API_PREFIX}/{tool}", headers={**auth, **headers})
        return await http.post(f"{base}{API_PREFIX}/{tool}", json=args,
                               headers={**auth, **headers})


def timeless(result: dict[str, Any]) -> dict[str, Any]:
    """A result without its wall-clock time, the one field two identical calls differ in."""
    out = json.loads(json.dumps(result))
    out.get("usage", {}).pop("elapsed_ms", None)
    return out


# ---- REST == MCP -----------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["alice", "bob"])
async def test_every_tool_answers_over_rest_as_over_mcp(served: str, who: str) -> None:
    async with http_client(f"{served}/mcp", DEMO[who]) as client:
        tools = {t.name for t in (await client.list_tools()).tools}
        assert tools == {tool for tool, _ in CALLS}
        over_mcp = [await client.call_tool(tool, args) for tool, args in CALLS]
    over_rest = [await rest(served, tool, args, who) for tool, args in CALLS]
    for (tool, args), m, r in zip(CALLS, over_mcp, over_rest, strict=True):
        assert not m.is_error, (tool, text_of(m))
        assert r.status_code == 200, (tool, r.text)
        assert r.headers["content-type"] == "application/json"
        assert timeless(r.json()) == timeless(m.structured_content), (tool, args)
    status = await rest(served, "status", None, who)
    assert status.json() == over_rest[-1].json()
    assert status.json()["documents"] == DOCUMENTS[who] + (who == "alice")  # + the canary
    # The views are the callers' own: alice reads the finance facts, bob does not.
    basic = json.dumps(over_rest[4].json())
    assert all(fact in basic for fact in FINANCE_FACTS) == (who == "alice")
    assert ("restricted/" in json.dumps([r.json() for r in over_rest])) == (who == "alice")


async def test_identity_comes_from_the_token_not_from_headers_or_arguments(served: str) -> None:
    r = await rest(served, "basic_search", {"query": FINANCE_QUESTION, "principal": "alice"},
                   "bob", **{"X-Canopy-Principal": "alice"})
    assert r.status_code == 200
    assert not any(fact in r.text for fact in FINANCE_FACTS)


# ---- auth ------------------------------------------------------------------------------------


@pytest.mark.parametrize("headers", [
    pytest.param({}, id="no-token"),
    pytest.param({"Authorization": "Bearer cnpy_demo_alice_wrong"}, id="wrong-token"),
    pytest.param({"Authorization": DEMO["alice"]}, id="token-without-bearer"),
    pytest.param({"X-Canopy-Principal": "alice"}, id="principal-header"),
])
@pytest.mark.parametrize("call", [("local_search", {"query": FINANCE_QUESTION}),
                                  ("drill_down", {"entity": CANARY}),
                                  ("nonexistent_tool", {}),
                                  ("status", None), ("openapi.json", None),
                                  ("resource?uri=canopy://reports", None)],
                         ids=lambda c: c[0])
async def test_without_a_valid_bearer_token_every_route_is_401_and_says_nothing_more(
    served: str, headers: dict[str, str], call: tuple[str, dict[str, Any] | None]
) -> None:
    r = await rest(served, call[0], call[1], None, **headers)
    assert r.status_code == 401
    assert r.json() == {"error": "invalid_token", "error_description": "Authentication required"}
    async with httpx2.AsyncClient(timeout=30) as http:  # exactly as /mcp refuses it
        mcp = await http.post(f"{served}/mcp", json={}, headers=headers)
    assert r.headers["www-authenticate"] == mcp.headers["www-authenticate"]


# ---- errors: the MCP tool's message ------------------------------------------------------------


async def mcp_error(served: str, who: str, tool: str, args: dict[str, Any]) -> str:
    async with http_client(f"{served}/mcp", DEMO[who]) as client:
        result = await client.call_tool(tool, args)
    assert result.is_error
    return text_of(result)


async def test_a_hidden_entity_answers_like_a_missing_one_and_as_over_mcp(served: str) -> None:
    seen = await rest(served, "drill_down", {"entity": CANARY}, "alice")
    assert seen.status_code == 200 and seen.json()["entity"]["name"] == CANARY  # not vacuous
    hidden = await rest(served, "drill_down", {"entity": CANARY}, "bob")
    missing = await rest(served, "drill_down", {"entity": MISSING}, "bob")
    assert hidden.status_code == missing.status_code == 404
    assert hidden.json()["error"] == missing.json()["error"] == "not_found"
    assert (hidden.json()["message"].replace(CANARY, "<x>")
            == missing.json()["message"].replace(MISSING, "<x>"))
    assert hidden.json()["message"] == await mcp_error(served, "bob", "drill_down",
                                                       {"entity": CANARY})
    asked = (await rest(served, "search", {"query": CANARY}, "bob")).text  # echoes the query
    assert "bridge_loan" not in asked and "3.2 million" not in asked


@pytest.mark.parametrize(("args", "status"), [
    pytest.param({"query": ""}, 422, id="schema"),
    pytest.param({"query": "x", "community_level": 11}, 422, id="range"),
    pytest.param({"query": "x", "community_level": 9}, 400, id="no-such-level"),
])
async def test_a_bad_argument_gets_the_mcp_tools_message(
    served: str, args: dict[str, Any], status: int
) -> None:
    r = await rest(served, "global_search", args, "bob")
    assert r.status_code == status
    assert r.json() == {"error": "invalid_argument",
                        "message": await mcp_error(served, "bob", "global_search", args)}


async def test_a_body_that_is_not_json_arguments_is_400_and_a_foreign_host_421(
    served: str,
) -> None:
    async with httpx2.AsyncClient(timeout=30, headers=bearer("bob")) as http:
        url = f"{served}{API_PREFIX}/local_search"
        not_json = await http.post(url, content=b"query=x",
                                   headers={"Content-Type": "application/json"})
        form = await http.post(url, content=b"query=x",
                               headers={"Content-Type": "application/x-www-form-urlencoded"})
        rebound = await http.post(url, json={"query": "x"}, headers={"Host": "evil.example"})
        no_body = await http.post(f"{served}{API_PREFIX}/index_status")
        wrong_method = await http.post(f"{served}{API_PREFIX}/status")
    assert not_json.status_code == 400 and not_json.json()["error"] == "invalid_request"
    assert form.status_code == 400 and form.json()["error"] == "invalid_request"
    assert rebound.status_code == 421 and rebound.json()["error"] == "invalid_request"
    assert no_body.status_code == 200 and no_body.json()["documents"] == DOCUMENTS["bob"]
    assert wrong_method.status_code == 405


@pytest.mark.parametrize("depth", [100_000, 3_000, 900])
async def test_a_deeply_nested_body_is_a_400_or_422_and_no_traceback(
        served: str, server_log: Path, depth: int) -> None:
    """Issue 30, finding 6: a body nested 100,000 deep got a 500 and a RecursionError
    traceback in the log (MCP answered cleanly). Too deep to parse: 400; parsed but not the
    arguments' shape: 422, as any wrong argument; deep in an argument the tool does not take:
    ignored, as over MCP."""
    deep = b"[" * depth + b"]" * depth
    parses = depth < 1000  # within the JSON parser's stack
    async with httpx2.AsyncClient(timeout=60, headers=bearer("bob")) as http:
        url = f"{served}{API_PREFIX}/local_search"
        got = [await http.post(url, content=body, headers={"Content-Type": "application/json"})
               for body in (deep, b'{"query": ' + deep + b"}",
                            b'{"query": "x", "filters": ' + deep + b"}")]
        after = await http.post(f"{served}{API_PREFIX}/index_status")
    expected = [400, 422, 200] if parses else [400, 400, 400]
    assert [r.status_code for r in got] == expected, [r.text[:200] for r in got]
    for r in got[:2] if parses else got:
        assert r.json()["error"] in ("invalid_request", "invalid_argument")
        assert len(r.text) < 2000  # the rejected value is not echoed back
    assert after.status_code == 200
    log_text = server_log.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in log_text and "RecursionError" not in log_text


# ---- the OpenAPI document ----------------------------------------------------------------------


async def test_the_openapi_document_is_valid_and_is_the_tools_own_schemas(served: str) -> None:
    doc = (await rest(served, "openapi.json", None, "bob")).json()
    validate(doc)  # OpenAPI 3.1, its JSON Schemas included
    async with http_client(f"{served}/mcp", DEMO["bob"]) as client:
        tools = (await client.list_tools()).tools
    schemas = doc["components"]["schemas"]
    for tool in tools:
        op = doc["paths"][f"{API_PREFIX}/{tool.name}"]["post"]
        arguments = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert schemas[arguments.rsplit("/", 1)[1]] == tool.input_schema  # no $defs in inputs
        result = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        # the whole result model, not the trimmed schema of the MCP listing
        model = TOOL_RESULTS[tool.name].model_json_schema()
        out = json.loads(json.dumps(model).replace("#/$defs/", "#/components/schemas/"))
        for name, definition in out.pop("$defs", {}).items():
            assert schemas[name] == definition
        assert schemas[result.rsplit("/", 1)[1]] == out
    assert doc["security"] == [{"bearer": []}]


@pytest.mark.heavy
def test_schemathesis_finds_no_failure_against_the_openapi_document(
    served: str, tmp_path: Path
) -> None:
    """Property-based calls to every operation from the document: no 5xx, every response
    (errors too) as documented. Arguments are validated as over MCP, by pydantic in lax mode
    (`false` passes as 0), so the check that schema-violating data is refused is left out; a
    schema-valid call may be refused by the tool (400: a level the index lacks; 404)."""
    require_heavy("schemathesis")
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.positive_data_acceptance]\n'
                      'expected-statuses = ["2XX", "400", "404"]\n', encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "schemathesis.cli", "--config-file", str(config), "run",
         f"{served}{API_PREFIX}/openapi.json", "-H", f"Authorization: Bearer {DEMO['bob']}",
         "--checks", "all", "--exclude-checks", "negative_data_rejection",
         "--max-examples", "6", "--seed", "7", "--generation-deterministic", "--workers", "1",
         "--no-color"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)  # its cache dir goes there
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Tested: 9" in done.stdout  # every operation of the document


# ---- other ways of serving -------------------------------------------------------------------


async def test_rest_works_behind_several_worker_processes(
    multi_tenant: tuple[Path, Path], tmp_path: Path
) -> None:
    docs, index_dir = multi_tenant
    with canopy_serve_http(docs, index_dir, tmp_path / "server.log", "--workers", "2") as url:
        base = url.removesuffix("/mcp")
        async def documents(who: str) -> int:
            for _ in range(100):  # the port opens before the workers have loaded the index
                r = await rest(base, "status", None, who)
                if r.status_code != 503:
                    break
                await asyncio.sleep(0.2)
            assert r.status_code == 200, r.text
            return int(r.json()["documents"])

        seen = await asyncio.gather(*(documents(w) for w in ["alice", "bob"] * 4))
        assert seen == [DOCUMENTS["alice"] + 1, DOCUMENTS["bob"]] * 4
        assert (await rest(base, "status", None)).status_code == 401


@contextmanager
def in_process(server: MCPServer) -> Iterator[str]:
    """`server` with the REST routes, served by uvicorn on a thread; yields the base URL."""
    port = free_port()
    mount_rest(server, "127.0.0.1")
    uv = uvicorn.Server(uvicorn.Config(server.streamable_http_app(host="127.0.0.1"),
                                       host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        uv.should_exit = True
        thread.join(10)


async def test_without_token_verification_rest_answers_as_the_start_up_principal(
    multi_tenant: tuple[Path, Path],
) -> None:
    """No [auth] (loopback): every caller is --principal, over REST as over MCP."""
    docs, index_dir = multi_tenant
    service = CanopyService(open_workspace(docs, index_dir=index_dir))
    try:
        with in_process(build_server(service, principal_name="bob")) as base:
            r = await rest(base, "status", None)
            assert r.status_code == 200 and r.json()["documents"] == DOCUMENTS["bob"]
            doc = (await rest(base, "openapi.json", None)).json()
    finally:
        service.close()
    validate(doc)
    assert "security" not in doc and "401" not in json.dumps(doc["paths"])


async def test_a_server_still_building_its_first_index_answers_503_with_the_mcp_message() -> None:
    slot = ServiceSlot(docs="team-docs")  # no index yet: the build has not committed
    server = build_server(slot)
    with in_process(server) as base:
        r = await rest(base, "local_search", {"query": "Who makes the cells?"})
        async with Client(f"{base}/mcp") as client:
            m = await client.call_tool("local_search", {"query": "Who makes the cells?"})
    assert r.status_code == 503 and r.json()["error"] == "unavailable"
    assert "building the first index of team-docs" in r.json()["message"]
    # the same message but for the elapsed time, which may pass a second between the calls
    def steady(text: str) -> str:
        return re.sub(r"\d+ s so far", "N s so far", text)

    assert m.is_error and steady(r.json()["message"]) == steady(text_of(m))


# ---- resources ---------------------------------------------------------------------------------


async def read(base: str, uri: str, who: str) -> httpx2.Response:
    async with httpx2.AsyncClient(timeout=60) as http:
        return await http.get(f"{base}{API_PREFIX}/resource", params={"uri": uri},
                              headers=bearer(who))


async def test_a_resource_reads_over_rest_as_over_mcp_with_its_mime_type(served: str) -> None:
    """The report listing, a report and a cited text unit, for alice and bob: the text an MCP
    client reads, with the resource's MIME type; what bob may not read is a 404 like a unit that
    does not exist (the same text as over MCP)."""
    finance_units: list[str] = []
    for who in ("alice", "bob"):
        cited = (await rest(served, "basic_search", {"query": FINANCE_QUESTION, "k": 20},
                            who)).json()["citations"]
        unit = next(c["id"] for c in cited if c["kind"] == "text_unit")
        if who == "alice":
            finance_units = [c["id"] for c in cited if c["kind"] == "text_unit"
                             and c["document"].startswith("restricted/")]
        listing = await read(served, "canopy://reports", who)
        assert listing.status_code == 200, listing.text
        report = listing.json()["reports"][0]["id"]
        async with http_client(f"{served}/mcp", DEMO[who]) as client:
            for uri, mime in ((f"canopy://units/{unit}", "text/plain"),
                              (f"canopy://reports/{report}", "text/markdown"),
                              ("canopy://reports", "application/json")):
                over_mcp = (await client.read_resource(uri)).contents[0]
                r = await read(served, uri, who)
                assert r.status_code == 200, (uri, r.text)
                assert r.headers["content-type"].startswith(mime)
                assert r.text == over_mcp.text  # type: ignore[union-attr]
    assert finance_units  # alice was cited finance text: bob must not read it
    hidden = await read(served, f"canopy://units/{finance_units[0]}", "bob")
    missing = await read(served, "canopy://units/tu-0000000000000000", "bob")
    assert hidden.status_code == missing.status_code == 404
    assert (hidden.json()["message"].replace(finance_units[0], "<x>")
            == missing.json()["message"].replace("tu-0000000000000000", "<x>"))
    assert not any(fact in hidden.text for fact in FINANCE_FACTS)


async def test_a_resource_request_without_a_uri_or_with_a_bad_page_is_400(served: str) -> None:
    async with httpx2.AsyncClient(timeout=30, headers=bearer("bob")) as http:
        no_uri = await http.get(f"{served}{API_PREFIX}/resource")
        posted = await http.post(f"{served}{API_PREFIX}/resource", json={"uri": "x"})
    bad_page = await read(served, "canopy://reports/page/x", "bob")
    far_page = await read(served, "canopy://reports/page/99", "bob")
    unknown = await read(served, "canopy://nothing/here", "bob")
    assert no_uri.status_code == 400 and no_uri.json()["error"] == "invalid_request"
    assert posted.status_code == 405
    assert bad_page.status_code == 400 and "positive integer" in bad_page.json()["message"]
    assert far_page.status_code == 400 and "page must be from 1 to" in far_page.json()["message"]
    assert unknown.status_code == 404
