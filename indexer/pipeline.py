"""`run_index`: the whole pipeline, planned as a diff against the committed generation
(design §3-4).

Reads top to bottom as the paper's pipeline: scan -> chunk -> extract -> merge -> summarize ->
communities -> reports -> embed -> commit. Each stage (indexer/stages/) works on what changed
plus a bounded neighbourhood, reading everything else from the store on demand: an update costs
what the change costs, and a full build streams in batches. Deletions and relabels are committed
first, at once (revocation); everything else becomes visible in one atomic commit at the end.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import astuple, dataclass, field
from pathlib import Path
from typing import Any

from canopy.allocator import release_free
from canopy.endpoint import preload_sdk
from canopy.ids import KEYS_VERSION, content_hash
from canopy.indexer.doc_time import document_time
from canopy.indexer.forecast import PlanSink
from canopy.indexer.listing import list_files
from canopy.indexer.loaders import LoadedDocument, load_entry
from canopy.indexer.operations.clustering import GivenCommunities
from canopy.indexer.stages import Build, Progress
from canopy.indexer.stages.build import no_progress
from canopy.indexer.stages.communities import stage_communities
from canopy.indexer.stages.community_index import stage_community_index
from canopy.indexer.stages.documents import DocumentPlan, plan_documents, stage_documents
from canopy.indexer.stages.graph import stage_graph
from canopy.indexer.stages.instances import extract_units
from canopy.indexer.stages.reports import stage_reports
from canopy.indexer.stages.resolve import stage_resolve
from canopy.indexer.stages.revocation import pending_relabelled, pending_revoked, revoke
from canopy.indexer.stages.vectors import (
    EmbeddingsAhead,
    SearchRows,
    VectorOutcome,
    embeds_remotely,
    retrain_noted,
    tidy_search_tables,
)
from canopy.lance import import_lancedb
from canopy.model import Skip, UnitFailure
from canopy.providers.base import INDEX_TASKS, Embedder, Provider, prompt_key
from canopy.providers.builtin.text import TERMS_VERSION
from canopy.settings import Settings
from canopy.store import CommitInfo, GraphReads, Staging, Store
from canopy.tokenizer import get_tokenizer
from canopy.vectors import merge_scrub

__all__ = ["IndexResult", "Progress", "run_index", "settings_fingerprint"]

log = logging.getLogger(__name__)

Labeler = Any  # Callable[[str], tuple[str, ...]]


@dataclass
class IndexResult:
    generation: int
    elapsed_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    usage: dict[str, dict[str, Any]] = field(default_factory=dict)
    skips: list[Skip] = field(default_factory=list)
    failures: list[UnitFailure] = field(default_factory=list)
    # what a full build did about a damaged index (canopy.server.runtime)
    recovered: str | None = None


def settings_fingerprint(settings: Settings, provider: Provider, embedder: Embedder) -> str:
    """What the index content depends on besides the documents: a change rebuilds it. The
    lexical statistics depend on how text is analysed into terms, whatever the provider.
    Replaced index-time templates (`[prompts] dir`) count too; what they did not change is
    reused on the rebuild (stored extractions, the response cache, reports by fingerprint)."""
    sections = [settings.chunking, settings.extract, settings.communities, settings.reports,
                settings.time]
    version = getattr(provider, "extraction_version", None)
    prompts = prompt_key(provider, *INDEX_TASKS)
    return content_hash(provider.name, embedder.name, f"terms-{TERMS_VERSION}",
                        f"keys-{KEYS_VERSION}", *(s.model_dump_json() for s in sections),
                        *([version] if version else []), *([prompts] if prompts else []))


def extraction_fingerprint(settings: Settings, provider: Provider) -> str:
    """What stored extractions depend on: a change extracts every unit again. A provider whose
    extraction rules change between releases (the builtin one) names their version; the merge
    keys of names (canopy.ids.normalize_name) have theirs; replaced extraction or gleaning
    templates change it too."""
    version = getattr(provider, "extraction_version", None)
    prompts = prompt_key(provider, "extract", "glean", "resolve")
    return content_hash(provider.name, settings.chunking.model_dump_json(),
                        settings.extract.model_dump_json(), f"keys-{KEYS_VERSION}",
                        *([version] if version else []), *([prompts] if prompts else []))


def _peak_mb() -> float:
    """This process's peak resident memory so far, in MB (0 where the platform has no rusage)."""
    try:
        import resource
    except ImportError:  # Windows
        return 0.0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1 << 20) if sys.platform == "darwin" else peak / 1024, 1)


