"""Is an index readable? Checks for `canopy status`, the writer and the server, and moving a
damaged index aside so `canopy index --full` can always rebuild it (issue "Safety", case 8).

Three depths, by cost:
- `check_database`: open the SQLite file read-only, read the generation and count the rows of
  the generation tables. Milliseconds on a 1-2 GB index, and it catches what a truncated or
  overwritten file does (SQLite compares the size in its header with the file's: "malformed").
  `PRAGMA quick_check` would also catch torn pages inside the file, but it reads every page:
  about 0.5 s per 600 MB with a warm page cache, so only `canopy status --check` runs it.
- `check_search_files`: the search tables' folders, without importing lancedb (which takes 1-2
  s): every committed table is there, its committed version's manifest is there, and each Lance
  file ends with its format's magic bytes, so a missing or truncated file is found by one small
  read per file.
- `check_search_tables` (lancedb): each table opens at its committed version, and its row count
  agrees with the database. The writer runs it before an update (it imports lancedb anyway),
  and `canopy status --check` does.

Reasons are short phrases with no paths and no library text: they reach callers of every kind.

A failed write is not damage: `write_failure` tells a full disk, a read-only folder, a missing
permission and a database another process holds locked from damage (SQLite reports some of
them as I/O errors, LanceDB as its own), so that an operator is told to free space or fix the
folder, not to rebuild (issue 30: a disk-full first build read as "damaged ... rebuild with
--full", which moved the database and its LLM cache aside).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from canopy.errors import IndexDamaged, IndexUnwritable

__all__ = [
    "DAMAGED_PREFIX",
    "DB_NAME",
    "DatabaseFacts",
    "check_database",
    "check_search_files",
    "check_search_tables",
    "index_committed",
    "is_corruption",
    "never_written",
    "quarantine",
    "raise_if_damaged",
    "write_failure",
    "writes_to",
]

log = logging.getLogger(__name__)

DB_NAME = "canopy.sqlite"  # the index database (canopy.store re-exports it)
LANCE_DIR = "lance"
DAMAGED_PREFIX = "damaged-"
_U64_MAX = (1 << 64) - 1  # Lance's v2 manifest names count down from here
_MAGIC = {".lance": b"LANC", ".manifest": b"LANC", ".arrow": b"ARROW1"}
# SQLite result codes that mean the file itself is bad (extended codes start with these).
_CORRUPT = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_IOERR")
# Tables whose search rows are one per database row when no revocation is pending.
_COUNTED = {"text_units": "text_units", "entities": "entities", "reports": "reports"}


# Free space under which an I/O error SQLite cannot explain is taken for a full disk.
_NEARLY_FULL = 16 << 20
_OS_ERROR = re.compile(r"os error (\d+)")  # how LanceDB (Rust) reports an errno
_FULL = (errno.ENOSPC, errno.EDQUOT)
_REMEDY = {
    "full": "Free space on that disk (or give --index-dir a folder on another one) and run the "
            "command again: it resumes where it stopped, and nothing already indexed is lost",
    "read-only": "Canopy writes its lock, database and search tables there: make the folder "
                 "writable, or give --index-dir a writable folder",
    "denied": "Give the user running canopy write permission on the index folder, or give "
              "--index-dir a folder it may write",
    "locked": "Another process holds the index database locked: let it finish (or stop it), "
              "then run the command again",
    "nolock": "The file system of the index folder does not support file locks: give "
              "--index-dir a folder on a local disk",
}
_PROBLEM = {
    "full": "no space left on the disk holding the index folder",
    "read-only": "the index folder is on a read-only file system",
    "denied": "permission denied writing to the index folder",
    "locked": "the index database stayed locked by another process past the wait for it",
    "nolock": "file locks are not supported in the index folder",
}


def _existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (a folder a failed run did not create)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _read_only(path: Path) -> bool:
    where = _existing(path)
    try:
        return bool(os.statvfs(where).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # Windows has no statvfs
        return not os.access(where, os.W_OK)


def _nearly_full(path: Path) -> bool:
    try:
        return shutil.disk_usage(_existing(path)).free < _NEARLY_FULL
    except OSError:
        return False


def _kind_of(exc: BaseException, index_dir: Path) -> str | None:
    """What kept a write to `index_dir` from happening, if it is not damage (see module doc)."""
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and not isinstance(exc, sqlite3.Error):
        m = _OS_ERROR.search(str(exc))  # LanceDB: "No space left on device (os error 28)"
        code = int(m.group(1)) if m else None
    if code in _FULL:
        return "full"
    if code == errno.EROFS:
        return "read-only"
    if code in (errno.EACCES, errno.EPERM):
        return "read-only" if _read_only(index_dir) else "denied"
    if code == errno.ENOLCK:
        return "nolock"
    if isinstance(exc, sqlite3.Error):
        name = getattr(exc, "sqlite_errorname", "") or ""
        if name.startswith("SQLITE_FULL"):
            return "full"
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            return "locked"
        if name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_IOERR", "SQLITE_PERM")):
            # SQLite says "I/O error" or "unable to open" for what the file system refused
            if _read_only(index_dir):
                return "read-only"
            if _nearly_full(index_dir):
                return "full"
            if name.startswith(("SQLITE_READONLY", "SQLITE_PERM")):
                return "denied"
    return None


def write_failure(exc: BaseException, index_dir: Path) -> IndexUnwritable | None:
    """The IndexUnwritable that `exc` means for `index_dir` (disk full, read-only, no
    permission, locked by another process), or None: `exc` is something else (damage, or a
    bug), to be handled as it was."""
    if isinstance(exc, IndexUnwritable):
        return exc
    kind = _kind_of(exc, Path(index_dir))
    if kind is None:
        return None
    return IndexUnwritable(_PROBLEM[kind], str(Path(index_dir)), _REMEDY[kind])


@contextmanager
def writes_to(index_dir: Path) -> Iterator[None]:
    """Within the block, an error that `write_failure` recognizes for `index_dir` becomes that
    IndexUnwritable (one line naming the folder and what to do; the library's own text goes to
    the log); every other error passes as it is."""
    try:
        yield
    except (OSError, sqlite3.Error, RuntimeError, ValueError) as exc:
        failure = write_failure(exc, index_dir)
        if failure is None:
            raise
        log.info("writing the index at %s failed: %s: %s", index_dir, type(exc).__name__, exc)
        raise failure from None


def is_corruption(exc: BaseException) -> bool:
    """True for SQLite errors that mean the database file is damaged (not busy, not a bug)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    return isinstance(exc, sqlite3.DatabaseError) and name.startswith(_CORRUPT)


