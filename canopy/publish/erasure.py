"""Which text a published database holds, so that a page-patch base never outlives deleted text.

A database published as a page patch names its base blob (canopy.publish.pages), a whole copy
of the database as it was when that base was taken. If text was deleted since, the base still
holds it, and so does every manifest that names the base: deleted text would stay in the object
store as long as the base does. So the writer re-bases (publishes the database whole) as soon as
the generation it publishes no longer holds something its base holds; the superseded manifests,
and with them the old base, are collected `grace_s` later (canopy.publish.writer).

What "holds" means here is what a deletion or revocation changes, as keys:
- every text unit, with its access class (an edit or deletion removes units; a relabel changes
  their class, and with it the views cached for it);
- every document, with its path and class (a document's path and title are text too, and a
  document with no units has nothing else);
- every skipped file's path;
- every derived row marked stale (entities, relationships, claims, communities, reports derived
  from revoked units, whose text stays until regeneration rewrites them).
Everything else in the database derives from units and goes with them (the pipeline's
`revoke` and `purge`); regenerated rows replace stale ones, whose keys then vanish. A base whose
keys are all in the current database holds no text the current one has dropped: the patch is
then safe to publish against it.
"""

from __future__ import annotations

import hashlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HeldText"]

_KEY = 8  # bytes of blake2b per key: a collision can only cost one re-base too few in 2^64


def _key(*parts: object) -> bytes:
    return hashlib.blake2b("\0".join(map(str, parts)).encode(), digest_size=_KEY).digest()


def _stale_tables(db: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, primary-key column) of every table with a `stale` column."""
    found = []
    names = [n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    for name in sorted(names):
        columns = db.execute(f"PRAGMA table_info({name})").fetchall()  # noqa: S608 - own names
        if any(c[1] == "stale" for c in columns):
            pk = next((c[1] for c in columns if c[5] == 1), "rowid")
            found.append((name, pk))
    return found


@dataclass(frozen=True)
class HeldText:
    """The keys of what one database file holds (module doc), sorted."""

    keys: frozenset[bytes]

    @classmethod
    def of_database(cls, path: Path) -> HeldText:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            keys = {_key("u", i, a) for i, a in db.execute("SELECT id, acl FROM text_units")}
            keys |= {_key("d", i, p, a)
                     for i, p, a in db.execute("SELECT id, path, acl FROM documents")}
            keys |= {_key("s", p) for (p,) in db.execute("SELECT path FROM skips")}
            for table, pk in _stale_tables(db):
                keys |= {_key("x", table, i) for (i,) in db.execute(
                    f"SELECT {pk} FROM {table} WHERE stale = 1")}  # noqa: S608 - own names
        finally:
            db.close()
        return cls(frozenset(keys))

    def dropped_by(self, current: HeldText) -> bool:
        """Whether `current` no longer holds something this one holds."""
        return not self.keys <= current.keys

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(sorted(self.keys)))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> HeldText | None:
        try:
            raw = path.read_bytes()
        except OSError:
            return None
        if len(raw) % _KEY:
            return None
        return cls(frozenset(raw[i:i + _KEY] for i in range(0, len(raw), _KEY)))
