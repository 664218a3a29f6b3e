"""Wiring shared by the CLI, the MCP server and the watcher: folders, settings, policy,
providers and the store, resolved one way.

A damaged index (canopy.health) stops an incremental update with `IndexDamaged`, whose message
names the command that rebuilds it; `build_index(full=True)` always rebuilds: it first moves
what is damaged into `index_dir/damaged-<UTC time>/` (the search tables; the database too when
it cannot be read) and says so in `IndexResult.recovered`. The index folder is never indexed,
so neither is that folder; nothing in it is deleted automatically."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from acl.policy import Policy
from canopy.allocator import limit_arenas
from canopy.errors import ConfigError, IndexDamaged, IndexMissing
from canopy.health import (
    DB_NAME,
    check_database,
    check_search_files,
    check_search_tables,
    quarantine,
    raise_if_damaged,
)
from canopy.providers import make_embedder, make_provider
from canopy.settings import INDEX_DIRNAME, Settings, load_settings
from canopy.store import Store
from indexer.pipeline import IndexResult, Progress, run_index

__all__ = ["Workspace", "build_index", "open_workspace"]

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
            raise exc.for_docs(self.docs_dir) from None


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


@contextmanager
def writer_lock(index_dir: Path) -> Iterator[None]:
    """One writer per index (a watcher and a manual `canopy index` take turns); readers never
    wait. A writer that has to wait says so (stderr), and again when its turn comes. An OS file
    lock (filelock: flock on POSIX, LockFileEx on Windows): a crashed writer holds nothing."""
    index_dir.mkdir(parents=True, exist_ok=True)
    lock = FileLock(index_dir / "write.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("another writer (`canopy index`, `watch` or `serve --watch`) is updating "
                    "%s: waiting for it to finish", index_dir)
        began = time.monotonic()
        lock.acquire()
        log.warning("the other writer finished after %.0f s: updating %s", time.monotonic() - began,
                    index_dir)
    try:
        yield
    finally:
        lock.release()


def build_index(
    ws: Workspace, *, full: bool = False, progress: Progress | None = None
) -> IndexResult:
    """Index (or incrementally update) the workspace's documents; one committed generation.
    An update of a damaged index raises IndexDamaged; a full build rebuilds it (module doc)."""
    limit_arenas()  # the build's peak (canopy.allocator); a no-op after the first call
    with writer_lock(ws.index_dir):
        if not full:
            _require_intact(ws)
            try:
                return _build(ws, full, progress)
            except IndexDamaged as exc:
                raise exc.for_docs(ws.docs_dir) from None
        recovered = _set_aside_damage(ws)
        try:
            result = _build(ws, full, progress)
        except IndexDamaged as exc:
            # Damage the checks could not see (inside the files): set everything aside, so the
            # rebuild cannot meet it again.
            moved = quarantine(ws.index_dir, database=True)
            recovered = _recovered(exc.reason, moved)
            log.info("%s", recovered)
            result = _build(ws, full, progress)
        result.recovered = recovered
        return result


def _require_intact(ws: Workspace) -> None:
    """IndexDamaged (naming `canopy index --full DOCS`) when an existing index is damaged, as
    far as its database and its search tables' files show (milliseconds: no lancedb)."""
    if not (ws.index_dir / DB_NAME).exists():
        return
    try:
        raise_if_damaged(ws.index_dir)
    except IndexDamaged as exc:
        raise exc.for_docs(ws.docs_dir) from None


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


def _build(ws: Workspace, full: bool, progress: Progress | None) -> IndexResult:
    store = Store(ws.index_dir)  # IndexDamaged carries no DOCS here: build_index adds it
    try:
        provider = make_provider(ws.settings, store)
        embedder = make_embedder(ws.settings)
        return asyncio.run(run_index(ws.docs_dir, store, ws.settings, provider, embedder,
                                     labeler=ws.policy.labels_for, full=full, progress=progress))
    finally:
        store.close()
