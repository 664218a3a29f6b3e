"""The published index database: its pages as encrypted records in packs, and one page map per
generation naming the record of each page and the only key that opens it.

Why pages. What a generation changes in `canopy.sqlite` is a set of pages spread over the
whole file (row ids are hashes, so inserts, updates and deletes land on B-tree pages all over
it). On the 100-article benchmark index a one-article edit changed 940 of 12,538 pages (7.5%),
a deletion 1,528 (12.2%), an addition 3,387 (25.7%); cut into runs of 16 pages (64 KiB) the
same changes touch 40%, 56% and 61% of the runs, into 1 MiB runs 100%, 100% and 92%
(`benchmarks/publish_bench.py`). Content-addressed chunks of the file would re-send most of
it; a generation here uploads the pages that changed, compressed.

Why encrypted. Deleted text has to leave every blob a manifest can name within `grace_s`. The
old image of a changed page sits in an immutable object beside images that are still current,
and rewriting that object re-sends its current pages: the same spread again. So every page
image is encrypted under a key of its own (AES-128-GCM, each key used once), and the keys are
kept apart from the records, in the generation's page map. A map holds only the keys of its
own generation's pages: once a page changes, its old record stays in its pack but the only key
that opens it is in the maps of earlier generations, which are collected with their manifests
`grace_s` after those were superseded (`writer`). From then on no blob at the URI,
and none in a replica's cache (`replica_cache`), holds what opens it: the text is erased
cryptographically (NIST SP 800-88's "cryptographic erase"), in every generation. The images
themselves are canonical (canopy.store.pages), so the current ones hold no byte SQLite left
of deleted rows either.

Why a map in two levels. A key per page is 16 bytes, 0.4% of the database: 14 MB at 10k
articles, more than the pages a one-article change writes there. So the page entries (where a
page's record is, and its key) are grouped in blocks of `BLOCK` pages, each block a record too,
encrypted under a key of its own, and the published page map (the root) holds the blocks'
entries: a generation writes the blocks its changed pages fall in, and a root of 1 byte a page.
Erasure holds at each level: a changed block's old record is opened only by the roots before.

    pack    PACK_MAGIC, then records: AES-GCM(key, zero nonce, zlib(plain)), where plain is a
            canonical page image, or a block: the entries of up to BLOCK pages
    entry   pack id (the first 8 bytes of the pack's sha256, as a little-endian u64), offset
            and length of the record in the pack (u32 each), key (16 bytes)
    root    MAP_MAGIC, then zlib of: page size (u32), pages (u64), packs (u32), block size
            (u32); each pack's sha256 (32 bytes) and size (u64); one entry per block

A pack is named by its sha256 like any blob, and a replica checks packs, the root and the
assembled file's sha256 against what the manifest names; a record that does not open under its
key is refused too (GCM's tag).

Writing (`write_pages`): a page whose staged bytes are unchanged (a digest the writer keeps)
keeps its record; every other page is a new record, under a new key, in a new pack, and so is
every block with a changed entry. Packs fill with records no map opens any more; a pack less
than half live, and the smallest packs beyond `SMALL_PACKS`, are compacted: their live records
are written again, at most `COMPACT_BYTES` of them a generation, so the URI holds about twice
the compressed database at most and a manifest names a bounded number of packs.

Reading (`read_map`, `assemble`): the entries of blocks unchanged since a database assembled
before are taken from its map, the others opened from their packs; then the file is written
from that database (its pages whose record is unchanged are copied) and the records that
differ, and checked against its sha256.
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

from canopy.store.pages import canonical_page, iter_pages, read_layout

__all__ = ["BLOCK", "COMPACT_BYTES", "LIST_MAGIC", "MAP_MAGIC", "PACK_BYTES", "PACK_MAGIC",
           "PageMap", "PageRoot", "PagedDatabase", "WriterState", "assemble", "open_block",
           "open_record", "pack_id", "read_map", "write_pages"]

PACK_MAGIC = b"canopy-pack\x00\x00\x00\x00\x01"
MAP_MAGIC = b"canopy-pagemap\x00\x02"  # a published root
LIST_MAGIC = b"canopy-pagelist\x01"  # a decoded map, every page's entry (kept locally)
STATE_MAGIC = b"canopy-pagestate\x02"
KEY = 16  # AES-128
DIGEST = 16  # blake2b of a staged page, the writer's own: equal digests mean an equal page
BLOCK = 32  # pages whose entries make one block
PACK_BYTES = 16 << 20  # a pack is closed once it holds this many bytes of records
COMPACT_SHARE = 0.5  # a pack whose live records are less than this share of it is compacted
COMPACT_BYTES = 16 << 20  # live records compacted at most, a generation
SMALL_PACKS = 32  # packs under PACK_BYTES / 16 kept before the smallest are merged
ENTRY = np.dtype([("pack", "<u8"), ("offset", "<u4"), ("length", "<u4"), ("key", "V16")])
_NONCE = bytes(12)  # every key encrypts one record: a fixed nonce never repeats under a key
_LEVEL = 6  # zlib: 3.5-4x on index pages
_ROOT = struct.Struct("<IQII")  # page size, pages, packs, block size
_LIST = struct.Struct("<IQI")  # page size, pages, packs


def pack_id(sha256: str) -> int:
    """A pack's id in entries: the first 8 bytes of its sha256."""
    return int.from_bytes(bytes.fromhex(sha256[:16]), "little")


