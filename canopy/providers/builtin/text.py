"""The one text-analysis module: words, stems, stop words, sentences, CJK detection and
segmentation. The builtin provider uses it, and so do the lexical index (the BM25 statistics
that indexer/stages/documents.py counts from `lexical_terms`), the builtin embedder (which
hashes them) and local_search's evidence ranking (server/engines/evidence.py). Pure functions,
deterministic, no network; jieba is loaded lazily and only for text that contains CJK characters.

Words are runs of letters of any script (apostrophes inside a word keep it whole: "o'brien",
"don't"), runs of digits, and CJK runs. A word is lower-cased, loses its accents
(canopy.ids.fold_accents), drops a possessive "'s", is dropped if it is a stop word
(lexicon.STOPWORDS) or a single letter (a digit stays), and is stemmed by `stem`. CJK runs are
segmented two ways:
- `lexical_terms`: character bigrams. No dictionary: cheap at index time, and the statistics
  stored in the index do not depend on jieba's version;
- `terms`: jieba's words without Chinese stop words, for query-time relevance over a few texts,
  where a dictionary word is a more precise match than a bigram.

`stem` and lexicon.STOPWORDS replace an index stemmer and stop list and a relevance stemmer;
`stem` is the one whose conflations are right (plurals: "says"/"say", "features"/"feature"; no
"business" -> "busines" or "based" -> "bas"). Against the two analyses it replaces, on DEV
questions only: local_search R@10 0.879 -> 0.878 (R@4 0.732 -> 0.734) on MultiHop-RAG
(benchmarks/retrieval_eval.py, 1,802 questions; with --front-matter 0.906 -> 0.904, R@4
0.786 -> 0.780), and R@10 of gold paragraphs 0.583 -> 0.605 on eval-data's MuSiQue sample
(82 questions, one document per paragraph). Changing what `lexical_terms` returns changes
stored statistics and builtin vectors: bump TERMS_VERSION, and the indexer rebuilds them
(indexer/pipeline.py).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Container, Iterable, Iterator
from functools import lru_cache
from itertools import pairwise
from types import ModuleType

from canopy.ids import fold_accents
from canopy.providers.builtin import lexicon as lx

__all__ = [
    "ANALYSIS_TAG",
    "TERMS_VERSION",
    "has_cjk",
    "initials_before_name",
    "lexical_terms",
    "load_jieba",
    "read_sentence_terms",
    "sentence_terms",
    "split_at_stops",
    "split_sentences",
    "stem",
    "terms",
    "trim",
]

TERMS_VERSION = 3  # of `lexical_terms`: 1 had its own stemmer and stop words; 2 kept accents

_CJK_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = re.compile(f"[{_CJK_CLASS}]")
_CJK_SPLIT = re.compile(f"([{_CJK_CLASS}]+)")
# Letters of any script with apostrophes inside, or digits. CJK runs are cut out of a word
# afterwards (`_word_terms`): once per distinct word, not once per occurrence.
_WORD = re.compile(r"[^\W\d_]+(?:['’][^\W\d_]+)*|\d+")


def has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


@lru_cache(maxsize=1)
def load_jieba() -> ModuleType:
    """jieba, initialised once and quietly (it logs its dictionary loading to stderr)."""
    import jieba
    import jieba.posseg

    jieba.setLogLevel(logging.WARNING)
    jieba.initialize()
    return jieba


def trim(text: str, limit: int = 300) -> str:
    """`text` cut at a word boundary to at most `limit` characters (an ellipsis marks a cut)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# ---- words and terms ------------------------------------------------------------------------


def stem(word: str) -> str:
    """A light English stemmer for lower-cased words: plurals ("-ies", "-es" after a sibilant,
    "-s" but not "-ss", "-us", "-is") and, when at least four letters remain, "-ing" and "-ed".
    Light on purpose: it joins a word's plural and its singular, and leaves short words alone
    ("based", "making"), where cutting a suffix would join unrelated words."""
    n = len(word)
    if n > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if n > 4 and word.endswith("es") and (word[-3] in "sxz" or word[-4:-2] in ("ch", "sh")):
        return word[:-2]
    if n > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if n > 6 and word.endswith("ing"):
        return word[:-3]
    if n > 5 and word.endswith("ed"):
        return word[:-2]
    return word


