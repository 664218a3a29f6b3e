"""The first build of a folder that has no index yet, run behind a server that already answers.

Agent hosts give a server 10-60 s to answer the MCP handshake; the first index of a folder can
take minutes. So `canopy serve` answers at once and builds on a thread: until the first
generation commits, every tool call is answered with what the build is doing (stage, progress,
time so far), and from the commit on, by the index. A build that fails says so in every answer
and in the log; restarting the server resumes it (extractions are saved as they finish).

`canopy serve --http --workers N` builds in the supervisor process: each worker's slot
(`ServiceSlot.once_built`) opens the service at the first call after the build committed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from canopy.errors import CanopyError, IndexMissing
from canopy.health import check_database
from canopy.server.runtime import Workspace, build_index
from canopy.server.service import CanopyService

__all__ = ["ServiceSlot"]

log = logging.getLogger(__name__)


class ServiceSlot:
    """The service the tools use: opened now, or once the first build commits."""

    def __init__(self, service: CanopyService | None = None, docs: str = "") -> None:
        self._service = service
        self._docs = docs
        self._elsewhere: tuple[Callable[[], CanopyService], Path] | None = None
        self._lock = threading.Lock()
        self._stage, self._done, self._total = "starting", 0, 0
        self._started = time.monotonic()
        self._error: str | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def once_built(cls, open_service: Callable[[], CanopyService], index_dir: Path,
                   docs: str) -> ServiceSlot:
        """A slot whose first build runs in another process: the service opens at the first
        call that finds a committed generation in `index_dir`."""
        slot = cls(docs=docs)
        slot._elsewhere = (open_service, index_dir)
        slot._stage = "in the server's main process"
        return slot

    @property
    def service(self) -> CanopyService:
        """The opened service, or IndexMissing saying how far the first build has come."""
        if self._service is not None:
            return self._service
        if self._elsewhere is not None:
            open_service, index_dir = self._elsewhere
            facts = check_database(index_dir)
            if not isinstance(facts, str) and facts.generation > 0:
                with self._lock:
                    if self._service is None:
                        self._service = open_service()
                return self._service
        raise IndexMissing(self.describe())

    def describe(self) -> str:
        with self._lock:
            if self._error is not None:
                return (f"The first index build of {self._docs} failed: {self._error}. The "
                        "server log has the details; fix the cause and restart the server, "
                        "which resumes the build.")
        return (f"Canopy is building the first index of {self._docs} ({self.progress()}). "
                "Nothing can be answered before it commits; call again in a minute.")

    def progress(self) -> str:
        """Where the build is: "extract 12/40, 35 s so far"."""
        with self._lock:
            took = time.monotonic() - self._started
            where = (f"{self._stage} {self._done}/{self._total}" if self._total
                     else self._stage)
        return f"{where}, {took:.0f} s so far"

    @property
    def building(self) -> bool:
        """A first build is running in this process (started here, neither committed nor
        failed yet)."""
        return (self._thread is not None and self._thread.is_alive() and self._service is None
                and self._error is None)

    def build(self, open_service: Callable[[], CanopyService], ws: Workspace) -> None:
        """Build `ws`'s first index on a daemon thread, then open the service with
        `open_service`. Daemon: when the host goes away (stdin closes) the server returns and
        the process exits at once, the OS releasing the writer lock; the build is stopped
        where it was, as by a crash, and a later `canopy index` or `canopy serve` resumes from
        the extractions it saved. (A non-daemon thread would keep the process, and the lock,
        until the build ended: minutes, for a large folder.)"""
        self._thread = threading.Thread(target=self._build, args=(open_service, ws),
                                        daemon=True, name="canopy-first-build")
        self._thread.start()

    def _progress(self, stage: str, total: int) -> Callable[[int], None]:
        with self._lock:
            self._stage, self._done, self._total = stage, 0, total

        def advance(n: int) -> None:
            with self._lock:
                if self._stage == stage:
                    self._done += n

        return advance

    def _build(self, open_service: Callable[[], CanopyService], ws: Workspace) -> None:
        try:
            result = build_index(ws, progress=self._progress)
            log.info("first index of %s built: %d documents in %.1f s", ws.docs_dir,
                        result.stats.get("documents", 0), result.elapsed_s)
            self._service = open_service()
        except CanopyError as exc:
            log.error("the first index build of %s failed: %s", ws.docs_dir, exc)
            with self._lock:
                self._error = str(exc)
        except Exception as exc:  # the thread must leave a message, whatever went wrong
            log.exception("the first index build of %s failed", ws.docs_dir)
            with self._lock:
                self._error = f"{type(exc).__name__} (see the server log)"

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
