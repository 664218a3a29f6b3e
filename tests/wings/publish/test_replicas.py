"""Published generations and stateless replicas (issue 13, items 1-2), on real engines: an
S3-compatible server (moto) on 127.0.0.1, a writer publishing with `canopy index --publish`, and
`canopy serve --http --index-uri` replicas as subprocesses; local-folder URIs in-process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from click.testing import CliRunner
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from canopy.acl.bearer_tokens import add_token
from canopy.errors import IndexMissing, IndexStale
from canopy.server.cli import main
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.wings.publish.location import open_location
from canopy.server.wings.publish.manifest import MANIFESTS, Manifest, blob_path, manifest_path
from canopy.server.wings.publish.publishing import publish_index
from canopy.server.wings.publish.replica import ReplicaSlot, build_replica
from canopy.server.wings.publish.replica_cache import materialize
from canopy.server.wings.publish.snapshot import stage_snapshot
from canopy.server.wings.publish.writer import collect_garbage, newest_manifest, publish_staged
from canopy.settings import load_settings
from tests.conftest import EXAMPLES, REPO, wait_until
from tests.net import free_port, wait_for_port
from tests.wings.publish import object_store
from tests.wings.publish.object_store import AWS

pytestmark = pytest.mark.anyio

s3, bucket = object_store.s3, object_store.bucket  # the fixtures of an S3 server

BOUND_S = 4.0  # the replicas' revocation bound in these tests
CANARY = "Quillmarsh"
CANARY_DOC = """# Supplier Profile: Quillmarsh Instruments

**Location:** Varrowby, Iceland
**Key account manager:** Zephyrine Brandvold

Quillmarsh Instruments makes torque sensors for Northwind Robotics. Zephyrine Brandvold of
Quillmarsh Instruments signed the sensor contract with Northwind Robotics in 2023.
"""
LATER = "Ostravel"
LATER_DOC = """# Supplier Profile: Ostravel Castings

Ostravel Castings pours the aluminium frames of Project Kestrel in Brno. Its plant manager,
Ludmila Ostravel, joined the Kestrel supplier review in 2024.
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def small_corpus(root: Path) -> Path:
    """The examples' suppliers (fast to index) plus the canary supplier."""
    docs = root / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs / "suppliers")
    (docs / "suppliers" / "quillmarsh.md").write_text(CANARY_DOC, encoding="utf-8")
    return docs


def text_of(result: Any) -> str:
    """Everything a tool result says, but the query it echoes."""
    structured = {k: v for k, v in (result.structured_content or {}).items() if k != "query"}
    return json.dumps([c.text for c in result.content]) + json.dumps(structured)


def start_replica(uri: str, s3: str, cache: Path, log: Path, *extra: str,
                  cwd: Path = REPO) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env.update(AWS, AWS_ENDPOINT_URL=s3, PYTHONPATH=str(REPO), CANOPY_PUBLISH__POLL_S="0.5",
               CANOPY_PUBLISH__REVOCATION_BOUND_S=str(BOUND_S),
               CANOPY_PUBLISH__CACHE_DIR=str(cache))
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "canopy.server.cli", "serve", "--http", "--port", str(port),
             "--index-uri", uri, *extra], cwd=cwd, env=env, stdout=out,
            stderr=subprocess.STDOUT)
    return proc, port


def health(port: int) -> dict[str, Any]:
    try:
        r = httpx2.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    except httpx2.HTTPError:
        return {"ready": False}
    return dict(r.json())