def _counts(reads: GraphReads) -> dict[str, Any]:
    out: dict[str, Any] = {t: reads.count(t) for t in (
        "documents", "text_units", "entities", "relationships", "claims", "communities", "reports")}
    out["communities_by_level"] = reads.communities_by_level()
    return out


@dataclass
class _Scan:
    """The documents folder against the committed generation: what the new one holds."""

    plan: DocumentPlan
    skips: list[Skip]
    ignored_types: str  # files of types that are not indexed, by extension (JSON)
    failures: list[UnitFailure]  # the committed generation's, retried by this run
    idle: bool  # same documents, labels and settings, nothing to retry or finish


def _scan(docs_dir: Path, store: Store, settings: Settings, labeler: Labeler, *, full: bool,
          rebuild_vectors: bool) -> _Scan:
    """Scan the folder and plan its documents against the committed ones; a file whose size and
    modification time are the committed ones is not read again."""
    with store.snapshot() as snap:
        previous = snap.all_documents()
        previous_failures = snap.failures()
        previous_skips = snap.skips()
        revoking = snap.meta("revoking") == "1"
        stale = bool(snap.stale_ids("entities") or snap.stale_ids("communities"))
        misfiled = snap.misfiled_documents()
    # relabelled by a revocation whose regeneration did not commit: restaged by this run
    unfinished = set(pending_relabelled(store))
    on_disk = {r.document.path: (r.size, r.mtime_ns) for r in previous.values()}
    loaded: list[LoadedDocument] = []
    skips: list[Skip] = []
    unchanged: list[str] = []
    file_stats: dict[str, tuple[int, int]] = {}
    ignored: Counter[str] = Counter()  # files of types that are not indexed, by extension
    for entry in list_files(docs_dir, settings.input, store.index_dir, ignored):
        if isinstance(entry, Skip):
            skips.append(entry)
            continue
        file_stats[entry.path] = (entry.size, entry.mtime_ns)
        if not full and on_disk.get(entry.path) == (entry.size, entry.mtime_ns) and entry.mtime_ns:
            unchanged.append(entry.path)
            continue
        got = load_entry(entry, settings.input)
        if isinstance(got, LoadedDocument):
            loaded.append(got)
        else:
            skips.append(got)
    plan = plan_documents(loaded, previous, labeler, lambda labels: store.acl_class(labels),
                          stats=file_stats, unchanged=unchanged, misfiled=misfiled | unfinished,
                          dater=lambda ld, mtime: astuple(document_time(
                              ld.path, ld.metadata, ld.text, mtime, settings.time)))
    if misfiled:
        log.warning("%d documents had text units of another access class than the document's "
                    "(an index written before this release): relabelling them", len(misfiled))
    skips.sort(key=lambda s: s.path)
    idle = (not full and plan.unchanged and not plan.touched and not previous_failures
            and not revoking and not stale and skips == previous_skips and not rebuild_vectors)
    return _Scan(plan, skips, json.dumps(dict(sorted(ignored.items()))), previous_failures, idle)


