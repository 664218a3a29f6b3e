"""The MCP server end to end, through the SDK's own client: in memory, over stdio (a `canopy
serve` subprocess) and over Streamable HTTP; plus the MCP Inspector CLI where Node is available.

The example corpus is indexed once per module with the builtin (offline) provider.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from itertools import pairwise
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import uvicorn
from click.testing import CliRunner
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer
from mcp.server.auth.provider import AccessToken

from canopy.server import engines
from canopy.server.cli import main
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.store.export import load_graph
from tests.conftest import REPO, offline_env, wait_until
from tests.net import free_port, wait_for_port

EXAMPLES = REPO / "examples" / "docs"
TOOLS = {"global_search", "local_search", "drift_search", "basic_search", "search", "drill_down",
         "index_status"}
MISSING_REPORT = "c1-0000000000"
MISSING_UNIT = "tu-0000000000000000"

# One call per tool, with a question each answers well on examples/docs and a fact to look for.
# The fact each call's text must hold; alternatives for a question with two parts, of which the
# builtin provider's extractive drift answer may quote either (the count or the cause).
CALLS: list[tuple[str, dict[str, Any], str | tuple[str, ...]]] = [
    ("global_search", {"query": "What are the main risks across the supply chain?"}, "Helio Cells"),
    ("local_search", {"query": "Who leads Project Kestrel?"}, "Maria Okafor"),
    ("drift_search", {"query": "What caused the Tern recall and how many packs did it affect?"},
     ("340", "HC-2311")),
    ("basic_search", {"query": "How many Tern T2 packs were recalled?", "k": 5}, "340"),
    ("search", {"query": "How many battery packs were recalled?"}, "Routed to basic_search"),
    ("drill_down", {}, "level 0"),
    ("index_status", {}, "documents {documents}"),
]

pytestmark = pytest.mark.anyio

ACL_TOML = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "finance/**"
labels = ["finance"]

[acl.principals]
cfo = ["staff", "finance"]
intern = ["staff"]
"""


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"



@pytest.fixture(scope="module")
def example_index(examples_index: Path) -> Path:
    return examples_index  # shared by the run (conftest): read only


@pytest.fixture(scope="module")
def service(example_index: Path) -> Iterator[CanopyService]:
    with offline_env():
        svc = CanopyService(open_workspace(EXAMPLES, index_dir=example_index))
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def mcp_server(service: CanopyService) -> MCPServer:
    return build_server(service)


@pytest.fixture(scope="module")
def acl_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CanopyService]:
    """Part of the corpus under a policy: finance/ is readable by `cfo` only; `intern` reads the
    rest."""
    docs = tmp_path_factory.mktemp("acl-docs")
    for name in ("finance", "projects", "events"):
        shutil.copytree(EXAMPLES / name, docs / name)
    (docs / "canopy.toml").write_text(ACL_TOML, encoding="utf-8")
    with offline_env():
        ws = open_workspace(docs, index_dir=docs.parent / f"{docs.name}-index")
        build_index(ws)
        svc = CanopyService(ws)
    yield svc
    svc.close()


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def hidden_from_intern(svc: CanopyService) -> tuple[str, str]:
    """A report id and a text unit id that exist but derive from finance/ documents only (a
    report that also draws on other documents is served to intern as a view of them)."""
    g = load_graph(svc.store)
    finance_units = {u.id for u in g.units.values()
                     if g.documents[u.document_id].path.startswith("finance/")}
    report = next(r.community_id for r in g.reports.values() if all(
        set(g.entities[e].text_unit_ids) <= finance_units
        for e in g.communities[r.community_id].entity_ids))
    return report, min(finance_units)


async def check_listing(client: Client) -> None:
    tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.input_schema["type"] == "object"
        assert tool.output_schema is not None and tool.output_schema["type"] == "object"
        assert tool.annotations is not None
        assert (
            tool.annotations.read_only_hint is True and tool.annotations.destructive_hint is False
        )
        assert (
            tool.annotations.idempotent_hint is True and tool.annotations.open_world_hint is False
        )
        assert tool.description and tool.description.startswith("Returns")
    arguments = {name: set(tool.input_schema["properties"]) for name, tool in tools.items()}
    window = {"since", "until"}  # every search tool's (issue 31)
    assert arguments["global_search"] == {"query", "community_level", "response_type", *window}
    assert arguments["drill_down"] == {"community_id", "entity", "finding", "limit", "offset"}
    assert arguments["basic_search"] == {"query", "k", "response_type", *window}
    assert arguments["search"] == {"query", "response_type", *window}
    assert arguments["local_search"] == arguments["drift_search"] == {
        "query", "response_type", *window}
    assert arguments["index_status"] == set()
    templates = {
        t.uri_template for t in (await client.list_resource_templates()).resource_templates
    }
    assert templates == {"canopy://reports/{community_id}", "canopy://reports/page/{page}",
                         "canopy://units/{unit_id}"}
    assert [r.uri for r in (await client.list_resources()).resources] == ["canopy://reports"]