async def answers(port: int, token: str | None = None) -> str:
    """What basic_search and local_search return for the canaries over MCP, and basic_search
    over the REST API, as one string."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://127.0.0.1:{port}"
    async with (httpx2.AsyncClient(headers=headers, timeout=60) as http,
                Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client):
        basic = await client.call_tool("basic_search", {"query": f"{CANARY} {LATER}", "k": 5})
        local = await client.call_tool("local_search",
                                       {"query": f"Who runs {CANARY} Instruments?"})
        assert not basic.is_error and not local.is_error, text_of(basic) + text_of(local)
        rest = await http.post(f"{url}/api/v1/basic_search",
                               json={"query": f"{CANARY} {LATER}", "k": 5})
        assert rest.status_code == 200, rest.text
        body = {k: v for k, v in rest.json().items() if k != "query"}
        return text_of(basic) + text_of(local) + json.dumps(body)


async def writer_index(docs: Path, index: Path, uri: str) -> str:
    """`canopy index DOCS --publish URI`, in this process (on a thread: it runs its own event
    loop); its output."""
    def run() -> str:
        result = CliRunner().invoke(main, ["index", str(docs), "--index-dir", str(index),
                                           "--publish", uri])
        assert result.exit_code == 0, result.output
        return result.output

    return await anyio.to_thread.run_sync(run)


async def test_two_replicas_over_s3_follow_an_update_and_a_deletion_within_the_bound(
        tmp_path: Path, s3: str, bucket: str) -> None:
    """Both serve MCP and the REST API; the second asks for bearer tokens from a token file in
    its working folder (a replica has no documents folder: no warning about indexing it)."""
    docs, index = small_corpus(tmp_path), tmp_path / "index"
    token = add_token(tmp_path / "tokens.jsonl", "alice")
    # The replicas start first (nothing is published yet: they answer so, and keep checking),
    # so their start-up overlaps the writer's first build.
    replicas = [start_replica(bucket, s3, tmp_path / "cache1", tmp_path / "replica1.log"),
                start_replica(bucket, s3, tmp_path / "cache2", tmp_path / "replica2.log",
                              "--tokens", "tokens.jsonl", cwd=tmp_path)]
    tokens = {replicas[1][1]: token}

    async def answers_on(port: int) -> str:
        return await answers(port, tokens.get(port))

    try:
        out = await writer_index(docs, index, bucket)
        assert f"to {bucket} as manifest 1" in out
        for proc, port in replicas:
            wait_for_port(port, proc, timeout=60)
            assert wait_until(lambda p=port: health(p).get("ready"), timeout=30)
        for _, port in replicas:  # before: the canary is served, the later document is not
            seen = await answers_on(port)
            assert CANARY in seen and LATER not in seen
        guarded = f"http://127.0.0.1:{replicas[1][1]}"
        async with httpx2.AsyncClient(timeout=10) as http:
            assert (await http.post(f"{guarded}/api/v1/basic_search",
                                    json={"query": CANARY})).status_code == 401
            # Stateless sessions: no stream to open at GET, answered at once.
            got = await http.get(f"http://127.0.0.1:{replicas[0][1]}/mcp",
                                 headers={"Accept": "text/event-stream"})
            assert got.status_code == 405 and got.headers["allow"] == "POST"
            web = await http.get(f"http://127.0.0.1:{replicas[0][1]}/ui/api/communities")
            assert web.status_code == 200 and web.json()["index"] == "team-docs", web.text
            assert web.json()["roots"]

        # An update: a new supplier appears on both replicas.
        (docs / "suppliers" / "ostravel.md").write_text(LATER_DOC, encoding="utf-8")
        assert "as manifest 2" in await writer_index(docs, index, bucket)
        for _, port in replicas:
            assert wait_until(lambda p=port: health(p).get("manifest") == 2, timeout=BOUND_S + 4)
            assert LATER in await answers_on(port)

        # A deletion: gone from both within the bound. Each replica is asked once a second
        # from the moment the manifest is written, and must have stopped serving the
        # document by bound + margin.
        (docs / "suppliers" / "quillmarsh.md").unlink()
        out = await writer_index(docs, index, bucket)
        # The deletion's own generation is published first, then the update's.
        assert "deletions and relabels first: Published generation" in out
        assert "as manifest 3" in out and "as manifest 4" in out
        published = time.monotonic()
        pending = {port for _, port in replicas}
        while pending and time.monotonic() - published < BOUND_S + 4:
            for port in sorted(pending):
                if CANARY not in await answers_on(port):
                    pending.discard(port)
            await anyio.sleep(0.2)
        assert not pending, f"replicas on {pending} still serve the deleted document"
        for _, port in replicas:
            assert wait_until(lambda p=port: health(p).get("manifest") == 4, timeout=BOUND_S)
            seen = await answers_on(port)
            assert CANARY not in seen and LATER in seen
    finally:
        for proc, _ in replicas:
            proc.terminate()
            proc.wait(10)
    assert "now serves generation" in (tmp_path / "replica1.log").read_text()
    second = (tmp_path / "replica2.log").read_text()
    assert "bearer tokens required" in second and "inside the documents folder" not in second


# ---- local folders, in-process replicas ----------------------------------------------------------


def replica_slot(uri: str, cache: Path, bound_s: float = BOUND_S) -> ReplicaSlot:
    local = load_settings(None, None, publish={"revocation_bound_s": bound_s, "poll_s": 60})
    slot = build_replica(uri, local, cache)
    assert slot.check()
    return slot


ACL = """
[acl]
default = ["public"]
[[acl.rules]]
glob = "suppliers/quillmarsh.md"
labels = ["sensors"]
[acl.principals]
alice = ["public", "sensors"]
bob = ["public"]
"""


async def test_a_local_folder_uri_serves_a_policy_revocation_at_the_next_check(
        tmp_path: Path) -> None:
    """A policy edit that changes no document is published too, and a replica applies it
    (alice loses the label) at its next check."""
    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    (docs / "canopy.toml").write_text(ACL, encoding="utf-8")
    ws = open_workspace(docs, tmp_path / "index")
    await anyio.to_thread.run_sync(build_index, ws)
    assert publish_index(ws, uri).seq == 1
    slot = replica_slot(uri, tmp_path / "cache")
    try:
        server = build_server(slot, principal_name="alice")
        async with Client(server) as client:
            before = await client.call_tool("basic_search", {"query": CANARY, "k": 3})
        assert CANARY in text_of(before)

        (docs / "canopy.toml").write_text(ACL.replace('alice = ["public", "sensors"]',
                                                      'alice = ["public"]'), encoding="utf-8")
        ws = open_workspace(docs, tmp_path / "index")
        # No document changed: the same generation, under another policy.
        assert (await anyio.to_thread.run_sync(build_index, ws)).stats.get("noop")
        result = publish_index(ws, uri)
        assert (result.outcome, result.seq) == ("published", 2)
        async with Client(server) as client:  # not checked yet: generation 1 is still newest
            assert CANARY in text_of(await client.call_tool("basic_search",
                                                            {"query": CANARY, "k": 3}))
            assert slot.check()
            after = await client.call_tool("basic_search", {"query": CANARY, "k": 3})
        assert not after.is_error and CANARY not in text_of(after)
        assert publish_index(ws, uri).outcome == "unchanged"
    finally:
        slot.close()


def test_a_replica_that_cannot_confirm_within_the_bound_refuses_then_recovers(
        tmp_path: Path) -> None:
    docs, uri = small_corpus(tmp_path), tmp_path / "published"
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    publish_index(ws, str(uri))
    slot = replica_slot(str(uri), tmp_path / "cache", bound_s=0.5)
    try:
        assert slot.service is not None
        uri.rename(tmp_path / "moved")  # the store is gone: checks fail
        assert not slot.check()
        time.sleep(0.6)
        with pytest.raises(IndexStale, match="cannot confirm that its index is current"):
            _ = slot.service
        assert slot.health()[0] is False
        (tmp_path / "moved").rename(uri)
        assert slot.check()
        assert slot.service is not None and slot.health()[0]
    finally:
        slot.close()


def test_a_replica_with_nothing_published_says_so(tmp_path: Path) -> None:
    local = load_settings(None, None)
    slot = build_replica(str(tmp_path / "empty"), local, tmp_path / "cache")
    assert not slot.check()
    with pytest.raises(IndexMissing, match="has not loaded a published index yet"):
        _ = slot.service


def test_garbage_collection_keeps_the_newest_generation_and_every_file_it_names(
        tmp_path: Path) -> None:
    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    publish_index(ws, uri)
    (docs / "suppliers" / "quillmarsh.md").unlink()
    build_index(ws)
    publish_index(ws, uri)
    location = open_location(uri)
    assert len(location.list(MANIFESTS)) == 2
    waiting = collect_garbage(location, grace_s=3600)  # within the grace period
    assert (waiting.manifests, waiting.blobs) == (0, 0)
    second = Manifest.model_validate_json(location.get(manifest_path(2)))
    assert waiting.next_due == pytest.approx(second.published_at + 3600)  # when 1 expires
    first = Manifest.model_validate_json(location.get(manifest_path(1)))
    newest = newest_manifest(location)
    assert newest is not None and newest.seq == 2
    only_first = {b for f in first.files.values() for b in f.blobs()} - {
        b for f in newest.files.values() for b in f.blobs()}
    assert only_first  # a Lance file at least
    deleted = collect_garbage(location, grace_s=0, now=time.time() + 1)
    assert (deleted.manifests, deleted.blobs, deleted.next_due) == (1, len(only_first), None)
    assert [o.path for o in location.list(MANIFESTS)] == [manifest_path(2)]
    with pytest.raises(FileNotFoundError):
        location.get(blob_path(sorted(only_first)[0]))
    folder, _ = materialize(location, newest, tmp_path / "cache")  # still complete
    assert (folder / "canopy.sqlite").is_file()


def test_an_older_snapshot_is_never_published_after_a_newer_one(tmp_path: Path) -> None:
    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    older = stage_snapshot(ws.index_dir, tmp_path / "older")
    (docs / "suppliers" / "quillmarsh.md").unlink()
    build_index(ws)
    newer = stage_snapshot(ws.index_dir, tmp_path / "newer")
    location = open_location(uri)
    assert publish_staged(location, newer, ws.settings, grace_s=60).outcome == "published"
    late = publish_staged(location, older, ws.settings, grace_s=60)
    assert (late.outcome, late.seq) == ("superseded", 1)
    newest = newest_manifest(location)
    assert newest is not None and newest.generation == newer.generation


def test_the_manifest_holds_no_credentials_and_blobs_are_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANOPY_LLM_API_KEY", "sk-canary-secret")
    monkeypatch.setenv("CANOPY_AUTH__JWT_KEY", "jwt-canary-secret")
    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    publish_index(ws, uri)
    location = open_location(uri)
    raw = location.get(manifest_path(1))
    assert b"canary-secret" not in raw and b'"auth"' not in raw
    manifest = Manifest.model_validate_json(raw)
    db = manifest.files["canopy.sqlite"]
    assert db.pages and db.packs
    (Path(uri) / blob_path(db.packs[0])).write_bytes(b"tampered")
    with pytest.raises(ValueError, match="does not match its content"):
        materialize(location, manifest, tmp_path / "cache")


def test_publish_without_an_index_or_a_uri_says_what_to_do(tmp_path: Path) -> None:
    docs = small_corpus(tmp_path)
    result = CliRunner().invoke(main, ["publish", str(docs), "--index-dir",
                                       str(tmp_path / "index"), "--to", str(tmp_path / "p")])
    assert result.exit_code != 0 and "no committed index" in result.output
    build_index(open_workspace(docs, tmp_path / "index"))
    result = CliRunner().invoke(main, ["publish", str(docs), "--index-dir",
                                       str(tmp_path / "index")])
    assert result.exit_code != 0 and "--to URI or set [publish] uri" in result.output


def test_the_deployment_example_runs_commands_and_options_canopy_has() -> None:
    """docs/deployment.md's compose file: the writer and replica commands name real options."""
    import click
    import yaml

    compose = yaml.safe_load((REPO / "examples" / "deployment" / "compose.yaml").read_text())
    commands = {name: svc["command"] for name, svc in compose["services"].items()
                if svc.get("command", [""])[0] == "canopy"}
    assert set(commands) == {"writer", "replica"}
    for argv in commands.values():
        command = main.get_command(click.Context(main), argv[1])
        assert command is not None, argv
        known = {o for p in command.params for o in p.opts}
        assert {a for a in argv if a.startswith("--")} <= known, argv
    assert "--index-uri" in commands["replica"] and "--publish" in commands["writer"]