def _unchanged(store: Store, settings: Settings, scan: _Scan, *, tidy: bool,
               t0: float) -> IndexResult:
    """A run with nothing to do: no generation; the counts are the committed ones."""
    with store.snapshot() as snap:
        counts = _counts(snap)
    stats: dict[str, Any] = {
        **counts, "noop": True, "documents_rechunked": 0, "skipped": len(scan.skips),
        "units_extracted": 0, "units_failed": 0, "reports_generated": 0,
        "reports_reused": counts["reports"], "embedded": 0}
    if store.get_meta("ignored_types") != scan.ignored_types:
        store.set_meta({"ignored_types": scan.ignored_types})
    # Old search-table versions may still hold deleted text: prune them once that is due.
    if tidy:
        tidy_search_tables(store, settings.storage)
    return IndexResult(store.generation, time.perf_counter() - t0, stats, {}, scan.skips, [])


class _Laps:
    """Time and peak memory so far, by stage (in the run's stats)."""

    def __init__(self, t0: float) -> None:
        self.seconds: dict[str, float] = {"plan": round(time.perf_counter() - t0, 3)}
        self.peak_mb: dict[str, float] = {"plan": _peak_mb()}
        self.clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        # What the stage freed goes back to the system before the next one allocates: LanceDB
        # (vectors) allocates on threads of its own, in an arena where the graph stages' free
        # space cannot be reused (1,827 articles: build peak 1,004 -> 886 MB, with
        # the tokenizer's Python vocabulary dropped too, `benchmarks/growth_bench.py --sizes 1827
        # --only build`).
        release_free()
        now = time.perf_counter()
        self.seconds[stage] = round(now - self.clock, 3)
        self.peak_mb[stage] = _peak_mb()
        self.clock = now


