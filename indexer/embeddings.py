"""Embed text units, entity descriptions and reports; sync the LanceDB tables (design §3.7).

Vectors are keyed by (embedder name, content hash), stored in SQLite, so unchanged text is never
re-embedded and the LanceDB tables can always be rebuilt from the store.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from canopy.ids import content_hash
from canopy.model import Document, TextUnit
from canopy.providers.base import Embedder
from canopy.store import Graph, Store
from canopy.vectors import VectorRow, VectorStore, acl_class

__all__ = ["EmbedResult", "artifact_texts", "embed_artifacts"]


@dataclass
class EmbedResult:
    embedded: int
    versions: dict[str, int]


@dataclass(frozen=True)
class _Item:
    table: str
    id: str
    text: str
    unit_ids: tuple[str, ...]
    level: int = -1


def artifact_texts(units: dict[str, TextUnit], docs: dict[str, Document], graph: Graph) -> list[_Item]:
    """What each searchable artifact is indexed by. Units carry their document's header (title and
    front-matter metadata), which measurably helps retrieval of news-like corpora."""
    items = [_Item("text_units", u.id, f"{docs[u.document_id].header()}\n{u.text}", (u.id,))
             for u in units.values()]
    items += [_Item("entities", e.id, f"{e.name}: {e.description}", e.text_unit_ids) for e in graph.entities.values()]
    items += [_Item("reports", r.community_id, r.full_text(), r.text_unit_ids, r.level) for r in graph.reports.values()]
    return items


async def embed_artifacts(
    store: Store,
    embedder: Embedder,
    docs: dict[str, Document],
    units: dict[str, TextUnit],
    graph: Graph,
    *,
    progress: Callable[[str, int], Callable[[int], None]],
    batch: int = 256,
) -> EmbedResult:
    items = artifact_texts(units, docs, graph)
    keys = {it: content_hash(embedder.name, it.text, length=32) for it in items}
    cached = store.embeddings_get(sorted(set(keys.values())))
    missing = sorted({keys[it]: it.text for it in items if keys[it] not in cached}.items())
    advance = progress("embed", len(missing))
    for i in range(0, len(missing), batch):
        part = missing[i : i + batch]
        vecs = await embedder.embed([t for _, t in part])
        new = {k: v.astype(np.float32).tobytes() for (k, _), v in zip(part, vecs, strict=True)}
        store.embeddings_put(new)
        cached.update(new)
        advance(len(part))

    unit_acl = {u.id: acl_class(docs[u.document_id].labels) for u in units.values()}
    # Endpoint embedders learn their width from the first reply; cached vectors tell it too.
    dims = embedder.dims or (len(next(iter(cached.values()))) // 4 if cached else 0)
    vs = VectorStore(store.index_dir, dims)
    versions: dict[str, int] = {}
    for table in ("text_units", "entities", "reports"):
        mine = [it for it in items if it.table == table]
        acl = {it: tuple(sorted({unit_acl[u] for u in it.unit_ids if u in unit_acl})) for it in mine}
        # The row hash covers the ACL classes too: a relabelled unit rewrites its rows, no re-embedding.
        row_hash = {it: content_hash(keys[it], *acl[it], str(it.level)) for it in mine}
        wanted = {it.id: row_hash[it] for it in mine}
        have = vs.existing_hashes(table)
        rows = [
            VectorRow(it.id, it.text, row_hash[it], np.frombuffer(cached[keys[it]], dtype=np.float32), it.unit_ids,
                      acl[it], it.level)
            for it in mine if have.get(it.id) != row_hash[it]
        ]
        versions[table] = vs.sync(table, wanted, rows)
    return EmbedResult(len(missing), versions)
