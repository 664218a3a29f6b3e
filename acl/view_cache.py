"""The view cache: built views by key, in memory within a byte budget over the index's SQLite
table `acl_views`, with single-flight builds across threads and event loops.

A view's key is a hash of everything it is derived from (canopy.acl.views), so an entry is never
stale, only unused; `canopy warm --prune` drops entries of artifacts that no longer exist. Views
that cost provider calls are stored in SQLite and survive restarts; a view written by the offline
provider during an endpoint outage is kept in memory for PROVISIONAL_S only, then written again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import sqlite3
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from canopy.model import Entity, Finding, Relationship, Report
from canopy.store import Store

__all__ = ["PROVISIONAL_S", "BuiltView", "ViewCache", "dump_view", "load_view"]

log = logging.getLogger(__name__)

PROVISIONAL_S = 60.0  # how long a view written during an endpoint outage is served


def dump_view(kind: str, value: Any) -> str:
    if kind == "entity":
        e: Entity = value
        d: dict[str, Any] = {"name": e.name, "type": e.type, "description": e.description,
                             "units": list(e.text_unit_ids), "degree": e.degree}
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
        return Entity(artifact_id, d["name"], d["type"], d["description"], tuple(d["units"]),
                      d.get("degree", 0))
    if kind == "relationship":
        return Relationship(artifact_id, d["source"], d["target"], d["description"], d["weight"],
                            tuple(d["units"]))
    findings = tuple(
        Finding(f[0], f[1], tuple(f[2]), tuple(f[3]), tuple(f[4])) for f in d["findings"]
    )
    return Report(artifact_id, d["level"], d["title"], d["summary"], d["rating"],
                  d["rating_explanation"], findings, tuple(d["units"]), d["fingerprint"],
                  d["context_tokens"], tuple(d["used_subreports"]))


@dataclass(frozen=True)
class BuiltView:
    value: Any
    persist: bool  # stored in SQLite (it cost provider calls)
    provisional: bool = False  # written offline while the endpoint was down: kept briefly


class ViewCache:
    """Views of one index, shared by every caller and generation of a service."""

    def __init__(self, store: Store, *, memory_bytes: int = 64 << 20) -> None:
        self.store = store
        self.memory_bytes = memory_bytes
        self.stats: Counter[str] = Counter()
        self._mem: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._provisional: dict[str, tuple[float, Any]] = {}
        self._inflight: dict[str, concurrent.futures.Future[tuple[Any, bool]]] = {}
        self._lock = threading.Lock()

    @property
    def memory_used(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._mem) + len(self._provisional)

    def peek(self, key: str, kind: str, artifact_id: str) -> tuple[Any | None, bool]:
        """(the view under `key` or None, whether it is durable rather than provisional)."""
        with self._lock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                return hit[0], True
            provisional = self._provisional.get(key)
            if provisional is not None:
                if time.monotonic() - provisional[0] < PROVISIONAL_S:
                    return provisional[1], False
                del self._provisional[key]
        try:
            row = self.store.view_get(key)
        except sqlite3.Error as exc:
            log.warning("view cache unreadable: %s", exc)
            row = None
        if row is None:
            return None, True
        value = load_view(kind, artifact_id, row[1])
        self.stats["db_hits"] += 1
        self._keep(key, value, len(row[1]))
        return value, True

    def _keep(self, key: str, value: Any, size: int) -> None:
        with self._lock:
            old = self._mem.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._mem[key] = (value, size)
            self._bytes += size
            while self._bytes > self.memory_bytes and len(self._mem) > 1:
                _, (_, n) = self._mem.popitem(last=False)
                self._bytes -= n

    def _remember(self, key: str, kind: str, artifact_id: str, built: BuiltView) -> None:
        if built.provisional:
            with self._lock:
                self._provisional[key] = (time.monotonic(), built.value)
            self.stats["provisional"] += 1
            return
        payload = dump_view(kind, built.value)
        self._keep(key, built.value, len(payload))
        self.stats[f"built_{kind}"] += 1
        if built.persist:
            try:
                self.store.view_put(key, kind=kind, artifact_id=artifact_id, payload=payload,
                                    units=built.value.text_unit_ids)
            except sqlite3.Error as exc:  # e.g. a read-only index: serve it, just uncached
                log.warning("view of %s not cached: %s", artifact_id, exc)

    async def once(self, key: str, kind: str, artifact_id: str,
                   build: Callable[[], Awaitable[BuiltView]]) -> tuple[Any, bool]:
        """(the view under `key`, durable?), built by `build` unless cached; never built twice
        at once, whatever thread or event loop asks."""
        value, durable = self.peek(key, kind, artifact_id)
        if value is not None:
            return value, durable
        with self._lock:
            pending = self._inflight.get(key)
            mine = pending is None
            if mine:
                pending = self._inflight[key] = concurrent.futures.Future()
        assert pending is not None
        if not mine:
            return await asyncio.wrap_future(pending)
        try:
            built = await build()
            self._remember(key, kind, artifact_id, built)
            result = (built.value, not built.provisional)
            pending.set_result(result)
            return result
        except BaseException as exc:
            pending.set_exception(exc)
            raise
        finally:
            with self._lock:
                self._inflight.pop(key, None)

    def forget(self) -> None:
        """Drop the views held in memory (the SQLite cache stays), as a restart would."""
        with self._lock:
            self._mem.clear()
            self._bytes = 0
            self._provisional.clear()
