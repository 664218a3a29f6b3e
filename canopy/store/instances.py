"""Per-unit extraction output as instance rows: what entities and relationships are merged from
(the same thing at two depths: canopy.indexer.stages.instances is the stage that writes them).

An extraction is saved as soon as it exists (outside generations), one row per entity,
relationship and claim instance, keyed by normalized name. Rules that make merging a function of
each unit alone, so an incremental update merges exactly as a full build does:
- an instance is keyed by its name's merge key (canopy.ids.entity_key), or by the key of the
  longer name it stands for in this unit (canopy.aliases.unit_aliases: "Altman" beside "Sam
  Altman", or a pair the provider confirmed from the unit's text, `Extraction.links`); the row
  keeps the name as written, which is the merge's record;
- an instance with an empty name is dropped;
- a relationship instance counts only when both endpoints are entities extracted from the same
  unit (and are distinct); a claim only when its subject is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from canopy.aliases import linked_keys
from canopy.ids import entity_key, relationship_id
from canopy.model import ClaimInstance, EntityInstance, Extraction, RelationshipInstance

__all__ = ["InstanceRows", "extraction_rows", "payload_extraction"]


@dataclass
class InstanceRows:
    entities: list[tuple[str, int, str, str, str, str]] = field(default_factory=list)
    relationships: list[tuple[str, int, str, str, str, str, float]] = field(default_factory=list)
    # unit_id, pos, subject key, object key, type, status, description, start, end, quote
    claims: list[tuple[str, int, str, str, str, str, str, str, str, str]] = field(
        default_factory=list)


def extraction_rows(ex: Extraction) -> InstanceRows:
    """The instance rows of one unit's extraction (see the module docstring for the rules)."""
    out = InstanceRows()
    keys: set[str] = set()
    links = linked_keys([(e.name, e.type) for e in ex.entities], ex.links)

    def key_of(name: str) -> str:
        key = entity_key(name)
        link = links.get(key)
        return link.canonical if link is not None else key

    for pos, e in enumerate(ex.entities):
        key = key_of(e.name)
        if not key:
            continue
        keys.add(key)
        out.entities.append((ex.unit_id, pos, key, e.name.strip(), e.type.strip().lower(),
                             e.description.strip()))
    for pos, r in enumerate(ex.relationships):
        a, b = key_of(r.source), key_of(r.target)
        if a == b or a not in keys or b not in keys:
            continue
        out.relationships.append((ex.unit_id, pos, relationship_id(a, b), min(a, b), max(a, b),
                                  r.description.strip(), float(r.strength)))
    for pos, c in enumerate(ex.claims):
        subject = key_of(c.subject)
        if subject not in keys:
            continue
        obj = key_of(c.object) if c.object else ""
        out.claims.append((ex.unit_id, pos, subject, obj, c.type, c.status, c.description,
                           c.start_date, c.end_date, c.quote))
    return out


def payload_extraction(unit_id: str, payload: str, passes: int) -> Extraction:
    """An extraction stored by schema versions before m004 (a JSON payload per unit)."""
    d: dict[str, Any] = json.loads(payload)
    return Extraction(
        unit_id,
        tuple(EntityInstance(*e) for e in d["entities"]),
        tuple(RelationshipInstance(*r) for r in d["relationships"]),
        tuple(ClaimInstance(*c[:5]) for c in d["claims"]),
        passes,
    )
