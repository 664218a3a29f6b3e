"""Per-unit extraction output as instance rows: what entities and relationships are merged from
(the same thing at two depths: canopy.indexer.stages.instances is the stage that writes them).

An extraction is saved as soon as it exists (outside generations), one row per entity,
relationship and claim instance, keyed by normalized name. Rules that make merging a function of
each document's live units alone, so an incremental update merges exactly as a full build does:
- an instance's *unit key* is its name's merge key (canopy.ids.entity_key), or the key of the
  longer name it stands for in this unit (canopy.aliases.unit_aliases: "Altman" beside "Sam
  Altman", or a pair the provider confirmed from the unit's text, `Extraction.links`); the row
  keeps the name as written, which is the merge's record;
- its *key*, what it merges by, is its unit key, or the key of the longer name it stands for in
  its document (canopy.aliases.document_links: "EU" in one unit, "European Union" in another).
  The unit keys are saved with the extraction; the keys are settled once the document's units
  are all extracted (`rekeyed`, canopy.indexer.stages.resolve), and again whenever the
  document's units change;
- an instance with an empty name is dropped;
- a relationship instance counts only when both endpoints are entities extracted from the same
  unit (and are distinct); a claim only when its subject is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from canopy.aliases import Alias, linked_keys
from canopy.ids import entity_key, relationship_id
from canopy.model import ClaimInstance, EntityInstance, Extraction, RelationshipInstance

__all__ = ["InstanceRows", "Rekeyed", "extraction_rows", "payload_extraction", "rekeyed"]


@dataclass
class InstanceRows:
    # unit_id, pos, key, name, type, description, unit key
    entities: list[tuple[str, int, str, str, str, str, str]] = field(default_factory=list)
    # unit_id, pos, rid, source key, target key, description, strength, unit keys of the ends
    relationships: list[tuple[str, int, str, str, str, str, float, str, str]] = field(
        default_factory=list)
    # unit_id, pos, subject key, object key, type, status, description, start, end, quote,
    # unit keys of subject and object
    claims: list[tuple[str, int, str, str, str, str, str, str, str, str, str, str]] = field(
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
                             e.description.strip(), key))
    for pos, r in enumerate(ex.relationships):
        a, b = key_of(r.source), key_of(r.target)
        if a == b or a not in keys or b not in keys:
            continue
        out.relationships.append((ex.unit_id, pos, relationship_id(a, b), min(a, b), max(a, b),
                                  r.description.strip(), float(r.strength), min(a, b), max(a, b)))
    for pos, c in enumerate(ex.claims):
        subject = key_of(c.subject)
        if subject not in keys:
            continue
        obj = key_of(c.object) if c.object else ""
        out.claims.append((ex.unit_id, pos, subject, obj, c.type, c.status, c.description,
                           c.start_date, c.end_date, c.quote, subject, obj))
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


@dataclass
class Rekeyed:
    """What settling the keys of some units' instances changed (`rekeyed`)."""

    # (key, unit_id, pos) of entity instances, (rid, source, target, unit_id, pos) of
    # relationship instances (rid "" for a link that makes the relationship a self-loop: it is
    # not merged), (subject, object, unit_id, pos) of claim instances: the new values
    entities: list[tuple[str, str, int]] = field(default_factory=list)
    relationships: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    claims: list[tuple[str, str, str, int]] = field(default_factory=list)
    units: set[str] = field(default_factory=set)  # units with a changed row
    keys: set[str] = field(default_factory=set)  # keys and rids the changed rows had before
    rids: set[str] = field(default_factory=set)


def rekeyed(links: dict[str, dict[str, Alias]],
            entities: list[tuple[str, int, str, str]],
            relationships: list[tuple[str, int, str, str, str, str, str]],
            claims: list[tuple[str, int, str, str, str, str]]) -> Rekeyed:
    """The rows whose key changes when each unit's instances take its document's links
    (`links`: by unit id, by unit key; canopy.aliases.document_links) over their unit keys.
    Rows as stored: entities (unit_id, pos, key, unit key), relationships (unit_id, pos, rid,
    source, target, unit source, unit target), claims (unit_id, pos, subject, object, unit
    subject, unit object)."""
    out = Rekeyed()

    def key_of(unit: str, unit_key: str) -> str:
        link = links.get(unit, {}).get(unit_key)
        return link.canonical if link is not None else unit_key

    for unit, pos, key, unit_key in entities:
        new = key_of(unit, unit_key)
        if new != key:
            out.entities.append((new, unit, pos))
            out.units.add(unit)
            out.keys |= {key, new}
    for unit, pos, rid, source, target, unit_source, unit_target in relationships:
        a, b = key_of(unit, unit_source), key_of(unit, unit_target)
        ends = (min(a, b), max(a, b))
        new_rid = relationship_id(*ends) if a != b else ""
        if (new_rid, *ends) != (rid, source, target):
            out.relationships.append((new_rid, *ends, unit, pos))
            out.units.add(unit)
            out.rids |= {rid, new_rid} - {""}
            out.keys |= {source, target, *ends}
    for unit, pos, subject, obj, unit_subject, unit_object in claims:
        s, o = key_of(unit, unit_subject), key_of(unit, unit_object) if unit_object else ""
        if (s, o) != (subject, obj):
            out.claims.append((s, o, unit, pos))
            out.units.add(unit)
    return out
