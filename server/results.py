"""Result models shared by the query engines, the CLI (`--json`) and the MCP tools.

These are the tools' output schemas (structuredContent): keep field names short and stable, since
agents and scripts depend on them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = [
    "Citation",
    "CommunityCard",
    "DrillResult",
    "EntityCard",
    "RelationshipCard",
    "SearchResult",
    "SourceSpan",
    "UsageInfo",
]


class UsageInfo(BaseModel):
    llm_calls: int = Field(0, description="Model calls made for this result (cache hits excluded)")
    prompt_tokens: int = 0
    completion_tokens: int = 0
    elapsed_ms: int = 0
    provider: str = Field(
        "builtin", description="'builtin' (offline, extractive) or 'openai:<model>'")
    embedding_calls: int = Field(
        0, description="Embedding endpoint calls (0 with the builtin embedder)")


class Citation(BaseModel):
    kind: str = Field(description="report | entity | relationship | claim | text_unit")
    id: str = Field(description="Pass report ids to drill_down(community_id=...); "
                                "text units resolve via resources")
    title: str = ""
    document: str | None = Field(None, description="Source document path (text units)")


class SearchResult(BaseModel):
    method: str = Field(description="global | local | drift | basic")
    query: str
    answer: str = Field(description="The answer; extractive when no LLM is configured")
    citations: list[Citation] = Field(
        default_factory=list, description="Sources the answer and context draw on")
    context: str = Field(
        "", description="The retrieved context the answer was written from (may be truncated)")
    community_level: int | None = Field(
        None, description="Level used by global search (None = dynamic)")
    usage: UsageInfo = Field(default_factory=UsageInfo)
    truncated: bool = Field(
        False, description="True when context or citations were cut to fit the result limit")
    note: str | None = Field(None, description="How to get more, when truncated")


class SourceSpan(BaseModel):
    text_unit_id: str
    document: str = Field(description="Document path relative to the indexed folder")
    char_start: int = Field(description="Offset in the document's text as loaded (for Markdown, "
                            "after its front matter; for HTML, PDF and DOCX, in the extracted "
                            "text)")
    char_end: int
    text: str
    metadata: dict[str, str] = Field(
        default_factory=dict,
        description="The document's front-matter fields (source, author, date...), when it has any")


class EntityCard(BaseModel):
    id: str
    name: str
    type: str
    description: str
    degree: int


class RelationshipCard(BaseModel):
    id: str
    source: str = Field(description="Source entity name")
    target: str = Field(description="Target entity name")
    description: str
    weight: float


class CommunityCard(BaseModel):
    id: str
    level: int
    title: str
    summary: str
    rating: float | None = None
    size: int = Field(0, description="Number of member entities")


class FindingCard(BaseModel):
    summary: str
    explanation: str
    entity_ids: list[str] = Field(default_factory=list)
    relationship_ids: list[str] = Field(default_factory=list)
    text_unit_ids: list[str] = Field(default_factory=list)


class DrillResult(BaseModel):
    community: CommunityCard | None = Field(
        None, description="The community at this point (None at the roots)")
    entity: EntityCard | None = Field(
        None, description="The entity asked about (drill_down(entity=...))")
    findings: list[FindingCard] = Field(default_factory=list)
    parents: list[CommunityCard] = Field(
        default_factory=list, description="Chain from the root down to the parent")
    children: list[CommunityCard] = Field(
        default_factory=list, description="Sub-communities (or the roots)")
    entities: list[EntityCard] = Field(
        default_factory=list, description="Top member entities by degree")
    relationships: list[RelationshipCard] = Field(
        default_factory=list, description="Top member relationships")
    sources: list[SourceSpan] = Field(
        default_factory=list, description="Source text spans (leaf or finding)")
    truncated: bool = False
    note: str | None = None
    usage: UsageInfo = Field(default_factory=UsageInfo)
