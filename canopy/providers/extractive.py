"""Offline indexing tasks for the builtin provider: extraction, summaries, community reports.

- `extract_unit`: entities are name-like phrases, acronyms and (for Chinese) jieba's proper
  nouns; relationships are co-occurrences within a sentence, with that sentence as evidence;
  claims are sentences with accusation/recall/violation cues.
- `summarize_descriptions`: an extractive summary of several descriptions, most central
  sentences first chosen, original order kept, within a token budget.
- `extractive_report`: a community report assembled from its context's own sentences.
No model, deterministic: ties are broken by position.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from canopy.ids import normalize_name
from canopy.model import ClaimInstance, EntityInstance, Extraction, RelationshipInstance, TextUnit
from canopy.providers import lexicon as lx
from canopy.providers.base import FindingOut, ReportContext, ReportOut
from canopy.providers.heuristics import TYPES, claim_type, find_mentions, split_sentences, trim
from canopy.providers.lexical import terms
from canopy.tokens import Tokenizer

__all__ = [
    "DEFAULT_ENTITY_TYPES",
    "REPORT_INTRO",
    "choose_type",
    "extract_unit",
    "extractive_report",
    "summarize_descriptions",
]

DEFAULT_ENTITY_TYPES = TYPES  # organization, person, geo, event
DESCRIPTION_CHARS = 300
PAIR_WINDOW = 4  # a sentence links each entity to the next few only (lists stay sparse)
_SYNONYMS = {
    "organization": ("organization", "organisation", "org", "company", "institution", "group",
                     "组织", "机构", "公司"),
    "person": ("person", "people", "character", "individual", "human", "人物", "人"),
    "geo": ("geo", "location", "place", "gpe", "country", "city", "region", "地点", "地理", "地名"),
    "event": ("event", "incident", "occurrence", "事件"),
}
_LOWER_WORD = re.compile(r"\b[a-zà-öø-ÿ][a-zà-öø-ÿ'’-]*")


def choose_type(scores: dict[str, float], entity_types: Sequence[str]) -> str:
    """The best-scoring type that `entity_types` allows (by name or synonym), else the first."""
    allowed = {t.lower(): t for t in entity_types}
    for t in sorted(TYPES, key=lambda t: (-scores.get(t, 0.0), TYPES.index(t))):
        for syn in _SYNONYMS[t]:
            if syn in allowed:
                return allowed[syn]
    return entity_types[0] if entity_types else "organization"


@dataclass
class _Seen:
    """What one unit says about one name (by normalized key)."""

    surfaces: Counter[str] = field(default_factory=Counter)
    scores: dict[str, float] = field(default_factory=lambda: dict.fromkeys(TYPES, 0.0))
    sentences: list[int] = field(default_factory=list)
    cue: float = 0.0
    noninitial: bool = False
    acronym: bool = True  # every mention was all capitals

    @property
    def name(self) -> str:
        return self.surfaces.most_common(1)[0][0]  # ties: first seen


def _keep(key: str, seen: _Seen, lower_words: set[str]) -> bool:
    """Drop words capitalized only by position and Title Case runs of ordinary words."""
    toks = key.split()
    if not seen.noninitial and (seen.cue < 3 or key in lower_words):
        return False
    if seen.acronym and seen.cue < 3 and key in lower_words:
        return False  # a shouted ordinary word ("COLOUR"), not an acronym
    ordinary = all(t in lower_words or t in lx.STOPWORDS for t in toks)
    return not (len(toks) > 1 and seen.cue < 3 and ordinary)


def _looks_personal(key: str, seen: _Seen, lower_words: set[str]) -> bool:
    """Two capitalized words with no cue at all, none of them an ordinary word or a
    place: most likely a person ("Taylor Swift"), not an organization ("Getty Images")."""
    toks = key.split()
    return (seen.cue < 1 and len(toks) == 2 and not toks[-1].endswith("s")
            and not any(t in lower_words or t in lx.GAZETTEER or t in lx.NOT_PERSONAL
                        or not t.isalpha() for t in toks))


def _propagate(kept: dict[str, _Seen]) -> None:
    """A lone "Scrooge" or "Kestrel" takes the type of "Ebenezer Scrooge" / "Project Kestrel"."""
    votes: dict[str, Counter[str]] = {}
    for key, seen in kept.items():
        toks = key.split()
        best = max(TYPES, key=lambda t: (seen.scores[t], -TYPES.index(t)))
        if len(toks) > 1 and seen.scores[best] >= 2:
            for tok in {toks[0], toks[-1]}:
                votes.setdefault(tok, Counter())[best] += 1
    for key, seen in kept.items():
        if " " not in key and key in votes:
            v = votes[key]
            best = max(TYPES, key=lambda t: (v[t], -TYPES.index(t)))
            seen.scores[best] += 2.5


def extract_unit(unit: TextUnit, *, entity_types: Sequence[str] = DEFAULT_ENTITY_TYPES,
                 claims: bool = False) -> Extraction:
    """Entities, co-occurrence relationships and (optionally) claims of one text unit."""
    sentences = split_sentences(unit.text)
    lower_words = set(_LOWER_WORD.findall(unit.text))
    seen: dict[str, _Seen] = {}
    per_sentence: list[list[str]] = []
    for si, sentence in enumerate(sentences):
        keys: list[str] = []
        for m in find_mentions(sentence):
            key = normalize_name(m.name)
            if not key:
                continue
            s = seen.get(key)
            if s is None:
                s = seen[key] = _Seen()
            s.surfaces[m.name] += 1
            for t, v in m.scores.items():
                s.scores[t] += v
            s.cue = max(s.cue, m.cue)
            s.noninitial = s.noninitial or not m.initial
            s.acronym = s.acronym and m.acronym
            if not s.sentences or s.sentences[-1] != si:
                s.sentences.append(si)
            if key not in keys:
                keys.append(key)
        per_sentence.append(keys)
    kept = {k: s for k, s in seen.items() if _keep(k, s, lower_words)}
    for k, s in kept.items():
        if _looks_personal(k, s, lower_words):
            s.scores["person"] += 1
    _propagate(kept)
    types = list(entity_types) or list(DEFAULT_ENTITY_TYPES)
    entities = tuple(
        EntityInstance(
            name=s.name,
            type=choose_type(s.scores, types),
            description=trim(" ".join(sentences[i] for i in s.sentences[:2]), DESCRIPTION_CHARS),
        )
        for s in kept.values()
    )
    pairs: dict[tuple[str, str], list[int]] = {}
    for si, keys in enumerate(per_sentence):
        ks = [k for k in keys if k in kept]
        for i, a in enumerate(ks):
            for b in ks[i + 1 : i + 1 + PAIR_WINDOW]:
                pk = (b, a) if (b, a) in pairs else (a, b)
                pairs.setdefault(pk, []).append(si)
    relationships = tuple(
        RelationshipInstance(
            source=kept[a].name,
            target=kept[b].name,
            description=trim(" ".join(sentences[i] for i in sis[:2]), DESCRIPTION_CHARS),
            strength=float(min(10, len(sis))),
        )
        for (a, b), sis in pairs.items()
    )
    found: list[ClaimInstance] = []
    if claims:
        done: set[tuple[str, str, str]] = set()
        for si, keys in enumerate(per_sentence):
            ks = [k for k in keys if k in kept]
            kind = claim_type(sentences[si]) if ks else None
            if kind is None:
                continue
            subject, obj = kept[ks[0]].name, kept[ks[1]].name if len(ks) > 1 else ""
            if (subject, obj, kind) not in done:
                done.add((subject, obj, kind))
                found.append(ClaimInstance(subject=subject, object=obj, type=kind,
                                           status="SUSPECTED",
                                           description=trim(sentences[si], DESCRIPTION_CHARS)))
    return Extraction(unit_id=unit.id, entities=entities, relationships=relationships,
                      claims=tuple(found), passes=1)


_NORM = re.compile(r"\W+")


def summarize_descriptions(descriptions: Sequence[str], max_tokens: int,
                           tokenizer: Tokenizer) -> str:
    """Extractive summary: distinct sentences ranked by centrality (how many other descriptions
    share each of their terms), chosen greedily within `max_tokens`, original order kept."""
    if max_tokens <= 0:
        return ""
    sents: list[tuple[int, str, set[str]]] = []
    seen: set[str] = set()
    for di, d in enumerate(descriptions):
        for s in split_sentences(d):
            key = _NORM.sub(" ", s.casefold()).strip()
            if key and key not in seen:
                seen.add(key)
                sents.append((di, s, set(terms(s))))
    if not sents:
        return ""
    per_description: dict[int, set[str]] = {}
    for di, _, t in sents:
        per_description.setdefault(di, set()).update(t)
    df = Counter(t for ts in per_description.values() for t in ts)
    scores = []
    for i, (di, _, ti) in enumerate(sents):
        central = sum(df[t] - 1 for t in ti) / math.sqrt(len(ti)) if ti else 0.0
        lead = 0.1 if i == 0 or sents[i - 1][0] != di else 0.0
        scores.append(central + lead)
    chosen: list[int] = []
    used = 0
    for i in sorted(range(len(sents)), key=lambda i: (-scores[i], i)):
        cost = tokenizer.count(sents[i][1]) + 1
        if used + cost <= max_tokens:
            chosen.append(i)
            used += cost
    if not chosen:
        best = sents[min(range(len(sents)), key=lambda i: (-scores[i], i))][1]
        cut = tokenizer.truncate(best, max_tokens)
        return cut[: cut.rfind(" ")] if " " in cut else cut.replace("\ufffd", "")
    chosen.sort()
    out = " ".join(sents[i][1] for i in chosen)
    while tokenizer.count(out) > max_tokens and len(chosen) > 1:
        chosen.remove(min(chosen, key=lambda i: (scores[i], -i)))
        out = " ".join(sents[i][1] for i in chosen)
    return out


# ---- community reports (Edge et al. 2024 §2.1.5, extractive) ---------------------------------

REPORT_INTRO = "The community around "
MAX_FINDINGS = 8
EXPLANATION_CHARS = 500


def _join_names(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _first_sentence(text: str) -> str:
    """The first sentence of `text` that is not a builtin report's own introduction."""
    return next((s for s in split_sentences(text) if not s.startswith(REPORT_INTRO)), "")