@dataclass(frozen=True)
class DatabaseFacts:
    """What the search-table checks need from a readable database."""

    generation: int
    versions: dict[str, int]  # committed Lance table versions (meta "lance_versions")
    counts: dict[str, int]
    revoking: bool  # a revocation committed and its regeneration has not (search rows differ)


def never_written(index_dir: Path) -> bool:
    """Whether the index folder holds an empty database file and nothing else of an index (no
    search tables, no write-ahead log): a first build that stopped before SQLite wrote its
    first page (a full disk), not an index that lost its database."""
    index_dir = Path(index_dir)
    try:
        if (index_dir / DB_NAME).stat().st_size != 0:
            return False
        wal = index_dir / f"{DB_NAME}-wal"
        if wal.exists() and wal.stat().st_size > 0:
            return False
    except OSError:
        return False
    lance = index_dir / LANCE_DIR
    return not (lance.is_dir() and any(lance.iterdir()))


def check_database(index_dir: Path, *, thorough: bool = False) -> DatabaseFacts | str:
    """The facts of a readable database, or why it cannot be read. `thorough` adds
    `PRAGMA quick_check` (reads every page). An empty file that `never_written` explains is a
    database at generation 0."""
    path = Path(index_dir) / DB_NAME
    try:
        if path.stat().st_size == 0:
            if never_written(index_dir):
                return DatabaseFacts(0, {}, dict.fromkeys(("documents", *_COUNTED.values()), 0),
                                     False)
            return "its database file is empty"
    except FileNotFoundError:
        return "its database file is missing"
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0)
    except sqlite3.Error as exc:
        failure = write_failure(exc, index_dir)
        if failure is not None:
            raise failure from None
        log.info("cannot open the index database: %s", exc)
        return "its database cannot be read"
    try:
        return _facts(db, thorough)
    except sqlite3.OperationalError as exc:
        failure = write_failure(exc, index_dir)  # a read-only folder, a full disk: not damage
        if failure is not None:
            raise failure from None
        if is_corruption(exc):
            log.info("the index database is damaged: %s", exc)
            return "its database cannot be read"
        if "no such table" in str(exc):
            return "its database lacks the index tables"
        raise  # busy, locked: not damage
    except sqlite3.DatabaseError as exc:
        log.info("the index database is damaged: %s", exc)
        return "its database cannot be read"
    finally:
        db.close()


