"""The generation the writer is building, staged beside the committed one (design §4, §8).

Rows of the new generation go to a staging database attached to the writer's connection
(`stage.*`, same DDL as the committed tables, no journal: it is scratch space). Reads by the
writer go through temporary views that overlay the staged rows on the committed ones (`*_new`),
so every stage of the pipeline reads "the new generation" with the same indexed queries the
server uses (canopy.store.reads), and only what changed is ever materialized: memory follows
the change, not the corpus. `commit()` swaps the staged rows in with one short transaction;
readers see the previous generation until then. A crash leaves the committed generation
untouched; the staging file is discarded by the next run.

A full build stages every row and commits with the committed tables emptied first.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from canopy.model import Skip, UnitFailure
from canopy.store.reads import GraphReads, Tables
from canopy.store.rows import dump
from canopy.store.schema import GENERATION_TABLES, generation_ddl, run_script
from canopy.store.sources import UNATTRIBUTED, purge
from canopy.store.store import Store, _drop_instances

__all__ = ["CommitInfo", "Staging"]

log = logging.getLogger(__name__)

STAGE_FILE = "staging.sqlite"
_COUNTERS = ("term_df", "acl_stats")  # staged as deltas, added at commit


@dataclass
class CommitInfo:
    """What a commit records besides the staged rows."""

    meta: dict[str, str]
    failures: list[UnitFailure]
    skips: list[Skip]
    removed_units: list[str] = field(default_factory=list)  # their instances are dropped
    run_id: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)


class Staging:
    """Staged rows of the next generation over the writer's connection (see module docstring)."""

    def __init__(self, store: Store, *, full: bool) -> None:
        self.store = store
        self.full = full
        self.db = store.writer
        self.path = store.index_dir / STAGE_FILE
        for leftover in (self.path, self.path.with_name(STAGE_FILE + "-journal")):
            leftover.unlink(missing_ok=True)
        db = self.db
        db.execute("ATTACH DATABASE ? AS stage", (str(self.path),))
        db.execute("PRAGMA stage.journal_mode=OFF")
        db.execute("PRAGMA stage.synchronous=OFF")
        db.execute("PRAGMA stage.cache_size=-32768")
        run_script(db, generation_ddl("stage."))
        for table, key in GENERATION_TABLES:
            db.execute(f"CREATE TABLE stage.{table}_touched ({key} TEXT PRIMARY KEY) WITHOUT ROWID")
            base = "" if full else (f" UNION ALL SELECT * FROM main.{table} WHERE {key} NOT IN "
                                    f"(SELECT {key} FROM stage.{table}_touched)")
            db.execute(f"CREATE TEMP VIEW {table}_new AS SELECT * FROM stage.{table}{base}")
        for table in _COUNTERS:
            db.execute(f"CREATE TEMP VIEW {table}_new AS SELECT * FROM main.{table}")
        self.reads = GraphReads(db, Tables.prefixed("temp", "_new"))
        self._open = True

    # ---- staging rows -------------------------------------------------------------------------

    def put(self, table: str, rows: Iterable[tuple[Any, ...]]) -> None:
        """Stage rows of `table` (a generation table), replacing staged rows with the same key."""
        rows = list(rows)
        if not rows:
            return
        key = dict(GENERATION_TABLES)[table]
        marks = ",".join("?" * len(rows[0]))
        self.db.executemany(f"INSERT OR REPLACE INTO stage.{table} VALUES ({marks})", rows)
        if not self.full:  # a full build replaces every row: nothing to track
            # every generation table has its key in its first column
            self.db.executemany(f"INSERT OR IGNORE INTO stage.{table}_touched ({key}) VALUES (?)",
                                [(r[0],) for r in rows])

    def delete(self, table: str, keys: Iterable[str]) -> None:
        """Remove these keys from the new generation (staged or committed rows alike)."""
        keys = sorted(set(keys))
        if not keys:
            return
        key = dict(GENERATION_TABLES)[table]
        ids = dump(keys)
        self.db.execute(
            f"DELETE FROM stage.{table} WHERE {key} IN (SELECT value FROM json_each(?))", (ids,)
        )
        self.db.executemany(f"INSERT OR IGNORE INTO stage.{table}_touched ({key}) VALUES (?)",
                            [(k,) for k in keys])

    def put_members(self, members: Iterable[tuple[str, int, Iterable[str]]]) -> None:
        """The members of communities in the new generation, (community id, level, entity ids)
        each, replacing their previous ones."""
        members = list(members)
        if not self.full:
            self.delete("community_members", [cid for cid, _, _ in members])
        self.db.executemany(
            "INSERT INTO stage.community_members VALUES (?, ?, ?)",
            [(cid, e, level) for cid, level, ids in members for e in sorted(set(ids))],
        )

    def add_counts(
        self, term_df: dict[tuple[str, int], int], acl_stats: dict[int, tuple[int, int]]
    ) -> None:
        """Add deltas to the lexical statistics (document frequency of a term per ACL class;
        units and summed terms per class)."""
        self.db.executemany(
            "INSERT INTO stage.term_df VALUES (?, ?, ?) ON CONFLICT(term, acl) "
            "DO UPDATE SET df = df + excluded.df",
            [(t, a, n) for (t, a), n in term_df.items() if n])
        self.db.executemany(
            "INSERT INTO stage.acl_stats VALUES (?, ?, ?) ON CONFLICT(acl) "
            "DO UPDATE SET units = units + excluded.units, terms = terms + excluded.terms",
            [(a, u, t) for a, (u, t) in acl_stats.items() if u or t])

    def staged_keys(self, table: str) -> list[str]:
        key = dict(GENERATION_TABLES)[table]
        return [r[0] for r in self.db.execute(f"SELECT {key} FROM stage.{table}_touched")]

    # ---- commit ---------------------------------------------------------------------------------

    def commit(self, info: CommitInfo) -> int:
        """Swap the staged generation in, atomically; returns its number."""
        started = time.perf_counter()
        with self.store.transaction() as db:
            generation = int((db.execute("SELECT value FROM meta WHERE key='generation'").fetchone()
                              or ("0",))[0]) + 1
            for table, key in GENERATION_TABLES:
                if self.full:
                    db.execute(f"DELETE FROM main.{table}")
                else:
                    db.execute(f"DELETE FROM main.{table} WHERE {key} IN "
                               f"(SELECT {key} FROM stage.{table}_touched)")
                db.execute(f"INSERT INTO main.{table} SELECT * FROM stage.{table}")
            self._commit_counts(db)
            if self.full:
                for table in ("entity_instances", "relationship_instances", "claim_instances",
                              "extracted"):
                    db.execute(f"DELETE FROM main.{table} WHERE unit_id NOT IN "  # noqa: S608
                               "(SELECT id FROM main.text_units)")
                # cached responses that quote units this generation no longer has
                purge(db, [r[0] for r in db.execute(
                    "SELECT DISTINCT unit_id FROM main.cache_sources WHERE unit_id != ? AND "
                    "unit_id NOT IN (SELECT id FROM main.text_units)", (UNATTRIBUTED,))])
            elif info.removed_units:
                _drop_instances(db, info.removed_units)
                purge(db, info.removed_units)
            db.execute("DELETE FROM main.failures")
            db.executemany("INSERT INTO main.failures VALUES (?, ?, ?)",
                           [(f.unit_id, f.task, f.error) for f in info.failures])
            db.execute("DELETE FROM main.skips")
            db.executemany("INSERT OR REPLACE INTO main.skips VALUES (?, ?)",
                           [(s.path, s.reason) for s in info.skips])
            meta = {**info.meta, "generation": str(generation), "committed_at": str(time.time())}
            db.executemany("INSERT OR REPLACE INTO main.meta VALUES (?, ?)", meta.items())
            if info.run_id is not None:
                db.execute(
                    "UPDATE main.runs SET finished=?, generation=?, stats=?, usage=? WHERE id=?",
                    (time.time(), generation, dump(info.stats), dump(info.usage), info.run_id),
                )
        log.debug("generation %d committed in %.2fs", generation, time.perf_counter() - started)
        return generation

    def _commit_counts(self, db: sqlite3.Connection) -> None:
        if self.full:
            db.execute("DELETE FROM main.term_df")
            db.execute("DELETE FROM main.acl_stats")
        db.execute("INSERT INTO main.term_df SELECT term, acl, df FROM stage.term_df WHERE true "
                   "ON CONFLICT(term, acl) DO UPDATE SET df = df + excluded.df")
        db.execute("DELETE FROM main.term_df WHERE df <= 0 AND (term, acl) IN "
                   "(SELECT term, acl FROM stage.term_df)")
        db.execute("INSERT INTO main.acl_stats SELECT acl, units, terms FROM stage.acl_stats "
                   "WHERE true ON CONFLICT(acl) DO UPDATE SET units = units + excluded.units, "
                   "terms = terms + excluded.terms")
        db.execute("DELETE FROM main.acl_stats WHERE units <= 0")

    def close(self) -> None:
        """Drop the staging database (after a commit, or to abandon the build)."""
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(sqlite3.Error):
            for table, _ in [*GENERATION_TABLES, *((t, "") for t in _COUNTERS)]:
                self.db.execute(f"DROP VIEW IF EXISTS temp.{table}_new")
            self.db.execute("DETACH DATABASE stage")
        self.path.unlink(missing_ok=True)