def extractive_report(ctx: ReportContext, max_tokens: int, tokenizer: Tokenizer) -> ReportOut:
    """A community report assembled from its context: title from the best-connected entities,
    summary from sub-report summaries and top entity descriptions, findings one per heavy
    relationship, top entity, sub-report or claim (ids index into `ctx`), all within
    `max_tokens`. The rating only measures size: nothing here judges impact."""
    count = tokenizer.count
    ents, rels, subs = ctx.entities, ctx.relationships, ctx.sub_reports
    degree = [ctx.degrees.get(e.id, e.degree) for e in ents]
    by_degree = sorted(range(len(ents)), key=lambda i: (-degree[i], i))
    index = {e.id: i for i, e in enumerate(ents)}
    names = {e.id: e.name for e in ents}
    if ents:
        title = _join_names([ents[i].name for i in by_degree[:3]])
        intro = f"{REPORT_INTRO}{title} has {len(ents)} entities and {len(rels)} relationships"
        intro += f" and draws on {len(subs)} sub-community reports." if subs else "."
    elif subs:
        title = "; ".join(r.title for r in subs[:2])
        title += f" (+{len(subs) - 2} more)" if len(subs) > 2 else ""
        intro = f"{REPORT_INTRO}{title} combines {len(subs)} sub-communities."
    else:
        title = f"Community {ctx.community_id}"
        intro = f"{title} has no entities."
    sentences = [intro] + [_first_sentence(r.summary) for r in subs[:2]]
    sentences += [_first_sentence(ents[i].description) for i in by_degree[: 4 - len(sentences)]]
    summary = " ".join(dict.fromkeys(s for s in sentences if s))

    total_degree = sum(degree)
    size = len(ents) + total_degree / 2 + sum(r.rating for r in subs)
    rating = round(min(10.0, 1.5 * math.log2(1 + size)), 1)
    parts = f"{len(ents)} entities, {len(rels)} relationships, total degree {total_degree}"
    parts += f", {len(subs)} sub-reports" if subs else ""
    explanation = (f"Heuristic rating from community size ({parts}); "
                   "the builtin provider does not assess impact.")

    def endpoint_degree(j: int) -> int:
        return sum(degree[index[x]] for x in (rels[j].source, rels[j].target) if x in index)

    def text(value: str, fallback: str) -> str:
        return trim(value, EXPLANATION_CHARS) or fallback

    rel_f = []
    heaviest = sorted(range(len(rels)), key=lambda j: (-rels[j].weight, -endpoint_degree(j), j))
    for j in heaviest[:MAX_FINDINGS]:
        r = rels[j]
        a, b = names.get(r.source, r.source), names.get(r.target, r.target)
        rel_f.append(FindingOut(
            summary=f"{a} — {b}", explanation=text(r.description, f"{a} relates to {b}."),
            entity_ids=[index[x] for x in (r.source, r.target) if x in index],
            relationship_ids=[j]))
    ent_f = [FindingOut(summary=ents[i].name, entity_ids=[i],
                        explanation=text(ents[i].description, f"{ents[i].name} ({ents[i].type})."))
             for i in by_degree[:MAX_FINDINGS]]
    sub_f = [FindingOut(summary=r.title, explanation=text(r.summary, r.title), report_ids=[k])
             for k, r in enumerate(subs[:3])]
    claim_f = [FindingOut(summary=f"{names.get(c.subject, c.subject)} — {c.type} ({c.status})",
                          explanation=trim(c.description, EXPLANATION_CHARS),
                          entity_ids=[index[c.subject]] if c.subject in index else [])
               for c in ctx.claims[:2]]
    candidates = sub_f + rel_f[:3] + ent_f[:3] + claim_f[:1] + rel_f[3:] + ent_f[3:] + claim_f[1:]

    used = count(title) + count(summary) + count(explanation) + 16
    if used > max_tokens:
        summary = tokenizer.truncate(summary, max(0, max_tokens - (used - count(summary))))
        used = max_tokens
    findings: list[FindingOut] = []
    for f in candidates:
        cost = count(f.summary) + count(f.explanation) + 12
        if len(findings) < MAX_FINDINGS and used + cost <= max_tokens:
            findings.append(f)
            used += cost
    return ReportOut(title=title, summary=summary, rating=rating, rating_explanation=explanation,
                     findings=findings)
