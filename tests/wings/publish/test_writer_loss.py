"""Published generations and replicas when the writer stops publishing or dies (issue 30).

The revocation bound (docs/deployment.md) counts from a manifest being written: every replica
honours a published deletion within `[publish] revocation_bound_s` of it, and one that cannot
confirm within the bound that it serves the newest manifest refuses (/healthz 503). Here the
writer, `canopy watch --publish` in a process of its own, is killed with SIGKILL in the middle
of an update that deletes a canary, and a publish is cut off between its uploads and its
manifest. Whatever the moment: a replica serves only complete generations and stays
answerable while the store answers (nothing newer is published: what it serves is the newest
state there is); the restarted writer publishes what it committed, and the replica follows
within the bound; with the store gone too, the replica refuses within the bound. A
restriction (a policy edit: revocation for some) published by a writer killed the same way is
honoured within the bound of its restarted writer's manifest, for a restricted canary that the
principal who may read it still finds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from canopy.errors import IndexStale
from canopy.server.runtime import build_index, open_workspace
from canopy.server.wings.publish.location import Location, open_location
from canopy.server.wings.publish.manifest import BLOBS, MANIFESTS
from canopy.server.wings.publish.replica import ReplicaSlot, build_replica
from canopy.server.wings.publish.replica_cache import materialize
from canopy.server.wings.publish.snapshot import stage_snapshot
from canopy.server.wings.publish.writer import collect_garbage, newest_manifest, publish_staged
from canopy.settings import load_settings
from tests.conftest import EXAMPLES, REPO, wait_until

BOUND_S = 2.0
CANARY = "Quillmarsh"
CANARY_DOC = """# Supplier Profile: Quillmarsh Instruments

