"""What engines hand back about artifacts the caller was served: cards, spans and citations."""

from __future__ import annotations

from canopy.acl.reader import CallerReader
from canopy.model import Claim, Document, Entity, Relationship, Report, TextUnit
from canopy.providers.base import ContextBlock
from canopy.server.results import (
    Citation,
    ClaimCard,
    CommunityCard,
    EntityCard,
    FindingCard,
    RelationshipCard,
    SourceSpan,
)
from canopy.server.tool_text import claim_period_text, claim_quote_text

__all__ = [
    "block_citation",
    "claim_block",
    "claim_card",
    "community_card",
    "entity_card",
    "finding_cards",
    "relationship_card",
    "span_of",
]


def community_card(reader: CallerReader, report: Report) -> CommunityCard:
    """A served report's card; `size` counts the members that exist for the caller."""
    return CommunityCard(id=report.community_id, level=report.level, title=report.title,
                         summary=report.summary, rating=report.rating,
                         size=reader.visible_size(report.community_id))


def finding_cards(reader: CallerReader, report: Report) -> list[FindingCard]:
    """The report's findings with their evidence ids narrowed to what exists for the caller."""
    entities = reader.entity_states({e for f in report.findings for e in f.entity_ids})
    rels = reader.relationship_states({r for f in report.findings for r in f.relationship_ids})
    units = reader.readable_units({u for f in report.findings for u in f.text_unit_ids})
    return [FindingCard(summary=f.summary, explanation=f.explanation,
                        entity_ids=[e for e in f.entity_ids if entities.get(e)],
                        relationship_ids=[r for r in f.relationship_ids if rels.get(r)],
                        text_unit_ids=[u for u in f.text_unit_ids if u in units])
            for f in report.findings]


def entity_card(entity: Entity) -> EntityCard:
    return EntityCard(id=entity.id, name=entity.name, type=entity.type,
                      description=entity.description, degree=entity.degree)


def relationship_card(rel: Relationship, names: dict[str, str]) -> RelationshipCard:
    """A served relationship with its endpoints' names as the caller is shown them."""
    return RelationshipCard(id=rel.id, source=names.get(rel.source, ""),
                            target=names.get(rel.target, ""), description=rel.description,
                            weight=rel.weight)


def claim_card(claim: Claim, names: dict[str, str]) -> ClaimCard:
    """A served claim with its entities' names as the caller is shown them."""
    return ClaimCard(id=claim.id, subject=names.get(claim.subject, ""),
                     object=names.get(claim.object, "") if claim.object else "",
                     type=claim.type, status=claim.status, start_date=claim.start_date,
                     end_date=claim.end_date, description=claim.description, quote=claim.quote,
                     text_unit_id=claim.text_unit_ids[0])


def claim_block(claim: Claim, names: dict[str, str]) -> ContextBlock:
    """A claim as local search's context shows it: who, what, status and period in the title;
    the description, then the verified quote (cut at tool_text.QUOTE_CHARS; left out when it is
    the description word for word, as with the builtin extractor)."""
    card = claim_card(claim, names)
    who = f"{card.subject} → {card.object}" if card.object else card.subject
    when = claim_period_text(card.start_date, card.end_date)
    title = f"{who}: {card.type} ({card.status}{', ' + when if when else ''})"
    quote = claim_quote_text(card.quote, card.description)
    text = f"{card.description}\n{quote}" if quote else card.description
    return ContextBlock("claim", claim.id, title, text)


def span_of(unit: TextUnit, doc: Document) -> SourceSpan:
    """The unit's own span of its document: `text` is document[char_start:char_end] (a unit's
    text starts with an overlap prefix from the previous unit, which is not part of the span)."""
    own = unit.char_end - unit.char_start
    text = unit.text[len(unit.text) - own:] if 0 < own <= len(unit.text) else unit.text
    return SourceSpan(text_unit_id=unit.id, document=doc.path, char_start=unit.char_start,
                      char_end=unit.char_end, text=text, metadata=dict(doc.metadata),
                      dated=dated(doc))


def dated(doc: Document) -> str | None:
    """The document's time with its source, as a span shows it: "2023-10-06 (front matter:
    date)"; None for a document indexed before times were recorded."""
    if not doc.time:
        return None
    source = doc.time_source.replace("_", " ").replace(":", ": ", 1)
    return f"{doc.time} ({source})" if source else doc.time


def block_citation(block: ContextBlock) -> Citation:
    return Citation(kind=block.kind, id=block.id, title=block.cite_title or block.title,
                    document=block.source or None)