async def run_index(
    docs_dir: Path,
    store: Store,
    settings: Settings,
    provider: Provider,
    embedder: Embedder,
    *,
    labeler: Labeler = lambda path: (),
    full: bool = False,
    progress: Progress | None = None,
    tidy: bool = True,
    given: GivenCommunities | None = None,
    on_revoked: Callable[[], None] | None = None,
    on_plan: PlanSink | None = None,
) -> IndexResult:
    """Index `docs_dir` into `store`: one committed generation. `tidy`: tidy the search tables
    after the commit (False leaves it to `canopy.indexer.index_writer.maintain_index`, off the
    update's path: its periodic part rewrites whole fragments, which at 10k articles takes a
    minute). `given`: communities a fresh clustering starts from (the GraphRAG wing's
    import). `on_revoked()` runs right after deletions and relabels commit, before any
    regeneration (a writer that publishes generations publishes that one at once).
    `on_plan` is told what extraction will request and, from its first units, what the rest of
    the build is projected to (canopy.indexer.forecast); only when the provider calls an
    endpoint."""
    t0 = time.perf_counter()
    fingerprint = settings_fingerprint(settings, provider, embedder)
    extraction = extraction_fingerprint(settings, provider)
    # --full or other extraction settings: extract every unit again; a first build (or one a
    # crash interrupted) reuses the extractions already saved.
    reextract = full or store.get_meta("extraction_fingerprint") not in (None, extraction)
    full = full or store.generation == 0 or store.get_meta("settings_fingerprint") != fingerprint
    rebuild_vectors = full or store.get_meta("embedder") != embedder.name

    # 1. scan, and plan the new generation's documents against the committed ones
    scan = _scan(docs_dir, store, settings, labeler, full=full, rebuild_vectors=rebuild_vectors)
    if scan.idle:
        return _unchanged(store, settings, scan, tidy=tidy, t0=t0)
    plan = scan.plan
    run_id = store.start_run()
    store.batch_cache_writes(64)  # the run is the only writer: cache replies in batches
    store.set_meta({"extraction_fingerprint": extraction})
    imports = _ImportsAhead.start(endpoint=settings.llm.enabled or embeds_remotely(embedder))

    # 2. deletions and relabels apply now, before any regeneration (design §2); with the units
    #    an interrupted run deleted (their derived rows go at this run's commit)
    revoked = sorted(set(revoke(store, plan)) | set(pending_revoked(store))) if not full else []
    if on_revoked is not None and not full and (plan.removed or plan.relabelled):
        on_revoked()

    tok = get_tokenizer(settings.chunking.encoding)
    staging = Staging(store, full=full)
    lap = _Laps(t0)
    memo = ExitStack()  # token counts are remembered for this build only
    memo.enter_context(tok.memoizing())
    b = Build(store, staging, settings, provider, embedder, tok, full,
              progress or no_progress, given=given, on_plan=on_plan)
    search_rows: SearchRows | None = None
    try:
        # An endpoint's embeddings are requested as their texts become final, while the chat
        # stages run (the vectors stage then finds them cached): the units' now.
        ahead = EmbeddingsAhead(b, enabled=embeds_remotely(embedder))
        b.ahead = ahead
        memo.callback(ahead.cancel)
        # 3. documents and text units (edit-stable chunking: unchanged units keep their ids)
        units = stage_documents(b, plan)
        ahead.submit("text_units", units.added if not rebuild_vectors
                     else b.reads.keys("text_units"))
        if revoked:  # a deleted document's text restored under the same path has its ids
            live = b.reads.unit_acl(revoked)
            revoked = [u for u in revoked if u not in live]
        lap("documents")
        imports.documents_done()
        # 4. extraction of new units, and retries of units that failed before
        retry = [f.unit_id for f in scan.failures if f.task == "extract"]
        live_retry = list(b.reads.unit_acl(retry)) if retry and not full else []
        todo = list(b.reads.unit_acl(units.added))
        if not reextract:
            todo = sorted(set(todo) - store.extracted(todo)) + live_retry
        extracted = await extract_units(b, todo)
        lap("extract")
        # 5. the keys of the instances of every document with a new, gone or re-extracted unit
        #    (names one unit links to a longer name in another unit of the document)
        resolved = stage_resolve(b, [*units.added, *live_retry], units.removed)
        # 6. entities, relationships and claims touched by the changed or rekeyed units
        # (the deleted documents' units too: their claims go with them)
        changed = [*units.added, *units.removed, *units.relabelled, *revoked, *live_retry,
                   *resolved.units]
        graph = await stage_graph(b, changed, keys=resolved.keys, rids=resolved.rids)
        ahead.submit("entities", graph.entities)  # written: their descriptions are final
        # the search rows of units and entities (final now) are written while the communities
        # and reports are computed, when the embedder runs here (SearchRows)
        search_rows = SearchRows(b, rebuild=rebuild_vectors,
                                 erase=bool(units.removed or revoked or full))
        search_rows.start_early()
        lap("merge")
        # 7. communities: a local update, or a fresh clustering
        hierarchy = stage_communities(b, graph)
        stage_community_index(b, graph, hierarchy)
        lap("communities")
        # 8. fingerprints and reports, bottom-up
        failed_reports = [f.unit_id for f in scan.failures if f.task == "report"]
        reports = await stage_reports(b, graph, hierarchy, failed_reports)
        lap("reports")
        # 9. embeddings and search rows of what changed
        await ahead.drain()
        lap("embed_wait")
        vectors = await search_rows.finish()
        await b.close_workers()
        lap("vectors")
        # 10. one atomic commit
        failures = extracted.failures + reports.failures
        usage = {task: u.as_dict() for task, u in sorted(provider.usage().items())}
        meta = _commit_meta(store, docs_dir, provider, embedder, vectors, fingerprint,
                            scan.ignored_types, hierarchy.meta)
        if b.counters.cjk or full:  # CJK text (the server preloads its segmenter)
            meta["cjk"] = "1" if b.counters.cjk else "0"
        c = b.counters
        c.documents = len(plan.documents)
        c.documents_rechunked = len(plan.changed) if not full else len(plan.documents)
        c.skipped = len(scan.skips)
        c.units_extracted = len(extracted.extracted)
        c.units_failed = sum(1 for f in failures if f.task == "extract")
        c.entities_changed = len(graph.entities) + len(graph.removed_entities)
        c.communities_recomputed = reports.communities
        c.reports_generated, c.reports_reused = reports.generated, reports.reused
        c.embedded = vectors.embedded + ahead.requested  # texts sent to the embedder
        stats: dict[str, Any] = c.as_stats()
        load = provider.concurrency()
        if load is not None:  # the LLM client's achieved concurrency (shown by `canopy status`)
            stats["llm_concurrency"] = load.as_dict()
        stats["seconds"] = lap.seconds
        stats["peak_mb"] = lap.peak_mb
        generation = staging.commit(CommitInfo(meta, failures, scan.skips,
                                               [*units.removed, *revoked], run_id, stats, usage))
        lap("commit")
    finally:
        imports.documents_done()  # a run that failed early leaves no thread waiting
        if search_rows is not None:  # nothing left writing or running behind a failed run
            await search_rows.close()
        await b.close_workers()
        memo.close()
        staging.close()
        store.batch_cache_writes(1)
    # Readers now use the new generation: compact the search tables and, once due, rewrite
    # what still stores erased rows and drop old versions (or leave that to a background
    # tidy: `canopy.indexer.index_writer.maintain_index`); then drop the WAL's old pages.
    if tidy:
        tidy_search_tables(store, settings.storage)
    if (units.removed or revoked or full) and not store.truncate_wal():
        log.info("a reader holds an older snapshot: the WAL is truncated at a later checkpoint")
    lap("tidy")
    with store.snapshot() as snap:
        stats.update(_counts(snap))
    store.finish_run(run_id, stats)
    return IndexResult(generation, time.perf_counter() - t0, stats, usage, scan.skips, failures)


