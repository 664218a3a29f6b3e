"""Deleted text leaves published storage and replicas' caches too, and replicas trust nothing
they cached (issue 34, items 1-2).

A deleted document's canary is looked for in every byte the URI's store holds (the whole
folder, or every object and object version of the bucket, read through boto3; every page
record opened with every key any stored page map holds, as someone holding the whole bucket
would) and every byte under a replica's cache, `grace_s` after the deletion was published: on
a local folder and on an S3-compatible server (moto) on 127.0.0.1. The writer is
`canopy index --publish` (its revocation generation, then its own), collected by `canopy
publish` as cron would run it; the replica is the one `canopy serve --index-uri` runs, driven
check by check. Search tables keep no old versions and tidy inline (`keep_versions_s = 0`), so
what is measured is publishing's part: the database's pages and maps, manifests, blobs and
caches.

What erasure costs: on 80 news articles a one-article edit and a one-article deletion each
publish exactly the database pages they changed (plus the generation's page map), a fraction
of what the first publish uploaded, and still leave no key that opens the deleted text once
the generations before are collected.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from click.testing import CliRunner
from mcp import Client

from canopy.errors import IndexMissing
from canopy.server.cli import main
from canopy.server.mcp_app import build_server
from canopy.server.wings.publish.location import open_location
from canopy.server.wings.publish.manifest import Manifest, blob_path
from canopy.server.wings.publish.replica import ReplicaSlot, build_replica
from canopy.server.wings.publish.writer import newest_manifest
from canopy.settings import load_settings
from tests.conftest import EXAMPLES, news_articles
from tests.wings.publish import object_store
from tests.wings.publish.object_store import folder_files, holders, stored_objects

pytestmark = pytest.mark.anyio

s3, bucket = object_store.s3, object_store.bucket  # the fixtures of an S3 server

GRACE_S = 2.0
BOUND_S = 4.0
CANARY = "Quillmarsh"
CANARY_DOC = """# Supplier Profile: Quillmarsh Instruments

**Location:** Varrowby, Iceland
**Key account manager:** Zephyrine Brandvold

Quillmarsh Instruments makes torque sensors for Northwind Robotics. Zephyrine Brandvold of
Quillmarsh Instruments signed the sensor contract with Northwind Robotics in 2023.
"""
LATER_DOC = """# Supplier Profile: Ostravel Castings

