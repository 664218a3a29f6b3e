"""What one engine call runs with (`QueryContext`), and the caches the service keeps for engines."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

from canopy.acl.caller import Caller
from canopy.acl.reader import CallerReader
from canopy.providers.base import Provider
from canopy.settings import QuerySettings

__all__ = ["BoundedCache", "EngineCaches", "ProgressCallback", "QueryContext"]

# progress(done, total, message) - the MCP layer forwards it as progress notifications. A
# coroutine function: the service schedules it on the caller's loop (run_coroutine_threadsafe).
ProgressCallback = Callable[[float, float | None, str], Coroutine[Any, Any, None]]


class BoundedCache:
    """A thread-safe LRU holding at most `max_bytes` of values (each entry's size given)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            hit = self._items.get(key)
            if hit is None:
                return None
            self._items.move_to_end(key)
            return hit[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            self._evict()

    def grow(self, key: Hashable, size: int) -> None:
        """Count `size` more bytes for `key`'s entry (what was added to its value after `put`),
        evicting the least recent others past the budget; nothing when `key` is not held."""
        with self._lock:
            held = self._items.get(key)
            if held is None:
                return
            self._items[key] = (held[0], held[1] + size)
            self._items.move_to_end(key)
            self._bytes += size
            self._evict()

    def _evict(self) -> None:
        """Drop the least recent entries while over the budget, never the newest (lock held)."""
        while self._bytes > self.max_bytes and len(self._items) > 1:
            _, (_, n) = self._items.popitem(last=False)
            self._bytes -= n

    @property
    def size(self) -> int:
        return self._bytes

    @property
    def entries(self) -> int:
        return len(self._items)

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._items)

    def retain(self, keep: Callable[[Hashable], bool]) -> int:
        """Drop the entries whose key `keep` refuses; the bytes freed."""
        freed = 0
        with self._lock:
            for key in [k for k in self._items if not keep(k)]:
                freed += self._items.pop(key)[1]
            self._bytes -= freed
        return freed


@dataclass
class EngineCaches:
    """Derived, content-keyed data engines reuse across calls (never stale: keys hash content).

    A key is never stale, but it can be dead: an edited or deleted unit's id is never asked for
    again. `retire` drops such entries once a newer generation is served; left to the LRU they
    filled the budget with dead text under `serve --watch` (an edit every 3 s, 100 articles:
    the unit analyses grew ~3 MB/min, still filling at minute 10; benchmarks/soak.py)."""

    unit_evidence: BoundedCache = field(default_factory=lambda: BoundedCache(32 << 20))
    generation: int = 0  # the newest generation `retire` has pruned for
    _retiring: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @staticmethod
    def within(max_bytes: int) -> EngineCaches:
        return EngineCaches(BoundedCache(max_bytes))

    def retire(self, generation: int, live_units: Callable[[list[str]], Iterable[str]]
               ) -> int | None:
        """Once per generation newer than any seen: drop the unit analyses of units that
        `live_units(ids)` (those of `ids` live in `generation`) leaves out. The bytes freed;
        None when `generation` is not newer (nothing was done)."""
        with self._retiring:
            if generation <= self.generation:
                return None
            self.generation = generation
            cached = sorted({key[0] for key in self.unit_evidence.keys()
                             if isinstance(key, tuple)})
            live = set(live_units(cached)) if cached else set()
            return self.unit_evidence.retain(
                lambda key: isinstance(key, tuple) and key[0] in live)


@dataclass
class QueryContext:
    """Everything one engine call needs; engines take this and nothing global."""

    reader: CallerReader
    provider: Provider
    settings: QuerySettings
    progress: ProgressCallback | None = None
    caches: EngineCaches = field(default_factory=EngineCaches)

    @property
    def caller(self) -> Caller:
        return self.reader.caller

    async def report_progress(self, done: float, total: float | None, message: str) -> None:
        if self.progress is not None:
            await self.progress(done, total, message)
