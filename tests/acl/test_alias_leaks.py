"""An alias known only from a restricted document is never revealed to a caller who cannot read
it (issue 31, "merges that respect access"; canopy.aliases states the rule).

The staff documents name "NKP" (a lease) and "Northwind Kestrel Partners" (a hiring note) apart;
only the finance memo writes "Northwind Kestrel Partners (NKP)", so only it links the two. A
staff caller must be served two entities, each as the staff documents alone index it (the
oracle: an index of the staff documents with no policy), through every tool and resource of
the MCP server, the web view's JSON and the export; the finance caller is served the merge, with
its evidence, in drill_down.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from canopy.ids import entity_id
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.server.wings.graphrag.export.collect import collect_tables
from canopy.server.wings.web.data import entity_page, find_entities, hierarchy
from tests.acl.test_acl_leaks import sweep

LEASE = """# Warehouse lease

NKP signed the warehouse lease in Leeds with Harbourline Estates in March. NKP pays the rent to Harbourline Estates every quarter, and Harbourline Estates maintains the loading bays in Leeds.
"""  # noqa: E501 - fixture documents keep one paragraph per line
HIRING = """# Hiring news

Northwind Kestrel Partners hired Imogen Talbot in Leeds as its new controller. Imogen Talbot joined Northwind Kestrel Partners from Carrow Mills, where Imogen Talbot ran the accounts.
"""  # noqa: E501
MEMO = """# Tindrel acquisition: funding

Northwind Kestrel Partners (NKP) is the vehicle for the Tindrel acquisition, file CANARY-ALIAS-9c2. NKP wired the deposit to Okafor Marsh Bank in Leeds; Northwind Kestrel Partners keeps the Tindrel acquisition quiet until June.
"""  # noqa: E501
POLICY = """[acl]
default = ["staff"]

[[acl.rules]]
glob = "finance/**"
labels = ["finance"]

[acl.principals]
staff = ["staff"]
cfo = ["staff", "finance"]
"""
LONG, SHORT = "Northwind Kestrel Partners", "NKP"
# Words only the memo writes: never served to staff.
FORBIDDEN = ("canary-alias-9c2", "canary alias 9c2", "tindrel", "okafor marsh")
QUERIES = [
    "What is NKP, and is it Northwind Kestrel Partners?",
    "Who funds the Tindrel acquisition? What is CANARY-ALIAS-9c2?",
    "What did Northwind Kestrel Partners and NKP do in Leeds?",
]

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def indexes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, Path, Path]]:
    """(docs, index) with the policy and the memo, and (docs, index) of the staff documents
    alone with no policy: the oracle."""
    root = tmp_path_factory.mktemp("alias-leaks")
    docs, oracle_docs = root / "docs", root / "oracle-docs"
    for d in (docs, oracle_docs):
        (d / "staff").mkdir(parents=True)
        (d / "staff" / "lease.md").write_text(LEASE, encoding="utf-8")
        (d / "staff" / "hiring.md").write_text(HIRING, encoding="utf-8")
    (docs / "finance").mkdir()
    (docs / "finance" / "deal.md").write_text(MEMO, encoding="utf-8")
    (docs / "canopy.toml").write_text(POLICY, encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in __import__("os").environ if k.startswith(("CANOPY_", "OPENAI_"))]:
            mp.delenv(key)
        for d in (docs, oracle_docs):
            build_index(open_workspace(d, index_dir=root / f"{d.name}-index"))
    yield docs, root / "docs-index", oracle_docs, root / "oracle-docs-index"
    shutil.rmtree(root, ignore_errors=True)


def _service(docs: Path, index: Path) -> CanopyService:
    return CanopyService(open_workspace(docs, index_dir=index))


async def _drill(svc: CanopyService, who: str | None, name: str) -> dict[str, Any]:
    from mcp import Client

    from canopy.server.mcp_app import build_server

    async with Client(build_server(svc, principal_name=who)) as client:
        got = await client.call_tool("drill_down", {"entity": name, "limit": 100})
        assert not got.is_error, got
        return got.structured_content  # type: ignore[return-value]


def _card(d: dict[str, Any]) -> tuple[str, str, str, list[str]]:
    e = d["entity"]
    return e["id"], e["name"], e["description"], sorted(a["name"] for a in d["aliases"])


async def test_the_finance_caller_is_served_the_merge_with_its_evidence(indexes):
    """The harness is not vacuous: the memo's "NKP" is merged into Northwind Kestrel Partners,
    and drill_down names the rule and the memo's unit."""
    docs, index, _, _ = indexes
    svc = _service(docs, index)
    d = await _drill(svc, "cfo", LONG)
    (alias,) = d["aliases"]
    assert alias["name"] == SHORT and alias["rule"] == "initialism"
    with svc.context("cfo") as ctx:
        units = ctx.reader.units(alias["text_unit_ids"])
    assert [doc.path for _, doc in units.values()] == ["finance/deal.md"]
    # the lease's "NKP" has no evidence in its unit: an entity of its own, for everyone
    assert (await _drill(svc, "cfo", SHORT))["entity"]["id"] == entity_id(SHORT)