async def check_every_tool(client: Client, documents: int = 17) -> None:
    for name, args, fact in CALLS:
        alternatives = (fact,) if isinstance(fact, str) else fact
        facts = [f.format(documents=documents) for f in alternatives]
        result = await client.call_tool(name, args)
        assert not result.is_error, (name, text_of(result))
        assert any(f in text_of(result) for f in facts), (name, text_of(result)[:2000])
        assert result.structured_content is not None
        if name.endswith("_search"):
            assert result.structured_content["method"] == name.removesuffix("_search")
            assert result.structured_content["citations"], name


# ---- in memory ------------------------------------------------------------------------------


async def test_tools_are_listed_with_schemas_and_read_only_annotations(
    mcp_server: MCPServer,
) -> None:
    async with Client(mcp_server) as client:
        await check_listing(client)


async def test_the_tool_listing_is_under_4k_tokens_with_dedented_descriptions(
    mcp_server: MCPServer,
) -> None:
    """Hosts that forward tool schemas to the model pay for the listing on every turn: the
    `tools/list` result as sent (compact JSON) stays under 4,000 o200k tokens (10,213 before
    the output schemas were trimmed), with each tool's description intact and dedented, and
    every tool's whole result model still behind it (the REST API publishes those)."""
    from mcp.types import ListToolsResult

    from canopy.server.mcp_app import TOOL_RESULTS
    from canopy.tokenizer import get_tokenizer

    async with Client(mcp_server) as client:
        listing = await client.list_tools()
    wire = ListToolsResult(tools=listing.tools).model_dump_json(by_alias=True, exclude_none=True)
    tokens = get_tokenizer("o200k_base").count(wire)
    print(f"tools/list: {len(wire):,} bytes, {tokens:,} o200k tokens")
    assert tokens < 4000
    for tool in listing.tools:
        assert tool.description and not re.search(r"^[ \t]", tool.description, re.M), tool.name
        assert "title" not in tool.input_schema, tool.name
        assert not any("title" in p for p in tool.input_schema["properties"].values())
        assert set(tool.output_schema["properties"]) == set(
            TOOL_RESULTS[tool.name].model_fields), tool.name
    # The search result's fields are described once, on `search`, nested fields named there.
    search = next(t for t in listing.tools if t.name == "search").output_schema
    assert "description" in search["properties"]["route"]
    assert set(search["properties"]["citations"]["items"]["properties"]) == {
        "kind", "id", "title", "document", "period"}


async def test_every_tool_answers_an_example_question_with_text_and_structured_content(
    mcp_server: MCPServer,
) -> None:
    async with Client(mcp_server) as client:
        await check_every_tool(client)


async def test_search_text_is_the_answer_with_its_sources_not_a_json_dump(
    mcp_server: MCPServer,
) -> None:
    async with Client(mcp_server) as client:
        result = await client.call_tool("local_search", {"query": "Who leads Project Kestrel?"})
    text, data = text_of(result), result.structured_content
    assert text.startswith(data["answer"].strip()[:200])
    assert "Sources:" in text and not text.lstrip().startswith("{")
    assert all(c["id"] in text for c in data["citations"][:25])


async def test_citations_resolve_through_drill_down_and_the_resources(
    mcp_server: MCPServer,
) -> None:
    async with Client(mcp_server) as client:
        cites = []
        for name, args, _ in CALLS[:4]:
            cites += (await client.call_tool(name, args)).structured_content["citations"]
        reports = {c["id"] for c in cites if c["kind"] == "report"}
        units = {c["id"]: c["document"] for c in cites if c["kind"] == "text_unit"}
        assert reports and units
        for rid in sorted(reports)[:8]:
            drilled = await client.call_tool("drill_down", {"community_id": rid})
            assert not drilled.is_error, text_of(drilled)
            assert drilled.structured_content["community"]["id"] == rid
            markdown = (await client.read_resource(f"canopy://reports/{rid}")).contents[0].text
            assert drilled.structured_content["community"]["title"] in markdown
        for uid, document in sorted(units.items())[:8]:
            text = (await client.read_resource(f"canopy://units/{uid}")).contents[0].text
            assert uid in text and document in text


async def test_drill_down_goes_from_the_roots_to_a_finding_and_its_source_text(
    mcp_server: MCPServer,
) -> None:
    async with Client(mcp_server) as client:
        roots = (await client.call_tool("drill_down", {})).structured_content
        assert roots["community"] is None and roots["children"]
        top = roots["children"][0]["id"]
        opened = (await client.call_tool("drill_down", {"community_id": top})).structured_content
        assert opened["findings"]
        sourced = await client.call_tool(
            "drill_down", {"community_id": top, "finding": 0, "limit": 3}
        )
        assert not sourced.is_error, text_of(sourced)
        spans = sourced.structured_content["sources"]
        assert spans and len(spans) <= 3
        unit = (await client.read_resource(f"canopy://units/{spans[0]['text_unit_id']}")).contents[0].text
        assert spans[0]["document"] in unit


async def test_the_reports_resource_lists_every_servable_report(
    mcp_server: MCPServer, service: CanopyService
) -> None:
    async with Client(mcp_server) as client:
        listing = json.loads((await client.read_resource("canopy://reports")).contents[0].text)
    assert {r["id"] for r in listing["reports"]} == set(load_graph(service.store).reports)


