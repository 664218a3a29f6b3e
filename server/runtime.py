"""Wiring shared by the CLI, the MCP server and the watcher: folders, settings, policy,
providers and the store, resolved one way.

A damaged index (canopy.health) stops an incremental update with `IndexDamaged`, whose message
names the command that rebuilds it; `build_index(full=True)` always rebuilds: it first moves
what is damaged into `index_dir/damaged-<UTC time>/` (the search tables; the database too when
it cannot be read) and says so in `IndexResult.recovered`. The index folder is never indexed,
so neither is that folder; nothing in it is deleted automatically.

Tidying the search tables (folding appended rows into their indexes; at most once per
`[storage] keep_versions_s`, rewriting what stores erased rows and pruning old versions) is
`maintain_index`: `build_index` does it inline by default, while `canopy index` and the
watchers leave it to a background tidy (`[storage] tidy`), because its periodic part rewrites
whole fragments and would make a one-article update cost a minute at 10k articles. A tidy
yields to any writer that starts waiting for the lock (`writer_waiting`)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

import canopy
from canopy.acl.policy import Policy
from canopy.allocator import limit_arenas
from canopy.collector import freeze_imports
from canopy.errors import CanopyError, ConfigError, IndexDamaged, IndexMissing
from canopy.health import (
    DB_NAME,
    check_database,
    check_search_files,
    check_search_tables,
    quarantine,
    raise_if_damaged,
    writes_to,
)
from canopy.indexer.forecast import PlanSink
from canopy.indexer.pipeline import IndexResult, Progress, run_index
from canopy.providers import make_embedder, make_provider
from canopy.server.wings import wing_module
from canopy.settings import INDEX_DIRNAME, Settings, load_settings
from canopy.store import Store

if TYPE_CHECKING:
    from canopy.indexer.watcher import Watcher
    from canopy.providers.fanout import Fanout

__all__ = ["Workspace", "build_index", "maintain_index", "open_workspace",
           "start_background_tidy", "tidy_needed", "workspace_watcher", "writer_waiting"]

log = logging.getLogger(__name__)


@dataclass
class Workspace:
    docs_dir: Path
    index_dir: Path
    settings: Settings
    policy: Policy

    def store(self, *, must_exist: bool = False) -> Store:
        if must_exist and not (self.index_dir / DB_NAME).exists():
            raise IndexMissing(
                f"no index at {self.index_dir}: run `canopy index {self.docs_dir}` first"
            )
        try:
            return Store(self.index_dir)
        except IndexDamaged as exc:
            raise exc.for_docs(self.docs_dir, self.index_dir) from None


def open_workspace(docs_dir: Path, index_dir: Path | None = None, config: Path | None = None,
                   **overrides: Any) -> Workspace:
    docs_dir = Path(docs_dir)
    if not docs_dir.is_dir():
        raise ConfigError(f"documents folder not found: {docs_dir}")
    if config is not None and not Path(config).is_file():
        raise ConfigError(f"config file not found: {config}")
    settings = load_settings(docs_dir, config, **overrides)
    index_dir = Path(index_dir) if index_dir else docs_dir / INDEX_DIRNAME
    return Workspace(docs_dir, index_dir, settings, Policy(settings.acl))


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


def build_index(
    ws: Workspace, *, full: bool = False, progress: Progress | None = None, tidy: bool = True,
    on_revoked: Callable[[], None] | None = None, on_plan: PlanSink | None = None,
    ray: Fanout | None = None,
) -> IndexResult:
    """Index (or incrementally update) the workspace's documents; one committed generation.
    An update of a damaged index raises IndexDamaged; a full build rebuilds it (module doc).
    `tidy=False` leaves tidying the search tables to `maintain_index` (module doc).
    `on_revoked()` runs once deletions and relabels have committed, before regeneration, with
    the writer lock held (`run_index`). `on_plan`: told the extraction plan and the projection of
    the rest (canopy.indexer.forecast). `ray`: a cluster the endpoint requests and the builtin
    provider's CPU work fan out to (the Ray wing's `connect_ray`; the caller closes it);
    what the cluster did is in `stats["ray"]`."""
    limit_arenas()  # the build's peak (canopy.allocator); a no-op after the first call
    # A full disk, a read-only folder: one line naming the folder and what to do (it resumes
    # when run again), never "damaged" (canopy.health.write_failure).
    with writes_to(ws.index_dir), writer_lock(ws.index_dir):
        if not full:
            _require_intact(ws)
            try:
                result = _build(ws, full, progress, tidy, on_revoked, on_plan, ray)
            except IndexDamaged as exc:
                raise exc.for_docs(ws.docs_dir, ws.index_dir) from None
        else:
            recovered = _set_aside_damage(ws)
            try:
                result = _build(ws, full, progress, tidy, on_revoked, on_plan, ray)
            except IndexDamaged as exc:
                # Damage the checks could not see (inside the files): set everything aside, so
                # the rebuild cannot meet it again.
                moved = quarantine(ws.index_dir, database=True)
                recovered = _recovered(exc.reason, moved)
                log.info("%s", recovered)
                result = _build(ws, full, progress, tidy, on_revoked, on_plan, ray)
            result.recovered = recovered
    if ray is not None:
        result.stats["ray"] = ray.stats().as_dict()
    return result


def _require_intact(ws: Workspace) -> None:
    """IndexDamaged (naming `canopy index --full DOCS`) when an existing index is damaged, as
    far as its database and its search tables' files show (milliseconds: no lancedb)."""
    if not (ws.index_dir / DB_NAME).exists():
        return
    try:
        raise_if_damaged(ws.index_dir)
    except IndexDamaged as exc:
        raise exc.for_docs(ws.docs_dir, ws.index_dir) from None


