"""Name-like mentions in a sentence, the entity types their words and context vote for, and
claim cues: the builtin extractor's heuristics. Pure functions, deterministic, no network; jieba
(for Chinese names) is loaded only for sentences that contain CJK characters.
"""

from __future__ import annotations

import re
from collections.abc import Container
from dataclasses import dataclass, field

from canopy.providers.builtin import lexicon as lx
from canopy.providers.builtin.text import has_cjk, initials_before_name, load_jieba

__all__ = ["TYPES", "Mention", "claim_type", "find_mentions", "heading_name", "headings",
           "type_scores"]

TYPES = ("organization", "person", "geo", "event")  # tie-break order

_UP = "A-ZÀ-ÖØ-Þ"
_AL = "A-Za-zÀ-ÖØ-öø-ÿ0-9"
_CAPW = f"[{_UP}][{_AL}]*(?:['’&.-][{_AL}]+)*"
_CONN = (r"(?:of the|of|de la|de|del|della|van der|van den|van de|van|von der|von|der|den|du|da"
         r"|di|dos|das|le|la|al|bin|ibn|&)")
_DOTTED = r"(?:Mr|Mrs|Ms|Mx|Dr|Prof|Rev|Capt|Col|Gen|Lt|Sgt|Hon|St)\.[ ]+"
# Initials with their dots before another capitalized word ("H.P. Lovecraft", "George A.
# Romero", "U.S. President"): in the run, and `_groups` decides whether they stay in the name.
_INIT = f"(?:[{_UP}]\\.){{1,3}}(?=[ ]+[{_UP}])"
_WORD = f"(?:{_INIT}|{_CAPW})"
_NAME = re.compile(f"(?<![{_AL}'’&.-])(?:{_DOTTED})?{_WORD}(?:[ ]+(?:{_CONN}[ ]+)?{_WORD})*")
_INITIALS = re.compile(f"(?:[{_UP}]\\.)+")
MAX_AFTER_INITIALS = 2  # words after initials that open a name: "H.P. Lovecraft", "W.E.B. Du Bois"
_ACRONYM = re.compile(r"[A-Z][A-Z0-9&]{1,5}")
_ROMAN = re.compile(r"[IVXLCDM]+")
_SHOUT = re.compile(r"\b[A-Z]{2,}\b")
_TOKEN = re.compile(r"\S+")
_BRANDISH = re.compile(  # "YouTube", "USB-C"; not "McDonald", "DeSantis"
    r"^(?!Mc|Mac|O'|O’|D'|D’|De|Di|La|Le|Van)[A-Za-z]+[A-Z]|^[A-Z0-9]+-[A-Z0-9]+$")
_ALLCAPS = re.compile(r"[A-Z0-9&-]+")
_WORDISH = re.compile(r"\b[A-Za-z]{2,}\b")
_PREV = re.compile(r"([A-Za-z]+)\W*$")
_NEXT = re.compile(r"^\W*([A-Za-z]+)")
_NEVER_ALONE = (lx.STOPWORDS | lx.SENTENCE_STARTERS | lx.MONTHS_DAYS | lx.HONORIFICS
                | lx.NON_NAMES)
_INITIAL_AFTER = tuple("\"“‘'([{—–-:;")
_APPOSED = re.compile(r",[ ]+([A-Z][A-Za-z.'’-]*(?:[ ]+[A-Z][A-Za-z.'’-]*){0,2})")
_APPOSED_ORG = re.compile(r",[ ]+(?:a|an|the)[ ]+((?:[a-z-]+[ ]*){1,4})")
_SPEAKER = re.compile(r"([A-Z][A-Z'’.-]+(?:[ ][A-Z][A-Z'’.-]+){1,3}):[ ]")
_NOT_SPEAKER = (_NEVER_ALONE | lx.NOT_ALONE | lx.ORG_SUFFIXES | lx.ORG_NOUNS | lx.GEO_SUFFIXES
                | lx.EVENT_WORDS | lx.CONNECTORS)


@dataclass
class Mention:
    """One name-like phrase in a sentence, with the type votes it casts."""

    name: str
    start: int
    scores: dict[str, float] = field(default_factory=dict)
    cue: float = 0.0  # strongest intrinsic cue (gazetteer, suffix, honorific, first name...)
    initial: bool = False  # one word, capitalized perhaps only because it opens the sentence
    acronym: bool = False
    speaker: bool = False  # a transcript's speaker label ("KEVIN SCOTT: ...")


