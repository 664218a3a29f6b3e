"""Canonical pages of the index database (canopy.store.pages): the file they make is the same
database, and holds none of what SQLite leaves of deleted rows (in a page's unallocated space,
freeblocks and free pages); pages publishing cannot be sure of are left as they are."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from canopy.store.pages import canonical_page, iter_pages, page_size, read_layout


def _canonical(db: Path, out: Path) -> Path:
    layout = read_layout(db)
    out.write_bytes(b"".join(canonical_page(p, i, layout)
                             for i, p in enumerate(iter_pages(db, layout.page_size))))
    return out


def _rows(db: Path) -> list[str]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        tables = [t for (t,) in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return sorted(f"{t}:{row!r}" for t in tables
                      for row in con.execute(f'SELECT * FROM "{t}"'))  # noqa: S608 - own names
    finally:
        con.close()


def _integrity(db: Path) -> str:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(con.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        con.close()


def _churn(path: Path, seed: int, *, secure_delete: bool) -> list[str]:
    """A table with an index, grown by random inserts and updates in batches (B-tree
    balancing moves cells between pages), then 600 random rows deleted. Returns the markers
    of the deleted rows."""
    rng = random.Random(seed)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute(f"PRAGMA secure_delete={'ON' if secure_delete else 'OFF'}")
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, name TEXT, body TEXT)")
    db.execute("CREATE INDEX t_name ON t(name)")
    ids: list[str] = []
    for _ in range(30):
        db.execute("BEGIN")
        for _ in range(100):
            key = f"{rng.getrandbits(64):016x}"
            ids.append(key)
            db.execute("INSERT OR REPLACE INTO t VALUES (?, ?, ?)",
                       (key, f"name-{key}", f"marker-{key} " + "y" * rng.randrange(50, 900)))
        for key in rng.sample(ids, 30):
            db.execute("UPDATE t SET body = ? WHERE id = ?",
                       (f"marker-{key} " + "z" * rng.randrange(50, 900), key))
        db.execute("COMMIT")
    gone = rng.sample(ids, 600)
    db.executemany("DELETE FROM t WHERE id = ?", [(key,) for key in gone])
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    return [f"{prefix}-{key}" for key in gone for prefix in ("marker", "name")]


def _left(data: bytes, markers: list[str]) -> list[str]:
    return [m for m in markers if m.encode() in data]


def test_sqlite_leaves_deleted_rows_in_pages_with_secure_delete_and_canonical_pages_do_not(
        tmp_path: Path) -> None:
    """`secure_delete=ON` (the store's setting) zeroes deleted cells, yet a page rebuilt by
    balancing keeps bytes of cells that lived there in its unallocated space: some deleted
    rows stay in the file. Its canonical pages make the same database without them."""
    left_by_sqlite = 0
    for seed in range(3):
        db = tmp_path / f"secure-{seed}.sqlite"
        markers = _churn(db, seed, secure_delete=True)
        left_by_sqlite += len(_left(db.read_bytes(), markers))
        out = _canonical(db, tmp_path / f"canonical-{seed}.sqlite")
        assert _left(out.read_bytes(), markers) == []
        assert _integrity(out) == "ok"
        assert _rows(out) == _rows(db)
    assert left_by_sqlite > 0  # what makes canonical pages necessary (module doc)


def test_without_secure_delete_freeblocks_and_free_pages_are_zeroed_too(tmp_path: Path) -> None:
    """An index written before the store turned `secure_delete` on keeps deleted cells in
    freeblocks and whole deleted pages on the freelist: canonical pages hold none of them."""
    db = tmp_path / "plain.sqlite"
    markers = _churn(db, 7, secure_delete=False)
    con = sqlite3.connect(db)
    gone = [f"marker-{key}" for (key,) in con.execute("SELECT id FROM t WHERE rowid % 3 = 0")]
    con.execute("DELETE FROM t WHERE rowid % 3 = 0")  # whole pages go to the freelist
    con.commit()
    con.close()
    layout = read_layout(db)
    assert layout.free_leaves and layout.free_trunks
    assert len(_left(db.read_bytes(), markers)) > 100
    out = _canonical(db, tmp_path / "canonical.sqlite")
    assert _left(out.read_bytes(), markers + gone) == []
    assert _integrity(out) == "ok"
    assert _rows(out) == _rows(db)
    for leaf in layout.free_leaves:
        assert not any(out.read_bytes()[leaf * layout.page_size:(leaf + 1) * layout.page_size])


def test_a_page_left_as_sqlite_wrote_it_when_nothing_is_left_behind(tmp_path: Path) -> None:
    """A freshly written file's pages are already canonical: the same bytes come back."""
    db = tmp_path / "fresh.sqlite"
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    con.executemany("INSERT INTO t (body) VALUES (?)", [("x" * 200,) for _ in range(2000)])
    con.commit()
    con.close()
    assert _canonical(db, tmp_path / "out.sqlite").read_bytes() == db.read_bytes()


def test_pages_publishing_cannot_be_sure_of_are_left_as_they_are(tmp_path: Path) -> None:
    """With auto_vacuum its pointer-map pages could pass for b-tree pages: nothing is touched.
    A b-tree page whose freeblock chain does not add up is left as it is too."""
    db = tmp_path / "auto.sqlite"
    con = sqlite3.connect(db)
    con.execute("PRAGMA auto_vacuum=FULL")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
    con.executemany("INSERT INTO t (body) VALUES (?)", [("x" * 300,) for _ in range(500)])
    con.commit()
    con.close()
    layout = read_layout(db)
    assert not layout.canonical
    page = next(iter_pages(db, layout.page_size))
    assert canonical_page(page, 0, layout) is page

    plain = tmp_path / "plain.sqlite"
    _churn(plain, 3, secure_delete=False)
    layout = read_layout(plain)
    pages = list(iter_pages(plain, layout.page_size))
    number, page = next((i, p) for i, p in enumerate(pages)
                        if i and p[0] == 13 and int.from_bytes(p[1:3], "big"))
    assert canonical_page(page, number, layout) != page  # its freeblocks hold deleted cells
    broken = bytearray(page)
    broken[1:3] = (layout.usable - 2).to_bytes(2, "big")  # a freeblock past the page's end
    assert canonical_page(bytes(broken), number, layout) == bytes(broken)


def test_page_size_of_the_header_including_64_kib(tmp_path: Path) -> None:
    big = tmp_path / "big.sqlite"
    con = sqlite3.connect(big)
    con.execute("PRAGMA page_size=65536")
    con.execute("CREATE TABLE t (body TEXT)")
    con.execute("INSERT INTO t VALUES ('x')")
    con.commit()
    con.close()
    assert page_size(big) == 65536  # stored as 1 in the header
    assert read_layout(big).pages == big.stat().st_size // 65536
    (tmp_path / "text").write_text("not a database" * 20)
    with pytest.raises(ValueError, match="not an SQLite database"):
        page_size(tmp_path / "text")


def test_the_store_zeroes_what_sqlite_left_in_its_own_file(tmp_path: Path) -> None:
    """Store.truncate_wal, which the writer calls after a run that removed text, makes the
    index database's own pages canonical in place: the deleted rows' bytes SQLite left are gone,
    the database reads the same, including to a connection that stayed open meanwhile, and a
    write after it does not bring them back."""
    from canopy.store.store import Store

    index_dir = tmp_path / "index"
    index_dir.mkdir()
    store = Store(index_dir)
    store.close()
    db = index_dir / "canopy.sqlite"
    markers: list[str] = []
    for seed in range(3):  # some seeds leave nothing behind: churn until one does
        churned = tmp_path / f"churn-{seed}.sqlite"
        markers = _churn(churned, seed, secure_delete=True)
        if _left(churned.read_bytes(), markers):
            break
    assert _left(churned.read_bytes(), markers)
    db.unlink()
    db.write_bytes(churned.read_bytes())
    def t_rows() -> list[str]:  # the store adds its own tables when it opens the file
        return [r for r in _rows(db) if r.startswith("t:")]

    rows = t_rows()
    reader = sqlite3.connect(db)
    reader.execute("SELECT COUNT(*) FROM t").fetchone()  # a connection with pages cached
    store = Store(index_dir)
    try:
        assert store.truncate_wal()
        assert _left(db.read_bytes(), markers) == []
        assert _integrity(db) == "ok" and t_rows() == rows
        assert reader.execute("SELECT COUNT(*) FROM t").fetchone()[0] == len(rows)
        with store.transaction() as con:
            con.execute("UPDATE t SET name = name || '!'")
        assert store.truncate_wal()
        assert _left(db.read_bytes(), markers) == []
    finally:
        reader.close()
        store.close()
