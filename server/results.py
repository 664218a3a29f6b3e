"""Result models shared by the query engines, the CLI (`--json`) and the MCP tools.

These are the tools' output schemas (structuredContent): keep field names short and stable, since
agents and scripts depend on them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

__all__ = [
    "Citation",
    "AliasCard",
    "ClaimCard",
    "CommunityCard",
    "Coverage",
    "LevelCoverage",
    "DrillResult",
    "EntityCard",
    "RelationshipCard",
    "RouteInfo",
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
    period: str | None = Field(None, description="Change questions: the evidence's period")


class LevelCoverage(BaseModel):
    level: int
    considered: int = Field(0, description="Communities of this level that selection took up")
    rated: int = Field(0, description="Of those, rated for relevance (dynamic selection)")
    relevant: int = Field(0, description="Rated relevant enough to read or to descend into")
    mapped: int = Field(0, description="Reports read by the map step")


class Coverage(BaseModel):
    """What global search read of the caller's hierarchy, and what rating it cost."""

    selection: str = Field(description="'dynamic' (rated from the top down) or 'level'")
    levels: list[LevelCoverage] = Field(default_factory=list)
    rating_calls: int = 0
    rating_prompt_tokens: int = Field(
        0, description="Prompt tokens of the rating calls (0 with the builtin provider)")
    map_calls: int = 0
    unrated: int = Field(0, description=(
        "Candidates left unrated: beyond [query] dynamic_max_rated or "
        "dynamic_max_rating_calls (the least similar to the question are left), or in a "
        "rating call that failed"))
    rating_bound: int | None = Field(
        None, description="The bound on rating calls, when it left candidates unrated")
    unmapped: int = Field(0, description="Selected reports lost to a failed map call")
    note: str | None = Field(
        None, description="Set when no community was rated relevant and the best-rated "
        "reports were read anyway")

    @property
    def complete(self) -> bool:
        return not (self.unrated or self.unmapped)

    def line(self) -> str:
        """One line for people and agents: what was considered, rated and read, per level."""
        parts = []
        for c in self.levels:
            rated = (f", {c.rated} rated, {c.relevant} relevant"
                     if self.selection == "dynamic" else "")
            parts.append(f"level {c.level}: {c.considered} considered{rated}, {c.mapped} read")
        out = "; ".join(parts) or "no community report"
        tokens = (f" of {self.rating_prompt_tokens:,} prompt tokens"
                  if self.rating_prompt_tokens else "")
        calls = (f" ({self.rating_calls} rating call{'s' * (self.rating_calls != 1)}{tokens}, "
                 f"{self.map_calls} map call{'s' * (self.map_calls != 1)})")
        gaps = []
        if self.unrated:
            bound = (f" (the bound of {self.rating_bound} rating calls)"
                     if self.rating_bound is not None else "")
            gaps.append(f"{self.unrated} candidates not rated{bound}")
        if self.unmapped:
            gaps.append(f"{self.unmapped} reports lost to failed map calls")
        note = f"; {self.note}" if self.note else ""
        return out + calls + (" — incomplete: " + ", ".join(gaps) if gaps else "") + note


class RouteInfo(BaseModel):
    """Why the `search` tool (or `canopy query -m auto`) chose the engine that answered."""

    engine: str = Field(description="basic | local | global: the engine that answered")
    by: str = Field(description="'rules' (offline classification) or 'llm' (the model's)")
    reason: str = Field(description="Why, in one sentence; it quotes the question's own words")

    def how(self) -> str:
        return "LLM classification" if self.by == "llm" else "offline rules"


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
    coverage: Coverage | None = Field(
        None, description="Global search: communities considered, rated and read, per level")
    usage: UsageInfo = Field(default_factory=UsageInfo)
    truncated: bool = Field(
        False, description="True when context or citations were cut to fit the result limit")
    note: str | None = Field(None, description="How to get more, when truncated")
    route: RouteInfo | None = Field(
        None, description="search (routed) only: which engine answered and why")


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
    dated: str | None = Field(
        None, description="The document's date and where it came from (front matter, a [time] "
        "rule, its text, its file's mtime)")


class EntityCard(BaseModel):
    id: str
    name: str
    type: str
    description: str
    degree: int


class AliasCard(BaseModel):
    name: str = Field(description="Another name the entity was merged from, as written")
    rule: str = Field(description="What linked it: form (case, punctuation, accents, spacing, "
                      "legal suffix), surname, initialism or abbreviation")
    text_unit_ids: list[str] = Field(description="Text units (readable by you) whose text "
                                     "supports the link")


class RelationshipCard(BaseModel):
    id: str
    source: str = Field(description="Source entity name")
    target: str = Field(description="Target entity name")
    description: str
    weight: float


class ClaimCard(BaseModel):
    """A claim (covariate, Edge et al. 2024 §2.1.2) about an entity, as extracted from one unit."""

    id: str
    subject: str = Field(description="Subject entity name")
    object: str = Field("", description="Object entity name, or empty")
    type: str = Field(description="Category in capitals, e.g. LEGAL_ACTION")
    status: str = Field(description="TRUE, FALSE or SUSPECTED (alleged, unconfirmed)")
    start_date: str = Field("", description="ISO 8601 date the claimed activity began, or empty")
    end_date: str = Field("", description="ISO 8601 date it ended, or empty")
    description: str
    quote: str = Field("", description="Verbatim text of the source unit stating the claim "
                       "(whitespace collapsed); empty when none could be verified")
    text_unit_id: str = Field(description="The unit it was extracted from (canopy://units/<id>)")


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
    claims: list[ClaimCard] = Field(
        default_factory=list, description="Claims about the entity (drill_down(entity=...)), "
        "with their period and source quote")
    aliases: list[AliasCard] = Field(
        default_factory=list, description="Other names the entity (drill_down(entity=...)) was "
        "merged from, each with its rule and supporting text units")
    sources: list[SourceSpan] = Field(
        default_factory=list, description="Source text spans (leaf or finding)")
    truncated: bool = False
    note: str | None = None
    usage: UsageInfo = Field(default_factory=UsageInfo)
