"""MCP over stdio that answers every malformed request (issue 9, case 11).

The SDK's stdio transport (mcp 2.3) parses each line with `jsonrpc_message_adapter.validate_json`
and hands a failure to the session as an exception, which the dispatcher only logs: a request
with a lone surrogate escape (`"\\ud800"`), `params` as a list, or deep nesting got no reply at
all, and a client waited forever. Here each line is checked first and a bad one is answered with
a JSON-RPC error while the server keeps serving:

- -32700 parse error: not UTF-8, not JSON, or a string holding a lone surrogate;
- -32600 invalid request: not one JSON-RPC 2.0 message object, an id that is not a string or
  an integer, nested deeper than `MAX_DEPTH`, or longer than `MAX_LINE_BYTES`;
- -32602 invalid params: `params` that is not an object (MCP params are always objects).

The error carries the request's id when one can be read, else null. A malformed notification
(no id) gets no reply, as JSON-RPC requires, nor does a malformed response or error. Lines that
pass go to the SDK's own `stdio_server` unchanged, with the same discipline for the process's
descriptors: while serving, fd 0 reads the null device and fd 1 writes to stderr, so stray output
from handlers or children never reaches the wire.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any, BinaryIO

import anyio
import mcp_types as types
from mcp.server import MCPServer
from mcp.server.stdio import stdio_server

__all__ = ["MAX_DEPTH", "MAX_LINE_BYTES", "check_line", "serve_stdio"]

log = logging.getLogger(__name__)

MAX_LINE_BYTES = 8 * 1024 * 1024  # one message; tool arguments are a few KB
MAX_DEPTH = 64  # nesting of objects and arrays; MCP messages use well under 10

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
_TOO_DEEP = f"Invalid request: nested deeper than {MAX_DEPTH} levels"


def check_line(raw: bytes) -> tuple[str | None, bytes | None]:
    """(the line as text for the SDK, None), or (None, the JSON-RPC error reply to write),
    or (None, None) for a line to drop silently (blank, or a malformed notification)."""
    if not raw.strip():
        return None, None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, _error(None, PARSE_ERROR, "Parse error: the message is not UTF-8")
    try:
        message = json.loads(text)
    except RecursionError:
        return None, _error(None, INVALID_REQUEST, _TOO_DEEP)
    except ValueError:
        return None, _error(None, PARSE_ERROR, "Parse error: the message is not valid JSON")
    if not isinstance(message, dict):
        return None, _error(None, INVALID_REQUEST, "Invalid request: expected one JSON-RPC "
                            "message object (batches are not supported)")
    request_id = _usable_id(message.get("id"))
    # Never answered: a notification, and a message that is itself a response or an error (two
    # strict peers answering each other's malformed errors would never stop).
    is_notification = ("id" not in message and isinstance(message.get("method"), str)
                       or "method" not in message and ("result" in message or "error" in message))
    problem = _shape_problem(message)
    if problem is None and "id" in message and request_id is None:
        problem = INVALID_REQUEST, "Invalid request: id must be a string or an integer"
    if problem is not None:
        code, text_problem = problem
        return None, (None if is_notification else _error(request_id, code, text_problem))
    try:
        types.jsonrpc_message_adapter.validate_json(text, by_name=False)
    except Exception:
        if is_notification:
            return None, None
        if "params" in message and not isinstance(message["params"], dict):
            return None, _error(request_id, INVALID_PARAMS,
                                "Invalid params: params must be an object")
        return None, _error(request_id, INVALID_REQUEST,
                            "Invalid request: not a JSON-RPC 2.0 message")
    return text, None


def _shape_problem(message: dict[str, Any]) -> tuple[int, str] | None:
    """What makes a parsed message unusable before the SDK sees it: a lone surrogate anywhere
    (it could never be written back as UTF-8) or nesting past MAX_DEPTH (walked iteratively)."""
    stack: list[tuple[Any, int]] = [(message, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            return INVALID_REQUEST, _TOO_DEEP
        if isinstance(value, dict):
            for key, item in value.items():
                if not _is_unicode(key):
                    return PARSE_ERROR, "Parse error: a string holds a lone surrogate escape"
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and not _is_unicode(value):
            return PARSE_ERROR, "Parse error: a string holds a lone surrogate escape"
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _usable_id(value: Any) -> int | str | None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    return value if not isinstance(value, str) or _is_unicode(value) else None


def _error(request_id: int | str | None, code: int, message: str) -> bytes:
    body = {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}
    return json.dumps(body, ensure_ascii=False).encode("utf-8") + b"\n"


class _Wire:
    """The protocol's end of stdout: whole lines, one writer at a time."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = anyio.Lock()

    async def write(self, text: str) -> None:
        await self.write_bytes(text.encode("utf-8"))

    async def write_bytes(self, data: bytes) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._write_flush, data)

    async def flush(self) -> None:
        return None  # every write is flushed whole

    def _write_flush(self, data: bytes) -> None:
        self._out.write(data)
        self._out.flush()