def type_scores(tokens: list[str], *, acronym: bool = False) -> dict[str, float]:
    """Votes per entity type from the words of a name alone."""
    low = [t.lower().rstrip(".") for t in tokens]
    phrase = " ".join(low)
    s = dict.fromkeys(TYPES, 0.0)
    multi = len(low) > 1
    if phrase in lx.GAZETTEER:
        s["geo"] += 6
    if phrase in lx.KNOWN_ORGS:
        s["organization"] += 6
    if multi and low[-1] in lx.ORG_SUFFIXES:
        s["organization"] += 5
    if multi and low[0] in lx.ORG_PREFIXES:
        s["organization"] += 3
    if multi and low[-1] in lx.EVENT_WORDS:
        s["event"] += 5
    if low[0].split("-")[0] in lx.HOLIDAYS or low[-1] in lx.HOLIDAYS:
        s["event"] += 3
    if multi and low[-1] in lx.GEO_SUFFIXES:
        s["geo"] += 5
    if multi and low[0] in lx.GEO_PREFIXES:
        s["geo"] += 4
    if multi and low[0] in lx.COMPASS and " ".join(low[1:]) in lx.GAZETTEER:
        s["geo"] += 5  # "Western Europe": a region of a known place
    if multi and low[0] in lx.HONORIFICS:
        s["person"] += 6 if low[0] in lx.PERSON_DOTTED else 3
    if low[0] in lx.FIRST_NAMES:
        s["person"] += 4 if multi else 3
    elif any(t in lx.FIRST_NAMES for t in low[1:-1]):
        s["person"] += 3  # a title before the name: "Agent Alex Mercer", "Coach Ann Wu"
    elif multi and low[-1] in lx.FIRST_NAMES:
        s["person"] += 1
    if len(low) > 2 and any(t in lx.PARTICLES for t in low[1:-1]):
        s["person"] += 2
    if acronym or any(ch.isdigit() for ch in phrase) or (not multi and _BRANDISH.search(tokens[0])):
        s["organization"] += 1  # "K2", "YouTube", "USB-C": products and brands, not people
    elif not multi and low[0].endswith("s") and not low[0].endswith("ss"):
        s["organization"] += 0.75  # "Jets", "Cratchits": teams and families
    if max(s.values()) == 0:
        s["organization" if multi else "person"] += 0.5 if multi else 0.25  # any context wins
    return s


def _initials_join(toks: list[tuple[str, int]], i: int, inside: bool,
                   ordinary: Container[str]) -> bool:
    """Whether the initials `toks[i]` ("H.P.", "A.") stay in the name with the words after them:
    a person's initials before a name (`initials_before_name`, on the first word after them and
    any further initials), after a first word of the name ("George A. Romero": `inside`) or
    opening it with at most MAX_AFTER_INITIALS words after them, each a name's ("T.J. Watt",
    "W.E.B. Du Bois"; not "N.F.L. Commissioner Roger Goodell", a title before a name, nor "S.
    Main Street")."""
    j = i + 1
    while j < len(toks) and _INITIALS.fullmatch(toks[j][0]):
        j += 1
    chain = "".join(t for t, _ in toks[i:j])  # "U. S." is "U.S."
    if j == len(toks) or not initials_before_name(chain, toks[j][0], ordinary):
        return False
    if inside:
        return True
    rest = [t for t, _ in toks[j:]]
    return len(rest) <= MAX_AFTER_INITIALS and all(
        initials_before_name(chain, t, ordinary) for t in rest)


def _initials_name(words: list[str]) -> bool:
    """Whether a name ends in initials and at most MAX_AFTER_INITIALS words of a name after
    them ("T.J. Watt", "George A. Romero"; not "Edward F. Knapp State Airport")."""
    last = max((k for k, w in enumerate(words) if _INITIALS.fullmatch(w)), default=None)
    if last is None:
        return False
    rest = words[last + 1 :]
    return 0 < len(rest) <= MAX_AFTER_INITIALS and all(
        initials_before_name(words[last], w) for w in rest)