def _term(word: str) -> str | None:
    """The term of one lower-cased word without CJK, or None for a stop word or a single
    letter."""
    word = fold_accents(word.replace("’", "'"))  # "Zürich" is also written "Zurich"
    if word in lx.STOPWORDS:
        return None
    word = word.removesuffix("'s")
    if (len(word) <= 1 and not word.isdigit()) or word in lx.STOPWORDS:
        return None
    return stem(word)


def _word_terms(word: str, cjk_words: bool) -> tuple[str, ...]:
    """The terms of one lower-cased word: CJK runs as jieba's words (`cjk_words`) or character
    bigrams."""
    if not _CJK.search(word):
        t = _term(word)
        return () if t is None else (t,)
    out: list[str] = []
    for i, part in enumerate(_CJK_SPLIT.split(word)):
        if i % 2 == 0:  # between CJK runs: letters of other scripts ("Kestrel项目")
            t = _term(part) if part else None
            out += () if t is None else (t,)
        elif cjk_words:
            out += [w for w in load_jieba().cut(part) if len(w) > 1 and w not in lx.STOPWORDS_ZH]
        else:
            out += [a + b for a, b in pairwise(part)] or [part]
    return tuple(out)


# Memoized per word: a corpus has far fewer distinct words than words.
@lru_cache(maxsize=200_000)
def _index_word(word: str) -> tuple[str, ...]:
    return _word_terms(word, cjk_words=False)


@lru_cache(maxsize=50_000)
def _relevance_word(word: str) -> tuple[str, ...]:
    return _word_terms(word, cjk_words=True)


def lexical_terms(text: str) -> list[str]:
    """Terms of `text` for the lexical index and the builtin embedder, in order (repeats kept):
    stemmed content words; CJK runs become character bigrams."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        out += _index_word(w)
    return out


def terms(text: str) -> list[str]:
    """Terms of `text` for query-time relevance, in order (repeats kept): stemmed content words;
    CJK runs become jieba's words (without Chinese stop words)."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        out += _relevance_word(w)
    return out


# ---- sentences ------------------------------------------------------------------------------
#
# Two granularities of one rule (a stop, optional closing quotes or brackets, whitespace):
# `split_sentences` reads like a person, for text that is shown or parsed for names; and
# `split_at_stops` cuts finer, for local_search's scoring windows (server/engines/evidence.py).
# On the DEV split of MultiHop-RAG, windows made of `split_sentences` lower local_search's
# R@4 from 0.7335 to 0.7319 (R@10 0.8783 -> 0.8779; with the terms of TERMS_VERSION 1 it
# was 0.7325 -> 0.7303, 16 questions lost and 4 won). The chunker's cut points are a third rule
# on purpose (indexer/chunking.py: unit ids derive from them).

