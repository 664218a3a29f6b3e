"""The view cache: single-flight builds, an in-memory LRU over the SQLite `acl_views` table,
and the context of a view-aware call (which views it found missing). See acl.views for what a
view is and how its key is made."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from canopy.model import (
    Claim,
    Community,
    Entity,
    Finding,
    Relationship,
    Report,
)
from canopy.providers.base import Provider
from canopy.settings import ExtractSettings, ReportSettings
from canopy.store import Store

__all__ = [
    "BuiltView",
    "ReportWriter",
    "ViewBook",
    "ViewParams",
    "ViewsPending",
    "book_for",
    "call_scope",
    "close_books",
    "collecting",
    "pending_views",
]

log = logging.getLogger(__name__)


class ViewsPending(RuntimeError):
    """A view was needed outside a view-aware call (use run_with_views / ensure_views)."""

    def __init__(self, kind: str, artifact_id: str) -> None:
        super().__init__(f"the {kind} view of {artifact_id} is not built: wrap the call in "
                         "server.engines.serving.run_with_views or call ensure_views first")
        self.kind = kind
        self.artifact_id = artifact_id


# Views a view-aware call found missing; set by `collecting`, shared with the tasks it starts.
PENDING_VIEWS: ContextVar[set[tuple[str, str]] | None] = ContextVar("canopy_views_pending", default=None)


# When the current view-aware call started (monotonic clock; inf outside one).
CALL_STARTED: ContextVar[float] = ContextVar("canopy_views_call_started", default=float("inf"))


@contextmanager
def call_scope() -> Iterator[None]:
    """One view-aware call (all its passes)."""
    token = CALL_STARTED.set(time.monotonic())
    try:
        yield
    finally:
        CALL_STARTED.reset(token)


@contextmanager
def collecting() -> Iterator[set[tuple[str, str]]]:
    """Within the block, a missing view is recorded as (kind, id) and the hook answers None."""
    pending: set[tuple[str, str]] = set()
    token = PENDING_VIEWS.set(pending)
    try:
        yield pending
    finally:
        PENDING_VIEWS.reset(token)


def pending_views() -> set[tuple[str, str]] | None:
    return PENDING_VIEWS.get()


@dataclass(frozen=True)
class ViewParams:
    """The budgets views are written with; the indexer's defaults."""

    summary_max_tokens: int = ExtractSettings().summary_max_tokens
    report_context_tokens: int = ReportSettings().max_context_tokens
    report_max_tokens: int = ReportSettings().max_report_tokens

    def key(self) -> str:
        return f"{self.summary_max_tokens}/{self.report_context_tokens}/{self.report_max_tokens}"


class ReportWriter(Protocol):
    async def __call__(
        self,
        community: Community,
        communities: dict[str, Community],
        entities: dict[str, Entity],
        relationships: dict[str, Relationship],
        claims: dict[str, Claim],
        child_reports: Callable[[], Awaitable[dict[str, Report]]],
        provider: Provider,
        params: ViewParams,
    ) -> Report:
        """A report of `community` from exactly these elements (all visible to the caller).
        `child_reports()` builds the children's reports, for when the context must be cut."""
        ...


# ---- payloads ---------------------------------------------------------------------------------


def dump_view(kind: str, value: Any) -> str:
    if kind == "entity":
        e: Entity = value
        d: dict[str, Any] = {"name": e.name, "type": e.type, "description": e.description,
                             "units": list(e.text_unit_ids)}
    elif kind == "relationship":
        r: Relationship = value
        d = {"source": r.source, "target": r.target, "description": r.description,
             "weight": r.weight, "units": list(r.text_unit_ids)}
    else:
        p: Report = value
        d = {"level": p.level, "title": p.title, "summary": p.summary, "rating": p.rating,
             "rating_explanation": p.rating_explanation, "fingerprint": p.fingerprint,
             "context_tokens": p.context_tokens, "used_subreports": list(p.used_subreports),
             "units": list(p.text_unit_ids),
             "findings": [[f.summary, f.explanation, list(f.entity_ids), list(f.relationship_ids),
                           list(f.text_unit_ids)] for f in p.findings]}
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def load_view(kind: str, artifact_id: str, payload: str) -> Any:
    d = json.loads(payload)
    if kind == "entity":
        return Entity(artifact_id, d["name"], d["type"], d["description"], tuple(d["units"]), 0)
    if kind == "relationship":
        return Relationship(artifact_id, d["source"], d["target"], d["description"], d["weight"],
                            tuple(d["units"]))
    findings = tuple(Finding(f[0], f[1], tuple(f[2]), tuple(f[3]), tuple(f[4])) for f in d["findings"])
    return Report(artifact_id, d["level"], d["title"], d["summary"], d["rating"],
                  d["rating_explanation"], findings, tuple(d["units"]), d["fingerprint"],
                  d["context_tokens"], tuple(d["used_subreports"]))


