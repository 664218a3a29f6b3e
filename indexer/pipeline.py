"""`run_index`: the whole pipeline, planned as a diff against the committed generation (design §3-4).

Reads top to bottom as the paper's pipeline: scan -> chunk -> extract -> merge -> summarize ->
communities -> reports -> embed -> commit. Each stage only does work for what changed:
unchanged documents keep their units, stored extractions are reused, summaries and reports of
unchanged elements come from the response cache / by fingerprint, and unchanged texts are never
re-embedded. The commit is one SQLite transaction; LanceDB versions are recorded with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from canopy.errors import EndpointUnavailable, ProviderError
from canopy.ids import content_hash, text_hash
from canopy.model import Document, Entity, Extraction, Relationship, Skip, TextUnit, UnitFailure
from canopy.providers.base import Provider
from canopy.settings import Settings
from canopy.store import Graph, Store
from canopy.tokens import get_tokenizer
from canopy.vectors import VectorStore
from indexer.chunking import chunk_document
from indexer.communities import build_communities, refresh_communities
from canopy.providers.base import Embedder
from indexer.embeddings import embed_artifacts
from indexer.graph import merge_extractions, summarize_descriptions
from indexer.loaders import LoadedDocument, scan_folder
from indexer.reports import community_fingerprints, generate_reports

__all__ = ["IndexResult", "ProgressFactory", "run_index"]

log = logging.getLogger(__name__)

# progress(stage, total) -> advance(n); the CLI passes tqdm bars, library callers may pass None.
ProgressFactory = Callable[[str, int], Callable[[int], None]]
Labeler = Callable[[str], tuple[str, ...]]


@dataclass
class IndexResult:
    generation: int
    elapsed_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, dict[str, int]] = field(default_factory=dict)
    skips: list[Skip] = field(default_factory=list)
    failures: list[UnitFailure] = field(default_factory=list)


def _noop_progress(stage: str, total: int) -> Callable[[int], None]:
    return lambda n: None


def plan_documents(
    loaded: list[LoadedDocument], previous: dict[str, Document], labeler: Labeler
) -> tuple[dict[str, Document], dict[str, str]]:
    """Documents of this scan with stable ids, and their texts by id.

    A path seen before keeps its id; a new path whose content equals a vanished document's keeps
    that document's id (a rename: its units, extractions and reports carry over untouched)."""
    by_path = {d.path: d for d in previous.values()}
    seen_paths = {d.path for d in loaded}
    vanished = {d.content_hash: d for d in previous.values() if d.path not in seen_paths}
    docs: dict[str, Document] = {}
    texts: dict[str, str] = {}
    for ld in loaded:
        h = text_hash(ld.text)
        old = by_path.get(ld.path) or vanished.pop(h, None)
        doc_id = old.id if old is not None else "doc-" + content_hash(ld.path)
        while doc_id in docs:  # a renamed file's old path reused by another file
            doc_id = "doc-" + content_hash(doc_id, ld.path)
        docs[doc_id] = Document(doc_id, ld.path, h, ld.title, len(ld.text), labeler(ld.path), ld.metadata)
        texts[doc_id] = ld.text
    return docs, texts


def settings_fingerprint(settings: Settings, provider: Provider, embedder: Embedder) -> str:
    """What the index content depends on besides the documents: a change forces a real run."""
    sections = [settings.chunking, settings.extract, settings.communities, settings.reports, settings.acl]
    return content_hash(provider.name, embedder.name, *(s.model_dump_json() for s in sections))


def _noop_stats(store: Store) -> dict[str, Any]:
    counts = {t: store.count(t) for t in ("documents", "text_units", "entities", "relationships", "claims",
                                          "communities", "reports")}
    return {**counts, "noop": True, "documents_rechunked": 0, "skipped": len(store.skips()), "units_extracted": 0,
            "units_failed": 0, "reports_generated": 0, "reports_reused": counts["reports"], "embedded": 0,
            "communities_by_level": store.communities_by_level()}


