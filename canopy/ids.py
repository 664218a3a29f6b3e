"""Content-hash identifiers with a type prefix: re-indexing identical content is a no-op."""

from __future__ import annotations

import hashlib
import re
import unicodedata

__all__ = ["content_hash", "entity_id", "normalize_name", "relationship_id", "text_hash", "unit_id"]


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


def normalize_name(name: str) -> str:
    """Merge key for entity names: NFKC, casefold, punctuation and whitespace collapsed.

    "Helio Cells, Ltd." and "HELIO CELLS LTD" merge; "李明" stays "李明"."""
    s = unicodedata.normalize("NFKC", name).casefold()
    s = _PUNCT.sub(" ", s)
    return " ".join(s.split())


def entity_id(name: str) -> str:
    return "ent-" + content_hash(normalize_name(name))


def relationship_id(source_key: str, target_key: str) -> str:
    """Relationships are undirected for clustering and merging: order the endpoints."""
    a, b = sorted((source_key, target_key))
    return "rel-" + content_hash(a, b)
