"""One committed generation of the index, loaded for serving.

The server keeps the graph in memory (a 600-article corpus is a few MB) and reloads when a new
generation commits; LanceDB tables are checked out at the versions recorded with the generation,
so readers never see a half-applied update.
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from canopy.model import Community, Document, Entity, TextUnit
from canopy.store import Graph, Store
from canopy.vectors import VectorStore
from canopy.providers.base import Embedder

__all__ = ["IndexView", "ViewCache"]


@dataclass
class IndexView:
    generation: int
    documents: dict[str, Document]
    units: dict[str, TextUnit]
    graph: Graph
    vectors: VectorStore
    embedder: Embedder
    provider_name: str
    entity_by_name: dict[str, str] = field(default_factory=dict)  # normalized name -> entity id
    communities_of: dict[str, list[str]] = field(default_factory=dict)  # entity id -> community ids, deepest first

    @classmethod
    def load(cls, store: Store, embedder: Embedder) -> IndexView:
        from canopy.ids import normalize_name

        with store.snapshot():
            generation = store.generation
            documents = store.documents()
            units = store.text_units()
            graph = store.graph()
            versions = json.loads(store.get_meta("lance_versions", "{}") or "{}")
            provider = store.get_meta("provider", "none") or "none"
        dims = embedder.dims or 0
        vectors = VectorStore(store.index_dir, dims)
        vectors.checkout(versions)
        view = cls(generation, documents, units, graph, vectors, embedder, provider)
        view.entity_by_name = {normalize_name(e.name): e.id for e in graph.entities.values()}
        by_entity: dict[str, list[Community]] = defaultdict(list)
        for c in graph.communities.values():
            for e in c.entity_ids:
                by_entity[e].append(c)
        view.communities_of = {e: [c.id for c in sorted(cs, key=lambda c: -c.level)] for e, cs in by_entity.items()}
        return view

    def document_of(self, unit_id: str) -> Document | None:
        u = self.units.get(unit_id)
        return self.documents.get(u.document_id) if u else None

    def entity(self, entity_id: str) -> Entity | None:
        return self.graph.entities.get(entity_id)

    async def embed_query(self, text: str) -> np.ndarray:
        return (await self.embedder.embed([text]))[0]


class ViewCache:
    """The current IndexView, reloaded when the store's generation moves on."""

    def __init__(self, store: Store, embedder: Embedder) -> None:
        self.store = store
        self.embedder = embedder
        self._view: IndexView | None = None
        self._lock = threading.Lock()

    def get(self) -> IndexView:
        with self._lock:
            gen = self.store.generation
            if self._view is None or self._view.generation != gen:
                self._view = IndexView.load(self.store, self.embedder)
            return self._view
