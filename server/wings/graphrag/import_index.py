"""A new index of a workspace from a Microsoft GraphRAG output folder, under the writer lock:
what `canopy import-graphrag` runs (the import itself is `canopy.server.wings.graphrag.ingest`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from canopy.allocator import limit_arenas
from canopy.errors import ConfigError
from canopy.health import DB_NAME
from canopy.indexer.index_writer import writer_lock
from canopy.indexer.pipeline import Progress
from canopy.providers import make_embedder, make_provider
from canopy.server.runtime import Workspace
from canopy.server.wings.graphrag.ingest import ImportResult, import_graphrag, read_output
from canopy.store import Store

__all__ = ["import_graphrag_index"]


def import_graphrag_index(ws: Workspace, output_dir: Path, *,
                          progress: Progress | None = None) -> ImportResult:
    """A new index of the workspace's documents from GraphRAG's `output_dir`. The folder is
    checked before anything is written; an existing index is never overwritten."""
    out = read_output(output_dir)
    limit_arenas()
    with writer_lock(ws.index_dir):
        if (ws.index_dir / DB_NAME).exists():
            raise ConfigError(f"{ws.index_dir} already holds an index: import into a new index "
                              "folder (--index-dir) or remove this one first")
        store = Store(ws.index_dir)
        try:
            provider = make_provider(ws.settings, store)
            embedder = make_embedder(ws.settings)
            return asyncio.run(import_graphrag(out, output_dir, ws.docs_dir, store, ws.settings,
                                               provider, embedder, labeler=ws.policy.labels_checked,
                                               progress=progress))
        finally:
            store.close()
