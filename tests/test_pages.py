"""Page patches of the index database (canopy.publish.pages): a patch against a base rebuilds
exactly the new file, whatever happened between (updates, inserts, deletes, growth, shrinking),
and what is not a patch or not a database is refused."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path

import pytest

from canopy.publish.pages import (
    REBASE_SHARE,
    PageDigests,
    apply_patch,
    page_digests,
    page_size,
    write_patch,
)


def _database(path: Path, rows: int, *, page: int = 4096, seed: int = 0) -> None:
    rng = random.Random(seed)
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA page_size={page}")
    con.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
    con.executemany("INSERT INTO t VALUES (?, ?)",
                    [(f"{rng.getrandbits(64):016x}", "x" * rng.randrange(50, 400))
                     for _ in range(rows)])
    con.commit()
    con.close()


def _copy(src: Path, dst: Path) -> Path:
    """What publishing stages: an online backup, page for page."""
    a, b = sqlite3.connect(src), sqlite3.connect(dst)
    a.backup(b)
    b.execute("PRAGMA journal_mode=DELETE")
    b.close()
    a.close()
    return dst


def _roundtrip(tmp_path: Path, base: Path, new: Path) -> int:
    patch, out = tmp_path / "p", tmp_path / "out.sqlite"
    carried, digests = write_patch(page_digests(base), new, patch)
    assert carried is not None
    assert digests == page_digests(new)  # taken in the same read
    apply_patch(base, patch, out)
    assert out.read_bytes() == new.read_bytes()
    return carried


def test_a_few_random_inserts_patch_a_few_pages_and_rebuild_the_file(tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    _database(live, 20_000)
    base = _copy(live, tmp_path / "base.sqlite")
    con = sqlite3.connect(live)
    con.executemany("INSERT INTO t VALUES (?, ?)", [(f"k{i:05d}", "y" * 120) for i in range(20)])
    con.execute("UPDATE t SET body = 'z' WHERE rowid % 997 = 0")
    con.commit()
    con.close()
    new = _copy(live, tmp_path / "new.sqlite")
    carried = _roundtrip(tmp_path, base, new)
    assert 0 < carried < new.stat().st_size / 10
    assert (tmp_path / "p").stat().st_size < carried  # compressed


def test_growth_and_shrinking_rebuild_exactly(tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    _database(live, 3_000, seed=1)
    base = _copy(live, tmp_path / "base.sqlite")
    con = sqlite3.connect(live)
    con.executemany("INSERT INTO t VALUES (?, ?)", [(f"g{i:05d}", "w" * 300) for i in range(400)])
    con.commit()
    grown = _copy(live, tmp_path / "grown.sqlite")
    assert grown.stat().st_size > base.stat().st_size
    _roundtrip(tmp_path, base, grown)
    con.execute("DELETE FROM t WHERE rowid % 2 = 0")
    con.commit()
    con.execute("VACUUM")
    con.close()
    shrunk = _copy(live, tmp_path / "shrunk.sqlite")
    assert shrunk.stat().st_size < base.stat().st_size
    patch = tmp_path / "shrink.patch"
    if write_patch(page_digests(grown), shrunk, patch)[0] is not None:  # VACUUM moved most pages
        apply_patch(grown, patch, tmp_path / "s.sqlite")
        assert (tmp_path / "s.sqlite").read_bytes() == shrunk.read_bytes()


def test_a_patch_that_would_carry_most_of_the_file_is_not_written(tmp_path: Path) -> None:
    a, b = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    _database(a, 2_000, seed=2)
    _database(b, 2_000, seed=3)  # other keys: nearly every page differs
    carried, digests = write_patch(page_digests(a), b, tmp_path / "p")
    assert carried is None and not (tmp_path / "p").exists()
    assert digests == page_digests(b)  # b becomes the next base
    assert write_patch(None, b, tmp_path / "p")[0] is None  # no base: nothing to patch
    assert REBASE_SHARE < 1


def test_page_size_of_the_header_including_64_kib(tmp_path: Path) -> None:
    big = tmp_path / "big.sqlite"
    _database(big, 200, page=65536)
    assert page_size(big) == 65536  # stored as 1 in the header
    other = tmp_path / "other.sqlite"
    _database(other, 200, page=1024)
    assert write_patch(page_digests(big), other, tmp_path / "p")[0] is None  # page sizes differ
    (tmp_path / "text").write_text("not a database" * 20)
    with pytest.raises(ValueError, match="not an SQLite database"):
        page_size(tmp_path / "text")


def test_a_damaged_patch_is_refused(tmp_path: Path) -> None:
    live = tmp_path / "live.sqlite"
    _database(live, 5_000, seed=4)
    base = _copy(live, tmp_path / "base.sqlite")
    con = sqlite3.connect(live)
    con.execute("UPDATE t SET body = 'changed' WHERE rowid % 50 = 0")
    con.commit()
    con.close()
    new = _copy(live, tmp_path / "new.sqlite")
    patch = tmp_path / "p"
    assert write_patch(page_digests(base), new, patch)[0] is not None
    raw = patch.read_bytes()
    (tmp_path / "cut").write_bytes(raw[:-40])
    with pytest.raises(ValueError):
        apply_patch(base, tmp_path / "cut", tmp_path / "o1")
    (tmp_path / "foreign").write_bytes(b"PK\x03\x04" + raw[4:])
    with pytest.raises(ValueError, match="not a page patch"):
        apply_patch(base, tmp_path / "foreign", tmp_path / "o2")


def test_digests_survive_a_save_and_a_damaged_file_reads_as_none(tmp_path: Path) -> None:
    db = tmp_path / "a.sqlite"
    _database(db, 1_000, seed=5)
    digests = page_digests(db)
    digests.save(tmp_path / "d")
    again = PageDigests.load(tmp_path / "d")
    assert again == digests and again.pages == db.stat().st_size // 4096
    (tmp_path / "d").write_bytes((tmp_path / "d").read_bytes()[:-3])
    assert PageDigests.load(tmp_path / "d") is None
    assert PageDigests.load(tmp_path / "missing") is None
