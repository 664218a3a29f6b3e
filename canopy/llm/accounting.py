"""Usage accounting per task: calls, cache hits, tokens and failures."""

from __future__ import annotations

import threading

from canopy.providers.base import Usage, record_usage

__all__ = ["UsageCounter"]


class UsageCounter:
    """Thread-safe per-task `Usage` totals (also added to the caller's open `usage_scope`s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_task: dict[str, Usage] = {}

    def add(self, task: str, **counts: int) -> None:
        with self._lock:
            usage = self._by_task.setdefault(task, Usage())
            for name, n in counts.items():
                setattr(usage, name, getattr(usage, name) + n)
        record_usage(task, **counts)

    def snapshot(self) -> dict[str, Usage]:
        with self._lock:
            return {task: Usage(**u.as_dict()) for task, u in self._by_task.items()}
