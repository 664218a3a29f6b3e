"""The index's source of truth: one SQLite database (WAL) in the index folder.

- Readers take a `snapshot()`: a read transaction on a connection of their own thread, so one
  request sees one committed generation from its first read to its last, however many writes
  commit meanwhile, and requests on different threads read in parallel.
- The writer (one per index, canopy's writer lock) stages a new generation beside the committed
  one and swaps it in with one short transaction (canopy.store.staging).
- Caches (LLM responses, embeddings, per-caller views) and per-unit extraction instances are
  written outside generations on the store's own connection: they only ever save work. Each
  cached response and view records the text units it derives from (canopy.store.sources), so
  removing a unit removes them too.
- Deleted rows leave no trace in the file: every connection runs with `secure_delete=ON`, which
  overwrites freed cells and pages with zeros as they are freed. Its cost is the writes to
  freed pages, paid by the deletes that free them (a VACUUM instead would rewrite the whole
  file, 1-2 GB at scale, per deletion). Old page images in the WAL go at the next complete
  checkpoint (`journal_size_limit=0` truncates the WAL then); the writer forces one after a
  run that removed text (`truncate_wal`).
- A file SQLite reports as damaged ("file is not a database", "malformed") raises
  `IndexDamaged`, never a raw sqlite3 error.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from canopy.aliases import Alias
from canopy.errors import IndexDamaged
from canopy.health import DB_NAME, is_corruption, never_written, write_failure, writes_to
from canopy.model import Extraction, Skip, UnitFailure
from canopy.store.instances import Rekeyed, extraction_rows, rekeyed
from canopy.store.pages import zero_left_behind
from canopy.store.reads import COMMITTED, GraphReads
from canopy.store.rows import dump
from canopy.store.schema import migrate
from canopy.store.sources import current_sources, record

__all__ = ["DB_NAME", "RunRecord", "Snapshot", "Store"]

_TIMEOUT_S = 30.0

log = logging.getLogger(__name__)


def connect(path: Path, cache_kib: int = 8192) -> sqlite3.Connection:
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=_TIMEOUT_S)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA temp_store=FILE")
    db.execute(f"PRAGMA cache_size=-{cache_kib}")  # index-heavy writes thrash the 2 MB default
    db.execute("PRAGMA secure_delete=ON")  # deleted text is zeroed, not left in free pages
    db.execute("PRAGMA journal_size_limit=0")  # a reset WAL is truncated: no stale frames kept
    return db


@contextmanager
def damage_as_index_damaged(index_dir: Path | None = None) -> Iterator[None]:
    """SQLite's "the file is damaged" errors become IndexDamaged (the raw text goes to the log).
    With `index_dir`, what the folder did (a full disk, a read-only file system, no permission:
    SQLite reports some of these as I/O errors too) becomes IndexUnwritable instead."""
    try:
        yield
    except sqlite3.DatabaseError as exc:
        failure = write_failure(exc, index_dir) if index_dir is not None else None
        if failure is not None:
            log.info("the index database at %s cannot be written: %s", index_dir, exc)
            raise failure from None
        if not is_corruption(exc):
            raise
        log.info("the index database is damaged: %s", exc)
        raise IndexDamaged("its database cannot be read") from None


@dataclass(frozen=True)
class RunRecord:
    id: int
    started: float
    finished: float | None
    generation: int | None
    stats: dict[str, Any]
    usage: dict[str, dict[str, Any]]


class Snapshot(GraphReads):
    """One committed generation, read through indexes (see GraphReads) plus its metadata."""

    def meta(self, key: str, default: str | None = None) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    @property
    def generation(self) -> int:
        return int(self.meta("generation", "0") or 0)

    def acl_classes(self) -> dict[int, tuple[str, ...]]:
        return {i: tuple(json.loads(labels)) for i, labels in
                self.db.execute("SELECT id, labels FROM acl_classes")}

    def failures(self) -> list[UnitFailure]:
        return [
            UnitFailure(*r) for r in self.db.execute("SELECT unit_id, task, error FROM failures")
        ]

    def skips(self) -> list[Skip]:
        return [Skip(*r) for r in self.db.execute("SELECT path, reason FROM skips ORDER BY path")]


# The reader connection each store (by id) holds a snapshot open on in this context, and the
# thread it is used on. A context is a thread's, or an asyncio task's: a task runs in a copy of its
# creator's context, so the tasks a call starts share its snapshot, while calls running side by
# side on one event loop each have their own. A task started from another thread (its creator's
# context copied there) does not share the creator's connection.
_HELD: ContextVar[dict[int, tuple[sqlite3.Connection, int]] | None] = ContextVar(
    "canopy_snapshots", default=None)


class Store:
    """SQLite access for one index folder. Safe to share between threads."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = Path(index_dir)
        with writes_to(self.index_dir):
            self.index_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.index_dir / DB_NAME
        if self.path.exists() and self.path.stat().st_size == 0 and not never_written(
                self.index_dir):
            # SQLite would take an empty file for a new database and build an empty index in
            # it, hiding that the real one was lost. (An empty file with nothing else beside it
            # is a first build that stopped before its first write, e.g. on a full disk.)
            raise IndexDamaged("its database file is empty")
        self._lock = threading.RLock()
        # Responses cached but not yet written (`batch_cache_writes`): one transaction per
        # reply was a fifth of an index run's CPU against a fast endpoint.
        self._cache_pending: dict[str, tuple[str, frozenset[str]]] = {}
        self._cache_batch = 0
        self._readers: list[sqlite3.Connection] = []
        self._idle: list[sqlite3.Connection] = []
        with damage_as_index_damaged(self.index_dir), writes_to(self.index_dir):
            self._db = connect(self.path, cache_kib=32768)  # the writer's: 32 MB of page cache
            try:
                with self._lock:
                    migrate(self._db)
            except BaseException:
                self._db.close()
                raise

    def close(self) -> None:
        with self._lock:
            if self._cache_pending:
                with self.transaction():
                    pass
            for db in self._readers:
                db.close()
            self._readers.clear()
            self._db.close()

    # ---- reading ------------------------------------------------------------------------------

    @contextmanager
    def snapshot(self) -> Iterator[Snapshot]:
        """A consistent read of the committed generation on a reader connection of its own;
        snapshots nested in one (in the same thread, or in the same asyncio task and the tasks
        it starts) share the outer one."""
        held = _HELD.get() or {}
        mine = held.get(id(self))
        if mine is not None and mine[1] == threading.get_ident():
            yield Snapshot(mine[0], COMMITTED)
            return
        with self._lock:
            db = self._idle.pop() if self._idle else None
        if db is None:
            db = connect(self.path)
            with self._lock:
                self._readers.append(db)
        token = _HELD.set({**held, id(self): (db, threading.get_ident())})
        db.execute("BEGIN")
        try:
            yield Snapshot(db, COMMITTED)
        finally:
            _HELD.reset(token)
            try:
                db.execute("COMMIT")
            finally:
                with self._lock:
                    self._idle.append(db)

    @property
    def generation(self) -> int:
        return int(self.get_meta("generation", "0") or 0)

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    def failures(self) -> list[UnitFailure]:
        with self.snapshot() as s:
            return s.failures()

    def skips(self) -> list[Skip]:
        with self.snapshot() as s:
            return s.skips()

    def runs(self, limit: int = 5) -> list[RunRecord]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, started, finished, generation, stats, usage FROM runs "
                "ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
        return [RunRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5])) for r in rows]

    def usage_total(self) -> dict[str, dict[str, int]]:
        """LLM usage summed over every run recorded, by task (the runs table keeps each run's)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT u.key, SUM(json_extract(u.value, '$.calls')), "
                "SUM(json_extract(u.value, '$.cached')), "
                "SUM(json_extract(u.value, '$.prompt_tokens')), "
                "SUM(json_extract(u.value, '$.completion_tokens')) "
                "FROM runs, json_each(runs.usage) AS u GROUP BY u.key ORDER BY u.key").fetchall()
        return {task: {"calls": int(c or 0), "cached": int(k or 0), "prompt_tokens": int(p or 0),
                       "completion_tokens": int(o or 0)} for task, c, k, p, o in rows}

    # ---- writing (the writer's connection) ------------------------------------------------------

    @property
    def writer(self) -> sqlite3.Connection:
        """The connection generations are staged and committed on (canopy.store.staging)."""
        return self._db

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction; cached responses still pending are written in it first, so a
        purge or a commit always sees them."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                if self._cache_pending:
                    self._write_pending(self._db)
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def set_meta(self, values: dict[str, str]) -> None:
        with self.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", values.items())

    def acl_class(self, labels: Iterable[str]) -> int:
        """The id of a label set (created on first use; ids are never reused)."""
        key = dump(sorted(set(labels)))
        with self._lock:
            row = self._db.execute("SELECT id FROM acl_classes WHERE labels=?", (key,)).fetchone()
            if row is not None:
                return int(row[0])
            cur = self._db.execute("INSERT INTO acl_classes (labels) VALUES (?)", (key,))
            return int(cur.lastrowid or 0)

    def finish_run(self, run_id: int, stats: dict[str, Any]) -> None:
        """Record a committed run's final figures (counts are taken after its commit)."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET stats=? WHERE id=?", (dump(stats), run_id))

    def start_run(self) -> int:
        with self.transaction() as db:
            cur = db.execute("INSERT INTO runs (started, stats, usage) VALUES (?, '{}', '{}')",
                             (time.time(),))
            return int(cur.lastrowid or 0)

    # ---- extraction instances (saved as soon as they exist) -------------------------------------

    def save_extractions(self, extractions: Iterable[Extraction]) -> None:
        """Units' extractions, replacing earlier ones, in one transaction: saved as soon as they
        exist, so a crash later never loses them."""
        extractions = list(extractions)
        if not extractions:
            return
        with self.transaction() as db:
            _drop_instances(db, [ex.unit_id for ex in extractions])
            for ex in extractions:
                rows = extraction_rows(ex)
                db.executemany(
                    "INSERT INTO entity_instances (unit_id, pos, key, name, type, description, "
                    "unit_key) VALUES (?, ?, ?, ?, ?, ?, ?)", rows.entities)
                db.executemany(
                    "INSERT INTO relationship_instances (unit_id, pos, rid, source_key, "
                    "target_key, description, strength, unit_source, unit_target) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows.relationships)
                db.executemany(
                    "INSERT INTO claim_instances (unit_id, pos, subject_key, object_key, type, "
                    "status, description, start_date, end_date, quote, unit_subject, "
                    "unit_object) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows.claims)
                db.execute(
                    "INSERT OR REPLACE INTO extracted VALUES (?, ?)", (ex.unit_id, ex.passes)
                )

    def extracted(self, unit_ids: Iterable[str]) -> set[str]:
        """Which of these units have a stored extraction."""
        with self._lock:
            rows = self._db.execute(
                "SELECT unit_id FROM extracted WHERE unit_id IN (SELECT value FROM json_each(?))",
                (dump(sorted(set(unit_ids))),),
            )
            return {r[0] for r in rows}

    def instance_keys(self, unit_ids: Iterable[str]) -> tuple[set[str], set[str]]:
        """(entity keys, relationship ids) with an instance in these units."""
        ids = dump(sorted(set(unit_ids)))
        with self._lock:
            keys = {r[0] for r in self._db.execute(
                "SELECT DISTINCT key FROM entity_instances WHERE unit_id IN "
                "(SELECT value FROM json_each(?))", (ids,))}
            rids = {r[0] for r in self._db.execute(
                "SELECT DISTINCT rid FROM relationship_instances WHERE unit_id IN "
                "(SELECT value FROM json_each(?)) AND rid != ''", (ids,))}
        return keys, rids

    def unit_key_instances(self, unit_ids: Iterable[str]
                           ) -> dict[str, list[tuple[str, str, str]]]:
        """The entity instances of these units as (name, type, unit key), by unit, in position
        order: what their document's links are settled from (canopy.aliases.document_links)."""
        out: dict[str, list[tuple[str, str, str]]] = {}
        with self._lock:
            rows = self._db.execute(
                "SELECT unit_id, name, type, unit_key FROM entity_instances WHERE unit_id IN "
                "(SELECT value FROM json_each(?)) ORDER BY unit_id, pos",
                (dump(sorted(set(unit_ids))),)).fetchall()
        for uid, name, type_, unit_key in rows:
            out.setdefault(uid, []).append((name, type_, unit_key))
        return out

    def rekey(self, links: dict[str, dict[str, Alias]], unit_ids: Iterable[str]) -> Rekeyed:
        """Give these units' instances the keys their documents' links make of their unit keys
        (canopy.store.instances.rekeyed), in one transaction that also records, until the
        regeneration commits (meta `rekeyed`), the units changed and the keys and rids their
        rows had: a run interrupted after it still merges those again."""
        ids = dump(sorted(set(unit_ids)))
        with self.transaction() as db:
            entities = db.execute(
                "SELECT unit_id, pos, key, unit_key FROM entity_instances WHERE unit_id IN "
                "(SELECT value FROM json_each(?))", (ids,)).fetchall()
            relationships = db.execute(
                "SELECT unit_id, pos, rid, source_key, target_key, unit_source, unit_target "
                "FROM relationship_instances WHERE unit_id IN (SELECT value FROM json_each(?))",
                (ids,)).fetchall()
            claims = db.execute(
                "SELECT unit_id, pos, subject_key, object_key, unit_subject, unit_object FROM "
                "claim_instances WHERE unit_id IN (SELECT value FROM json_each(?))",
                (ids,)).fetchall()
            out = rekeyed(links, entities, relationships, claims)
            if not out.units:
                return out
            db.executemany("UPDATE entity_instances SET key = ? WHERE unit_id = ? AND pos = ?",
                           out.entities)
            db.executemany("UPDATE relationship_instances SET rid = ?, source_key = ?, "
                           "target_key = ? WHERE unit_id = ? AND pos = ?", out.relationships)
            db.executemany("UPDATE claim_instances SET subject_key = ?, object_key = ? "
                           "WHERE unit_id = ? AND pos = ?", out.claims)
            row = db.execute("SELECT value FROM meta WHERE key = 'rekeyed'").fetchone()
            pending = json.loads(row[0]) if row and row[0] else {}
            pending = {"units": sorted(set(pending.get("units", ())) | out.units),
                       "keys": sorted(set(pending.get("keys", ())) | out.keys),
                       "rids": sorted(set(pending.get("rids", ())) | out.rids)}
            db.execute("INSERT OR REPLACE INTO meta VALUES ('rekeyed', ?)", (dump(pending),))
        return out

    def pending_rekeyed(self) -> tuple[set[str], set[str], set[str]]:
        """(units, keys, rids) rekeyed since the last commit (`rekey`)."""
        pending = json.loads(self.get_meta("rekeyed", "") or "{}")
        return (set(pending.get("units", ())), set(pending.get("keys", ())),
                set(pending.get("rids", ())))

    def entity_keys_by_unit(self, unit_ids: Iterable[str]) -> dict[str, list[str]]:
        """The entity keys extracted from each of these units, in extraction order, once each."""
        out: dict[str, list[str]] = {}
        with self._lock:
            rows = self._db.execute(
                "SELECT unit_id, key FROM entity_instances WHERE unit_id IN "
                "(SELECT value FROM json_each(?)) ORDER BY unit_id, pos",
                (dump(sorted(set(unit_ids))),)).fetchall()
        for uid, key in rows:
            keys = out.setdefault(uid, [])
            if key not in keys:
                keys.append(key)
        return out

    def claim_instances(
        self, unit_ids: Iterable[str]
    ) -> list[tuple[str, int, str, str, str, str, str, str, str, str]]:
        ids = dump(sorted(set(unit_ids)))
        with self._lock:
            return self._db.execute(
                "SELECT unit_id, pos, subject_key, object_key, type, status, description, "
                "start_date, end_date, quote FROM "
                "claim_instances WHERE unit_id IN (SELECT value FROM json_each(?)) "
                "ORDER BY unit_id, pos", (ids,)).fetchall()

    # ---- caches (written outside generations: they only ever save work) -------------------------

    def cache_get(self, key: str) -> str | None:
        with self._lock:
            pending = self._cache_pending.get(key)
            if pending is not None:
                return pending[0]
            row = self._db.execute("SELECT response FROM llm_cache WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def cache_put(self, key: str, response: str) -> None:
        """Cache a response, with the units the current `cache_sources` block declares."""
        sources = current_sources()
        with self._lock:
            self._cache_pending[key] = (response, sources)
            if len(self._cache_pending) < self._cache_batch:
                return
            with self.transaction():
                pass  # writes what is pending

    def batch_cache_writes(self, size: int) -> None:
        """Write cached responses `size` at a time (1: each at once, the default). For an index
        run, the one writer: a crash loses at most the responses of one batch, which are asked
        again. Every write transaction, and `close`, writes what is pending first."""
        with self._lock:
            self._cache_batch = size
            if size <= 1 and self._cache_pending:
                with self.transaction():
                    pass

    def _write_pending(self, db: sqlite3.Connection) -> None:
        db.executemany("INSERT OR REPLACE INTO llm_cache VALUES (?, ?)",
                       [(k, r) for k, (r, _) in self._cache_pending.items()])
        for key, (_, sources) in self._cache_pending.items():
            record(db, key, sources)
        self._cache_pending.clear()

    def embeddings_get(self, keys: Iterable[str]) -> dict[str, bytes]:
        with self._lock:
            rows = self._db.execute("SELECT key, vector FROM embeddings WHERE key IN "
                                    "(SELECT value FROM json_each(?))", (dump(sorted(set(keys))),))
            return dict(rows.fetchall())

    def embeddings_put(self, rows: dict[str, bytes], sources: dict[str, Iterable[str]]) -> None:
        """Cache vectors by key, and record the text units each key's text derives from (a
        vector can betray its text: it goes when they do)."""
        with self.transaction() as db:
            db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?)", rows.items())
            for key, units in sources.items():
                record(db, key, units)

    def element_tokens(self, keys: Iterable[str]) -> dict[str, int]:
        """Known token sizes of report-context elements (ElementSizes), by key."""
        with self._lock:
            rows = self._db.execute("SELECT key, tokens FROM element_tokens WHERE key IN "
                                    "(SELECT value FROM json_each(?))", (dump(sorted(set(keys))),))
            return dict(rows.fetchall())

    def element_tokens_clear(self) -> None:
        """Forget every size (a full build counts afresh: sizes of gone elements go too)."""
        with self.transaction() as db:
            db.execute("DELETE FROM element_tokens")

    def element_tokens_put(self, sizes: dict[str, int]) -> None:
        """Remember token sizes by key (derived from content hashes: they hold no text)."""
        if sizes:
            with self.transaction() as db:
                db.executemany("INSERT OR REPLACE INTO element_tokens VALUES (?, ?)",
                               sorted(sizes.items()))

    def view_get(self, key: str) -> tuple[str, str] | None:
        """(kind, payload) of a cached per-caller view (canopy.acl.view_cache), or None."""
        with self._lock:
            row = self._db.execute("SELECT kind, payload FROM acl_views WHERE key=?",
                                   (key,)).fetchone()
        return (row[0], row[1]) if row else None

    def view_put(self, key: str, *, kind: str, artifact_id: str, payload: str,
                 units: Iterable[str]) -> None:
        """Store a view derived from these text units."""
        with self.transaction() as db:
            db.execute("INSERT OR REPLACE INTO acl_views VALUES (?, ?, ?, ?, ?, ?)",
                       (key, kind, artifact_id, payload, len(payload), time.time()))
            record(db, key, units)

    def view_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT kind, COUNT(*) FROM acl_views GROUP BY kind"))

    def truncate_wal(self) -> bool:
        """Checkpoint the WAL into the database file and truncate it to zero bytes, so page
        images of deleted rows leave the disk now, then zero what B-tree balancing left of
        deleted cells in the file's pages (canopy.store.pages: secure_delete does not reach
        it); False when a reader still holds an older snapshot (then the next complete
        checkpoint does the first, the next run that removes text the second). Waits at most a
        second."""
        with self._lock:
            self._db.execute("PRAGMA busy_timeout=1000")
            try:
                busy, _, _ = self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                if not busy:
                    self._db.execute("BEGIN IMMEDIATE")  # no writer while the file is scrubbed
                    try:
                        wal = self.path.with_name(self.path.name + "-wal")
                        if not wal.exists() or wal.stat().st_size == 0:
                            zero_left_behind(self.path)
                    finally:
                        self._db.execute("COMMIT")
                    # this connection's cached page images still hold the old bytes: drop them,
                    # or its next write of such a page would put them back
                    self._db.execute("PRAGMA shrink_memory")
            except sqlite3.OperationalError as exc:  # busy: another writer holds the lock
                log.info("the index database was not scrubbed now: %s", exc)
                return False
            finally:
                self._db.execute(f"PRAGMA busy_timeout={int(_TIMEOUT_S * 1000)}")
        return not busy

    def views_prune(self) -> int:
        """Drop cached views of artifacts the committed generation no longer has; how many."""
        with self.transaction() as db:
            cur = db.execute("DELETE FROM acl_views WHERE artifact_id NOT IN (SELECT id FROM "
                             "entities UNION ALL SELECT id FROM relationships UNION ALL "
                             "SELECT id FROM communities)")
            return cur.rowcount


def _drop_instances(db: sqlite3.Connection, unit_ids: list[str]) -> None:
    ids = dump(sorted(set(unit_ids)))
    for table in ("entity_instances", "relationship_instances", "claim_instances", "extracted"):
        db.execute(f"DELETE FROM {table} WHERE unit_id IN (SELECT value FROM json_each(?))",  # noqa: S608
                   (ids,))
