"""The index's schema, as ordered migrations recorded in `_migrations` (style: simonw/llm).

Generation tables (documents ... term_df) hold one committed generation; their DDL is also run
in the writer's staging database (canopy.store.staging), so staged rows have the very same
columns. Instance tables and caches are written outside generations: they only ever save work.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

__all__ = ["GENERATION_TABLES", "MIGRATIONS", "generation_ddl", "migrate"]

MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = []
migration = MIGRATIONS.append


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Run DDL inside the caller's transaction (executescript would commit it)."""
    for stmt in script.split(";"):
        if stmt.strip():
            db.execute(stmt)


# (table, key column) of every table that belongs to a generation; the writer stages rows of
# exactly these and replaces them by key at commit.
GENERATION_TABLES: tuple[tuple[str, str], ...] = (
    ("documents", "id"),
    ("text_units", "id"),
    ("entities", "id"),
    ("relationships", "id"),
    ("claims", "id"),
    ("communities", "id"),
    ("community_members", "community_id"),
    ("reports", "community_id"),
    ("community_edges", "relationship_id"),
    ("member_ranks", "entity_id"),
)

# Artifacts carry their provenance gate: `units` (JSON list of text-unit ids), `acl` (JSON list of
# the ACL class ids of those units), `acl_sig` (hash of unit:class pairs, so a relabel is seen),
# and `stale` (1 when a source unit was revoked and regeneration has not caught up yet).
_GENERATION_DDL = """
CREATE TABLE {p}documents (
    id TEXT PRIMARY KEY, path TEXT NOT NULL, content_hash TEXT NOT NULL, title TEXT NOT NULL,
    n_chars INTEGER NOT NULL, labels TEXT NOT NULL, metadata TEXT NOT NULL, acl INTEGER NOT NULL,
    size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL, time TEXT NOT NULL DEFAULT '',
    time_source TEXT NOT NULL DEFAULT '');
CREATE INDEX {p}documents_path ON documents(path);
CREATE TABLE {p}text_units (
    id TEXT PRIMARY KEY, document_id TEXT NOT NULL, ordinal INTEGER NOT NULL, text TEXT NOT NULL,
    n_tokens INTEGER NOT NULL, char_start INTEGER NOT NULL, char_end INTEGER NOT NULL,
    acl INTEGER NOT NULL, sort_key TEXT NOT NULL, n_terms INTEGER NOT NULL,
    sentence_terms TEXT NOT NULL DEFAULT '');
CREATE INDEX {p}text_units_document ON text_units(document_id);
CREATE TABLE {p}entities (
    id TEXT PRIMARY KEY, key TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL,
    description TEXT NOT NULL, units TEXT NOT NULL, degree INTEGER NOT NULL, acl TEXT NOT NULL,
    acl_sig TEXT NOT NULL, hash TEXT NOT NULL, stale INTEGER NOT NULL);
CREATE INDEX {p}entities_key ON entities(key);
CREATE INDEX {p}entities_stale ON entities(stale) WHERE stale = 1;
CREATE TABLE {p}relationships (
    id TEXT PRIMARY KEY, source TEXT NOT NULL, target TEXT NOT NULL, description TEXT NOT NULL,
    weight REAL NOT NULL, units TEXT NOT NULL, acl TEXT NOT NULL, acl_sig TEXT NOT NULL,
    hash TEXT NOT NULL, stale INTEGER NOT NULL);
CREATE INDEX {p}relationships_source ON relationships(source);
CREATE INDEX {p}relationships_target ON relationships(target);
CREATE INDEX {p}relationships_stale ON relationships(stale) WHERE stale = 1;
CREATE TABLE {p}claims (
    id TEXT PRIMARY KEY, subject TEXT NOT NULL, object TEXT NOT NULL, type TEXT NOT NULL,
    status TEXT NOT NULL, description TEXT NOT NULL, unit_id TEXT NOT NULL, acl TEXT NOT NULL,
    hash TEXT NOT NULL, stale INTEGER NOT NULL, start_date TEXT NOT NULL DEFAULT '',
    end_date TEXT NOT NULL DEFAULT '', quote TEXT NOT NULL DEFAULT '');
CREATE INDEX {p}claims_subject ON claims(subject);
CREATE INDEX {p}claims_object ON claims(object);
CREATE INDEX {p}claims_unit ON claims(unit_id);
CREATE TABLE {p}communities (
    id TEXT PRIMARY KEY, level INTEGER NOT NULL, parent TEXT, n_members INTEGER NOT NULL,
    n_children INTEGER NOT NULL, acl TEXT NOT NULL, acl_sig TEXT NOT NULL,
    fingerprint TEXT NOT NULL, stale INTEGER NOT NULL, w_in REAL NOT NULL, d_tot REAL NOT NULL);
CREATE INDEX {p}communities_parent ON communities(parent);
CREATE INDEX {p}communities_level ON communities(level);
CREATE INDEX {p}communities_stale ON communities(stale) WHERE stale = 1;
CREATE TABLE {p}community_members (
    community_id TEXT NOT NULL, entity_id TEXT NOT NULL, level INTEGER NOT NULL,
    PRIMARY KEY (community_id, entity_id)) WITHOUT ROWID;
CREATE INDEX {p}community_members_entity ON community_members(entity_id);
CREATE TABLE {p}reports (
    community_id TEXT PRIMARY KEY, level INTEGER NOT NULL, title TEXT NOT NULL,
    summary TEXT NOT NULL, rating REAL NOT NULL, rating_explanation TEXT NOT NULL,
    findings TEXT NOT NULL, units TEXT NOT NULL, fingerprint TEXT NOT NULL,
    context_tokens INTEGER NOT NULL, used_subreports TEXT NOT NULL, acl TEXT NOT NULL,
    stale INTEGER NOT NULL);
CREATE INDEX {p}reports_fingerprint ON reports(fingerprint);
CREATE TABLE {p}term_df (
    term TEXT NOT NULL, acl INTEGER NOT NULL, df INTEGER NOT NULL,
    PRIMARY KEY (term, acl)) WITHOUT ROWID;
CREATE TABLE {p}acl_stats (acl INTEGER PRIMARY KEY, units INTEGER NOT NULL, terms INTEGER NOT NULL);
"""

