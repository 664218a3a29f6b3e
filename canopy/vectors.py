"""LanceDB tables for vector and full-text (BM25) retrieval: derived data, rebuilt from SQLite
(the same thing at two depths: canopy.indexer.stages.vectors is the stage that writes them).

Three tables - `text_units`, `entities`, `reports` - share one schema. Each row carries the ACL
classes of the units it derives from, so retrieval *prefilters* by what a caller may read before
ranking (design §5): scores, counts and top-k never reflect hidden rows.

Writes are diffs (rows of changed artifacts deleted and added); rows appended since the last
index optimization are searched by a flat scan until `tidy` folds them into the full-text
index, which happens when they pass a share of the table. Every committed generation records
the table versions it was written with; readers check out exactly those (`reading`), and a
writer first rolls the tables back to the committed versions (`restore`), so a crashed update
leaves nothing behind that a later one could duplicate.

Deleted rows stay in Lance's data files (marked deleted) and in every older version until the
files are rewritten and the versions pruned. `tidy`, run after a commit (by the writer, or in
the background: `canopy.indexer.index_writer.tidy_index`), does both: it rewrites the fragments that
still store rows deleted because text left the index (writers note them: `scrub`, meta
`lance_scrub`) and prunes old versions, so deleted text leaves the disk within about two grace
periods (design §2, issue "Safety" case 10). A writer that only adds or re-derives rows from
text that is still indexed (`erase=False`) notes nothing: what its deletions leave in the
files is derived from live text, and rewriting every fragment an entity update touched would
make each small addition cost a rewrite of the whole table.
A reader holds the versions it started with for one request, so a version is pruned only once
it has not been committed for the grace period: each change of the committed versions is
recorded with its time (`superseded`, meta `lance_history`), and `floor` gives, per table, the
oldest version committed within the grace period; nothing from it on is pruned. A grace
period of 0 prunes all but the latest version at once (for indexes nobody reads meanwhile).

A table that is missing, or cannot be opened or searched, raises `IndexDamaged`: a reader must
never mistake a lost table for an empty one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from canopy.errors import IndexDamaged
from canopy.health import write_failure

if TYPE_CHECKING:
    import pyarrow as pa

# lancedb and pyarrow are imported where tables are opened: importing them takes seconds, and
# commands that never touch the search tables (status, token, the HTTP supervisor) skip that.

__all__ = ["FOLD_CHECK_ROWS", "METADATA_CACHE_MAX", "TABLES", "Hit", "VectorReader", "VectorRow",
           "VectorStore", "floor", "load_scrub", "merge_scrub", "metadata_cache_bytes", "rrf",
           "superseded"]

log = logging.getLogger(__name__)
TABLES = ("text_units", "entities", "reports")
_RRF_K = 60
_WORD = re.compile(r"\w+", re.UNICODE)  # FTS query syntax characters are dropped, words kept
# Unindexed rows are scanned flat: fold them into the FTS index past this share of the table.
_UNINDEXED_SHARE = 0.1
_UNINDEXED_MIN = 2000
# Rows added since the last tidy after which one opens the tables to see if a fold is due.
FOLD_CHECK_ROWS = _UNINDEXED_MIN
_SCRUB_BATCH = 20_000  # rows per batch when a table is rewritten
# Longer than an optimization takes before it prunes (about 7 s for 70,000 rows here).
_PRUNE_MARGIN = timedelta(minutes=5)
# A table this large gets an IVF vector index; below it a flat scan is fast enough (a flat scan
# of 380,000 rows x 384 dims takes about a second).
VECTOR_INDEX_MIN = 20_000
# The index stores 8-bit scalar-quantized vectors (IVF_SQ), a quarter of IVF_FLAT's bytes. A
# server's LanceDB cache ([query] cache_mb) holds a fraction of it at 10,000 articles, so a
# search reads its probed partitions anew: with the IVF_FLAT index of a 10,000-article growth
# index that was ~100 MB and 40 ms of CPU per entity search, half of it page faults, a third
# of a local_search's CPU.
# Partitions of about this many rows: LanceDB's index optimization (the tidy's) joins
# partitions far smaller than its target, so sqrt(rows) partitions (193 of 195 rows for 37,579
# text units) fell to 2 after one optimization and every search compared every row.
_PARTITION_ROWS = 2000
# Probe this share of the partitions, at least _MIN_PROBES (LanceDB's default). At 10,000
# articles, after an update's optimization (benchmarks/vector_index_bench.py), recall of an
# entity search's exact top 20 rose from 0.71 at 49 ms of CPU to 0.95 at 33 ms with the builtin
# hashing vectors, and from 0.90 at 77 ms to 0.99 at 28 ms with WordLlama's; probing a fifth
# gave 0.66 with WordLlama's. Hashing vectors spread evenly over the partitions, so what a
# search reads grows with the table.
_PROBE_SHARE = 0.6
_MIN_PROBES = 20
# The probed rows' quantized distances choose this many times k rows, which their exact
# distances then rank: quantization alone lost 14% of the exact top 20 of hashing vectors.
_REFINE = 5
# A table this many times larger than when its index was trained gets it trained anew (by
# the tidy): rows added later only join the partitions they are nearest to.
_RETRAIN_GROWTH = 4
_INDEX_NAME = re.compile(r"vector_sq_r(\d+)$")


# LanceDB's metadata cache keeps each version's manifest and deletion files, and nothing evicts
# a version's once readers have moved on: under `serve --watch` it filled with retired
# versions (~0.15 MB a generation at 100 articles, an edit every 3 s: ~1 MB/min for 25 minutes
# at a quarter of the default budget; benchmarks/soak.py). What one generation reads of it is
# far smaller, so it gets at most this much, reached within minutes and then held; the index
# cache (index pages: what searches reread) gets the rest of the budget.
METADATA_CACHE_MAX = 8 << 20


def metadata_cache_bytes(cache_bytes: int) -> int:
    """What of a server's LanceDB cache budget goes to table metadata (the rest: index pages)."""
    return min(cache_bytes // 4, METADATA_CACHE_MAX)


def _vector_index_name(rows: int) -> str:
    """The name records the rows it was trained on (`trained_rows`)."""
    return f"vector_sq_r{rows}"


def trained_rows(index_name: str) -> int | None:
    """Rows a vector index named by `_vector_index_name` was trained on; None for another
    index (one written before IVF_SQ, which the tidy replaces)."""
    m = _INDEX_NAME.match(index_name)
    return int(m.group(1)) if m else None


def _vector_index_names(indices: Iterable[Any]) -> list[str]:
    """Names of the indexes on the `vector` column, from a table's `list_indices()`."""
    return [i.name for i in indices if tuple(i.columns) == ("vector",)]


def probes(rows: int) -> int:
    """Partitions a search probes in an index of `rows` rows."""
    return max(_MIN_PROBES, math.ceil(_PROBE_SHARE * rows / _PARTITION_ROWS))


@dataclass(frozen=True)
class VectorRow:
    id: str
    text: str  # what is embedded and full-text indexed
    hash: str  # content hash of the row (text, model, ACL classes)
    vector: np.ndarray
    acl: tuple[int, ...]  # ACL classes of the units the row derives from
    level: int = -1


@dataclass(frozen=True)
class Hit:
    id: str
    score: float


def _schema(dims: int) -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        ("id", pa.string()), ("text", pa.string()), ("hash", pa.string()),
        ("vector", pa.list_(pa.float32(), dims)), ("acl", pa.list_(pa.int32())),
        ("level", pa.int32()),
    ])


