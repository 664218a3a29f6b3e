"""The published index database: its pages as encrypted records in packs, and one page map per
generation naming the record of each page and the only key that opens it.

Why pages. What a generation changes in `canopy.sqlite` is a set of pages spread over the
whole file (row ids are hashes, so inserts, updates and deletes land on B-tree pages all over
it). On the 100-article benchmark index a one-article edit changed 942 of 12,361 pages (7.6%),
a deletion 1,527 (12.3%), an addition 3,391 (26%); cut into runs of 16 pages (64 KiB) the same
changes touch 40%, 56% and 61% of the runs, into 1 MiB runs 96%, 98% and 90%
(benchmarks/README.md, "Publishing"). Content-addressed chunks of the file would re-send most
of it; a generation here uploads the pages that changed, compressed.

Why encrypted. Deleted text has to leave every blob a manifest can name within `grace_s`. The
old image of a changed page sits in an immutable object beside images that are still current,
and rewriting that object re-sends its current pages: the same spread again. So every page
image is encrypted under a key of its own (AES-128-GCM, each key used once), and the keys are
kept apart from the records, in the generation's page map. A map holds only the keys of its
own generation's pages: once a page changes, its old record stays in its pack but the only key
that opens it is in the maps of earlier generations, which are collected with their manifests
`grace_s` after those were superseded (canopy.publish.writer). From then on no blob at the URI,
and none in a replica's cache (canopy.publish.reader), holds what opens it: the text is erased
cryptographically (NIST SP 800-88's "cryptographic erase"), in every generation, at the cost of
a map (21-25 bytes a page) per generation. The images themselves are canonical
(canopy.publish.pages), so the current ones hold no byte SQLite left of deleted rows either.

    pack   PACK_MAGIC, then records: AES-GCM(key, zero nonce, zlib(canonical page image))
    map    MAP_MAGIC, then zlib of: page size (u32), pages (u64), packs (u32); each pack's
           sha256 (32 bytes) and size (u64); for each page its pack (u32), offset (u32) and
           length (u32), column by column; then each page's key (16 bytes)

A pack is named by its sha256 like any blob, and a replica checks it, the map and the
assembled file's sha256 against what the manifest names; a record that does not open under its
key is refused too (GCM's tag).

Writing (`write_pages`): a page whose staged bytes are unchanged (a digest the writer keeps)
keeps its record; every other page is a new record, under a new key, in a new pack. Packs fill
with records no map opens any more; a pack less than half live, and the smallest packs beyond
`SMALL_PACKS`, are compacted: their live pages are written again as new records, at most
`COMPACT_BYTES` of them a generation, so the URI holds about twice the compressed database at
most and a manifest names a bounded number of packs.

Reading (`assemble`): the file is written from a database assembled before (its pages whose
record is unchanged are copied) and the records that differ, then checked against its sha256.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from canopy.publish.pages import canonical_page, iter_pages, read_layout

__all__ = ["COMPACT_BYTES", "MAP_MAGIC", "PACK_BYTES", "PACK_MAGIC", "PageMap",
           "PagedDatabase", "WriterState", "assemble", "open_record", "write_pages"]

PACK_MAGIC = b"canopy-pack\x00\x00\x00\x00\x01"
MAP_MAGIC = b"canopy-pagemap\x00\x01"
STATE_MAGIC = b"canopy-pagestate\x01"
KEY = 16  # AES-128
DIGEST = 16  # blake2b of a staged page, the writer's own: equal digests mean an equal page
PACK_BYTES = 16 << 20  # a pack is closed once it holds this many bytes of records
COMPACT_SHARE = 0.5  # a pack whose live records are less than this share of it is compacted
COMPACT_BYTES = 16 << 20  # live records compacted at most, a generation
SMALL_PACKS = 32  # packs under PACK_BYTES / 16 kept before the smallest are merged
_NONCE = bytes(12)  # every key encrypts one record: a fixed nonce never repeats under a key
_LEVEL = 6  # zlib: 3.5-4x on index pages
_HEADER = struct.Struct("<IQI")  # page size, pages, packs
_U32 = np.dtype("<u4")


@dataclass(frozen=True, eq=False)
class PageMap:
    """One generation's database: for each page, where its record is and the key that opens it."""

    page_size: int
    packs: tuple[str, ...]  # sha256 of each pack the map names
    pack_sizes: tuple[int, ...]
    pack: np.ndarray  # per page: index into `packs` (u32)
    offset: np.ndarray  # per page: byte offset of its record in the pack (u32)
    length: np.ndarray  # per page: bytes of its record (u32)
    keys: bytes  # KEY bytes per page

    @property
    def pages(self) -> int:
        return len(self.pack)

    def key(self, page: int) -> bytes:
        return self.keys[page * KEY:(page + 1) * KEY]

    def live_bytes(self) -> np.ndarray:
        """Bytes of each pack's records that this map opens."""
        return np.bincount(self.pack, weights=self.length, minlength=len(self.packs))

    def to_bytes(self) -> bytes:
        body = b"".join([
            _HEADER.pack(self.page_size, self.pages, len(self.packs)),
            b"".join(bytes.fromhex(s) for s in self.packs),
            np.asarray(self.pack_sizes, dtype="<u8").tobytes(),
            self.pack.astype(_U32).tobytes(), self.offset.astype(_U32).tobytes(),
            self.length.astype(_U32).tobytes(), self.keys])
        return MAP_MAGIC + zlib.compress(body, _LEVEL)

    @classmethod
    def from_bytes(cls, data: bytes) -> PageMap:
        """The map `data` holds; ValueError when it is not one."""
        if not data.startswith(MAP_MAGIC):
            raise ValueError("not a page map")
        try:
            body = zlib.decompress(data[len(MAP_MAGIC):])
            size, pages, packs = _HEADER.unpack_from(body)
        except (zlib.error, struct.error) as exc:
            raise ValueError(f"a damaged page map ({exc})") from None
        at = _HEADER.size
        want = at + packs * 40 + pages * (12 + KEY)
        if len(body) != want:
            raise ValueError("a damaged page map (its length)")
        names = tuple(body[at + 32 * i:at + 32 * (i + 1)].hex() for i in range(packs))
        at += 32 * packs
        sizes = tuple(int(s) for s in np.frombuffer(body, "<u8", packs, at))
        at += 8 * packs
        columns = [np.frombuffer(body, _U32, pages, at + 4 * pages * k).astype(np.uint32)
                   for k in range(3)]
        keys = body[at + 12 * pages:]
        if pages and int(columns[0].max()) >= packs:
            raise ValueError("a damaged page map (a page in no pack)")
        return cls(size, names, sizes, columns[0], columns[1], columns[2], keys)