# Serving's orderings of a community's contents, kept with the generation so that a page of a
# community with tens of thousands of members is an index range, not a scan
# (canopy.store.community_index): every relationship with both endpoints in a community, by
# weight, and every member, by degree and name. Keyed by relationship and by entity, so an update
# rewrites the rows of what it touched, never a whole top community. Their columns are in primary
# key order, not key first: SQLite 3.40's quick_check reports NULLs in a WITHOUT ROWID table whose
# columns are ordered otherwise (so they are staged by canopy.store.community_index, never by
# Staging.put, which takes the first column for the key).
_COMMUNITY_INDEX_DDL = """
CREATE TABLE {p}community_edges (
    community_id TEXT NOT NULL, weight REAL NOT NULL, relationship_id TEXT NOT NULL,
    PRIMARY KEY (community_id, weight DESC, relationship_id)) WITHOUT ROWID;
CREATE INDEX {p}community_edges_relationship ON community_edges(relationship_id);
CREATE TABLE {p}member_ranks (
    community_id TEXT NOT NULL, degree INTEGER NOT NULL, name TEXT NOT NULL,
    entity_id TEXT NOT NULL,
    PRIMARY KEY (community_id, degree DESC, name, entity_id)) WITHOUT ROWID;
CREATE INDEX {p}member_ranks_entity ON member_ranks(entity_id)
"""


def generation_ddl(schema: str = "") -> str:
    """The generation tables' DDL, in `schema` ("stage." for the writer's staging database)."""
    return (_GENERATION_DDL + _COMMUNITY_INDEX_DDL).replace("{p}", schema)


def migrate(db: sqlite3.Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY)")
    done = {r[0] for r in db.execute("SELECT name FROM _migrations")}
    for m in MIGRATIONS:
        if m.__name__ not in done:
            db.execute("BEGIN IMMEDIATE")
            try:
                m(db)
                db.execute("INSERT INTO _migrations VALUES (?)", (m.__name__,))
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")