def _groups(toks: list[tuple[str, int]], initial: bool,
            ordinary: Container[str] = ()) -> list[list[tuple[str, int]]]:
    """Split one capitalized run into name candidates: drop sentence-initial common words,
    split at titles like "PhD", at inner possessives, at "of" without a head word and after
    initials that are not a person's (`_initials_join`: they lose their dot, "U.S")."""
    while toks:
        low = toks[0][0].lower().replace("’", "'")
        if (
            low in lx.MONTHS_DAYS
            or (low in lx.STOPWORDS and (initial or low != "the" or len(toks) == 1))
            or (initial and low in lx.SENTENCE_STARTERS)
        ):  # "The Verge" keeps its "The" inside a sentence, not at its start
            toks = toks[1:]
        else:
            break
        initial = False
    groups: list[list[tuple[str, int]]] = []
    cur: list[tuple[str, int]] = []
    for i, (tok, pos) in enumerate(toks):
        if tok.endswith(".") and _INITIALS.fullmatch(tok):
            chained = i > 0 and _INITIALS.fullmatch(toks[i - 1][0])  # "J. R. R. Tolkien"
            if chained and cur and cur[-1][0] == toks[i - 1][0] or (
                    not chained and _initials_join(toks, i, bool(cur), ordinary)):
                cur.append((tok, pos))
            else:  # as if the name ended at the dot and another run began after the initials
                groups.append([*cur, (tok[:-1], pos)])
                j = i + 1
                while j < len(toks) and _INITIALS.fullmatch(toks[j][0]):
                    groups.append([(toks[j][0][:-1], toks[j][1])])
                    j += 1
                groups += _groups(toks[j:], False, ordinary)
                cur = []
                break
            continue
        low = tok.lower()
        if low.rstrip(".") in lx.NON_NAMES or (len(tok) > 6 and _ALLCAPS.fullmatch(tok)):
            groups.append(cur)
            cur = []
            continue
        if low == "of" and not (len(cur) <= 2 and cur and cur[-1][0].lower() in lx.OF_HEADS):
            groups.append(cur)
            cur = []
            continue
        cur.append((tok, pos))
        if cur and len(cur) > 1 and cur[-2][0] == tok:  # "Scrooge Scrooge": two mentions
            groups.append(cur[:-1])
            cur = [cur[-1]]
        if tok.endswith(("'s", "’s")) and i < len(toks) - 1:
            groups.append(cur)
            cur = []
    groups.append(cur)
    out = []
    for g in list(groups):
        if len(g) > 1 and all(_ALLCAPS.fullmatch(t) for t, _ in g):
            groups.remove(g)  # "SIGN UP I": shouted words, each judged alone as an acronym
            groups += [[t] for t in g]
    for g in groups:  # lowercase connectors only join: "Le Monde" and "De Beers" keep theirs
        while g and (g[-1][0] in lx.CONNECTORS or g[-1][0].lower() in lx.MONTHS_DAYS):
            g = g[:-1]
        while g and g[0][0] in lx.CONNECTORS:
            g = g[1:]
        if g:
            out.append(g)
    return out


def _apposed_place(rest: str) -> bool:
    """Whether a known place follows after a comma: "Fresno, California", "Lyon, France"."""
    m = _APPOSED.match(rest)
    words = m.group(1).split() if m else []
    return any(" ".join(words[:k]).lower().rstrip(".") in lx.GAZETTEER
               for k in range(len(words), 0, -1))


def _next_word(sentence: str, end: int) -> str:
    nxt = _NEXT.match(sentence[end : end + 24])
    return nxt.group(1).lower() if nxt else ""


def _context_scores(sentence: str, start: int, end: int, s: dict[str, float]) -> None:
    prev = _PREV.search(sentence, max(0, start - 24), start)
    p = prev.group(1).lower() if prev else ""
    n = _next_word(sentence, end)
    if p in lx.GEO_PREPOSITIONS_STRONG:
        s["geo"] += 1.5
    elif p in lx.GEO_PREPOSITIONS_WEAK:
        s["geo"] += 0.5
    if _apposed_place(sentence[end:]):
        s["geo"] += 3
    org = _APPOSED_ORG.match(sentence[end:])
    if p in lx.ORG_NOUNS or (org and not lx.ORG_NOUNS.isdisjoint(org.group(1).split())):
        s["organization"] += 1.5  # "the supplier Hengda Tooling", "Hengda, a mould maker"
    if p in lx.SPEECH_VERBS or n in lx.SPEECH_VERBS or n == "who":
        s["person"] += 1
    if p == "the":
        s["person"] -= 1


