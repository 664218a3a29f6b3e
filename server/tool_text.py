"""Readable text for tool results: what an agent host shows the model next to `structuredContent`.

The structured result is the full record (its schema is the tool's output schema); the text is
written to be read: the answer, then the sources with the exact call or resource that opens each,
then usage and any truncation note naming the next call. Nothing here decides what a caller may
see: it renders results the engines already filtered.
"""

from __future__ import annotations

import json

from canopy.model import metadata_line
from canopy.server.results import (
    Citation,
    ClaimCard,
    CommunityCard,
    DrillResult,
    SearchResult,
    SourceSpan,
    UsageInfo,
)
from canopy.server.status import IndexStatus, concurrency_line

__all__ = ["citation_line", "claim_period_text", "claim_quote_text", "drill_text", "search_text",
           "span_text", "status_text"]

MAX_CITATIONS = 25  # listed in the text; the structured result carries all of them
CONTEXT_CHARS = 6000  # extractive answers come with this much of their context
SPAN_CHARS = 1500  # per source span inside a drill_down text
QUOTE_CHARS = 400  # of a claim's quote as text (structured cards carry it whole)


def _trim(text: str, limit: int, where: str) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n… (trimmed; the full text is in {where})"


def _usage(u: UsageInfo) -> str:
    parts = [f"{u.llm_calls} LLM call{'s' if u.llm_calls != 1 else ''}"]
    if u.prompt_tokens or u.completion_tokens:
        parts.append(f"{u.prompt_tokens} prompt + {u.completion_tokens} completion tokens")
    parts.append(f"{u.elapsed_ms} ms")
    return f"Usage: {', '.join(parts)} (provider {u.provider})"


def _how_to_open(c: Citation) -> str:
    if c.kind == "report":
        return f"drill_down(community_id=\"{c.id}\") or canopy://reports/{c.id}"
    if c.kind == "text_unit":
        return f"canopy://units/{c.id}"
    if c.kind == "entity" and c.title:
        return f"drill_down(entity={json.dumps(c.title, ensure_ascii=False)})"
    return ""


def citation_line(c: Citation) -> str:
    label = c.title or c.id
    if c.document and c.document != label:
        label = f"{label} ({c.document})" if c.title else c.document
    line = f"- [{c.kind} {c.id}] {label}"
    how = _how_to_open(c)
    return f"{line} -> {how}" if how else line


def search_text(r: SearchResult) -> str:
    out = [r.answer.strip() or "(no answer: nothing relevant was found)"]
    if r.citations:
        out.append("\nSources:")
        out += [citation_line(c) for c in r.citations[:MAX_CITATIONS]]
        if len(r.citations) > MAX_CITATIONS:
            more = len(r.citations) - MAX_CITATIONS
            out.append(f"- … and {more} more in structuredContent.citations")
    if r.usage.provider == "builtin" and r.context.strip():
        # No LLM wrote the answer: give the calling agent the retrieved context to synthesize from.
        out.append("\nRetrieved context (extractive mode, no LLM configured):")
        out.append(_trim(r.context, CONTEXT_CHARS, "structuredContent.context"))
    level = ""
    if r.method == "global":
        level = ("; dynamic level selection" if r.community_level is None
                 else f"; community level {r.community_level}")
    out.append(f"\n{_usage(r.usage)}; method {r.method}{level}")
    if r.route is not None:
        out.append(f"Routed to {r.route.engine}_search ({r.route.how()}): {r.route.reason}")
    if r.coverage is not None:
        out.append(f"Coverage: {r.coverage.line()}")
    if r.truncated:
        out.append(f"Truncated: {r.note or 'the result was cut to fit the size limit.'}")
    return "\n".join(out)


def _card(c: CommunityCard) -> str:
    rating = f", rating {c.rating:g}" if c.rating is not None else ""
    return f"{c.id} (level {c.level}, {c.size} entities{rating}): {c.title}"


def span_text(s: SourceSpan, limit: int | None = None) -> str:
    head = f"[text_unit {s.text_unit_id}] {s.document}, characters {s.char_start}-{s.char_end}"
    if s.metadata:
        head += f" ({metadata_line(s.metadata.items())})"
    if s.dated:
        head += f", dated {s.dated}"
    body = s.text.strip() if limit is None else _trim(s.text, limit, f"canopy://units/{s.text_unit_id}")
    return f"{head}\n{body}"