def _set_aside_damage(ws: Workspace) -> str | None:
    """Before a full build: move what is damaged aside, and say what was done (None: nothing
    was damaged). The search tables are opened too: the build imports lancedb anyway."""
    if not (ws.index_dir / DB_NAME).exists():
        return None
    facts = check_database(ws.index_dir)
    reason: str | None
    if isinstance(facts, str):
        reason, database = facts, True
    else:
        found = check_search_files(ws.index_dir, facts.versions)
        reason, database = found or check_search_tables(ws.index_dir, facts), False
    if reason is None:
        return None
    moved = quarantine(ws.index_dir, database=database)
    message = _recovered(reason, moved)
    log.info("%s", message)  # the caller reports it (`canopy index` on stderr)
    return message


def _recovered(reason: str, moved: Path) -> str:
    return (f"the index was damaged ({reason}): moved the damaged files to {moved} and rebuilt "
            "the index from the documents (delete that folder once it is not needed)")


def _build(ws: Workspace, full: bool, progress: Progress | None, tidy: bool,
           on_revoked: Callable[[], None] | None = None,
           on_plan: PlanSink | None = None, ray: Fanout | None = None) -> IndexResult:
    store = Store(ws.index_dir)  # IndexDamaged carries no DOCS here: build_index adds it
    try:
        provider = make_provider(ws.settings, store, ray=ray)
        embedder = make_embedder(ws.settings, ray=ray)
        freeze_imports()  # the SDK they may have imported, out of the GC's way (canopy.collector)
        return asyncio.run(run_index(ws.docs_dir, store, ws.settings, provider, embedder,
                                     labeler=ws.policy.labels_checked, full=full, progress=progress,
                                     tidy=tidy, on_revoked=on_revoked,
                                     on_plan=on_plan))
    finally:
        store.close()


def maintain_index(ws: Workspace, *, wait: bool = False,
                   should_stop: Callable[[], bool] | None = None) -> bool | None:
    """Tidy the search tables (`canopy.indexer.stages.vectors.tidy_search_tables`) under the writer
    lock, giving way to any writer that starts waiting (and to `should_stop()`). None: another
    writer holds the lock and `wait` is False (its own run or tidy will do the work); False:
    it gave way before the end (what it finished is kept); True: done, or nothing to do."""
    from canopy.indexer.stages.vectors import tidy_search_tables

    if not (ws.index_dir / DB_NAME).exists():
        return True
    def stop() -> bool:
        return writer_waiting(ws.index_dir) or bool(should_stop and should_stop())

    def tidy() -> bool:
        store = Store(ws.index_dir)
        try:
            return tidy_search_tables(store, ws.settings.storage, should_stop=stop)
        finally:
            store.close()

    with writer_lock(ws.index_dir, wait=wait) as held:
        return tidy() if held else None


def tidy_needed(ws: Workspace) -> bool:
    """Whether `maintain_index` has work it may do (milliseconds: the index's meta only)."""
    from canopy.indexer.stages.vectors import search_tables_need_tidy

    if not (ws.index_dir / DB_NAME).exists():
        return False
    store = Store(ws.index_dir)
    try:
        return search_tables_need_tidy(store, ws.settings.storage)
    finally:
        store.close()


