"""The index's source of truth: one SQLite database (WAL) in the index folder.

Every write of derived data happens in `Store.commit_generation`, one transaction: readers (WAL
snapshot isolation) see the previous generation until it commits, and a crash mid-update leaves
the previous generation intact. LanceDB tables are derived from these rows and can be rebuilt.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy.model import (
    Claim,
    ClaimInstance,
    Community,
    Document,
    Entity,
    EntityInstance,
    Extraction,
    Finding,
    Relationship,
    RelationshipInstance,
    Report,
    Skip,
    TextUnit,
    UnitFailure,
)

__all__ = ["Graph", "Store", "RunRecord"]

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []
migration = MIGRATIONS.append


@migration
def m001_initial(db: sqlite3.Connection) -> None:
    _statements(
        db,
        """
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE documents (
            id TEXT PRIMARY KEY, path TEXT UNIQUE NOT NULL, content_hash TEXT NOT NULL,
            title TEXT NOT NULL, n_chars INTEGER NOT NULL, labels TEXT NOT NULL);
        CREATE TABLE text_units (
            id TEXT PRIMARY KEY, document_id TEXT NOT NULL, ordinal INTEGER NOT NULL,
            text TEXT NOT NULL, n_tokens INTEGER NOT NULL, char_start INTEGER NOT NULL,
            char_end INTEGER NOT NULL);
        CREATE INDEX text_units_doc ON text_units(document_id);
        CREATE TABLE extractions (unit_id TEXT PRIMARY KEY, payload TEXT NOT NULL, passes INTEGER NOT NULL);
        CREATE TABLE failures (unit_id TEXT NOT NULL, task TEXT NOT NULL, error TEXT NOT NULL);
        CREATE TABLE skips (path TEXT PRIMARY KEY, reason TEXT NOT NULL);
        CREATE TABLE entities (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, type TEXT NOT NULL, description TEXT NOT NULL,
            text_unit_ids TEXT NOT NULL, degree INTEGER NOT NULL);
        CREATE TABLE relationships (
            id TEXT PRIMARY KEY, source TEXT NOT NULL, target TEXT NOT NULL, description TEXT NOT NULL,
            weight REAL NOT NULL, text_unit_ids TEXT NOT NULL);
        CREATE TABLE claims (
            id TEXT PRIMARY KEY, subject TEXT NOT NULL, object TEXT NOT NULL, type TEXT NOT NULL,
            status TEXT NOT NULL, description TEXT NOT NULL, text_unit_ids TEXT NOT NULL);
        CREATE TABLE communities (
            id TEXT PRIMARY KEY, level INTEGER NOT NULL, parent TEXT, children TEXT NOT NULL,
            entity_ids TEXT NOT NULL, relationship_ids TEXT NOT NULL, text_unit_ids TEXT NOT NULL,
            fingerprint TEXT NOT NULL);
        CREATE TABLE reports (
            community_id TEXT PRIMARY KEY, level INTEGER NOT NULL, title TEXT NOT NULL,
            summary TEXT NOT NULL, rating REAL NOT NULL, rating_explanation TEXT NOT NULL,
            findings TEXT NOT NULL, text_unit_ids TEXT NOT NULL, fingerprint TEXT NOT NULL,
            context_tokens INTEGER NOT NULL, used_subreports TEXT NOT NULL);
        CREATE TABLE embeddings (key TEXT PRIMARY KEY, vector BLOB NOT NULL);
        CREATE TABLE llm_cache (key TEXT PRIMARY KEY, response TEXT NOT NULL);
        CREATE TABLE runs (
            id INTEGER PRIMARY KEY AUTOINCREMENT, started REAL NOT NULL, finished REAL,
            generation INTEGER, stats TEXT NOT NULL, usage TEXT NOT NULL);
        """
    )


@migration
def m002_acl_views(db: sqlite3.Connection) -> None:
    """Per-caller views (design §2, "fallback views"): derived data keyed by content, so a row
    is never stale, only unused. Written outside generations, like the LLM cache."""
    _statements(
        db,
        """
        CREATE TABLE acl_views (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, artifact_id TEXT NOT NULL,
            fingerprint TEXT NOT NULL, visible TEXT NOT NULL, provider TEXT NOT NULL,
            payload TEXT NOT NULL, created REAL NOT NULL);
        CREATE INDEX acl_views_artifact ON acl_views(artifact_id);
        """
    )


@migration
def m003_document_metadata(db: sqlite3.Connection) -> None:
    """Front-matter metadata of documents (a JSON list of [field, value] pairs)."""
    db.execute("ALTER TABLE documents ADD COLUMN metadata TEXT NOT NULL DEFAULT '[]'")


_COUNTABLE = frozenset({"documents", "text_units", "entities", "relationships", "claims", "communities", "reports"})


def _statements(db: sqlite3.Connection, script: str) -> None:
    """Run a DDL script inside the caller's transaction (executescript would commit it)."""
    for stmt in script.split(";"):
        if stmt.strip():
            db.execute(stmt)


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _t(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text))


