"""The corpus's text units, and a deterministic sample of them, for the commands that look at a
corpus before building it (`canopy index --estimate`, `canopy prompts tune`).

The sample is chosen by a hash of the units' ids (content hashes): spread over the documents,
the same on every run, and stable when unrelated documents are added."""

from __future__ import annotations

from canopy.ids import content_hash
from canopy.indexer.forecast import sample_key
from canopy.indexer.loaders import LoadedDocument, scan_folder
from canopy.indexer.operations.chunking import chunk_document
from canopy.model import TextUnit
from canopy.server.runtime import Workspace
from canopy.tokenizer import get_tokenizer

__all__ = ["corpus_units", "spread_sample"]


def corpus_units(ws: Workspace) -> tuple[list[LoadedDocument], list[TextUnit]]:
    """The readable documents of the workspace and their text units, chunked as the index
    would chunk them (nothing is written)."""
    settings = ws.settings
    tok = get_tokenizer(settings.chunking.encoding)
    docs = [d for d in scan_folder(ws.docs_dir, settings.input, ws.index_dir)
            if isinstance(d, LoadedDocument)]
    # Ids as a first build gives them (canopy.indexer.stages.documents: a new path's document
    # id), so the sample is the units a build's projection is made from.
    units = [u for d in docs for u in chunk_document(
        "doc-" + content_hash(d.path), d.text, tok, max_tokens=settings.chunking.chunk_tokens,
        overlap=settings.chunking.overlap_tokens)]
    return docs, units


def spread_sample(units: list[TextUnit], n: int) -> list[TextUnit]:
    """`n` (at least one) of `units`, by a hash of their ids: the units a build's projection is
    made from (canopy.indexer.forecast)."""
    return sorted(units, key=lambda u: sample_key(u.id))[:max(1, n)]
