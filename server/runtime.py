"""Wiring shared by the CLI, the MCP server and the watcher: folders, settings, policy,
providers and the store, resolved one way.

`Workspace` (from `open_workspace`) stays in this layer because it holds the access policy
(canopy.acl.policy), which the indexer may not import (server -> (indexer, acl) -> kernel): the
server resolves the policy and hands the writer only its labeler. The writer itself (its lock,
damage recovery, the build and the search tables' tidy) is canopy.indexer.index_writer:
`build_index` and `maintain_index` ask it with the workspace's values.
`start_background_tidy` starts the CLI's `canopy tidy` in a detached process.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import canopy
from canopy.acl.policy import Policy
from canopy.errors import CanopyError, ConfigError, IndexDamaged, IndexMissing
from canopy.health import (
    DB_NAME,
)
from canopy.indexer.forecast import PlanSink
from canopy.indexer.index_writer import tidy_due, tidy_index, write_index
from canopy.indexer.pipeline import IndexResult, Progress
from canopy.server.wings import wing_module
from canopy.settings import INDEX_DIRNAME, Settings, load_settings
from canopy.store import Store

if TYPE_CHECKING:
    from canopy.indexer.watcher import Watcher
    from canopy.providers.fanout import Fanout

__all__ = ["Workspace", "build_index", "maintain_index", "open_workspace",
           "start_background_tidy", "tidy_needed", "workspace_watcher"]

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


def build_index(
    ws: Workspace, *, full: bool = False, progress: Progress | None = None, tidy: bool = True,
    on_revoked: Callable[[], None] | None = None, on_plan: PlanSink | None = None,
    ray: Fanout | None = None,
) -> IndexResult:
    """Index (or incrementally update) the workspace's documents: the writer's build
    (canopy.indexer.index_writer.write_index, which says what each argument does) with the
    workspace's folders, settings and policy."""
    return write_index(ws.docs_dir, ws.index_dir, ws.settings, ws.policy.labels_checked,
                       full=full, progress=progress, tidy=tidy, on_revoked=on_revoked,
                       on_plan=on_plan, ray=ray)


def maintain_index(ws: Workspace, *, wait: bool = False,
                   should_stop: Callable[[], bool] | None = None) -> bool | None:
    """Tidy the workspace's search tables (canopy.indexer.index_writer.tidy_index says what the
    result means)."""
    return tidy_index(ws.index_dir, ws.settings.storage, wait=wait, should_stop=should_stop)


def tidy_needed(ws: Workspace) -> bool:
    """Whether `maintain_index` has work it may do (canopy.indexer.index_writer.tidy_due)."""
    return tidy_due(ws.index_dir, ws.settings.storage)


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
