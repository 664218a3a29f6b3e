"""GraphRAG's text units and extractions laid onto Canopy's own text units (`align`).

Canopy keys everything by its own units (edit-stable chunks with content-hash ids, design §3), so
GraphRAG's units, cut as fixed token windows, are not kept as units. Instead each GraphRAG unit
is located in the document's current text, and what GraphRAG extracted from it becomes the
extraction of the Canopy units it covers:
- A document is matched by path (GraphRAG's title is the file's path under its input folder,
  or its name), else by identical text. GraphRAG documents no file matches are left out.
- A GraphRAG unit is located by its exact text, else by its first and last 200 characters; one
  that cannot be found (the document changed since GraphRAG indexed it) is left out.
- A Canopy unit whose own text lies wholly inside located GraphRAG units is *replayed*: its
  extraction is the instances of those units. Any other unit (new text, a file GraphRAG did
  not have) is extracted by the configured provider, like any new unit.
- An entity of a GraphRAG unit goes to each replayed Canopy unit overlapping it whose text names
  it, else to the one overlapping it most; a relationship goes to one such unit holding both
  ends (the one overlapping most; its ends are added there when no unit holds both), with
  strength weight / number of its GraphRAG units, so merged weights equal GraphRAG's.
- Descriptions: GraphRAG keeps only each element's summarized description, so every instance
  carries it; Canopy's merge then finds one distinct description and keeps it as is.
- A claim (covariates.parquet) goes to one replayed Canopy unit overlapping its GraphRAG unit:
  the one whose text holds its quote verbatim, else one naming its subject, else the one
  overlapping most. Its subject and object are GraphRAG names (upper case), mapped to the
  imported entities by Canopy's name key; the subject's instance (and a known object's) is added
  to that unit, as Canopy keeps a claim only with its subject extracted from the same unit. A
  claim whose subject is no imported entity is left out (Canopy's extraction drops those too);
  an object that is none ("NONE", or no imported entity) becomes "". Dates and quote follow
  Canopy's rules (canopy.claims): ISO 8601 or dropped, a quote kept only if it is in the unit's
  text. Claims GraphRAG extracted twice (the same sentence in two overlapping GraphRAG units)
  are one claim of the Canopy unit.
Provenance therefore follows Canopy's units, and with it the document's ACL labels.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from canopy.claims import checked_claim, claim_key, verified_quote
from canopy.ids import content_hash, entity_key, text_hash
from canopy.indexer.loaders import LoadedDocument
from canopy.indexer.operations.chunking import chunk_document
from canopy.model import (
    ClaimInstance,
    EntityInstance,
    Extraction,
    RelationshipInstance,
    TextUnit,
)
from canopy.server.wings.graphrag.ingest.tables import (
    GRClaim,
    GRDocument,
    GREntity,
    GROutput,
    GRUnit,
)
from canopy.tokenizer import Tokenizer

__all__ = ["Alignment", "align", "canopy_document_id"]

_PROBE = 200  # characters of a unit's ends located when its whole text is not found


@dataclass
class Alignment:
    extractions: dict[str, Extraction] = field(default_factory=dict)  # Canopy unit id -> replayed
    documents: dict[str, str] = field(default_factory=dict)  # Canopy path -> GraphRAG doc id
    left_out_documents: list[str] = field(default_factory=list)  # GraphRAG titles not matched
    units_located: int = 0  # GraphRAG units found in the current text
    units_not_located: int = 0
    units_identical: int = 0  # GraphRAG units whose text is a Canopy unit's own text
    canopy_units: int = 0  # units of the matched documents
    canopy_units_fresh: int = 0  # of those, units left to the configured provider
    claims_placed: int = 0  # GraphRAG claims given to a replayed Canopy unit (before merging)
    # GraphRAG claims left out: their unit was not located or covers no replayed unit, or their
    # subject is no imported entity
    claims_left_out: int = 0


def canopy_document_id(path: str) -> str:
    """The id a new path gets in a new index (canopy.indexer.stages.documents.plan_documents)."""
    return "doc-" + content_hash(path)


def _match(docs: list[LoadedDocument], theirs: list[GRDocument]) -> dict[str, GRDocument]:
    by_title: dict[str, list[GRDocument]] = defaultdict(list)
    for d in theirs:
        by_title[d.title].append(d)
        by_title[PurePosixPath(d.title).name].append(d)
    by_text = {text_hash(d.text.strip()): d for d in theirs}
    out: dict[str, GRDocument] = {}
    used: set[str] = set()
    for doc in docs:
        for key in (doc.path, PurePosixPath(doc.path).name):
            found = [d for d in by_title.get(key, []) if d.id not in used]
            if len(found) == 1 or (found and key == doc.path):
                out[doc.path] = found[0]
                break
        else:
            hit = by_text.get(text_hash(doc.text.strip()))
            if hit is not None and hit.id not in used:
                out[doc.path] = hit
        if doc.path in out:
            used.add(out[doc.path].id)
    return out


def _locate(text: str, unit: str) -> tuple[int, int] | None:
    at = text.find(unit)
    if at >= 0:
        return at, at + len(unit)
    body = unit.strip()
    if len(body) < 2 * _PROBE:
        return None
    head, tail = body[:_PROBE], body[-_PROBE:]
    start = text.find(head)
    end = text.find(tail, start + 1) if start >= 0 else -1
    return (start, end + len(tail)) if start >= 0 and end >= 0 else None


def _covered(spans: list[tuple[int, int]], start: int, end: int) -> bool:
    at = start
    for a, b in sorted(spans):
        if a > at:
            break
        at = max(at, b)
        if at >= end:
            return True
    return at >= end


def align(out: GROutput, docs: Iterable[LoadedDocument], tok: Tokenizer, *, max_tokens: int,
          overlap: int) -> Alignment:
    docs = list(docs)
    result = Alignment()
    matched = _match(docs, out.documents)
    result.documents = {p: d.id for p, d in matched.items()}
    taken = {d.id for d in matched.values()}
    result.left_out_documents = sorted(d.title for d in out.documents if d.id not in taken)
    units_of: dict[str, list[GRUnit]] = defaultdict(list)
    for u in out.units:
        units_of[u.document_id].append(u)
    entities_of: dict[str, list[int]] = defaultdict(list)  # GraphRAG unit -> entity indexes
    for i, e in enumerate(out.entities):
        for uid in e.unit_ids:
            entities_of[uid].append(i)
    rels_of: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(out.relationships):
        for uid in r.unit_ids:
            rels_of[uid].append(i)
    claims_of: dict[str, list[GRClaim]] = defaultdict(list)
    for c in out.claims:
        claims_of[c.unit_id].append(c)
    for doc in docs:
        theirs = matched.get(doc.path)
        if theirs is None:
            continue
        units = chunk_document(canopy_document_id(doc.path), doc.text, tok,
                               max_tokens=max_tokens, overlap=overlap)
        result.canopy_units += len(units)
        own = {doc.text[u.char_start:u.char_end] for u in units}
        located: list[tuple[GRUnit, int, int]] = []
        for gu in units_of.get(theirs.id, []):
            span = _locate(doc.text, gu.text)
            if span is None:
                result.units_not_located += 1
                continue
            result.units_located += 1
            result.units_identical += gu.text in own
            located.append((gu, *span))
        spans = [(a, b) for _, a, b in located]
        replayed = [u for u in units if _covered(spans, u.char_start, u.char_end)]
        result.canopy_units_fresh += len(units) - len(replayed)
        _place(out, located, replayed, entities_of, rels_of, claims_of, result)
    result.claims_left_out = len(out.claims) - result.claims_placed
    return result


def _place(out: GROutput, located: list[tuple[GRUnit, int, int]], replayed: list[TextUnit],
           entities_of: dict[str, list[int]], rels_of: dict[str, list[int]],
           claims_of: dict[str, list[GRClaim]], result: Alignment) -> None:
    ents: dict[str, dict[str, EntityInstance]] = {u.id: {} for u in replayed}
    rels: dict[str, list[RelationshipInstance]] = {u.id: [] for u in replayed}
    claims: dict[str, dict[tuple[str, str, str, str], ClaimInstance]] = {u.id: {} for u in replayed}
    lowered = {u.id: u.text.casefold() for u in replayed}
    texts = {u.id: u.text for u in replayed}
    by_title = {e.title: e for e in out.entities}
    by_key: dict[str, GREntity] = {}
    for e in out.entities:
        by_key.setdefault(entity_key(e.title), e)
    for gu, a, b in located:
        near = sorted(((min(b, u.char_end) - max(a, u.char_start), u.id) for u in replayed
                       if min(b, u.char_end) > max(a, u.char_start)), reverse=True)
        if not near:
            continue
        placed: dict[str, set[str]] = {}
        for i in entities_of.get(gu.id, []):
            e = out.entities[i]
            inst = EntityInstance(e.title, e.type, e.description)
            named = [uid for _, uid in near if e.title.casefold() in lowered[uid]]
            targets = named or [near[0][1]]
            for uid in targets:
                ents[uid].setdefault(e.title, inst)
            placed[e.title] = set(targets)
        for i in rels_of.get(gu.id, []):
            r = out.relationships[i]
            both = [uid for _, uid in near
                    if uid in placed.get(r.source, ()) and uid in placed.get(r.target, ())]
            uid = both[0] if both else near[0][1]
            for end in (r.source, r.target):
                known = by_title.get(end)
                if known is not None:
                    ents[uid].setdefault(end, EntityInstance(known.title, known.type,
                                                             known.description))
            rels[uid].append(RelationshipInstance(r.source, r.target, r.description,
                                                  r.weight / max(1, len(r.unit_ids))))
        for c in claims_of.get(gu.id, []):
            subject = by_key.get(entity_key(c.subject) or "\0")
            if subject is None:
                continue
            # GraphRAG writes NONE for an unknown object; no entity has an empty key
            obj = by_key.get(entity_key(c.object)) if entity_key(c.object) else None
            uid = next((u for _, u in near if verified_quote(c.source_text, texts[u])),
                       next((u for _, u in near if subject.title.casefold() in lowered[u]),
                            near[0][1]))
            for member in (subject, obj):
                if member is not None:
                    ents[uid].setdefault(member.title, EntityInstance(
                        member.title, member.type, member.description))
            # GraphRAG's model may bold the status (**TRUE**)
            claim = checked_claim(subject.title, obj.title if obj is not None else "", c.type,
                                  c.status.strip().strip("*"), c.description, c.start_date,
                                  c.end_date, c.source_text, texts[uid])
            key = claim_key(claim)
            if key not in claims[uid] or (claim.quote and not claims[uid][key].quote):
                claims[uid][key] = claim
            result.claims_placed += 1
    for u in replayed:
        result.extractions[u.id] = Extraction(u.id, tuple(ents[u.id].values()),
                                              tuple(rels[u.id]), tuple(claims[u.id].values()))