async def test_a_staff_caller_sees_each_name_as_the_staff_documents_alone_index_it(indexes):
    docs, index, oracle_docs, oracle_index = indexes
    svc, oracle = _service(docs, index), _service(oracle_docs, oracle_index)
    for name in (LONG, SHORT):
        served, expected = await _drill(svc, "staff", name), await _drill(oracle, None, name)
        assert _card(served) == _card(expected), name
        assert not served["aliases"]
    assert (await _drill(svc, "staff", LONG))["entity"]["id"] != (
        await _drill(svc, "staff", SHORT))["entity"]["id"]


async def test_no_tool_or_resource_reveals_the_link_to_staff(indexes):
    """Every tool and resource, following every handle (tests/acl/test_acl_leaks.py's sweep): no
    word only the memo writes, and no entity served under one name says the other."""
    docs, index, _, _ = indexes
    svc = _service(docs, index)
    t = await sweep(svc, "staff", queries=QUERIES)
    for asked, text in t.outputs:
        low = text.lower()
        leaked = [w for w in FORBIDDEN if w in low and w not in asked]
        assert not leaked, (leaked, asked, text[:400])
        for card in _entity_cards(text):
            other = SHORT if card.get("name") == LONG else LONG if card.get("name") == SHORT else ""
            assert not other or other.lower() not in json.dumps(card).lower(), (asked, card)


def _entity_cards(text: str) -> list[dict[str, Any]]:
    """The entity cards of a structured output (any dict with a name and a description)."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    out: list[dict[str, Any]] = []

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if "name" in x and "description" in x:
                out.append(x)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(data)
    return out


def test_the_web_view_and_the_export_keep_the_names_apart_for_staff(indexes):
    docs, index, _, _ = indexes
    svc = _service(docs, index)
    with svc.context("staff") as ctx:
        pages = {n: asyncio.run(entity_page(ctx, entity_id(n))).model_dump_json() for n in
                 (LONG, SHORT)}
        found = asyncio.run(find_entities(ctx, SHORT))
        tree = asyncio.run(hierarchy(ctx, "index")).model_dump_json()
        tables = asyncio.run(collect_tables(ctx))
    assert SHORT.lower() not in pages[LONG].lower() and LONG.lower() not in pages[SHORT].lower()
    assert [e.id for e in found.entities][:1] == [entity_id(SHORT)]
    assert LONG not in [e.name for e in found.entities]
    exported = json.dumps(tables.rows, default=str).lower()
    for blob in (*pages.values(), tree.lower(), exported):
        assert not [w for w in FORBIDDEN if w in blob.lower()]
    (row,) = [r for r in tables.rows["entities"] if r["title"] == LONG]
    assert SHORT not in json.dumps(row, default=str)
