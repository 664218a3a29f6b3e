"""Merge per-unit extractions into one entity/relationship graph (design §3.4).

Instances of an entity merge by normalized name (case, whitespace, punctuation, NFKC). Order never
depends on processing order: instances are sorted by text-unit id, so an incremental update and a
from-scratch build of the same corpus produce identical rows. An element with several distinct
descriptions gets one summary from the provider (cached by its full request on the LLM path).
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from canopy.errors import InvalidOutput
from canopy.ids import content_hash, entity_id, normalize_name, relationship_id
from canopy.model import Claim, Entity, Extraction, Relationship
from canopy.providers.base import Provider
from canopy.tokens import Tokenizer

__all__ = ["MergedGraph", "merge_extractions", "most_frequent", "summarize_descriptions", "summary_input",
           "summary_key"]

_MAX_SUMMARY_INPUT_TOKENS = 4000


@dataclass
class MergedGraph:
    entities: dict[str, Entity] = field(default_factory=dict)
    relationships: dict[str, Relationship] = field(default_factory=dict)
    claims: dict[str, Claim] = field(default_factory=dict)
    # element id -> distinct descriptions (in unit-id order) awaiting a summary
    pending: dict[str, list[str]] = field(default_factory=dict)


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


def summary_key(provider_name: str, max_tokens: int, name: str, kept: list[str]) -> str:
    """Memo key of one summary; shared with per-caller views (acl.views), so a visible subset
    summarized once is never summarized again."""
    return "summary:" + content_hash(provider_name, str(max_tokens), name, *kept, length=32)


def merge_extractions(extractions: dict[str, Extraction], order: dict[str, str] | None = None) -> MergedGraph:
    """Entities, relationships and claims from the extractions of the live units.

    Instances are visited in `order` (unit id -> sort key; the pipeline passes the hash of the
    unit's text), which does not depend on document ids: a renamed document merges exactly as a
    freshly indexed one would."""
    names: dict[str, Counter[str]] = defaultdict(Counter)
    types: dict[str, Counter[str]] = defaultdict(Counter)
    ent_desc: dict[str, list[str]] = defaultdict(list)
    ent_units: dict[str, set[str]] = defaultdict(set)
    rel_desc: dict[str, list[str]] = defaultdict(list)
    rel_units: dict[str, set[str]] = defaultdict(set)
    rel_weight: dict[str, float] = defaultdict(float)
    rel_ends: dict[str, tuple[str, str]] = {}
    claims: dict[str, Claim] = {}

    key = order or {}
    for uid in sorted(extractions, key=lambda u: (key.get(u, ""), u)):
        ex = extractions[uid]
        for e in ex.entities:
            key = normalize_name(e.name)
            if not key:
                continue
            names[key][e.name.strip()] += 1
            types[key][e.type.strip().lower()] += 1
            if e.description.strip() and e.description.strip() not in ent_desc[key]:
                ent_desc[key].append(e.description.strip())
            ent_units[key].add(uid)
        for r in ex.relationships:
            s, t = normalize_name(r.source), normalize_name(r.target)
            if not s or not t or s == t or s not in names or t not in names:
                continue
            a, b = sorted((s, t))
            rid = relationship_id(a, b)
            rel_ends[rid] = (a, b)
            rel_weight[rid] += float(r.strength)
            if r.description.strip() and r.description.strip() not in rel_desc[rid]:
                rel_desc[rid].append(r.description.strip())
            rel_units[rid].add(uid)
        for c in ex.claims:
            subj = normalize_name(c.subject)
            if subj not in names:
                continue
            obj = normalize_name(c.object) if c.object else ""
            cid = "cl-" + content_hash(uid, subj, obj, c.type, c.description)
            claims[cid] = Claim(cid, entity_id(subj), entity_id(obj) if obj in names else "",
                                c.type, c.status, c.description, (uid,))

    g = MergedGraph()
    degree: Counter[str] = Counter()
    for rid, (a, b) in rel_ends.items():
        degree[a] += 1
        degree[b] += 1
    for key in names:
        eid = entity_id(key)
        descs = ent_desc[key]
        g.entities[eid] = Entity(eid, most_frequent(names[key]), most_frequent(types[key]), descs[0] if len(descs) == 1 else "",
                                 tuple(sorted(ent_units[key])), degree[key])
        if len(descs) > 1:
            g.pending[eid] = descs
    for rid, (a, b) in rel_ends.items():
        descs = rel_desc[rid]
        g.relationships[rid] = Relationship(rid, entity_id(a), entity_id(b), descs[0] if len(descs) == 1 else "",
                                            rel_weight[rid], tuple(sorted(rel_units[rid])))
        if len(descs) > 1:
            g.pending[rid] = descs
    g.claims = claims
    return g


class SummaryMemo(Protocol):
    def cache_get(self, key: str) -> str | None: ...
    def cache_put(self, key: str, response: str) -> None: ...


async def summarize_descriptions(
    g: MergedGraph,
    provider: Provider,
    tok: Tokenizer,
    *,
    max_tokens: int,
    memo: SummaryMemo | None = None,
    concurrency: int = 16,
    on_done: Callable[[], None] | None = None,
) -> MergedGraph:
    """Fill in the description of every element that has several: one provider call each,
    unless this exact (provider, name, descriptions) was summarized before (`memo`): an element
    whose instance set did not change is never re-summarized."""
    sem = asyncio.Semaphore(concurrency)

    async def one(element_id: str, descs: list[str]) -> tuple[str, str]:
        if element_id in g.entities:
            name = g.entities[element_id].name
        else:
            r = g.relationships[element_id]
            name = f"{g.entities[r.source].name} -- {g.entities[r.target].name}"
        kept = summary_input(descs, tok)
        key = summary_key(provider.name, max_tokens, name, kept)
        text = memo.cache_get(key) if memo else None
        if text is None:
            try:
                async with sem:
                    text = await provider.summarize(name, kept, max_tokens=max_tokens)
            except InvalidOutput:
                text = ""  # fall back to the joined descriptions below; never fail the index
            if memo and text:
                memo.cache_put(key, text)
        if on_done:
            on_done()
        return element_id, text.strip() or " ".join(kept)

    results = await asyncio.gather(*(one(k, v) for k, v in sorted(g.pending.items())))
    for element_id, text in results:
        if element_id in g.entities:
            g.entities[element_id] = replace(g.entities[element_id], description=text)
        else:
            g.relationships[element_id] = replace(g.relationships[element_id], description=text)
    g.pending = {}
    return g