def open_record(record: bytes, key: bytes) -> bytes:
    """The page image a record holds; ValueError when `key` does not open it."""
    try:
        return zlib.decompress(AESGCM(key).decrypt(_NONCE, record, None))
    except (InvalidTag, zlib.error):
        raise ValueError("a published page does not open with its key") from None


def _seal(page: bytes, key: bytes) -> bytes:
    return AESGCM(key).encrypt(_NONCE, zlib.compress(page, _LEVEL), None)


# ---- the writer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterState:
    """What a writer keeps of the map it last published to one URI: the map, and the digest of
    each page as it was staged (before it was made canonical), to see which pages changed."""

    map: PageMap
    digests: bytes  # DIGEST bytes per page

    def save(self, path: Path) -> None:
        blob = self.map.to_bytes()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(STATE_MAGIC + struct.pack("<Q", len(blob)) + blob + self.digests)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> WriterState | None:
        """The state saved at `path`; None when there is none or it cannot be read."""
        try:
            raw = path.read_bytes()
            (n,) = struct.unpack_from("<Q", raw, len(STATE_MAGIC))
            at = len(STATE_MAGIC) + 8
            page_map = PageMap.from_bytes(raw[at:at + n])
        except (OSError, struct.error, ValueError):
            return None
        digests = raw[at + n:]
        if not raw.startswith(STATE_MAGIC) or len(digests) != page_map.pages * DIGEST:
            return None
        return cls(page_map, digests)


@dataclass(frozen=True)
class PagedDatabase:
    """A staged database as pages: what to publish, and what to keep once it is published."""

    sha256: str  # of the file its pages make (canonical pages)
    size: int
    map_blob: bytes
    map_sha256: str
    packs: tuple[str, ...]  # every pack the map names
    new_packs: dict[str, Path]  # those written for it, to upload
    pages: int
    pages_written: int  # records written: changed pages, and live pages of compacted packs
    compacted: int  # packs compacted
    state: WriterState


