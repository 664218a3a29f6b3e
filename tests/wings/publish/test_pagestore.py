"""The published database as encrypted page records (canopy.server.wings.publish.pagestore): a
generation writes exactly the pages that changed and the blocks of entries they fall in; the file
assembles byte for byte from the records, with or without the database assembled before; a
superseded generation's pages open only with its own page map (so they are erased with it);
packs are compacted so the store stays near the database's size; and what is damaged or
foreign is refused."""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path

import pytest

from canopy.server.wings.publish.pagestore import (
    BLOCK,
    PACK_MAGIC,
    PagedDatabase,
    PageMap,
    PageRoot,
    WriterState,
    assemble,
    open_block,
    open_record,
    read_map,
    write_pages,
)
from canopy.store.pages import canonical_page, iter_pages, read_layout
from tests.wings.publish.object_store import holders


class Store:
    """A URI's blobs in memory, and the writer's state, as publish_staged keeps them."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs: dict[str, bytes] = {}
        self.state: WriterState | None = None
        self.n = 0
        self.fetched: list[str] = []

    def publish(self, db: Path) -> PagedDatabase:
        self.n += 1
        work = self.root / f"work-{self.n}"
        work.mkdir()
        paged = write_pages(db, self.state, set(self.blobs), work)
        for sha, path in paged.new_packs.items():
            self.blobs[sha] = path.read_bytes()
        self.blobs[paged.root_sha256] = paged.root_blob
        self.state = paged.state
        return paged

    def pack_file(self, sha: str) -> Path:
        self.fetched.append(sha)
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


def _changed(a: Path, b: Path) -> list[int]:
    size = read_layout(b).page_size
    old, new = list(iter_pages(a, size)), list(iter_pages(b, size))
    return [i for i, p in enumerate(new) if i >= len(old) or old[i] != p]


def _root(paged: PagedDatabase) -> PageRoot:
    return PageRoot.from_bytes(paged.root_blob)


def test_an_update_writes_exactly_its_changed_pages_and_assembles_byte_for_byte(
        tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    con = _database(live, 20_000)
    store = Store(tmp_path)
    v1 = _staged(live, tmp_path / "v1.sqlite")
    first = store.publish(v1)
    assert first.pages_written == first.pages == v1.stat().st_size // 4096
    assert first.blocks_written == -(-first.pages // BLOCK)
    assert first.sha256 == hashlib.sha256(_canonical_bytes(v1)).hexdigest()
    map1 = read_map(_root(first), store.pack_file)
    assert map1.entries.tobytes() == first.state.map.entries.tobytes()
    out1 = tmp_path / "out1.sqlite"
    assert assemble(map1, out1, store.pack_file) == first.sha256
    assert out1.read_bytes() == _canonical_bytes(v1)

    con.executemany("INSERT INTO t VALUES (?, ?)", [(f"k{i:05d}", "y" * 120) for i in range(20)])
    con.execute("UPDATE t SET body = 'z' WHERE rowid % 997 = 0")
    v2 = _staged(live, tmp_path / "v2.sqlite")
    second = store.publish(v2)
    changed = _changed(v1, v2)
    assert second.pages_written == len(changed) and second.compacted == 0
    assert 0 < second.pages_written < second.pages / 10
    assert second.blocks_written == len({i // BLOCK for i in changed})
    new_bytes = sum(len(store.blobs[s]) for s in second.new_packs)
    assert new_bytes < 4096 * second.pages_written / 2  # compressed
    assert len(second.root_blob) < 2 * second.pages  # a root of about a byte a page

    # A replica holding the first generation reads the changed blocks and pages, nothing else.
    store.fetched.clear()
    map2 = read_map(_root(second), store.pack_file, (_root(first), map1))
    out2 = tmp_path / "out2.sqlite"
    assert assemble(map2, out2, store.pack_file, (out1, map1)) == second.sha256
    assert set(store.fetched) == set(second.new_packs)
    assert out2.read_bytes() == _canonical_bytes(v2)
    fresh = read_map(_root(second), store.pack_file)  # and from nothing, the same
    assert fresh.entries.tobytes() == map2.entries.tobytes()
    assert assemble(fresh, tmp_path / "scratch.sqlite", store.pack_file) == second.sha256
    con.close()


def test_a_superseded_generation_s_pages_open_only_with_its_own_map(tmp_path: Path) -> None:
    """After a deletion the old records of the changed pages (and blocks) are still in the
    first generation's packs, which the new map names for what did not change; but no key the
    new map holds or opens opens them, so once the old map is gone nothing opens the deleted
    row."""
    live = tmp_path / "live.sqlite"
    con = _database(live, 5_000, seed=1)
    con.execute("INSERT INTO t VALUES ('gone', 'Quillmarsh Instruments signed in 2023')")
    store = Store(tmp_path)
    first = store.publish(_staged(live, tmp_path / "v1.sqlite"))
    con.execute("DELETE FROM t WHERE id = 'gone'")
    second = store.publish(_staged(live, tmp_path / "v2.sqlite"))
    assert set(first.packs) <= set(second.packs)  # the first packs still serve unchanged pages
    everything = dict(store.blobs)
    assert holders(everything, "Quillmarsh")  # the first map opens the old record
    without_first = {k: v for k, v in everything.items() if k != first.root_sha256}
    assert holders(without_first, "Quillmarsh") == []
    assert b"Quillmarsh" not in b"".join(store.blobs[s] for s in second.packs)  # ciphertext
    old, new = first.state.map, second.state.map

    def where(m: PageMap, i: int) -> tuple[str, int, int]:
        return m.record(i)

    changed = [i for i in range(old.pages) if i >= new.pages or where(old, i) != where(new, i)]
    assert changed and not {old.key(i) for i in changed} & {new.key(i) for i in range(new.pages)}
    con.close()


def test_packs_are_compacted_so_the_store_stays_near_the_database(tmp_path: Path) -> None:
    """Many generations, each rewriting a few hundred random rows: the packs a map names stay
    few and hold less than 2.5 times its live records, and every map assembles exactly."""
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
        root = _root(paged)
        compacted += paged.compacted
        live_bytes = (int(paged.state.map.entries["length"].sum())
                      + int(root.blocks["length"].sum()))
        worst = max(worst, sum(size for _, size in root.packs.values()) / live_bytes)
        assert len(root.packs) <= 16
        staged.unlink()
    assert compacted > 10
    assert worst < 2.5
    page_map = read_map(root, store.pack_file)
    assert assemble(page_map, tmp_path / "last.sqlite", store.pack_file) == paged.sha256
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
    assert again.root.to_bytes() == first.root_blob
    unchanged = write_pages(v1, again, set(store.blobs), tmp_path)
    assert (unchanged.pages_written, unchanged.blocks_written) == (0, 0)
    assert unchanged.root_blob == first.root_blob
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
    blob = paged.root_blob
    with pytest.raises(ValueError, match="not a page map"):
        PageRoot.from_bytes(b"PK\x03\x04" + blob[4:])
    with pytest.raises(ValueError, match="damaged page map"):
        PageRoot.from_bytes(blob[:-7])
    root = _root(paged)
    page_map = read_map(root, store.pack_file)
    sha, at, n = page_map.record(3)
    pack = store.blobs[sha]
    assert pack.startswith(PACK_MAGIC)
    assert len(open_record(pack[at:at + n], page_map.key(3))) == 4096
    with pytest.raises(ValueError, match="does not open with its key"):
        open_record(pack[at:at + n], page_map.key(4))
    block = root.blocks[0]
    block_pack = store.blobs[root.packs[int(block["pack"])][0]]
    b_at, b_n = int(block["offset"]), int(block["length"])
    assert len(open_block(block_pack[b_at:b_at + b_n], bytes(block["key"]))) == BLOCK
    damaged = bytearray(pack)
    damaged[at + 5] ^= 1
    (tmp_path / "bad-pack").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="does not open with its key"):
        assemble(page_map, tmp_path / "out.sqlite",
                 lambda s: tmp_path / "bad-pack" if s == sha else store.pack_file(s))
    con.close()