async def test_the_reports_resource_pages_and_each_page_names_the_next(
    mcp_server: MCPServer, service: CanopyService, monkeypatch: pytest.MonkeyPatch
) -> None:
    import canopy.server.mcp_app as mcp_app

    monkeypatch.setattr(mcp_app, "REPORTS_PAGE", 10)
    every = set(load_graph(service.store).reports)
    seen: list[str] = []
    uri: str | None = "canopy://reports"
    async with Client(mcp_server) as client:
        while uri is not None:
            page = json.loads((await client.read_resource(uri)).contents[0].text)
            assert len(page["reports"]) <= 10 and page["total"] == len(every)
            seen += [r["id"] for r in page["reports"]]
            uri = page["next"]
        assert page["page"] == page["pages"] == -(-len(every) // 10) > 1
        with pytest.raises(MCPError, match="page must be from 1 to"):
            await client.read_resource(f"canopy://reports/page/{page['pages'] + 1}")
        one = await client.read_resource(f"canopy://reports/{seen[0]}")  # a report still opens
        assert seen[0] in one.contents[0].text
    assert len(seen) == len(set(seen)) and set(seen) == every


@pytest.mark.parametrize(("tool", "args", "expected"), [
    ("global_search", {"query": ""}, "query"),
    ("local_search", {"query": "   "}, "query must not be empty"),
    ("global_search", {"query": "risks", "community_level": 99}, "community_level"),
    ("basic_search", {"query": "risks", "k": 0}, "k"),
    ("drill_down", {"community_id": MISSING_REPORT}, MISSING_REPORT),
    ("drill_down", {"community_id": "c0-x", "limit": 500}, "limit"),
])
async def test_bad_input_gives_an_error_result_the_agent_can_read(
    mcp_server: MCPServer, tool: str, args: dict[str, Any], expected: str
) -> None:
    async with Client(mcp_server) as client:
        result = await client.call_tool(tool, args)
    assert result.is_error
    assert expected in text_of(result)
    assert "Traceback" not in text_of(result)


async def test_an_unknown_resource_id_is_a_not_found_error(mcp_server: MCPServer) -> None:
    async with Client(mcp_server) as client:
        for uri in (f"canopy://reports/{MISSING_REPORT}", f"canopy://units/{MISSING_UNIT}"):
            with pytest.raises(MCPError):
                await client.read_resource(uri)


async def test_an_unexpected_exception_reaches_the_agent_as_a_generic_message(
    mcp_server: MCPServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret path /srv/private/finance.md")

    monkeypatch.setattr(engines, "local_search", broken)
    async with Client(mcp_server) as client:
        result = await client.call_tool("local_search", {"query": "Who leads Project Kestrel?"})
    assert result.is_error
    assert "Internal error in local_search; see server log" in text_of(result)
    assert "secret" not in text_of(result)
    logged = [r for r in caplog.records if r.name == "canopy.server.mcp_gateway" and r.exc_info]
    assert logged and "secret path" in str(logged[0].exc_info[1])


async def test_global_search_sends_progress_notifications(mcp_server: MCPServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    async with Client(mcp_server) as client:
        result = await client.call_tool(
            "global_search",
            {"query": "What themes run through the projects?"},
            progress_callback=progress,
        )
    assert not result.is_error
    assert seen, "no progress notifications arrived"
    values = [d for d, _, _ in seen]
    assert all(a < b for a, b in pairwise(values)), values  # the spec: always increasing
    assert all(total is None or done <= total for done, total, _ in seen)
    assert any("map" in (message or "") for _, _, message in seen)


async def test_an_openai_compatible_llm_writes_the_answers(
    example_index: Path, fake_openai: Any, tmp_path: Path
) -> None:
    """A copy of the offline-built index (the LLM response cache lives in it), queried through the
    real openai client against the fake endpoint; an endpoint failure reads as such."""
    index_dir = tmp_path / "index"
    shutil.copytree(example_index, index_dir)
    llm = {"base_url": fake_openai.base_url, "model": "fake", "api_key": "test", "max_retries": 0}
    svc = CanopyService(open_workspace(EXAMPLES, index_dir=index_dir, llm=llm))
    try:
        async with Client(build_server(svc)) as client:
            for name, args, _ in CALLS[:4]:
                result = await client.call_tool(name, args)
                assert not result.is_error, (name, text_of(result))
                usage = result.structured_content["usage"]
                assert usage["llm_calls"] >= 1, (name, usage)
                assert usage["provider"].startswith("openai:"), (name, usage)
                assert "extractive mode" not in text_of(result)
            fake_openai.fail_next(5, status=503)  # a new question: answers are cached by request
            down = await client.call_tool(
                "local_search", {"query": "Where is Helio Cells Ltd based?"}
            )
            assert down.is_error and "unavailable" in text_of(down), text_of(down)
    finally:
        svc.close()
    assert fake_openai.count("map") >= 1 and fake_openai.count("answer") >= 1


# ---- callers and visibility -----------------------------------------------------------------


async def test_hidden_and_nonexistent_ids_give_identical_errors(acl_service: CanopyService) -> None:
    hidden_report, hidden_unit = hidden_from_intern(acl_service)
    async with Client(build_server(acl_service, principal_name="intern")) as client:
        a = await client.call_tool("drill_down", {"community_id": hidden_report})
        b = await client.call_tool("drill_down", {"community_id": MISSING_REPORT})
        assert a.is_error and b.is_error
        assert text_of(a).replace(hidden_report, "<id>") == text_of(b).replace(
            MISSING_REPORT, "<id>"
        )
        for template, hidden, missing in (("canopy://reports/{}", hidden_report, MISSING_REPORT),
                                          ("canopy://units/{}", hidden_unit, MISSING_UNIT)):
            errors = []
            for ident in (hidden, missing):
                with pytest.raises(MCPError) as info:
                    await client.read_resource(template.format(ident))
                errors.append(
                    (info.value.error.code, info.value.error.message.replace(ident, "<id>"))
                )
            assert errors[0] == errors[1]
    async with Client(build_server(acl_service, principal_name="cfo")) as client:
        assert not (await client.call_tool("drill_down", {"community_id": hidden_report})).is_error


async def test_index_status_counts_only_what_the_caller_may_see(acl_service: CanopyService) -> None:
    async def status(who: str, **args: Any) -> dict[str, Any]:
        async with Client(build_server(acl_service, principal_name=who)) as client:
            return (await client.call_tool("index_status", args)).structured_content

    cfo, intern = await status("cfo"), await status("intern")
    assert cfo["documents"] == 8 and intern["documents"] == 6
    assert intern["text_units"] < cfo["text_units"] and intern["entities"] < cfo["entities"]
    assert intern["last_run"] == {} and intern["llm_usage"] == intern["llm_usage_total"] == {}
    assert intern["ignored_types"] == {}
    assert await status("intern", principal="cfo") == intern  # identity never comes from arguments
    assert (await status("nobody"))["documents"] == 0


class TokenTable:
    """A stand-in for the bearer-token verifier a later issue adds: token -> principal."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self.tokens = tokens

    async def verify_token(self, token: str) -> AccessToken | None:
        name = self.tokens.get(token)
        return AccessToken(token=token, client_id=name, scopes=[]) if name else None


@contextmanager
def uvicorn_thread(app: Any, port: int) -> Iterator[None]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for_port(port)
        yield
    finally:
        server.should_exit = True
        thread.join(10)


@asynccontextmanager
async def http_client(url: str, headers: dict[str, str]) -> AsyncIterator[Client]:
    async with (httpx2.AsyncClient(headers=headers, timeout=30) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        yield client


async def test_http_callers_are_identified_by_their_bearer_token(
    acl_service: CanopyService,
) -> None:
    port = free_port()
    server = build_server(acl_service, principal_name="cfo", port=port,
                          auth=TokenTable({"tok-cfo": "cfo", "tok-intern": "intern"}))
    url = f"http://127.0.0.1:{port}/mcp"
    with uvicorn_thread(server.streamable_http_app(host="127.0.0.1"), port):
        documents = {}
        for token in ("tok-cfo", "tok-intern"):
            # The header naming another principal is ignored: only the verified token counts.
            headers = {"Authorization": f"Bearer {token}", "X-Canopy-Principal": "cfo"}
            async with http_client(url, headers) as c:
                status = await c.call_tool("index_status", {})
                documents[token] = status.structured_content["documents"]
        assert documents == {"tok-cfo": 8, "tok-intern": 6}
        async with httpx2.AsyncClient() as http:
            refused = await http.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert refused.status_code == 401


# ---- real transports --------------------------------------------------------------------------


def serve_args(docs: Path, index_dir: Path, *extra: str) -> list[str]:
    return ["-m", "canopy.server.cli", "serve", str(docs), "--index-dir", str(index_dir), *extra]


async def test_the_stdio_server_lists_and_answers_every_tool(example_index: Path) -> None:
    params = StdioServerParameters(command=sys.executable, args=serve_args(EXAMPLES, example_index),
                                   env={"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    async with Client(params) as client:
        await check_listing(client)
        await check_every_tool(client)
        bad = await client.call_tool("drill_down", {"community_id": MISSING_REPORT})
        assert bad.is_error and MISSING_REPORT in text_of(bad)


@pytest.fixture
def http_serve_fresh(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[tuple[int, Path]]:
    """`canopy serve --http` on part of the examples (6 documents), not indexed yet; yields
    (port, log). With the parameter "interrupted", a first build died before committing: the
    index folder holds a database at generation 0."""
    docs = tmp_path / "docs"
    for name in ("projects", "events"):
        shutil.copytree(EXAMPLES / name, docs / name)
    if getattr(request, "param", None) == "interrupted":
        from canopy.store import Store

        Store(tmp_path / "index").close()
    port, log_path = free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *serve_args(docs, tmp_path / "index", "--http", "--port", str(port))],
            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc, timeout=60)
            yield port, log_path
        finally:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("http_serve_fresh", ["missing", "interrupted"], indirect=True)
async def test_the_http_server_builds_a_missing_index_then_answers_every_tool(
    http_serve_fresh: tuple[int, Path],
) -> None:
    """It listens at once and builds behind; once the build commits, every tool answers. A
    database no build ever committed is no index either (it used to be waited for forever)."""
    port, log_path = http_serve_fresh
    async with Client(f"http://127.0.0.1:{port}/mcp") as client:
        await check_listing(client)
        await _after_first_build(client, "basic_search", {"query": "Kestrel", "k": 3})
        await check_every_tool(client, documents=6)
    log = log_path.read_text()
    assert "serving now, building it meanwhile" in log
    # a first build that succeeded is news, not a warning
    assert re.search(r"^INFO canopy\.server\.first_build: first index of .* built", log, re.M)
    assert not re.search(r"^WARNING .*first index", log, re.M)


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_an_http_server_listens_before_its_first_build_and_reports_it(
        tmp_path: Path, workers: str) -> None:
    """`serve --http` on a folder with no index: clients connect before the build ends and
    are told what it is doing; with several workers the build runs in the supervisor and
    each worker opens the index once it commits."""
    from tests.fakes.openai_server import FakeOpenAI

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    port, log_path = free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    with FakeOpenAI(latency=0.4) as fake, log_path.open("wb") as log:
        env.update(PYTHONPATH=str(REPO), CANOPY_LLM_BASE_URL=fake.base_url,
                   CANOPY_LLM_API_KEY="test", CANOPY_LLM__CONCURRENCY="2")
        proc = subprocess.Popen(
            [sys.executable, *serve_args(docs, tmp_path / "index", "--http", "--port", str(port),
                                         "--workers", workers)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc, timeout=90)
            async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                first = await client.call_tool("local_search", {"query": "Who makes the cells?"})
                assert fake.count("report") == 0  # the build is still extracting
                assert first.is_error and "building the first index" in text_of(first)
                fake.latency = 0.0  # the call met the build under way: let it finish quickly
                done = await _after_first_build(client, "local_search",
                                                {"query": "Who makes the cells?"})
                assert not done.is_error, text_of(done)
        finally:
            proc.terminate()
            proc.wait(20)


async def test_several_worker_processes_answer_every_tool_from_concurrent_clients(
    example_index: Path, tmp_path: Path,
) -> None:
    """`serve --http --workers 2`: uvicorn's worker processes each open the index (stateless
    sessions: any worker answers any request); concurrent clients all get complete answers."""
    port, log_path = free_port(), tmp_path / "server.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, *serve_args(EXAMPLES, example_index, "--http", "--port", str(port),
                                         "--workers", "2")],
            cwd=REPO, env={**env, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(port, proc, timeout=90)

            async def one() -> None:
                async with Client(f"http://127.0.0.1:{port}/mcp") as client:
                    await check_every_tool(client)

            await asyncio.gather(*(one() for _ in range(4)))
            if sys.platform == "linux":
                _each_worker_listens_and_a_burst_of_connections_reaches_both(proc.pid, port)
            # No session, so no stream of server messages to open: answered at once (a probe
            # that met a 200 stream held open with nothing to send used to hang).
            async with httpx2.AsyncClient(timeout=5) as http:
                got = await http.get(f"http://127.0.0.1:{port}/mcp",
                                     headers={"Accept": "text/event-stream"})
            assert (got.status_code, got.headers["allow"]) == (405, "POST")
            assert got.json()["error"]["message"].startswith("Method Not Allowed")
        finally:
            proc.terminate()
            proc.wait(20)
    assert "2 processes" in log_path.read_text(), log_path.read_text()[-2000:]


def _each_worker_listens_and_a_burst_of_connections_reaches_both(supervisor: int,
                                                                  port: int) -> None:
    """Each worker has a listening socket of its own on the port (SO_REUSEPORT), so sixteen
    connections opened at once are spread over both; on one shared socket, a burst could all
    land on whichever worker was accepting."""
    workers = [int(p) for p in
               Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()]
    burst = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(16)]
    try:
        def accepted() -> int:
            return sum(by_state.get("established", 0)
                       for by_state in _sockets_on_port(workers, port).values())

        assert wait_until(lambda: accepted() >= 16, timeout=10)
        owners = _sockets_on_port(workers, port)
        serving = [pid for pid, by_state in owners.items() if by_state.get("listen")]
        assert len(serving) == 2, owners  # a listener each, none shared
        assert all(owners[pid].get("established") for pid in serving), owners
    finally:
        for conn in burst:
            conn.close()


def _sockets_on_port(pids: list[int], port: int) -> dict[int, dict[str, int]]:
    """Per process: how many of its TCP sockets on local port `port` listen, how many are
    connected (from /proc: socket inodes of its descriptors, states from /proc/net/tcp)."""
    states = {"0A": "listen", "01": "established"}
    by_inode: dict[str, str] = {}
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in states:
                by_inode[fields[9]] = states[fields[3]]
    out: dict[int, dict[str, int]] = {}
    for pid in pids:
        counts: dict[str, int] = {}
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            state = by_inode.get(target[len("socket:["):-1]) if target.startswith("socket:[") \
                else None
            if state is not None:
                counts[state] = counts.get(state, 0) + 1
        out[pid] = counts
    return out


def test_worker_processes_answer_without_waiting_for_delayed_acks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The socket `--workers N` shares is opened by uvicorn with protocol number 0, so asyncio
    leaves Nagle's algorithm on for its connections and every answer waited 40 ms for the
    client's delayed ACK. The listener a worker gets turns it off, and accepted connections
    inherit that."""
    import canopy.server.http as http

    seen: list[object] = []
    monkeypatch.setattr(http, "_supervise", seen.append)
    for name in (http.SPEC_ENV, http.READY_ENV):  # run_http sets them: restored afterwards
        monkeypatch.setenv(name, "")
    spec = http.HttpSpec("docs", None, None, None, None, "127.0.0.1", free_port())
    http.run_http(spec, 2)
    (config,) = seen
    assert isinstance(config, uvicorn.Config) and config.workers == 2
    held = http._bind(config)  # the supervisor's; a worker gets what spawning it unpickles
    listener = ForkingPickler.loads(ForkingPickler.dumps(held)) if isinstance(
        held, http._ReusePortSocket) else held
    try:
        listener.listen()
        with socket.create_connection(listener.getsockname()[:2], timeout=5):
            accepted, _ = listener.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        listener.close()
        held.close()


def test_worker_processes_share_the_cache_budget(example_index: Path) -> None:
    from canopy.server.service import CanopyService

    ws = open_workspace(EXAMPLES, index_dir=example_index)
    budgets = []
    for share in (1, 2):
        service = CanopyService(ws, cache_share=share)
        try:
            budgets.append(service.view_cache.memory_bytes)
        finally:
            service.close()
    assert budgets[1] == budgets[0] // 2 > 0


def test_worker_processes_share_the_call_loops_and_open_before_any_answers(
        tmp_path: Path) -> None:
    from canopy.server.http import wait_for_siblings
    from canopy.server.service import QUICK_LOOPS, call_loops

    assert call_loops(1) == QUICK_LOOPS and call_loops(QUICK_LOOPS) == 1
    assert call_loops(64) == 1
    folder = tmp_path / "ready"
    folder.mkdir()
    sibling = threading.Timer(0.5, (folder / "other-worker").touch)
    sibling.start()
    t0 = time.monotonic()
    wait_for_siblings(str(folder), 2)
    assert 0.4 < time.monotonic() - t0 < 5  # waited for the sibling, then went on
    assert (folder / str(os.getpid())).exists()
    t0 = time.monotonic()
    wait_for_siblings(str(folder), 3, timeout=0.3)  # a sibling that never opens: not forever
    assert time.monotonic() - t0 < 2


def test_the_mcp_inspector_cli_lists_the_tools(example_index: Path) -> None:
    npx = shutil.which("npx")
    if npx is None:
        pytest.skip("Node (npx) is not installed")
    cmd = [npx, "-y", "@modelcontextprotocol/inspector", "--cli",
           sys.executable, *serve_args(EXAMPLES, example_index), "--method", "tools/list"]
    try:
        done = subprocess.run(cmd, check=False, cwd=REPO, capture_output=True, text=True,
                              timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})
    except subprocess.TimeoutExpired:
        pytest.skip("npx did not fetch and run the MCP Inspector within 240 s")
    if done.returncode != 0 and ("npm ERR" in done.stderr or "npm error" in done.stderr):
        pytest.skip(f"npx could not fetch the MCP Inspector: {done.stderr.strip()[-300:]}")
    assert done.returncode == 0, done.stderr[-2000:]
    tools = json.loads(done.stdout)["tools"]
    assert {t["name"] for t in tools} == TOOLS
    assert all(t["annotations"]["readOnlyHint"] for t in tools)


def test_canopy_demo_calls_every_tool_over_stdio_and_its_total_covers_the_run(
        example_index: Path, tmp_path: Path) -> None:
    """`canopy demo` as a user runs it (its own process): every tool answers over stdio, and
    its "Done in X s" covers the whole run up to that line but the interpreter's start-up (it
    once said 4.6 s for a 9 s run, leaving out imports). Start-up is measured side by side: the
    time to start Python and import the CLI, whose import starts the demo's clock."""
    shutil.copytree(example_index, tmp_path / "index")  # the demo updates it (a no-op here)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO)
    began = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import canopy.server.cli"], check=True, cwd=REPO,
                   env=env)
    start_up = time.perf_counter() - began
    lines, done_at = [], None
    with (tmp_path / "stderr").open("wb") as err:
        began = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "canopy.server.cli", "demo", "--index-dir",
             str(tmp_path / "index")], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err,
            text=True, encoding="utf-8")
        assert proc.stdout is not None
        for line in proc.stdout:  # click.echo flushes every line
            lines.append(line)
            if line.startswith("Done in "):
                done_at = time.perf_counter()
        proc.wait(60)
        ended = time.perf_counter()
    output = "".join(lines)
    assert proc.returncode == 0, output[-3000:] + (tmp_path / "stderr").read_text()[-2000:]
    for tool in TOOLS:
        assert f"── {tool}(" in output
    assert "[error" not in output
    assert "canopy://units/" in output
    found = re.search(r"^Done in ([0-9.]+)s \(([0-9.]+)s indexing, ([0-9.]+)s serving", output,
                      re.MULTILINE)
    assert found is not None and done_at is not None, output[-500:]
    total, indexing, serving = (float(x) for x in found.groups())
    assert abs(indexing + serving - total) <= 0.15  # the parts add up (each rounded)
    elapsed = done_at - began
    assert total <= elapsed + 0.05, (total, elapsed)  # never more than has passed (rounding)
    assert elapsed - total <= start_up + 1.0, (total, elapsed, start_up)
    assert ended - done_at < 5, ended - done_at  # nothing long after it: the exit only