class _CheckedLines:
    """stdin for the SDK's transport: yields the lines that pass `check_line`, answers the rest."""

    def __init__(self, source: BinaryIO, wire: _Wire) -> None:
        self._source = source
        self._wire = wire

    def __aiter__(self) -> AsyncIterator[str]:
        return self._lines()

    async def _lines(self) -> AsyncIterator[str]:
        while True:
            raw = await anyio.to_thread.run_sync(self._source.readline, MAX_LINE_BYTES + 1,
                                                 abandon_on_cancel=True)
            if not raw:
                return
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                await anyio.to_thread.run_sync(self._discard_rest, abandon_on_cancel=True)
                await self._wire.write_bytes(_error(
                    None, INVALID_REQUEST, f"Invalid request: longer than {MAX_LINE_BYTES} bytes"))
                continue
            text, reply = check_line(raw)
            if reply is not None:
                log.warning("answered a malformed stdio message: %s", reply.decode()[:200].strip())
                await self._wire.write_bytes(reply)
            if text is not None:
                yield text

    def _discard_rest(self) -> None:
        while (chunk := self._source.readline(1 << 20)) and not chunk.endswith(b"\n"):
            pass


@contextmanager
def _claimed_stdio() -> Iterator[tuple[BinaryIO, BinaryIO]]:
    """Private duplicates of fds 0 and 1 for the protocol; while serving, fd 0 reads the null
    device and fd 1 writes to stderr. Restored on exit. Where the descriptors cannot be
    duplicated, the standard streams are served in place (as the SDK does)."""
    try:
        wire_in, wire_out = os.dup(0), os.dup(1)
    except OSError:
        yield sys.stdin.buffer, sys.stdout.buffer
        return
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(2, 1)
    source = os.fdopen(wire_in, "rb")
    out = os.fdopen(wire_out, "wb")
    try:
        yield source, out
    finally:
        out.flush()
        os.dup2(out.fileno(), 1)
        os.dup2(source.fileno(), 0)
        out.close()
        source.close()


async def serve_stdio(server: MCPServer) -> None:
    """Serve `server` over this process's stdin and stdout until stdin closes."""
    with _claimed_stdio() as (source, out):
        wire = _Wire(out)
        # Duck-typed to the AsyncFile[str] the SDK reads and writes (async iteration; write/flush).
        stdin: Any = _CheckedLines(source, wire)
        stdout: Any = wire
        async with stdio_server(stdin=stdin, stdout=stdout) as (read_stream, write_stream):
            # MCPServer.run_stdio_async is these lines with the SDK's unchecked transport; the
            # low-level server has no public accessor in mcp 2.3.
            lowlevel = server._lowlevel_server
            await lowlevel.run(read_stream, write_stream, lowlevel.create_initialization_options())
