"""Wiring shared by the CLI, the MCP server and the watcher: folders, settings, policy,
providers and the store, resolved one way."""

from __future__ import annotations

import asyncio
import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from acl.policy import Policy
from canopy.errors import ConfigError, IndexMissing
from canopy.providers import make_embedder, make_provider
from canopy.settings import INDEX_DIRNAME, Settings, load_settings
from canopy.store import Store
from indexer.pipeline import IndexResult, Progress, run_index

__all__ = ["Workspace", "build_index", "open_workspace"]


@dataclass
class Workspace:
    docs_dir: Path
    index_dir: Path
    settings: Settings
    policy: Policy

    def store(self, *, must_exist: bool = False) -> Store:
        if must_exist and not (self.index_dir / "canopy.sqlite").exists():
            raise IndexMissing(f"no index at {self.index_dir}: run `canopy index {self.docs_dir}` first")
        return Store(self.index_dir)


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
    """One writer per index (a watcher and a manual `canopy index` take turns); readers never wait."""
    index_dir.mkdir(parents=True, exist_ok=True)
    with open(index_dir / "write.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def build_index(ws: Workspace, *, full: bool = False, progress: Progress | None = None) -> IndexResult:
    """Index (or incrementally update) the workspace's documents; one committed generation."""
    with writer_lock(ws.index_dir):
        return _build(ws, full, progress)


def _build(ws: Workspace, full: bool, progress: Progress | None) -> IndexResult:
    store = ws.store()
    try:
        provider = make_provider(ws.settings, store)
        embedder = make_embedder(ws.settings)
        return asyncio.run(run_index(ws.docs_dir, store, ws.settings, provider, embedder,
                                     labeler=ws.policy.labels_for, full=full, progress=progress))
    finally:
        store.close()
