"""Settle the keys of the instances of the documents an update touches (issue 31).

An instance's unit key comes from its own unit (canopy.store.instances, saved with the
extraction); the key it merges by may come from another unit of its document
(canopy.aliases.document_links: "EU" in one unit, "European Union" in another). So once the
run's units are extracted, every live unit of each document with an added, removed or
re-extracted unit is resolved again, from the unit keys of all of the document's live units: an
edit that removes a link's only evidence splits the names in the document's other units too,
and an incremental update keys every instance as a fresh build does. Nothing is extracted
again. A full build resolves every document.

What changed (the units whose rows were rekeyed, and the keys and relationship ids those rows
had) is merged again by the graph stage; it is also recorded until the regeneration commits
(canopy.store.Store.rekey), so a run interrupted after this stage still merges it. The instance
rows live outside generations, as extractions do, so until that commit a reader's per-caller view
of an entity the change touches is built from the new keys; the access rule holds either way, a
link moving an instance only between names of its own document.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from canopy.aliases import Alias, document_links
from canopy.indexer.stages.build import Build

__all__ = ["Resolved", "stage_resolve"]

_DOCUMENTS = 256  # documents resolved per batch


@dataclass
class Resolved:
    units: set[str] = field(default_factory=set)  # units with a rekeyed row
    keys: set[str] = field(default_factory=set)  # entity keys those rows had or have
    rids: set[str] = field(default_factory=set)  # relationship ids likewise


def stage_resolve(b: Build, touched: Iterable[str], removed: Iterable[str]) -> Resolved:
    """Resolve the documents of `touched` (live units of the new generation) and `removed`
    (committed units not in it), or every document in a full build."""
    pending_units, pending_keys, pending_rids = b.store.pending_rekeyed()
    out = Resolved(set(pending_units), set(pending_keys), set(pending_rids))
    if b.full:
        documents = set(b.reads.keys("documents"))
    else:
        live = [*touched, *pending_units]
        documents = {r.unit.document_id for r in b.reads.units(live).values()}
        removed = list(removed)
        documents |= {r.unit.document_id for r in b.committed.units(removed).values()}
    ordered = sorted(documents)
    for start in range(0, len(ordered), _DOCUMENTS):
        units = b.reads.unit_ids_of_documents(ordered[start:start + _DOCUMENTS])
        unit_ids = [u for us in units.values() for u in us]
        instances = b.store.unit_key_instances(unit_ids)
        links: dict[str, dict[str, Alias]] = {}
        for doc_units in units.values():
            links.update(document_links((u, instances.get(u, [])) for u in doc_units))
        done = b.store.rekey(links, unit_ids)
        out.units |= done.units
        out.keys |= done.keys
        out.rids |= done.rids
    return out
