"""ACL leak search (design §2, §5, §9) through the real MCP server.

A corpus of public documents (the bundled examples) plus restricted documents that plant canary
strings ("CANARY-7f3a") and canary entity names ("Zebulon Quartzfield") found nowhere else, each
co-mentioned with public entities, so public entities, relationships and communities are shared
with restricted text and are served to restricted callers as views (canopy.acl.views).

For seeded random policies and principals, every tool (global_search at every level and dynamic,
local, drift, basic, drill_down on every root, child, finding and member entity reachable,
index_status) and every resource (the report list, each report, each unit reached) is called
through the MCP in-memory client, with questions that name the canaries. Asserted on every
output field (structuredContent, text content, resource text, error messages):
- no canary string or canary entity name of a document the caller may not read appears, nor any
  id of a hidden unit, entity or community;
- hidden ids answer exactly like nonexistent ones (errors, codes, messages);
- views match the oracle: an entity view equals the entity as indexed from the caller's
  documents alone, and index_status counts equal that index's counts;
and again after a restricted document is deleted, after a label is revoked from a principal and
after documents are relabelled. The deletion test (issue 4) checks that a deleted document's text,
names and reports vanish as soon as the revocation generation commits, before regeneration.

The default run sweeps a few principals (about 30 s); `-m slow` runs a larger randomized sweep.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError

from canopy.acl.access import State
from canopy.errors import EndpointUnavailable
from canopy.indexer.pipeline import run_index
from canopy.providers import make_embedder
from canopy.providers.builtin import BuiltinProvider
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.store.export import Graph, load_graph
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.anyio

GROUPS = ("board", "hr", "legal", "lab")
LABELS = ("board", "hr", "legal", "lab", "exec")

# path -> (text, canaries). Canaries occur in that document only; each shares sentences with
# public entities (Helio Cells Ltd, Maria Okafor, Eindhoven, ...).
RESTRICTED: dict[str, tuple[str, tuple[str, ...]]] = {
    "restricted/board/zephyr.md": ("""---
title: "Project Zephyr: acquisition memo"
source: Board desk, file CANARY-8b6d
date: 2024-05-14
---
# Project Zephyr: acquisition memo

Zebulon Quartzfield leads Project Zephyr, a confidential acquisition study at Northwind Robotics. Zebulon Quartzfield met Maria Okafor in Eindhoven in May 2024 to discuss Okonkwo Brightwater Holdings. The code word for the deal is CANARY-7f3a, and CANARY-7f3a must never appear outside the board.

Okonkwo Brightwater Holdings offered to buy Helio Cells Ltd for 41 million pounds. Zebulon Quartzfield told Sofia Brandt that Okonkwo Brightwater Holdings would keep Line 3 in Sheffield running. Helio Cells Ltd and Okonkwo Brightwater Holdings signed a letter of intent in Rotterdam; CANARY-7f3a was the file name.
""", ("Zebulon Quartzfield", "Okonkwo Brightwater Holdings", "Project Zephyr",  # noqa: E501 - fixture documents keep one paragraph per line
      "CANARY-7f3a", "CANARY-8b6d")),  # the last only in front matter: metadata is guarded too
    "restricted/hr/review.md": ("""# Performance review: Project Tern

Philippa Marrowgate reviewed Jonas Lindqvist for Project Tern in December 2024. Philippa Marrowgate hired Thistledown Vexley Partners to interview the Tern team in Eindhoven. The review is filed under CANARY-91bd.

Thistledown Vexley Partners reported that Bluewater Logistics delays hurt morale on Project Tern. Jonas Lindqvist disputed the findings of Thistledown Vexley Partners with Philippa Marrowgate; the appeal reference is CANARY-91bd.
""", ("Philippa Marrowgate", "Thistledown Vexley Partners", "CANARY-91bd")),  # noqa: E501 - fixture documents keep one paragraph per line
    "restricted/legal/case.md": ("""# Legal hold: Tern recall

Ignatius Fernhollow of Quillon Sarabande Trust represents the owners of recalled Tern packs against Helio Cells Ltd. Ignatius Fernhollow filed the claim in Sheffield in January 2025 under docket CANARY-c04e.

Quillon Sarabande Trust asked Daniel Ferreira for the audit of batch HC-2311. Daniel Ferreira and Ignatius Fernhollow met in Rotterdam; Quillon Sarabande Trust seeks damages from Helio Cells Ltd under CANARY-c04e.
""", ("Ignatius Fernhollow", "Quillon Sarabande Trust", "CANARY-c04e")),  # noqa: E501 - fixture documents keep one paragraph per line
    "restricted/lab/orion.md": ("""# Lab notebook: Project Orion

