"""The index's writer: one at a time per index folder, damage set aside before a rebuild, one
committed generation per build (the pipeline: canopy.indexer.pipeline). The server asks for a
build with the values it resolved (folders, settings, the policy's labeler) and gets the result;
nothing here reads the server's objects.

A damaged index (canopy.health) stops an incremental update with `IndexDamaged`, whose message
names the command that rebuilds it; a full build always rebuilds: it first moves what is
damaged into `index_dir/damaged-<UTC time>/` (the search tables; the database too when it cannot
be read) and says so in `IndexResult.recovered`. The index folder is never indexed, so neither
is that folder; nothing in it is deleted automatically.

Tidying the search tables (folding appended rows into their indexes; at most once per
`[storage] keep_versions_s`, rewriting what stores erased rows and pruning old versions) is
`tidy_index`: a build does it inline by default, while `canopy index` and the watchers leave it
to a background tidy (`[storage] tidy`), because its periodic part rewrites whole fragments and
would make a one-article update cost a minute at 10k articles. A tidy yields to any writer that
starts waiting for the lock (`writer_waiting`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock, Timeout

from canopy.allocator import limit_arenas
from canopy.collector import freeze_imports
from canopy.errors import IndexDamaged
from canopy.health import (
    DB_NAME,
    check_database,
    check_search_files,
    check_search_tables,
    quarantine,
    raise_if_damaged,
    writes_to,
)
from canopy.ids import memoized_names
from canopy.indexer.forecast import PlanSink
from canopy.indexer.pipeline import IndexResult, Labeler, Progress, run_index
from canopy.providers import make_embedder, make_provider
from canopy.settings import Settings, StorageSettings
from canopy.store import Store

if TYPE_CHECKING:
    from canopy.providers.fanout import Fanout

__all__ = ["tidy_due", "tidy_index", "write_index", "writer_lock", "writer_waiting"]

log = logging.getLogger(__name__)


_WAITING = "write.waiting."  # a waiting writer holds an OS lock on its own marker file


@contextmanager
def writer_lock(index_dir: Path, *, wait: bool = True) -> Iterator[bool]:
    """One writer per index (a watcher and a manual `canopy index` take turns); readers never
    wait. A writer that has to wait says so (stderr), and again when its turn comes; while it
    waits it holds a lock on a marker file, so a background tidy holding the lock gives way
    (`writer_waiting`). With `wait=False` a busy lock yields False at once instead (the caller
    leaves the work to the writer that holds it). OS file locks (filelock: flock on POSIX,
    LockFileEx on Windows): a crashed writer holds nothing."""
    lock = FileLock(index_dir / "write.lock")
    try:
        with writes_to(index_dir):  # a read-only folder, a full disk: one line, not OSError
            index_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire(timeout=0)
    except Timeout:
        if not wait:
            yield False
            return
        log.warning("another writer (`canopy index`, `watch`, `serve --watch` or a tidy) is "
                    "updating %s: waiting for it to finish", index_dir)
        began = time.monotonic()
        marker = index_dir / f"{_WAITING}{os.getpid()}.{threading.get_ident()}"
        with FileLock(marker):
            lock.acquire()
        marker.unlink(missing_ok=True)
        log.warning("the other writer finished after %.0f s: updating %s", time.monotonic() - began,
                    index_dir)
    try:
        yield True
    finally:
        lock.release()


def writer_waiting(index_dir: Path) -> bool:
    """Whether a writer is waiting for the lock (a marker file it holds locked); markers of
    writers that died while waiting are removed."""
    for marker in sorted(index_dir.glob(f"{_WAITING}*")):
        probe = FileLock(marker)
        try:
            probe.acquire(timeout=0)
        except Timeout:
            return True
        probe.release()
        marker.unlink(missing_ok=True)
    return False


def write_index(
    docs_dir: Path, index_dir: Path, settings: Settings, labeler: Labeler, *,
    full: bool = False, progress: Progress | None = None, tidy: bool = True,
    on_revoked: Callable[[], None] | None = None, on_plan: PlanSink | None = None,
    ray: Fanout | None = None,
) -> IndexResult:
    """Index (or incrementally update) `docs_dir` into `index_dir`; one committed generation,
    under the writer lock. An update of a damaged index raises IndexDamaged; a full build
    rebuilds it (module doc). `labeler`: path -> ACL labels (the policy's). `tidy=False` leaves
    tidying the search tables to `tidy_index`. `on_revoked()` runs once deletions and relabels
    have committed, before regeneration, with the lock held (`run_index`). `on_plan`: told the
    extraction plan and the projection of the rest (canopy.indexer.forecast). `ray`: a cluster
    the endpoint requests and the builtin provider's CPU work fan out to
    (the Ray wing's `connect_ray`; the caller closes it); what it did is in `stats["ray"]`."""
    limit_arenas()  # the build's peak (canopy.allocator); a no-op after the first call

    def build() -> IndexResult:
        store = Store(index_dir)  # IndexDamaged carries no DOCS here: the caller adds it
        try:
            provider = make_provider(settings, store, ray=ray)
            embedder = make_embedder(settings, ray=ray)
            freeze_imports()  # the SDK they may have imported, out of the GC's way
            with memoized_names():
                return asyncio.run(run_index(docs_dir, store, settings, provider, embedder,
                                             labeler=labeler, full=full, progress=progress,
                                             tidy=tidy, on_revoked=on_revoked, on_plan=on_plan))
        finally:
            store.close()

    # A full disk, a read-only folder: one line naming the folder and what to do (it resumes
    # when run again), never "damaged" (canopy.health.write_failure).
    with writes_to(index_dir), writer_lock(index_dir):
        if not full:
            _require_intact(docs_dir, index_dir)
            try:
                result = build()
            except IndexDamaged as exc:
                raise exc.for_docs(docs_dir, index_dir) from None
        else:
            recovered = _set_aside_damage(index_dir)
            try:
                result = build()
            except IndexDamaged as exc:
                # Damage the checks could not see (inside the files): set everything aside, so
                # the rebuild cannot meet it again.
                moved = quarantine(index_dir, database=True)
                recovered = _recovered(exc.reason, moved)
                log.info("%s", recovered)
                result = build()
            result.recovered = recovered
    if ray is not None:
        result.stats["ray"] = ray.stats().as_dict()
    return result


def _require_intact(docs_dir: Path, index_dir: Path) -> None:
    """IndexDamaged (naming `canopy index --full DOCS`) when an existing index is damaged, as
    far as its database and its search tables' files show (milliseconds: no lancedb)."""
    if not (index_dir / DB_NAME).exists():
        return
    try:
        raise_if_damaged(index_dir)
    except IndexDamaged as exc:
        raise exc.for_docs(docs_dir, index_dir) from None


def _set_aside_damage(index_dir: Path) -> str | None:
    """Before a full build: move what is damaged aside, and say what was done (None: nothing
    was damaged). The search tables are opened too: the build imports lancedb anyway."""
    if not (index_dir / DB_NAME).exists():
        return None
    facts = check_database(index_dir)
    reason: str | None
    if isinstance(facts, str):
        reason, database = facts, True
    else:
        found = check_search_files(index_dir, facts.versions)
        reason, database = found or check_search_tables(index_dir, facts), False
    if reason is None:
        return None
    moved = quarantine(index_dir, database=database)
    message = _recovered(reason, moved)
    log.info("%s", message)  # the caller reports it (`canopy index` on stderr)
    return message


def _recovered(reason: str, moved: Path) -> str:
    return (f"the index was damaged ({reason}): moved the damaged files to {moved} and rebuilt "
            "the index from the documents (delete that folder once it is not needed)")


def tidy_index(index_dir: Path, storage: StorageSettings, *, wait: bool = False,
               should_stop: Callable[[], bool] | None = None) -> bool | None:
    """Tidy the search tables (`canopy.indexer.stages.vectors.tidy_search_tables`) under the writer
    lock, giving way to any writer that starts waiting (and to `should_stop()`). None: another
    writer holds the lock and `wait` is False (its own run or tidy will do the work); False:
    it gave way before the end (what it finished is kept); True: done, or nothing to do."""
    from canopy.indexer.stages.vectors import tidy_search_tables

    if not (index_dir / DB_NAME).exists():
        return True

    def stop() -> bool:
        return writer_waiting(index_dir) or bool(should_stop and should_stop())

    def tidy() -> bool:
        store = Store(index_dir)
        try:
            return tidy_search_tables(store, storage, should_stop=stop)
        finally:
            store.close()

    with writer_lock(index_dir, wait=wait) as held:
        return tidy() if held else None


def tidy_due(index_dir: Path, storage: StorageSettings) -> bool:
    """Whether `tidy_index` has work it may do (milliseconds: the index's meta only)."""
    from canopy.indexer.stages.vectors import search_tables_need_tidy

    if not (index_dir / DB_NAME).exists():
        return False
    store = Store(index_dir)
    try:
        return search_tables_need_tidy(store, storage)
    finally:
        store.close()
