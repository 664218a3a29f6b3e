"""`LLMProvider`: the Provider tasks as prompts (from `prompts/`, or the user's `[prompts] dir`:
the client's `PromptSet`) sent through one `ChatClient`.

Extraction follows Edge et al. 2024 §2.1.2: one extraction pass, then up to `max_gleanings`
gleaning passes that ask for what the earlier passes missed. Gleaning is adaptive: it stops as
soon as a pass adds no new entity (by normalized name) and no new relationship. Output is checked
against the request: relationships and claims must refer to extracted entities, and entity types
must be among the allowed ones; a claim's dates are normalised to ISO 8601 and its quote is kept
only when it occurs in the unit (canopy.claims).
"""

from __future__ import annotations

import dataclasses
import difflib
import json

from canopy.aliases import alias_candidates
from canopy.claims import checked_claim, claim_key
from canopy.errors import InvalidOutput
from canopy.ids import normalize_name
from canopy.limiter import LimiterStats
from canopy.llm import ChatClient
from canopy.model import (
    ClaimInstance,
    EntityInstance,
    Extraction,
    RelationshipInstance,
    Report,
    TextUnit,
)
from canopy.providers.base import (
    AliasesOut,
    ContextBlock,
    DriftOut,
    ExtractionOut,
    MapOut,
    MapPoint,
    RatingsOut,
    ReportContext,
    ReportOut,
    RouteOut,
    Usage,
    render_blocks,
)
from canopy.providers.report_prompt import report_prompt, within_context
from canopy.tokenizer import Tokenizer, get_tokenizer

__all__ = ["LLMProvider"]

CLAIMS_ON = "Extract claims as described below."
CLAIMS_OFF = 'Skip this step: do not extract claims, and reply with an empty "claims" list.'
NO_DATA_ANSWER = "The indexed documents do not contain information that answers this question."


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _listed(out: ExtractionOut) -> str:
    """A pass's answer as the next gleaning turn quotes it: its items by name, descriptions left
    out. What is missing is decided by names and pairs; resending the descriptions made the
    gleaning prompt about ten times the extraction prompt (a unit's answer is several times its
    text), the largest part of a build's prompt tokens."""
    return json.dumps({
        "entities": [{"name": e.name, "type": e.type} for e in out.entities],
        "relationships": [{"source": r.source, "target": r.target} for r in out.relationships],
        "claims": [{"subject": c.subject, "object": c.object, "type": c.type}
                   for c in out.claims],
    }, ensure_ascii=False)


def joined_fits(descriptions: list[str], tok: Tokenizer, max_tokens: int) -> bool:
    """Whether an element's distinct descriptions, joined, already fit its summary's budget.
    Then they are its description as they stand: a call would only rephrase them, and such
    calls were two thirds of a build's requests (100 MultiHop-RAG articles, the fake). The
    builtin provider's extractive summary keeps such input whole too (its distinct sentences);
    the build's projection counts the same (canopy.indexer.forecast)."""
    return tok.count(" ".join(descriptions)) <= max_tokens


def _words(max_tokens: int) -> int:
    return max(20, int(max_tokens * 0.75))