def rrf(*rankings: list[str], k: int = _RRF_K, weights: list[float] | None = None) -> list[Hit]:
    """Reciprocal rank fusion of several ranked id lists (ties broken by id); `weights` scale
    each ranking's contribution (default 1 each)."""
    scores: dict[str, float] = {}
    for i, ranking in enumerate(rankings):
        w = 1.0 if weights is None else weights[i]
        for rank, rid in enumerate(ranking):
            scores[rid] = scores.get(rid, 0.0) + w / (k + rank + 1)
    return [Hit(i, s) for i, s in sorted(scores.items(), key=lambda kv: (-kv[1], kv[0]))]


def superseded(history: str | None, old: dict[str, int], now: float) -> str:
    """`history` (JSON) with the versions `old` recorded as committed until `now`."""
    entries = json.loads(history or "[]")
    return json.dumps([*entries, [now, old]])


def floor(history: str | None, current: dict[str, int], now: float, keep: float
          ) -> tuple[dict[str, int], str]:
    """Per table, the oldest version committed within the last `keep` seconds (readers may
    hold it), and the history without entries older than that."""
    entries = [e for e in json.loads(history or "[]") if e[0] > now - keep]
    out = dict(current)
    for _, versions in entries:
        for name, version in versions.items():
            out[name] = min(out.get(name, version), int(version))
    return out, json.dumps(entries)


