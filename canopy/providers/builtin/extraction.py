"""The builtin provider's extraction (Edge et al. 2024 §2.1.2, with heuristics for a model).

Entities are name-like phrases, acronyms and (for Chinese) jieba's proper nouns
(canopy.providers.builtin.mentions), plus the name a level-one heading gives its section
("# Marlowe Quarry"): the section is about that entity, so each of its sentences mentions it.
Relationships are co-occurrences within a sentence, with that sentence as evidence; claims are
sentences with accusation/recall/violation cues. No model, deterministic: ties are broken by
position.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from canopy.claims import claim_period, verified_quote
from canopy.ids import normalize_name
from canopy.model import ClaimInstance, EntityInstance, Extraction, RelationshipInstance, TextUnit
from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.mentions import (
    TYPES,
    claim_type,
    find_mentions,
    heading_name,
    headings,
    type_scores,
)
from canopy.providers.builtin.text import split_sentences, trim

__all__ = ["DEFAULT_ENTITY_TYPES", "choose_type", "extract_unit"]

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
_ACRONYM_LAST = re.compile(r"^\S*[a-z]\S*\s+(?![IVXLCDM]+$)[A-Z][A-Z0-9&]+$")
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
    speaker: bool = True  # every mention was a transcript's speaker label
    heading: bool = False  # a level-one heading names it: kept whatever its mentions look like

    @property
    def name(self) -> str:
        return self.surfaces.most_common(1)[0][0]  # ties: first seen


def _keep(key: str, seen: _Seen, lower_words: set[str]) -> bool:
    """Drop words capitalized only by position and Title Case runs of ordinary words."""
    if seen.heading:
        return True
    toks = key.split()
    if not seen.noninitial and (seen.cue < 3 or key in lower_words):
        return False
    if seen.acronym and seen.cue < 3 and key in lower_words:
        return False  # a shouted ordinary word ("COLOUR"), not an acronym
    if seen.speaker and any(t in lower_words for t in toks):
        return False  # a shouted heading ("LAST WEEK:"), not a speaker
    ordinary = all(t in lower_words or t in lx.STOPWORDS for t in toks)
    return not (len(toks) > 1 and seen.cue < 3 and ordinary)


def _looks_personal(key: str, seen: _Seen, lower_words: set[str]) -> bool:
    """Two capitalized words with no cue at all, none of them an ordinary word or a place, the
    second not an acronym: most likely a person ("Taylor Swift", "DJ Moore"), not an
    organization ("Getty Images", "Mistral AI": a surname is not written in capitals after a
    mixed-case word; a roman numeral is, "Henry VIII")."""
    toks = key.split()
    return (seen.cue < 1 and len(toks) == 2 and not toks[-1].endswith("s")
            and not any(t in lower_words or t in lx.GAZETTEER or t in lx.NOT_PERSONAL
                        or not t.isalpha() for t in toks)
            and not _ACRONYM_LAST.search(seen.name))


def _propagate(kept: dict[str, _Seen]) -> None:
    """A lone "Okafor" or "Kestrel" takes the type of "Maria Okafor" / "Project Kestrel"."""
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


def _heading_name(heading: str, lower_words: set[str]) -> str | None:
    """heading_name, unless every word of it is written in lower case in the text too: a
    section's topic ("# Introduction", "# Water Quality"), not a name."""
    name = heading_name(heading)
    if name is None:
        return None
    words = [w.lower() for w in _LOWER_WORD.findall(name.lower())]
    return None if all(w in lower_words or w in lx.STOPWORDS for w in words) else name


def extract_unit(unit: TextUnit, *, entity_types: Sequence[str] = DEFAULT_ENTITY_TYPES,
                 claims: bool = False) -> Extraction:
    """Entities, co-occurrence relationships and (optionally) claims of one text unit."""
    sentences = split_sentences(unit.text)
    lower_words = set(_LOWER_WORD.findall(unit.text))
    seen: dict[str, _Seen] = {}
    per_sentence: list[list[str]] = []  # keys mentioned in each sentence
    under: list[str | None] = []  # key of the heading each sentence is under
    named = {normalize_name(h): _heading_name(h, lower_words) for h in headings(unit.text)}
    current: str | None = None
    for si, sentence in enumerate(sentences):
        keys: list[str] = []
        norm = normalize_name(sentence)
        if norm in named:  # a level-one heading: its name (if it is one) holds until the next
            name = named[norm]
            current = normalize_name(name) if name else None
            if name and current:
                s = seen.get(current)
                if s is None:
                    s = seen[current] = _Seen(scores=type_scores(name.split()))
                s.heading = True
                s.surfaces[name] += 1
        if current is not None:
            s = seen[current]
            if not s.sentences or s.sentences[-1] != si:
                s.sentences.append(si)
        under.append(current)
        for m in find_mentions(sentence, lower_words):
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
            s.speaker = s.speaker and m.speaker
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
        head = under[si]
        ks = [k for k in ([head] if head else []) + [k for k in keys if k != head] if k in kept]
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
                start, end = claim_period(sentences[si])  # only an unambiguous full date
                found.append(ClaimInstance(subject=subject, object=obj, type=kind,
                                           status="SUSPECTED",
                                           description=trim(sentences[si], DESCRIPTION_CHARS),
                                           start_date=start, end_date=end,
                                           quote=verified_quote(sentences[si], unit.text)))
    return Extraction(unit_id=unit.id, entities=entities, relationships=relationships,
                      claims=tuple(found), passes=1)
