"""The revocation generation (design §2): deletions and relabels committed at once, before any
regeneration (the writer's stage: canopy.indexer.stages.revocation decides what it holds)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from canopy.store.rows import dump
from canopy.store.sources import purge
from canopy.store.store import Store

__all__ = ["Revocation", "commit_revocation"]

_IN = "IN (SELECT value FROM json_each(?))"


@dataclass
class Revocation:
    """What one revocation changes in the committed generation."""

    stale_entities: list[str]
    stale_relationships: list[str]
    units: list[str]  # units of removed and relabelled documents: their claims go stale
    stale_communities: list[str]  # and their reports
    removed_documents: list[str]
    deleted_units: list[str]  # the removed documents' units (cached work quoting them is purged)
    # relabelled documents: (id, labels, ACL class)
    relabelled: list[tuple[str, tuple[str, ...], int]] = field(default_factory=list)
    term_df: dict[tuple[str, int], int] = field(default_factory=dict)  # deltas by (term, class)
    acl_stats: dict[int, tuple[int, int]] = field(default_factory=dict)  # (units, terms) deltas
    meta: dict[str, str] = field(default_factory=dict)  # written beside the new generation number


def commit_revocation(store: Store, r: Revocation) -> int:
    """Commit `r` as one generation; returns its number."""
    with store.transaction() as db:
        for table, column, ids in (("entities", "id", r.stale_entities),
                                   ("relationships", "id", r.stale_relationships),
                                   ("claims", "unit_id", r.units),
                                   ("communities", "id", r.stale_communities),
                                   ("reports", "community_id", r.stale_communities)):
            db.execute(f"UPDATE {table} SET stale = 1 WHERE {column} {_IN}", (_ids(ids),))
        removed = _ids(r.removed_documents)
        db.execute(f"DELETE FROM text_units WHERE document_id {_IN}", (removed,))
        purge(db, r.deleted_units)  # cached responses and views that quote the deleted units
        db.execute(f"DELETE FROM documents WHERE id {_IN}", (removed,))
        for doc_id, labels, acl in r.relabelled:
            db.execute("UPDATE documents SET labels = ?, acl = ? WHERE id = ?",
                       (dump(labels), acl, doc_id))
            db.execute("UPDATE text_units SET acl = ? WHERE document_id = ?", (acl, doc_id))
        db.executemany("INSERT INTO term_df VALUES (?, ?, ?) ON CONFLICT(term, acl) "
                       "DO UPDATE SET df = df + excluded.df",
                       [(t, a, n) for (t, a), n in r.term_df.items() if n])
        db.execute("DELETE FROM term_df WHERE df <= 0")
        for acl, (units, terms) in sorted(r.acl_stats.items()):
            db.execute("INSERT INTO acl_stats VALUES (?, ?, ?) ON CONFLICT(acl) DO UPDATE SET "
                       "units = units + excluded.units, terms = terms + excluded.terms",
                       (acl, units, terms))
        generation = (
            int(db.execute("SELECT value FROM meta WHERE key='generation'").fetchone()[0]) + 1
        )
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                       [("generation", str(generation)), *r.meta.items()])
    return generation


def _ids(ids: Iterable[str]) -> str:
    return dump(sorted(ids))