def drill_text(r: DrillResult) -> str:
    out: list[str] = []
    entity = r.entity  # set by drill_down(entity=...)
    if entity is not None:
        out.append(f"Entity {entity.name} ({entity.type}, degree {entity.degree}) [{entity.id}]: "
                   f"{entity.description}\n")
        if r.aliases:
            out.append("Also named: " + "; ".join(
                f"{a.name} ({a.rule}; units: {', '.join(a.text_unit_ids[:5])})" for a in r.aliases)
                + "\n")
    if r.community is None:
        out.append("Top of the community hierarchy. "
                   "Pass one of these ids as drill_down(community_id=...):")
    else:
        out.append(f"Community {_card(r.community)}")
        if r.community.summary:
            out.append(r.community.summary.strip())
    if r.parents:
        out.append("\nParents (root first): " + " > ".join(f"{p.id} {p.title}" for p in r.parents))
    if r.findings:
        out.append("\nFindings "
                   "(pass the number as drill_down(community_id=..., finding=N) for sources):")
        for i, f in enumerate(r.findings):
            units = f" [units: {', '.join(f.text_unit_ids[:5])}]" if f.text_unit_ids else ""
            out.append(f"{i}. {f.summary}: {f.explanation}{units}")
    if r.sources:
        out.append("\nSource text:")
        out += [span_text(s, SPAN_CHARS) for s in r.sources]
    if r.children:
        if r.community is not None:
            out.append("\nSub-communities:")
        out += [f"- {_card(c)}" for c in r.children]
    if r.entities:
        out.append("\nEntities:")
        out += [f"- {e.name} ({e.type}, degree {e.degree}) [{e.id}]: {e.description}"
                for e in r.entities]
    if r.relationships:
        out.append("\nRelationships:")
        out += [f"- {x.source} — {x.target} (weight {x.weight:g}) [{x.id}]: {x.description}"
                for x in r.relationships]
    if r.claims:
        out.append("\nClaims:")
        out += [_claim(c) for c in r.claims]
    if r.usage.llm_calls:
        out.append(f"\n{_usage(r.usage)}")
    if r.truncated:
        out.append(f"\nTruncated: {r.note or 'raise limit to see more.'}")
    return "\n".join(out).strip()


def claim_period_text(start: str, end: str) -> str:
    """"2024-05-14", "2024-05-01 to 2024-05-31", "from 2024-05", "until 2024-05", or ""."""
    if start and end:
        return start if start == end else f"{start} to {end}"
    return f"from {start}" if start else (f"until {end}" if end else "")


def claim_quote_text(quote: str, description: str) -> str:
    """The quote as a line to show under the description: "" when there is none or it is the
    description word for word (the builtin extractor's), cut at a word after QUOTE_CHARS."""
    if not quote or quote == " ".join(description.split()):
        return ""
    if len(quote) > QUOTE_CHARS:
        quote = quote[:QUOTE_CHARS].rsplit(" ", 1)[0] + " …"
    return f'Quote: "{quote}"'


def _claim(c: ClaimCard) -> str:
    who = f"{c.subject} → {c.object}" if c.object else c.subject
    when = claim_period_text(c.start_date, c.end_date)
    line = (f"- {who}: {c.type} ({c.status}{', ' + when if when else ''}) [{c.id}, "
            f"unit {c.text_unit_id}]: {c.description}")
    quote = claim_quote_text(c.quote, c.description)
    return f"{line}\n  {quote}" if quote else line


def status_text(s: IndexStatus) -> str:
    provider = ("builtin (offline, no LLM endpoint configured)" if s.provider == "builtin"
                else s.provider)
    out = [
        f"Index generation {s.generation}; provider {provider}; embeddings {s.embedder}",
        f"documents {s.documents}, text units {s.text_units}",
        f"entities {s.entities}, relationships {s.relationships}, claims {s.claims}",
        f"communities {s.communities} by level {s.communities_by_level}, reports {s.reports}",
    ]
    if s.llm_concurrency is not None:
        out.append(concurrency_line(s.llm_concurrency))
    out += [f"skipped {k.path}: {k.reason}" for k in s.skipped]
    out += [f"failed {f.task} {f.id}: {f.error}" for f in s.failures]
    return "\n".join(out)