def merge_scrub(recorded: str | None, new: dict[str, set[int]]) -> str:
    """Meta `lance_scrub` (fragments with deleted rows, per table) with `new` added."""
    out = load_scrub(recorded)
    for name, frags in new.items():
        out.setdefault(name, set()).update(frags)
    return json.dumps({name: sorted(frags) for name, frags in sorted(out.items()) if frags})


def load_scrub(recorded: str | None) -> dict[str, set[int]]:
    return {name: set(frags) for name, frags in json.loads(recorded or "{}").items()}


def _deleted_rows(history: list[dict[str, Any]]) -> int:
    """Rows the latest version's files store but marks deleted."""
    return int(history[-1]["metadata"].get("total_deletion_file_rows", 0) or 0)


def _quote(values: Iterable[str]) -> str:
    return ", ".join("'" + v.replace("'", "''") + "'" for v in values)


class VectorStore:
    """The LanceDB tables of one index folder (the writer's side, and readers' factory)."""

    def __init__(self, index_dir: Path, dims: int, *, cache_bytes: int | None = None,
                 erase: bool = True) -> None:
        """`cache_bytes`: what LanceDB may keep of index and table metadata in memory (its
        defaults allow gigabytes); None keeps its defaults (one-off index runs). `erase`: the
        rows this writer deletes may hold text that left the index (a deleted or edited
        document, a revocation), so `tidy` must rewrite the fragments storing them."""
        self.path = Path(index_dir) / "lance"
        self.dims = dims
        self.erase = erase
        from canopy.lance import import_lancedb

        lancedb = import_lancedb()

        session = None
        if cache_bytes is not None:
            metadata = metadata_cache_bytes(cache_bytes)
            session = lancedb.Session(index_cache_size_bytes=cache_bytes - metadata,
                                      metadata_cache_size_bytes=metadata)
        self.session = session
        self._db = lancedb.connect(str(self.path), session=session)
        self._local = threading.local()
        self._sets: weakref.WeakSet[_TableSet] = weakref.WeakSet()  # every thread's (diagnostics)
        self._clearing: set[str] = set()
        # Per table, the fragments this writer deleted rows from (a row address is the
        # fragment id in its high 32 bits, the offset in the low ones).
        self.scrub: dict[str, set[int]] = {}
        self.written = 0  # rows added: what `tidy` may have to fold into the indexes
        self._written_lock = threading.Lock()
        self.retrain: set[str] = set()  # tables whose vector index `tidy` must train anew

    def _table(self, name: str) -> Any | None:
        if name in self._db.list_tables().tables:
            return self._db.open_table(name)
        return None

    def _committed(self, name: str, version: int) -> Any:
        """Table `name` checked out at `version`, or IndexDamaged (a committed table that is
        missing must not read as an empty one)."""
        try:
            t = self._table(name)
            if t is not None:
                t.checkout(version)
        except Exception as exc:  # lancedb raises RuntimeError/ValueError/OSError with paths
            log.info("search table %s cannot be opened at version %d: %s", name, version, exc)
            raise (write_failure(exc, self.path.parent) or IndexDamaged(
                "a search table cannot be opened at its committed version")) from None
        if t is None:
            log.info("search table %s is missing from %s", name, self.path)
            raise IndexDamaged("a search table is missing")
        return t

    # ---- writing --------------------------------------------------------------------------

    def restore(self, versions: dict[str, int], *, missing_ok: bool = False) -> None:
        """Roll each table back to the version its committed generation recorded (tables the
        generation does not know are dropped): what a crashed update wrote is undone. A
        recorded table that is missing raises IndexDamaged unless `missing_ok` (a rebuild,
        which writes every table anew); one that cannot be restored always does."""
        for name in TABLES:
            version = versions.get(name)
            if version is None:
                # (dropped by name, not opened: a creation a full disk stopped leaves a table
                # LanceDB lists but cannot open)
                if name in self._db.list_tables().tables:
                    self._db.drop_table(name)
                continue
            t = self._table(name)
            if t is None:
                if missing_ok:
                    continue
                raise IndexDamaged("a search table is missing")
            if t.version != version:
                try:
                    t.restore(version)
                except Exception as exc:  # restoring writes a manifest: a full disk is no damage
                    log.info("search table %s cannot be restored to version %d: %s",
                                name, version, exc)
                    raise (write_failure(exc, self.path.parent) or IndexDamaged(
                        "a search table cannot be opened at its committed version")) from None

    def clear(self) -> None:
        """Empty every table before this writer's first write to it (a full rebuild). Rows are
        deleted rather than tables dropped, so readers of the committed versions carry on; a
        table whose vectors have another width (another embedder) is dropped."""
        self._clearing = set(TABLES)

    def _clear(self, name: str, t: Any) -> Any:
        self._clearing.discard(name)
        width = t.schema.field("vector").type.list_size if t is not None else None
        if t is not None and width == self.dims:
            t.delete("true")
            return t
        if t is not None:
            self._db.drop_table(name)
        return self._db.create_table(name, schema=_schema(self.dims)) if self.dims else None

    def write(self, name: str, delete: Iterable[str], rows: list[VectorRow]) -> None:
        """Delete rows with these ids, then add `rows` (ids of changed rows appear in both)."""
        t = self._table(name)
        if name in self._clearing:
            t = self._clear(name, t)
        if t is None:
            if not rows or not self.dims:
                return
            t = self._db.create_table(name, schema=_schema(self.dims))
        ids = sorted(set(delete))
        for i in range(0, len(ids), 500):
            where = f"id IN ({_quote(ids[i:i + 500])})"
            if self.erase:
                # Note the fragments that will hold deleted rows: `tidy` rewrites only those.
                found = t.search().where(where).with_row_id(True).select(["id"]).limit(None)
                self.scrub.setdefault(name, set()).update(
                    int(r) >> 32 for r in found.to_arrow()["_rowid"].to_pylist())
            t.delete(where)
        import pyarrow as pa

        with self._written_lock:  # tables are written from several threads (stage_vectors)
            self.written += len(rows)
        for i in range(0, len(rows), 5000):
            t.add(pa.Table.from_pylist([
                {"id": r.id, "text": r.text, "hash": r.hash, "vector": r.vector.astype(np.float32),
                 "acl": list(r.acl), "level": r.level} for r in rows[i:i + 5000]
            ], schema=_schema(self.dims)))

    def maintain(self, name: str) -> None:
        """Create the table's full-text index (and, once the table is large, a vector index).
        Folding appended rows into them is `tidy`'s, after the commit: an optimization prunes
        versions, which must never happen to a committed version."""
        t = self._table(name)
        if t is None:
            return
        rows = t.count_rows()
        listed = t.list_indices()
        if not any(tuple(i.columns) == ("text",) for i in listed) and rows:
            t.create_fts_index("text", replace=True)
        vector = _vector_index_names(listed)
        if rows < VECTOR_INDEX_MIN:
            return
        if not vector:
            self._train_vector_index(t, rows, [])
        elif self._vector_index_stale(vector, rows):
            # Not now: in the middle of a run the table holds this run's small fragments, and
            # LanceDB samples training rows by offset, which then costs ~2 ms a row (691 s for
            # 397,514 entities). `tidy` replaces it once it has compacted the table.
            self.retrain.add(name)

    @staticmethod
    def _vector_index_stale(names: list[str], rows: int) -> bool:
        """A vector index not named by `_vector_index_name` (IVF_FLAT, written before IVF_SQ),
        several of them, or one trained on a small share of today's rows."""
        trained = [trained_rows(n) for n in names]
        if len(trained) != 1 or trained[0] is None:
            return True
        return rows > _RETRAIN_GROWTH * trained[0]

    @staticmethod
    def _train_vector_index(t: Any, rows: int, replaced: list[str]) -> None:
        from lancedb.index import IvfSq

        name = _vector_index_name(rows)
        t.create_index("vector", config=IvfSq(distance_type="l2",
                                              target_partition_size=_PARTITION_ROWS),
                       name=name, replace=True)
        for old in replaced:  # searches of this version use the new index only
            if old != name:
                t.drop_index(old)

    def tidy(self, committed: dict[str, int], keep_from: dict[str, int] | None, *, due: bool,
             record: Callable[[dict[str, int], str], None],
             scrub: dict[str, set[int]] | None = None,
             should_stop: Callable[[], bool] | None = None,
             retrain: Iterable[str] = ()) -> dict[str, int]:
        """After a commit (each table at its committed version, the latest): fold appended rows
        into the indexes once they pass a share of a table, and when `due` also rewrite the
        fragments noted as storing erased rows (`scrub`: per table; None, from an index older
        than the notes: every table storing deleted rows is rewritten whole) and prune old
        versions: those before `keep_from` (per table, the oldest version readers may hold:
        `floor`, which includes the committed one), or, with None, every version but the
        latest. Tables are done one at a time; `record(versions, name)` commits each table's
        new version (same rows) as soon as it is done, and `should_stop()` (checked between
        tables and rewrite batches) ends the work early: a writer is waiting. What a stopped
        table wrote was never recorded, and the next writer rolls it back. Returns the
        committed versions. The tables in `retrain` (noted by `maintain`) get their vector
        index trained anew once compacted, if it is still stale.

        Lance prunes by age, measured when its pruning step runs (after compaction): versions
        created up to `_PRUNE_MARGIN` before `keep_from` are kept too, so the committed version
        survives a crash before `record`. With None it does not (nobody reads concurrently)."""
        final = dict(committed)
        stop = should_stop or (lambda: False)
        for name, version in sorted(committed.items()):
            if stop():
                break
            t = self._table(name)
            if t is None or t.version != version:
                continue  # the writer restores committed versions before it writes
            history = t.list_versions()
            stored_deleted = _deleted_rows(history)
            oldest = version if keep_from is None else min(keep_from.get(name, version), version)
            prunable = any(v["version"] < oldest for v in history)
            fragments = None if scrub is None else sorted(scrub.get(name, ()))
            erase = due and stored_deleted and (fragments is None or fragments)
            if not (self._fold_due(t) or erase or (due and prunable) or name in retrain):
                continue
            if erase and not self._rewrite(t, version, fragments, stop):
                break
            with warnings.catch_warnings():
                # lancedb warns that age 0 breaks readers of older versions: the caller said
                # there are none ([storage] keep_versions_s = 0 documents it).
                warnings.filterwarnings("ignore", message=r"optimize\(cleanup_older_than=0\)")
                t.optimize(cleanup_older_than=self._keep_age(history, oldest, keep_from),
                           delete_unverified=True)
            if name in retrain and not stop():
                vector = _vector_index_names(t.list_indices())
                rows = t.count_rows()
                if self._vector_index_stale(vector, rows):
                    self._train_vector_index(t, rows, vector)
            log.debug("search table %s tidied: version %d", name, t.version)
            final[name] = int(t.version)
            record(dict(final), name)
        return final

    @staticmethod
    def _keep_age(history: list[dict[str, Any]], oldest: int,
                  keep_from: dict[str, int] | None) -> timedelta:
        """The age below which versions are kept: that of version `oldest`, plus the margin."""
        if keep_from is None:
            return timedelta(0)
        created = min((v["timestamp"] for v in history if v["version"] >= oldest),
                      default=datetime.now())  # list_versions gives naive local times
        return datetime.now() - created + _PRUNE_MARGIN

    @staticmethod
    def _fold_due(t: Any) -> bool:
        unindexed = max((i.num_unindexed_rows or 0 for i in t.list_indices()), default=0)
        return unindexed > max(_UNINDEXED_MIN, _UNINDEXED_SHARE * t.count_rows())

    def _rewrite(self, t: Any, version: int, fragments: list[int] | None,
                 stop: Callable[[], bool]) -> bool:
        """Write the live rows of these fragments of `t` (all with None; at `version`) into new
        files and delete the old rows: a fragment whose rows are all deleted leaves the table,
        and its files leave with the old versions. The work is the size of the fragments.
        Batches are read from the committed version, which the prune keeps. False when `stop`
        ended it (the table then holds unrecorded versions, which the next writer undoes)."""
        where = None if fragments is None else " OR ".join(
            f"(_rowid >= {f << 32} AND _rowid < {(f + 1) << 32})" for f in fragments)
        source = self._db.open_table(t.name)
        source.checkout(version)
        t.delete(where or "true")
        query = source.search().limit(None).select(list(source.schema.names))
        if where:
            query = query.where(where)
        for batch in query.to_batches(_SCRUB_BATCH):
            if stop():
                return False
            if batch.num_rows:
                t.add(batch)
        return True

    def versions(self) -> dict[str, int]:
        """The tables' current versions (tables still waiting to be cleared are cleared)."""
        for name in sorted(self._clearing):
            self._clear(name, self._table(name))
        out = {}
        for name in TABLES:
            t = self._table(name)
            if t is not None:
                out[name] = int(t.version)
        return out

    # ---- reading --------------------------------------------------------------------------

    @contextmanager
    def reading(self, versions: dict[str, int]) -> Iterator[VectorReader]:
        """A reader of the tables at these versions (one generation) while the block runs.
        The calls of one thread that read one generation share a reader (several calls run on
        a thread's event loop at once); a call of another generation gets table objects of its
        own, and an idle set is moved to its versions rather than opened anew: a table opened
        for every generation left native memory behind in a long-running server
        (benchmarks/soak.py)."""
        key = tuple(sorted(versions.items()))
        sets: list[_TableSet] = getattr(self._local, "sets", None) or []
        self._local.sets = sets
        held = next((s for s in sets if s.key == key), None)
        if held is None:
            idle = next((s for s in sets if not s.users), None)
            if idle is not None:
                sets.remove(idle)  # its table objects move on to these versions
            tables = self._moved(idle.reader.tables if idle else {}, versions)
            held = _TableSet(key, VectorReader(tables, self.path, self.session))
            sets.append(held)
            self._sets.add(held)
        held.users += 1
        try:
            yield held.reader
        finally:
            held.users -= 1
            if not held.users and sum(not s.users for s in sets) > 1:
                sets.remove(held)  # one idle set per thread is enough to move

    def held_sets(self) -> dict[str, int]:
        """Readers' table sets alive over every thread: how many, at how many distinct
        generations' versions, and the calls reading through them."""
        sets = list(self._sets)
        return {"sets": len(sets), "generations": len({s.key for s in sets}),
                "users": sum(s.users for s in sets)}

    def reader(self, versions: dict[str, int]) -> VectorReader:
        """This thread's reader of the tables at these versions, for one-off use (warming,
        tests): it stays at them until this thread reads another generation."""
        with self.reading(versions) as reader:
            return reader

    def _moved(self, held: dict[str, Any], versions: dict[str, int]) -> dict[str, Any]:
        """Tables at `versions`: those of `held` checked out there where they can be (a version
        below an object's means the table was replaced: it is opened anew), others opened."""
        tables = {}
        for name, version in versions.items():
            t = held.get(name)
            if t is not None:
                try:
                    if int(t.version) > version:
                        t = None
                    elif int(t.version) != version:
                        t.checkout(version)
                except Exception as exc:  # the files of the object's version are gone
                    log.debug("search table %s reopened: %s", name, exc)
                    t = None
            tables[name] = t if t is not None else self._committed(name, version)
        return tables

    def warm(self, versions: dict[str, int]) -> None:
        """Load what every search reads first (index headers, the full-text dictionary, vector
        partition centroids) into the cache, with one small query of each kind per table. A fresh
        server's first search otherwise reads them itself: 0.6 s of a 1 s first query at 10,000
        articles (benchmarks/growth_bench.py). Runs on its own thread; failures are left for
        the searches to report."""
        try:
            reader = self.reader(versions)
            for name, t in reader.tables.items():
                width = t.schema.field("vector").type.list_size
                asyncio.run(reader.search(name, vector=np.zeros(width, dtype=np.float32),
                                          text="the", k=1))
        except Exception as exc:  # IndexDamaged or a table replaced meanwhile
            log.debug("search tables not warmed: %s", exc)


