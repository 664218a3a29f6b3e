"""The published database as encrypted page records (canopy.publish.pagestore): a generation
writes exactly the pages that changed; the file assembles byte for byte from the records,
with or without the database assembled before; a superseded generation's pages open only with
its own map (so they are erased with it); packs are compacted so the store stays near the
database's size; and what is damaged or foreign is refused."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path

import pytest

from canopy.publish.pages import canonical_page, iter_pages, read_layout
from canopy.publish.pagestore import (
    PACK_MAGIC,
    PagedDatabase,
    PageMap,
    WriterState,
    assemble,
    open_record,
    write_pages,
)


class Store:
    """A URI's blobs in memory, and the writer's state, as publish_staged keeps them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs: dict[str, bytes] = {}
        self.state: WriterState | None = None
        self.n = 0

    def publish(self, db: Path) -> PagedDatabase:
        self.n += 1
        work = self.root / f"work-{self.n}"
        work.mkdir()
        paged = write_pages(db, self.state, set(self.blobs), work)
        for sha, path in paged.new_packs.items():
            self.blobs[sha] = path.read_bytes()
        self.blobs[paged.map_sha256] = paged.map_blob
        self.state = paged.state
        return paged

    def pack_file(self, sha: str) -> Path:
        path = self.root / "packs" / sha
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(self.blobs[sha])
        return path


def _database(path: Path, rows: int, seed: int = 0) -> sqlite3.Connection:
    rng = random.Random(seed)
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA secure_delete=ON")
    con.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)",
                    [(f"{rng.getrandbits(64):016x}", f"text {i} " + "x" * rng.randrange(50, 400))
                     for i in range(rows)])
    return con


def _staged(live: Path, dst: Path) -> Path:
    """What publishing stages: an online backup, page for page."""
    a, b = sqlite3.connect(live), sqlite3.connect(dst)
    a.backup(b)
    b.execute("PRAGMA journal_mode=DELETE")
    b.close()
    a.close()
    return dst


def _canonical_bytes(db: Path) -> bytes:
    layout = read_layout(db)
    return b"".join(canonical_page(p, i, layout)
                    for i, p in enumerate(iter_pages(db, layout.page_size)))


def _changed_pages(a: Path, b: Path) -> int:
    size = read_layout(b).page_size
    old, new = list(iter_pages(a, size)), list(iter_pages(b, size))
    return sum(1 for i, p in enumerate(new) if i >= len(old) or old[i] != p)


def _opened(blobs: dict[str, bytes], page_map: PageMap) -> bytes:
    """Every page image `page_map` opens among `blobs`' packs."""
    return b"".join(open_record(blobs[page_map.packs[int(page_map.pack[i])]][
        int(page_map.offset[i]):int(page_map.offset[i] + page_map.length[i])], page_map.key(i))
        for i in range(page_map.pages))


