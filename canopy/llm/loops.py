"""Per-event-loop resources: `PerLoop` makes one object (an HTTP session and its pool) per
event loop, lazily, and closes it when that loop shuts down."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["PerLoop"]


class PerLoop:
    """Objects that belong to one event loop (HTTP sessions and their pools), made lazily.

    With `close`, each object is closed when its loop shuts down: a parked async generator is
    finalised by `asyncio.run` (loop.shutdown_asyncgens), so callers need no cleanup call and
    no connection outlives its loop. Entries of closed loops are dropped."""

    def __init__(
        self, factory: Callable[[], Any], close: Callable[[Any], Awaitable[None]] | None = None
    ) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._items: dict[int, tuple[asyncio.AbstractEventLoop, Any, Any]] = {}

    async def get(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            for key, (old, _, _) in list(self._items.items()):
                if old.is_closed():
                    del self._items[key]
            entry = self._items.get(id(loop))
            if entry is not None and entry[0] is loop:
                return entry[1]
            value = self._factory()
            keeper = self._keeper(loop, value) if self._close is not None else None
            self._items[id(loop)] = (loop, value, keeper)
        if keeper is not None:
            await keeper.asend(None)  # registers it with the loop's async-generator hooks
        return value

    async def _keeper(self, loop: asyncio.AbstractEventLoop, value: Any) -> Any:
        try:
            yield
        finally:
            with self._lock:
                entry = self._items.get(id(loop))
                if entry is not None and entry[1] is value:
                    del self._items[id(loop)]
            assert self._close is not None
            await self._close(value)

    async def close(self) -> None:
        """Close the running loop's object now (if any)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._items.pop(id(loop), None)
        if entry is not None and entry[2] is not None:
            await entry[2].aclose()
