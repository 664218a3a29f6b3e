"""Throttled is not down: a call's retry budget comes back when an overload reply names a
Retry-After or while the client's other requests succeed (workers sharing one rate budget), and
only for overload replies, within a cap.

Drives `call_with_retries` with scripted attempts (no network: what is under test is the
policy's counting, the HTTP side is covered by test_llm_client and test_fake_rate_limit).
"""

from __future__ import annotations

import asyncio
import time

import pytest

from canopy.endpoint import StatusError
from canopy.errors import EndpointUnavailable
from canopy.llm.retries import THROTTLED_RETRY_FACTOR, RetryPolicy, call_with_retries

POLICY = RetryPolicy(max_retries=2, backoff_base=0.001, backoff_max=1.0)


class Script:
    """Fails with `status` `failures` times, then answers; before each failure, other requests
    of the same client succeed when `others_succeed` (the progress counter moves)."""

    def __init__(
        self, failures: int, status: int = 429, others_succeed: bool = True,
        retry_after: bool = False,
    ) -> None:
        self.failures = failures
        self.status = status
        self.headers = {"retry-after-ms": "1"} if retry_after else {}
        self.others_succeed = others_succeed
        self.attempts = 0
        self.successes = 0  # the client's successful requests, as its limiter counts them

    async def __call__(self) -> str:
        self.attempts += 1
        if self.attempts <= self.failures:
            if self.others_succeed:
                self.successes += 1
            raise StatusError(self.status, self.headers, b"{}")
        return "ok"

    def progress(self) -> int:
        return self.successes


def run(script: Script, *, progress: bool = True) -> str:
    return asyncio.run(call_with_retries(
        script, what="LLM endpoint E", model="m", policy=POLICY,
        progress=script.progress if progress else None,
    ))


def test_429s_while_the_client_makes_progress_do_not_use_up_the_retries() -> None:
    script = Script(failures=6)  # three times max_retries
    assert run(script) == "ok"
    assert script.attempts == 7


def test_429s_without_progress_end_after_max_retries_as_before() -> None:
    script = Script(failures=6, others_succeed=False)
    with pytest.raises(EndpointUnavailable, match="3 attempts failed, the last with HTTP 429"):
        run(script)
    assert script.attempts == 3


def test_429s_that_name_a_retry_after_get_retries_back_without_progress() -> None:
    script = Script(failures=6, others_succeed=False, retry_after=True)
    assert run(script) == "ok"
    assert script.attempts == 7


def test_without_a_progress_counter_the_budget_is_max_retries() -> None:
    script = Script(failures=6)
    with pytest.raises(EndpointUnavailable, match="3 attempts failed"):
        run(script, progress=False)


@pytest.mark.parametrize("progress, retry_after", [(True, False), (False, True)])
def test_a_throttled_call_still_gives_up_after_the_cap(progress: bool, retry_after: bool) -> None:
    cap = POLICY.max_retries * THROTTLED_RETRY_FACTOR
    script = Script(failures=100, others_succeed=progress, retry_after=retry_after)
    with pytest.raises(EndpointUnavailable, match=f"{cap + 1} attempts failed"):
        run(script)
    assert script.attempts == cap + 1


def test_server_errors_get_no_retries_back_even_with_progress() -> None:
    script = Script(failures=6, status=500, retry_after=True)
    with pytest.raises(EndpointUnavailable, match="3 attempts failed, the last with HTTP 500"):
        run(script)


def test_a_retry_waits_at_least_the_retry_after_asked() -> None:
    class Once(Script):
        async def __call__(self) -> str:
            self.attempts += 1
            if self.attempts == 1:
                raise StatusError(429, {"retry-after": "0.2"}, b"{}")
            return "ok"

    start = time.monotonic()
    assert run(Once(failures=1)) == "ok"
    assert time.monotonic() - start >= 0.2