def _speaker(sentence: str) -> Mention | None:
    """A speaker label that opens a transcript line, none of its words a common one."""
    m = _SPEAKER.match(sentence)
    if m is None or any(w.lower() in _NOT_SPEAKER for w in m.group(1).split()):
        return None
    scores = {**dict.fromkeys(TYPES, 0.0), "person": 3.0}
    return Mention(m.group(1), 0, scores, 3.0, speaker=True)


def _latin_mentions(sentence: str, cjk: bool, ordinary: Container[str]) -> list[Mention]:
    out: list[Mention] = []
    speaker = _speaker(sentence)
    if speaker is not None:  # blanked out: the line is read as if it began after the label
        out.append(speaker)
        sentence = " " * (len(speaker.name) + 1) + sentence[len(speaker.name) + 1 :]
    words = _WORDISH.findall(sentence)
    if len(words) >= 2 and len(_SHOUT.findall(sentence)) > 0.6 * len(words):
        return out  # an all-caps heading: capitals say nothing here
    for m in _NAME.finditer(sentence):
        before = sentence[: m.start()].rstrip()
        initial = not cjk and (not before or before.endswith(_INITIAL_AFTER))
        toks = [(t.group(), m.start() + t.start()) for t in _TOKEN.finditer(m.group())]
        for g in _groups(toks, initial, ordinary):
            words_ = [t for t, _ in g]
            last = words_[-1]
            if last.endswith(("'s", "’s")):
                words_[-1] = last[:-2]
            honor = words_[0].lower().rstrip(".") in lx.HONORIFICS
            if honor and len(words_) == 1:
                continue
            core = words_[1:] if honor and len(words_) > 2 else words_
            name = " ".join(core)
            real = [w for w in core if w.lower() not in lx.CONNECTORS]
            if len(name) < 2 or len(real) > 6 or name.replace(" ", "").isdigit():
                continue
            single = len(core) == 1
            low = name.lower().replace("’", "'")
            acronym = single and bool(_ACRONYM.fullmatch(name)) and not _ROMAN.fullmatch(name)
            if single and not acronym and (
                (name.isupper() and len(name) > 6) or low in _NEVER_ALONE or low in lx.NOT_ALONE
            ):
                continue
            scores = type_scores(core, acronym=acronym)
            if _initials_name(core):
                scores["person"] += 3  # a person's initials kept before a name: "T.J. Watt"
            if honor and len(core) > 1 and core is not words_:
                scores["person"] += 6 if words_[0].lower().rstrip(".") in lx.PERSON_DOTTED else 3
            cue = max(scores.values())
            _context_scores(sentence, g[0][1], g[-1][1] + len(g[-1][0]), scores)
            at_start = initial and g[0][1] == toks[0][1]
            # "Gwen said": a word that opens a sentence as the speaker's name is a name
            speech = _next_word(sentence, g[-1][1] + len(g[-1][0])) in lx.SPEECH_VERBS
            initial_only = single and at_start and not acronym and not speech
            out.append(Mention(name, g[0][1], scores, cue, initial_only, acronym))
    return out


_ZH_NOUNISH = ("n", "a", "b", "j")


def _votes(kind: str) -> dict[str, float]:
    return {**dict.fromkeys(TYPES, 0.0), kind: 6.0}