@dataclass
class Graph:
    """Everything derived from the live text units, as one consistent generation."""

    entities: dict[str, Entity] = field(default_factory=dict)
    relationships: dict[str, Relationship] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    communities: dict[str, Community] = field(default_factory=dict)
    reports: dict[str, Report] = field(default_factory=dict)


@dataclass(frozen=True)
class RunRecord:
    id: int
    started: float
    finished: float | None
    generation: int | None
    stats: dict[str, Any]
    usage: dict[str, dict[str, int]]


class Store:
    """SQLite access for one index folder. Thread-safe for the cache/embedding helpers."""

    def __init__(self, index_dir: Path) -> None:
        self.index_dir = index_dir
        index_dir.mkdir(parents=True, exist_ok=True)
        self.path = index_dir / "canopy.sqlite"
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._lock = threading.RLock()
        self._migrate()

    def close(self) -> None:
        self._db.close()

    # ---- schema ---------------------------------------------------------------------------

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY)")
            done = {r[0] for r in self._db.execute("SELECT name FROM _migrations")}
            for m in MIGRATIONS:
                if m.__name__ not in done:
                    self._db.execute("BEGIN IMMEDIATE")
                    m(self._db)
                    self._db.execute("INSERT INTO _migrations VALUES (?)", (m.__name__,))
                    self._db.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A consistent read of one committed generation."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    # ---- meta -----------------------------------------------------------------------------

    def get_meta(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else default

    @property
    def generation(self) -> int:
        return int(self.get_meta("generation", "0") or 0)

    # ---- reads ----------------------------------------------------------------------------

    def documents(self) -> dict[str, Document]:
        rows = self._db.execute("SELECT id, path, content_hash, title, n_chars, labels, metadata FROM documents")
        return {r[0]: Document(r[0], r[1], r[2], r[3], r[4], _t(r[5]), tuple(tuple(kv) for kv in json.loads(r[6])))
                for r in rows}

    def text_units(self, document_ids: Iterable[str] | None = None) -> dict[str, TextUnit]:
        sql = "SELECT id, document_id, ordinal, text, n_tokens, char_start, char_end FROM text_units"
        rows = self._db.execute(sql).fetchall()
        keep = set(document_ids) if document_ids is not None else None
        return {r[0]: TextUnit(*r) for r in rows if keep is None or r[1] in keep}

    def extractions(self) -> dict[str, Extraction]:
        return {r[0]: _extraction_from_json(r[0], r[1], r[2]) for r in
                self._db.execute("SELECT unit_id, payload, passes FROM extractions")}

    def failures(self) -> list[UnitFailure]:
        return [UnitFailure(*r) for r in self._db.execute("SELECT unit_id, task, error FROM failures")]

    def skips(self) -> list[Skip]:
        return [Skip(*r) for r in self._db.execute("SELECT path, reason FROM skips ORDER BY path")]

    def graph(self) -> Graph:
        g = Graph()
        db = self._db
        for r in db.execute("SELECT id, name, type, description, text_unit_ids, degree FROM entities"):
            g.entities[r[0]] = Entity(r[0], r[1], r[2], r[3], _t(r[4]), r[5])
        for r in db.execute("SELECT id, source, target, description, weight, text_unit_ids FROM relationships"):
            g.relationships[r[0]] = Relationship(r[0], r[1], r[2], r[3], r[4], _t(r[5]))
        for r in db.execute("SELECT id, subject, object, type, status, description, text_unit_ids FROM claims"):
            g.claims[r[0]] = Claim(*r[:6], _t(r[6]))
        for r in db.execute(
            "SELECT id, level, parent, children, entity_ids, relationship_ids, text_unit_ids, fingerprint "
            "FROM communities"
        ):
            g.communities[r[0]] = Community(r[0], r[1], r[2], _t(r[3]), _t(r[4]), _t(r[5]), _t(r[6]), r[7])
        for r in db.execute(
            "SELECT community_id, level, title, summary, rating, rating_explanation, findings, "
            "text_unit_ids, fingerprint, context_tokens, used_subreports FROM reports"
        ):
            findings = tuple(
                Finding(f["summary"], f["explanation"], tuple(f["entity_ids"]),
                        tuple(f["relationship_ids"]), tuple(f["text_unit_ids"]))
                for f in json.loads(r[6])
            )
            g.reports[r[0]] = Report(r[0], r[1], r[2], r[3], r[4], r[5], findings, _t(r[7]), r[8], r[9], _t(r[10]))
        return g

    def count(self, table: str) -> int:
        if table not in _COUNTABLE:
            raise ValueError(table)
        return int(self._db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])  # noqa: S608 - whitelisted

    def communities_by_level(self) -> dict[str, int]:
        rows = self._db.execute("SELECT level, COUNT(*) FROM communities GROUP BY level ORDER BY level")
        return {str(level): n for level, n in rows}

    def runs(self, limit: int = 5) -> list[RunRecord]:
        rows = self._db.execute(
            "SELECT id, started, finished, generation, stats, usage FROM runs ORDER BY id DESC LIMIT ?", (limit,)
        )
        return [RunRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), json.loads(r[5])) for r in rows]

    # ---- caches (written outside generations: they only ever save work) ---------------------

    def cache_get(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT response FROM llm_cache WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def cache_put(self, key: str, response: str) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO llm_cache VALUES (?, ?)", (key, response))

    def embeddings_get(self, keys: list[str]) -> dict[str, bytes]:
        out: dict[str, bytes] = {}
        with self._lock:
            for i in range(0, len(keys), 500):
                part = keys[i : i + 500]
                q = f"SELECT key, vector FROM embeddings WHERE key IN ({','.join('?' * len(part))})"
                out.update(dict(self._db.execute(q, part).fetchall()))
        return out

    def embeddings_put(self, rows: dict[str, bytes]) -> None:
        with self._lock:
            self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?)", rows.items())

    def extractions_of(self, unit_ids: Iterable[str]) -> dict[str, Extraction]:
        """Stored extractions of the given units only (views read a few units at a time)."""
        ids = sorted(set(unit_ids))
        out: dict[str, Extraction] = {}
        with self._lock:
            for i in range(0, len(ids), 500):
                part = ids[i : i + 500]
                q = f"SELECT unit_id, payload, passes FROM extractions WHERE unit_id IN ({','.join('?' * len(part))})"
                out.update({r[0]: _extraction_from_json(r[0], r[1], r[2]) for r in self._db.execute(q, part)})
        return out

    def view_get(self, key: str) -> tuple[str, str] | None:
        """(kind, payload) of a cached per-caller view (acl.views), or None."""
        with self._lock:
            row = self._db.execute("SELECT kind, payload FROM acl_views WHERE key=?", (key,)).fetchone()
        return (row[0], row[1]) if row else None

    def view_put(self, key: str, *, kind: str, artifact_id: str, fingerprint: str, visible: str,
                 provider: str, payload: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO acl_views VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (key, kind, artifact_id, fingerprint, visible, provider, payload, time.time()),
            )

    def view_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._db.execute("SELECT kind, COUNT(*) FROM acl_views GROUP BY kind").fetchall())

    def views_prune(self, live_artifact_ids: set[str]) -> int:
        """Drop cached views of artifacts that no longer exist; returns how many."""
        with self._lock:
            ids = [r[0] for r in self._db.execute("SELECT DISTINCT artifact_id FROM acl_views")]
            gone = [(i,) for i in ids if i not in live_artifact_ids]
            before = self._db.total_changes
            self._db.executemany("DELETE FROM acl_views WHERE artifact_id=?", gone)
            return self._db.total_changes - before

    def save_extraction(self, ex: Extraction) -> None:
        """Per-unit extraction is saved as soon as it exists, so a crash never loses LLM work."""
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO extractions VALUES (?, ?, ?)", (ex.unit_id, _extraction_to_json(ex), ex.passes)
            )

    # ---- the one write of a generation ------------------------------------------------------

    def commit_generation(
        self,
        *,
        documents: dict[str, Document],
        units: dict[str, TextUnit],
        graph: Graph,
        failures: list[UnitFailure],
        skips: list[Skip],
        meta: dict[str, str],
        run_id: int | None = None,
        stats: dict[str, Any] | None = None,
        usage: dict[str, dict[str, int]] | None = None,
        keep_extractions: set[str] | None = None,
    ) -> int:
        """Replace the served state with a new generation atomically; returns its number.

        Stored extractions of units outside `keep_extractions` (default: the live units) are
        dropped; the LLM response cache still holds that work."""
        with self.transaction() as db:
            gen = self.generation + 1
            _sync(db, "documents", "id", documents, lambda d: (d.id, d.path, d.content_hash, d.title, d.n_chars, _j(d.labels),
                                                                    _j(d.metadata)))
            _sync(db, "text_units", "id", units, lambda u: (u.id, u.document_id, u.ordinal, u.text, u.n_tokens, u.char_start, u.char_end))
            keep = set(units) if keep_extractions is None else keep_extractions
            stale = [r[0] for r in db.execute("SELECT unit_id FROM extractions") if r[0] not in keep]
            db.executemany("DELETE FROM extractions WHERE unit_id=?", [(s,) for s in stale])
            _sync(db, "entities", "id", graph.entities, lambda e: (e.id, e.name, e.type, e.description, _j(e.text_unit_ids), e.degree))
            _sync(db, "relationships", "id", graph.relationships, lambda r: (r.id, r.source, r.target, r.description, r.weight, _j(r.text_unit_ids)))
            _sync(db, "claims", "id", graph.claims, lambda c: (c.id, c.subject, c.object, c.type, c.status, c.description, _j(c.text_unit_ids)))
            _sync(db, "communities", "id", graph.communities, lambda c: (
                c.id, c.level, c.parent, _j(c.children), _j(c.entity_ids), _j(c.relationship_ids), _j(c.text_unit_ids), c.fingerprint))
            _sync(db, "reports", "community_id", graph.reports, lambda r: (
                r.community_id, r.level, r.title, r.summary, r.rating, r.rating_explanation,
                _j([{"summary": f.summary, "explanation": f.explanation, "entity_ids": f.entity_ids,
                     "relationship_ids": f.relationship_ids, "text_unit_ids": f.text_unit_ids} for f in r.findings]),
                _j(r.text_unit_ids), r.fingerprint, r.context_tokens, _j(r.used_subreports)))
            db.execute("DELETE FROM failures")
            db.executemany("INSERT INTO failures VALUES (?, ?, ?)", [(f.unit_id, f.task, f.error) for f in failures])
            db.execute("DELETE FROM skips")
            db.executemany("INSERT OR REPLACE INTO skips VALUES (?, ?)", [(s.path, s.reason) for s in skips])
            for k, v in {**meta, "generation": str(gen), "committed_at": str(time.time())}.items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (k, v))
            if run_id is not None:
                db.execute(
                    "UPDATE runs SET finished=?, generation=?, stats=?, usage=? WHERE id=?",
                    (time.time(), gen, _j(stats or {}), _j(usage or {}), run_id),
                )
            return gen

    def start_run(self) -> int:
        with self.transaction() as db:
            cur = db.execute("INSERT INTO runs (started, stats, usage) VALUES (?, '{}', '{}')", (time.time(),))
            return int(cur.lastrowid or 0)


