"""Page patches of the index database: publish what changed in `canopy.sqlite`, not all of it.

A one-article update rewrites a few thousand rows spread over the database's B-trees (ids are
hashes, so inserts land on pages all over the file): at 100 articles about a fifth of the
pages, at 10k articles a few thousand pages of a 3.5 GB file. Whole-file blobs re-sent all of
it on every generation. SQLite's backup API copies a database page for page, so the staged copy
of a generation has the same page numbers as the one before it, and what changed is a set of
pages.

A published database is then a base (a whole-file blob, published once) plus one patch against
that base: the pages that differ, compressed. Patches are always against the base, never
against the previous patch, so a replica needs two blobs however many generations passed, and
the writer starts a new base when a patch would carry more than `REBASE_SHARE` of the file.

Patch file: `MAGIC`, then page size and page count of the result (two little-endian u32/u64),
then zlib-compressed records of (page number u64, page bytes). Page numbers count from 0.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["REBASE_SHARE", "PageDigests", "apply_patch", "page_digests", "page_size",
           "write_patch"]

MAGIC = b"canopy-pages\x00\x01"
REBASE_SHARE = 0.5  # a patch larger than this share of the database: publish a new base
_HEADER = struct.Struct("<IQ")  # page size, page count of the patched file
_RECORD = struct.Struct("<Q")  # page number
_DIGEST = 8  # bytes of blake2b per page: collisions are checked away by the file's sha256


def page_size(db: Path) -> int:
    """The page size an SQLite database file declares (header bytes 16-17; 1 means 65536)."""
    with open(db, "rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise ValueError(f"{db} is not an SQLite database")
    size = int.from_bytes(header[16:18], "big")
    return 65536 if size == 1 else size


@dataclass(frozen=True)
class PageDigests:
    """A short digest of every page of one database file, and the file's sha256."""

    page_size: int
    digests: bytes  # _DIGEST bytes per page, in page order
    sha256: str

    @property
    def pages(self) -> int:
        return len(self.digests) // _DIGEST

    def digest(self, page: int) -> bytes:
        return self.digests[page * _DIGEST:(page + 1) * _DIGEST]

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(_HEADER.pack(self.page_size, self.pages) + self.sha256.encode()
                        + self.digests)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> PageDigests | None:
        try:
            raw = path.read_bytes()
            size, pages = _HEADER.unpack_from(raw)
            sha = raw[_HEADER.size:_HEADER.size + 64].decode()
            digests = raw[_HEADER.size + 64:]
        except (OSError, struct.error, UnicodeDecodeError):
            return None
        return cls(size, digests, sha) if len(digests) == pages * _DIGEST else None


def _pages(db: Path, size: int) -> Iterator[bytes]:
    with open(db, "rb") as fh:
        while page := fh.read(size):
            yield page


def page_digests(db: Path) -> PageDigests:
    """Digests of every page of `db` and its sha256, in one read."""
    size = page_size(db)
    whole = hashlib.sha256()
    parts = []
    for page in _pages(db, size):
        whole.update(page)
        parts.append(hashlib.blake2b(page, digest_size=_DIGEST).digest())
    return PageDigests(size, b"".join(parts), whole.hexdigest())


def write_patch(base: PageDigests | None, db: Path,
                out: Path) -> tuple[int | None, PageDigests]:
    """Write the patch that turns the base file into `db`, in one read of `db` that also takes
    its digests. Returns (the size of the pages the patch carries, the digests of `db`); the
    size is None, and `out` absent, when no patch applies: no base, another page size, or more
    than REBASE_SHARE of `db` changed."""
    size = page_size(db)
    total = db.stat().st_size
    pages = -(-total // size)
    limit = REBASE_SHARE * total
    patching = base is not None and base.page_size == size
    carried = 0
    whole = hashlib.sha256()
    parts = []
    squeeze = zlib.compressobj(level=1)
    with open(out, "wb") as fh:
        fh.write(MAGIC + _HEADER.pack(size, pages))
        for number, page in enumerate(_pages(db, size)):
            whole.update(page)
            digest = hashlib.blake2b(page, digest_size=_DIGEST).digest()
            parts.append(digest)
            if not patching or (base is not None and number < base.pages
                                and digest == base.digest(number)):
                continue
            carried += len(page)
            if carried > limit:
                patching = False  # read on for the digests: this file becomes the base
                continue
            fh.write(squeeze.compress(_RECORD.pack(number) + page))
        fh.write(squeeze.flush())
    digests = PageDigests(size, b"".join(parts), whole.hexdigest())
    if not patching:
        out.unlink()
        return None, digests
    return carried, digests


def apply_patch(base: Path, patch: Path, out: Path) -> None:
    """Write the database `patch` makes of `base` to `out`. A patch that is not one raises
    ValueError (callers check the result's sha256 against the manifest)."""
    with open(patch, "rb") as fh:
        head = fh.read(len(MAGIC) + _HEADER.size)
        if not head.startswith(MAGIC) or len(head) < len(MAGIC) + _HEADER.size:
            raise ValueError(f"{patch.name} is not a page patch")
        size, pages = _HEADER.unpack_from(head, len(MAGIC))
        shutil.copyfile(base, out)
        record = _RECORD.size + size
        expand = zlib.decompressobj()
        pending = b""
        with open(out, "r+b") as db:
            db.truncate(min(db.seek(0, 2), pages * size))
            try:
                while chunk := fh.read(1 << 20):
                    pending += expand.decompress(chunk)
                    pending = _write_records(db, pending, record, size)
                pending += expand.flush()
            except zlib.error as exc:
                raise ValueError(f"{patch.name} is damaged: {exc}") from None
            if _write_records(db, pending, record, size) or not expand.eof:
                raise ValueError(f"{patch.name} ends inside a page")
            db.truncate(pages * size)


def _write_records(db: BinaryIO, data: bytes, record: int, size: int) -> bytes:
    """Write the whole records at the start of `data`; return the incomplete rest."""
    whole = len(data) - len(data) % record
    for at in range(0, whole, record):
        (number,) = _RECORD.unpack_from(data, at)
        db.seek(number * size)
        db.write(data[at + _RECORD.size:at + record])
    return data[whole:]
