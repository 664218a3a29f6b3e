"""Keep an index current: watchdog events, debounced into batches, each applied as one update.

The watcher only decides *when* to update; *what* changed is recomputed by the pipeline from
content hashes (so missed, duplicated or reordered events cannot corrupt anything, and a file
that vanishes mid-read is simply gone in the next scan). Events inside the index folder and from
editors' temp/swap files are ignored. `canopy.toml` edits trigger an update too: a policy change
relabels units without re-extraction.
"""

from __future__ import annotations

import fnmatch
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from canopy.errors import CanopyError

__all__ = ["Watcher", "is_ignored"]

log = logging.getLogger(__name__)

_TEMP_PATTERNS = ("*.swp", "*.swx", "*.swo", "*~", ".#*", "#*#", "*.tmp", "*.temp", "*.part",
                  "*.crdownload", ".DS_Store", "Thumbs.db", "*.lock", "4913")


def is_ignored(path: Path, docs_dir: Path, index_dir: Path) -> bool:
    """Events the watcher drops: the index folder itself, VCS folders, editor temp/swap files."""
    try:
        path.resolve().relative_to(index_dir.resolve())
        return True
    except ValueError:
        pass
    try:
        rel = path.resolve().relative_to(docs_dir.resolve())
    except ValueError:
        return True
    if any(part in (".git", ".hg", ".svn", "__pycache__") for part in rel.parts):
        return True
    return any(fnmatch.fnmatch(path.name, pat) for pat in _TEMP_PATTERNS)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: Watcher) -> None:
        self.w = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("opened", "closed_no_write"):
            return
        for raw in (event.src_path, getattr(event, "dest_path", "")):
            if raw:
                path = Path(raw if isinstance(raw, str) else raw.decode())
                if not is_ignored(path, self.w.docs_dir, self.w.index_dir):
                    self.w.notify(path)


class Watcher:
    """Runs `apply()` after file activity settles (`debounce` s of quiet, at most `max_wait` s).

    `apply` returns any summary object; it is logged. Exceptions from it are logged and the
    watcher keeps going: the failed batch is tried again `retry_s` later (doubling up to
    `max_retry_s` while it keeps failing), or sooner with the next change, and the pipeline
    resumes from stored work (a full disk freed meanwhile needs no edit to be caught up).

    `idle(busy)`, if given, is the background work of a quiet watcher (tidying the search
    tables): it runs after each applied batch once nothing is pending, and every `idle_every`
    seconds; `busy()` turns true when a change arrives, and `idle` should then stop soon."""

    def __init__(
        self,
        docs_dir: Path,
        index_dir: Path,
        apply: Callable[[], Any],
        *,
        debounce: float = 1.0,
        max_wait: float = 10.0,
        on_applied: Callable[[set[Path], Any], None] | None = None,
        idle: Callable[[Callable[[], bool]], Any] | None = None,
        idle_every: float = 600.0,
        retry_s: float = 5.0,
        max_retry_s: float = 300.0,
    ) -> None:
        self.docs_dir = docs_dir
        self.index_dir = index_dir
        self.apply = apply
        self.debounce = debounce
        self.max_wait = max_wait
        self.on_applied = on_applied
        self.idle = idle
        self.idle_every = idle_every
        self._idle_at = time.monotonic() + idle_every
        self.retry_s = retry_s
        self.max_retry_s = max_retry_s
        self._retry = retry_s  # the wait before retrying a failed batch (doubles)
        self._not_before = 0.0  # a failed batch is not retried before then (a change is)
        self._pending: set[Path] = set()
        self._first = 0.0
        self._last = 0.0
        self._cv = threading.Condition()
        self._stop = threading.Event()
        self._observer = Observer()
        self._observing = False
        self._thread = threading.Thread(target=self._loop, name="canopy-watcher", daemon=True)
        self.batches = 0

    def notify(self, path: Path) -> None:
        with self._cv:
            now = time.monotonic()
            if not self._pending:
                self._first = now
            self._pending.add(path)
            self._last = now
            self._not_before = 0.0  # a change is applied at once, a failed batch with it
            self._cv.notify()

    def observe(self) -> Watcher:
        """Start recording file activity (not applying it yet): a caller that indexes first and
        then starts the watcher observes first, so a change made meanwhile is not missed."""
        if not self._observing:
            self._observer.schedule(_Handler(self), str(self.docs_dir), recursive=True)
            self._observer.start()
            self._observing = True
        return self

    def start(self, *, catch_up: bool = False) -> Watcher:
        """Observe (if not yet) and apply batches from now on. `catch_up`: apply one batch
        first whatever happens, for what changed while nobody watched (a server restarted after
        it was stopped or killed)."""
        self.observe()
        if catch_up:
            self.notify(self.docs_dir)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cv:
            self._cv.notify()
        if self._observing:
            self._observer.stop()
            self._observer.join(timeout=5)
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    def _next_batch(self) -> set[Path] | None:
        """The next batch of changed paths; an empty set when it is time for `idle`."""
        with self._cv:
            while not self._stop.is_set():
                now = time.monotonic()
                if self._pending:
                    due = max(self._not_before,
                              min(self._last + self.debounce, self._first + self.max_wait))
                    if now >= due:
                        batch, self._pending = self._pending, set()
                        return batch
                    self._cv.wait(timeout=due - now)
                elif self.idle is not None and now >= self._idle_at:
                    return set()
                else:
                    self._cv.wait(timeout=0.5)
            return None

    def _again(self, batch: set[Path]) -> None:
        """Queue a failed batch again, to be retried after the current wait (then doubled)."""
        with self._cv:
            now = time.monotonic()
            if not self._pending:
                self._first = self._last = now
            self._pending |= batch
            self._not_before = now + self._retry
            self._retry = min(self._retry * 2, self.max_retry_s)

    def _busy(self) -> bool:
        return bool(self._pending) or self._stop.is_set()

    def _loop(self) -> None:
        while (batch := self._next_batch()) is not None:
            if not batch:
                self._idle_at = time.monotonic() + self.idle_every
                try:
                    if self.idle is not None:
                        self.idle(self._busy)
                except Exception:
                    log.exception("background work of the watcher failed; it runs again later")
                continue
            try:
                result = self.apply()
            except CanopyError as exc:  # written for people (e.g. a full disk): no traceback
                log.error("update after %d changed path(s) failed: %s (retrying in %.0f s)",
                          len(batch), exc, self._retry)
                self._again(batch)
                continue
            except Exception:
                log.exception("update after %d changed path(s) failed; retrying in %.0f s",
                              len(batch), self._retry)
                self._again(batch)
                continue
            self._retry = self.retry_s
            self.batches += 1
            self._idle_at = time.monotonic()  # tidy once the changes stop
            if self.on_applied:
                self.on_applied(batch, result)
