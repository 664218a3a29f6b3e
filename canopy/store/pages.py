"""The index database page by page: its layout, and each page in its canonical form, holding
no byte SQLite left behind. The store zeroes them in its own file after a run that removed
text (`zero_left_behind`); publishing sends pages in this form.

SQLite's `secure_delete` (which the store turns on) zeroes a cell when it is deleted and a page
when it is freed, but not everything: a page rebuilt by B-tree balancing keeps, in the
unallocated space between its cell pointers and its cell content, bytes of cells that lived
there before. Measured on the 100-article benchmark index after a one-article deletion: an
entity description quoting the deleted article still sat in the unallocated space of an
`entities` page; and on a small table with an index (tests/canopy/test_pages.py), 1-2 of 600 deleted
rows. Such bytes outlive the rows they came from, so a page is published canonical: every byte
SQLite never reads is zero, namely

- a b-tree page's unallocated space (between the cell pointer array and the cell content
  area) and the bodies of its freeblocks (their 4-byte headers stay: SQLite walks them);
- a freelist leaf page, whole;
- a freelist trunk page past its list of leaves.

Cells, page headers and cell pointers are left as SQLite wrote them, so the canonical file is
the same database (`integrity_check` passes, every row reads the same: tests/canopy/test_pages.py),
byte for byte where nothing was left behind. What else a file holds needs no cleaning:
overflow pages carry a payload and the zeros of a freed page; the first 100 bytes are the
file's header.

Which pages are b-tree pages is read from the page itself (its first byte 2, 5, 10 or 13): an
overflow or freelist trunk page starts with a page number, whose first byte is 0 in a file
of fewer than 2^24 pages (64 GiB at 4 KiB pages). A file that is larger, or has pointer-map
pages (auto_vacuum, which Canopy never turns on), or a page whose header and freeblocks do
not add up, is left as it is: canonical pages are then not guaranteed, and `Layout.canonical`
says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["Layout", "canonical_page", "iter_pages", "page_size", "read_layout", "zero_left_behind"]

_BTREE = frozenset((2, 5, 10, 13))  # interior index, interior table, leaf index, leaf table
_MAX_PAGES = 1 << 24  # below this, overflow and trunk pages start with a 0 byte
_READ = 1 << 20  # bytes read at once


def page_size(db: Path) -> int:
    """The page size an SQLite database file declares (header bytes 16-17; 1 means 65536)."""
    with open(db, "rb") as fh:
        header = fh.read(100)
    if len(header) < 100 or not header.startswith(b"SQLite format 3\x00"):
        raise ValueError(f"{db} is not an SQLite database")
    size = int.from_bytes(header[16:18], "big")
    return 65536 if size == 1 else size


@dataclass(frozen=True)
class Layout:
    """What canonical pages need to know of one database file."""

    page_size: int
    usable: int  # page size less the bytes reserved at the end of each page
    pages: int
    canonical: bool  # whether pages are made canonical (module doc)
    free_leaves: frozenset[int]  # freelist leaf pages (0-based)
    free_trunks: dict[int, int]  # freelist trunk page (0-based) -> the leaves it lists


def read_layout(db: Path) -> Layout:
    """The layout of the database file `db` (its header, and its freelist's trunk pages)."""
    size = page_size(db)
    total = db.stat().st_size
    if total % size:
        raise ValueError(f"{db} is not a whole number of {size}-byte pages")
    pages = total // size
    with open(db, "rb") as fh:
        header = fh.read(100)
        usable = size - header[20]
        autovacuum = int.from_bytes(header[52:56], "big") != 0
        leaves, trunks = _freelist(fh, header, size, usable, pages)
    return Layout(size, usable, pages, not autovacuum and pages < _MAX_PAGES, leaves, trunks)


def _freelist(f: BinaryIO, header: bytes, size: int, usable: int,
              pages: int) -> tuple[frozenset[int], dict[int, int]]:
    """The freelist's leaf pages and trunk pages (0-based); none when the chain does not hold
    together (its pages are then published as they are)."""
    trunk = int.from_bytes(header[32:36], "big")
    leaves: set[int] = set()
    trunks: dict[int, int] = {}
    while trunk:
        if not 1 <= trunk <= pages or trunk - 1 in trunks:
            return frozenset(), {}
        f.seek((trunk - 1) * size)
        page = f.read(size)
        count = int.from_bytes(page[4:8], "big")
        if 8 + 4 * count > usable:
            return frozenset(), {}
        listed = [int.from_bytes(page[8 + 4 * i:12 + 4 * i], "big") for i in range(count)]
        if not all(1 <= n <= pages for n in listed):
            return frozenset(), {}
        trunks[trunk - 1] = count
        leaves.update(n - 1 for n in listed)
        trunk = int.from_bytes(page[0:4], "big")
    if leaves & trunks.keys():
        return frozenset(), {}
    return frozenset(leaves), trunks


def iter_pages(db: Path, size: int) -> Iterator[bytes]:
    """The pages of `db`, in order."""
    with open(db, "rb") as fh:
        while block := fh.read(_READ - _READ % size or size):
            for at in range(0, len(block), size):
                yield block[at:at + size]


def canonical_page(page: bytes, number: int, layout: Layout) -> bytes:
    """Page `number` (0-based) of a file of `layout`, with every byte SQLite never reads set to
    zero (module doc); the page itself when it has none, or is not understood."""
    if not layout.canonical:
        return page
    if number in layout.free_leaves:
        return bytes(len(page))
    listed = layout.free_trunks.get(number)
    if listed is not None:
        end = 8 + 4 * listed
        return page if not any(page[end:]) else page[:end] + bytes(len(page) - end)
    return _canonical_btree(page, 100 if number == 0 else 0, layout.usable)


def _canonical_btree(page: bytes, h: int, usable: int) -> bytes:
    """A b-tree page whose header starts at `h` with its unallocated space and freeblock bodies
    zeroed; any other page, or one whose header or freeblocks do not hold together, as it is."""
    kind = page[h]
    if kind not in _BTREE:
        return page
    cells = int.from_bytes(page[h + 3:h + 5], "big")
    content = int.from_bytes(page[h + 5:h + 7], "big") or 65536
    pointers_end = h + (12 if kind in (2, 5) else 8) + 2 * cells
    if not pointers_end <= content <= usable:
        return page
    zero: list[tuple[int, int]] = []
    if content > pointers_end and any(page[pointers_end:content]):
        zero.append((pointers_end, content))
    block, end = int.from_bytes(page[h + 1:h + 3], "big"), content
    for _ in range(usable // 4):  # freeblocks ascend and do not touch: at most this many
        if not block:
            break
        if block < end or block + 4 > usable:
            return page
        length = int.from_bytes(page[block + 2:block + 4], "big")
        if length < 4 or block + length > usable:
            return page
        if any(page[block + 4:block + length]):
            zero.append((block + 4, block + length))
        end = block + length
        block = int.from_bytes(page[block:block + 2], "big")
    else:
        return page
    if not zero:
        return page
    out = bytearray(page)
    for start, stop in zero:
        out[start:stop] = bytes(stop - start)
    return bytes(out)


def zero_left_behind(db: Path) -> int:
    """Make every page of the database file `db` canonical in place; how many pages changed.

    Only bytes SQLite never reads change, so the database is the same for every connection,
    open or not. The caller holds SQLite's write lock with an empty WAL (nothing else writes
    the file meanwhile: a checkpoint has no frame to copy)."""
    layout = read_layout(db)
    if not layout.canonical:
        return 0
    changed = 0
    with open(db, "r+b") as fh:
        for number, page in enumerate(iter_pages(db, layout.page_size)):
            clean = canonical_page(page, number, layout)
            if clean != page:
                fh.seek(number * layout.page_size)
                fh.write(clean)
                changed += 1
        if changed:
            fh.flush()
            os.fsync(fh.fileno())
    return changed