@migration
def m001_initial(db: sqlite3.Connection) -> None:
    run_script(
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
        CREATE TABLE extractions (unit_id TEXT PRIMARY KEY, payload TEXT NOT NULL,
            passes INTEGER NOT NULL);
        CREATE TABLE failures (unit_id TEXT NOT NULL, task TEXT NOT NULL, error TEXT NOT NULL);
        CREATE TABLE skips (path TEXT PRIMARY KEY, reason TEXT NOT NULL);
        CREATE TABLE entities (
            id TEXT PRIMARY KEY, name TEXT NOT NULL, type TEXT NOT NULL, description TEXT NOT NULL,
            text_unit_ids TEXT NOT NULL, degree INTEGER NOT NULL);
        CREATE TABLE relationships (
            id TEXT PRIMARY KEY, source TEXT NOT NULL, target TEXT NOT NULL,
            description TEXT NOT NULL, weight REAL NOT NULL, text_unit_ids TEXT NOT NULL);
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
        """,
    )


@migration
def m002_acl_views(db: sqlite3.Connection) -> None:
    run_script(
        db,
        """
        CREATE TABLE acl_views (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, artifact_id TEXT NOT NULL,
            fingerprint TEXT NOT NULL, visible TEXT NOT NULL, provider TEXT NOT NULL,
            payload TEXT NOT NULL, created REAL NOT NULL);
        CREATE INDEX acl_views_artifact ON acl_views(artifact_id);
        """,
    )


@migration
def m003_document_metadata(db: sqlite3.Connection) -> None:
    db.execute("ALTER TABLE documents ADD COLUMN metadata TEXT NOT NULL DEFAULT '[]'")


@migration
def m004_store_backed_graph(db: sqlite3.Connection) -> None:
    """The graph moves from JSON lists loaded whole to indexed tables read on demand (issue 14).

    Derived tables are recreated empty and the generation reset, so the next `canopy index`
    rebuilds them; per-unit extractions become instance rows and the LLM response and embedding
    caches are kept, so that rebuild repeats no extraction, summary, report or embedding call
    that the cache can answer. Views are keyed differently now and are dropped."""
    old = db.execute("SELECT unit_id, payload, passes FROM extractions").fetchall()
    run_script(
        db,
        """
        DROP TABLE documents; DROP TABLE text_units; DROP TABLE entities;
        DROP TABLE relationships; DROP TABLE claims; DROP TABLE communities; DROP TABLE reports;
        DROP TABLE extractions; DROP TABLE acl_views;
        DELETE FROM meta WHERE key != 'created';
        CREATE TABLE acl_classes (id INTEGER PRIMARY KEY, labels TEXT UNIQUE NOT NULL);
        CREATE TABLE extracted (unit_id TEXT PRIMARY KEY, passes INTEGER NOT NULL) WITHOUT ROWID;
        CREATE TABLE entity_instances (
            unit_id TEXT NOT NULL, pos INTEGER NOT NULL, key TEXT NOT NULL, name TEXT NOT NULL,
            type TEXT NOT NULL, description TEXT NOT NULL,
            PRIMARY KEY (unit_id, pos)) WITHOUT ROWID;
        CREATE INDEX entity_instances_key ON entity_instances(key);
        CREATE TABLE relationship_instances (
            unit_id TEXT NOT NULL, pos INTEGER NOT NULL, rid TEXT NOT NULL,
            source_key TEXT NOT NULL, target_key TEXT NOT NULL, description TEXT NOT NULL,
            strength REAL NOT NULL, PRIMARY KEY (unit_id, pos)) WITHOUT ROWID;
        CREATE INDEX relationship_instances_rid ON relationship_instances(rid);
        CREATE INDEX relationship_instances_source ON relationship_instances(source_key);
        CREATE INDEX relationship_instances_target ON relationship_instances(target_key);
        CREATE TABLE claim_instances (
            unit_id TEXT NOT NULL, pos INTEGER NOT NULL, subject_key TEXT NOT NULL,
            object_key TEXT NOT NULL, type TEXT NOT NULL, status TEXT NOT NULL,
            description TEXT NOT NULL, PRIMARY KEY (unit_id, pos)) WITHOUT ROWID;
        CREATE TABLE acl_views (
            key TEXT PRIMARY KEY, kind TEXT NOT NULL, artifact_id TEXT NOT NULL,
            payload TEXT NOT NULL, bytes INTEGER NOT NULL, created REAL NOT NULL);
        CREATE INDEX acl_views_artifact ON acl_views(artifact_id);
        """,
    )
    run_script(db, generation_ddl())
    if old:
        from canopy.store.instances import extraction_rows, payload_extraction

        for unit_id, payload, passes in old:
            rows = extraction_rows(payload_extraction(unit_id, payload, passes))
            # m004's instance tables have the first columns (m012 adds the unit keys)
            db.executemany("INSERT INTO entity_instances VALUES (?, ?, ?, ?, ?, ?)",
                           [e[:6] for e in rows.entities])
            db.executemany("INSERT INTO relationship_instances VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [r[:7] for r in rows.relationships])
            # m004's claim_instances has the first seven columns (m007 adds the rest)
            db.executemany("INSERT INTO claim_instances VALUES (?, ?, ?, ?, ?, ?, ?)",
                           [c[:7] for c in rows.claims])
            db.execute("INSERT INTO extracted VALUES (?, ?)", (unit_id, passes))


@migration
def m005_cache_sources(db: sqlite3.Connection) -> None:
    """The text units each cached response, view and embedding derives from
    (canopy.store.sources). Entries cached before this table existed have unknown sources:
    they are recorded as unattributed, so the first removal of a document deletes them
    (once; what is still needed is asked or embedded again)."""
    run_script(
        db,
        """
        CREATE TABLE cache_sources (
            unit_id TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (unit_id, key)) WITHOUT ROWID;
        CREATE INDEX cache_sources_key ON cache_sources(key);
        INSERT INTO cache_sources SELECT '', key FROM llm_cache;
        INSERT OR IGNORE INTO cache_sources SELECT '', key FROM acl_views;
        INSERT OR IGNORE INTO cache_sources SELECT '', key FROM embeddings;
        """,
    )


@migration
def m006_element_tokens(db: sqlite3.Connection) -> None:
    """Token sizes of entities and relationships as report contexts show them, by tokenizer
    and element hash (which covers every field a size depends on): an update that writes a
    report of a large community reads its elements' sizes instead of re-tokenizing them."""
    run_script(db, "CREATE TABLE element_tokens (key TEXT PRIMARY KEY, tokens INTEGER NOT NULL) "
                   "WITHOUT ROWID;")


_CLAIM_FIELDS = ("start_date", "end_date", "quote")


@migration
def m007_claim_periods_and_quotes(db: sqlite3.Connection) -> None:
    """Claims get the paper's period and source quote (Edge et al. 2024 §2.1.2; issue 12).

    Columns are appended, so an existing index opens with its claims intact (their dates and
    quotes empty until their units are extracted again, e.g. by `canopy index --full`). An index
    created after this change already has them in `claims`, whose DDL is the current generation
    DDL (m004 runs it): only missing columns are added, in the order that DDL lists them."""
    for table in ("claims", "claim_instances"):
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for name in _CLAIM_FIELDS:
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} TEXT NOT NULL DEFAULT ''")