def test_a_deletion_is_published_before_the_rest_of_its_update(tmp_path: Path) -> None:
    """`canopy index --publish` publishes the generation that applies deletions as soon as it
    commits (before extraction of the update's new text), then the update's own."""
    import sqlite3

    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    args = ["index", str(docs), "--index-dir", str(tmp_path / "index"), "--publish", uri]
    assert CliRunner().invoke(main, args).exit_code == 0
    (docs / "suppliers" / "quillmarsh.md").unlink()
    (docs / "suppliers" / "ostravel.md").write_text(LATER_DOC, encoding="utf-8")
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    location = open_location(uri)

    def paths(seq: int) -> set[str]:
        manifest = Manifest.model_validate_json(location.get(manifest_path(seq)))
        folder, _ = materialize(location, manifest, tmp_path / "cache")
        db = sqlite3.connect(folder / "canopy.sqlite")
        try:
            return {p for (p,) in db.execute("SELECT path FROM documents")}
        finally:
            db.close()

    revoked, updated = paths(2), paths(3)
    assert "suppliers/quillmarsh.md" not in revoked | updated
    assert "suppliers/ostravel.md" not in revoked and "suppliers/ostravel.md" in updated
    first, second = (Manifest.model_validate_json(location.get(manifest_path(s)))
                     for s in (2, 3))
    assert first.generation < second.generation


