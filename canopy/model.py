"""Every artifact's shape, defined once.

Provenance is data: each derived artifact carries the sorted tuple of text-unit ids it was
derived from (`text_unit_ids`). Serving rules (design §2) are checked against exactly that field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "ClaimInstance",
    "Claim",
    "Community",
    "Document",
    "EntityInstance",
    "Entity",
    "Extraction",
    "Finding",
    "RelationshipInstance",
    "Relationship",
    "Report",
    "Skip",
    "TextUnit",
    "UnitFailure",
    "metadata_line",
]


def metadata_line(pairs: Iterable[tuple[str, str]]) -> str:
    """"source: X · date: Y": front-matter metadata as one line ("" without any)."""
    return " · ".join(f"{k}: {v}" for k, v in pairs)


@dataclass(frozen=True)
class Document:
    id: str
    path: str  # relative to the documents folder, POSIX separators
    content_hash: str
    title: str
    n_chars: int
    labels: tuple[str, ...] = ()  # ACL labels from the policy; () with no policy
    # (field, value) pairs of the document's front matter, as rendered for search and context
    metadata: tuple[tuple[str, str], ...] = ()
    # When it is from (ISO date; its text units' time too) and where that came from
    # (canopy.indexer.doc_time: "front_matter:<field>", "rule:<glob>", "text", "mtime")
    time: str = ""
    time_source: str = ""

    def metadata_line(self) -> str:
        return metadata_line(self.metadata)

    def header(self) -> str:
        """What every text unit of the document is indexed and shown under: its title and,
        on a second line, its metadata. A unit from the middle of an article still matches
        "the TechCrunch article of October 6" that way."""
        line = self.metadata_line()
        return f"{self.title}\n{line}" if line else self.title

    def label(self) -> str:
        """The title with its metadata in parentheses, on one line (context block titles)."""
        line = self.metadata_line()
        return f"{self.title} ({line})" if line else self.title


@dataclass(frozen=True)
class TextUnit:
    id: str
    document_id: str
    ordinal: int
    text: str
    n_tokens: int
    char_start: int  # span of the unit's own text (without overlap prefix) in the document
    char_end: int


@dataclass(frozen=True)
class Skip:
    """A file that was not indexed, and why (visible in `canopy status`)."""

    path: str
    reason: str


@dataclass(frozen=True)
class UnitFailure:
    """A text unit whose extraction failed after retries and repair; retried on the next run."""

    unit_id: str
    task: str
    error: str


# ---- extraction output, one per text unit -------------------------------------------------


@dataclass(frozen=True)
class EntityInstance:
    name: str
    type: str
    description: str


@dataclass(frozen=True)
class RelationshipInstance:
    source: str
    target: str
    description: str
    strength: float = 1.0


@dataclass(frozen=True)
class ClaimInstance:
    subject: str
    object: str
    type: str
    status: str  # TRUE | FALSE | SUSPECTED
    description: str
    # The claimed activity's period (ISO 8601 dates, "" when unknown) and the sentence(s) of
    # the unit that state it, verbatim (canopy.claims checks both before they are kept).
    start_date: str = ""
    end_date: str = ""
    quote: str = ""


@dataclass(frozen=True)
class Extraction:
    unit_id: str
    entities: tuple[EntityInstance, ...] = ()
    relationships: tuple[RelationshipInstance, ...] = ()
    claims: tuple[ClaimInstance, ...] = ()
    passes: int = 1  # extraction + gleaning passes actually run
    # (name, longer name it stands for) pairs of this unit's entities that the provider confirmed
    # from the unit's text (canopy.aliases: the LLM confirmation of the pairs its rules leave open)
    links: tuple[tuple[str, str], ...] = ()


# ---- merged graph -------------------------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    id: str
    name: str  # display name: the most frequent surface form
    type: str
    description: str
    text_unit_ids: tuple[str, ...]
    degree: int = 0


@dataclass(frozen=True)
class Relationship:
    id: str
    source: str  # entity id
    target: str  # entity id
    description: str
    weight: float  # summed strength of instances
    text_unit_ids: tuple[str, ...]


@dataclass(frozen=True)
class Claim:
    id: str
    subject: str  # entity id
    object: str  # entity id or ""
    type: str
    status: str
    description: str
    text_unit_ids: tuple[str, ...]  # the one unit it was extracted from
    start_date: str = ""  # ISO 8601 date, "" when the text gives none
    end_date: str = ""
    quote: str = ""  # verbatim text of that unit (whitespace collapsed), "" when none was kept


# ---- communities and reports --------------------------------------------------------------


@dataclass(frozen=True)
class Community:
    """A community with its members, as a report is written from it. The store keeps the
    hierarchy and memberships in tables and assembles this on demand (canopy.store)."""

    id: str
    level: int
    parent: str | None
    children: tuple[str, ...]
    entity_ids: tuple[str, ...]
    relationship_ids: tuple[str, ...]  # relationships with both endpoints inside
    fingerprint: str = ""  # hash of members' and children's content; reports regenerate on change


@dataclass(frozen=True)
class Finding:
    summary: str
    explanation: str
    entity_ids: tuple[str, ...] = ()
    relationship_ids: tuple[str, ...] = ()
    text_unit_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Report:
    community_id: str
    level: int
    title: str
    summary: str
    rating: float
    rating_explanation: str
    findings: tuple[Finding, ...]
    text_unit_ids: tuple[str, ...]
    fingerprint: str
    context_tokens: int = 0
    used_subreports: tuple[str, ...] = field(default=())  # child community ids substituted

    def full_text(self) -> str:
        parts = [f"# {self.title}", self.summary]
        parts += [f"## {f.summary}\n{f.explanation}" for f in self.findings]
        return "\n\n".join(parts)

    def digest(self) -> str:
        """Title, summary and the findings' headlines: what a relevance rating reads (a
        fraction of the full text)."""
        return "\n".join([self.title, self.summary, *(f"- {f.summary}" for f in self.findings)])