def _same_graph(previous: Graph, entities: dict[str, Entity], relationships: dict[str, Relationship]) -> bool:
    """True when clustering input is unchanged: same entities, same weighted edges."""
    def edges(rels: dict[str, Relationship]) -> set[tuple[str, float]]:
        return {(r.id, r.weight) for r in rels.values()}

    return set(previous.entities) == set(entities) and edges(previous.relationships) == edges(relationships)


async def run_index(
    docs_dir: Path,
    store: Store,
    settings: Settings,
    provider: Provider,
    embedder: Embedder,
    *,
    labeler: Labeler = lambda path: (),
    full: bool = False,
    progress: ProgressFactory | None = None,
) -> IndexResult:
    t0 = time.perf_counter()
    progress = progress or _noop_progress
    tok = get_tokenizer(settings.chunking.encoding)
    # 1. scan + plan documents
    scanned = list(scan_folder(docs_dir, settings.input, store.index_dir))
    loaded = [d for d in scanned if isinstance(d, LoadedDocument)]
    skips = [s for s in scanned if isinstance(s, Skip)]
    prev_docs = store.documents()
    docs, texts = plan_documents(loaded, prev_docs, labeler)
    fingerprint = settings_fingerprint(settings, provider, embedder)
    if (not full and store.generation > 0 and docs == prev_docs and not store.failures()
            and store.get_meta("revoking") != "1"
            and store.get_meta("settings_fingerprint") == fingerprint and skips == store.skips()):
        # Nothing to do: same documents, labels and settings, no failed units to retry, and the
        # last update finished (a revocation commit alone leaves regeneration to resume).
        return IndexResult(store.generation, time.perf_counter() - t0, _noop_stats(store), {}, skips, [])
    run_id = store.start_run()

    # 2. chunk changed documents; unchanged ones keep their units
    prev_units = store.text_units()
    units_by_doc: dict[str, list[TextUnit]] = {}
    for u in prev_units.values():
        units_by_doc.setdefault(u.document_id, []).append(u)
    units: dict[str, TextUnit] = {}
    rechunked = 0
    for doc_id, doc in docs.items():
        old = prev_docs.get(doc_id)
        if not full and old is not None and old.content_hash == doc.content_hash and doc_id in units_by_doc:
            units.update({u.id: u for u in units_by_doc[doc_id]})
        else:
            rechunked += 1
            for u in chunk_document(doc_id, texts[doc_id], tok, max_tokens=settings.chunking.chunk_tokens,
                                    overlap=settings.chunking.overlap_tokens):
                units[u.id] = u

    # 2b. revoke at once: removed units and relabelled documents take effect for readers now,
    #     before any regeneration (design §2: deletion is revocation; stale is never served).
    removed = sorted(set(prev_units) - set(units))
    relabelled = any(prev_docs[d].labels != doc.labels for d, doc in docs.items() if d in prev_docs)
    if (removed or relabelled) and store.generation > 0:
        versions = VectorStore(store.index_dir, 0).delete_derived_from(removed) if removed else {}
        old_versions = json.loads(store.get_meta("lance_versions", "{}") or "{}")
        store.commit_generation(
            documents=docs, units={k: v for k, v in prev_units.items() if k in units}, graph=store.graph(),
            failures=store.failures(), skips=skips, keep_extractions=set(units),
            meta={"lance_versions": json.dumps({**old_versions, **versions}), "revoking": "1"},
        )

    # 3. extract units that have no stored extraction
    stored = {} if full else store.extractions()
    todo = sorted((u for uid, u in units.items() if uid not in stored), key=lambda u: u.id)
    failures: list[UnitFailure] = []
    extractions = {uid: ex for uid, ex in stored.items() if uid in units}
    advance = progress("extract", len(todo))
    sem = asyncio.Semaphore(settings.llm.concurrency if settings.llm.enabled else 4)

    async def extract(u: TextUnit) -> None:
        try:
            async with sem:
                ex = await provider.extract(u, entity_types=settings.extract.entity_types,
                                            claims=settings.extract.claims, max_gleanings=settings.extract.max_gleanings)
        except EndpointUnavailable:
            raise  # the whole run stops with a clear error; nothing is committed, saved work is kept
        except ProviderError as exc:  # invalid output after repair, or a request the endpoint refused
            failures.append(UnitFailure(u.id, "extract", str(exc)[:300]))
        else:
            store.save_extraction(ex)  # saved at once: a crash later never loses this LLM work
            extractions[u.id] = ex
        advance(1)

    await asyncio.gather(*(extract(u) for u in todo))

    # 4. merge + summarize
    merged = merge_extractions(extractions, order={uid: text_hash(units[uid].text) for uid in extractions})
    advance = progress("summarize", len(merged.pending))
    merged = await summarize_descriptions(merged, provider, tok, max_tokens=settings.extract.summary_max_tokens,
                                          memo=store, concurrency=settings.llm.concurrency, on_done=lambda: advance(1))

    # 5. communities (stable ids against the previous generation) + fingerprints
    previous = store.graph()
    if not full and previous.communities and _same_graph(previous, merged.entities, merged.relationships):
        communities = refresh_communities(previous.communities, merged.entities, merged.relationships)
    else:
        communities = build_communities(
            merged.entities, merged.relationships, max_cluster_size=settings.communities.max_cluster_size,
            seed=settings.communities.seed, max_levels=settings.communities.max_levels,
            previous=None if full else previous.communities,
            modularity_drift=settings.communities.modularity_drift,
        )
    communities = community_fingerprints(communities, merged.entities, merged.relationships, merged.claims)

    # 6. reports, bottom-up; unchanged fingerprints reuse the previous report
    advance = progress("reports", len(communities))
    built = await generate_reports(
        communities, merged.entities, merged.relationships, merged.claims,
        {} if full else previous.reports, provider, tok,
        max_context_tokens=settings.reports.max_context_tokens,
        max_report_tokens=settings.reports.max_report_tokens,
        concurrency=settings.llm.concurrency, on_done=lambda: advance(1),
    )
    failures += built.failures
    graph = Graph(merged.entities, merged.relationships, merged.claims, communities, built.reports)

    # 7. embeddings (content-hash keyed) + vector tables
    emb = await embed_artifacts(store, embedder, docs, units, graph, progress=progress)

    # 8. commit one generation
    levels = Counter(c.level for c in communities.values())
    stats = {
        "documents": len(docs), "documents_rechunked": rechunked, "skipped": len(skips),
        "text_units": len(units), "units_extracted": len(todo) - sum(1 for f in failures if f.task == "extract"),
        "units_failed": sum(1 for f in failures if f.task == "extract"),
        "entities": len(graph.entities), "relationships": len(graph.relationships), "claims": len(graph.claims),
        "communities": len(communities), "communities_by_level": {str(k): v for k, v in sorted(levels.items())},
        "reports": len(graph.reports), "reports_generated": built.generated, "reports_reused": built.reused,
        "embedded": emb.embedded,
    }
    load = provider.concurrency()  # what the LLM client's adaptive window achieved
    if load is not None:
        stats["llm_concurrency"] = load.as_dict()
    usage = {task: u.as_dict() for task, u in sorted(provider.usage().items())}
    gen = store.commit_generation(
        documents=docs, units=units, graph=graph, failures=failures, skips=skips,
        meta={"provider": provider.name, "embedder": embedder.name, "lance_versions": json.dumps(emb.versions),
              "docs_dir": str(docs_dir.resolve()), "revoking": "0", "settings_fingerprint": fingerprint},
        run_id=run_id, stats=stats, usage=usage,
    )
    return IndexResult(gen, time.perf_counter() - t0, stats, usage, skips, failures)

