"""The test suite's fake OpenAI endpoint in a process of its own, driven over a pipe.

A benchmark's driver stays small (its peak RSS is not the fake's) and the fake's CPU is not
charged to the runs it serves. Each benchmark passes its own `serve(conn, *args)`: it starts
a `tests.fakes.openai_server.FakeOpenAI`, sends its base URL, then answers `(command, argument)`
pairs until "stop" (reset, stats and the like, which differ by benchmark).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["FakeHost", "serve_with_latency"]

REPO = Path(__file__).resolve().parents[1]


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


def serve_with_latency(conn: Any, latency: float) -> None:
    """A fake with a fixed latency per request. "reset" takes None or (capacity, retry_after)
    for a fake that refuses with 429 past `capacity` requests in flight; "stats" gives the
    requests, the refusals and the in-flight figures since the last reset, "spans" each request as
    (task, arrival, reply, messages in its conversation)."""
    sys.path.insert(0, str(REPO))
    from tests.fakes.openai_server import FakeOpenAI

    fake = FakeOpenAI(latency=latency).start()
    conn.send(fake.base_url)
    while True:
        cmd, arg = conn.recv()
        if cmd == "reset":
            fake.reset()
            if arg is not None:
                fake.capacity, fake.capacity_retry_after = arg
            conn.send(None)
        elif cmd == "stats":
            conn.send({"requests": len(fake.requests), "refused": fake.refused,
                       **fake.in_flight_stats()})
        elif cmd == "spans":  # every request since the reset, bodies dropped: the pipe stays light
            conn.send([(r.task, r.time, r.finished or r.time, len(r.body.get("messages") or []))
                       for r in fake.requests])
        else:
            fake.stop()
            conn.send(None)
            return
