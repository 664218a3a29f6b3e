"""Endpoint requests sent from the writer through Ray workers (`canopy index --ray`).

`EndpointWorker` is a Ray actor that holds one `canopy.endpoint.JsonEndpoint` (its connection
pool) and makes POSTs for the writer; `RemoteEndpoint` is the writer's `Endpoint` that hands
each POST to the least busy actor of a pool. Everything around the POST stays in the writer's
client (`ChatClient`, `OpenAIEmbedder`): the response cache, the one AIMD window of requests in
flight, retries with Retry-After, structured-output parsing and the accounting. So a build on
Ray sends the same requests, paced by the same window, as a local one: a 429 seen by any worker
cuts the window every worker's requests pass through, and a Retry-After pauses them all.

Why the window is not an actor of its own: every request starts in the writer, so the writer's
window already bounds what all workers send together; an actor would add two round trips per
attempt (acquire and release, each about a Ray call: benchmarks/README.md) for no extra safety.

Failures come back as values, not exceptions (`Reply`): the retry policy needs the status,
headers and body of a `StatusError` exactly as a local request would raise it, and a Ray worker
that died mid-request is a connection failure like any other (retried by the same policy).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from canopy.endpoint import (
    ConnectFailed,
    EndpointConfig,
    EndpointError,
    JsonEndpoint,
    RequestTimeout,
    StatusError,
    local_endpoint,
)

__all__ = ["EndpointPool", "EndpointWorker", "Reply", "RemoteEndpoint"]


@dataclass(frozen=True)
class Reply:
    """One POST's outcome, as sent back from a worker."""

    kind: str  # ok | status | timeout | connect
    body: bytes = b""
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    detail: str = ""
    seconds: float = 0.0  # the POST itself, on the worker

    def result(self) -> bytes:
        """The body, or the exception a local `JsonEndpoint.post` would have raised."""
        if self.kind == "ok":
            return self.body
        if self.kind == "status":
            raise StatusError(self.status, self.headers, self.body)
        if self.kind == "timeout":
            raise RequestTimeout(self.detail)
        raise ConnectFailed(self.detail)


class EndpointWorker:
    """A Ray actor (async: many POSTs in flight on one event loop) holding one endpoint's
    connection pool. Made by `EndpointPool` with `ray.remote(EndpointWorker).options(...)`."""

    def __init__(self, config: EndpointConfig) -> None:
        self._config = config
        self._endpoint: JsonEndpoint | None = None  # made in the actor's own event loop

    async def post(self, path: str, data: bytes) -> Reply:
        if self._endpoint is None:
            self._endpoint = local_endpoint(self._config)
        t0 = time.perf_counter()
        try:
            body = await self._endpoint.post(path, data)
        except StatusError as exc:
            return Reply("status", exc.body, exc.status, exc.headers,
                         seconds=time.perf_counter() - t0)
        except RequestTimeout as exc:
            return Reply("timeout", detail=str(exc), seconds=time.perf_counter() - t0)
        except EndpointError as exc:  # ConnectFailed
            return Reply("connect", detail=str(exc), seconds=time.perf_counter() - t0)
        return Reply("ok", body, seconds=time.perf_counter() - t0)

    def ready(self) -> bool:
        return True


@dataclass
class PoolStats:
    """What a pool's POSTs cost on top of the requests themselves."""

    calls: int = 0
    # From submitting a POST to its reply arriving in the writer (on Ray's thread), less the
    # POST's own time on the worker: Ray's dispatch, the actor's queue, the reply's way back.
    overhead_s: float = 0.0
    # From the reply arriving to the waiting request resuming: the writer's event loop was busy
    # (a local request waits the same, inside its POST time).
    waited_s: float = 0.0
    lost: int = 0  # POSTs whose worker died (retried by the client's policy)
    startup_s: float = 0.0  # from the first POST until every actor had started


class EndpointPool:
    """The actors that make one endpoint's requests, and the writer's accounting of them."""

    def __init__(self, config: EndpointConfig, workers: int) -> None:
        per_worker = max(1, -(-config.connections // workers))  # each takes its share
        # No CPU reserved (the actors wait on the network); a little more concurrency than
        # their share, since the least busy actor may get one over it; restarted when lost,
        # while the lost request is the client's to retry (its own policy), not Ray's.
        actor = ray.remote(EndpointWorker).options(
            max_concurrency=per_worker + 4, num_cpus=0, max_restarts=3, max_task_retries=0,
            scheduling_strategy="SPREAD")
        worker_config = EndpointConfig(config.base_url, config.api_key, config.timeout_s,
                                       per_worker)
        # Ray's handle types do not follow async methods: the handles are Any here.
        self.actors: list[Any] = [actor.remote(worker_config) for _ in range(workers)]
        self.stats = PoolStats()
        self._busy = [0] * workers
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._started = False

    async def _start(self) -> None:
        """Wait until every actor has started (its process up, Canopy imported), so that
        start-up is not counted as the first requests' overhead."""
        t0 = time.perf_counter()
        await asyncio.gather(*(a.ready.remote() for a in self.actors))
        if not self._started:
            self._started = True
            self.stats.startup_s = time.perf_counter() - t0

    def _pick(self) -> int:
        """The actor with the fewest POSTs in flight (ties in turn)."""
        with self._lock:
            start = next(self._turn) % len(self.actors)
            order = [(start + k) % len(self.actors) for k in range(len(self.actors))]
            i = min(order, key=lambda k: self._busy[k])
            self._busy[i] += 1
            return i

    async def post(self, path: str, data: bytes) -> bytes:
        if not self._started:
            try:
                await self._start()
            except ray.exceptions.RayError as exc:
                raise ConnectFailed(f"Ray workers did not start ({type(exc).__name__})") from None
        i = self._pick()
        arrived: list[float] = []
        t0 = time.perf_counter()
        try:
            future = self.actors[i].post.remote(path, data).future()
            future.add_done_callback(lambda _: arrived.append(time.perf_counter()))
            reply: Reply = await asyncio.wrap_future(future)
        except ray.exceptions.RayError as exc:  # the worker died, or the cluster went away
            with self._lock:
                self.stats.lost += 1
            raise ConnectFailed(f"Ray worker lost ({type(exc).__name__})") from None
        finally:
            with self._lock:
                self._busy[i] -= 1
        resumed = time.perf_counter()
        came = arrived[0] if arrived else resumed
        with self._lock:
            self.stats.calls += 1
            self.stats.overhead_s += max(0.0, came - t0 - reply.seconds)
            self.stats.waited_s += max(0.0, resumed - came)
        return reply.result()

    def close(self) -> None:
        for a in self.actors:
            ray.kill(a)


class RemoteEndpoint:
    """The writer's `Endpoint` for one event loop: POSTs go to the pool's workers."""

    def __init__(self, pool: EndpointPool) -> None:
        self._pool = pool

    async def post(self, path: str, data: bytes) -> bytes:
        return await self._pool.post(path, data)

    async def close(self) -> None:
        """Nothing per loop: the pool's actors live until the build's executor closes."""