async def _after_first_build(client: Client, tool: str, args: dict[str, Any],
                             timeout: float = 120) -> Any:
    """The tool's answer once the server's first build has committed (until then every call
    answers with the build's progress)."""
    deadline = time.monotonic() + timeout
    while True:
        result = await client.call_tool(tool, args)
        if not (result.is_error and "building the first index" in text_of(result)):
            return result
        assert time.monotonic() < deadline, text_of(result)
        await anyio.sleep(0.5)


async def test_a_first_start_answers_the_handshake_at_once_and_tools_report_the_build(
        tmp_path: Path) -> None:
    """On a folder with no index, `canopy serve` (stdio) completes the handshake before the
    build ends; tool calls meanwhile say what the build is doing; then they answer."""
    from tests.fakes.openai_server import FakeOpenAI

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    with FakeOpenAI(latency=0.4) as fake:  # every request 0.4 s: the build takes several
        env.update(PYTHONPATH=str(REPO), CANOPY_LLM_BASE_URL=fake.base_url,
                   CANOPY_LLM_API_KEY="test", CANOPY_LLM__CONCURRENCY="2")
        params = StdioServerParameters(command=sys.executable,
                                       args=serve_args(docs, tmp_path / "idx"), env=env,
                                       cwd=str(REPO))
        async with Client(params) as client:
            first = await client.call_tool("local_search", {"query": "Who makes the cells?"})
            assert fake.count("extract") < len(list(docs.rglob("*.md")))  # still building
            assert first.is_error, text_of(first)
            assert "building the first index" in text_of(first)
            assert str(docs) in text_of(first) and "s so far" in text_of(first)
            fake.latency = 0.0  # the call met the build under way: let it finish quickly
            done = await _after_first_build(client, "local_search",
                                            {"query": "Who makes the cells?"})
            assert not done.is_error, text_of(done)
            assert done.structured_content["usage"]["provider"].startswith("openai:")


