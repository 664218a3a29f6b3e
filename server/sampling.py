"""The corpus's text units, and a deterministic sample of them, for the commands that look at a
corpus before building it (`canopy index --estimate`, `canopy prompts tune`).

The sample is chosen by a hash of the units' ids (content hashes): spread over the documents,
the same on every run, and stable when unrelated documents are added."""

from __future__ import annotations

import hashlib

from canopy.indexer.chunking import chunk_document
from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.model import TextUnit
from canopy.server.runtime import Workspace
from canopy.tokens import get_tokenizer

__all__ = ["corpus_units", "spread_sample"]


def corpus_units(ws: Workspace) -> tuple[list[LoadedDocument], list[TextUnit]]:
    """The readable documents of the workspace and their text units, chunked as the index
    would chunk them (nothing is written)."""
    settings = ws.settings
    tok = get_tokenizer(settings.chunking.encoding)
    docs = [d for d in scan_folder(ws.docs_dir, settings.input, ws.index_dir)
            if isinstance(d, LoadedDocument)]
    units = [u for d in docs for u in chunk_document(
        d.path, d.text, tok, max_tokens=settings.chunking.chunk_tokens,
        overlap=settings.chunking.overlap_tokens)]
    return docs, units


def spread_sample(units: list[TextUnit], n: int) -> list[TextUnit]:
    """`n` (at least one) of `units`, by a hash of their ids."""
    return sorted(units, key=lambda u: hashlib.sha256(u.id.encode("utf-8")).hexdigest())[:max(1, n)]
