"""Documents and text units: what the scan found, diffed against the committed generation.

`plan_documents` decides, per path, whether a document is new, changed, renamed, relabelled,
unchanged or gone; `stage_documents` chunks what changed and stages documents, units and the
lexical statistics of units (BM25 over what each caller may read; server/engines/evidence.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from canopy.ids import content_hash, text_hash
from canopy.indexer.loaders import LoadedDocument
from canopy.indexer.operations.chunking import chunk_document
from canopy.indexer.stages.build import Build
from canopy.model import Document, TextUnit
from canopy.providers.builtin.text import has_cjk, lexical_terms, sentence_terms
from canopy.store import DocumentRow, UnitRow

__all__ = ["DocumentPlan", "UnitChange", "plan_documents", "stage_documents", "unit_terms"]

Labeler = Callable[[str], tuple[str, ...]]
AclClass = Callable[[tuple[str, ...]], int]
# (document as loaded, its file's mtime_ns) -> (ISO date, source): canopy.indexer.doc_time
Dater = Callable[[LoadedDocument, int], tuple[str, str]]


@dataclass
class DocumentPlan:
    documents: dict[str, DocumentRow]  # every document of the new generation, by id
    texts: dict[str, str]  # the text of every document the scan read
    changed: set[str] = field(default_factory=set)  # new, or its content changed
    moved: set[str] = field(default_factory=set)  # same content; path, title or metadata changed
    # committed documents whose stored access is not the policy's (edited or not)
    relabelled: set[str] = field(default_factory=set)
    removed: set[str] = field(default_factory=set)  # committed documents that are gone
    touched: set[str] = field(default_factory=set)  # same content, new size/mtime on disk

    @property
    def unchanged(self) -> bool:
        return not (self.changed or self.moved or self.relabelled or self.removed)


def plan_documents(loaded: Iterable[LoadedDocument], previous: dict[str, DocumentRow],
                   labeler: Labeler, acl_class: AclClass, *,
                   stats: dict[str, tuple[int, int]] | None = None,
                   unchanged: Iterable[str] = (),
                   misfiled: Iterable[str] = (),
                   dater: Dater | None = None) -> DocumentPlan:
    """The new generation's documents with stable ids, and what changed.

    `loaded` are the documents the scan read; `unchanged` the paths it did not read because
    their size and modification time are the committed ones (their rows carry over); `stats`
    the (size, mtime_ns) of every file. A path seen before keeps its id; a new path whose
    content equals a vanished document's keeps that document's id (a rename: its units,
    extractions and reports carry over untouched).

    A document that keeps its id is relabelled whenever what is stored of its access differs
    from what the policy gives it now: other labels, another class, or a unit of another class
    than the document (`misfiled`, GraphReads.misfiled_documents), whether or not its content
    changed too. Relabels commit first (revocation), for every committed unit of the document,
    so the units an edit keeps never keep the old class (issue 30, finding 1).

    `dater` gives each document read its time; one not read keeps its committed time."""
    stats = stats or {}
    by_path = {r.document.path: r for r in previous.values()}
    loaded = list(loaded)
    kept = [by_path[p] for p in unchanged if p in by_path]
    seen_paths = {d.path for d in loaded} | {r.document.path for r in kept}
    vanished = {r.document.content_hash: r for r in previous.values()
                if r.document.path not in seen_paths}
    misfiled = set(misfiled)
    plan = DocumentPlan({}, {})

    def relabel(old: DocumentRow, new: DocumentRow) -> bool:
        return (old.document.labels != new.document.labels or old.acl != new.acl
                or old.document.id in misfiled)

    old: DocumentRow | None
    for old in kept:
        labels = labeler(old.document.path)
        doc = replace(old.document, labels=labels)
        plan.documents[doc.id] = DocumentRow(doc, acl_class(labels), old.size, old.mtime_ns)
        if relabel(old, plan.documents[doc.id]):
            plan.relabelled.add(doc.id)
    for ld in loaded:
        h = text_hash(ld.text)
        old = by_path.get(ld.path) or vanished.pop(h, None)
        doc_id = old.document.id if old is not None else "doc-" + content_hash(ld.path)
        while doc_id in plan.documents:  # a renamed file's old path reused by another file
            doc_id = "doc-" + content_hash(doc_id, ld.path)
        labels = labeler(ld.path)
        size, mtime = stats.get(ld.path, (0, 0))
        when, source = dater(ld, mtime) if dater is not None else ("", "")
        doc = Document(doc_id, ld.path, h, ld.title, len(ld.text), labels, ld.metadata, when,
                       source)
        plan.documents[doc_id] = DocumentRow(doc, acl_class(labels), size, mtime)
        plan.texts[doc_id] = ld.text
        same_id = old is not None and old.document.id == doc_id
        if old is not None and same_id and relabel(old, plan.documents[doc_id]):
            plan.relabelled.add(doc_id)  # its committed units too, edited or not
        if old is None or not same_id or old.document.content_hash != h:
            plan.changed.add(doc_id)
            continue
        if (old.document.path, old.document.title, old.document.metadata) != (
                doc.path, doc.title, doc.metadata):
            plan.moved.add(doc_id)
        elif (old.size, old.mtime_ns) != (size, mtime):
            plan.touched.add(doc_id)  # same content, new file times: remember them
    plan.removed = set(previous) - set(plan.documents)
    return plan


def unit_terms(doc: Document, unit: TextUnit) -> list[str]:
    """The lexical terms a unit is searched by: its document's header (title, front-matter
    metadata) and its text."""
    return lexical_terms(f"{doc.header()}\n{unit.text}")


@dataclass
class UnitChange:
    added: list[str]  # units that are new in this generation
    removed: list[str]  # committed units that are not in it
    relabelled: list[str]  # committed units restaged with their document's new ACL class
    retouched: list[str]  # committed units searched by other text or labels (header, ACL)


class _TermCounts:
    """Deltas of the lexical statistics: document frequency per (term, ACL class), and units and
    summed terms per class."""

    def __init__(self) -> None:
        self.df: Counter[tuple[str, int]] = Counter()
        self.stats: dict[int, list[int]] = {}

    def count(self, doc: Document, unit: TextUnit, acl: int, sign: int) -> int:
        terms = unit_terms(doc, unit)
        for t in set(terms):
            self.df[(t, acl)] += sign
        s = self.stats.setdefault(acl, [0, 0])
        s[0] += sign
        s[1] += sign * len(terms)
        return len(terms)

    def flush(self, b: Build) -> None:
        b.staging.add_counts(dict(self.df), {a: (s[0], s[1]) for a, s in self.stats.items()})
        self.df.clear()
        self.stats.clear()


def stage_documents(b: Build, plan: DocumentPlan) -> UnitChange:
    """Stage the documents and units of the new generation (every one in a full build) and
    the deltas of the lexical statistics, a batch of documents at a time."""
    committed = b.committed
    staged_docs = set(plan.documents) if b.full else (
        plan.changed | plan.moved | plan.relabelled | plan.touched)
    b.staging.put("documents", [plan.documents[d].values() for d in sorted(staged_docs)])
    b.staging.delete("documents", plan.removed)
    chunked = sorted(set(plan.documents) if b.full else plan.changed)
    touched = [] if b.full else sorted(plan.changed | plan.moved)
    old_docs = committed.documents(touched)
    old_units = committed.units_of_documents(touched)
    chunk = b.settings.chunking
    counts = _TermCounts()
    added: list[str] = []
    removed: list[str] = []
    reheadered: list[UnitRow] = []
    for start in range(0, len(chunked), 200):
        rows: list[UnitRow] = []
        for doc_id in chunked[start:start + 200]:
            new = plan.documents[doc_id]
            before = {u.unit.id: u for u in old_units.get(doc_id, [])}
            kept = set()
            for u in chunk_document(doc_id, plan.texts[doc_id], b.tok,
                                    max_tokens=chunk.chunk_tokens, overlap=chunk.overlap_tokens):
                if u.id in before:
                    kept.add(u.id)
                    continue
                n_terms = counts.count(new.document, u, new.acl, 1)
                rows.append(UnitRow(u, new.acl, text_hash(u.text), n_terms,
                                    sentence_terms(u.text)))
                if not b.counters.cjk and has_cjk(u.text):
                    b.counters.cjk = True
            for uid, row in before.items():
                if uid not in kept:
                    removed.append(uid)
                    counts.count(old_docs[doc_id].document, row.unit, row.acl, -1)
        b.staging.put("text_units", [r.values() for r in rows])
        added += [r.unit.id for r in rows]
    gone = set(removed)
    for doc_id in touched:  # kept units of a document whose header (title, metadata) changed
        old, new = old_docs.get(doc_id), plan.documents[doc_id]
        if old is None or old.document.header() == new.document.header():
            continue
        for row in old_units.get(doc_id, []):
            if row.unit.id in gone:
                continue
            counts.count(old.document, row.unit, row.acl, -1)
            n_terms = counts.count(new.document, row.unit, new.acl, 1)
            reheadered.append(UnitRow(row.unit, new.acl, row.sort_key, n_terms,
                                      row.sentence_terms or sentence_terms(row.unit.text)))
    b.staging.put("text_units", [r.values() for r in reheadered])
    b.staging.delete("text_units", removed)
    relabelled = [] if b.full else sorted(set(_restage_relabelled(
        b, plan, counts, skip=gone | {r.unit.id for r in reheadered} | set(added))) | {
        r.unit.id for r in reheadered if r.unit.document_id in plan.relabelled})
    counts.flush(b)
    retouched = sorted({r.unit.id for r in reheadered} | set(relabelled))
    return UnitChange(added, sorted(removed), relabelled, retouched)


def _restage_relabelled(b: Build, plan: DocumentPlan, counts: _TermCounts, *,
                        skip: set[str]) -> list[str]:
    """Stage every committed unit of the relabelled documents (but those in `skip`: gone, or
    staged already) with its document's new class: the generation's units and their search
    rows (which the revocation dropped) then all carry it. The revocation moved the lexical
    statistics of these units already; a unit still of another class is moved here."""
    out: list[str] = []
    relabelled = sorted(plan.relabelled)
    for start in range(0, len(relabelled), 200):
        batch = relabelled[start:start + 200]
        docs = b.committed.documents(batch)
        rows: list[UnitRow] = []
        for doc_id, units in b.committed.units_of_documents(batch).items():
            new = plan.documents[doc_id]
            for row in units:
                if row.unit.id in skip:
                    continue
                n_terms = row.n_terms
                if row.acl != new.acl:
                    counts.count(docs[doc_id].document, row.unit, row.acl, -1)
                    n_terms = counts.count(new.document, row.unit, new.acl, 1)
                rows.append(replace(row, acl=new.acl, n_terms=n_terms,
                                    sentence_terms=row.sentence_terms
                                    or sentence_terms(row.unit.text)))
        b.staging.put("text_units", [r.values() for r in rows])
        out += [r.unit.id for r in rows]
    return sorted(out)