def _count(database: Path, table: str) -> int:
    import sqlite3

    db = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        db.close()


def test_a_host_that_goes_away_during_the_first_build_leaves_no_process_or_lock_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent host starts `canopy serve` (stdio) on a folder with no index, completes the
    handshake, and goes away (closes stdin) while the first build waits on a slow LLM. The
    server must exit at once and free the writer lock (an orphaned build once held it three
    minutes longer), saying what is kept; the next `canopy index` resumes: the units whose
    extraction was saved are not extracted again."""
    from filelock import FileLock

    from canopy.store import DB_NAME
    from tests.fakes.openai_server import FakeOpenAI

    docs, index_dir = tmp_path / "docs", tmp_path / "idx"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "host", "version": "0"}}}
    with FakeOpenAI(latency=0.5) as fake, (tmp_path / "stderr").open("wb") as err:
        # One request at a time, 0.5 s each: a unit (extraction + gleaning) takes a second.
        env.update(PYTHONPATH=str(REPO), CANOPY_LLM_BASE_URL=fake.base_url,
                   CANOPY_LLM_API_KEY="test", CANOPY_LLM__CONCURRENCY="1")
        proc = subprocess.Popen([sys.executable, *serve_args(docs, index_dir)], cwd=REPO,
                                env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=err)
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(hello).encode() + b"\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["id"] == 1  # answered at once
            proc.stdin.write(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}\n')
            proc.stdin.flush()
            # The second unit's gleaning: the first unit's extraction is saved by now.
            assert wait_until(lambda: fake.count("glean") >= 2, 90), fake.tasks()
            closed = time.monotonic()
            proc.stdin.close()
            proc.wait(10)  # TimeoutExpired: the build kept the process alive
            gone = time.monotonic() - closed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0
        lock = FileLock(index_dir / "write.lock")
        lock.acquire(timeout=0)  # Timeout if any process still held it
        lock.release()
        said = (tmp_path / "stderr").read_text()
        assert "went away during the first build" in said and "resumes" in said, said
        saved = _count(index_dir / DB_NAME, "extracted")
        fake.reset()
        fake.latency = 0.0
        monkeypatch.setenv("CANOPY_LLM_BASE_URL", fake.base_url)
        monkeypatch.setenv("CANOPY_LLM_API_KEY", "test")
        done = CliRunner().invoke(main, ["index", str(docs), "--index-dir", str(index_dir)])
        assert done.exit_code == 0, done.output
        units = _count(index_dir / DB_NAME, "text_units")
    assert gone < 10
    assert 1 <= saved < units  # the build was cut between its first and last unit
    assert fake.count("extract") <= units - saved  # the saved ones were not extracted again


async def test_serve_with_watch_answers_while_it_applies_an_edit(tmp_path: Path) -> None:
    """`canopy serve --watch`: one process serves over stdio and commits new generations."""
    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    params = StdioServerParameters(command=sys.executable,
                                   args=serve_args(docs, tmp_path / "idx", "--watch"),
                                   env={"PYTHONPATH": str(REPO)}, cwd=str(REPO))
    async with Client(params) as client:
        before = await _after_first_build(client, "basic_search",
                                          {"query": "Who is Perpetua Lindgren?", "k": 3})
        assert not before.is_error and "Perpetua Lindgren" not in text_of(before)
        (docs / "new_hire.md").write_text(
            "# New hire\n\nPerpetua Lindgren joined Helio Cells Ltd as CFO.", encoding="utf-8"
        )
        deadline = time.monotonic() + 60
        seen = False
        while time.monotonic() < deadline and not seen:
            await anyio.sleep(0.5)
            result = await client.call_tool(
                "basic_search", {"query": "Who is Perpetua Lindgren?", "k": 3}
            )
            assert not result.is_error
            seen = "Perpetua Lindgren" in text_of(result)
        assert seen, "the watcher's update never reached the serving process"


async def _drills_during_a_global_search(
        server: MCPServer) -> tuple[dict[str, float], list[float]]:
    """Five drill_down calls from one client while another's global_search runs (started 0.3 s
    before them): when each ended (seconds from the start), and how long each drill_down took."""
    drills: list[float] = []
    done: dict[str, float] = {}
    async with Client(server) as slow, Client(server) as quick:
        await quick.call_tool("drill_down", {})  # the quick calls' loop is started
        t0 = time.perf_counter()

        async def global_call() -> None:
            result = await slow.call_tool("global_search", {"query": "What are the main themes?"})
            assert not result.is_error, text_of(result)
            done["global"] = time.perf_counter() - t0

        async with anyio.create_task_group() as tg:
            tg.start_soon(global_call)
            await anyio.sleep(0.3)  # global_search is now busy, or waiting on its endpoint
            for _ in range(5):
                t = time.perf_counter()
                result = await quick.call_tool("drill_down", {})
                assert not result.is_error, text_of(result)
                drills.append(time.perf_counter() - t)
            done["drills"] = time.perf_counter() - t0
    return done, drills


async def test_global_search_busy_on_its_thread_does_not_hold_a_drill_down_behind_it(
        example_index: Path) -> None:
    """Calls run side by side as tasks on one event loop per lane: a global search whose map
    keeps its thread busy (as the builtin provider's does over many reports) runs on the long
    calls' loop, so drill_down calls are answered meanwhile on the quick one."""
    from canopy.providers.builtin import BuiltinProvider

    class BusyMap(BuiltinProvider):
        async def map(self, query: str, reports: list[Any], *, response_type: str) -> Any:
            time.sleep(0.4)  # holds the thread, as CPU work would: no await lets others run
            return await super().map(query, reports, response_type=response_type)

    with offline_env():  # small map batches: the top-level reports take several map calls
        svc = CanopyService(open_workspace(EXAMPLES, index_dir=example_index,
                                           query={"map_batch_tokens": 500}), loops=1)
    svc.use_provider(BusyMap())
    try:
        done, drills = await _drills_during_a_global_search(build_server(svc))
        assert done["global"] >= 0.8  # at least two busy map batches
        assert done["drills"] < done["global"], (done, drills)
        assert max(drills) < 0.35, drills
    finally:
        svc.close()


async def test_calls_in_flight_on_an_event_loop_are_capped(
        example_index: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most CALLS_PER_LOOP calls run on a loop at once; the rest wait their turn (a burst
    of requests does not open a snapshot and a result's memory for each)."""
    import canopy.server.service as service_module

    monkeypatch.setattr(service_module, "CALLS_PER_LOOP", 2)
    with offline_env():
        svc = CanopyService(open_workspace(EXAMPLES, index_dir=example_index), loops=1)
    running, most = 0, 0

    async def call(ctx: Any) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.05)
        running -= 1
        return ctx.reader.generation

    try:
        generations = await asyncio.gather(*(svc.run(None, call) for _ in range(7)))
    finally:
        svc.close()
    assert most == 2 and len(set(generations)) == 1 and generations[0] > 0


async def test_a_slow_global_search_does_not_hold_a_drill_down_behind_it(
        example_index: Path) -> None:
    """Requests run side by side: while global_search waits on a slow LLM (1 s per call, map
    then reduce), drill_down calls from another client are answered at once."""
    from canopy.llm import ChatClient
    from canopy.providers.llm_provider import LLMProvider
    from canopy.settings import LLMSettings
    from tests.fakes.openai_server import FakeOpenAI

    with offline_env():
        svc = CanopyService(open_workspace(EXAMPLES, index_dir=example_index))
    fake = FakeOpenAI(latency=1.0).start()
    try:
        svc.use_provider(LLMProvider(ChatClient(LLMSettings(base_url=fake.base_url, model="fake",
                                                            max_retries=0), cache=None)))
        done, drills = await _drills_during_a_global_search(build_server(svc))
        assert len(fake.requests) >= 2  # map and reduce both went to the slow endpoint
        assert done["global"] >= 2.0
        assert done["drills"] < done["global"] - 0.5, (done, drills)
        assert max(drills) < 0.75, drills
    finally:
        fake.stop()
        svc.close()
