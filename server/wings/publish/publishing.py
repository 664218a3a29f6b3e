"""The writer's side of published generations: `canopy publish`, and the publish step of
`canopy index` / `watch` when `[publish] uri` (or `--publish`) names a URI.

Two locks, always taken in this order: the index's writer lock, held only while the snapshot is
staged (milliseconds: a database backup and hard links, `snapshot`), then a
publish lock (`publish.lock` in the index folder) held while uploading, so publishes of one
index leave in the order their snapshots were taken, and an upload never holds up the next
index update. A publish whose snapshot is older than the newest manifest is dropped
("superseded"): what it would publish is already there or newer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock

from canopy.errors import CanopyError, ConfigError, IndexMissing
from canopy.health import DB_NAME, check_database
from canopy.indexer.index_writer import writer_lock
from canopy.server.runtime import Workspace
from canopy.server.wings.publish.location import open_location
from canopy.server.wings.publish.snapshot import stage_snapshot
from canopy.server.wings.publish.writer import (
    Collected,
    PublishResult,
    collect_garbage,
    publish_staged,
    published_seqs,
)

__all__ = ["check_publish_target", "collect_published", "describe_publish", "publish_index",
           "revocation_publisher"]

log = logging.getLogger("canopy.server.wings.publish")  # `canopy watch` shows canopy.* at INFO

_STAGING = "publish-staging-"  # + pid-thread: a publish's snapshot (`snapshot`)


def publish_index(ws: Workspace, uri: str | None = None, *, locked: bool = False,
                  label: str = "") -> PublishResult:
    """Publish the committed generation of `ws` to `uri` (default `[publish] uri`).
    `locked`: the caller already holds the writer lock. `label`: what the logged line starts
    with."""
    settings = ws.settings.publish
    target = uri or settings.uri
    if not target:
        raise ConfigError("no URI to publish to: pass --to URI or set [publish] uri")
    facts = check_database(ws.index_dir) if (ws.index_dir / DB_NAME).exists() else "missing"
    if isinstance(facts, str) or facts.generation == 0:
        raise IndexMissing(f"no committed index at {ws.index_dir} to publish: run "
                           f"`canopy index {ws.docs_dir}` first")
    location = open_location(target, endpoint_url=settings.endpoint_url, region=settings.region)
    _remove_stale_staging(ws.index_dir)
    staging = ws.index_dir / f"{_STAGING}{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        if locked:
            staged = stage_snapshot(ws.index_dir, staging)
        else:
            with writer_lock(ws.index_dir):
                staged = stage_snapshot(ws.index_dir, staging)
        with FileLock(ws.index_dir / "publish.lock"):
            tag = hashlib.sha256(location.uri.encode()).hexdigest()[:12]
            for old in (f"publish-base-{tag}.pages", f"publish-base-{tag}.held"):
                (ws.index_dir / old).unlink(missing_ok=True)  # an earlier Canopy's page base
            result = publish_staged(location, staged, ws.settings, grace_s=settings.grace_s,
                                    hash_cache=ws.index_dir / "publish-hashes.json",
                                    page_state=ws.index_dir / f"publish-pages-{tag}.state")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("%s%s", label, describe_publish(result, target))
    return result


def _remove_stale_staging(index_dir: Path) -> None:
    """Delete the staging folders of publishes whose process is gone (killed mid-publish): each
    holds a copy of the database as it was, deleted text included."""
    if os.name == "nt":  # os.kill(pid, 0) would end the process there
        return
    for folder in index_dir.glob(f"{_STAGING}*"):
        pid = folder.name[len(_STAGING):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # alive, someone else's
            continue


def check_publish_target(ws: Workspace, uri: str) -> None:
    """Raise now, in one line, when `uri` cannot be read (a bucket that does not exist, a store
    that does not answer, credentials refused), rather than after a build that may take an
    hour: one LIST of its manifests."""
    settings = ws.settings.publish
    published_seqs(open_location(uri, endpoint_url=settings.endpoint_url,
                                 region=settings.region))


def collect_published(ws: Workspace, uri: str | None = None) -> Collected:
    """Collect the garbage at `uri` (default `[publish] uri`) now, under the publish lock (so no
    publish in this machine names a blob while it is deleted). A writer calls it when the last
    collection said something falls due (`Collected.next_due`), so a deletion leaves the URI
    `grace_s` after it was published even when nothing is published after it."""
    settings = ws.settings.publish
    target = uri or settings.uri
    if not target:
        raise ConfigError("no URI to collect: pass --to URI or set [publish] uri")
    location = open_location(target, endpoint_url=settings.endpoint_url, region=settings.region)
    with FileLock(ws.index_dir / "publish.lock"):
        return collect_garbage(location, grace_s=settings.grace_s)


def revocation_publisher(ws: Workspace, uri: str | None,
                         report: Callable[[str], None] | None = None) -> Callable[[], None]:
    """For `build_index(on_revoked=...)`: publish the generation that applied deletions and
    relabels as soon as it commits, before the regeneration (which may take minutes with an
    LLM), so replicas drop what was deleted or restricted without waiting for it. `report`
    gets the line saying what was published. A failure is logged: the update goes on, and
    publishes again when it commits."""
    def publish_now() -> None:
        try:
            first = "deletions and relabels first: "
            result = publish_index(ws, uri, locked=True, label=first)
            if report is not None:
                report(first + describe_publish(result, uri or ""))
        except CanopyError as exc:  # written for people: no traceback
            log.error("publishing the revocation generation failed (%s); the update publishes "
                      "again when it commits", exc)
        except Exception:
            log.exception("publishing the revocation generation failed; the update publishes "
                          "again when it commits")

    return publish_now


def describe_publish(r: PublishResult, uri: str) -> str:
    """One line saying what a publish did."""
    gc = (f"; removed {r.deleted_manifests} superseded generations, {r.deleted_blobs} files"
          if r.deleted_manifests or r.deleted_blobs else "")
    if r.outcome == "unchanged":
        return (f"Generation {r.generation} is already published at {uri} "
                f"(manifest {r.seq}): nothing to upload{gc}")
    if r.outcome == "superseded":
        return (f"Generation {r.generation} not published at {uri}: manifest {r.seq} holds a "
                "newer snapshot")
    database = (f"; the database: {r.database_written:,} of {r.database_pages:,} pages written "
                f"({_mb(r.database_uploaded)})" if r.database_pages else "")
    return (f"Published generation {r.generation} to {uri} as manifest {r.seq}: {r.files} files "
            f"({_mb(r.total_bytes)}), uploaded {r.uploaded_files} ({_mb(r.uploaded_bytes)}) "
            f"in {r.elapsed_s:.2f}s{database}{gc}")


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 10_000 else f"{n} B"