def _pack_table(packs: dict[int, tuple[str, int]]) -> bytes:
    ordered = sorted(packs.values())
    return (b"".join(bytes.fromhex(sha) for sha, _ in ordered)
            + np.asarray([size for _, size in ordered], dtype="<u8").tobytes())


def _read_pack_table(body: bytes, at: int, count: int) -> tuple[dict[int, tuple[str, int]], int]:
    if len(body) < at + 40 * count:
        raise ValueError("a damaged page map (its packs)")
    names = [body[at + 32 * i:at + 32 * (i + 1)].hex() for i in range(count)]
    at += 32 * count
    sizes = np.frombuffer(body, "<u8", count, at).tolist()
    table = {pack_id(sha): (sha, int(n)) for sha, n in zip(names, sizes, strict=True)}
    return table, at + 8 * count


def _entries(body: bytes, at: int, count: int) -> np.ndarray:
    if len(body) != at + ENTRY.itemsize * count:
        raise ValueError("a damaged page map (its length)")
    return np.frombuffer(body, ENTRY, count, at).copy()


def _unzip(data: bytes, magic: bytes, what: str) -> bytes:
    if not data.startswith(magic):
        raise ValueError(f"not a {what}")
    try:
        return zlib.decompress(data[len(magic):])
    except zlib.error as exc:
        raise ValueError(f"a damaged {what} ({exc})") from None


def _check_packs(entries: np.ndarray, packs: dict[int, tuple[str, int]], what: str) -> None:
    if len(entries) and not set(np.unique(entries["pack"]).tolist()) <= packs.keys():
        raise ValueError(f"a damaged {what} (a record in no pack it names)")