def _facts(db: sqlite3.Connection, thorough: bool) -> DatabaseFacts | str:
    db.execute("BEGIN")  # one snapshot for the meta and the counts
    meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN "
                           "('generation', 'lance_versions', 'revoking')").fetchall())
    counts = {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])  # noqa: S608
              for t in ("documents", *_COUNTED.values())}
    if thorough:
        problems = [r[0] for r in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            log.info("PRAGMA quick_check: %s", "; ".join(problems[:5]))
            return "its database fails SQLite's integrity check"
    db.execute("COMMIT")
    try:
        versions = {str(k): int(v) for k, v in
                    json.loads(meta.get("lance_versions") or "{}").items()}
    except (ValueError, TypeError, AttributeError):
        return "its record of the search tables cannot be read"
    return DatabaseFacts(int(meta.get("generation") or 0), versions, counts,
                         meta.get("revoking") == "1")


def _manifest(table: Path, version: int) -> Path | None:
    """The manifest file of `version` in either of Lance's naming schemes, if it exists."""
    for name in (f"{_U64_MAX - version:020d}.manifest", f"{version}.manifest"):
        path = table / "_versions" / name
        if path.is_file():
            return path
    return None


def _files(table: Path) -> Iterator[Path]:
    """The table's files that end with a magic number (object-store staging files, named
    `<file>#<n>` until renamed into place, are not finished files)."""
    for root, _, names in os.walk(table):
        for name in names:
            if "#" not in name and os.path.splitext(name)[1] in _MAGIC:
                yield Path(root, name)


def _committed_files(table: Path, manifest: Path) -> Iterator[Path]:
    """The files of `table` its committed version (`manifest`) may read. A write that failed
    (a full disk) leaves a partial file of a version that was never committed, which the next
    writer rolls back: that is no damage. A data file belongs when the manifest names it, an
    index when the manifest holds its id; other manifests never do; any other file (deletion
    vectors, which the manifest records by number) when it is no newer than the manifest."""
    body = manifest.read_bytes()
    made = manifest.stat().st_mtime_ns
    for path in _files(table):
        part = path.relative_to(table).parts
        if part[0] == "data":
            if path.name.encode() in body:
                yield path
        elif part[0] == "_indices" and len(part) > 2:
            try:
                if uuid.UUID(part[1]).bytes in body:
                    yield path
            except ValueError:
                yield path
        elif part[0] == "_versions":
            if path == manifest:
                yield path
        else:
            try:
                if path.stat().st_mtime_ns <= made:
                    yield path
            except FileNotFoundError:  # removed by a concurrent cleanup
                continue


def _intact(path: Path) -> bool:
    magic = _MAGIC[path.suffix]
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() < len(magic):
                return False
            fh.seek(-len(magic), os.SEEK_END)
            return fh.read(len(magic)) == magic
    except FileNotFoundError:  # removed by a concurrent cleanup of old versions: not damage
        return True


def check_search_files(index_dir: Path, versions: dict[str, int]) -> str | None:
    """Why the committed search tables cannot be read, judged from their files alone (None:
    nothing found). A table the generation does not record (none yet) is not looked at."""
    lance = Path(index_dir) / LANCE_DIR
    if versions and not lance.is_dir():
        return "its search tables are missing"
    for name, version in sorted(versions.items()):
        table = lance / f"{name}.lance"
        if not table.is_dir():
            return "a search table is missing"
        manifest = _manifest(table, version)
        if manifest is None:
            return "a search table lacks its committed version"
        if not all(_intact(path) for path in _committed_files(table, manifest)):
            return "a search table's files are truncated"
    return None


def index_committed(index_dir: Path) -> bool:
    """Whether `index_dir` holds a committed generation: the one test of "is there an index
    yet" (a first build killed before its first commit leaves a database at generation 0, which
    must be built, not served or waited for). A damaged database counts: opening it reports
    the damage."""
    if not (index_dir / DB_NAME).exists():
        return False
    facts = check_database(index_dir)
    return isinstance(facts, str) or facts.generation > 0


def check_search_tables(index_dir: Path, facts: DatabaseFacts) -> str | None:
    """Open each committed table at its version and compare its rows with the database's (the
    search rows of revoked artifacts are dropped before the artifacts are regenerated, so only
    text units are compared while a revocation is pending). Imports lancedb."""
    if not facts.versions:
        return None
    from canopy.lance import import_lancedb

    db = import_lancedb().connect(str(Path(index_dir) / LANCE_DIR))
    for name, version in sorted(facts.versions.items()):
        try:
            table = db.open_table(name)
            table.checkout(version)
            rows = table.count_rows()
        except Exception as exc:  # lancedb raises plain RuntimeError/ValueError/OSError
            log.info("search table %s cannot be opened at version %d: %s", name, version, exc)
            return "a search table cannot be opened at its committed version"
        expected = facts.counts.get(_COUNTED.get(name, ""), None)
        if expected is not None and (name == "text_units" or not facts.revoking) \
                and rows != expected:
            log.info("search table %s has %d rows, the database %d", name, rows, expected)
            return "the search tables do not match the database"
    return None


def quarantine(index_dir: Path, *, database: bool) -> Path:
    """Move the damaged parts of an index into `index_dir/damaged-<UTC time>/` and return that
    folder: the search tables always (they are derived data), and with `database` the SQLite
    files too. Nothing is deleted: the operator removes the folder once it is not needed."""
    index_dir = Path(index_dir)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    target = index_dir / f"{DAMAGED_PREFIX}{stamp}"
    n = 1
    while target.exists():
        n += 1
        target = index_dir / f"{DAMAGED_PREFIX}{stamp}-{n}"
    target.mkdir(parents=True)
    parts = [LANCE_DIR]
    if database:
        parts += [DB_NAME, f"{DB_NAME}-wal", f"{DB_NAME}-shm"]
    for part in parts:
        source = index_dir / part
        if source.exists():
            shutil.move(str(source), str(target / part))
    return target


def raise_if_damaged(index_dir: Path, *, thorough: bool = False) -> DatabaseFacts:
    """The database's facts, or IndexDamaged when the database or (judged by their files) the
    search tables are damaged; `thorough` adds SQLite's page check and opens the tables."""
    facts = check_database(index_dir, thorough=thorough)
    if isinstance(facts, str):
        raise IndexDamaged(facts)
    reason = check_search_files(index_dir, facts.versions)
    if reason is None and thorough:
        reason = check_search_tables(index_dir, facts)
    if reason is not None:
        raise IndexDamaged(reason)
    return facts