class LLMProvider:
    """The Provider protocol backed by an OpenAI-compatible chat endpoint."""

    def __init__(self, client: ChatClient, tokenizer: Tokenizer | None = None) -> None:
        self.client = client
        self._tok = tokenizer or get_tokenizer()
        self.prompts = client.prompts
        self.name = f"openai:{client.model}"

    def usage(self) -> dict[str, Usage]:
        return self.client.usage()

    def concurrency(self) -> LimiterStats:
        return self.client.concurrency()

    # ---- indexing ------------------------------------------------------------------------------

    async def extract(
        self, unit: TextUnit, *, entity_types: list[str], claims: bool, max_gleanings: int
    ) -> Extraction:
        types = ", ".join(entity_types)
        prompt = self.prompts.render(
            "extract",
            entity_types=types,
            claims_switch=CLAIMS_ON if claims else CLAIMS_OFF,
            text=unit.text,
        )
        messages = _user(prompt)
        out = await self.client.json("extract", messages, ExtractionOut)
        acc = _Accumulator(entity_types, claims, unit.text)
        acc.add(out)
        passes = 1
        for _ in range(max_gleanings):
            messages = [
                *messages,
                {"role": "assistant", "content": _listed(out)},
                *_user(self.prompts.render("glean", entity_types=types)),
            ]
            out = await self.client.json("glean", messages, ExtractionOut)
            passes += 1
            if not acc.add(out):
                break
        return await self._confirm_links(unit, acc.result(unit.id, passes))

    async def _confirm_links(self, unit: TextUnit, ex: Extraction) -> Extraction:
        """`ex` with the pairs of its names the resolution rules leave open (canopy.aliases)
        confirmed or not from the unit's text: all of a unit's pairs in one request (cached like
        every request). Unusable output confirms nothing; the extraction stands."""
        pairs = alias_candidates((e.name, e.type) for e in ex.entities)
        if not pairs:
            return ex
        listing = "\n".join(f"{i}. {a} | {b}" for i, (a, b) in enumerate(pairs, 1))
        prompt = self.prompts.render("resolve", pairs=listing, text=unit.text)
        try:
            out = await self.client.json("resolve", _user(prompt), AliasesOut)
        except InvalidOutput:
            return ex
        same = {a.id for a in out.pairs if a.same}
        return dataclasses.replace(
            ex, links=tuple(p for i, p in enumerate(pairs, 1) if i in same))

    async def summarize(self, name: str, descriptions: list[str], *, max_tokens: int) -> str:
        distinct = list(dict.fromkeys(d.strip() for d in descriptions if d.strip()))
        if len(distinct) <= 1:
            return distinct[0] if distinct else ""
        if joined_fits(distinct, self._tok, max_tokens):
            return " ".join(distinct)
        listing = "\n".join(f"- {d}" for d in distinct)
        prompt = self.prompts.render("summarize", name=name, descriptions=listing,
                                     max_words=_words(max_tokens))
        text = await self.client.text("summarize", _user(prompt), max_tokens=max_tokens)
        return text.strip() or " ".join(distinct)

    async def report(self, context: ReportContext, *, max_tokens: int) -> ReportOut:
        prompt = report_prompt(self.prompts, context, max_words=_words(max_tokens))
        out = await self.client.json("report", _user(prompt), ReportOut)
        return within_context(out, context)

    # ---- querying ------------------------------------------------------------------------------

    async def rate(self, query: str, reports: list[Report]) -> list[int]:
        listing = "\n\n".join(f"[Report {r.community_id}] {r.digest()}" for r in reports)
        prompt = self.prompts.render("rate", query=query, reports=listing)
        out = await self.client.json("rate", _user(prompt), RatingsOut)
        scores = {s.id.strip(): s.score for s in out.scores}
        # A report the model left out is rated 0: it is not read, and the coverage says so.
        return [scores.get(r.community_id, 0) for r in reports]

    async def map(self, query: str, reports: list[Report], *, response_type: str) -> MapOut:
        listing = "\n\n".join(f"[Report {r.community_id}] {r.full_text()}" for r in reports)
        prompt = self.prompts.render("map", query=query, reports=listing,
                                     response_type=response_type)
        out = await self.client.json("map", _user(prompt), MapOut)
        known = {r.community_id for r in reports}
        points = [
            p.model_copy(update={"report_ids": [i for i in p.report_ids if i in known]})
            for p in out.points
        ]
        return MapOut(points=points)

    async def reduce(self, query: str, points: list[MapPoint], *, response_type: str) -> str:
        ranked = sorted((p for p in points if p.score > 0), key=lambda p: -p.score)
        if not ranked:
            return NO_DATA_ANSWER
        listing = "\n\n".join(
            f"----- Analyst point {i} (importance {p.score}) -----\n{p.description}"
            for i, p in enumerate(ranked, 1)
        )
        prompt = self.prompts.render("reduce", query=query, points=listing,
                                     response_type=response_type)
        return (await self.client.text("reduce", _user(prompt))).strip()

    async def answer(self, query: str, blocks: list[ContextBlock], *, response_type: str) -> str:
        prompt = self.prompts.render(
            "answer", query=query, context=render_blocks(blocks), response_type=response_type
        )
        return (await self.client.text("answer", _user(prompt))).strip()

    async def hyde(self, query: str) -> str:
        prompt = self.prompts.render("hyde", query=query)
        return (await self.client.text("hyde", _user(prompt))).strip()

    async def drift(self, query: str, blocks: list[ContextBlock]) -> DriftOut:
        prompt = self.prompts.render("drift", query=query, context=render_blocks(blocks))
        out = await self.client.json("drift", _user(prompt), DriftOut)
        follow_ups = list(dict.fromkeys(q.strip() for q in out.follow_up_queries if q.strip()))
        return out.model_copy(update={"follow_up_queries": follow_ups})

    async def route(self, query: str, names: list[str]) -> RouteOut:
        listing = "\n".join(f"- {n}" for n in names) or "(none)"
        prompt = self.prompts.render("route", query=query, names=listing)
        return await self.client.json("route", _user(prompt), RouteOut)