_PARA = re.compile(r"\n[ \t]*\n")
_STRUCT = re.compile(r"\s*(?:#{1,6}\s|[-*+•]\s|\d{1,3}[.)]\s|\||>|\*\*|__|\{)")
_KEYVAL = re.compile(r"\s*[A-Z][\w .'&-]{0,30}:\s")
_PREFIX = re.compile(r"^\s*(?:#{1,6}\s+|[-*+•]\s+|\d{1,3}[.)]\s+|>\s*)+")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_MARKUP = re.compile(r"\*\*|__|`|(?<!\w)_|_(?!\w)")
_HAS_TEXT = re.compile(f"[A-Za-z0-9{_CJK_CLASS}]")
_BOUND = re.compile(
    r"(?P<cjk>[。！？；]+[”’」』）]*)"
    r"|(?P<lat>[.!?…]+[\"'”’)\]]*)(?=\s+[\"'“‘(\[]*[A-Z0-9À-ÖØ-Þ" + _CJK_CLASS + "])"
)
_LAST_WORD = re.compile(r"([A-Za-z][A-Za-z.]*)$")
_NEXT_WORD = re.compile(r"\s+[\"'“‘(\[]*([^\s\"'”’)\],;:!?]+)")
_INITIALS = re.compile(r"(?:[A-ZÀ-ÖØ-Þ]\.){1,3}")  # "A.", "H.P.", "W.E.B."
_DOTTED_INITIALS = re.compile(r"(?:[A-Z]\.)+[A-Z]")  # as `_LAST_WORD` sees "H.P." before its stop
_AFTER_NUMBER = re.compile(r"[\d°][ ]?$")  # "34° C.", "660 V.": a unit, not an initial
_LOWER = re.compile(r"\b[a-zà-öø-ÿ][a-zà-öø-ÿ'’-]*")
# Capitalized words that are no surname: words of sentences, dates, titles, the head and first
# words of organizations, places and events ("U.N. Security Council", "D.C. Police").
_NOT_SURNAME = (lx.STOPWORDS | lx.SENTENCE_STARTERS | lx.MONTHS_DAYS | lx.HONORIFICS
                | lx.NON_NAMES | lx.NOT_ALONE | lx.ORG_SUFFIXES | lx.ORG_NOUNS
                | lx.ORG_PREFIXES | lx.GEO_SUFFIXES | lx.GEO_PREFIXES | lx.EVENT_WORDS
                | lx.NOT_PERSONAL | lx.COMPASS)


def initials_before_name(initials: str, word: str, ordinary: Container[str] = ()) -> bool:
    """Whether `initials` ("H.P.", "A.", "W.E.B.": one to three capitals, each with its dot)
    written just before `word` read as a person's initials before the rest of the name ("H.P.
    Lovecraft", "George A. Romero"), not as an abbreviation before another word ("U.S.
    President", "U.K. Prime Minister", "the U.S. The next day").

    They do when the initials are not themselves a known place or organization (lexicon
    GAZETTEER, KNOWN_ORGS: "U.S.", "U.N.") and `word` looks like a name: capitalized with
    lower-case letters (not an acronym), no function word, title, month or head word of an
    organization, place or event, and not a word the text also writes in lower case
    (`ordinary`: "Hepatitis B. Lymphoma ..." beside "lymphoma"). Another initial passes too
    ("J. R. R. Tolkien")."""
    if not _INITIALS.fullmatch(initials):
        return False
    letters = initials.replace(".", "").lower()
    if len(letters) > 1 and (letters in lx.GAZETTEER or initials.lower() in lx.GAZETTEER
                             or letters in lx.KNOWN_ORGS):
        return False
    if _INITIALS.fullmatch(word):
        return True
    w = word.replace("’", "'").removesuffix("'s").rstrip(".")
    if not (w[:1].isupper() and any(c.islower() for c in w)):
        return False
    low = w.lower()
    return low not in _NOT_SURNAME and low not in ordinary


def _blocks(paragraph: str) -> list[str]:
    """Lines of one paragraph grouped into logical blocks: wrapped prose joins, while headings,
    list items, table rows, "Key: value" lines and short lines stand alone."""
    out: list[str] = []
    cur: list[str] = []
    for line in paragraph.splitlines():
        s = line.strip()
        if not s:
            continue
        if cur and (_STRUCT.match(line) or _KEYVAL.match(line) or len(cur[-1]) < 45):
            out.append(" ".join(cur))
            cur = []
        cur.append(s)
        if s.startswith(("#", "|")):
            out.append(" ".join(cur))
            cur = []
    if cur:
        out.append(" ".join(cur))
    return out


def _clean(block: str) -> str:
    block = _PREFIX.sub("", block)
    if block.startswith("|"):
        block = " ; ".join(c.strip() for c in block.strip("| ").split("|"))
    block = _MARKUP.sub("", _LINK.sub(r"\1", block))
    return " ".join(block.split())


def _pieces(text: str, cuts: Iterable[int]) -> list[str]:
    """`text` cut at these increasing offsets, each piece stripped, empty ones dropped."""
    out: list[str] = []
    start = 0
    for end in [*cuts, len(text)]:
        piece = text[start:end].strip()
        if piece:
            out.append(piece)
        start = end
    return out