Wilhelmina Ostrovane runs Project Orion, a solid-state cell trial with Cobaltreach Meridian AG in Hamburg. Wilhelmina Ostrovane showed Priya Raman the first Orion prototype at the Eindhoven plant; the sample label is CANARY-5e21.

Cobaltreach Meridian AG will ship Orion cells to Northwind Robotics through Bluewater Logistics. Priya Raman and Wilhelmina Ostrovane want Orion cells in the Kestrel K3 by 2026, batch CANARY-5e21.
""", ("Wilhelmina Ostrovane", "Cobaltreach Meridian AG", "Project Orion",  # noqa: E501 - fixture documents keep one paragraph per line
      "CANARY-5e21")),
}

QUERIES = [
    "What are the main risks across the supply chain?",
    "Who is Zebulon Quartzfield and what is Okonkwo Brightwater Holdings buying?",
    "What is CANARY-7f3a? What do CANARY-91bd, CANARY-c04e, CANARY-5e21 and CANARY-8b6d refer to?",
    "What did Philippa Marrowgate and Thistledown Vexley Partners find about Jonas Lindqvist?",
    "Ignatius Fernhollow Quillon Sarabande Trust claim against Helio Cells Ltd",
    "Wilhelmina Ostrovane Cobaltreach Meridian AG Project Orion solid-state cells",
    "Who met Maria Okafor in Eindhoven, and who will buy Helio Cells Ltd?",
]
MISSING_COMMUNITY = "c1-0123456789"
MISSING_UNIT = "tu-0123456789abcdef"
MISSING_ENTITY_ID = "ent-0123456789abcdef"
MISSING_NAME = "Nobody Suchperson Holdings"


def group_of(path: str) -> str | None:
    parts = path.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "restricted" else None


@dataclass
class Policy:
    groups: dict[str, list[str]]  # restricted group -> its labels
    principals: dict[str, list[str]]

    def toml(self) -> str:
        lines = ['[acl]', 'default = ["staff"]', ""]
        for g in GROUPS:
            lines += ["[[acl.rules]]", f'glob = "restricted/{g}/**"',
                      f"labels = {json.dumps(self.groups[g])}", ""]
        lines.append("[acl.principals]")
        lines += [f"{name} = {json.dumps(labels)}" for name, labels in self.principals.items()]
        return "\n".join(lines) + "\n"

    def readable(self, principal: str, path: str) -> bool:
        group = group_of(path)
        labels = self.groups[group] if group else ["staff"]
        return bool(set(labels) & set(self.principals.get(principal, [])))


def random_policy(rng: random.Random, n_principals: int = 3) -> Policy:
    groups = {g: sorted(rng.sample(LABELS, rng.choice([1, 1, 2]))) for g in GROUPS}
    principals = {"admin": ["staff", *LABELS], "staff": ["staff"]}
    for i in range(n_principals):
        labels = rng.sample(LABELS, rng.randint(0, 3))
        if rng.random() < 0.8:
            labels.append("staff")
        principals[f"p{i}"] = sorted(labels)
    return Policy(groups, principals)


def write_corpus(docs: Path, policy: Policy) -> None:
    if not docs.exists():
        shutil.copytree(EXAMPLES, docs)
        for path, (text, _) in RESTRICTED.items():
            (docs / path).parent.mkdir(parents=True, exist_ok=True)
            (docs / path).write_text(text, encoding="utf-8")
    (docs / "canopy.toml").write_text(policy.toml(), encoding="utf-8")


def forbidden(policy: Policy, principal: str, docs: Path) -> list[str]:
    """Lower-cased canaries (and their distinctive words) of restricted documents the principal
    may not read, or that no longer exist."""
    out: list[str] = []
    for path, (_, canaries) in RESTRICTED.items():
        if (docs / path).exists() and policy.readable(principal, path):
            continue
        for c in canaries:
            out.append(c.lower())
            if c.startswith("CANARY-"):
                out.append(c.lower().replace("-", " "))
            else:  # and each of its words that no public document uses
                out += [w.lower() for w in c.split() if w.lower() not in _public_text()]
    return sorted(set(out))


_PUBLIC: list[str] = []


def _public_text() -> str:
    if not _PUBLIC:
        _PUBLIC.append("\n".join(p.read_text(encoding="utf-8", errors="replace").lower()
                                 for p in sorted(EXAMPLES.rglob("*")) if p.is_file()))
    return _PUBLIC[0]


# ---- driving the MCP server -------------------------------------------------------------------


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


@dataclass
class Transcript:
    # (the call's own arguments, lower-cased; an output field). A canary the caller wrote in a
    # question may be echoed back (the query field, DRIFT's follow-up questions): it is not
    # looked for in the outputs of that call, every other canary is.
    outputs: list[tuple[str, str]] = field(default_factory=list)
    communities: set[str] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)  # names
    units: set[str] = field(default_factory=set)
    calls: int = 0
    status: dict[str, Any] = field(default_factory=dict)


class Probe:
    def __init__(self, client: Client, transcript: Transcript) -> None:
        self.client = client
        self.t = transcript

    async def tool(self, name: str, args: dict[str, Any]) -> Any:
        result = await self.client.call_tool(name, args)
        self.t.calls += 1
        asked = json.dumps(args, ensure_ascii=False).lower()
        self.t.outputs.append((asked, text_of(result)))
        if result.structured_content is not None:
            self.t.outputs.append(
                (asked, json.dumps(result.structured_content, ensure_ascii=False))
            )
            for c in result.structured_content.get("citations", []):
                if c["kind"] == "text_unit":
                    self.t.units.add(c["id"])
        return result

    async def resource(self, uri: str) -> str | None:
        self.t.calls += 1
        try:
            result = await self.client.read_resource(uri)
        except MCPError as exc:
            self.t.outputs.append((uri.lower(), f"{exc.error.code} {exc.error.message}"))
            return None
        text = "\n".join(getattr(c, "text", "") for c in result.contents)
        self.t.outputs.append((uri.lower(), text))
        return text


async def sweep(service: CanopyService, principal: str, *, queries: list[str],
                findings: bool = True, entity_sample: int | None = None,
                rng: random.Random | None = None) -> Transcript:
    """Call every tool and resource as `principal`, following every navigation handle."""
    t = Transcript()
    async with Client(build_server(service, principal_name=principal)) as client:
        p = Probe(client, t)
        status = (await p.tool("index_status", {})).structured_content
        t.status = status
        levels = sorted(int(k) for k in status["communities_by_level"])
        for q in queries:
            for level in [None, *levels]:
                await p.tool("global_search", {"query": q, "community_level": level})
            await p.tool("local_search", {"query": q})
            await p.tool("drift_search", {"query": q})
            await p.tool("basic_search", {"query": q, "k": 20})
            await p.tool("search", {"query": q})
        roots = (await p.tool("drill_down", {"limit": 100})).structured_content
        queue = [c["id"] for c in roots["children"]] if roots else []
        while queue:
            cid = queue.pop()
            if cid in t.communities:
                continue
            t.communities.add(cid)
            opened = await p.tool("drill_down", {"community_id": cid, "limit": 100})
            d = opened.structured_content
            assert not opened.is_error and d is not None, text_of(opened)
            queue += [c["id"] for c in [*d["children"], *d["parents"]]]
            t.entities.update(e["name"] for e in d["entities"])
            t.units.update(s["text_unit_id"] for s in d["sources"])
            if findings:
                for i in range(len(d["findings"])):
                    f = await p.tool(
                        "drill_down", {"community_id": cid, "finding": i, "limit": 100}
                    )
                    t.units.update(s["text_unit_id"] for s in f.structured_content["sources"])
            await p.resource(f"canopy://reports/{cid}")
        names = sorted(t.entities)
        if entity_sample is not None and len(names) > entity_sample:
            names = sorted((rng or random.Random(0)).sample(names, entity_sample))
        for name in names:
            got = await p.tool("drill_down", {"entity": name, "limit": 100})
            assert not got.is_error, (name, text_of(got))
            t.units.update(s["text_unit_id"] for s in got.structured_content["sources"])
        await p.resource("canopy://reports")
        for uid in sorted(t.units):
            assert await p.resource(f"canopy://units/{uid}") is not None, uid
    return t


@dataclass
class Hidden:
    units: set[str]
    entities: dict[str, str]  # id -> name
    communities: set[str]


def readable_units(service: CanopyService, principal: str | None) -> tuple[Graph, set[str]]:
    """The committed graph, and the live units `principal` may read."""
    g = load_graph(service.store)
    with service.context(principal) as ctx:
        acl = ctx.reader._snap.unit_acl(g.units)
        return g, {u for u, a in acl.items() if a in ctx.caller.readable}


def hidden_of(service: CanopyService, principal: str) -> Hidden:
    """What the principal may not be served at all: units they cannot read (or that are dead),
    entities with no readable instance, communities with no member they can see."""
    g, readable = readable_units(service, principal)
    units = {u for u in g.units if u not in readable}
    units |= {u for e in g.entities.values() for u in e.text_unit_ids if u not in g.units}
    entities = {e.id: e.name for e in g.entities.values() if not readable & set(e.text_unit_ids)}
    communities = {c.id for c in g.communities.values() if all(e in entities for e in c.entity_ids)}
    return Hidden(units, entities, communities)


def assert_no_leak(t: Transcript, tokens: list[str], hidden: Hidden, who: str) -> None:
    for asked, text in t.outputs:
        low = text.lower()
        leaked = [tok for tok in tokens if tok in low and tok not in asked]
        assert not leaked, (who, leaked, asked, _context(low, leaked[0]))
    blob = "\n".join(text for _, text in t.outputs)
    ids = re.findall(r"\b(?:tu|ent|rel|c\d+)-[0-9a-f]{6,}\b", blob)
    bad = sorted(
        {i for i in ids if i in hidden.units or i in hidden.entities or i in hidden.communities}
    )
    assert not bad, (who, bad[:5])


def _context(text: str, token: str) -> str:
    i = text.find(token)
    return text[max(0, i - 300): i + 200]


async def assert_hidden_like_missing(
    service: CanopyService, principal: str, hidden: Hidden
) -> None:
    """Every handle to a hidden item answers exactly like the same handle to a missing one."""
    cid = min(hidden.communities) if hidden.communities else None
    eid = min(hidden.entities) if hidden.entities else None
    uid = min(hidden.units) if hidden.units else None
    canary_names = [c for _, cs in RESTRICTED.values() for c in cs if not c.startswith("CANARY")]
    async with Client(build_server(service, principal_name=principal)) as client:
        async def tool(args: dict[str, Any], value: str) -> tuple[bool, str, Any]:
            r = await client.call_tool("drill_down", args)
            return r.is_error, text_of(r).replace(repr(value), "<x>").replace(value, "<x>"), \
                r.structured_content

        async def read(uri: str, value: str) -> tuple[int, str]:
            with pytest.raises(MCPError) as err:
                await client.read_resource(uri)
            return err.value.error.code, err.value.error.message.replace(value, "<x>")

        pairs: list[tuple[str, str, str]] = []  # (argument, hidden value, missing value)
        if cid:
            pairs.append(("community_id", cid, MISSING_COMMUNITY))
        if eid:
            pairs.append(("entity", eid, MISSING_ENTITY_ID))
            pairs.append(("entity", hidden.entities[eid], MISSING_NAME))
        pairs += [("entity", name, MISSING_NAME) for name in canary_names
                  if name.lower() in {n.lower() for n in hidden.entities.values()}]
        for arg, hid, missing in pairs:
            for extra in ({}, {"limit": 3}, {"finding": 0} if arg == "community_id" else {}):
                a = await tool({arg: hid, **extra}, hid)
                b = await tool({arg: missing, **extra}, missing)
                assert a == b and a[0], (principal, arg, a, b)
        if cid:
            assert await read(f"canopy://reports/{cid}", cid) == \
                await read(f"canopy://reports/{MISSING_COMMUNITY}", MISSING_COMMUNITY)
        if uid:
            assert await read(f"canopy://units/{uid}", uid) == \
                await read(f"canopy://units/{MISSING_UNIT}", MISSING_UNIT)


def check_principal(service: CanopyService, policy: Policy, principal: str, docs: Path, *,
                    queries: list[str], findings: bool = True, entity_sample: int | None = 40,
                    seed: int = 0) -> Transcript:
    t = asyncio.run(sweep(service, principal, queries=queries, findings=findings,
                          entity_sample=entity_sample, rng=random.Random(seed)))
    hidden = hidden_of(service, principal)
    assert_no_leak(t, forbidden(policy, principal, docs), hidden, principal)
    asyncio.run(assert_hidden_like_missing(service, principal, hidden))
    return t


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def base_policy() -> Policy:
    return Policy(
        groups={"board": ["board"], "hr": ["hr"], "legal": ["legal", "exec"], "lab": ["lab"]},
        principals={"admin": ["staff", *LABELS], "staff": ["staff"], "board": ["staff", "board"],
                    "counsel": ["legal", "hr"]},
    )


@pytest.fixture(scope="module")
def leak_index(
    tmp_path_factory: pytest.TempPathFactory, base_policy: Policy
) -> Iterator[tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("leaks")
    docs, index_dir = root / "docs", root / "index"
    write_corpus(docs, base_policy)
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in __import__("os").environ if k.startswith(("CANOPY_", "OPENAI_"))]:
            mp.delenv(key)
        build_index(open_workspace(docs, index_dir=index_dir))
    yield docs, index_dir


def fresh_copy(leak_index: tuple[Path, Path], dst: Path) -> tuple[Path, Path]:
    docs, index_dir = leak_index
    shutil.copytree(docs, dst / "docs")
    shutil.copytree(index_dir, dst / "index")
    return dst / "docs", dst / "index"


def service_for(docs: Path, index_dir: Path) -> CanopyService:
    return CanopyService(open_workspace(docs, index_dir=index_dir))


# ---- tests --------------------------------------------------------------------------------------


def test_canaries_are_indexed_and_reach_a_principal_who_may_read_them(leak_index, base_policy):
    """The harness is not vacuous: admin is served the canaries, and restricted callers are
    served views of public entities that share text with restricted documents."""
    docs, index_dir = leak_index
    svc = service_for(docs, index_dir)
    try:
        t = asyncio.run(sweep(svc, "admin", queries=QUERIES[1:3], findings=False, entity_sample=10))
        answers = "\n".join(text for asked, text in t.outputs if "zebulon" not in asked).lower()
        assert "zebulon quartzfield" in answers and "canary-7f3a" in answers
        assert "canary-8b6d" in answers  # front-matter metadata is indexed and served
        g, readable = readable_units(svc, "staff")
        tokens = forbidden(base_policy, "staff", docs)
        shared = [e for e in g.entities.values()
                  if readable & set(e.text_unit_ids) and not set(e.text_unit_ids) <= readable
                  and any(tok in e.description.lower() for tok in tokens)]
        assert len(shared) >= 2, "no public entity's description quotes a restricted document"
        with svc.context("staff") as ctx:
            views = asyncio.run(ctx.reader.entities(e.id for e in shared))
        for canonical in shared:
            view = views.get(canonical.id)
            assert view is not None and view != canonical
            assert set(view.text_unit_ids) < set(canonical.text_unit_ids)
            assert not any(tok in view.description.lower() for tok in tokens)
            assert view.degree < canonical.degree
    finally:
        svc.close()


@pytest.mark.parametrize("principal", ["staff", "board", "counsel", "nobody"])
def test_no_canary_reaches_a_principal_through_any_tool_or_resource(
    leak_index, base_policy, principal
):
    docs, index_dir = leak_index
    svc = service_for(docs, index_dir)
    try:
        deep = principal in ("staff", "nobody")
        t = check_principal(svc, base_policy, principal, docs,
                            queries=QUERIES if deep else QUERIES[1:4], findings=deep,
                            entity_sample=None if deep else 30)
        if principal != "nobody":
            assert t.communities and t.entities and t.units
        else:
            assert t.status["documents"] == 0 and not t.communities
    finally:
        svc.close()


def test_views_equal_the_index_of_the_callers_documents_alone(leak_index, base_policy, tmp_path):
    """The oracle: indexing only the documents `board` may read gives exactly the entities (name,
    type, description, degree) and counts `board` is served from the full index."""
    docs, index_dir = leak_index
    oracle_docs = tmp_path / "oracle"
    shutil.copytree(docs, oracle_docs)
    for path in RESTRICTED:
        if not base_policy.readable("board", path):
            (oracle_docs / path).unlink()
    (oracle_docs / "canopy.toml").unlink()
    build_index(open_workspace(oracle_docs, index_dir=tmp_path / "oracle-index"))
    oracle = service_for(oracle_docs, tmp_path / "oracle-index")
    svc = service_for(docs, index_dir)
    try:
        truth = load_graph(oracle.store)
        g = load_graph(svc.store)
        with svc.context("board") as ctx:
            states = ctx.reader.entity_states(g.entities)
            served_ids = {e for e, s in states.items() if s}
            views = asyncio.run(ctx.reader.entities(sorted(served_ids)))
            rel_states = ctx.reader.relationship_states(g.relationships)
        assert served_ids == set(truth.entities)
        for eid, want in truth.entities.items():
            got = views[eid]
            assert (got.name, got.type, got.description, got.degree, got.text_unit_ids) == (
                want.name, want.type, want.description, want.degree, want.text_unit_ids), eid
        served_rels = {r for r, s in rel_states.items() if s}
        assert served_rels == set(truth.relationships)

        async def status(s: CanopyService, who: str | None) -> dict[str, Any]:
            async with Client(build_server(s, principal_name=who)) as client:
                return (await client.call_tool("index_status", {})).structured_content

        mine, theirs = asyncio.run(status(svc, "board")), asyncio.run(status(oracle, None))
        for key in ("documents", "text_units", "entities", "relationships", "claims"):
            assert mine[key] == theirs[key], key
    finally:
        svc.close()
        oracle.close()


class _FailingReports(BuiltinProvider):
    """The builtin provider, except that report() fails as an endpoint outage: the update
    stops at its first report, after the revocation commit (indexer/pipeline.py step 2b)."""

    async def report(self, context: Any, *, max_tokens: int) -> Any:
        raise EndpointUnavailable("the report endpoint is down (test)")


def test_a_deleted_document_vanishes_before_regeneration(leak_index, base_policy, tmp_path):
    """Issue 4: delete restricted/board/zephyr.md and run the update with a provider whose
    report() fails: the revocation generation commits, regeneration does not. Even admin, who
    could read the document, no longer gets its text, its names or the reports that used it."""
    docs, index_dir = fresh_copy(leak_index, tmp_path)
    gone = "restricted/board/zephyr.md"
    svc = service_for(docs, index_dir)
    try:
        before = load_graph(svc.store)
        generation = svc.store.generation
        dead = {u.id for u in before.units.values() if before.documents[u.document_id].path == gone}
        used = {r.community_id for r in before.reports.values() if dead & set(r.text_unit_ids)}
        assert dead and used
        (docs / gone).unlink()
        ws = open_workspace(docs, index_dir=index_dir)
        store = ws.store()
        try:
            with pytest.raises(EndpointUnavailable):
                asyncio.run(run_index(ws.docs_dir, store, ws.settings, _FailingReports(),
                                      make_embedder(ws.settings), labeler=ws.policy.labels_for))
            assert store.get_meta("revoking") == "1"
        finally:
            store.close()
        view = load_graph(svc.store)
        assert svc.store.generation == generation + 1 and not dead & set(view.units)
        assert used <= set(view.reports)  # the old reports are still stored, not served
        for principal in ("admin", "staff", "board"):  # `forbidden` covers deleted documents
            check_principal(svc, base_policy, principal, docs, queries=QUERIES[1:3],
                            findings=principal == "admin", entity_sample=30)
        with svc.context("admin") as ctx:
            served = asyncio.run(ctx.reader.reports(sorted(used)))
        for cid in sorted(used):
            report = served.get(cid)
            assert report is None or (report != view.reports[cid]
                                      and not dead & set(report.text_unit_ids)), cid
        build_index(open_workspace(docs, index_dir=index_dir))  # regeneration catches up
        assert not any(dead & set(r.text_unit_ids) for r in load_graph(svc.store).reports.values())
        check_principal(svc, base_policy, "admin", docs, queries=QUERIES[1:2], findings=False,
                        entity_sample=20)
    finally:
        svc.close()


def test_between_a_deletion_and_its_regeneration_no_count_includes_deleted_members(
        leak_index, base_policy, tmp_path):
    """Issue 30, finding 10: with the gate's stale check removed (canopy/store/rows.py) every ACL
    and incremental test still passed. Between a deletion's revocation commit and its
    regeneration, a community whose members came partly from the deleted document is stale:
    its size, as drill_down and the report cards give it, counts only the members that still
    exist for the caller (not its stored size, which counts members known only through the
    deleted text); the same for a caller who reads everything."""
    docs, index_dir = fresh_copy(leak_index, tmp_path)
    gone = ("restricted/board/zephyr.md", "restricted/board/island.md")
    # a document whose names occur nowhere else: its communities exist only through its text
    (docs / gone[1]).write_text(
        "# Island notes\n\nTobiah Fernweather met Quillon Ashgrove at Marrowhaven Quay. "
        "Quillon Ashgrove and Tobiah Fernweather founded Brackenmoor Salvage at Marrowhaven "
        "Quay. Brackenmoor Salvage hired Ysolde Penhallow of Marrowhaven Quay.\n",
        encoding="utf-8")
    build_index(open_workspace(docs, index_dir=index_dir))
    svc = service_for(docs, index_dir)
    try:
        before = load_graph(svc.store)
        dead = {u.id for u in before.units.values() if before.documents[u.document_id].path in gone}
        only_dead = {e.id for e in before.entities.values() if set(e.text_unit_ids) <= dead}
        touched = {c.id for c in before.communities.values() if only_dead & set(c.entity_ids)}
        # communities that exist only through the deleted text: none of them is served at all
        all_dead = {c.id for c in before.communities.values() if set(c.entity_ids) <= only_dead}
        assert only_dead and touched and all_dead
        for path in gone:
            (docs / path).unlink()
        ws = open_workspace(docs, index_dir=index_dir)
        store = ws.store()
        try:
            with pytest.raises(EndpointUnavailable):
                asyncio.run(run_index(ws.docs_dir, store, ws.settings, _FailingReports(),
                                      make_embedder(ws.settings), labeler=ws.policy.labels_for))
        finally:
            store.close()
        checked = 0
        for principal in ("admin", "board", "staff"):
            with svc.context(principal) as ctx:
                reader = ctx.reader
                rows = reader.community_rows(touched)
                assert all(r.gate.stale for r in rows.values())
                for cid in sorted(touched):
                    members = reader.members(cid)
                    assert not only_dead & set(members), (principal, cid)
                    assert reader.visible_size(cid) == len(members), (principal, cid)
                    checked += bool(members)
                states = reader.community_states(all_dead)
                assert all(st == State.NONE for st in states.values()), (principal, states)
                served = reader.community_states(reader.inventory.community_ids())
                assert reader.served_report_count() == sum(1 for st in served.values() if st)
                assert not all_dead & {c for c, st in served.items() if st}

            async def sizes(who: str = principal) -> dict[str, int]:
                async with Client(build_server(svc, principal_name=who)) as client:
                    out = {}
                    for cid in sorted(touched):
                        got = await client.call_tool("drill_down", {"community_id": cid})
                        if not got.is_error:
                            out[cid] = got.structured_content["community"]["size"]
                    return out

            got = asyncio.run(sizes())
            assert not all_dead & set(got), principal  # answered like a missing id
            for cid, size in got.items():
                with svc.context(principal) as ctx:
                    assert size == len(ctx.reader.members(cid)), (principal, cid)
        assert checked  # some touched community still has members: the check is not vacuous
    finally:
        svc.close()


def test_revoking_a_label_and_relabelling_take_effect(leak_index, base_policy, tmp_path):
    """A principal loses a label (canopy.toml edited, index updated): the documents under it
    vanish for them. Then rules move documents to other labels (relabel, no re-extraction)."""
    docs, index_dir = fresh_copy(leak_index, tmp_path)
    revoked = Policy(dict(base_policy.groups), {**base_policy.principals, "board": ["staff"]})
    (docs / "canopy.toml").write_text(revoked.toml(), encoding="utf-8")
    result = build_index(open_workspace(docs, index_dir=index_dir))
    assert result.stats["units_extracted"] == 0
    svc = service_for(docs, index_dir)
    try:
        check_principal(svc, revoked, "board", docs, queries=QUERIES[1:3], findings=False,
                        entity_sample=30)
    finally:
        svc.close()
    moved = Policy({"board": ["hr"], "hr": ["board"], "legal": ["lab"], "lab": ["legal"]},
                   revoked.principals)
    (docs / "canopy.toml").write_text(moved.toml(), encoding="utf-8")
    result = build_index(open_workspace(docs, index_dir=index_dir))
    assert result.stats["units_extracted"] == 0
    svc = service_for(docs, index_dir)
    try:
        for principal in ("counsel", "staff"):
            check_principal(svc, moved, principal, docs, queries=QUERIES[1:4], findings=False,
                            entity_sample=30)
    finally:
        svc.close()


def test_a_grouped_top_leaks_nothing_and_hides_no_readable_child(leak_index, base_policy, tmp_path):
    """The top bounded to two communities: small components of restricted documents are grafted
    under top-level communities that also hold public entities. Such a parent reaches staff as a
    view (never its canonical report), every community staff may read in full is still served in
    full, and no canary leaks through any tool."""
    docs, index_dir = fresh_copy(leak_index, tmp_path)
    (docs / "canopy.toml").write_text(base_policy.toml() + "\n[communities]\nmax_top_level = 2\n",
                                      encoding="utf-8")
    build_index(open_workspace(docs, index_dir=index_dir), full=True)
    svc = service_for(docs, index_dir)
    try:
        g, readable = readable_units(svc, "staff")
        tops = [c for c in g.communities.values() if c.parent is None]
        assert len(tops) == 2
        mixed = [c.id for c in tops if readable & set(g.reports[c.id].text_unit_ids)
                 and not set(g.reports[c.id].text_unit_ids) <= readable]
        assert mixed, "no top-level community mixes restricted and public sources"
        whole = [cid for cid, r in g.reports.items() if set(r.text_unit_ids) <= readable]
        with svc.context("staff") as ctx:
            states = ctx.reader.community_states([*mixed, *whole])
        assert all(states[cid] == State.VIEW for cid in mixed)
        assert all(states[cid] == State.FULL for cid in whole)
        check_principal(svc, base_policy, "staff", docs, queries=QUERIES[1:3], findings=False,
                        entity_sample=10)
    finally:
        svc.close()


def test_randomized_policies(leak_index, tmp_path):
    """Seeded random label assignments and principals (relabelling the same index)."""
    _randomized(leak_index, tmp_path, seeds=[7], principals=2, queries=QUERIES[1:3])


@pytest.mark.slow
def test_randomized_policies_sweep(leak_index, tmp_path):
    _randomized(leak_index, tmp_path, seeds=[1, 2, 3, 4, 5], principals=4, queries=QUERIES,
                findings=True, entity_sample=None)


def _randomized(leak_index: tuple[Path, Path], tmp_path: Path, *, seeds: list[int], principals: int,
                queries: list[str], findings: bool = False, entity_sample: int | None = 25) -> None:
    docs, index_dir = fresh_copy(leak_index, tmp_path)
    for seed in seeds:
        rng = random.Random(seed)
        policy = random_policy(rng, principals)
        (docs / "canopy.toml").write_text(policy.toml(), encoding="utf-8")
        result = build_index(open_workspace(docs, index_dir=index_dir))
        assert result.stats["units_extracted"] == 0
        svc = service_for(docs, index_dir)
        try:
            for principal in sorted(policy.principals):
                if principal == "admin":
                    continue
                check_principal(svc, policy, principal, docs, queries=queries, findings=findings,
                                entity_sample=entity_sample, seed=seed)
        finally:
            svc.close()


# ---- claims: a quote is served only with its unit ---------------------------------------------

CLAIM_DOCS = {
    "public/suppliers.md": "Helio Cells Ltd makes battery cells in Sheffield for Maria Okafor.\n"
                           "Maria Okafor buys cells from Helio Cells Ltd.\n",
    # Both entities of this claim are public: only its unit is restricted.
    "restricted/legal/suit.md": "Helio Cells Ltd sued Maria Okafor on 14 January 2025 under "
                                "docket CANARY-d41e.\n",
}


def test_a_claim_quoted_from_a_restricted_unit_is_not_served_to_a_caller_who_cannot_read_it(
    tmp_path: Path, fake_openai: Any
) -> None:
    """Claims are gated by their own unit, not by their entities: `staff` reads both entities
    (from the public document) but not the unit the claim and its quote come from, so neither
    local_search nor drill_down nor search shows the claim, its quote, date or id. `admin`, who
    reads the unit, is shown all of it (the check is not vacuous)."""
    docs = tmp_path / "docs"
    for path, text in CLAIM_DOCS.items():
        (docs / path).parent.mkdir(parents=True, exist_ok=True)
        (docs / path).write_text(text, encoding="utf-8")
    (docs / "canopy.toml").write_text(
        '[acl]\ndefault = ["staff"]\n\n[[acl.rules]]\nglob = "restricted/legal/**"\n'
        'labels = ["legal"]\n\n[acl.principals]\nadmin = ["staff", "legal"]\nstaff = ["staff"]\n',
        encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "index",
                        extract={"claims": True, "max_gleanings": 0},
                        llm={"base_url": fake_openai.base_url, "max_retries": 0})
    build_index(ws)
    svc = CanopyService(ws)
    try:
        claims = load_graph(svc.store).claims.values()
        secret = [c for c in claims if "CANARY-d41e" in c.quote]
        assert secret and secret[0].start_date == "2025-01-14"
        secret_ids = {c.id for c in secret}

        async def outputs(principal: str) -> str:
            calls = [("local_search", {"query": "What did Helio Cells Ltd do in January 2025?"}),
                     ("local_search", {"query": "Helio Cells Ltd and Maria Okafor"}),
                     ("search", {"query": "What did Helio Cells Ltd do to Maria Okafor?"}),
                     ("drill_down", {"entity": "Helio Cells Ltd", "limit": 100}),
                     ("drill_down", {"entity": "Maria Okafor", "limit": 100})]
            seen: list[str] = []
            async with Client(build_server(svc, principal_name=principal)) as client:
                for name, args in calls:
                    result = await client.call_tool(name, args)
                    assert not result.is_error, (principal, name, text_of(result))
                    seen += [text_of(result), json.dumps(result.structured_content)]
            return "\n".join(seen)

        admin = asyncio.run(outputs("admin"))
        assert "CANARY-d41e" in admin and "2025-01-14" in admin
        assert secret_ids <= set(re.findall(r"cl-[0-9a-f]+", admin))
        staff = asyncio.run(outputs("staff"))
        for token in ("canary-d41e", "docket", " sued", "2025-01-14", *secret_ids):
            assert token not in staff.lower(), (token, _context(staff.lower(), token))
        assert "Maria Okafor" in staff  # the entities themselves are served
    finally:
        svc.close()