# ---- the cache ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltView:
    value: Any
    persist: bool  # stored in SQLite (it cost provider calls)
    fingerprint: str = ""
    visible: str = ""
    provisional: bool = False  # written offline while the endpoint was down: kept briefly


PROVISIONAL_S = 60.0  # how long a view written during an endpoint outage is served


class ViewBook:
    """Views of one index folder, shared by every caller and generation: an in-memory LRU over
    the SQLite `acl_views` table, with single-flight builds."""

    def __init__(self, store: Store, writer: ReportWriter, params: ViewParams | None = None,
                 *, memory: int = 100_000) -> None:
        self.store = store
        self.writer = writer
        self.params = params or ViewParams()
        self.memory = memory
        self.stats: Counter[str] = Counter()
        self._mem: OrderedDict[str, Any] = OrderedDict()
        self._provisional: dict[str, tuple[float, Any]] = {}
        self._locks: dict[tuple[int, str], asyncio.Lock] = {}
        self._tlock = threading.Lock()

    def peek(self, key: str, kind: str, artifact_id: str) -> tuple[Any | None, bool]:
        """(the view under `key` or None, whether it is durable rather than provisional)."""
        with self._tlock:
            value = self._mem.get(key)
            if value is not None:
                self._mem.move_to_end(key)
                return value, True
        row = self.store.view_get(key)
        if row is None:
            value = self._provisional_view(key)
            return value, value is None
        value = load_view(kind, artifact_id, row[1])
        self.stats["db_hits"] += 1
        self._keep(key, value)
        return value, True

    def _provisional_view(self, key: str) -> Any | None:
        """A view written offline: served for PROVISIONAL_S, and to the end of the call that
        wrote it (so that call never loops on it); then written again, by the endpoint if up."""
        with self._tlock:
            hit = self._provisional.get(key)
            if hit is None:
                return None
            built_at, value = hit
            if time.monotonic() - built_at < PROVISIONAL_S or built_at >= CALL_STARTED.get():
                return value
            del self._provisional[key]
            return None

    def _keep(self, key: str, value: Any) -> None:
        with self._tlock:
            self._mem[key] = value
            self._mem.move_to_end(key)
            while len(self._mem) > self.memory:
                self._mem.popitem(last=False)

    def remember(self, key: str, kind: str, artifact_id: str, built: BuiltView, provider: str) -> None:
        if built.provisional:
            with self._tlock:
                self._provisional[key] = (time.monotonic(), built.value)
            self.stats["provisional"] += 1
            return
        with self._tlock:
            self._provisional.pop(key, None)
        self._keep(key, built.value)
        self.stats[f"built_{kind}"] += 1
        if built.persist:
            try:
                self.store.view_put(key, kind=kind, artifact_id=artifact_id,
                                    fingerprint=built.fingerprint, visible=built.visible,
                                    provider=provider, payload=dump_view(kind, built.value))
            except sqlite3.Error as exc:  # e.g. a read-only index: serve it, just uncached
                log.warning("view of %s not cached: %s", artifact_id, exc)

    async def once(self, key: str, kind: str, artifact_id: str, provider: str,
                   build: Callable[[], Awaitable[BuiltView]]) -> tuple[Any, bool]:
        """(the view under `key`, durable?), built by `build` unless cached; never built twice
        at once."""
        value, durable = self.peek(key, kind, artifact_id)
        if value is not None:
            return value, durable
        slot = (id(asyncio.get_running_loop()), key)
        lock = self._locks.setdefault(slot, asyncio.Lock())
        try:
            async with lock:
                value, durable = self.peek(key, kind, artifact_id)
                if value is None:
                    built = await build()
                    self.remember(key, kind, artifact_id, built, provider)
                    value, durable = built.value, not built.provisional
        finally:
            if not lock.locked():
                self._locks.pop(slot, None)
        return value, durable


_BOOKS: dict[tuple[str, int], ViewBook] = {}
_BOOKS_LOCK = threading.Lock()


def book_for(index_dir: Path, writer: ReportWriter, params: ViewParams | None = None) -> ViewBook:
    """The process's ViewBook for an index folder (one SQLite connection of its own)."""
    index_dir = Path(index_dir).resolve()
    db = index_dir / "canopy.sqlite"
    ident = (str(index_dir), db.stat().st_ino if db.exists() else 0)
    with _BOOKS_LOCK:
        book = _BOOKS.get(ident)
        if book is None:
            book = ViewBook(Store(index_dir), writer, params)
            _BOOKS[ident] = book
        return book


def close_books() -> None:
    """Drop this process's in-memory views and close their cache connections (SQLite stays)."""
    with _BOOKS_LOCK:
        for book in _BOOKS.values():
            book.store.close()
        _BOOKS.clear()
