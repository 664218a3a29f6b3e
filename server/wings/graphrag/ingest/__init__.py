"""`import_graphrag`: a Microsoft GraphRAG output folder turned into a Canopy index.

The import is a full Canopy build of the documents folder in which GraphRAG's work is replayed
instead of asked for again (`ingest.replay`): Canopy chunks the documents itself, lays GraphRAG's
units and extractions onto its own units (`ingest.align`), merges them into entities and
relationships, starts the hierarchy from GraphRAG's communities
(canopy.indexer.operations.clustering.GivenCommunities) and takes GraphRAG's report for each
community placed with exactly GraphRAG's members. GraphRAG's claims (covariates.parquet, when its
claim extraction ran) are imported whatever `[extract] claims` says, like its entities: that setting
says whether Canopy's provider is asked for claims, and a unit it re-extracts later gets that
provider's. The result is an ordinary index: `canopy index` keeps it current (changed documents
re-extracted by the configured provider, unchanged ones kept), and `canopy serve` / `query` answer
from it. GraphRAG's vectors are not read: Canopy embeds with its own embedder, keyed by content
hash.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

from canopy.errors import CanopyError
from canopy.ids import entity_id
from canopy.indexer.listing import list_files
from canopy.indexer.loaders import LoadedDocument, load_entry
from canopy.indexer.operations.clustering import GivenCommunities
from canopy.indexer.pipeline import IndexResult, Labeler, run_index
from canopy.indexer.stages import Progress
from canopy.model import Skip
from canopy.providers.base import Embedder, Provider
from canopy.server.wings.graphrag.ingest.align import Alignment, align
from canopy.server.wings.graphrag.ingest.replay import ReplayProvider, ReplayStats, community_key
from canopy.server.wings.graphrag.ingest.tables import GROutput, NotGraphRAGOutput, read_output
from canopy.settings import Settings
from canopy.store import Store
from canopy.tokenizer import get_tokenizer

__all__ = ["ImportResult", "NotGraphRAGOutput", "import_graphrag", "read_output"]


@dataclass
class ImportResult:
    """What an import took from GraphRAG and what the configured provider did instead."""

    source: str
    documents_matched: int
    documents_left_out: list[str]  # GraphRAG documents no file of the folder matches
    documents_new: int  # files GraphRAG did not have (extracted by the configured provider)
    graphrag_units: int
    graphrag_units_located: int
    graphrag_units_identical: int  # GraphRAG units equal to a Canopy unit's text
    graphrag_claims: int  # rows of covariates.parquet (0 without it)
    claims_placed: int  # given to a Canopy unit (GraphRAG's duplicates in one unit merge)
    claims_left_out: int  # unit not found or not replayed, or subject not an imported entity
    canopy_units: int
    replay: ReplayStats
    communities_given: int
    communities_kept: int  # placed with exactly GraphRAG's members
    index: IndexResult = field(repr=False)

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in asdict(self).items() if k not in ("index", "replay")}
        out["replay"] = asdict(self.replay)
        out["generation"] = self.index.generation
        out["stats"] = {k: v for k, v in self.index.stats.items() if k not in ("seconds",
                                                                                "peak_mb")}
        return out


def _given(out: GROutput) -> GivenCommunities:
    """GraphRAG's communities as placements of Canopy entity ids, parents first."""
    ids = {e.id: entity_id(e.title) for e in out.entities}
    known = {c.community for c in out.communities}
    placements = []
    for c in sorted(out.communities, key=lambda c: (c.level, c.community)):
        parent = c.parent if c.parent in known else None
        members = sorted({ids[e] for e in c.entity_ids if e in ids})
        placements.append((c.level, community_key(c.community),
                           community_key(parent) if parent is not None else None, members))
    return GivenCommunities(placements)


def _load(docs_dir: Path, settings: Settings, index_dir: Path) -> list[LoadedDocument]:
    loaded = []
    for entry in list_files(docs_dir, settings.input, index_dir, Counter()):
        if isinstance(entry, Skip):
            continue
        got = load_entry(entry, settings.input)
        if isinstance(got, LoadedDocument):
            loaded.append(got)
    return loaded


async def import_graphrag(
    out: GROutput,
    source: Path,
    docs_dir: Path,
    store: Store,
    settings: Settings,
    provider: Provider,
    embedder: Embedder,
    *,
    labeler: Labeler = lambda path: (),
    progress: Progress | None = None,
) -> ImportResult:
    """Build the index of `docs_dir` in `store` (which must hold none yet) from GraphRAG's
    output `out`, read from `source` by `read_output` (see the module docstring)."""
    if store.generation:
        raise CanopyError(f"{store.index_dir} already holds an index: import into a new index "
                          "folder (--index-dir) or remove this one first")
    loaded = _load(docs_dir, settings, store.index_dir)
    c = settings.chunking
    aligned: Alignment = align(out, loaded, get_tokenizer(c.encoding),
                               max_tokens=c.chunk_tokens, overlap=c.overlap_tokens)
    if not aligned.documents:
        raise CanopyError(f"none of GraphRAG's {len(out.documents)} documents is in {docs_dir} "
                          "(matched by path under GraphRAG's input folder, file name or text)")
    given = _given(out)
    replay = ReplayProvider(provider, aligned.extractions, out, given)
    result = await run_index(docs_dir, store, settings, cast(Provider, replay), embedder,
                             labeler=labeler, full=True, progress=progress, given=given)
    store.set_meta({"imported_from": f"graphrag:{Path(source).resolve()}"})
    return ImportResult(
        source=str(Path(source).resolve()),
        documents_matched=len(aligned.documents),
        documents_left_out=aligned.left_out_documents,
        documents_new=len(loaded) - len(aligned.documents),
        graphrag_units=len(out.units),
        graphrag_units_located=aligned.units_located,
        graphrag_units_identical=aligned.units_identical,
        graphrag_claims=len(out.claims),
        claims_placed=aligned.claims_placed,
        claims_left_out=aligned.claims_left_out,
        canopy_units=result.stats.get("text_units", 0),
        replay=replay.stats,
        communities_given=len(given.placements),
        communities_kept=len(given.ids),
        index=result,
    )