@dataclass(eq=False)  # identity: sets are removed from lists, and kept in a WeakSet
class _TableSet:
    """A reader of one thread's table objects checked out at one generation's versions, and
    how many of the thread's calls are reading through it."""

    key: tuple[tuple[str, int], ...]
    reader: VectorReader
    users: int = 0


class VectorReader:
    """Hybrid search over tables checked out at one generation's versions."""

    def __init__(self, tables: dict[str, Any], path: Path | None = None,
                 session: Any = None) -> None:
        """`tables`: LanceDB's synchronous tables, checked out at the generation's versions;
        `path` and `session`: their folder and cache (to open asynchronous ones: `_async_of`)."""
        self.tables = tables
        self._path = path
        self._session = session
        self._opened: dict[str, Any] = {}
        self._probes: dict[str, int | None] = {}

    async def _async_of(self, name: str, t: Any) -> Any:
        """`t`'s asynchronous table: the one behind it, or else (a LanceDB that keeps it
        elsewhere) one opened through the public API at the same version, once per reader."""
        table = _async_table(t)
        if table is not None:
            return table
        if name not in self._opened:
            import lancedb

            if self._path is None:
                raise IndexDamaged("a search table cannot be read")
            db = await lancedb.connect_async(str(self._path), session=self._session)
            opened = await db.open_table(name)
            await opened.checkout(int(t.version))
            self._opened[name] = opened
        return self._opened[name]

    def _table_probes(self, name: str, t: Any) -> int | None:
        """Partitions to probe in `name`'s vector index (None: LanceDB's default, for an index
        written before IVF_SQ, or none)."""
        if name not in self._probes:
            ours = [n for n in _vector_index_names(t.list_indices()) if trained_rows(n)]
            self._probes[name] = probes(t.count_rows()) if ours else None
        return self._probes[name]

    async def search(
        self,
        name: str,
        *,
        vector: np.ndarray | None,
        text: str | None,
        k: int,
        hidden_acl: Iterable[int] = (),
        level: int | None = None,
        vector_weight: float = 1.0,
    ) -> list[Hit]:
        """Top-k over rows the caller may see (prefiltered on ACL classes), vector and
        full-text rankings fused by RRF. `vector_weight` scales the vector ranking against the
        full-text one (1: equal); a lexical embedder such as the builtin one is best given a
        small weight: its ranking then orders the rows full-text search missed.

        The queries run on LanceDB's asynchronous table, awaited on the caller's event loop.
        Its synchronous API runs each query, and each batch of its answer, through a
        background event loop thread: more thread hand-offs per query, each waiting for the
        GIL, and about 1.3 ms more CPU per query (`benchmarks/lance_query_path.py` at 10,000
        articles: 16.0-17.8 against 11.8-13.8 ms per step of three searches and 5 ms of
        Python work; 26-36% more steps a second)."""
        t = self.tables.get(name)
        if t is None or k <= 0:
            return []
        clauses = []
        hidden = sorted(set(hidden_acl))
        if hidden:
            clauses.append(f"NOT array_has_any(acl, [{', '.join(map(str, hidden))}])")
        if level is not None:
            clauses.append(f"level = {int(level)}")
        where = " AND ".join(clauses) or None
        table = await self._async_of(name, t)
        rankings: list[list[str]] = []
        weights: list[float] = []
        if vector is not None:
            q = table.query().nearest_to(vector.astype(np.float32)).limit(k)
            nprobes = self._table_probes(name, t)
            if nprobes:
                q = q.nprobes(nprobes).refine_factor(_REFINE)
            if where:
                q = q.where(where)  # a prefilter: LanceDB's default for vector queries
            try:
                rankings.append(await _ids(q.select(["id", "_distance"])))
            except Exception as exc:  # missing or truncated files: the text names them
                log.info("vector search of %s failed: %s", name, exc)
                raise IndexDamaged("a search table cannot be read") from None
            weights.append(vector_weight)
        words = " ".join(_WORD.findall(text or ""))
        if words:
            try:
                q = table.query().nearest_to_text(words).limit(k).select(["id", "_score"])
                if where:
                    q = q.where(where)
                rankings.append(await _ids(q))
                weights.append(1.0)
            except Exception as exc:  # e.g. a query made only of FTS syntax characters
                log.debug("full-text search skipped: %s", exc)
        return rrf(*rankings, weights=weights)[:k]


def _async_table(t: Any) -> Any | None:
    """The asynchronous table behind LanceDB's synchronous one (the object both APIs share:
    one cache, one checked-out version), where LanceDB keeps it (0.40: `_table`)."""
    from lancedb.table import AsyncTable

    table = getattr(t, "_table", None)
    return table if isinstance(table, AsyncTable) else None


async def _ids(query: Any) -> list[str]:
    return [str(i) for i in (await query.to_arrow()).column("id").to_pylist()]
