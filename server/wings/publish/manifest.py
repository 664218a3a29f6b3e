"""The published layout: content-addressed files, and one manifest per published generation.

    URI/blobs/<sha256>                 every file of every published generation, named by its
                                       content (written once, never changed)
    URI/manifests/<seq:012d>.json      one published generation: which blob is which file of an
                                       index folder (canopy.sqlite, lance/...), written last

The database is published as pages: a page map and the packs of encrypted page records it
names (`canopy.server.wings.publish.pagestore`), blobs like the others.

A manifest is written only after every blob it names is in place, with a create-only put, so
a reader that finds a manifest finds a complete generation, and two publishers can never both
write one number. The newest manifest (highest `seq`) is the published index.

Files are addressed by content rather than copied under their Lance names: LanceDB rewrites a
few of its files in place (`_versions/latest_version_hint.json`), and a table that is dropped
and created again reuses version names, so name-addressed copies could change under a reader;
blobs never do, and an unchanged file is uploaded once whatever generations name it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field

__all__ = ["BLOBS", "MANIFESTS", "FileRef", "Manifest", "blob_path", "manifest_path", "seq_of",
           "sha256_file"]

BLOBS = "blobs"
MANIFESTS = "manifests"


class FileRef(BaseModel):
    """One file of a published index folder: a blob named by its content, or, for the database,
    a page map (`pages`) and the packs it names (`pagestore`). `sha256` is the
    content of the file either way."""

    sha256: str
    size: int
    pages: str | None = None
    packs: list[str] = Field(default_factory=list)
    # A page patch against a base blob (format 2, written by Canopy before pages): read only
    # so that garbage collection keeps what such a manifest names; replicas refuse it.
    base: str | None = None
    patch: str | None = None

    def blobs(self) -> set[str]:
        """The blobs at the URI this file is made of (what garbage collection keeps)."""
        if self.pages:
            return {self.pages, *self.packs}
        return {self.base, self.patch} if self.base and self.patch else {self.sha256}

    def cached_blobs(self) -> set[str]:
        """The blobs a replica keeps for this file: packs only while it assembles the
        database (canopy.server.wings.publish.replica_cache)."""
        return {self.pages} if self.pages else self.blobs()


class Manifest(BaseModel):
    """One published generation of an index."""

    format: Literal[1, 2, 3] = Field(
        default=1, description="3 when the database is published as pages "
        "(`pagestore`); 2 was a page patch, written by Canopy before pages and "
        "no longer read; 1 has whole files only")
    seq: int = Field(description="Publication number at the URI: the newest is the highest")
    generation: int = Field(description="The index generation it holds (the writer's)")
    snapshot_ns: int = Field(
        description="When the writer took the snapshot (its clock, under its writer lock): "
        "publishers order their manifests by it, so an older snapshot is never published "
        "after a newer one")
    published_at: float = Field(description="Unix time the manifest was written (writer clock)")
    lance_versions: dict[str, int]
    settings: dict[str, Any] = Field(
        description="The writer's settings that serving needs (policy, embedder, query...), "
        "without credentials")
    settings_digest: str
    files: dict[str, FileRef] = Field(description="Index-folder path -> content")
    grace_s: float | None = Field(
        default=None, description="The writer's `[publish] grace_s`: how long superseded "
        "generations stay at the URI, and so the longest a replica keeps one in its cache "
        "(None: written before replicas were told)")

    def same_content(self, other: Manifest) -> bool:
        """Whether `other` serves exactly what this one does (a publish would change nothing)."""
        return (self.generation, self.lance_versions, self.settings_digest) == (
            other.generation, other.lance_versions, other.settings_digest)


def manifest_path(seq: int) -> str:
    return f"{MANIFESTS}/{seq:012d}.json"


def seq_of(path: str) -> int | None:
    """The publication number of a manifest path, or None for anything else there."""
    name = path.rsplit("/", 1)[-1]
    stem, dot, ext = name.partition(".")
    return int(stem) if dot and ext == "json" and stem.isdigit() and len(stem) == 12 else None


def blob_path(sha256: str) -> str:
    return f"{BLOBS}/{sha256}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