Quillmarsh Instruments makes torque sensors for Northwind Robotics. Zephyrine Brandvold of
Quillmarsh Instruments signed the sensor contract with Northwind Robotics in 2023.
"""
EDIT = "\n\nHelio Cells Ltd opened a second plant in Tampere in 2025.\n"


def corpus(root: Path) -> Path:
    docs = root / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs / "suppliers")
    (docs / "suppliers" / "quillmarsh.md").write_text(CANARY_DOC, encoding="utf-8")
    return docs


def start_writer(docs: Path, index: Path, uri: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env.update(PYTHONPATH=str(REPO), CANOPY_STORAGE__TIDY="inline")
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "canopy.server.cli", "watch", str(docs), "--index-dir",
             str(index), "--publish", uri, "--debounce", "0.1"],
            cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def newest_seq(uri: str) -> int:
    newest = newest_manifest(open_location(uri))
    return newest.seq if newest is not None else 0


def documents_served(slot: ReplicaSlot) -> set[str]:
    """The documents of the generation the replica answers from (IndexStale when it would
    refuse), read from its database."""
    import sqlite3

    db = sqlite3.connect(f"file:{slot.service.ws.index_dir / 'canopy.sqlite'}?mode=ro",
                         uri=True)
    try:
        return {p for (p,) in db.execute("SELECT path FROM documents")}
    finally:
        db.close()


def serves_canary(slot: ReplicaSlot) -> bool:
    return "suppliers/quillmarsh.md" in documents_served(slot)


def replica(uri: str, cache: Path) -> ReplicaSlot:
    local = load_settings(None, None, publish={"revocation_bound_s": BOUND_S, "poll_s": 0.2})
    return build_replica(uri, local, cache).start()


def test_a_writer_killed_mid_update_leaves_replicas_on_complete_generations_and_its_restart_catches_up(  # noqa: E501
        tmp_path: Path) -> None:
    docs, index, uri = corpus(tmp_path), tmp_path / "index", str(tmp_path / "published")
    log = tmp_path / "writer.log"
    writer = start_writer(docs, index, uri, log)
    slot = replica(uri, tmp_path / "cache")
    try:
        assert wait_until(lambda: slot.health()[0], timeout=90), log.read_text()
        first = newest_seq(uri)
        assert serves_canary(slot)

        # The deletion, and the writer killed while it applies and publishes it.
        (docs / "suppliers" / "quillmarsh.md").unlink()
        time.sleep(0.4)
        kill(writer)
        # Nothing is torn: the replica serves a complete generation, confirmed (the store
        # answers and holds nothing newer than it), before and after the bound runs out.
        for _ in range(2):
            assert wait_until(lambda: slot.health()[1]["manifest"] == newest_seq(uri),
                              timeout=BOUND_S + 2)
            assert slot.health()[0]
            assert documents_served(slot)  # its files open and read
            time.sleep(BOUND_S)
        # The restarted writer publishes what it had committed (and finishes the update):
        # the replica drops the canary within the bound of that manifest.
        writer = start_writer(docs, index, uri, log)
        assert wait_until(lambda: newest_seq(uri) > first and not _holds(uri, CANARY),
                          timeout=90), log.read_text()
        published = time.monotonic()
        assert wait_until(lambda: not serves_canary(slot), timeout=BOUND_S + 2)
        assert time.monotonic() - published <= BOUND_S + 2

        # Killed again, idle; then the store goes away too: the replica cannot confirm, and
        # refuses within the bound, until the store is back.
        kill(writer)
        assert slot.health()[0]
        moved = tmp_path / "moved"
        Path(uri).rename(moved)
        lost = time.monotonic()
        assert wait_until(lambda: not slot.health()[0], timeout=BOUND_S + 2)
        assert time.monotonic() - lost <= BOUND_S + 1
        with pytest.raises(IndexStale, match="cannot confirm that its index is current"):
            _ = slot.service
        moved.rename(uri)
        assert wait_until(lambda: slot.health()[0], timeout=5)
    finally:
        if writer.poll() is None:
            kill(writer)
        slot.close()


def _holds(uri: str, document: str) -> bool:
    """Whether the newest published generation has a document whose path holds `document`'s
    name (read from its database as a replica would)."""
    import sqlite3
    import tempfile

    location = open_location(uri)
    newest = newest_manifest(location)
    if newest is None:
        return True
    with tempfile.TemporaryDirectory() as cache:
        folder, _ = materialize(location, newest, Path(cache))
        db = sqlite3.connect(folder / "canopy.sqlite")
        try:
            return any(document.lower() in p for (p,) in db.execute("SELECT path FROM documents"))
        finally:
            db.close()


class _DiesAfter(Location):
    """The writer's view of the URI, dying (an exception no code catches) after `puts`
    uploads: a publish cut off between its blobs and its manifest."""

    def __init__(self, inner: Location, puts: int) -> None:
        super().__init__(inner.uri, inner._store)
        self.left = puts

    def put(self, path: str, data: Any, *, create: bool = False) -> None:
        if self.left == 0:
            raise KeyboardInterrupt("the writer died")
        self.left -= 1
        super().put(path, data, create=create)


def test_a_publish_cut_off_before_its_manifest_changes_nothing_replicas_see(
        tmp_path: Path) -> None:
    docs, uri = corpus(tmp_path), str(tmp_path / "published")
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    location = open_location(uri)
    assert publish_staged(location, stage_snapshot(ws.index_dir, tmp_path / "s1"), ws.settings,
                          grace_s=60).outcome == "published"
    slot = build_replica(uri, load_settings(None, None, publish={"revocation_bound_s": BOUND_S}),
                         tmp_path / "cache")
    try:
        assert slot.check()
        (docs / "suppliers" / "quillmarsh.md").unlink()
        build_index(ws)
        before = {o.path for o in location.list(BLOBS)}
        with pytest.raises(KeyboardInterrupt):
            publish_staged(_DiesAfter(location, 2), stage_snapshot(ws.index_dir, tmp_path / "s2"),
                           ws.settings, grace_s=60)
        orphans = {o.path for o in location.list(BLOBS)} - before
        assert len(orphans) == 2 and len(location.list(MANIFESTS)) == 1
        # Nothing newer is published: the replica confirms what it serves.
        assert slot.check() and slot.health()[1]["manifest"] == 1 and serves_canary(slot)
        # Blobs no manifest names are collected after the grace period like any other.
        assert collect_garbage(location, grace_s=60).blobs == 0
        assert collect_garbage(location, grace_s=60, now=time.time() + 61).blobs == 2
        assert {o.path for o in location.list(BLOBS)} == before
        # The next publish (a restarted writer's) goes out whole and complete.
        assert publish_staged(location, stage_snapshot(ws.index_dir, tmp_path / "s3"),
                              ws.settings, grace_s=60).outcome == "published"
        assert slot.check() and slot.health()[1]["manifest"] == 2 and not serves_canary(slot)
    finally:
        slot.close()


# ---- a restriction published by a writer that dies (a restricted canary) ---------------------

ACL = """[acl]
default = ["staff"]