class _PackWriter:
    """New packs in `folder`, each closed once it holds PACK_BYTES of records."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.done: list[tuple[str, Path, int]] = []
        self._fh: BinaryIO | None = None
        self._path = folder
        self._sha = hashlib.sha256()
        self._size = 0

    def add(self, record: bytes) -> tuple[int, int]:
        """Append `record`; (which of the new packs holds it, its offset there)."""
        if self._fh is not None and self._size + len(record) > PACK_BYTES:
            self._close()
        if self._fh is None:
            self._path = self.folder / f"pack-{len(self.done)}"
            self._fh = open(self._path, "wb")  # noqa: SIM115 - closed by _close
            self._sha = hashlib.sha256(PACK_MAGIC)
            self._fh.write(PACK_MAGIC)
            self._size = len(PACK_MAGIC)
        at = self._size
        self._fh.write(record)
        self._sha.update(record)
        self._size += len(record)
        return len(self.done), at

    def _close(self) -> None:
        assert self._fh is not None
        self._fh.close()
        self._fh = None
        self.done.append((self._sha.hexdigest(), self._path, self._size))

    def close(self) -> list[tuple[str, Path, int]]:
        if self._fh is not None:
            self._close()
        return self.done


class _Keys:
    """Fresh random keys, drawn from the OS a few thousand at a time."""

    def __init__(self) -> None:
        self._pool = b""
        self._at = 0

    def next(self) -> bytes:
        if self._at >= len(self._pool):
            self._pool, self._at = secrets.token_bytes(KEY * 4096), 0
        self._at += KEY
        return self._pool[self._at - KEY:self._at]


def _to_compact(page_map: PageMap) -> set[int]:
    """The packs of `page_map` to compact now (module doc): the least live first, then the
    smallest beyond SMALL_PACKS, within COMPACT_BYTES of live records."""
    live = page_map.live_bytes()
    sizes = np.asarray(page_map.pack_sizes, dtype=np.float64)
    share = live / np.maximum(sizes - len(PACK_MAGIC), 1.0)
    sparse = [int(p) for p in np.argsort(share, kind="stable") if share[p] < COMPACT_SHARE]
    small = [int(p) for p in np.argsort(sizes, kind="stable") if sizes[p] < PACK_BYTES // 16]
    chosen: set[int] = set()
    budget = 0.0
    for p in sparse + small[:max(0, len(small) - SMALL_PACKS)]:
        if p in chosen or budget + live[p] > COMPACT_BYTES:
            continue
        chosen.add(p)
        budget += live[p]
    return chosen


def write_pages(db: Path, previous: WriterState | None, stored: set[str],
                work: Path) -> PagedDatabase:
    """The staged database `db` as pages (module doc), in one read of it: the records of pages
    unchanged since `previous` (the state of the last publish to this URI, None for none) are
    kept when their packs are still `stored` there; new packs are written into the folder
    `work`."""
    layout = read_layout(db)
    prev = previous
    if prev is not None and (prev.map.page_size != layout.page_size
                             or not set(prev.map.packs) <= stored):
        prev = None  # another page size, or its packs were collected: every page goes anew
    n = layout.pages
    pack = np.zeros(n, np.uint32)
    offset = np.zeros(n, np.uint32)
    length = np.zeros(n, np.uint32)
    keys = bytearray(n * KEY)
    digests = bytearray(n * DIGEST)
    names: list[str] = list(prev.map.packs) if prev is not None else []
    sizes: list[int] = list(prev.map.pack_sizes) if prev is not None else []
    retire = _to_compact(prev.map) if prev is not None else set()
    if prev is not None:
        kept_pages = prev.map.pages
        prev_pack = prev.map.pack.tolist()
        prev_offset, prev_length = prev.map.offset.tolist(), prev.map.length.tolist()
        prev_digests, prev_keys = prev.digests, prev.map.keys
    else:
        kept_pages, prev_pack, prev_offset, prev_length = 0, [], [], []
        prev_digests, prev_keys = b"", b""
    base = len(names)
    packs = _PackWriter(work)
    fresh = _Keys()
    whole = hashlib.sha256()
    written = 0
    for i, raw in enumerate(iter_pages(db, layout.page_size)):
        d0, d1 = i * DIGEST, (i + 1) * DIGEST
        digest = hashlib.blake2b(raw, digest_size=DIGEST).digest()
        digests[d0:d1] = digest
        page = canonical_page(raw, i, layout)
        whole.update(page)
        k0, k1 = i * KEY, (i + 1) * KEY
        if i < kept_pages and prev_digests[d0:d1] == digest and prev_pack[i] not in retire:
            pack[i], offset[i], length[i] = prev_pack[i], prev_offset[i], prev_length[i]
            keys[k0:k1] = prev_keys[k0:k1]
            continue
        key = fresh.next()
        record = _seal(page, key)
        which, at = packs.add(record)
        pack[i], offset[i], length[i] = base + which, at, len(record)
        keys[k0:k1] = key
        written += 1
    new = packs.close()
    names += [sha for sha, _, _ in new]
    sizes += [size for _, _, size in new]
    used = np.unique(pack) if n else np.zeros(0, np.uint32)  # packs no page needs are dropped
    renumber = np.zeros(len(names), np.uint32)
    renumber[used] = np.arange(len(used), dtype=np.uint32)
    page_map = PageMap(layout.page_size, tuple(names[u] for u in used),
                       tuple(sizes[u] for u in used), renumber[pack], offset, length, bytes(keys))
    blob = page_map.to_bytes()
    named = set(page_map.packs)
    return PagedDatabase(
        sha256=whole.hexdigest(), size=n * layout.page_size, map_blob=blob,
        map_sha256=hashlib.sha256(blob).hexdigest(), packs=page_map.packs,
        new_packs={sha: path for sha, path, _ in new if sha in named}, pages=n,
        pages_written=written, compacted=len(retire), state=WriterState(page_map, bytes(digests)))


# ---- the reader ------------------------------------------------------------------------------


def _same_records(page_map: PageMap, source: PageMap) -> np.ndarray:
    """Per page of `page_map`: whether `source` names the very same record for it."""
    same = np.zeros(page_map.pages, bool)
    m = min(page_map.pages, source.pages)
    if not m:
        return same
    index = {sha: i for i, sha in enumerate(source.packs)}
    translate = np.array([index.get(sha, -1) for sha in page_map.packs], dtype=np.int64)
    mine = translate[page_map.pack[:m]]
    same[:m] = ((mine == source.pack[:m].astype(np.int64))
                & (page_map.offset[:m] == source.offset[:m])
                & (page_map.length[:m] == source.length[:m]))
    return same


def assemble(page_map: PageMap, out: Path, pack_file: Callable[[str], Path],
             source: tuple[Path, PageMap] | None = None) -> str:
    """Write the database `page_map` describes to `out` and return the sha256 of what was
    written. Pages whose record `source` (a database assembled before, and its map) names too
    are copied from it; the others are opened from their packs, `pack_file(sha256)` giving a
    checked local copy of each. A record that does not open raises ValueError."""
    size = page_map.page_size
    same = np.zeros(page_map.pages, bool)
    if source is not None and source[1].page_size == size:
        same = _same_records(page_map, source[1])
        same[source[0].stat().st_size // size:] = False
    needed = sorted({int(p) for p in np.unique(page_map.pack[~same])})
    whole = hashlib.sha256()
    # Runs of pages to copy, as [start, stop) pairs, then the end.
    edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
    runs = [*edges.reshape(-1, 2).tolist(), [page_map.pages, page_map.pages]]
    with contextlib.ExitStack() as stack:
        files = {p: stack.enter_context(open(pack_file(page_map.packs[p]), "rb"))
                 for p in needed}
        src = stack.enter_context(open(source[0], "rb")) if source is not None else None
        dst = stack.enter_context(open(out, "wb"))
        at = 0
        for start, stop in runs:
            for i in range(at, start):
                fh = files[int(page_map.pack[i])]
                fh.seek(int(page_map.offset[i]))
                page = open_record(fh.read(int(page_map.length[i])), page_map.key(i))
                if len(page) != size:
                    raise ValueError("a published page has the wrong size")
                dst.write(page)
                whole.update(page)
            left = (stop - start) * size
            if left and src is not None:
                src.seek(start * size)
            while left > 0 and src is not None:
                block = src.read(min(left, 1 << 20))
                if not block:
                    raise ValueError("the database assembled before is shorter than its map")
                dst.write(block)
                whole.update(block)
                left -= len(block)
            at = stop
    return whole.hexdigest()
