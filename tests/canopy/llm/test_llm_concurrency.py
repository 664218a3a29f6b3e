"""Adaptive concurrency: the AIMD window of ChatClient against the fake endpoint (real HTTP).

Each test drives many requests at once through one client and reads what the server saw (its
in-flight peak and mean, arrival times, refusals) and what the client reports
(`ChatClient.concurrency()`). Latencies are tens of milliseconds, so each test takes ~1 s.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time

import pytest

from canopy.limiter import AdaptiveLimiter
from canopy.llm import ChatClient
from canopy.settings import LLMSettings
from tests.fakes.openai_server import FakeOpenAI


def make_client(server: FakeOpenAI, **settings: object) -> ChatClient:
    values: dict[str, object] = {
        "base_url": server.base_url,
        "model": "fake-model",
        "max_retries": 8,
        # Latency-driven backoff is the subject of one test, which sets the tolerance itself;
        # elsewhere a loaded test machine must not trigger it.
        "latency_tolerance": 10.0,
        **settings,
    }
    return ChatClient(LLMSettings(**values), None, backoff_base=0.01, backoff_max=5.0)


def hyde(i: int) -> list[dict]:
    return [{"role": "user", "content": f"Task: hyde\nquestion {i}"}]


async def burst(client: ChatClient, n: int, start: int = 0) -> list[str]:
    return await asyncio.gather(*(client.text("hyde", hyde(start + i)) for i in range(n)))


def test_the_window_grows_from_its_start_while_latency_holds_and_nothing_is_refused(fake_openai):
    # A latency well above a loaded machine's scheduling noise, so "latency holds" is judged
    # on the endpoint, not on the test machine.
    fake_openai.latency = 0.25
    client = make_client(fake_openai, initial_concurrency=2, concurrency=64)
    asyncio.run(burst(client, 120))
    stats = client.concurrency()
    # Slow start doubles the window per round trip: 2, 4, 8, 16, 32 within ~1.25 s.
    assert fake_openai.max_in_flight >= 24
    assert stats.peak_in_flight >= fake_openai.max_in_flight
    assert stats.window >= 24 and stats.throttled == 0 and stats.backoffs == 0
    assert stats.requests == 120 and stats.mean_in_flight > 8


def test_a_fixed_window_stays_at_concurrency(fake_openai):
    fake_openai.latency = 0.05
    client = make_client(fake_openai, concurrency=3, adaptive=False)
    asyncio.run(burst(client, 30))
    assert fake_openai.max_in_flight == 3
    assert client.concurrency().window == 3


def test_the_window_never_exceeds_the_ceiling(fake_openai):
    fake_openai.latency = 0.03
    client = make_client(fake_openai, initial_concurrency=2, concurrency=6)
    asyncio.run(burst(client, 80))
    assert fake_openai.max_in_flight == 6
    stats = client.concurrency()
    assert stats.window == 6 and stats.peak_in_flight == 6 and stats.ceiling == 6


def test_the_window_does_not_grow_when_demand_is_below_it(fake_openai):
    fake_openai.latency = 0.02
    client = make_client(fake_openai, initial_concurrency=4, concurrency=64)

    async def two_at_a_time() -> None:
        for i in range(0, 40, 2):
            await burst(client, 2, start=i)

    asyncio.run(two_at_a_time())
    assert client.concurrency().window == 4  # an idle client never inflates its window


def test_a_burst_of_429s_cuts_the_window_once_per_round_trip(fake_openai):
    fake_openai.latency = 0.02
    fake_openai.fail_next(8, status=429, retry_after=0.05)
    client = make_client(fake_openai, initial_concurrency=8, concurrency=8)
    asyncio.run(burst(client, 8))
    stats = client.concurrency()
    # All eight were sent in the same round trip: one cut (8 -> 5.6), not eight.
    assert stats.throttled == 8 and stats.backoffs == 1
    assert 5 <= stats.window < 8
    assert [r.status for r in fake_openai.requests].count(200) == 8


def test_retry_after_pauses_every_caller_until_the_time_the_server_asked(fake_openai):
    fake_openai.latency = 0.02
    fake_openai.fail_next(1, status=429, retry_after=0.5)
    client = make_client(fake_openai, initial_concurrency=8, concurrency=8)

    async def run() -> None:
        first = asyncio.ensure_future(client.text("hyde", hyde(0)))
        # Others arrive once the client has seen the 429 (polled: a loaded machine may take
        # longer than the 20 ms latency to deliver it), i.e. during the pause.
        deadline = time.monotonic() + 5
        while client.concurrency().throttled == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.gather(first, burst(client, 6, start=1))

    asyncio.run(run())
    refused, *others = fake_openai.requests
    assert refused.status == 429 and len(others) == 7
    # No caller, not only the one that was told, sent anything before the pause ended.
    assert min(r.time for r in others) >= refused.finished + 0.45
    stats = client.concurrency()
    assert stats.throttled == 1 and stats.backoffs == 1
    assert stats.paused_s == pytest.approx(0.5, abs=0.05)
    assert 5 <= stats.window < 8  # cut from 8 to 5.6, then additive growth


def test_against_a_concurrency_quota_the_window_settles_near_it_without_failures(fake_openai):
    fake_openai.latency = 0.03
    fake_openai.capacity = 4
    fake_openai.capacity_retry_after = 0.02
    client = make_client(fake_openai, initial_concurrency=16, concurrency=64)
    answers = asyncio.run(burst(client, 200))
    assert len(answers) == 200 and all(answers)
    stats = client.concurrency()
    assert 2 <= stats.window <= 8
    assert fake_openai.refused < 60  # the first burst, then only probes above the quota
    assert fake_openai.in_flight_stats()["mean"] >= 2


def test_a_queueing_endpoint_holds_growth_near_the_start(fake_openai):
    # One request at a time (a local server with one slot): more in flight only adds latency.
    fake_openai.latency = 0.01
    fake_openai.serial = True
    client = make_client(fake_openai, initial_concurrency=4, concurrency=64,
                         latency_tolerance=2.0)
    asyncio.run(burst(client, 120))
    stats = client.concurrency()
    assert stats.window <= 12 and stats.peak_in_flight <= 20  # the ceiling is 64
    assert stats.throttled == 0  # latency alone never pushes the window below its start
    assert stats.window >= 4


def test_callers_on_different_threads_and_loops_share_one_window(fake_openai):
    fake_openai.latency = 0.05
    client = make_client(fake_openai, initial_concurrency=4, concurrency=4)
    errors: list[BaseException] = []

    def caller(start: int) -> None:
        try:
            asyncio.run(burst(client, 16, start=start))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i * 100,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert fake_openai.max_in_flight == 4  # not 4 per loop
    assert client.concurrency().requests == 48


def test_a_429_seen_by_one_loop_pauses_callers_on_another(fake_openai):
    fake_openai.latency = 0.02
    fake_openai.fail_next(1, status=429, retry_after=0.4)
    client = make_client(fake_openai, initial_concurrency=8, concurrency=8)
    asyncio.run(client.text("hyde", hyde(0)))  # 429, pause, retry: in this thread's loop
    refused = fake_openai.requests[0]
    assert refused.status == 429
    # A pause set from a loop that has ended still holds for a new loop in another thread.
    fake_openai.fail_next(1, status=429, retry_after=0.4)
    done = threading.Event()

    def other(start: int) -> None:
        asyncio.run(burst(client, 3, start=start))
        done.set()

    first = threading.Thread(target=other, args=(10,))
    first.start()
    # The second thread starts once the client has seen the 429 (polled: a loaded machine may
    # take longer than the 20 ms latency to deliver it), i.e. during the pause.
    deadline = time.monotonic() + 5
    while client.concurrency().throttled < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    second = threading.Thread(target=other, args=(20,))
    second.start()
    first.join(timeout=10)
    second.join(timeout=10)
    late = [r for r in fake_openai.requests if r.body["messages"][0]["content"].endswith(" 20")]
    second_refusal = fake_openai.requests[2]
    assert second_refusal.status == 429
    assert late and min(r.time for r in late) >= second_refusal.finished + 0.35


# ---- the limiter alone --------------------------------------------------------------------------


def test_cancelled_waiters_give_their_places_back():
    limiter = AdaptiveLimiter(ceiling=2, initial=2)

    async def hold(seconds: float) -> None:
        async with limiter.slot("t") as permit:
            await asyncio.sleep(seconds)
            permit.succeeded()

    async def run() -> None:
        holders = [asyncio.ensure_future(hold(0.1)) for _ in range(2)]
        waiters = [asyncio.ensure_future(hold(0.0)) for _ in range(5)]
        await asyncio.sleep(0.02)
        for w in waiters[:3]:
            w.cancel()
        await asyncio.gather(*holders, *waiters, return_exceptions=True)
        assert limiter.in_flight == 0
        await asyncio.wait_for(asyncio.gather(*(hold(0.0) for _ in range(4))), 1.0)

    asyncio.run(run())
    assert limiter.in_flight == 0
    assert limiter.stats().requests == 2 + 2 + 4


def test_stats_report_mean_and_peak_in_flight():
    limiter = AdaptiveLimiter(ceiling=4, initial=4, adaptive=False)

    async def hold() -> None:
        async with limiter.slot("t") as permit:
            await asyncio.sleep(0.2)
            permit.succeeded()

    async def run() -> None:
        await asyncio.gather(*(hold() for _ in range(4)))

    asyncio.run(run())
    stats = limiter.stats()
    assert stats.peak_in_flight == 4
    assert stats.mean_in_flight == pytest.approx(4, abs=0.3)
    assert stats.span_s == pytest.approx(0.2, abs=0.1)


# ---- an index run records what it achieved; status shows it --------------------------------------


def test_an_index_run_stores_its_concurrency_and_status_shows_it(tmp_path, fake_openai):
    from click.testing import CliRunner

    from canopy.server.cli import main
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.status import index_status
    from canopy.server.tool_text import status_text
    from canopy.store import Store
    from tests.conftest import EXAMPLES

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    fake_openai.latency = 0.02
    llm = {"base_url": fake_openai.base_url, "max_retries": 2, "backoff_s": 0.01}
    ws = open_workspace(docs, index_dir=tmp_path / "idx", llm=llm)
    result = build_index(ws)
    load = result.stats["llm_concurrency"]
    assert load["requests"] == len(fake_openai.requests) > 0
    assert load["peak_in_flight"] >= 2 and load["mean_in_flight"] > 0
    assert load["adaptive"] and load["ceiling"] == 64 and load["throttled"] == 0

    store = Store(ws.index_dir)
    try:
        st = index_status(store)
    finally:
        store.close()
    assert st.llm_concurrency is not None and st.llm_concurrency.requests == load["requests"]
    assert "llm_concurrency" not in st.last_run
    assert "LLM requests in flight: mean" in status_text(st)

    out = CliRunner().invoke(main, ["status", str(docs), "--index-dir", str(tmp_path / "idx")])
    assert out.exit_code == 0, out.output
    assert f"{load['requests']} requests, 0 throttled" in out.output

    builtin = open_workspace(docs, index_dir=tmp_path / "offline")
    assert "llm_concurrency" not in build_index(builtin).stats