[acl.principals]
staff = ["staff"]
buyer = ["staff", "procurement"]
"""
RESTRICTED = ACL + """
[[acl.rules]]
glob = "suppliers/quillmarsh.md"
labels = ["procurement"]
"""
QUESTION = "Who makes torque sensors for Northwind Robotics, and who signed the sensor contract?"


def canary_seen(slot: ReplicaSlot, who: str) -> bool:
    """Whether the replica's answers to `who` (basic_search and local_search: text units,
    entities, relationships, reports) hold the canary; a refused call fails the test."""
    import asyncio

    from mcp import Client

    from canopy.server.mcp_app import build_server

    async def seen() -> bool:
        async with Client(build_server(slot, principal_name=who)) as client:
            out = []
            for tool, args in (("basic_search", {"query": QUESTION, "k": 8}),
                               ("local_search", {"query": QUESTION})):
                got = await client.call_tool(tool, args)
                assert not got.is_error, (who, tool, got.content)
                out += [getattr(b, "text", "") for b in got.content]
                out.append(str(got.structured_content))
        return CANARY in "\n".join(out)

    return asyncio.run(seen())


def test_a_restriction_the_dying_writer_leaves_unpublished_is_honoured_within_the_bound_of_its_restart(  # noqa: E501
        tmp_path: Path) -> None:
    """A policy edit restricts the canary document (revocation for some, not a deletion) and
    the writer is killed with SIGKILL while it applies and publishes it. Whatever the moment:
    the replica stays on a complete generation, confirmed, and answers; the restarted writer
    publishes the restriction and, within the bound of that, `staff` (who lost the document)
    meets the canary in no answer while `buyer` (who may read it) still does."""
    docs, index, uri = corpus(tmp_path), tmp_path / "index", str(tmp_path / "published")
    (docs / "canopy.toml").write_text(ACL, encoding="utf-8")
    log = tmp_path / "writer.log"
    writer = start_writer(docs, index, uri, log)
    slot = replica(uri, tmp_path / "cache")
    try:
        assert wait_until(lambda: slot.health()[0], timeout=90), log.read_text()
        assert canary_seen(slot, "staff") and canary_seen(slot, "buyer")  # not vacuous

        (docs / "canopy.toml").write_text(RESTRICTED, encoding="utf-8")
        time.sleep(0.4)
        kill(writer)
        # A complete generation, confirmed, answering (the restriction or the state before it:
        # what the writer had not published, no replica can know of).
        assert wait_until(lambda: slot.health()[1]["manifest"] == newest_seq(uri),
                          timeout=BOUND_S + 2)
        assert slot.health()[0] and canary_seen(slot, "buyer")

        writer = start_writer(docs, index, uri, log)
        # `canopy watch --publish` says it is watching once its first update (this one,
        # resumed) has committed and been published: the manifest is written by then.
        assert wait_until(lambda: log.read_text().count("watching") >= 2, timeout=90), (
            log.read_text())
        published = time.monotonic()
        assert wait_until(lambda: not canary_seen(slot, "staff"), timeout=BOUND_S + 2)
        assert time.monotonic() - published <= BOUND_S + 2
        # The restarted writer may publish again meanwhile (its tidy, a second batch): the
        # replica then catches up within the same bound, always on a complete generation.
        assert wait_until(lambda: slot.health()[0]
                          and slot.health()[1]["manifest"] == newest_seq(uri),
                          timeout=BOUND_S + 2)
        assert canary_seen(slot, "buyer")
    finally:
        if writer.poll() is None:
            kill(writer)
        slot.close()