@migration
def m008_community_index(db: sqlite3.Connection) -> None:
    """community_edges and member_ranks (issue 14: a page of a top community reads an index
    range). An index made before them gets them filled from its committed generation; an index
    created since has them from m004's DDL, empty and filled by its first build."""
    if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'community_edges'").fetchone():
        return
    from canopy.store.community_index import fill_edges, fill_ranks
    from canopy.store.reads import COMMITTED

    run_script(db, _COMMUNITY_INDEX_DDL.replace("{p}", ""))
    fill_edges(db, COMMITTED, "main.community_edges")
    fill_ranks(db, COMMITTED, "main.member_ranks")


@migration
def m009_sentence_terms(db: sqlite3.Connection) -> None:
    """Each text unit stores its pieces' terms (builtin.text.sentence_terms), which local_search
    read from the text at every query. An index made before gets the column filled from its
    committed units' text, a batch at a time; an index created since has it from m004's DDL."""
    if "sentence_terms" in {r[1] for r in db.execute("PRAGMA table_info(text_units)")}:
        return
    from canopy.providers.builtin.text import sentence_terms

    db.execute("ALTER TABLE text_units ADD COLUMN sentence_terms TEXT NOT NULL DEFAULT ''")
    after = ""
    while True:
        batch = db.execute("SELECT id, text FROM text_units WHERE id > ? ORDER BY id LIMIT 2000",
                           (after,)).fetchall()
        if not batch:
            return
        db.executemany("UPDATE text_units SET sentence_terms = ? WHERE id = ?",
                       [(sentence_terms(text), uid) for uid, text in batch])
        after = batch[-1][0]


@migration
def m010_orphan_claims(db: sqlite3.Connection) -> None:
    """Claims of deleted text units. Before issue 30 the regeneration after a deletion rewrote
    only the claims of edited documents' units, so a deleted document's claims stayed, stale
    (never served) but stored with their text and counted by `canopy status`."""
    db.execute("DELETE FROM claims WHERE unit_id NOT IN (SELECT id FROM text_units)")


@migration
def m011_document_times(db: sqlite3.Connection) -> None:
    """Each document's time and its source (canopy.indexer.doc_time). An index made before has
    them empty until its next build, which rebuilds (the [time] settings are part of the
    settings fingerprint) and dates every document."""
    if "time" in {r[1] for r in db.execute("PRAGMA table_info(documents)")}:
        return
    db.execute("ALTER TABLE documents ADD COLUMN time TEXT NOT NULL DEFAULT ''")
    db.execute("ALTER TABLE documents ADD COLUMN time_source TEXT NOT NULL DEFAULT ''")


_UNIT_KEYS = (("entity_instances", (("unit_key", "key"),)),
              ("relationship_instances", (("unit_source", "source_key"),
                                          ("unit_target", "target_key"))),
              ("claim_instances", (("unit_subject", "subject_key"), ("unit_object", "object_key"))))


@migration
def m012_unit_keys(db: sqlite3.Connection) -> None:
    """Instances keep the key their own unit gives them beside the one they merge by, which may
    come from another unit of their document (canopy.aliases.document_links, issue 31): an edit
    of the document settles the keys again from the unit keys, re-extracting nothing. An
    index made before has the keys it merged by as its unit keys (what its units gave them);
    the next build settles them (the keys version is part of the settings fingerprint)."""
    for table, columns in _UNIT_KEYS:
        have = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
        for column, source in columns:
            if column not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
                db.execute(f"UPDATE {table} SET {column} = {source}")  # noqa: S608
