"""Fewer malloc arenas for Canopy's processes (glibc only).

glibc gives every thread that meets contention an arena of its own, up to 8 per core, and keeps
what each arena once held. LanceDB's index building and searches run on thread pools of their
own, so an index build's peak and a server's resident memory grow by arenas that are mostly
free space: with two arenas, a 609-article build peaks 14% lower (738 -> 637 MB, measured with
`benchmarks/growth_bench.py`-style stage probes), at no measurable cost in time. A
`MALLOC_ARENA_MAX` set in the environment is glibc's own setting and wins.

glibc also keeps the free space at the top of each arena and whole free pages inside it:
`release_free` hands them back, once a server has opened its index (the tokenizer's and the
search tables' loading leave tens of MB free in the arenas of the threads that loaded them).
A server's calls free what they allocate, but glibc gives back only the top of an arena, so
what they free stays resident until a trim: `Trimmer` trims every few seconds while calls are
being served, and once after the last; an idle server is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["SERVER_GC_THRESHOLD", "TRIM_EVERY_S", "Trimmer", "limit_arenas", "relax_collector",
           "release_free"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # mallopt parameter number, from glibc's malloc.h
DEFAULT_ARENAS = 2
_done: list[bool] = []


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def limit_arenas(arenas: int = DEFAULT_ARENAS) -> bool:
    """Cap glibc's malloc arenas at `arenas` for the rest of this process (arenas threads made
    already stay); True when the cap is in place. Once per process; nothing on other C
    libraries or when the environment sets MALLOC_ARENA_MAX."""
    if _done or not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return bool(_done and _done[0])
    ok = False
    try:
        libc = _libc()
        mallopt = getattr(libc, "mallopt", None)  # musl has none
        ok = bool(mallopt is not None and mallopt(_M_ARENA_MAX, arenas) == 1)
    except OSError as exc:
        log.debug("malloc arenas not limited: %s", exc)
    _done.append(ok)
    return ok


def release_free() -> bool:
    """Return the free memory malloc keeps in its arenas to the system (glibc's malloc_trim);
    True when glibc did so. Nothing on other C libraries."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = getattr(_libc(), "malloc_trim", None)  # glibc only
    except OSError:
        return False
    return bool(trim is not None and trim(0) == 1)


# Seconds between a busy server's trims. With 16 callers between updates in one process
# (benchmarks/heap_concurrent.py), a trim once they had finished gave back 35-45 MB every time,
# on top of the trim at each generation's first call, which runs while other calls hold
# theirs. A trim took ~28 ms under issue 30's soak (294 in 10 minutes, ~1.4% of a core), and
# did not lower the slope of RSS there (benchmarks/README.md, "Issue 30").
TRIM_EVERY_S = 2.0


class Trimmer:
    """Calls `release_free` every `every` seconds on a thread of its own when calls finished
    since its last trim (`note`), so a busy server's freed memory goes back to the system
    within seconds and an idle one is not woken. Nothing is started off Linux."""

    def __init__(self, every: float = TRIM_EVERY_S,
                 trim: Callable[[], bool] | None = None) -> None:
        self.every = every
        self._trim = trim
        self._lock = threading.Lock()
        self._pending = 0  # calls finished since the last trim
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.trims = 0
        self.seconds = 0.0  # spent trimming (glibc holds each arena's lock while it trims it)

    def start(self) -> Trimmer:
        if self._thread is None and sys.platform.startswith("linux"):
            self._thread = threading.Thread(target=self._run, daemon=True, name="canopy-trim")
            self._thread.start()
        return self

    def note(self) -> None:
        """A call finished: its freed memory is handed back at the next tick."""
        with self._lock:
            self._pending += 1

    def tick(self) -> bool:
        """Trim if calls finished since the last trim; True when it did."""
        with self._lock:
            pending, self._pending = self._pending, 0
        if not pending:
            return False
        t = time.perf_counter()
        (self._trim or release_free)()
        with self._lock:
            self.trims += 1
            self.seconds += time.perf_counter() - t
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


# Python's cycle collector runs after every 700 new container objects by default; a call of a
# server creates tens of thousands (rows, tuples, evidence sets), nearly all freed by their
# reference counts, so the collector ran about five times per call and found little. At 10,000
# articles, 79 DEV questions answered by local_search and basic_search in one process spent
# 1.9-2.1 s of 21 s in 840 collections; at 50,000 it spent 0.19 s in 5, and the whole run took
# 17.7-19 s (the garbage cycles waiting for the next collection are a few MB).
SERVER_GC_THRESHOLD = 50_000


def relax_collector() -> None:
    """Collect cycles after SERVER_GC_THRESHOLD new container objects (servers; the older
    generations keep their thresholds)."""
    young, middle, old = gc.get_threshold()
    if young < SERVER_GC_THRESHOLD:
        gc.set_threshold(SERVER_GC_THRESHOLD, middle, old)