class _Accumulator:
    """Items of all passes over one unit, deduplicated by normalized name."""

    def __init__(self, entity_types: list[str], claims: bool, text: str) -> None:
        self.types = {t.casefold(): t for t in entity_types}
        self.claims_on = claims
        self.text = text  # what a claim's quote must occur in
        self.entities: dict[str, EntityInstance] = {}
        self.relationships: dict[tuple[str, str], RelationshipInstance] = {}
        self.claims: dict[tuple[str, str, str, str], ClaimInstance] = {}

    def _type(self, raw: str) -> str:
        key = raw.strip().casefold()
        if key in self.types:
            return self.types[key]
        close = difflib.get_close_matches(key, list(self.types), n=1, cutoff=0.6)
        return self.types[close[0]] if close else next(iter(self.types.values()))

    def add(self, out: ExtractionOut) -> bool:
        """Merge one pass; True when it added an entity or relationship not seen before."""
        before = (len(self.entities), len(self.relationships))
        for e in out.entities:
            key = normalize_name(e.name)
            if key and key not in self.entities:
                self.entities[key] = EntityInstance(
                    e.name.strip(), self._type(e.type), e.description.strip()
                )
        for r in out.relationships:
            a, b = normalize_name(r.source), normalize_name(r.target)
            pair = (min(a, b), max(a, b))
            if a and b and a != b and pair not in self.relationships:
                self.relationships[pair] = RelationshipInstance(
                    r.source.strip(), r.target.strip(), r.description.strip(), float(r.strength)
                )
        if self.claims_on:
            for c in out.claims:
                claim = checked_claim(c.subject, c.object, c.type, c.status, c.description,
                                      c.start_date, c.end_date, c.quote, self.text)
                self.claims.setdefault(claim_key(claim), claim)
        return (len(self.entities), len(self.relationships)) != before

    def result(self, unit_id: str, passes: int) -> Extraction:
        """Drop relationships and claims whose entities were not extracted; use entity spellings."""
        names = {key: e.name for key, e in self.entities.items()}
        rels = []
        for (a, b), r in self.relationships.items():
            if a in names and b in names:
                src, tgt = names[normalize_name(r.source)], names[normalize_name(r.target)]
                rels.append(RelationshipInstance(src, tgt, r.description, r.strength))
        claims = []
        for (subject, obj, _, _), c in self.claims.items():
            if subject in names and (not obj or obj in names):
                claims.append(dataclasses.replace(
                    c, subject=names[subject], object=names[obj] if obj else ""))
        return Extraction(
            unit_id, tuple(self.entities.values()), tuple(rels), tuple(claims), passes
        )
