"""Canopy's errors. The server turns each into a message written for the agent; raw exception
text from libraries never reaches a caller.

    CanopyError
    ├── ConfigError            bad settings or policy (user-facing, no traceback)
    ├── IndexMissing           no index at the given folder yet
    │   └── IndexStale         a replica cannot confirm it serves the newest published
    │                          generation within its revocation bound
    ├── IndexDamaged           the index's files are unreadable or inconsistent: only
    │                          `canopy index --full` brings it back
    ├── IndexUnwritable        the index folder cannot be written now (disk full, read-only,
    │                          no permission, locked by another process): nothing is damaged
    ├── ProviderError          an LLM/embedding endpoint failed
    │   ├── EndpointUnavailable   unreachable / auth failure / retries exhausted
    │   └── InvalidOutput         output failed validation after repair (per-unit failure)
    ├── NotFound               unknown id; hidden ids raise exactly the same message
    ├── InvalidArgument        a tool or CLI argument out of range
    └── StoreUnavailable       the object store of published generations failed or refused
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "CanopyError",
    "ConfigError",
    "EndpointUnavailable",
    "IndexDamaged",
    "IndexMissing",
    "IndexStale",
    "IndexUnwritable",
    "InvalidArgument",
    "InvalidOutput",
    "NotFound",
    "ProviderError",
    "StoreUnavailable",
]


class CanopyError(Exception):
    """Base of every error Canopy raises on purpose."""


class ConfigError(CanopyError):
    pass


class IndexMissing(CanopyError):
    pass


class IndexStale(IndexMissing):
    """A replica that has not confirmed, within its revocation bound, that the generation it
    serves is still the newest published one: it answers nothing until it has (a deletion or
    revocation may have been published meanwhile). Forwarded to callers like IndexMissing."""


class IndexDamaged(CanopyError):
    """The index's database or search tables cannot be read, or disagree with each other.

    `reason` says what is wrong in words safe for any caller: no file paths, no library text
    (those go to the operator's log). `docs` is the documents folder when the code that raises
    knows it; the message then names the exact command that rebuilds the index."""

    def __init__(self, reason: str, docs: str | None = None,
                 index_dir: str | None = None) -> None:
        self.reason = reason
        self.docs = docs
        self.index_dir = index_dir
        super().__init__(reason)

    def __str__(self) -> str:
        command = f"canopy index --full {self.docs}" if self.docs else "canopy index --full <docs>"
        where = "The index"
        if self.index_dir:
            where = f"The index at {self.index_dir}"
            if self.docs and Path(self.index_dir) != Path(self.docs) / ".canopy":
                command += f" --index-dir {self.index_dir}"  # the rebuild must go there too
        return (f"{where} is damaged ({self.reason}). Rebuild it from the documents with "
                f"`{command}`.")

    def for_docs(self, docs: object, index_dir: object | None = None) -> IndexDamaged:
        """The same error, naming the documents folder and the index folder: the remedy is
        then the exact command (with --index-dir when the index is not DOCS/.canopy)."""
        return IndexDamaged(self.reason, str(docs),
                            str(index_dir) if index_dir is not None else self.index_dir)


class IndexUnwritable(CanopyError):
    """What a write to the index folder met instead of damage: a full disk, a read-only
    folder, a missing permission, a lock held by another process. The message is one line
    naming the path and what to do; a run stopped by it resumes when it is run again (what was
    committed or saved stays). Never reaches an MCP caller with its path: the server logs it."""

    def __init__(self, problem: str, path: str, remedy: str) -> None:
        self.problem = problem
        self.path = path
        self.remedy = remedy
        super().__init__(problem)

    def __str__(self) -> str:
        return f"{self.problem}: {self.path}. {self.remedy}"


class ProviderError(CanopyError):
    pass


class EndpointUnavailable(ProviderError):
    pass


class InvalidOutput(ProviderError):
    pass


class NotFound(CanopyError):
    pass


class InvalidArgument(CanopyError):
    pass


class StoreUnavailable(CanopyError):
    """The object store (or folder) that published generations live in cannot be used: not
    reachable, credentials refused, a request failed. One line, with the store's own reason."""
