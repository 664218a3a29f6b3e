"""Text analysis for the builtin provider and the lexical index: words, stems, stop words,
sentences, CJK detection and segmentation. Pure functions, deterministic, no network; jieba is
loaded lazily and only for text that contains CJK characters.
"""

from __future__ import annotations

import logging
import re
from functools import lru_cache
from types import ModuleType

from canopy.providers.builtin import lexicon as lx

__all__ = [
    "has_cjk",
    "lexical_terms",
    "load_jieba",
    "split_sentences",
    "terms",
    "trim",
]

_CJK_CLASS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK = re.compile(f"[{_CJK_CLASS}]")
_CJK_RUN = re.compile(f"[{_CJK_CLASS}]+")


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


# ---- index terms ----------------------------------------------------------------------------

_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be been but by for from had has have he her his i if in into is it its me my "
    "not of on or our she so that the their them then there these they this to was we were what when "
    "where which who whom why will with would you your do does did can could should about after before "
    "than also more most other some such only own same very just over under again further once here".split()
)


@lru_cache(maxsize=200_000)
def _index_stem(w: str) -> str:
    for suf in ("ingly", "edly", "ing", "ies", "ied", "es", "ed", "ly", "s"):
        if len(w) > len(suf) + 3 and w.endswith(suf):
            return w[: -len(suf)] + ("y" if suf in ("ies", "ied") else "")
    return w


@lru_cache(maxsize=200_000)
def _word_terms(w: str) -> tuple[str, ...]:
    """The terms of one lower-cased word (memoized: a corpus has far fewer distinct words)."""
    if _CJK.search(w):
        chars = [c for c in w if _CJK.match(c)]
        return tuple(a + b for a, b in zip(chars, chars[1:], strict=False)) or tuple(chars)
    if w in _STOP or len(w) <= 1:
        return ()
    return (_index_stem(w),)


def lexical_terms(text: str) -> list[str]:
    """Lower-cased, stemmed content words; CJK runs become character bigrams."""
    out: list[str] = []
    for w in _WORD.findall(text.lower()):
        out += _word_terms(w)
    return out


# ---- relevance terms ------------------------------------------------------------------------

_LAT_WORD = re.compile(r"[a-z0-9à-öø-ÿ]+(?:['’][a-z]+)?")


def _stem(w: str) -> str:
    if w.endswith(("'s", "’s")):
        w = w[:-2]
    if len(w) > 5 and w.endswith("ing"):
        return w[:-3]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith("es") and (w[-3] in "sxz" or w[-4:-2] in ("ch", "sh")):
        return w[:-2]
    if len(w) > 4 and w.endswith("ed"):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


def terms(text: str) -> list[str]:
    """Search terms of `text`, in order (repeats kept)."""
    low = text.lower()
    out = [_stem(w) for w in _LAT_WORD.findall(low)
           if w not in lx.STOPWORDS and (len(w) > 1 or w.isdigit())]
    if has_cjk(low):
        cut = load_jieba().cut
        for run in _CJK_RUN.findall(low):
            out += [w for w in cut(run) if len(w) > 1 and w not in lx.STOPWORDS_ZH]
    return out


def stem(w: str) -> str:
    """The stem `terms` gives a lower-cased word."""
    return _stem(w)


# ---- sentences ------------------------------------------------------------------------------

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


def _split_block(block: str) -> list[str]:
    out: list[str] = []
    start = 0
    for m in _BOUND.finditer(block):
        lat = m.group("lat")
        if lat and lat[0] == ".":
            w = _LAST_WORD.search(block, max(0, m.start() - 16), m.start())
            word = w.group(1).lower() if w else ""
            if word in lx.ABBREVIATIONS or (len(word) == 1 and w and w.group(1).isupper()):
                continue
        s = block[start : m.end()].strip()
        if s:
            out.append(s)
        start = m.end()
    tail = block[start:].strip()
    if tail:
        out.append(tail)
    return out


def split_sentences(text: str) -> list[str]:
    """Sentences of `text`, markdown markers removed, whitespace collapsed (Latin and CJK)."""
    out: list[str] = []
    for para in _PARA.split(text):
        for block in _blocks(para):
            cleaned = _clean(block)
            if cleaned and _HAS_TEXT.search(cleaned):
                out.extend(_split_block(cleaned))
    return out