def _cjk_mentions(sentence: str) -> list[Mention]:
    """Chinese names from jieba's POS tags: nr person, ns place, nt/nz organization, plus
    organization compounds ending in 公司/大学/... ("深圳华光传感器有限公司")."""
    words = [(p.word, p.flag) for p in load_jieba().posseg.cut(sentence)]
    offsets = []
    pos = 0
    for w, _ in words:
        offsets.append(pos)
        pos += len(w)
    out: list[Mention] = []
    used: set[int] = set()
    for i, (w, f) in enumerate(words):
        suffix = next((x for x in lx.ORG_SUFFIXES_ZH if w.endswith(x)), None)
        if suffix is None or not f.startswith("n") or not has_cjk(w):
            continue
        j = i
        while j > 0 and i - j < 5:
            pw, pf = words[j - 1]
            if not pf.startswith(_ZH_NOUNISH) or not has_cjk(pw) or pf == "eng":
                break
            j -= 1
            if pf == "ns":
                break
        name = "".join(x for x, _ in words[j : i + 1])
        if len(name) > len(suffix):
            out.append(Mention(name, offsets[j], _votes("organization"), 6.0))
            used.update(range(j, i + 1))
    kinds = {"ns": "geo", "nt": "organization", "nz": "organization"}
    freq = load_jieba().dt.FREQ
    for i, (w, f) in enumerate(words):
        if i in used or len(w) < 2 or not has_cjk(w) or w in lx.ZH_NOT_NAMES:
            continue
        kind = "person" if f.startswith("nr") else kinds.get(f)
        if kind == "organization" and f == "nz" and freq.get(w):
            continue  # dictionary nz words are ethnonyms, wars, languages...: only new words
        if kind:
            out.append(Mention(w, offsets[i], _votes(kind), 6.0))
    return out


MAX_HEADING_WORDS = 6  # the longest name a heading is taken as (as for names in prose)
_HEADING = re.compile(r"^#[ \t]+(.+?)[ \t#]*$", re.MULTILINE)
_QUALIFIER = re.compile(r"\s*\([^()]*\)$")  # "Vessel (novel)": what kind of thing, not its name
_HEADING_WORD = re.compile(r"[\"'“”‘’,]")


def headings(text: str) -> list[str]:
    """The level-one markdown headings ("# ...") of `text`, in order, as written."""
    return [m.group(1) for m in _HEADING.finditer(text)]


def heading_name(heading: str) -> str | None:
    """The name a level-one heading gives its section, or None when it reads as a headline or
    a sentence rather than a name.

    A document titled by a name is about that entity ("# Marlowe Quarry", "# Ostrava"), even when
    the text never repeats the name in a form the mention rules keep (a lone word opening a
    sentence is dropped as possibly capitalized by position only). A name here is what a
    title-cased phrase is: every word capitalized (or a digit, connector or stop word), at
    most MAX_HEADING_WORDS words, no sentence or clause punctuation; a trailing
    parenthesized qualifier ("Vessel (novel)") is not part of the name."""
    name = _QUALIFIER.sub("", " ".join(heading.split())).strip()
    if not name or re.search(r"[.!?:;…]$|[:;?!()\[\]]", name):
        return None
    words = [_HEADING_WORD.sub("", w) for w in name.split()]
    words = [w for w in words if w]
    real = [w for w in words if w.lower() not in lx.CONNECTORS and w.lower() not in lx.STOPWORDS]
    if not real or len(real) > MAX_HEADING_WORDS:
        return None
    if not all(w[0].isupper() or w[0].isdigit() for w in real):
        return None
    if len(real) == 1 and real[0].lower().rstrip(".") in _NEVER_ALONE | lx.NOT_ALONE:
        return None
    if all(w.isdigit() for w in real) or not any(ch.isalpha() for ch in name):
        return None
    return name


def find_mentions(sentence: str, ordinary: Container[str] = ()) -> list[Mention]:
    """Name-like mentions in one sentence, in order of appearance. `ordinary`: the words the
    text around it writes in lower case (no surname after initials is one of them)."""
    cjk = has_cjk(sentence)
    out = _latin_mentions(sentence, cjk, ordinary)
    if cjk:
        out += _cjk_mentions(sentence)
    out.sort(key=lambda m: (m.start, -len(m.name)))
    return out


_CLAIM_RE = re.compile(
    r"\b(" + "|".join(sorted(lx.CLAIM_CUES, key=len, reverse=True)) + r")\w*", re.IGNORECASE)
_CLAIM_ZH = re.compile("|".join(lx.CLAIM_CUES_ZH))


def claim_type(sentence: str) -> str | None:
    """The claim type cued by a sentence ("RECALL" for "... recalled ..."), or None."""
    m = _CLAIM_RE.search(sentence)
    if m:
        return lx.CLAIM_CUES[m.group(1).lower()]
    z = _CLAIM_ZH.search(sentence)
    return lx.CLAIM_CUES_ZH[z.group()] if z else None