@dataclass(frozen=True, eq=False)
class PageRoot:
    """A published page map: the packs, and where each block of page entries is."""

    page_size: int
    pages: int
    packs: dict[int, tuple[str, int]]  # pack id -> (sha256, size)
    blocks: np.ndarray  # ENTRY per block of BLOCK pages
    block: int = BLOCK

    def to_bytes(self) -> bytes:
        return MAP_MAGIC + zlib.compress(
            _ROOT.pack(self.page_size, self.pages, len(self.packs), self.block)
            + _pack_table(self.packs) + self.blocks.tobytes(), _LEVEL)

    @classmethod
    def from_bytes(cls, data: bytes) -> PageRoot:
        """The root `data` holds; ValueError when it is not one."""
        body = _unzip(data, MAP_MAGIC, "page map")
        try:
            size, pages, count, block = _ROOT.unpack_from(body)
        except struct.error:
            raise ValueError("a damaged page map (its header)") from None
        if block < 1:
            raise ValueError("a damaged page map (its block size)")
        packs, at = _read_pack_table(body, _ROOT.size, count)
        blocks = _entries(body, at, -(-pages // block))
        _check_packs(blocks, packs, "page map")
        return cls(size, pages, packs, blocks, block)


@dataclass(frozen=True, eq=False)
class PageMap:
    """Every page's entry: where its record is and the key that opens it (a root with its
    blocks opened)."""

    page_size: int
    packs: dict[int, tuple[str, int]]  # pack id -> (sha256, size)
    entries: np.ndarray  # ENTRY per page

    @property
    def pages(self) -> int:
        return len(self.entries)

    def key(self, page: int) -> bytes:
        return bytes(self.entries["key"][page])

    def record(self, page: int) -> tuple[str, int, int]:
        """(pack sha256, offset, length) of a page's record."""
        e = self.entries[page]
        return self.packs[int(e["pack"])][0], int(e["offset"]), int(e["length"])

    def to_bytes(self) -> bytes:
        """The local form (LIST_MAGIC): a writer's state, a replica's cache."""
        return LIST_MAGIC + zlib.compress(
            _LIST.pack(self.page_size, self.pages, len(self.packs)) + _pack_table(self.packs)
            + self.entries.tobytes(), _LEVEL)

    @classmethod
    def from_bytes(cls, data: bytes) -> PageMap:
        body = _unzip(data, LIST_MAGIC, "page list")
        try:
            size, pages, count = _LIST.unpack_from(body)
        except struct.error:
            raise ValueError("a damaged page list (its header)") from None
        packs, at = _read_pack_table(body, _LIST.size, count)
        entries = _entries(body, at, pages)
        _check_packs(entries, packs, "page list")
        return cls(size, packs, entries)


def _open(record: bytes, key: bytes) -> bytes:
    try:
        return zlib.decompress(AESGCM(key).decrypt(_NONCE, record, None))
    except (InvalidTag, zlib.error):
        raise ValueError("a published page does not open with its key") from None


def open_record(record: bytes, key: bytes) -> bytes:
    """The page image a record holds; ValueError when `key` does not open it."""
    return _open(record, key)


def open_block(record: bytes, key: bytes) -> np.ndarray:
    """The page entries a block record holds; ValueError when `key` does not open it."""
    plain = _open(record, key)
    if len(plain) % ENTRY.itemsize:
        raise ValueError("a published block of page entries is damaged")
    return np.frombuffer(plain, ENTRY).copy()


def _seal(plain: bytes, key: bytes) -> bytes:
    return AESGCM(key).encrypt(_NONCE, zlib.compress(plain, _LEVEL), None)


def _read(fh: BinaryIO, offset: int, length: int) -> bytes:
    fh.seek(offset)
    return fh.read(length)


# ---- the writer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriterState:
    """What a writer keeps of what it last published to one URI: the root, every page's entry,
    and the digest of each page as it was staged (before it was made canonical), to see which
    pages changed."""

    root: PageRoot
    map: PageMap
    digests: bytes  # DIGEST bytes per page

    def save(self, path: Path) -> None:
        root, pages = self.root.to_bytes(), self.map.to_bytes()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(STATE_MAGIC + struct.pack("<QQ", len(root), len(pages)) + root + pages
                        + self.digests)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> WriterState | None:
        """The state saved at `path`; None when there is none or it cannot be read."""
        try:
            raw = path.read_bytes()
            if not raw.startswith(STATE_MAGIC):
                return None
            a, b = struct.unpack_from("<QQ", raw, len(STATE_MAGIC))
            at = len(STATE_MAGIC) + 16
            root = PageRoot.from_bytes(raw[at:at + a])
            page_map = PageMap.from_bytes(raw[at + a:at + a + b])
        except (OSError, struct.error, ValueError):
            return None
        digests = raw[at + a + b:]
        if page_map.pages != root.pages or len(digests) != root.pages * DIGEST:
            return None
        return cls(root, page_map, digests)


@dataclass(frozen=True)
class PagedDatabase:
    """A staged database as pages: what to publish, and what to keep once it is published."""

    sha256: str  # of the file its pages make (canonical pages)
    size: int
    root_blob: bytes
    root_sha256: str
    packs: tuple[str, ...]  # every pack the root and its blocks name
    new_packs: dict[str, Path]  # those written for it, to upload
    pages: int
    pages_written: int  # page records written: changed pages, and live pages of compacted packs
    blocks_written: int
    compacted: int  # packs compacted
    state: WriterState


class _PackWriter:
    """New packs in `folder`, each closed once it holds PACK_BYTES of records."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder = folder
        self.name = name
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
            self._path = self.folder / f"{self.name}-{len(self.done)}"
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


def _live_bytes(state: WriterState) -> dict[int, int]:
    """Bytes of each pack's records that the state's root and blocks open."""
    live: dict[int, int] = dict.fromkeys(state.root.packs, 0)
    for entries in (state.map.entries, state.root.blocks):
        ids, sums = np.unique(entries["pack"], return_inverse=True)
        for pid, total in zip(ids.tolist(), np.bincount(sums, weights=entries["length"]).tolist(),
                              strict=True):
            live[pid] = live.get(pid, 0) + int(total)
    return live


def _to_compact(state: WriterState) -> set[int]:
    """The packs (ids) to compact now (module doc): the least live first, then the smallest
    beyond SMALL_PACKS, within COMPACT_BYTES of live records."""
    live = _live_bytes(state)
    sizes = {pid: size for pid, (_, size) in state.root.packs.items()}
    share = {pid: live[pid] / max(sizes[pid] - len(PACK_MAGIC), 1) for pid in sizes}
    sparse = sorted((p for p in sizes if share[p] < COMPACT_SHARE), key=lambda p: (share[p], p))
    small = sorted((p for p in sizes if sizes[p] < PACK_BYTES // 16), key=lambda p: (sizes[p], p))
    chosen: set[int] = set()
    budget = 0
    for p in sparse + small[:max(0, len(small) - SMALL_PACKS)]:
        if p in chosen or budget + live[p] > COMPACT_BYTES:
            continue
        chosen.add(p)
        budget += live[p]
    return chosen


def _entries_of(ids: list[int], offsets: list[int], lengths: list[int],
                keys: bytes | bytearray) -> np.ndarray:
    out = np.zeros(len(ids), ENTRY)
    out["pack"], out["offset"], out["length"] = ids, offsets, lengths
    out["key"] = np.frombuffer(bytes(keys), "V16")
    return out


def write_pages(db: Path, previous: WriterState | None, stored: set[str],
                work: Path) -> PagedDatabase:
    """The staged database `db` as pages (module doc), in one read of it: the records of pages
    and blocks unchanged since `previous` (the state of the last publish to this URI, None for
    none) are kept when their packs are still `stored` there; new packs are written into the
    folder `work`."""
    layout = read_layout(db)
    prev = previous
    if prev is not None and (prev.root.page_size != layout.page_size or prev.root.block != BLOCK
                             or not {s for s, _ in prev.root.packs.values()} <= stored):
        prev = None  # another layout, or its packs were collected: every page goes anew
    retire = _to_compact(prev) if prev is not None else set()
    n = layout.pages
    kept = prev.map.pages if prev is not None else 0
    prev_entries = prev.map.entries if prev is not None else np.zeros(0, ENTRY)
    prev_pack = prev_entries["pack"].tolist()
    prev_digests = prev.digests if prev is not None else b""
    ids = [0] * n
    offsets = [0] * n
    lengths = [0] * n
    keys = bytearray(n * KEY)
    fresh: list[tuple[int, int]] = []  # (page, which new pack)
    digests = bytearray(n * DIGEST)
    packs = _PackWriter(work, "pages")
    new_key = _Keys()
    whole = hashlib.sha256()
    for i, raw in enumerate(iter_pages(db, layout.page_size)):
        d0, d1 = i * DIGEST, (i + 1) * DIGEST
        digest = hashlib.blake2b(raw, digest_size=DIGEST).digest()
        digests[d0:d1] = digest
        page = canonical_page(raw, i, layout)
        whole.update(page)
        if i < kept and prev_digests[d0:d1] == digest and prev_pack[i] not in retire:
            e = prev_entries[i]
            ids[i], offsets[i], lengths[i] = prev_pack[i], int(e["offset"]), int(e["length"])
            keys[i * KEY:(i + 1) * KEY] = bytes(e["key"])
            continue
        key = new_key.next()
        record = _seal(page, key)
        which, offsets[i] = packs.add(record)
        lengths[i] = len(record)
        keys[i * KEY:(i + 1) * KEY] = key
        fresh.append((i, which))
    page_packs = packs.close()
    for i, which in fresh:
        ids[i] = pack_id(page_packs[which][0])
    entries = _entries_of(ids, offsets, lengths, keys)

    # The blocks: one record per BLOCK pages, kept when its pages' entries are unchanged.
    blocks_writer = _PackWriter(work, "blocks")
    nb = -(-n // BLOCK)
    b_ids, b_offsets, b_lengths = [0] * nb, [0] * nb, [0] * nb
    b_keys = bytearray(nb * KEY)
    b_fresh: list[tuple[int, int]] = []
    prev_blocks = prev.root.blocks if prev is not None else np.zeros(0, ENTRY)
    for b in range(nb):
        lo, hi = b * BLOCK, min(n, (b + 1) * BLOCK)
        if (b < len(prev_blocks) and min(kept, (b + 1) * BLOCK) == hi
                and int(prev_blocks[b]["pack"]) not in retire
                and entries[lo:hi].tobytes() == prev_entries[lo:hi].tobytes()):
            e = prev_blocks[b]
            b_ids[b], b_offsets[b], b_lengths[b] = int(e["pack"]), int(e["offset"]), int(
                e["length"])
            b_keys[b * KEY:(b + 1) * KEY] = bytes(e["key"])
            continue
        key = new_key.next()
        record = _seal(entries[lo:hi].tobytes(), key)
        which, b_offsets[b] = blocks_writer.add(record)
        b_lengths[b] = len(record)
        b_keys[b * KEY:(b + 1) * KEY] = key
        b_fresh.append((b, which))
    block_packs = blocks_writer.close()
    for b, which in b_fresh:
        b_ids[b] = pack_id(block_packs[which][0])
    blocks = _entries_of(b_ids, b_offsets, b_lengths, b_keys)

    known = dict(prev.root.packs) if prev is not None else {}
    new = page_packs + block_packs
    for sha, _, size in new:
        if known.get(pack_id(sha), (sha,))[0] != sha:  # two packs sharing 8 bytes of sha256
            raise RuntimeError(f"pack {sha[:16]} shares its id with another: publish again")
        known[pack_id(sha)] = (sha, size)
    used = set(entries["pack"].tolist()) | set(blocks["pack"].tolist())
    named = {pid: known[pid] for pid in used}  # packs no page or block needs are dropped
    root = PageRoot(layout.page_size, n, named, blocks)
    page_map = PageMap(layout.page_size, named, entries)
    blob = root.to_bytes()
    shas = {sha for sha, _ in named.values()}
    return PagedDatabase(
        sha256=whole.hexdigest(), size=n * layout.page_size, root_blob=blob,
        root_sha256=hashlib.sha256(blob).hexdigest(),
        packs=tuple(sorted(shas)),
        new_packs={sha: path for sha, path, _ in new if sha in shas}, pages=n,
        pages_written=len(fresh), blocks_written=len(b_fresh), compacted=len(retire),
        state=WriterState(root, page_map, bytes(digests)))


# ---- the reader ------------------------------------------------------------------------------


def _same(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per entry of `a`: whether `b` names the very same record at that position (a pack id
    is its sha256's first 8 bytes: the writer never publishes two packs sharing one)."""
    same = np.zeros(len(a), bool)
    m = min(len(a), len(b))
    same[:m] = ((a["pack"][:m] == b["pack"][:m]) & (a["offset"][:m] == b["offset"][:m])
                & (a["length"][:m] == b["length"][:m]))
    return same


def read_map(root: PageRoot, pack_file: Callable[[str], Path],
             source: tuple[PageRoot, PageMap] | None = None) -> PageMap:
    """Every page's entry of `root`. Blocks whose record `source` (an earlier root and its
    map) names too are taken from that map; the others are opened from their packs,
    `pack_file(sha256)` giving a checked local copy of each. ValueError when one does not
    open, or does not fit."""
    same = np.zeros(len(root.blocks), bool)
    if source is not None and source[0].block == root.block:
        same = _same(root.blocks, source[0].blocks)
    entries = np.zeros(root.pages, ENTRY)
    with contextlib.ExitStack() as stack:
        files: dict[int, BinaryIO] = {}
        for b in range(len(root.blocks)):
            lo, hi = b * root.block, min(root.pages, (b + 1) * root.block)
            if same[b] and source is not None and source[1].pages >= hi:
                entries[lo:hi] = source[1].entries[lo:hi]
                continue
            e = root.blocks[b]
            pid = int(e["pack"])
            if pid not in files:
                files[pid] = stack.enter_context(open(pack_file(root.packs[pid][0]), "rb"))
            got = open_block(_read(files[pid], int(e["offset"]), int(e["length"])),
                             bytes(e["key"]))
            if len(got) != hi - lo:
                raise ValueError("a published block of page entries does not fit its pages")
            entries[lo:hi] = got
    _check_packs(entries, root.packs, "page map")
    return PageMap(root.page_size, root.packs, entries)


def assemble(page_map: PageMap, out: Path, pack_file: Callable[[str], Path],
             source: tuple[Path, PageMap] | None = None) -> str:
    """Write the database `page_map` describes to `out` and return the sha256 of what was
    written. Pages whose record `source` (a database assembled before, and its map) names too
    are copied from it; the others are opened from their packs, `pack_file(sha256)` giving a
    checked local copy of each. A record that does not open raises ValueError."""
    size = page_map.page_size
    same = np.zeros(page_map.pages, bool)
    if source is not None and source[1].page_size == size:
        same = _same(page_map.entries, source[1].entries)
        same[source[0].stat().st_size // size:] = False
    needed = sorted(set(page_map.entries["pack"][~same].tolist()))
    whole = hashlib.sha256()
    # Runs of pages to copy, as [start, stop) pairs, then the end.
    edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
    runs = [*edges.reshape(-1, 2).tolist(), [page_map.pages, page_map.pages]]
    with contextlib.ExitStack() as stack:
        files = {p: stack.enter_context(open(pack_file(page_map.packs[p][0]), "rb"))
                 for p in needed}
        src = stack.enter_context(open(source[0], "rb")) if source is not None else None
        dst = stack.enter_context(open(out, "wb"))
        at = 0
        for start, stop in runs:
            for i in range(at, start):
                e = page_map.entries[i]
                page = _open(_read(files[int(e["pack"])], int(e["offset"]), int(e["length"])),
                             bytes(e["key"]))
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