def _sentence_ends(block: str, ordinary: Callable[[], Container[str]]) -> Iterator[int]:
    """Where sentences end in `block`: not after an abbreviation, nor after an initial (a
    capital and its dot: "George A. Romero"; not a unit after a number, "at 660 V. Underground
    trains ..."), nor after dotted initials read as a person's before a name
    (`initials_before_name`: "H.P. Lovecraft"; "the U.S. Senate" and "the U.S. The next day"
    end one)."""
    for m in _BOUND.finditer(block):
        lat = m.group("lat")
        if lat and lat[0] == ".":
            w = _LAST_WORD.search(block, max(0, m.start() - 16), m.start())
            word = w.group(1) if w else ""
            if word.lower() in lx.ABBREVIATIONS:
                continue
            if len(word) == 1 and word.isupper():
                if not _AFTER_NUMBER.search(block, max(0, m.start() - 4), m.start() - 1):
                    continue
            elif _DOTTED_INITIALS.fullmatch(word):
                nxt = _NEXT_WORD.match(block, m.start() + len(lat))
                if initials_before_name(word + ".", nxt.group(1) if nxt else "", ordinary()):
                    continue
        yield m.end()


def _split_block(block: str, ordinary: Callable[[], Container[str]]) -> list[str]:
    return _pieces(block, _sentence_ends(block, ordinary))


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, markdown markers removed, whitespace collapsed (Latin and CJK).

    Sentences end at CJK full stops, and at Latin ones followed by a capital or a digit but not
    after an abbreviation ("Dr.", "e.g.") or a person's initials (`_sentence_ends`); headings,
    list items, table rows and short lines stand alone, wrapped prose lines join."""
    lower: set[str] | None = None

    def ordinary() -> set[str]:  # the words `text` writes in lower case, only when asked
        nonlocal lower
        if lower is None:
            lower = set(_LOWER.findall(text))
        return lower

    out: list[str] = []
    for para in _PARA.split(text):
        for block in _blocks(para):
            cleaned = _clean(block)
            if cleaned and _HAS_TEXT.search(cleaned):
                out.extend(_split_block(cleaned, ordinary))
    return out


# A stop with the closing quotes or brackets after it, then whitespace; or a line break.
_STOP_BREAK = re.compile(r"[.!?…。！？][\"'”’)\]]*\s+|\s*\n\s*")


STOPS_VERSION = 1  # of `split_at_stops`: bump it with any change to where pieces are cut


def split_at_stops(text: str) -> list[str]:
    """Pieces of `text` cut at every line break and after every stop followed by whitespace,
    abbreviations and initials included ("U.S." ends a piece). A piece is the text as written,
    closing quotes and brackets after its stop included: only the whitespace between pieces
    goes."""
    return _pieces(text, (m.end() for m in _STOP_BREAK.finditer(text)))


# ---- a unit's stored sentence analysis ----------------------------------------------------
#
# local_search scores every candidate unit by the terms of each of its pieces
# (server/engines/evidence.py); analysing a unit's text at query time was the largest part of
# local_search's CPU at 10,000 articles. The indexer stores the analysis with the unit instead:
# one line per piece of `split_at_stops`, its `lexical_terms` separated by spaces (terms hold
# neither), after a first line naming the versions of both. A stored analysis whose tag is not
# ANALYSIS_TAG is not used: the query analyses the text as before.

ANALYSIS_TAG = f"terms{TERMS_VERSION}-stops{STOPS_VERSION}"


def sentence_terms(text: str) -> str:
    """The stored form of `text`'s analysis: its pieces' terms, a line each, under the tag."""
    return "\n".join([ANALYSIS_TAG, *(" ".join(lexical_terms(p)) for p in split_at_stops(text))])


def read_sentence_terms(stored: str) -> list[list[str]] | None:
    """The terms of each piece from `sentence_terms`'s form, or None when it was made by other
    versions of the analysis (or never: an empty string)."""
    lines = stored.split("\n")
    if lines[0] != ANALYSIS_TAG:
        return None
    return [line.split() for line in lines[1:]]
