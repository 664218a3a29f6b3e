"""The test suite's fake OpenAI endpoint in a process of its own, driven over a pipe.

A benchmark's driver stays small (its peak RSS is not the fake's) and the fake's CPU is not
charged to the runs it serves. Each benchmark passes its own `serve(conn, *args)`: it starts
a `tests.fakes.openai_server.FakeOpenAI`, sends its base URL, then answers `(command, argument)`
pairs until "stop" (reset, stats and the like, which differ by benchmark).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

__all__ = ["FakeHost"]


class FakeHost:
    def __init__(self, serve: Callable[..., None], *args: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, theirs = ctx.Pipe()
        self._proc = ctx.Process(target=serve, args=(theirs, *args), daemon=True,
                                 name="fake-openai")
        self._proc.start()
        self.base_url: str = self._conn.recv()

    def call(self, cmd: str, arg: Any = None) -> Any:
        self._conn.send((cmd, arg))
        return self._conn.recv()

    def stop(self) -> None:
        try:
            self.call("stop")
        finally:
            self._proc.join(timeout=10)
