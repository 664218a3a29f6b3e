"""`Inventory`: what status, warm-up, listings and exports count and enumerate for one caller.

Counts are over rows that touch an ACL class the caller reads (canopy.store counts them in SQL);
id lists are candidates whose serving state the reader still decides (canopy.acl.reader). It holds
the request's snapshot privately, like the reader it belongs to: engines and commands reach the
index only through the reader and this object.
"""

from __future__ import annotations

from collections.abc import Iterable

from canopy.acl.caller import Caller
from canopy.storage import GraphSnapshot

__all__ = ["Inventory"]


class Inventory:
    def __init__(self, snap: GraphSnapshot, caller: Caller) -> None:
        self._snap = snap
        self._readable = caller.readable

    def count_readable(self, table: str) -> int:
        """Rows of `table` (documents, entities, relationships) touching a readable class."""
        return self._snap.count_touching(table, self._readable)

    def partly_readable(self, table: str) -> list[str]:
        """Ids of rows of `table` that touch a readable class and one that is not: the
        candidates for views."""
        return self._snap.partly_touching(table, self._readable)

    def readable_ids(self, table: str) -> list[str]:
        """Ids of the rows of `table` (entities, relationships, claims) that may exist for the
        caller: those touching a readable class, and the stale ones (candidates: the reader
        decides each). For exports, which enumerate what a caller may read."""
        touching = self._snap.ids_touching(table, self._readable)
        return sorted({*touching, *self._snap.stale_ids(table)})

    def unit_ids_of(self, document_ids: Iterable[str]) -> dict[str, list[str]]:
        """Ids of the live units of each of these documents (candidates: CallerReader.units
        serves only the readable ones)."""
        return self._snap.unit_ids_of_documents(document_ids)

    def community_levels_readable(self) -> dict[str, int]:
        """Communities per level that touch a readable class."""
        return self._snap.community_levels_touching(self._readable)

    def stale_ids(self, table: str) -> list[str]:
        """Ids of rows a revocation left stale (their state is decided by the reader)."""
        return self._snap.stale_ids(table)

    def community_ids(self) -> list[str]:
        """Every community id of the generation (candidates: the reader decides each)."""
        return self._snap.community_ids()

    def community_ids_by_level(self) -> list[str]:
        """Every community id, broadest level first (candidates, as above)."""
        ids: list[str] = []
        for level in self._snap.levels():
            ids += [r.id for r in self._snap.level_partition(level) if r.level == level]
        return ids

    def relationships_among(self, cid: str) -> list[str]:
        """Ids of the relationships with both ends in community `cid` (candidates)."""
        return self._snap.relationships_among([cid]).get(cid, [])
