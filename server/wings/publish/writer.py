"""Publishing a staged snapshot: upload what the URI lacks, write the manifest last, collect
garbage.

Order is the guarantee: every blob a manifest names is stored before the manifest is written
(one atomic, create-only put), so readers only ever find complete generations. Garbage goes
the other way round: a superseded manifest is deleted first, `grace_s` after the manifest that
superseded it was written, and a blob only once no remaining manifest names it and it is older
than `grace_s` (so the blobs of a publish still uploading are never taken).

The database goes as pages (`pagestore`): its changed pages as new encrypted
records, the blocks of page entries they fall in as new records too, and a page map (the
root) holding the keys of the generation's own blocks. Deleted text leaves the URI with the
garbage: a superseded generation's root, the only blob holding the keys that open its blocks,
whose keys alone open the records of pages changed since, goes with its manifest, `grace_s`
after it was superseded, whatever the generation dropped (a deletion, an edit, a relabel).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canopy.health import DB_NAME
from canopy.server.wings.publish.location import Location
from canopy.server.wings.publish.manifest import (
    BLOBS,
    MANIFESTS,
    FileRef,
    Manifest,
    blob_path,
    manifest_path,
    seq_of,
    sha256_file,
)
from canopy.server.wings.publish.pagestore import PagedDatabase, WriterState, write_pages
from canopy.server.wings.publish.snapshot import StagedSnapshot

__all__ = ["Collected", "PublishResult", "collect_garbage", "newest_manifest", "publish_staged",
           "published_seqs", "published_settings"]

log = logging.getLogger(__name__)

_UPLOADS = 8  # blobs uploaded at once (object stores reward parallel requests)


@dataclass(frozen=True)
class Collected:
    """What one garbage collection deleted, and when the next one has something to delete."""

    manifests: int = 0
    blobs: int = 0
    next_due: float | None = None  # Unix time (writer clock); None: nothing waits


@dataclass(frozen=True)
class PublishResult:
    outcome: str  # "published", "unchanged" (the newest manifest serves the same), "superseded"
    seq: int  # the manifest that now serves this generation (0: none)
    generation: int
    files: int = 0
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    total_bytes: int = 0
    deleted_manifests: int = 0
    deleted_blobs: int = 0
    elapsed_s: float = 0.0
    # The database (`pagestore`): its pages, the page records written (changed
    # pages, and live pages of compacted packs), the blocks of page entries written, the packs
    # compacted, and the bytes uploaded for it (new packs of pages and blocks, and the root;
    # included in uploaded_bytes).
    database_pages: int = 0
    database_written: int = 0
    database_blocks_written: int = 0
    database_compacted: int = 0
    database_uploaded: int = 0
    next_collection: float | None = None  # Collected.next_due after this publish


def published_settings(settings: Any) -> tuple[dict[str, Any], str]:
    """What replicas serve with (the `Settings` model, less what is each replica's own: its
    callers' authentication, its publish/replica settings, and every credential; less the
    writer's own Ray cluster too), and its digest."""
    data = settings.model_dump(mode="json", exclude={
        "auth": True, "publish": True, "distributed": True, "llm": {"api_key"},
        "embed": {"api_key"}})
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()
    return data, digest


def published_seqs(location: Location) -> list[int]:
    """The publication numbers of the manifests at `location`, oldest first (one LIST)."""
    return sorted(s for s in (seq_of(o.path) for o in location.list(MANIFESTS)) if s is not None)


def newest_manifest(location: Location, seqs: list[int] | None = None) -> Manifest | None:
    """The newest complete generation at `location` (None: nothing published yet); `seqs`:
    a listing just taken (`published_seqs`)."""
    for seq in reversed(published_seqs(location) if seqs is None else seqs):
        try:
            return Manifest.model_validate_json(location.get(manifest_path(seq)))
        except FileNotFoundError:  # collected since the listing: an older one was newest
            continue
    return None


class _HashCache:
    """sha256 of files by (inode, size, mtime): Lance data files never change, so each is hashed
    once however many generations include it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.known: dict[str, str] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.known = {}
        self.used: dict[str, str] = {}

    def sha256(self, file: Path) -> str:
        st = file.stat()
        key = f"{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        sha = self.known.get(key) or sha256_file(file)
        self.used[key] = sha
        return sha

    def save(self) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self.used))
        tmp.replace(self.path)


def publish_staged(location: Location, staged: StagedSnapshot, settings: Any, *,
                   grace_s: float, hash_cache: Path | None = None,
                   page_state: Path | None = None) -> PublishResult:
    """Publish `staged` at `location` as the next manifest, unless the newest one already
    serves the same content ("unchanged") or was taken from a newer snapshot ("superseded").
    Then collect garbage. Callers on one machine serialize publishes (a lock file); the
    create-only manifest put keeps two machines from writing one number.

    `page_state`: where the writer keeps what it last published of the database at this
    location (`pagestore.WriterState`); with it, only pages changed since go up,
    without it every page does."""
    began = time.perf_counter()
    data, digest = published_settings(settings)
    newest = newest_manifest(location)
    if newest is not None and newest.snapshot_ns >= staged.snapshot_ns:
        return PublishResult("superseded", newest.seq, staged.generation)
    probe = Manifest(seq=0, generation=staged.generation, snapshot_ns=staged.snapshot_ns,
                     published_at=0.0, lance_versions=staged.lance_versions, settings=data,
                     settings_digest=digest, files={}, grace_s=grace_s)
    if newest is not None and newest.same_content(probe):
        gc = collect_garbage(location, grace_s=grace_s)
        return PublishResult("unchanged", newest.seq, staged.generation,
                             deleted_manifests=gc.manifests, deleted_blobs=gc.blobs,
                             elapsed_s=time.perf_counter() - began, next_collection=gc.next_due)
    cache = _HashCache(hash_cache) if hash_cache is not None else None
    files: dict[str, FileRef] = {}
    local: dict[str, Path] = {}
    database = staged.folder / DB_NAME
    for path in staged.files():
        if path == database:
            continue  # as pages, below
        sha = cache.sha256(path) if cache is not None else sha256_file(path)
        files[path.relative_to(staged.folder).as_posix()] = FileRef(sha256=sha,
                                                                   size=path.stat().st_size)
        local.setdefault(sha, path)
    if cache is not None:
        cache.save()
    stored = {o.path.rsplit("/", 1)[-1] for o in location.list(BLOBS)}
    work = staged.folder.with_name(staged.folder.name + ".pages")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        paged: PagedDatabase | None = None
        if database.is_file():
            previous = WriterState.load(page_state) if page_state is not None else None
            paged = write_pages(database, previous, stored, work)
            files[DB_NAME] = FileRef(sha256=paged.sha256, size=paged.size,
                                     pages=paged.root_sha256, packs=list(paged.packs))
            (work / "map").write_bytes(paged.root_blob)
            local.setdefault(paged.root_sha256, work / "map")
            for sha, path in paged.new_packs.items():
                local.setdefault(sha, path)
        missing = {sha: p for sha, p in local.items() if sha not in stored}
        with concurrent.futures.ThreadPoolExecutor(_UPLOADS) as pool:
            for done in [pool.submit(location.put, blob_path(sha), p)
                         for sha, p in missing.items()]:
                done.result()
        seq = (newest.seq if newest is not None else 0) + 1
        while True:
            manifest = probe.model_copy(update={
                "seq": seq, "files": files, "published_at": time.time(),
                "format": 3 if paged is not None else 1})
            try:
                location.put(manifest_path(seq), manifest.model_dump_json(indent=1).encode(),
                             create=True)
                break
            except FileExistsError:  # another publisher took this number
                other = newest_manifest(location)
                if other is not None and other.snapshot_ns >= staged.snapshot_ns:
                    return PublishResult("superseded", other.seq, staged.generation)
                seq = max(seq, other.seq if other is not None else 0) + 1
        if paged is not None and page_state is not None:
            # Its packs and map are stored and named by a manifest: build on them from now on.
            paged.state.save(page_state)
        uploaded = {sha: p.stat().st_size for sha, p in missing.items()}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gc = collect_garbage(location, grace_s=grace_s)
    db_blobs = {paged.root_sha256, *paged.new_packs} if paged is not None else set()
    return PublishResult("published", seq, staged.generation, files=len(files),
                         uploaded_files=len(missing), uploaded_bytes=sum(uploaded.values()),
                         total_bytes=sum(f.size for f in files.values()),
                         deleted_manifests=gc.manifests, deleted_blobs=gc.blobs,
                         elapsed_s=time.perf_counter() - began,
                         database_pages=paged.pages if paged is not None else 0,
                         database_written=paged.pages_written if paged is not None else 0,
                         database_blocks_written=(paged.blocks_written if paged is not None
                                                  else 0),
                         database_compacted=paged.compacted if paged is not None else 0,
                         database_uploaded=sum(n for sha, n in uploaded.items()
                                               if sha in db_blobs),
                         next_collection=gc.next_due)


def collect_garbage(location: Location, *, grace_s: float,
                    now: float | None = None) -> Collected:
    """Delete manifests superseded more than `grace_s` ago (never the newest), then blobs no
    remaining manifest names that are older than `grace_s`; say when the next of either
    falls due."""
    now = time.time() if now is None else now
    manifests: dict[int, Manifest] = {}
    for seq in published_seqs(location):
        try:
            manifests[seq] = Manifest.model_validate_json(location.get(manifest_path(seq)))
        except FileNotFoundError:
            continue
    if not manifests:
        return Collected()
    ordered = sorted(manifests)
    superseded = {seq: manifests[after].published_at
                  for seq, after in zip(ordered, ordered[1:], strict=False)}
    expired = [seq for seq, at in superseded.items() if now - at > grace_s]
    # Oldest first, so what remains is always a run of consecutive publications.
    location.delete(manifest_path(seq) for seq in expired)
    kept = {blob for seq in ordered if seq not in expired
            for f in manifests[seq].files.values() for blob in f.blobs()}
    unnamed = [o for o in location.list(BLOBS) if o.path.rsplit("/", 1)[-1] not in kept]
    old = [o.path for o in unnamed if now - o.modified.timestamp() > grace_s]
    location.delete(old)
    if expired or old:
        log.info("published index %s: removed %d superseded generations and %d files",
                 location.uri, len(expired), len(old))
    # A blob that only expired manifests name goes at the collection after theirs.
    waiting = [at + grace_s for seq, at in superseded.items() if seq not in expired]
    waiting += [o.modified.timestamp() + grace_s for o in unnamed if o.path not in old]
    return Collected(len(expired), len(old), min(waiting, default=None))