def test_a_superseded_generation_is_closed_and_deleted_after_its_drain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import canopy.server.wings.publish.replica

    docs, uri, cache = small_corpus(tmp_path), str(tmp_path / "published"), tmp_path / "cache"
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    publish_index(ws, uri)
    slot = replica_slot(uri, cache)
    try:
        (docs / "suppliers" / "quillmarsh.md").unlink()
        build_index(ws)
        publish_index(ws, uri)
        assert slot.check() and slot.health()[1]["manifest"] == 2
        folders = sorted(p.name for p in (cache / "generations").iterdir())
        assert folders == ["000000000001", "000000000002"]  # the old one drains first
        slot._close_drained()
        assert len(list((cache / "generations").iterdir())) == 2
        monkeypatch.setattr(canopy.server.wings.publish.replica, "_DRAIN_S", 0.0)
        slot._close_drained()
        assert [p.name for p in (cache / "generations").iterdir()] == ["000000000002"]
        newest = newest_manifest(open_location(uri))
        assert newest is not None
        # What the generation serves from: its files, its page map, its assembled database and
        # that map opened (the packs were read to assemble it, then deleted).
        assert {p.name for p in (cache / "blobs").iterdir()} == {
            b for f in newest.files.values() for b in f.cached_blobs()}
        ref = newest.files["canopy.sqlite"]
        assert {p.name for p in (cache / "databases").iterdir()} == {
            ref.sha256, f"{ref.sha256}.map", f"{ref.sha256}.pages"}
        assert slot.service.store.generation == newest.generation
    finally:
        slot.close()