def test_an_update_writes_exactly_its_changed_pages_and_assembles_byte_for_byte(
        tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    con = _database(live, 20_000)
    store = Store(tmp_path)
    v1 = _staged(live, tmp_path / "v1.sqlite")
    first = store.publish(v1)
    assert first.pages_written == first.pages == v1.stat().st_size // 4096
    assert first.sha256 == hashlib.sha256(_canonical_bytes(v1)).hexdigest()
    out1 = tmp_path / "out1.sqlite"
    assert assemble(PageMap.from_bytes(first.map_blob), out1, store.pack_file) == first.sha256
    assert out1.read_bytes() == _canonical_bytes(v1)

    con.executemany("INSERT INTO t VALUES (?, ?)", [(f"k{i:05d}", "y" * 120) for i in range(20)])
    con.execute("UPDATE t SET body = 'z' WHERE rowid % 997 = 0")
    v2 = _staged(live, tmp_path / "v2.sqlite")
    second = store.publish(v2)
    assert second.pages_written == _changed_pages(v1, v2)
    assert 0 < second.pages_written < second.pages / 10 and second.compacted == 0
    new_bytes = sum(len(store.blobs[s]) for s in second.new_packs)
    assert new_bytes < 4096 * second.pages_written / 2  # compressed
    assert len(second.map_blob) < 30 * second.pages  # the keys, mostly: 16 bytes a page
    page_map = PageMap.from_bytes(second.map_blob)
    fetched: list[str] = []

    def pack_file(sha: str) -> Path:
        fetched.append(sha)
        return store.pack_file(sha)

    out2 = tmp_path / "out2.sqlite"
    assert assemble(page_map, out2, pack_file, (out1, PageMap.from_bytes(first.map_blob))) == (
        second.sha256)
    assert set(fetched) == set(second.new_packs)  # the rest came from the file before
    assert out2.read_bytes() == _canonical_bytes(v2)
    scratch = tmp_path / "scratch.sqlite"
    assert assemble(page_map, scratch, store.pack_file) == second.sha256
    con.close()


def test_a_superseded_generation_s_pages_open_only_with_its_own_map(tmp_path: Path) -> None:
    """After a deletion the old records of the changed pages are still in the first pack,
    which the new map names for the pages that did not change; but no key of the new map
    opens them, so once the old map is gone no blob holds what opens the deleted rows."""
    live = tmp_path / "live.sqlite"
    con = _database(live, 5_000, seed=1)
    con.execute("INSERT INTO t VALUES ('gone', 'Quillmarsh Instruments signed in 2023')")
    store = Store(tmp_path)
    first = store.publish(_staged(live, tmp_path / "v1.sqlite"))
    con.execute("DELETE FROM t WHERE id = 'gone'")
    second = store.publish(_staged(live, tmp_path / "v2.sqlite"))
    old, new = PageMap.from_bytes(first.map_blob), PageMap.from_bytes(second.map_blob)
    assert set(old.packs) <= set(new.packs)  # the first pack still serves unchanged pages
    assert b"Quillmarsh" in _opened(store.blobs, old)
    assert b"Quillmarsh" not in _opened(store.blobs, new)
    assert b"Quillmarsh" not in b"".join(store.blobs[s] for s in new.packs)  # ciphertext

    def record(m: PageMap, i: int) -> tuple[str, int]:
        return m.packs[int(m.pack[i])], int(m.offset[i])

    changed = [i for i in range(old.pages) if i >= new.pages or record(old, i) != record(new, i)]
    assert changed and not {old.key(i) for i in changed} & {new.key(i) for i in range(new.pages)}
    con.close()


def test_packs_are_compacted_so_the_store_stays_near_the_database(tmp_path: Path) -> None:
    """Many generations, each rewriting a few hundred random rows: the packs a map names stay
    few and hold little more than twice its live records, and every map assembles exactly."""
    live = tmp_path / "live.sqlite"
    con = _database(live, 20_000, seed=2)
    store = Store(tmp_path)
    rng = random.Random(3)
    ids = [i for (i,) in con.execute("SELECT id FROM t")]
    compacted = 0
    worst = 0.0
    for generation in range(40):
        if generation:
            con.execute("BEGIN")
            for key in rng.sample(ids, 300):
                con.execute("UPDATE t SET body = ? WHERE id = ?",
                            (f"g{generation} " + "w" * rng.randrange(50, 400), key))
            con.execute("COMMIT")
        staged = _staged(live, tmp_path / f"s{generation}.sqlite")
        paged = store.publish(staged)
        page_map = PageMap.from_bytes(paged.map_blob)
        compacted += paged.compacted
        worst = max(worst, sum(page_map.pack_sizes) / int(page_map.live_bytes().sum()))
        assert len(page_map.packs) <= 16
        staged.unlink()
    assert compacted > 10
    assert worst < 2.5
    out = tmp_path / "last.sqlite"
    assert assemble(page_map, out, store.pack_file) == paged.sha256
    con.close()


def test_a_writer_state_survives_a_save_and_anything_else_starts_afresh(tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    con = _database(live, 3_000, seed=4)
    store = Store(tmp_path)
    v1 = _staged(live, tmp_path / "v1.sqlite")
    first = store.publish(v1)
    first.state.save(tmp_path / "state")
    again = WriterState.load(tmp_path / "state")
    assert again is not None and again.digests == first.state.digests
    assert again.map.to_bytes() == first.map_blob
    unchanged = write_pages(v1, again, set(store.blobs), tmp_path)
    assert unchanged.pages_written == 0 and unchanged.map_blob == first.map_blob
    # Its packs collected at the URI (or another URI's state): every page goes anew.
    assert write_pages(v1, again, set(), tmp_path).pages_written == first.pages
    (tmp_path / "state").write_bytes((tmp_path / "state").read_bytes()[:-5])
    assert WriterState.load(tmp_path / "state") is None
    assert WriterState.load(tmp_path / "missing") is None
    con.close()


def test_damaged_or_foreign_maps_packs_and_records_are_refused(tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    con = _database(live, 2_000, seed=5)
    store = Store(tmp_path)
    paged = store.publish(_staged(live, tmp_path / "v1.sqlite"))
    blob = paged.map_blob
    with pytest.raises(ValueError, match="not a page map"):
        PageMap.from_bytes(b"PK\x03\x04" + blob[4:])
    with pytest.raises(ValueError, match="damaged page map"):
        PageMap.from_bytes(blob[:-7])
    page_map = PageMap.from_bytes(blob)
    pack = store.blobs[page_map.packs[0]]
    assert pack.startswith(PACK_MAGIC)
    record = pack[int(page_map.offset[3]):int(page_map.offset[3] + page_map.length[3])]
    assert len(open_record(record, page_map.key(3))) == 4096
    with pytest.raises(ValueError, match="does not open with its key"):
        open_record(record, page_map.key(4))
    damaged = bytearray(pack)
    damaged[int(page_map.offset[3]) + 5] ^= 1
    (tmp_path / "bad-pack").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="does not open with its key"):
        assemble(page_map, tmp_path / "out.sqlite", lambda sha: tmp_path / "bad-pack")
    con.close()