Ostravel Castings pours the aluminium frames of Project Kestrel in Brno.
"""
SETTINGS = f"""
[storage]
keep_versions_s = 0
tidy = "inline"
[publish]
grace_s = {GRACE_S}
"""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def corpus(root: Path) -> Path:
    docs = root / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs / "suppliers")
    (docs / "suppliers" / "quillmarsh.md").write_text(CANARY_DOC, encoding="utf-8")
    (docs / "canopy.toml").write_text(SETTINGS, encoding="utf-8")
    return docs


async def run(*args: str) -> str:
    """`canopy ARGS` in this process, on a thread (an index runs its own event loop)."""
    def invoke() -> str:
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == 0, result.output
        return result.output

    return await anyio.to_thread.run_sync(invoke)


def replica(uri: str, cache: Path) -> ReplicaSlot:
    local = load_settings(None, None, publish={"revocation_bound_s": BOUND_S, "poll_s": 60})
    slot = build_replica(uri, local, cache)
    assert slot.check()
    return slot


def one_poll(slot: ReplicaSlot) -> None:
    """What a running replica does every poll_s (`ReplicaSlot._loop`)."""
    assert slot.check()
    slot._close_drained()


async def served(slot: ReplicaSlot) -> str:
    async with Client(build_server(slot)) as client:
        result = await client.call_tool("basic_search", {"query": f"{CANARY} Zephyrine",
                                                         "k": 5})
    assert not result.is_error
    # Everything it says but the query it echoes and what the call cost.
    return json.dumps({k: v for k, v in (result.structured_content or {}).items()
                       if k not in ("query", "usage")})


@pytest.fixture(params=["folder", "s3"])
def uri(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "folder":
        return str(tmp_path / "published")
    return str(request.getfixturevalue("bucket"))


async def test_a_deleted_canary_leaves_every_published_and_cached_byte_after_the_grace_period(
        tmp_path: Path, uri: str) -> None:
    docs = corpus(tmp_path)
    index = ["index", str(docs), "--index-dir", str(tmp_path / "index"), "--publish", uri]
    await run(*index)
    location = open_location(uri)
    first = newest_manifest(location)
    assert first is not None and first.format == 3
    cache = tmp_path / "cache"
    slot = replica(uri, cache)
    try:
        assert CANARY in await served(slot)
        # An addition: the database goes as its changed pages; the unchanged pages (the
        # canary's among them) keep their records, in the first generation's pack of pages,
        # which the newest manifest then names.
        (docs / "suppliers" / "ostravel.md").write_text(LATER_DOC, encoding="utf-8")
        await run(*index)
        patched = newest_manifest(location)
        assert patched is not None
        assert set(first.files["canopy.sqlite"].packs) & set(
            patched.files["canopy.sqlite"].packs)
        one_poll(slot)
        published = stored_objects(uri)
        assert any("blobs/" in k for k in holders(published, CANARY))
        lance = {ref.sha256 for rel, ref in patched.files.items() if rel.startswith("lance/")}
        assert any(k.split("/")[-1].split("@")[0] in lance for k in holders(published, CANARY))
        assert holders(folder_files(cache), CANARY)  # the grep sees the cache's copies

        (docs / "suppliers" / "quillmarsh.md").unlink()
        out = await run(*index)
        assert "deletions and relabels first" in out and "pages written" in out
        deleted_at = time.time()
        one_poll(slot)
        assert CANARY not in await served(slot)
        newest = newest_manifest(location)
        assert newest is not None and newest.grace_s == GRACE_S
        # A replica that starts now downloads none of it, and the newest generation's files
        # reveal none of it: its packs still hold the canary's old records, but its page map
        # has no key that opens them.
        fresh = replica(uri, tmp_path / "fresh-cache")
        fresh.close()
        assert holders(folder_files(tmp_path / "fresh-cache"), CANARY) == []
        named = {b for f in newest.files.values() for b in f.blobs()}
        now = stored_objects(uri)
        assert holders({k: v for k, v in now.items()
                        if k.split("/")[-1].split("@")[0] in named}, CANARY) == []
        # Within the grace period the superseded generations are still there for readers:
        # their maps open those records.
        assert holders(now, CANARY)

        await anyio.sleep(max(0.0, deleted_at + GRACE_S + 0.2 - time.time()))
        collected = await run("publish", str(docs), "--index-dir", str(tmp_path / "index"),
                              "--to", uri)  # cron's next publish collects
        assert "removed" in collected
        one_poll(slot)
        published = stored_objects(uri)
        assert holders(published, CANARY) == [] and holders(published, "Zephyrine") == []
        assert holders(folder_files(cache), CANARY) == []
        assert "Ostravel" in await served(slot)
    finally:
        slot.close()


def test_a_watcher_collects_the_deleted_generations_when_their_grace_ends(
        tmp_path: Path) -> None:
    """`canopy watch --publish` deletes the superseded copies `grace_s` after a deletion was
    published although nothing is published after it (its idle check, every second)."""
    from canopy.server.runtime import workspace_watcher

    docs, uri = corpus(tmp_path), str(tmp_path / "published")
    watcher = workspace_watcher(docs, tmp_path / "index", None, debounce=0.2, publish=uri)
    watcher.apply()
    watcher.start()
    try:
        (docs / "suppliers" / "ostravel.md").write_text(LATER_DOC, encoding="utf-8")
        assert _wait(lambda: watcher.batches >= 1, 60)
        (docs / "suppliers" / "quillmarsh.md").unlink()
        assert _wait(lambda: watcher.batches >= 2, 60)
        published_at = time.time()
        assert holders(stored_objects(uri), CANARY)  # the superseded ones, within the grace
        assert _wait(lambda: not holders(stored_objects(uri), CANARY), GRACE_S + 10), (
            holders(stored_objects(uri), CANARY))
        assert time.time() - published_at >= GRACE_S - 0.5
    finally:
        watcher.stop()


def _changed_pages(a: Path, b: Path) -> int:
    """Pages of the database `b` that differ from `a`'s (both staged snapshots)."""
    from canopy.store.pages import iter_pages, page_size

    size = page_size(b)
    old = list(iter_pages(a, size))
    return sum(1 for i, page in enumerate(iter_pages(b, size)) if i >= len(old) or old[i] != page)