@dataclass
class _ImportsAhead:
    """Libraries a build needs later, imported in a thread (issue 35: the first requests of a
    500 ms endpoint build went out 2.6 s after it started, behind these imports). The
    endpoint's SDK first, while the documents are chunked, since the first extraction request
    needs it; LanceDB (most of 1.5 s of CPU, needed by the vectors stage) once the documents
    stage is done, so that it runs while extraction's first requests wait on the endpoint rather
    than taking turns with the chunking and the client's start on one interpreter lock."""

    _go: threading.Event

    @classmethod
    def start(cls, *, endpoint: bool) -> _ImportsAhead:
        go = threading.Event()
        if "lancedb" in sys.modules and not endpoint:
            go.set()
            return cls(go)

        def run() -> None:
            if endpoint:
                preload_sdk()
            go.wait()
            import_lancedb()

        threading.Thread(target=run, daemon=True, name="canopy-imports").start()
        return cls(go)

    def documents_done(self) -> None:
        self._go.set()


def _commit_meta(store: Store, docs_dir: Path, provider: Provider, embedder: Embedder,
                 vectors: VectorOutcome, fingerprint: str, ignored_types: str,
                 hierarchy_meta: dict[str, str]) -> dict[str, str]:
    """The meta the new generation commits with: what it was built by and from, its search
    tables' versions, and the community guard's aggregates; the revocation marks cleared."""
    return {
        "provider": provider.name,
        "embedder": embedder.name,
        "lance_versions": json.dumps(vectors.versions),
        "lance_scrub": merge_scrub(store.get_meta("lance_scrub"), vectors.scrub),
        "lance_retrain": json.dumps(sorted(set(retrain_noted(store)) | vectors.retrain)),
        "lance_changed_at": str(time.time()),
        "lance_appended": str(int(store.get_meta("lance_appended", "0") or 0)
                              + vectors.written),
        "docs_dir": str(Path(docs_dir).resolve()),
        "revoking": "0",
        "revoked_units": "[]",
        "relabelled_documents": "[]",
        "rekeyed": "",
        "settings_fingerprint": fingerprint,
        "ignored_types": ignored_types,
        **hierarchy_meta,
    }