def test_serve_needs_docs_or_an_index_uri_but_not_both(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(main, ["serve", "--http"])
    assert missing.exit_code == 2 and "Missing argument 'DOCS' (or --index-uri URI)" in (
        missing.output)
    both = runner.invoke(main, ["serve", str(tmp_path), "--http", "--index-uri", "s3://b/p"])
    assert both.exit_code == 2 and "--index-uri serves a published index" in both.output


def test_the_database_is_published_as_its_changed_pages_and_assembled_exactly(
        tmp_path: Path) -> None:
    """After the first publish, a one-document update sends the pages that changed (a fraction
    of the database) and a new page map; a replica holding the previous generation downloads
    only those, assembles the file byte for byte, and deletes the packs it read. A replica
    with an empty cache assembles the same file from all the packs."""
    # every example, not the suppliers alone: in a database of a few dozen pages one document
    # touches half of them (every table's last pages, the term statistics, the meta)
    docs, uri = tmp_path / "docs", str(tmp_path / "published")
    shutil.copytree(EXAMPLES, docs)
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    first_result = publish_index(ws, uri)
    location = open_location(uri)
    first = newest_manifest(location)
    assert first is not None and first.format == 3
    assert first_result.database_written == first_result.database_pages > 0
    cache = tmp_path / "cache"
    materialize(location, first, cache)
    (docs / "suppliers" / "later.md").write_text(LATER_DOC, encoding="utf-8")
    build_index(ws)
    result = publish_index(ws, uri)
    assert result.outcome == "published"
    assert 0 < result.database_written < result.database_pages / 2
    assert 0 < result.database_uploaded < first_result.database_uploaded
    second = newest_manifest(location)
    assert second is not None
    db = second.files["canopy.sqlite"]
    assert db.pages and set(first.files["canopy.sqlite"].packs) & set(db.packs)
    folder, fetched = materialize(location, second, cache)
    rebuilt = folder / "canopy.sqlite"
    assert rebuilt.stat().st_size == db.size  # and its sha256 was checked by materialize
    had = {g.sha256 for g in first.files.values()}
    others = sum({f.sha256: f.size for rel, f in second.files.items()
                  if rel != "canopy.sqlite" and f.sha256 not in had}.values())
    assert fetched == result.database_uploaded + others  # the new map and pack, not the rest
    assert not set(db.packs) & {p.name for p in (cache / "blobs").iterdir()}
    again, _ = materialize(location, second, tmp_path / "fresh-cache")  # from every pack
    assert again.joinpath("canopy.sqlite").read_bytes() == rebuilt.read_bytes()
    (Path(uri) / blob_path(db.packs[-1])).write_bytes(b"tampered")
    with pytest.raises(ValueError, match="does not match its content"):
        materialize(location, second, tmp_path / "third-cache")


def test_a_damaged_database_assembled_before_is_not_built_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A replica copies a new generation's unchanged pages from the database it assembled
    before. When that file was damaged on disk since (in a page the new generation keeps),
    the assembled file misses its sha256: the replica drops the damaged file and assembles
    the generation from the published pages alone, byte for byte what an empty cache gets."""
    docs, uri = small_corpus(tmp_path), str(tmp_path / "published")
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    publish_index(ws, uri)
    location = open_location(uri)
    first = newest_manifest(location)
    assert first is not None
    cache = tmp_path / "cache"
    materialize(location, first, cache)
    (docs / "suppliers" / "later.md").write_text(LATER_DOC, encoding="utf-8")
    build_index(ws)
    publish_index(ws, uri)
    second = newest_manifest(location)
    assert second is not None
    fresh_folder, _ = materialize(location, second, tmp_path / "fresh-cache")
    expected = fresh_folder.joinpath("canopy.sqlite").read_bytes()

    # A page the second generation keeps (the same record in both opened maps).
    from canopy.server.wings.publish.pagestore import PageMap

    old_ref, new_ref = first.files["canopy.sqlite"], second.files["canopy.sqlite"]
    old_map = PageMap.from_bytes((cache / "databases" / f"{old_ref.sha256}.pages").read_bytes())
    new_map = PageMap.from_bytes(
        (tmp_path / "fresh-cache" / "databases" / f"{new_ref.sha256}.pages").read_bytes())
    kept = [i for i in range(1, min(old_map.pages, new_map.pages))
            if old_map.record(i) == new_map.record(i)]
    assert kept
    before = cache / "databases" / old_ref.sha256
    before.chmod(0o644)
    with open(before, "r+b") as fh:
        fh.seek(kept[len(kept) // 2] * old_map.page_size + 200)
        fh.write(b"\xff" * 32)

    with caplog.at_level("WARNING", logger="canopy.server.wings.publish.replica_cache"):
        folder, fetched = materialize(location, second, cache)
    assert "assembling it from the published pages alone" in caplog.text
    assert folder.joinpath("canopy.sqlite").read_bytes() == expected
    assert not before.exists()  # the damaged file is not a source any more
    packs = sum((Path(uri) / blob_path(p)).stat().st_size for p in new_ref.packs)
    had = {b for f in first.files.values() for b in f.cached_blobs()}
    others = sum({b: (Path(uri) / blob_path(b)).stat().st_size for f in second.files.values()
                  for b in f.cached_blobs() if b not in had}.values())
    assert fetched == packs + others  # every pack, each once


def test_publishing_to_a_missing_bucket_or_a_dead_store_is_one_line(
        tmp_path: Path, s3: str, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`canopy index --publish`, `watch --publish` and `publish` to a bucket that does not
    exist: one line naming it, before any build; a store that does not answer: one line too."""
    docs = small_corpus(tmp_path)
    missing = f"s3://no-such-{uuid.uuid4().hex[:8]}/team-docs"
    bucket_name = missing[len("s3://"):].split("/")[0]
    expected = [f"Error: the bucket '{bucket_name}' of {missing} does not exist at {s3}: create "
                f"it (for example `aws s3 mb s3://{bucket_name}`) or correct the URI"]
    index_dir = tmp_path / "index"
    runner = CliRunner()
    for args in (["index", str(docs), "--index-dir", str(index_dir), "--publish", missing],
                 ["watch", str(docs), "--index-dir", str(index_dir), "--publish", missing]):
        result = runner.invoke(main, args)
        assert (result.exit_code, result.output.splitlines()) == (1, expected), result.output
    assert not (index_dir / "canopy.sqlite").exists()  # nothing was built first
    build_index(open_workspace(docs, index_dir))
    result = runner.invoke(main, ["publish", str(docs), "--index-dir", str(index_dir),
                                  "--to", missing])
    assert (result.exit_code, result.output.splitlines()) == (1, expected), result.output

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing there
    result = runner.invoke(main, ["publish", str(docs), "--index-dir", str(index_dir),
                                  "--to", bucket])
    assert result.exit_code == 1 and len(result.output.splitlines()) == 1, result.output
    assert result.output.startswith(f"Error: the object store of {bucket} failed: ")