def test_a_one_article_edit_or_deletion_publishes_only_the_pages_it_changed(
        tmp_path: Path) -> None:
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.wings.publish.publishing import publish_index
    from canopy.server.wings.publish.replica_cache import materialize
    from canopy.server.wings.publish.snapshot import stage_snapshot
    from canopy.server.wings.publish.writer import collect_garbage

    docs, uri = tmp_path / "docs", str(tmp_path / "published")
    docs.mkdir()
    articles = news_articles(0, 80)
    for i, (title, body) in enumerate(articles):
        (docs / f"{i:04d}.md").write_text(f"# {title}\n\n{body}\n", encoding="utf-8")
    (docs / "canopy.toml").write_text(SETTINGS, encoding="utf-8")
    # The deleted article's opening sentence, found in no other article.
    gone = articles[20][1].split(". ")[0]
    assert len(gone) > 40 and all(gone not in body for _, body in articles[:20] + articles[21:])
    ws = open_workspace(docs, tmp_path / "index")
    build_index(ws)
    snapshots = [stage_snapshot(ws.index_dir, tmp_path / "s0").folder / "canopy.sqlite"]
    first = publish_index(ws, uri)
    assert first.database_written == first.database_pages > 5000
    location = open_location(uri)
    cache = tmp_path / "cache"
    materialize(location, newest_manifest(location) or pytest.fail("nothing published"), cache)

    def edit() -> None:
        edited = docs / "0040.md"
        edited.write_text(edited.read_text(encoding="utf-8") + "\nA paragraph added later.\n",
                          encoding="utf-8")

    for step, change in (("edit", edit), ("deletion", (docs / "0020.md").unlink)):
        change()
        build_index(ws)
        snapshots.append(stage_snapshot(ws.index_dir, tmp_path / step).folder / "canopy.sqlite")
        size = snapshots[-1].stat().st_size
        result = publish_index(ws, uri)
        # Exactly the pages that changed go up (compaction moved blocks of entries at most:
        # the first generation's pack of pages is still mostly live).
        assert result.database_written == _changed_pages(snapshots[-2], snapshots[-1]) > 0
        assert result.database_uploaded < 0.3 * first.database_uploaded, step
        assert result.database_uploaded < 0.1 * size, step
        # A replica holding the generation before downloads that and the changed Lance files.
        previous = {f.sha256 for f in (newest_manifest(location, [result.seq - 1]) or
                                       pytest.fail("no manifest before")).files.values()}
        manifest = newest_manifest(location)
        assert manifest is not None
        _, fetched = materialize(location, manifest, cache)
        lance = sum({f.sha256: f.size for rel, f in manifest.files.items()
                     if rel != "canopy.sqlite" and f.sha256 not in previous}.values())
        assert fetched == result.database_uploaded + lance, step

    # The deleted article: what the newest map opens does not hold it; the maps before it do,
    # until they are collected.
    newest = newest_manifest(location)
    assert newest is not None
    named = {b for f in newest.files.values() for b in f.blobs()}
    now = stored_objects(uri)
    assert holders({k: v for k, v in now.items() if k.rsplit("/", 1)[-1] in named}, gone) == []
    assert holders(now, gone)
    collect_garbage(location, grace_s=GRACE_S, now=time.time() + GRACE_S + 1)
    assert holders(stored_objects(uri), gone) == []


