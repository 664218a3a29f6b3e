"""Large imports moved out of the cyclic garbage collector's way.

A Canopy process that has imported what it needs to index holds about 140,000 long-lived
objects the garbage collector tracks (60,000 from the `openai` SDK's ~500 modules of pydantic
types, 35,000 from LanceDB), and every full collection traverses all of them again: three in a
build of A Christmas Carol, 0.14-0.16 s of its ~3 s of CPU (with these freezes: one, 0.02 s;
the collector's total 0.21-0.24 s -> 0.10-0.13 s). `gc.freeze()` moves the objects alive at
that moment into the permanent generation, which collections skip; they are still freed by
reference counting as usual. Its one cost: cyclic garbage alive at a freeze is never
collected. So Canopy freezes only right after a large import (the SDK once the provider is
made, LanceDB once imported), and only when many modules arrived since the last freeze: a
long-running server freezes a few times as it starts, never once per build or request.
"""

from __future__ import annotations

import gc
import sys
import threading

__all__ = ["MIN_NEW_MODULES", "freeze_imports"]

# Modules imported since the last freeze that make a freeze worth it (the SDK brings ~700,
# LanceDB ~300; a build or a query that imports nothing new brings none).
MIN_NEW_MODULES = 100

_lock = threading.Lock()
_modules_at_freeze = [0]


def freeze_imports(min_new_modules: int = MIN_NEW_MODULES) -> bool:
    """Freeze the objects alive now (`gc.freeze`) if at least `min_new_modules` modules were
    imported since the last freeze; True when it froze."""
    with _lock:
        n = len(sys.modules)
        if n - _modules_at_freeze[0] < min_new_modules:
            return False
        _modules_at_freeze[0] = n
        gc.freeze()
        return True
