"""Merge extraction instances into entities and relationships (design §3.4).

Instances of an entity merge by normalized name (case, whitespace, punctuation, NFKC). A merge is
a function of the entity's instances in live units alone, visited in a fixed order (by the hash
of the unit's text, then unit id, then position), so an incremental update that re-merges only
the entities whose instances changed produces exactly the rows of a from-scratch build.

Pure: instance rows in, drafts and rows out. What a draft's several descriptions are summarized
into is settled by canopy.indexer.descriptions (the provider's part).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from canopy.aliases import display_name
from canopy.ids import content_hash, entity_id
from canopy.model import Entity, Relationship
from canopy.store.reads import EntityInstanceRow, RelationshipInstanceRow
from canopy.store.rows import EntityRow, Gate, RelationshipRow
from canopy.tokenizer import Tokenizer

__all__ = [
    "EntityDraft",
    "RelationshipDraft",
    "acl_signature",
    "entity_row",
    "merge_entities",
    "merge_relationships",
    "most_frequent",
    "relationship_row",
    "summary_input",
    "summary_key",
]

_MAX_SUMMARY_INPUT_TOKENS = 4000


def most_frequent(counter: Counter[str]) -> str:
    """The most frequent form, ties to the smallest: deterministic whatever the visit order."""
    return min(counter.items(), key=lambda kv: (-kv[1], kv[0]))[0]


def summary_input(descs: list[str], tok: Tokenizer) -> list[str]:
    """The descriptions a summary is written from: in order, within the input budget."""
    if sum(len(d) for d in descs) <= _MAX_SUMMARY_INPUT_TOKENS:  # a token spans >= 1 character
        return descs
    kept: list[str] = []
    used = 0
    for d in descs:
        n = tok.count(d)
        if used + n > _MAX_SUMMARY_INPUT_TOKENS and kept:
            break
        kept.append(d)
        used += n
    return kept


def summary_key(provider_name: str, max_tokens: int, name: str, kept: list[str],
                prompt: str = "") -> str:
    """Memo key of one summary; shared with per-caller views (canopy.acl.views), so a visible subset
    summarized once is never summarized again. `prompt`: a replaced summarize template
    (canopy.providers.base.prompt_key), which summarizes afresh."""
    return "summary:" + content_hash(provider_name, str(max_tokens), name, *kept,
                                     *([prompt] if prompt else []), length=32)


def acl_signature(unit_acl: Iterable[tuple[str, int]]) -> str:
    """Hash of an artifact's (unit, ACL class) pairs: it changes when a source unit is relabelled,
    which keys per-caller views (canopy.acl.views) without touching content fingerprints."""
    return content_hash(*(f"{u}:{a}" for u, a in sorted(set(unit_acl))))


@dataclass(frozen=True)
class EntityDraft:
    """An entity merged from its instances, before its description is settled."""

    id: str
    key: str
    name: str
    type: str
    descriptions: tuple[str, ...]  # distinct, in merge order
    unit_acl: tuple[tuple[str, int], ...]  # (unit id, ACL class), sorted


@dataclass(frozen=True)
class RelationshipDraft:
    id: str
    source: str  # entity id
    target: str
    descriptions: tuple[str, ...]
    weight: float  # summed strength of instances
    unit_acl: tuple[tuple[str, int], ...]


def merge_entities(rows: Iterable[EntityInstanceRow]) -> dict[str, EntityDraft]:
    """Drafts by merge key from instance rows given in merge order (GraphReads order); named
    by the entity's own form of the name, not a short form merged into it (canopy.aliases)."""
    names: dict[str, Counter[str]] = {}
    types: dict[str, Counter[str]] = {}
    descs: dict[str, list[str]] = {}
    units: dict[str, dict[str, int]] = {}
    for r in rows:
        names.setdefault(r.key, Counter())[r.name] += 1
        types.setdefault(r.key, Counter())[r.type] += 1
        kept = descs.setdefault(r.key, [])
        if r.description and r.description not in kept:
            kept.append(r.description)
        units.setdefault(r.key, {})[r.unit_id] = r.acl
    return {key: EntityDraft(entity_id(key), key, display_name(names[key], key),
                             most_frequent(types[key]), tuple(descs[key]),
                             tuple(sorted(units[key].items())))
            for key in names}


def merge_relationships(rows: Iterable[RelationshipInstanceRow]) -> dict[str, RelationshipDraft]:
    ends: dict[str, tuple[str, str]] = {}
    weight: dict[str, float] = {}
    descs: dict[str, list[str]] = {}
    units: dict[str, dict[str, int]] = {}
    for r in rows:
        ends[r.rid] = (r.source_key, r.target_key)
        weight[r.rid] = weight.get(r.rid, 0.0) + float(r.strength)
        kept = descs.setdefault(r.rid, [])
        if r.description and r.description not in kept:
            kept.append(r.description)
        units.setdefault(r.rid, {})[r.unit_id] = r.acl
    return {rid: RelationshipDraft(rid, entity_id(a), entity_id(b), tuple(descs[rid]),
                                   weight[rid], tuple(sorted(units[rid].items())))
            for rid, (a, b) in ends.items()}


def entity_row(d: EntityDraft, description: str, degree: int) -> EntityRow:
    units = tuple(u for u, _ in d.unit_acl)
    e = Entity(d.id, d.name, d.type, description, units, degree)
    gate = Gate(frozenset(a for _, a in d.unit_acl), acl_signature(d.unit_acl), False)
    return EntityRow(e, d.key, gate, entity_hash(e))


def entity_hash(e: Entity) -> str:
    """What a community report could be written from, for this entity (and its provenance)."""
    return content_hash(e.id, e.name, e.type, e.description, str(e.degree), *e.text_unit_ids)


def relationship_row(d: RelationshipDraft, description: str) -> RelationshipRow:
    units = tuple(u for u, _ in d.unit_acl)
    r = Relationship(d.id, d.source, d.target, description, d.weight, units)
    gate = Gate(frozenset(a for _, a in d.unit_acl), acl_signature(d.unit_acl), False)
    return RelationshipRow(r, gate, content_hash(r.id, r.description, f"{r.weight:g}", *units))