def start_background_tidy(ws: Workspace, config: Path | None) -> int | None:
    """Start `canopy tidy --if-idle` as a detached process when the index has tidying to do
    (as `git gc --auto` does after a commit), so the command that committed returns at once.
    Its output goes to `index_dir/tidy.log`. Returns its pid, or None when nothing is due."""
    if not tidy_needed(ws):
        return None
    # Absolute paths: the tidy runs from the package's parent folder, not the caller's.
    argv = [sys.executable, "-m", "canopy.server.cli", "tidy", str(ws.docs_dir.resolve()),
            "--index-dir", str(ws.index_dir.resolve()), "--if-idle"]
    if config is not None:
        argv += ["--config", str(Path(config).resolve())]
    detach: dict[str, Any] = {"start_new_session": True}
    if sys.platform == "win32":  # no sessions there: a detached process of its own group
        detach = {"creationflags": getattr(subprocess, "DETACHED_PROCESS", 0)
                  | getattr(subprocess, "CREATE_NEW_PROCESS_GROUP", 0)}
    with open(ws.index_dir / "tidy.log", "wb") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                cwd=str(Path(canopy.__file__).resolve().parents[1]), **detach)
    return proc.pid


def workspace_watcher(docs: Path, index_dir: Path | None, config: Path | None, *,
                      debounce: float = 1.0,
                      on_applied: Callable[[set[Path], Any], None] | None = None,
                      publish: str | None = None) -> Watcher:
    """A (not yet started) watcher that applies each batch of changes with `build_index`,
    re-reading the settings (and so the policy) each time, and with `[storage] tidy =
    "background"` tidies the search tables in its idle time instead of inside the update.
    With `publish` (or `[publish] uri`) each batch's generation is then published there
    (the publish wing); a policy edit that changes no document is published too, and
    the URI's garbage is collected when it falls due, so a deletion leaves the URI `grace_s`
    after it was published even if nothing is published after it."""
    from canopy.indexer.watcher import Watcher

    first = open_workspace(docs, index_dir, config)
    background = first.settings.storage.tidy == "background"
    tidy_every = max(60.0, first.settings.storage.keep_versions_s)
    publishing = bool(publish or first.settings.publish.uri)
    due = _IdleDue()

    def publish_wing() -> ModuleType:  # the publish wing's, once a batch publishes
        return wing_module("publish", "publishing", wanted_by="--publish / [publish] uri")

    def published(ws: Workspace, what: str) -> None:
        try:
            due.collect_at = publish_wing().publish_index(ws, publish).next_collection
        except CanopyError as exc:  # written for people (a missing bucket...): one line
            log.error("publishing %s failed: %s; the next change (or `canopy publish`) "
                      "publishes again", what, exc)
        except Exception:  # the update is committed; the next batch publishes again
            log.exception("publishing %s failed; the next change (or `canopy publish`) "
                          "publishes again", what)

    def apply() -> IndexResult:
        ws = open_workspace(docs, index_dir, config)
        on_revoked = None
        if publish or ws.settings.publish.uri:
            on_revoked = publish_wing().revocation_publisher(ws, publish)
        result = build_index(ws, tidy=not background, on_revoked=on_revoked)
        if publish or ws.settings.publish.uri:
            published(ws, f"generation {result.generation}")
        due.tidy_at = 0.0  # tidy once the changes stop
        return result

    def idle(busy: Callable[[], bool]) -> None:
        if background and time.monotonic() >= due.tidy_at:
            due.tidy_at = time.monotonic() + tidy_every
            ws = open_workspace(docs, index_dir, config)
            maintain_index(ws, should_stop=busy)
            if publish or ws.settings.publish.uri:
                # A tidy rewrote the files that held deleted text: publish them (nothing is
                # sent when it changed nothing), so the published copies can be collected too.
                published(ws, "the tidied search tables")
        if due.collect_at is not None and time.time() >= due.collect_at:
            ws = open_workspace(docs, index_dir, config)
            due.collect_at = None
            if publish or ws.settings.publish.uri:
                try:
                    due.collect_at = publish_wing().collect_published(ws, publish).next_due
                except Exception as exc:  # the next publish collects again
                    log.error("collecting superseded generations at the published URI "
                              "failed: %s", _first_line(exc))

    # Publishing, the idle check runs every second (it does nothing until a collection or the
    # tidy is due); otherwise only to tidy.
    return Watcher(first.docs_dir, first.index_dir, apply, debounce=debounce,
                   on_applied=on_applied, idle=idle if background or publishing else None,
                   idle_every=1.0 if publishing else tidy_every)


@dataclass
class _IdleDue:
    """When a quiet watcher next has work: the tidy (monotonic clock) and the published URI's
    garbage collection (Unix time, as the URI's manifests record it; None: nothing waits)."""

    tidy_at: float = 0.0
    collect_at: float | None = None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
