"""Side-by-side work on one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

__all__ = ["side_by_side"]

_T = TypeVar("_T")


async def side_by_side(work: Iterable[Awaitable[_T]]) -> list[_T]:
    """The results of these awaitables, run together. When one fails (or the caller is
    cancelled), the others are cancelled and awaited before the error propagates: nothing is
    left running behind a stage that ended."""
    tasks = [asyncio.ensure_future(w) for w in work]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
