"""Adaptive concurrency for the requests to one endpoint: an AIMD window every caller shares.

A fixed number of requests in flight is wrong for most endpoints: 8 leaves a hosted API that
answers in 500 ms mostly idle, and 64 floods a laptop's Ollama. `AdaptiveLimiter` finds the
level the endpoint sustains, the way TCP finds a link's capacity:

- **Slow start.** From `initial`, each reply that came back while callers were queueing for a
  slot widens the window by one (the window doubles every round trip) until the first sign of
  overload; after that it grows by about one request per round trip (additive increase).
- **Multiplicative decrease on overload.** A 429/503/529 or a timeout cuts the window to 70%
  (TCP CUBIC's factor: the window then saws between 70% and 100% of what the server allows; a
  halving left a quota-limited endpoint a quarter idle), once per round trip: replies to
  requests sent before the last decrease do not count again (otherwise one burst of 25
  throttled replies would cut the window 25 times).
- **Retry-After pauses everyone.** When an overloaded reply names a wait, no caller starts a
  request until that time, not just the one that was told.
- **Latency holds growth.** Each task's request duration, and its duration per completion
  token, are tracked against that task's best (floors that creep up slowly). While both smoothed
  ratios exceed `latency_tolerance` the endpoint is queueing rather than working in parallel, so
  the window stops growing and shrinks (by tolerance/ratio, between x0.5 and x0.9, once per
  round trip), never below `initial`: only the server's own overload signals push the window
  below where it started.
- Growth only happens while demand exceeds the window, so an idle client never inflates it.

The window never leaves [floor, ceiling]. `adaptive=False` is a plain semaphore of `ceiling`
slots that still honours Retry-After pauses.

One limiter is shared by every task, thread and event loop that calls the endpoint: waiters are
futures of their own loop, woken thread-safely, so concurrent callers always share one window.

Why not a library: the PyPI limiters we looked at are rate-based (aiolimiter, pyrate-limiter),
fixed (aiometer, asyncio-throttle), or adaptive but bound to one event loop, without Retry-After
pauses or a latency signal, and resizing a private asyncio.Semaphore field (gentlify 2.0).
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

__all__ = ["AdaptiveLimiter", "LimiterStats", "Permit"]

# Completion tokens are the main driver of an LLM request's duration; this many "token
# equivalents" stand for the fixed part (queueing, prompt processing) so that short replies
# do not look slow per token.
_FIXED_TOKENS = 16
_BASELINE_DRIFT = 0.002  # how fast a task's best latency creeps up towards new samples
_RATIO_SMOOTHING = 0.3  # weight of a new sample in the latency ratios (EWMA)
_OVERLOAD_FACTOR = 0.7  # as TCP CUBIC: a sawtooth between 70% and 100% of what the server allows


@dataclass(frozen=True)
class LimiterStats:
    """What the limiter achieved since it was made (one index run, or one server's life)."""

    adaptive: bool
    window: float  # requests in flight the limiter allows now
    floor: int
    ceiling: int
    requests: int  # requests admitted, retries included
    peak_in_flight: int
    mean_in_flight: float  # time-weighted, from the first request to the last reply
    span_s: float  # from the first request to the last reply
    busy_s: float  # time with at least one request in flight
    throttled: int  # overload replies (429/503/529) and timeouts
    backoffs: int  # times the window was cut (overload or latency)
    paused_s: float  # time new requests were held back because the server said Retry-After

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


class Permit:
    """One admitted request. Report how it went with `succeeded` or `overloaded`; a permit left
    unreported (cancelled, or failed for another reason) leaves the window alone."""

    __slots__ = ("task", "start", "epoch", "outcome", "tokens", "retry_after")

    def __init__(self, task: str, start: float, epoch: int) -> None:
        self.task = task
        self.start = start
        self.epoch = epoch
        self.outcome: str | None = None
        self.tokens = 0
        self.retry_after: float | None = None

    def succeeded(self, completion_tokens: int = 0) -> None:
        self.outcome = "ok"
        self.tokens = completion_tokens

    def overloaded(self, retry_after: float | None = None) -> None:
        self.outcome = "overload"
        self.retry_after = retry_after


_Waiter = tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class AdaptiveLimiter:
    """See the module docstring. `async with limiter.slot(task) as permit: ...`"""

    def __init__(
        self,
        *,
        ceiling: int,
        initial: int | None = None,
        floor: int = 1,
        adaptive: bool = True,
        latency_tolerance: float = 2.0,
        max_pause: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ceiling < 1 or floor < 1:
            raise ValueError("ceiling and floor must be at least 1")
        self.ceiling = ceiling
        self.floor = min(floor, ceiling)
        self.initial = max(self.floor, min(initial or ceiling, ceiling))
        self.adaptive = adaptive
        self.latency_tolerance = latency_tolerance
        self.max_pause = max_pause
        self._clock = clock
        self._lock = threading.Lock()
        self._window = float(self.initial if adaptive else ceiling)
        self._threshold = float(ceiling)  # slow start below it, additive increase above
        self._epoch = 0
        self._in_flight = 0
        self._waiters: deque[_Waiter] = deque()
        self._pause_until = 0.0
        self._timers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, float] = (
            weakref.WeakKeyDictionary()
        )
        self._baseline: dict[tuple[str, str], float] = {}
        self._ratio_raw = 1.0  # smoothed duration / best duration
        self._ratio_token = 1.0  # smoothed (duration per completion token) / best
        # accounting
        self._requests = 0
        self._peak = 0
        self._area = 0.0
        self._busy = 0.0
        self._first: float | None = None  # first admission
        self._last = 0.0  # last admission or release
        self._mark = 0.0  # time up to which _area and _busy are integrated
        self._throttled = 0
        self._successes = 0
        self._backoffs = 0
        self._paused = 0.0

    # ---- public ---------------------------------------------------------------------------

    @asynccontextmanager
    async def slot(self, task: str = "") -> AsyncIterator[Permit]:
        """Wait for a place under the window (and for any Retry-After pause), hold it for the
        body, then adapt the window to how the request went."""
        await self._acquire()
        with self._lock:
            permit = Permit(task, self._clock(), self._epoch)
        try:
            yield permit
        finally:
            self._release(permit)

    def stats(self) -> LimiterStats:
        with self._lock:
            now = self._clock()
            self._tick(now)
            end = now if self._in_flight else self._last
            span = (end - self._first) if self._first is not None else 0.0
            return LimiterStats(
                adaptive=self.adaptive,
                window=round(self._window, 2),
                floor=self.floor,
                ceiling=self.ceiling,
                requests=self._requests,
                peak_in_flight=self._peak,
                mean_in_flight=round(self._area / span, 2) if span > 0 else 0.0,
                span_s=round(span, 3),
                busy_s=round(self._busy, 3),
                throttled=self._throttled,
                backoffs=self._backoffs,
                paused_s=round(self._paused, 3),
            )

    def successes(self) -> int:
        """Requests that came back well so far (a retry policy reads it as "the endpoint is
        answering": `canopy.llm.retries`)."""
        return self._successes

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def window(self) -> float:
        return self._window

    # ---- admission --------------------------------------------------------------------------

    def _limit(self) -> int:
        return max(self.floor, min(self.ceiling, int(self._window)))

    async def _acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            now = self._clock()
            if not self._waiters and now >= self._pause_until and self._in_flight < self._limit():
                self._admit(now)
                return
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, fut))
            paused_until = self._pause_until if now < self._pause_until else None
        if paused_until is not None:
            self._wake_at(loop, paused_until)
        try:
            await fut
        except asyncio.CancelledError:
            with self._lock:
                granted = fut.done() and not fut.cancelled()
                if not granted:
                    try:
                        self._waiters.remove((loop, fut))
                    except ValueError:
                        pass  # popped by _wake: its hand-over sees the cancelled future
            if granted:
                self._give_back()
            raise

    def _admit(self, now: float) -> None:
        """Count one more request in flight (lock held)."""
        self._tick(now)
        if self._first is None:
            self._first = self._mark = now
        self._last = now
        self._in_flight += 1
        self._requests += 1
        self._peak = max(self._peak, self._in_flight)

    def _tick(self, now: float) -> None:
        """Integrate requests in flight over time (lock held)."""
        if self._first is None:
            return
        dt = now - self._mark
        if dt > 0:
            self._area += self._in_flight * dt
            if self._in_flight:
                self._busy += dt
            self._mark = now

    def _wake(self) -> None:
        """Hand free places to waiters in order, or arrange to be called when a pause ends."""
        granted: list[_Waiter] = []
        timers: set[asyncio.AbstractEventLoop] = set()
        with self._lock:
            now = self._clock()
            until = self._pause_until
            if now < until:
                timers = {loop for loop, _ in self._waiters}
            else:
                while self._waiters and self._in_flight < self._limit():
                    loop, fut = self._waiters.popleft()
                    if fut.done():  # cancelled while queued; its task removes nothing
                        continue
                    self._admit(now)
                    granted.append((loop, fut))
        for loop, fut in granted:
            self._hand_over(loop, fut)
        for loop in timers:
            self._wake_at(loop, until)

    def _hand_over(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None]) -> None:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is running:
            self._grant(fut)
            return
        try:
            loop.call_soon_threadsafe(self._grant, fut)
        except RuntimeError:  # that loop is closed: nobody waits there any more
            self._give_back()

    def _grant(self, fut: asyncio.Future[None]) -> None:
        if fut.done():  # cancelled between being chosen and being told
            self._give_back()
        else:
            fut.set_result(None)

    def _give_back(self) -> None:
        """Return a place that was admitted but never used."""
        with self._lock:
            self._tick(self._clock())
            self._in_flight -= 1
            self._requests -= 1
        self._wake()

    def _wake_at(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        """Run `_wake` on `loop` when the pause ends (once per loop and pause)."""
        with self._lock:
            if self._timers.get(loop, 0.0) >= until:
                return
            self._timers[loop] = until
            delay = max(0.0, until - self._clock())
        try:
            loop.call_soon_threadsafe(loop.call_later, delay, self._wake)
        except RuntimeError:
            pass  # closed loop: its waiters are gone with it

    # ---- adaptation -------------------------------------------------------------------------

    def _release(self, permit: Permit) -> None:
        with self._lock:
            now = self._clock()
            self._tick(now)
            saturated = bool(self._waiters) or self._in_flight >= self._limit()
            self._in_flight -= 1
            self._last = now
            if permit.outcome == "overload":
                self._throttled += 1
                if permit.retry_after:
                    self._pause(now, min(permit.retry_after, self.max_pause))
                if self.adaptive and permit.epoch == self._epoch:
                    self._cut(_OVERLOAD_FACTOR, self.floor)
            elif permit.outcome == "ok":
                self._successes += 1
                if self.adaptive:
                    self._on_success(permit, now - permit.start, saturated)
        self._wake()

    def _pause(self, now: float, seconds: float) -> None:
        until = now + seconds
        if until > self._pause_until:
            self._paused += until - max(now, self._pause_until)
            self._pause_until = until

    def _cut(self, factor: float, lowest: int) -> None:
        """One multiplicative decrease; later replies to earlier requests do not cut again."""
        self._window = max(float(lowest), self._window * factor)
        self._threshold = self._window
        self._epoch += 1
        self._backoffs += 1
        self._ratio_raw = self._ratio_token = 1.0

    def _on_success(self, permit: Permit, elapsed: float, saturated: bool) -> None:
        # Queueing at the endpoint raises both the request's duration and its duration per
        # completion token above the task's best. Either alone misleads: long replies take
        # longer (hosted APIs), and some servers answer in fixed time whatever the length.
        raw = self._vs_best(("s", permit.task), elapsed)
        per_token = self._vs_best(("t", permit.task), elapsed / (permit.tokens + _FIXED_TOKENS))
        self._ratio_raw += (raw - self._ratio_raw) * _RATIO_SMOOTHING
        self._ratio_token += (per_token - self._ratio_token) * _RATIO_SMOOTHING
        ratio = min(self._ratio_raw, self._ratio_token)
        if ratio > self.latency_tolerance:
            if permit.epoch == self._epoch and self._window > self.initial:
                # Queueing makes latency grow with the window: shrink it by about as much as
                # latency is over the tolerance, by a tenth at least and by half at most.
                factor = min(0.9, max(0.5, self.latency_tolerance / ratio))
                self._cut(factor, self.initial)
            return
        if saturated and self._window < self.ceiling:
            step = 1.0 if self._window < self._threshold else 1.0 / self._window
            self._window = min(float(self.ceiling), self._window + step)

    def _vs_best(self, key: tuple[str, str], sample: float) -> float:
        """`sample` over the best seen for `key` (a floor that creeps up towards new samples)."""
        best = self._baseline.get(key)
        if best is None or sample < best:
            best = sample
        else:
            best += (sample - best) * _BASELINE_DRIFT
        self._baseline[key] = best
        return sample / best if best > 0 else 1.0
