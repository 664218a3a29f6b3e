"""Parse PDF and DOCX bytes in a child process that is killed when it takes too long.

pypdf and python-docx are pure Python over attacker-shaped input: a crafted file can keep them
busy for minutes (or forever: pypdf has had infinite-loop CVEs), and no in-process timer can stop
a thread stuck in a loop. So these formats are parsed in one long-lived child (spawned, not
forked: the indexer may run inside a threaded server), one file at a time; a file that takes over
`load_timeout_s` gets its child killed and becomes a recorded skip, and the next file starts a new
child. The child's stdout is pointed at stderr first, so nothing it prints can reach an MCP stdio
stream.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from canopy.indexer.office import LimitExceeded, Limits, MissingDependency, docx_text, pdf_text

__all__ = ["ParseFailed", "parse_office"]

log = logging.getLogger(__name__)

_PARSERS = {"pdf": pdf_text, "docx": docx_text}
_STARTUP_TIMEOUT_S = 120.0  # spawning and importing pypdf, not counted against the file


class ParseFailed(Exception):
    """The file could not be parsed: too slow, malformed, or the child died. The message is the
    skip reason (an exception type name at most: never the library's text about the file)."""


class _Child:
    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_end = ctx.Pipe()
        self.proc: BaseProcess = ctx.Process(target=_serve, args=(child_end,), daemon=True,
                                             name="canopy-parse-worker")
        self.proc.start()
        child_end.close()
        if not self.conn.poll(_STARTUP_TIMEOUT_S):
            self.kill()
            raise ParseFailed("the parser process did not start")
        self.conn.recv()  # "ready"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=10)
        self.conn.close()


_lock = threading.Lock()
_child: _Child | None = None


def parse_office(kind: str, data: bytes, limits: Limits, timeout_s: float) -> str:
    """Text of a PDF or DOCX file's bytes. Raises `LimitExceeded`, `MissingDependency` or
    `ParseFailed`, each with a one-line reason."""
    global _child
    with _lock:  # one child, one file at a time
        if _child is None or not _child.proc.is_alive():
            _child = _Child()
        child = _child
        try:
            child.conn.send((kind, data, limits))
            if not child.conn.poll(timeout_s):
                _child = None
                child.kill()
                raise ParseFailed(f"took longer than load_timeout_s ({timeout_s:g} s) to read")
            status, value = child.conn.recv()
        except (EOFError, OSError) as exc:  # the child died (killed for memory, crashed)
            _child = None
            child.kill()
            raise ParseFailed("the parser process died reading it") from exc
    if status == "ok":
        return str(value)
    if status == "limit":
        raise LimitExceeded(value)
    if status == "missing":
        raise MissingDependency(value)
    raise ParseFailed(f"could not be read: {value}")


def _serve(conn: Connection) -> None:
    """The child's loop: (kind, bytes, limits) in, (status, text or reason) out, until EOF."""
    os.dup2(2, 1)  # stray prints go to stderr, never to an MCP stdout
    logging.basicConfig(level=logging.WARNING)
    for module in ("pypdf", "docx"):
        try:
            __import__(module)
        except ImportError:
            pass
    conn.send("ready")
    while True:
        try:
            kind, data, limits = conn.recv()
        except EOFError:
            return
        try:
            reply: tuple[str, str] = ("ok", _PARSERS[kind](data, limits))
        except LimitExceeded as exc:
            reply = ("limit", str(exc))
        except MissingDependency as exc:
            reply = ("missing", str(exc))
        except Exception as exc:  # malformed file: its reason is the exception type only
            reply = ("error", type(exc).__name__)
        conn.send(reply)
