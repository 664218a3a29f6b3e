"""Entity resolution: which names of a document name one entity (design §3.4, issue 31).

Three kinds of evidence, and where each applies:

- **a name's form** (`canopy.ids.entity_key`): case, punctuation, accents, spacing ("Open AI" /
  "OpenAI") and a leading "The". The two names alone are the evidence, so it applies to every
  instance, in every unit.
- **the text unit both names occur in** (`unit_aliases`): a surname standing for the one person
  of the unit with that surname ("Altman" for "Sam Altman"), a first name, an initialism of
  three or more capitals or a dotted one, or a clipped form of the one longer name of the unit
  it abbreviates ("FBI" for "Federal Bureau of Investigation", "Fed" for "Federal Reserve"). A
  short form with two candidates in the unit ("Kelce" beside "Travis Kelce" and "Jason Kelce")
  is left alone. This gives each instance its *unit key*.
- **the document** (`document_links`): the same rules over all the names of the document's
  live units, for an instance its unit left unlinked: "EU" in one unit stands for "European
  Union" in another, but only from the first unit that writes the longer name on, and only when
  the document holds one candidate. Two undotted capitals ("EU", "PL"), which the unit rules
  never take for an initialism, link only where every unit of the document that writes them
  also writes the one name they are the initials of ("AI" written anywhere without "Amnesty
  International" is the common abbreviation). A name with and without a trailing legal form
  ("Intel Corp" / "Intel", "JPMorgan Chase & Co") is one company only in a document that writes
  both (`canopy.ids.fold_key`), and not where it also names a parent of the bare name
  ("SoftBank Group" beside "SoftBank Corp": "SoftBank" could be either); elsewhere "SoftBank"
  and "SoftBank Corp" may be two companies. Likewise a person's name with and without a
  generational suffix ("Floyd Mayweather Jr" / "Floyd Mayweather"), unless the document writes
  the name with another suffix too ("Jr" and "Sr": the bare name could be either). A unit's own
  link wins over its document's.

The access rule follows from where the evidence is: an instance is merged under another name
only on evidence in its own document (its own unit, or another unit of it), and every unit of a
document carries the document's ACL labels. So whoever may read a merged instance may read the
text that links the two names, and a caller is never served a merge that only text they cannot
read supports: through the provenance gate (design §2) they are served a view of the merged
entity built from their readable instances, under the name those instances support, and the
other name stays an entity of its own. drill_down lists each merged name with its evidence: the
units it was merged in, and for a link of the document, the units of that document that write
the entity's own name (`merged_names`).

Every resolution is a function of one document's live units: unit keys are saved with each
unit's extraction; the keys instances merge by are settled again from them whenever a unit of
the document is added, removed or re-extracted (canopy.indexer.stages.resolve), so an
incremental update merges exactly as a fresh build does, and an edit that removes a link's only
evidence splits the names again in every unit of the document, the unchanged ones included,
without extracting them again.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property

from canopy.ids import entity_key, fold_key, key_words
from canopy.providers.builtin.lexicon import FIRST_NAMES, HONORIFICS

__all__ = ["Alias", "MergedName", "alias_candidates", "alias_rule", "display_name",
           "document_links", "linked_keys", "merged_names", "unit_aliases"]

# Words an initialism skips ("Bank of America" -> "BoA", "BA").
_JOINERS = frozenset({"of", "the", "and", "for", "on", "in", "at", "to", "de", "la", "du", "des",
                      "der", "von", "van", "y", "e", "et", "und"})
_ROMAN = re.compile(r"^[ivxlcdm]+$")
_GENERATIONAL = frozenset({"jr", "sr", "ii", "iii", "iv"})
_LETTERS = re.compile(r"[^\W\d_]+")
SURNAME, GIVEN_NAME, INITIALISM, ABBREVIATION, FORM, CONFIRMED, LEGAL_FORM, SUFFIX = (
    "surname", "given name", "initialism", "abbreviation", "form", "confirmed", "legal form",
    "generational suffix")
# What a company's parent is named ("SoftBank Group" beside "SoftBank Corp"): a document writing
# one names two companies, and its bare name ("SoftBank") could be either.
_PARENTS = ("group", "holdings")
# A person's generational suffixes ("Floyd Mayweather Jr"): the bare name is the same person in
# a document writing both, unless it writes the name with another ("Jr" and "Sr": father and son).
# Not numerals: "Exorcist III" is a sequel, "Henry VIII" a king of his own.
_SUFFIXES = frozenset({"jr", "sr"})
MAX_CANDIDATES = 24  # pairs of one unit asked about in one confirmation request


@dataclass(frozen=True)
class Alias:
    """Within one unit, the instances named `key` belong to the entity named `canonical`."""

    key: str
    canonical: str
    rule: str


@dataclass
class _Form:
    key: str
    words: list[str]
    written: str  # the surface form as extracted (capitals count for initialisms)
    types: Counter[str]
    first: int  # position of its first instance in the unit's extraction (text order)

    @cached_property
    def type(self) -> str:  # read only once the unit's instances are all counted
        return min(self.types.items(), key=lambda kv: (-kv[1], kv[0]))[0]

    @cached_property
    def name_words(self) -> list[str]:
        """The words a surname is the last of: no generational suffix, numeral or honorific."""
        words = [w for w in self.words if w not in _GENERATIONAL and not _ROMAN.match(w)]
        while words and words[0] in HONORIFICS:  # "Mrs. Fezziwig" is no fuller name of "Fezziwig"
            words.pop(0)
        return words

    @cached_property
    def given_words(self) -> list[str]:
        """The words a given name is the first of: no honorific."""
        return [w for w in self.words if w not in HONORIFICS]


def _initials(words: list[str], written: str = "") -> set[str]:
    """Initialisms a multi-word name is abbreviated to: every word's initial, or the initials of
    its words but joiners ("of", "the"). A word written in capitals (`written`: the name as
    written) is an initialism itself and gives all its letters ("CLL Tests" is "CLLT", not
    "CT")."""
    acronyms = {t.lower() for t in _LETTERS.findall(written) if len(t) >= 2 and t.isupper()}

    def initial(w: str) -> str:
        return w if w in acronyms else w[0]

    out = {"".join(initial(w) for w in words)}
    content = [w for w in words if w not in _JOINERS]
    if len(content) >= 2:
        out.add("".join(initial(w) for w in content))
    return out


def _is_initialism(written: str, two_capitals: bool = False) -> bool:
    """Written as capitals, optionally dotted: "FBI", "U.S.". Two undotted capitals ("AI",
    "TD", "RW") are as often a common abbreviation of the text as a name's initials: only with
    `two_capitals` (`document_links` asks more of them)."""
    letters = "".join(_LETTERS.findall(written))
    dotted = "." in written
    return ((2 if dotted or two_capitals else 3) <= len(letters) <= 6 and letters.isupper()
            and set(written) <= set(letters) | {"."})


def _surname(short: _Form, long: _Form) -> bool:
    """The last word of a person's full name ("Altman" of "Sam Altman"). A full name is a
    person's when typed so, when it starts with a known first name (an extractor may type "Pat
    Cummins" an organization), or when it is two words and the surname alone is typed a person
    ("Ohtani" beside "Shohei Ohtani"); the surname is typed a person or like the full name;
    neither is typed a place more often than a person; a hyphenated word is one word
    ("High-grade" is no full name of "Grade")."""
    if len(long.words) < 2 or len(long.written.split()) < 2:
        return False
    if _place(short) or _place(long):
        return False
    words = long.name_words
    two = len(words) == 2 and len(long.written.split()) == 2  # a given name and a surname
    if len(words) < 2 or not (_person(long) or words[0] in FIRST_NAMES
                              or (_person(short) and two)):
        return False
    if not (_person(short) or _person(long) or set(short.types) & set(long.types)):
        return False
    (w,) = short.words
    last = key_words(long.written.split()[-1])
    return words[-1] == w and w != words[0] and last == [w]


def _person(f: _Form) -> bool:
    return f.type == "person"


def _place(f: _Form) -> bool:
    return f.types["geo"] > f.types["person"]


def _two_capitals(written: str) -> bool:
    """Two undotted capitals ("EU", "AI")."""
    return _is_initialism(written, two_capitals=True) and not _is_initialism(written)


def _given_name(short: _Form, long: _Form) -> bool:
    """A known first name standing for the one person of the unit with it ("Alicia" for "Alicia
    Huberman")."""
    (w,) = short.words
    if w not in FIRST_NAMES or short.type not in ("person", long.type) or long.type == "geo":
        return False
    words = long.given_words
    return len(words) >= 2 and words[0] == w and (long.type == "person" or w in FIRST_NAMES)


def _abbreviation(short: _Form, long: _Form) -> bool:
    """A clipped first word ("Fed" for "Federal Reserve"): at most four letters and at most
    about half the word, written capitalized, of a name that is not a person's."""
    (w,) = short.words
    first = long.words[0]
    return (len(long.words) >= 2 and "person" not in (short.type, long.type)
            and 3 <= len(w) <= 4 and 2 * len(w) <= len(first) + 1 and first.startswith(w)
            and w.isalpha() and short.written[:1].isupper() and not short.written.isupper())


def unit_aliases(names: Iterable[tuple[str, str]], two_capitals: bool = False
                 ) -> dict[str, Alias]:
    """The links one unit's entity instances ((name, type) each, in text order) support, by the
    key of the short form: only a short form with exactly one candidate longer name in the unit
    is linked. Two undotted capitals count as an initialism only with `two_capitals`."""
    forms: dict[str, _Form] = {}
    for pos, (name, type_) in enumerate(names):
        key = entity_key(name)
        if not key:
            continue
        f = forms.get(key)
        if f is None:
            f = forms[key] = _Form(key, key_words(name), name.strip(), Counter(), pos)
        f.types[type_.strip().lower()] += 1
    # Each rule can only hold for a long form indexed under the short form's word (its initials,
    # the last or first of its name words, its first word's first three or four letters), so a
    # short form is tested against those alone, not against every long form of the unit.
    by_initials: dict[str, list[_Form]] = {}
    by_word: dict[str, list[_Form]] = {}
    for long in forms.values():
        if len(long.words) < 2:
            continue
        for initials in _initials(long.words, long.written):
            by_initials.setdefault(initials, []).append(long)
        first = long.words[0]
        hooks = {long.name_words[-1] if long.name_words else "",
                 long.given_words[0] if long.given_words else "", first[:3], first[:4]}
        for hook in hooks - {""}:
            by_word.setdefault(hook, []).append(long)
    out: dict[str, Alias] = {}
    for short in sorted(forms.values(), key=lambda f: f.key):
        initialism = _is_initialism(short.written, two_capitals)
        if len(short.words) != 1 and not initialism:
            continue
        found: dict[str, str] = {}
        if initialism:
            for long in by_initials.get(short.key, ()):
                if long.key != short.key:
                    found[long.key] = INITIALISM
        else:
            for long in by_word.get(short.words[0], ()):
                if long.key == short.key:
                    continue
                if _surname(short, long):
                    found[long.key] = SURNAME
                elif _given_name(short, long):
                    found[long.key] = GIVEN_NAME
                elif _abbreviation(short, long):
                    found[long.key] = ABBREVIATION
        if len(found) == 1:
            ((canonical, rule),) = found.items()
            out[short.key] = Alias(short.key, canonical, rule)
    return out


def alias_candidates(names: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Pairs (shorter name, longer name) of one unit's entities ((name, type) each) that the
    rules leave open and the unit's text could settle: the shorter's words all in the longer
    ("Apple" / "Apple Watch", "Kelce" / "Travis Kelce" beside "Jason Kelce"), or capitals that
    spell its initials ("AI" / "Amnesty International"). What an LLM is asked to confirm."""
    names = list(names)
    linked = unit_aliases(names)
    forms: dict[str, tuple[str, list[str]]] = {}
    for name, _ in names:
        key = entity_key(name)
        if key and key not in forms:
            forms[key] = (name.strip(), key_words(name))
    out: list[tuple[str, str]] = []
    for short_key, (short, short_words) in sorted(forms.items()):
        if short_key in linked:
            continue
        letters = "".join(_LETTERS.findall(short))
        capitals = letters.isupper() and 2 <= len(letters) <= 6
        for long_key, (long, long_words) in sorted(forms.items()):
            if long_key == short_key or len(long_words) < 2 or len(long_words) <= len(short_words):
                continue
            if set(short_words) < set(long_words) or (
                    capitals and letters.lower() in _initials(long_words, long)):
                out.append((short, long))
    return out[:MAX_CANDIDATES]


def linked_keys(names: list[tuple[str, str]], confirmed: Iterable[tuple[str, str]] = ()
                ) -> dict[str, Alias]:
    """Every link of one unit: its rules' (`unit_aliases`) and the pairs the provider confirmed
    from its text (`confirmed`, (short, long) names of this unit's entities)."""
    links = unit_aliases(names)
    here = {entity_key(n) for n, _ in names}
    for short, long in confirmed:
        s, t = entity_key(short), entity_key(long)
        if s in here and t in here and s != t and s not in links:
            target = links[t].canonical if t in links else t
            if target != s:
                links[s] = Alias(s, target, CONFIRMED)
    return links


def document_links(units: Iterable[tuple[str, Iterable[tuple[str, str, str]]]]
                   ) -> dict[str, dict[str, Alias]]:
    """The links one document supports beyond those its units make alone. `units`: the
    document's live units in text order, each (unit id, its instances as (name, type, unit key)
    in position order), the unit key being what its own unit made of the instance
    (`linked_keys`). Returns, by unit id, the links by the instances' unit key:

    - the rules of `unit_aliases` over the whole document's names: a short form links to the one
      longer name of the document it stands for ("FBI" in one unit, "Federal Bureau of
      Investigation" in another); with two candidates in the document it is left alone;
    - only once the longer name is written: not in a document that uses the short form in a unit
      before the first that writes the longer one (an abbreviation in use before is its own);
    - two undotted capitals ("EU") stand for the one name they are the initials of only where
      every unit of the document that writes them writes that name too ("AI" in a unit without
      "Amnesty International" is the common abbreviation, and so it is throughout);
    - a name written with a legal form ("Intel Corp") and without ("Intel") in the document is
      one name, the bare one (`_legal_forms`), unless the document names a parent of it ("X
      Group", "X Holdings"); so is a person's name with one generational suffix and without
      ("Floyd Mayweather Jr"), unless the document writes another suffix of it ("X Sr"); a
      link to either form ends on that name;
    - an instance its own unit linked keeps its unit's link (a legal form's excepted: it ends
      on the bare name).
    """
    units = [(uid, list(rows)) for uid, rows in units]
    names = [(name, type_) for _, rows in units for name, type_, _ in rows]
    legal = _legal_forms(name for name, _ in names)
    out: dict[str, dict[str, Alias]] = {}
    for uid, rows in units:
        for _, _, unit_key in rows:
            if unit_key in legal:
                out.setdefault(uid, {})[unit_key] = legal[unit_key]
    links = {k: Alias(k, legal[a.canonical].canonical, a.rule) if a.canonical in legal else a
             for k, a in unit_aliases(names).items() if k not in legal}
    first: dict[str, int] = {}  # the unit each name is first written in, in text order
    for i, (_, rows) in enumerate(units):
        for name, _, _ in rows:
            first.setdefault(entity_key(name), i)
    for uid, rows in units:
        for name, _, unit_key in rows:
            key = entity_key(name)
            link = links.get(key)
            if (link is not None and unit_key == key and key not in legal
                    and first.get(link.canonical, len(units)) <= first[key]):
                out.setdefault(uid, {})[key] = link
    # Two capitals ("EU", "PL") are as often a common abbreviation of the text ("AI", "TD"):
    # they stand for the name they are the initials of only where every unit of the document
    # that writes them also writes that one name.
    weak: dict[str, set[str]] = {}  # short key -> the names it abbreviates, unit by unit
    unlinked: set[str] = set()
    for _, rows in units:
        here = unit_aliases(((n, t) for n, t, _ in rows), two_capitals=True)
        for name, _, unit_key in rows:
            key = entity_key(name)
            if unit_key != key or not _two_capitals(name):
                continue
            link = here.get(key)
            if link is None or link.rule != INITIALISM:
                unlinked.add(key)
            else:
                weak.setdefault(key, set()).add(link.canonical)
    for uid, rows in units:
        for name, _, unit_key in rows:
            key = entity_key(name)
            targets = weak.get(key, set())
            if key not in unlinked and len(targets) == 1 and unit_key == key and key not in legal:
                target = next(iter(targets))
                target = legal[target].canonical if target in legal else target
                out.setdefault(uid, {})[key] = Alias(key, target, INITIALISM)
    return out


def _legal_forms(names: Iterable[str]) -> dict[str, Alias]:
    """A document's links of a name written with and without its legal form ("Intel Corp" and
    "Intel", "Intel Corporation"), by key: to the bare name's key, or with none written, to the
    shortest. Not when the document also names a parent of the bare name ("SoftBank Group"
    beside "SoftBank Corp" and "SoftBank": two companies). And of a name written with and
    without one generational suffix (`_suffixed`): to the bare name, unless the document
    writes the name with two suffixes ("X Jr", "X Sr")."""
    groups: dict[str, set[str]] = {}
    suffixed: dict[str, set[tuple[str, str]]] = {}  # bare key -> (key, suffix) written with it
    keys: set[str] = set()
    for name in names:
        key = entity_key(name)
        if key:
            keys.add(key)
            groups.setdefault(fold_key(name), set()).add(key)
            found = _suffixed(name)
            if found is not None:
                suffixed.setdefault(found[0], set()).add((key, found[1]))
    out: dict[str, Alias] = {}
    for bare, members in groups.items():
        if len(members) < 2 or any(bare + w in keys for w in _PARENTS):
            continue
        canonical = bare if bare in members else min(members, key=lambda k: (len(k), k))
        for key in sorted(members - {canonical}):
            out[key] = Alias(key, canonical, LEGAL_FORM)
    for bare, forms in suffixed.items():
        if bare not in keys or len({suffix for _, suffix in forms}) != 1:
            continue
        bare = out[bare].canonical if bare in out else bare
        for key, _ in sorted(forms):
            if key not in out:
                out[key] = Alias(key, bare, SUFFIX)
    return out


def _suffixed(name: str) -> tuple[str, str] | None:
    """(the key without it, the suffix) of a name of two or more words and a generational
    suffix ("Floyd Mayweather Jr." -> ("floydmayweather", "jr")); None for another name."""
    words = key_words(name)
    if len(words) >= 3 and words[-1] in _SUFFIXES:
        return "".join(words[:-1]), words[-1]
    return None


def alias_rule(alias: str, canonical: str, alias_type: str = "", canonical_type: str = "") -> str:
    """Which rule links a surface form to the entity it was merged into: `FORM` when the forms
    share a key, else the unit rule that would link them ("" when none would)."""
    if entity_key(alias) == entity_key(canonical):
        return FORM
    if fold_key(alias) == fold_key(canonical):
        return LEGAL_FORM
    if (_suffixed(alias) or ("",))[0] == entity_key(canonical):
        return SUFFIX
    found = unit_aliases([(alias, alias_type), (canonical, canonical_type)], two_capitals=True)
    link = found.get(entity_key(alias))
    return link.rule if link is not None and link.canonical == entity_key(canonical) else ""


def display_name(names: Counter[str], key: str) -> str:
    """An entity's name: its most frequent surface form among those with its own key ("Sam
    Altman", not the "Altman" merged into it), ties to the smallest; any form when none has."""
    own = Counter({n: c for n, c in names.items() if entity_key(n) == key}) or names
    return min(own.items(), key=lambda kv: (-kv[1], kv[0]))[0]


@dataclass(frozen=True)
class MergedName:
    """A name merged into an entity under another key, with the rule that linked it and the
    units whose text supports the link (those it was merged in, and for a link of their
    document, the units of it that write the entity's own name)."""

    name: str
    rule: str
    text_unit_ids: tuple[str, ...]


def merged_names(key: str, instances: Iterable[tuple[str, str, str]],
                 documents: Mapping[str, str] | None = None) -> list[MergedName]:
    """The names of an entity's instances ((name, type, unit id) each) written otherwise than
    its own name, by name: what drill_down shows as the merge's record. Given only the instances
    a caller may read, it shows only the links their text supports. With `documents` (each
    unit's document id), a name merged in a unit without the entity's own name (a link of its
    document, `document_links`) is shown with the units of that document that write the own
    name: the link's evidence."""
    instances = list(instances)
    names = Counter(n for n, _, _ in instances)
    if not names:
        return []
    own = display_name(names, key)
    own_type = Counter(t for n, t, _ in instances if n == own)
    canonical_type = min(own_type.items(), key=lambda kv: (-kv[1], kv[0]))[0] if own_type else ""
    units: dict[str, set[str]] = {}
    types: dict[str, Counter[str]] = {}
    with_own: set[str] = set()  # units writing a name of the entity's own key
    for name, type_, unit in instances:
        if entity_key(name) == key:
            with_own.add(unit)
        if name != own and name.casefold() != own.casefold():
            units.setdefault(name, set()).add(unit)
            types.setdefault(name, Counter())[type_] += 1
    by_document: dict[str, set[str]] = {}
    for unit in with_own:
        if documents is not None and unit in documents:
            by_document.setdefault(documents[unit], set()).add(unit)
    out = []
    for name in sorted(units):
        t = min(types[name].items(), key=lambda kv: (-kv[1], kv[0]))[0]
        rule = alias_rule(name, own, t, canonical_type) or CONFIRMED
        evidence = set(units[name])
        if rule != FORM and documents is not None:
            for unit in units[name] - with_own:
                evidence |= by_document.get(documents.get(unit, ""), set())
        out.append(MergedName(name, rule, tuple(sorted(evidence))))
    return out