def _wait(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


# ---- a replica checks its cache against the manifest ------------------------------------------


def cached_lance_blob(cache: Path, manifest: Manifest) -> Path:
    """The cached blob of the largest search-table file `manifest` names."""
    rel, ref = max(((r, f) for r, f in manifest.files.items() if r.startswith("lance/")),
                   key=lambda item: item[1].size)
    return cache / "blobs" / ref.sha256


def damage(path: Path) -> None:
    path.chmod(0o644)  # cached blobs are read-only
    data = bytearray(path.read_bytes())
    # Bits flipped, not bytes zeroed: a run of zeros may already be zeros, changing nothing.
    middle = len(data) // 2
    data[middle:middle + 16] = bytes(b ^ 0xFF for b in data[middle:middle + 16])
    before = hashlib.sha256(path.read_bytes()).digest()
    path.write_bytes(bytes(data))
    assert hashlib.sha256(bytes(data)).digest() != before


async def test_a_replica_restarted_on_a_damaged_cache_downloads_the_damaged_files_again(
        tmp_path: Path) -> None:
    docs, uri = corpus(tmp_path), str(tmp_path / "published")
    index = ["index", str(docs), "--index-dir", str(tmp_path / "index"), "--publish", uri]
    await run(*index)
    cache = tmp_path / "cache"
    first = replica(uri, cache)
    answer = await served(first)
    first.close()  # the process stops; its cache stays
    manifest = newest_manifest(open_location(uri))
    assert manifest is not None
    lance = cached_lance_blob(cache, manifest)
    ref = manifest.files["canopy.sqlite"]
    assert ref.pages
    page_map = cache / "blobs" / ref.pages
    db = cache / "databases" / ref.sha256  # assembled from the published pages
    folder_db = cache / "generations" / f"{manifest.seq:012d}" / "canopy.sqlite"
    for path in (lance, page_map, db, folder_db):
        damage(path)

    restarted = replica(uri, cache)  # a new process on the same cache
    try:
        assert restarted.health()[0]
        for path in (lance, page_map, db):
            assert hashlib.sha256(path.read_bytes()).hexdigest() == path.name
        # The generation's database is made again from the published pages (the server has
        # opened it since, which rewrites its header: it is compared page by page past that).
        assert folder_db.read_bytes()[100:] == db.read_bytes()[100:]
        assert await served(restarted) == answer
        # The next generation names the same search-table file: opening it checks it again.
        damage(lance)
        (docs / "suppliers" / "ostravel.md").write_text(LATER_DOC, encoding="utf-8")
        await run(*index)
        newer = newest_manifest(open_location(uri))
        assert newer is not None and lance.name in {f.sha256 for f in newer.files.values()}
        assert restarted.check() and restarted.health()[1]["manifest"] == newer.seq
        assert hashlib.sha256(lance.read_bytes()).hexdigest() == lance.name
    finally:
        restarted.close()


async def test_a_replica_whose_cache_and_store_both_hold_a_damaged_file_refuses(
        tmp_path: Path) -> None:
    docs, uri = corpus(tmp_path), str(tmp_path / "published")
    await run("index", str(docs), "--index-dir", str(tmp_path / "index"), "--publish", uri)
    cache = tmp_path / "cache"
    replica(uri, cache).close()
    manifest = newest_manifest(open_location(uri))
    assert manifest is not None
    lance = cached_lance_blob(cache, manifest)
    damage(lance)
    damage(Path(uri) / blob_path(lance.name))
    local = load_settings(None, None, publish={"revocation_bound_s": BOUND_S, "poll_s": 60})
    slot = build_replica(uri, local, cache)
    try:
        assert not slot.check()
        assert not slot.health()[0]
        with pytest.raises(IndexMissing, match="cannot be loaded"):
            _ = slot.service
        assert not lance.exists()  # nothing damaged is kept to be served later
    finally:
        slot.close()
