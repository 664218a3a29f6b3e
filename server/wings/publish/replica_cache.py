"""A replica's local copy of a published generation: an ordinary index folder, built from blobs.

`materialize` makes sure the cache holds every blob a manifest names, each checked against its
sha256 (downloaded when missing, downloaded again when the cached copy no longer matches, and
refused when the store's copy does not match either), assembles the database from its pages
(`pagestore`), then lays out `generations/<seq>/` (canopy.sqlite, lance/...)
afresh with hard links to the blobs, so a generation that changed a few files downloads a few
files, and the server opens the folder like any local index: the query path is the same code
on one machine and on N replicas. The database is copied rather than linked (the server writes
its views into it); blobs are read-only and Lance only reads them.

The database is assembled into `databases/<sha256>` (read-only, named by its content like a
blob) from the database assembled for the generation before, whose unchanged pages are
copied, and the records of the pages that changed, read from the packs that hold them: a
generation downloads its page map, its changed blocks of page entries and its changed pages,
not the database. Beside the file, `databases/<sha256>.pages` keeps its page map opened (every
page's entry), from which the next generation's unchanged blocks are taken. Packs are only
read while assembling and are deleted after; the assembled file is checked against the
manifest's sha256, and assembled again from the published pages alone when it does not
match.

Nothing cached is trusted: every opening of a generation (a replica's start included) reads
every cached file it uses once, so a file damaged on disk, or changed by hand, is replaced
before it is served. The database assembled before and its opened map are only a source of
unchanged pages and entries: what they give is checked with the rest, as the assembled file's
sha256, and a file that does not match is assembled again from the published pages alone.

What a replica keeps goes with the generations it serves (`prune_cache`): the assembled
database, the page map and its opened entries (the keys of the generation's pages) and the
files of every generation no longer open are deleted, so the cache holds nothing that opens a
page the open generations do not have.

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
from canopy.server.wings.publish.location import Location
from canopy.server.wings.publish.manifest import FileRef, Manifest, blob_path, sha256_file
from canopy.server.wings.publish.pagestore import PageMap, PageRoot, assemble, read_map

__all__ = ["generation_folder", "materialize", "prune_cache", "remove_generation"]

log = logging.getLogger(__name__)

DATABASES = "databases"


def generation_folder(cache_dir: Path, seq: int) -> Path:
    return cache_dir / "generations" / f"{seq:012d}"


def _checked(location: Location, blobs: Path, sha: str) -> int:
    """Make `blobs/<sha>` a checked copy of the published blob; the bytes downloaded. A blob
    the store holds whose content does not match its name raises ValueError."""
    blob = blobs / sha
    if blob.exists():
        if sha256_file(blob) == sha:
            return 0
        log.warning("cached file %s no longer matches its content: downloading it again",
                    sha[:12])
        blob.unlink()
    location.download(blob_path(sha), blob)
    if sha256_file(blob) != sha:
        blob.unlink()
        raise ValueError(f"published file {sha[:12]} does not match its content")
    blob.chmod(0o444)
    return blob.stat().st_size


def materialize(location: Location, manifest: Manifest, cache_dir: Path) -> tuple[Path, int]:
    """The index folder of `manifest` under `cache_dir`, built from checked blobs (module doc),
    and the bytes downloaded to build it. A blob the store holds whose content does not match
    its name, or a database that cannot be assembled to its published content, raises
    ValueError."""
    if manifest.format == 2:
        raise ValueError(
            f"manifest {manifest.seq} was published by an earlier Canopy, as a page patch, which "
            "this version does not read: publish the index again with this version (`canopy "
            "publish`, or restart `canopy watch --publish`)")
    folder = generation_folder(cache_dir, manifest.seq)
    blobs = cache_dir / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    fetched = 0
    for sha in sorted({b for f in manifest.files.values() for b in f.cached_blobs()}):
        fetched += _checked(location, blobs, sha)
    building = folder.with_name(folder.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    try:
        for rel, ref in manifest.files.items():
            target = building / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            if ref.pages:
                database, got = _database(location, cache_dir, ref)
                fetched += got
                shutil.copyfile(database, target)  # written to: a copy of its own
                target.chmod(0o644)
            elif rel == DB_NAME:
                shutil.copyfile(blobs / ref.sha256, target)
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


def _database(location: Location, cache_dir: Path, ref: FileRef) -> tuple[Path, int]:
    """`databases/<sha256>`, the database `ref` publishes as pages, checked (assembled when it
    is missing or damaged); and the bytes of packs downloaded to assemble it."""
    assert ref.pages
    folder = cache_dir / DATABASES
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / ref.sha256
    listing = folder / f"{ref.sha256}.pages"  # its page map opened: every page's entry
    if target.exists():
        if sha256_file(target) == ref.sha256 and listing.is_file():
            return target, 0
        log.warning("cached database %s no longer matches its content: assembling it again",
                    ref.sha256[:12])
        target.unlink()
    blobs = cache_dir / "blobs"
    root = PageRoot.from_bytes((blobs / ref.pages).read_bytes())  # checked by materialize
    fetched = 0
    used: set[str] = set()

    def pack_file(sha: str) -> Path:
        nonlocal fetched
        fetched += _checked(location, blobs, sha)
        used.add(sha)
        return blobs / sha

    building = folder / f"{ref.sha256}.building"
    source = _assembled_before(cache_dir, ref.sha256)
    try:
        got, page_map = "", None
        if source is not None:
            try:
                page_map = read_map(root, pack_file, (source[1], source[2]))
                got = assemble(page_map, building, pack_file, (source[0], source[2]))
            except ValueError:  # the cached map does not fit: the published pages decide
                got = ""
            if got != ref.sha256:
                log.warning("the cached database %s did not assemble %s: assembling it from "
                            "the published pages alone", source[0].name[:12], ref.sha256[:12])
                _forget(source[0])
        if got != ref.sha256:
            page_map = read_map(root, pack_file)
            got = assemble(page_map, building, pack_file)
        if got != ref.sha256 or page_map is None:
            raise ValueError(f"the database assembled from page map {ref.pages[:12]} does not "
                             "match its published content")
        listing.write_bytes(page_map.to_bytes())
        building.chmod(0o444)
        building.replace(target)
        target.with_name(f"{ref.sha256}.map").write_text(ref.pages)
    finally:
        building.unlink(missing_ok=True)
        for sha in used:  # only read while assembling
            (blobs / sha).unlink(missing_ok=True)
    return target, fetched


def _assembled_before(cache_dir: Path, sha: str) -> tuple[Path, PageRoot, PageMap] | None:
    """The database assembled last, other than `sha`, with its root (still cached) and its
    page map: what a new generation's unchanged blocks and pages are taken from."""
    found = []
    for note in (cache_dir / DATABASES).glob("*.map"):
        database = note.with_suffix("")
        if database.name == sha or not database.is_file():
            continue
        try:
            root = PageRoot.from_bytes((cache_dir / "blobs" / note.read_text().strip())
                                       .read_bytes())
            page_map = PageMap.from_bytes(database.with_name(database.name + ".pages")
                                          .read_bytes())
        except (OSError, ValueError):
            continue
        found.append((database.stat().st_mtime, database, root, page_map))
    if not found:
        return None
    _, database, root, page_map = max(found, key=lambda item: item[0])
    return database, root, page_map


def _forget(database: Path) -> None:
    for path in (database, database.with_name(database.name + ".map"),
                 database.with_name(database.name + ".pages")):
        path.unlink(missing_ok=True)


def remove_generation(cache_dir: Path, seq: int) -> None:
    shutil.rmtree(generation_folder(cache_dir, seq), ignore_errors=True)


def prune_cache(cache_dir: Path, keep: list[Manifest], *, partial: bool = False) -> None:
    """Delete the cached blobs and assembled databases the generations `keep` (those still
    open) do not use; with `partial`, what downloads and assemblies that never finished left
    too (only when none runs)."""
    blobs = {b for m in keep for f in m.files.values() for b in f.cached_blobs()}
    databases = {f.sha256 for m in keep for f in m.files.values() if f.pages}
    for blob in (cache_dir / "blobs").glob("*"):
        if blob.name.endswith(".part") and not partial:
            continue
        if blob.name not in blobs:
            blob.unlink(missing_ok=True)
    for path in (cache_dir / DATABASES).glob("*"):
        name = path.name.split(".", 1)[0]
        if path.name.endswith(".building") and not partial:
            continue
        if name not in databases:
            path.unlink(missing_ok=True)
