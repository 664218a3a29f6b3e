"""Content-hash identifiers with a type prefix: re-indexing identical content is a no-op."""

from __future__ import annotations

import hashlib
import re
import threading
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

__all__ = ["KEYS_VERSION", "LEGAL_FORMS", "content_hash", "entity_id", "entity_key",
           "fold_accents", "fold_key", "key_words", "normalize_name", "relationship_id",
           "text_hash", "unit_id"]

# Of `normalize_name`: entity ids and merge keys derive from it, so a change re-extracts and
# rebuilds every index (indexer/pipeline.py fingerprints). 2: accents folded. 3: merge keys are
# `entity_key` (legal forms dropped, spaces removed) and links within a unit (canopy.aliases).
# 4: and links within a document (canopy.aliases.document_links). 5: a legal form is part of the
# key; a document writing the name with and without it links the two (canopy.aliases). 6: and
# so does one writing a person's name with and without a generational suffix ("Jr", "Sr").
KEYS_VERSION = 6


def content_hash(*parts: str, length: int = 16) -> str:
    """Stable hex digest of the parts (NUL-separated so ("ab","c") != ("a","bc"))."""
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:length]


def text_hash(text: str) -> str:
    return content_hash(text, length=32)


def unit_id(document_id: str, text: str) -> str:
    return "tu-" + content_hash(document_id, text)


_PUNCT = re.compile(r"[\W_]+", re.UNICODE)
# Letters of Latin, Greek and Cyrillic (with their extensions) whose marks are accents; a mark
# on a letter of another script is part of it (kana's voicing mark, Indic vowel signs).
_ACCENTED_BASE = re.compile("[A-Za-z\u00c0-\u024f\u0370-\u052f\u1e00-\u1fff]")
# Latin letters with no decomposition that writers (and keyboards) replace by plain ones.
_PLAIN = str.maketrans({"ø": "o", "Ø": "O", "ł": "l", "Ł": "L", "đ": "d", "Đ": "D", "ð": "d",
                        "æ": "ae", "Æ": "AE", "œ": "oe", "Œ": "OE", "ı": "i", "þ": "th"})


def fold_accents(text: str) -> str:
    """`text` with the accents of Latin, Greek and Cyrillic letters removed ("Zürich" ->
    "Zurich", "Purkyně" -> "Purkyne", "Ørsted" -> "Orsted"), other scripts unchanged, NFC.
    People and sources write the same name with and without its accents."""
    if text.isascii():
        return text
    out: list[str] = []
    base = False
    for ch in unicodedata.normalize("NFD", text.translate(_PLAIN)):
        if unicodedata.combining(ch):
            if not base:
                out.append(ch)
            continue
        base = _ACCENTED_BASE.match(ch) is not None
        out.append(ch)
    return unicodedata.normalize("NFC", "".join(out))


# Names recur: a build asks for the key of each entity, relationship end and claim subject of
# every unit, most of them names seen before (1,827 articles: ~570k keys of ~70k names). Only
# name-sized strings are kept, and only while a build runs (`memoized_names`): a server asks
# for the keys of every word run of every question, which are seldom asked again; kept for the
# process, they filled the memo to its bound (tens of MB) over a soak (benchmarks/soak.py).
_NAME_CACHE = 1 << 16
_NAME_CHARS = 120
_builds = 0  # builds running in this process: the memo is used while there is one
_builds_lock = threading.Lock()


@contextmanager
def memoized_names() -> Iterator[None]:
    """Memoize name keys while the block runs (an index build); the memo is emptied when the
    last such block of the process ends."""
    global _builds
    with _builds_lock:
        _builds += 1
    try:
        yield
    finally:
        with _builds_lock:
            _builds -= 1
            if not _builds:
                _normalized_name.cache_clear()
                _key_words.cache_clear()


def normalize_name(name: str) -> str:
    """Merge key for entity names: NFKC, casefold, accents folded, punctuation and whitespace
    collapsed.

    "Helio Cells, Ltd." and "HELIO CELLS LTD" merge, so do "Zürich" and "Zurich"; "李明" stays
    "李明"."""
    return _normalized_name(name) if _builds and len(name) <= _NAME_CHARS else _normalized(name)


def _normalized(name: str) -> str:
    s = fold_accents(unicodedata.normalize("NFKC", name).casefold())
    s = _PUNCT.sub(" ", s)
    return " ".join(s.split())


_normalized_name = lru_cache(maxsize=_NAME_CACHE)(_normalized)


# Legal forms of companies, as the trailing word of a name (a general list, not a corpus's).
LEGAL_FORMS = frozenset({
    "inc", "incorporated", "ltd", "limited", "llc", "plc", "corp", "corporation", "co", "gmbh",
    "ag", "sa", "nv", "bv", "llp", "pty", "spa", "srl", "oyj", "ab", "kk",
})


def key_words(name: str) -> list[str]:
    """The name's words, normalized ("&" read as "and"), without trailing legal forms ("& Co"
    with its "and") and a leading "The": one word is always kept, and a country's name keeps its
    suffix ("India Inc" is India's business world, not India)."""
    return list(_name_words(name))


def _name_words(name: str) -> tuple[str, ...]:
    return _key_words(name) if _builds and len(name) <= _NAME_CHARS else _words_of(name)


def _words_of(name: str) -> tuple[str, ...]:
    from canopy.providers.builtin.lexicon import GAZETTEER

    words = normalize_name(name.replace("&", " and ")).split()
    while len(words) > 1 and words[-1] in LEGAL_FORMS:
        if len(words) == 2 and words[0] in GAZETTEER:
            break
        words.pop()
        if len(words) > 1 and words[-1] == "and":  # "JPMorgan Chase & Co"
            words.pop()
    if len(words) > 1 and words[0] == "the":  # "The Project Gutenberg Literary Archive ..."
        words.pop(0)
    return tuple(words)


_key_words = lru_cache(maxsize=_NAME_CACHE)(_words_of)


def entity_key(name: str) -> str:
    """The merge key of an entity name: normalized (`normalize_name`, "&" read as "and"), a
    leading "The" dropped, spaces removed. "Open AI" and "OpenAI" share one, so do "Helio Cells,
    Ltd." and "HELIO CELLS LTD", and "The Beatles" and "Beatles"; "" for a name without letters
    or digits. Idempotent: a key is its own key. A trailing legal form stays ("Helio Cells Ltd"
    is not "Helio Cells" everywhere: "SoftBank Corp" is not the "SoftBank" of SoftBank Group):
    the two are linked in a document that writes both (`fold_key`, canopy.aliases)."""
    words = normalize_name(name.replace("&", " and ")).split()
    if len(words) > 1 and words[0] == "the":
        words.pop(0)
    return "".join(words)


def fold_key(name: str) -> str:
    """`entity_key` without trailing legal forms (`key_words` joined): "Helio Cells Ltd" and
    "Helio Cells" share it, "India Inc" and "India" do not. What a document links by
    (canopy.aliases.document_links)."""
    return "".join(_name_words(name))


def entity_id(name: str) -> str:
    """The id of the entity a name (or merge key) names."""
    return "ent-" + content_hash(entity_key(name))


def relationship_id(source_key: str, target_key: str) -> str:
    """Relationships are undirected for clustering and merging: order the endpoints."""
    a, b = sorted((source_key, target_key))
    return "rel-" + content_hash(a, b)
