"""The retry policy shared by the chat and embedding clients.

Retries with exponential backoff and jitter on 429, 5xx, timeouts and connection errors,
honouring `Retry-After` / `retry-after-ms` (plus a little jitter); when retries run out, or at
once on 401/403/404, `EndpointUnavailable` with a message naming the endpoint and the last
status. `note_failure` tells the adaptive limiter when a failure means the endpoint is
overloaded. A 429 whose error code says the account's quota is used up (`insufficient_quota`)
is not a rate limit: it fails at once, like a rejected key.

Throttled is not down: an overload reply (429/503/529) gives the call its retries back when it
names a Retry-After (a rate limiter telling the client when to come back), or when it comes
after the endpoint answered another request of the same client (`progress`, the client's count
of successful requests): the endpoint is working and the call is competing for a shared rate
budget (several workers behind one API key), not facing an outage. Such a call still gives up
after `THROTTLED_RETRY_FACTOR` x max_retries retries in all. Without it, N workers sharing one
tokens-per-minute budget lost whole builds to a request unlucky six times in a row, and with
the progress rule alone a worker that got nothing through at the start of its build lost units
(benchmarks/scaleout_sim.py, 16 workers).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception

from canopy.endpoint import ConnectFailed, EndpointError, RequestTimeout, StatusError
from canopy.errors import EndpointUnavailable
from canopy.limiter import Permit

__all__ = ["RetryPolicy", "call_with_retries", "describe", "invalid_request", "note_failure",
           "retry_after"]

T = TypeVar("T")

_RETRY_STATUSES = frozenset({408, 409, 429})
# Replies that mean "too much load": the adaptive window shrinks on these (and on timeouts).
_OVERLOAD_STATUSES = frozenset({429, 503, 529})
_FATAL_STATUSES = {
    401: "rejected the API key (HTTP 401); check CANOPY_LLM_API_KEY / CANOPY_EMBED_API_KEY",
    403: "refused access (HTTP 403); the key lacks permission for this model or endpoint",
    404: "answered HTTP 404; check the base URL (usually ending in /v1) and the model {model!r}",
}


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    backoff_base: float = 1.0  # first wait in seconds; doubles per attempt, with jitter
    backoff_max: float = 60.0  # cap of any single wait, Retry-After included


def _status(exc: BaseException | None) -> int | None:
    return exc.status if isinstance(exc, StatusError) else None


# A 429 that is not a rate limit: the account has no quota left (OpenAI's error code), which no
# wait cures. Said at once instead of retried up to THROTTLED_RETRY_FACTOR x max_retries times.
_QUOTA_CODES = frozenset({"insufficient_quota"})


def _error_code(exc: BaseException | None) -> str | None:
    """The `error.code` (else `error.type`) of an OpenAI-style error body, if any."""
    if not isinstance(exc, StatusError):
        return None
    try:
        data = json.loads(exc.body)
    except ValueError:
        return None
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return None
    code = err.get("code") or err.get("type")
    return code if isinstance(code, str) else None


def _out_of_quota(exc: BaseException | None) -> bool:
    return _status(exc) == 429 and _error_code(exc) in _QUOTA_CODES


# A request body the server's validator refused, said in a 5xx: llama-cpp-python's server answers
# FastAPI's validation errors with HTTP 500 ("1 validation error: ... Input should be 'text' or
# 'json_object'"). The same bytes get the same answer: retrying it is only waiting.
_VALIDATION = re.compile(r"validation error|Input should be|literal_error|Field required")


def invalid_request(exc: BaseException | None) -> bool:
    """The endpoint refused the request itself (400, 422, or a 5xx that is a validation error
    of the request body), so no retry can succeed."""
    status = _status(exc)
    if status in (400, 422):
        return True
    return (status is not None and status >= 500 and isinstance(exc, StatusError)
            and _VALIDATION.search(exc.message) is not None)


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectFailed, RequestTimeout)):
        return True
    status = _status(exc)
    if status is None or _out_of_quota(exc) or invalid_request(exc):
        return False
    return status in _RETRY_STATUSES or status >= 500


def retry_after(exc: BaseException | None) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    if not isinstance(exc, StatusError):
        return None
    headers = exc.headers
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(float(ms) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(when.timestamp() - time.time(), 0.0)


def note_failure(permit: Permit, exc: BaseException) -> None:
    """Tell the limiter when a failed request means the endpoint is overloaded."""
    if isinstance(exc, RequestTimeout) or _status(exc) in _OVERLOAD_STATUSES:
        permit.overloaded(retry_after(exc))


def describe(exc: BaseException) -> str:
    """A short, library-independent account of why a request failed."""
    if isinstance(exc, RequestTimeout):
        return "request timed out"
    if isinstance(exc, ConnectFailed):
        return f"connection failed ({exc})"[:300]
    status = _status(exc)
    if status is not None:
        return f"HTTP {status}"
    return type(exc).__name__


# Retries a throttled call may make in all, as a multiple of max_retries (see the docstring).
THROTTLED_RETRY_FACTOR = 4
# A Retry-After is "not before": waiting up to a quarter more (at most 1 s) spreads the clients
# told the same instant, which otherwise all come back at once into a budget that just reset.
_RETRY_AFTER_JITTER = 0.25
_RETRY_AFTER_JITTER_MAX_S = 1.0


class _RetryBudget:
    """The retries one call has left (see the module docstring)."""

    def __init__(self, max_retries: int, progress: Callable[[], int] | None) -> None:
        self.max_retries = max_retries
        self.left = max_retries
        self.used = 0
        self._progress = progress
        self._seen = progress() if progress is not None else 0

    def allow(self, exc: BaseException | None) -> bool:
        """One more retry after `exc`? (Counts it when it is allowed.)"""
        if _status(exc) in _OVERLOAD_STATUSES:
            throttled = retry_after(exc) is not None  # told when to come back
            if self._progress is not None:
                now = self._progress()
                if now > self._seen:  # the endpoint answered this client since
                    self._seen = now
                    throttled = True
            if throttled:
                self.left = self.max_retries
        if self.left <= 0 or self.used >= self.max_retries * THROTTLED_RETRY_FACTOR:
            return False
        self.left -= 1
        self.used += 1
        return True


# An endpoint that has never answered and refuses connections is most likely not running, or
# base_url is wrong: say so after one short retry instead of minutes of backoff.
FIRST_CONTACT_WAIT_S = 0.5


async def call_with_retries(
    call: Callable[[], Awaitable[T]], *, what: str, model: str, policy: RetryPolicy,
    first_contact: bool = False, progress: Callable[[], int] | None = None,
) -> T:
    """Run `call` and retry transient failures; translate endpoint failures into Canopy errors.

    `what` names the endpoint in messages ("LLM endpoint http://.../v1"). Raises
    `EndpointUnavailable` when retries run out or on 401/403/404; other 4xx `StatusError`s
    are re-raised unchanged for the caller to interpret (e.g. a rejected response_format).
    `first_contact`: the endpoint has not answered yet in this process; failing to connect then
    ends the call after one retry FIRST_CONTACT_WAIT_S later (an endpoint that answered before
    gets the full policy: it may be restarting). `progress`: the client's count of successful
    requests, which makes the retry budget throttling-aware (module docstring)."""
    budget = _RetryBudget(policy.max_retries, progress)
    try:
        return await call()
    except ConnectFailed as exc:
        if not first_contact:
            return await _with_retries(call, what=what, model=model, policy=policy, failed=exc,
                                       budget=budget)
        await asyncio.sleep(FIRST_CONTACT_WAIT_S)
        try:
            return await call()
        except ConnectFailed as again:
            raise EndpointUnavailable(
                f"{what} cannot be reached ({describe(again)}, 2 attempts): is the server "
                "running, and is base_url right?") from None
        except EndpointError as other:
            return await _with_retries(call, what=what, model=model, policy=policy,
                                       failed=other, budget=budget)
    except EndpointError as exc:
        return await _with_retries(call, what=what, model=model, policy=policy, failed=exc,
                                   budget=budget)


async def _with_retries(
    call: Callable[[], Awaitable[T]], *, what: str, model: str, policy: RetryPolicy,
    failed: EndpointError, budget: _RetryBudget,
) -> T:
    """The retries after a first attempt that failed with `failed`."""

    def wait(exc: BaseException | None, attempt: int) -> float:
        asked = retry_after(exc)
        if asked is not None:
            asked = min(asked, policy.backoff_max)
            spread = min(asked * _RETRY_AFTER_JITTER, _RETRY_AFTER_JITTER_MAX_S)
            return asked + random.uniform(0, spread)
        base = min(policy.backoff_base * 2 ** (attempt - 1), policy.backoff_max)
        return base / 2 + random.uniform(0, base / 2)  # "equal jitter"

    try:
        # The first attempt ran bare (call_with_retries): most calls succeed, and tenacity's
        # per-call set-up costs more than the rest of the retry policy together.
        if not _is_transient(failed) or not budget.allow(failed):
            raise failed
        await asyncio.sleep(wait(failed, 1))

        def later_wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return wait(exc, state.attempt_number + 1)

        def out_of_retries(state: RetryCallState) -> bool:
            return not budget.allow(state.outcome.exception() if state.outcome else None)

        async for attempt in AsyncRetrying(
            stop=out_of_retries,
            wait=later_wait,
            retry=retry_if_exception(_is_transient),
            reraise=True,
            sleep=asyncio.sleep,
        ):
            with attempt:
                result = await call()
        return result
    except EndpointError as exc:
        status = _status(exc)
        if _out_of_quota(exc):
            raise EndpointUnavailable(
                f"{what} says the account has no quota left (HTTP 429 insufficient_quota): "
                "add credit or raise the limit, then run again; what is indexed is kept.") from None
        if status in _FATAL_STATUSES:
            reason = _FATAL_STATUSES[status].format(model=model)
            raise EndpointUnavailable(f"{what} {reason}.") from None
        if _is_transient(exc):
            attempts = budget.used + 1
            n = "attempt" if attempts == 1 else "attempts"
            raise EndpointUnavailable(
                f"{what} is unavailable: {attempts} {n} failed, the last with {describe(exc)}."
            ) from None
        raise