def _sync(db: sqlite3.Connection, table: str, key: str, rows: dict[str, Any], to_row: Callable[[Any], tuple[Any, ...]]) -> None:
    """Make `table` hold exactly `rows`, touching only rows that differ (cheap incremental commits)."""
    existing = {r[0]: tuple(r) for r in db.execute(f"SELECT * FROM {table}")}  # noqa: S608 - fixed names
    wanted = {k: to_row(v) for k, v in rows.items()}
    gone = [(k,) for k in existing if k not in wanted]
    changed = [row for k, row in wanted.items() if existing.get(k) != row]
    db.executemany(f"DELETE FROM {table} WHERE {key}=?", gone)  # noqa: S608
    if changed:
        marks = ",".join("?" * len(changed[0]))
        db.executemany(f"INSERT OR REPLACE INTO {table} VALUES ({marks})", changed)  # noqa: S608


def _extraction_to_json(ex: Extraction) -> str:
    return _j({
        "entities": [[e.name, e.type, e.description] for e in ex.entities],
        "relationships": [[r.source, r.target, r.description, r.strength] for r in ex.relationships],
        "claims": [[c.subject, c.object, c.type, c.status, c.description] for c in ex.claims],
    })


def _extraction_from_json(unit_id: str, payload: str, passes: int) -> Extraction:
    d = json.loads(payload)
    return Extraction(
        unit_id,
        tuple(EntityInstance(*e) for e in d["entities"]),
        tuple(RelationshipInstance(*r) for r in d["relationships"]),
        tuple(ClaimInstance(*c) for c in d["claims"]),
        passes,
    )
