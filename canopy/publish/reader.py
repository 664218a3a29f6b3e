"""A replica's local copy of a published generation: an ordinary index folder, built from blobs.

`materialize` makes sure the cache holds every blob a manifest names, each checked against its
sha256 (downloaded when missing, downloaded again when the cached copy no longer matches, and
refused when the store's copy does not match either), rebuilds a database published as a page
patch from its base blob (canopy.publish.pages; the base stays cached, so the next generation
downloads only its patch), then lays out `generations/<seq>/` (canopy.sqlite, lance/...) afresh
with hard links to them, so a generation that changed a few files downloads a few files, and
the server opens the folder like any local index: the query path is the same code on one
machine and on N replicas. The database is copied rather than linked (the server writes its
views into it); blobs are read-only and Lance only reads them.

Nothing cached is trusted: every opening of a generation (a replica's start included) reads
every cached blob it names once, so a file damaged on disk, or changed by hand, is replaced
before it is served.

Reading the Lance tables in place from the object store was measured and not chosen
(benchmarks/publish_bench.py): every search becomes several dependent range requests, which
local files answer in microseconds.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from canopy.health import DB_NAME
from canopy.publish.location import Location
from canopy.publish.manifest import FileRef, Manifest, blob_path, sha256_file
from canopy.publish.pages import apply_patch

__all__ = ["generation_folder", "materialize", "prune_blobs", "remove_generation"]

log = logging.getLogger(__name__)


def generation_folder(cache_dir: Path, seq: int) -> Path:
    return cache_dir / "generations" / f"{seq:012d}"


def materialize(location: Location, manifest: Manifest, cache_dir: Path) -> tuple[Path, int]:
    """The index folder of `manifest` under `cache_dir`, built from checked blobs (module doc),
    and the bytes downloaded to build it. A blob the store holds whose content does not match
    its name raises ValueError."""
    folder = generation_folder(cache_dir, manifest.seq)
    blobs = cache_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for sha in sorted({b for f in manifest.files.values() for b in f.blobs()}):
        blob = blobs / sha
        if blob.exists():
            if sha256_file(blob) == sha:
                continue
            log.warning("cached file %s no longer matches its content: downloading it again",
                        sha[:12])
            blob.unlink()
        location.download(blob_path(sha), blob)
        if sha256_file(blob) != sha:
            blob.unlink()
            raise ValueError(f"published file {sha[:12]} does not match its content")
        blob.chmod(0o444)
        fetched += blob.stat().st_size
    building = folder.with_name(folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    try:
        for rel, ref in manifest.files.items():
            target = building / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if ref.patch:
                _rebuild(blobs, ref, target)
            elif rel == DB_NAME:
                shutil.copyfile(blobs / ref.sha256, target)  # written to: a copy of its own
                target.chmod(0o644)
            else:
                try:
                    os.link(blobs / ref.sha256, target)
                except OSError:
                    shutil.copyfile(blobs / ref.sha256, target)
        (building / ".complete").write_text(str(manifest.seq))
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    building.replace(folder)
    return folder, fetched


def _rebuild(blobs: Path, ref: FileRef, target: Path) -> None:
    """The file a page patch makes of its base (a copy of its own: the server writes to the
    database), checked against the manifest's sha256."""
    assert ref.base and ref.patch
    apply_patch(blobs / ref.base, blobs / ref.patch, target)
    target.chmod(0o644)
    if sha256_file(target) != ref.sha256:
        raise ValueError(f"the database rebuilt from {ref.base[:12]} and {ref.patch[:12]} does "
                         "not match its published content")


def remove_generation(cache_dir: Path, seq: int) -> None:
    shutil.rmtree(generation_folder(cache_dir, seq), ignore_errors=True)


def prune_blobs(cache_dir: Path, keep: set[str], *, partial: bool = False) -> None:
    """Delete the cached blobs `keep` (the sha256 of the generations still open) does not name;
    with `partial`, the parts of downloads that never finished too (only when none runs)."""
    for blob in (cache_dir / "blobs").glob("*"):
        if blob.name.endswith(".part") and not partial:
            continue
        if blob.name not in keep:
            blob.unlink(missing_ok=True)
