"""The fake endpoint's token and request budgets (OpenAI-style 429 + Retry-After), and an index
build that runs into them: the budget is spent, the client backs off, and the build completes.

Real HTTP through the real `openai` client for the server side; `build_index` for the client side.
"""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.fakes.openai_server import FakeOpenAI


def ask(client: openai.OpenAI, text: str) -> None:
    client.chat.completions.create(
        model="fake", messages=[{"role": "user", "content": f"Task: hyde\n{text}"}]
    )


def refusal(client: openai.OpenAI, text: str) -> openai.RateLimitError:
    with pytest.raises(openai.RateLimitError) as info:
        ask(client, text)
    return info.value


@pytest.fixture
def client(fake_openai: FakeOpenAI) -> openai.OpenAI:
    return openai.OpenAI(base_url=fake_openai.base_url, api_key="x", max_retries=0)


def test_a_spent_request_budget_answers_429_with_the_time_left_in_the_window(
    fake_openai: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake_openai.rpm, fake_openai.rate_window_s = 2, 2.0
    ask(client, "one")
    ask(client, "two")
    err = refusal(client, "three")
    wait = float(err.response.headers["retry-after"])
    assert 0 < wait <= 2.0
    assert 0 < float(err.response.headers["retry-after-ms"]) <= 2000
    assert fake_openai.rate_limited == 1
    assert [r.status for r in fake_openai.requests] == [200, 200, 429]
    time.sleep(wait + 0.05)  # the next window has a fresh budget
    ask(client, "four")
    assert fake_openai.requests[-1].status == 200


def test_a_spent_token_budget_refuses_until_the_window_ends(
    fake_openai: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake_openai.tpm, fake_openai.rate_window_s = 100, 2.0
    ask(client, "x" * 600)  # ~150 prompt tokens: admitted into an empty window, overshooting it
    assert fake_openai.requests[0].tokens > 150
    err = refusal(client, "short")
    refusal(client, "short again")  # still the same window
    assert fake_openai.rate_limited == 2
    assert fake_openai.tokens_served() == fake_openai.requests[0].tokens  # refusals cost nothing
    time.sleep(float(err.response.headers["retry-after"]) + 0.05)
    ask(client, "short")
    assert fake_openai.requests[-1].status == 200


def test_requests_in_flight_do_not_overshoot_the_token_budget(
    fake_openai: FakeOpenAI, client: openai.OpenAI
) -> None:
    # Charged at admission, prompt and completion: ten requests at once into a 600-token window
    # take at most the budget plus the one request that crossed it.
    fake_openai.latency, fake_openai.tpm, fake_openai.rate_window_s = 0.3, 600, 5.0

    def one(i: int) -> None:
        try:
            ask(client, f"{i} " + "y" * 300)
        except openai.RateLimitError:
            pass

    with ThreadPoolExecutor(10) as pool:
        list(pool.map(one, range(10)))
    answered = [r.tokens for r in fake_openai.requests if r.status == 200]
    assert 0 < len(answered) < 10 and fake_openai.rate_limited == 10 - len(answered)
    assert sum(answered) <= 600 + max(answered)


def test_without_budgets_nothing_is_refused(fake_openai: FakeOpenAI, client: openai.OpenAI) -> None:
    for i in range(5):
        ask(client, str(i))
    assert fake_openai.rate_limited == 0
    assert all(r.status == 200 for r in fake_openai.requests)


def test_a_build_against_a_token_budget_backs_off_and_completes(tmp_path, fake_openai) -> None:
    from canopy.server.runtime import build_index, open_workspace
    from tests.conftest import EXAMPLES

    docs = tmp_path / "docs"
    shutil.copytree(EXAMPLES / "suppliers", docs)
    llm = {"base_url": fake_openai.base_url, "max_retries": 5, "backoff_s": 0.01}
    fake_openai.latency = 0.02
    # This build sends ~300k tokens in ~1.5 s unthrottled: 40k per 0.5 s binds several times.
    fake_openai.tpm, fake_openai.rate_window_s = 40_000, 0.5
    result = build_index(open_workspace(docs, index_dir=tmp_path / "idx", llm=llm))
    load = result.stats["llm_concurrency"]
    assert result.failures == []
    assert fake_openai.rate_limited > 0
    assert load["throttled"] == fake_openai.rate_limited  # every refusal reached the limiter
    assert load["backoffs"] >= 1 and load["paused_s"] > 0
    answered = sum(1 for r in fake_openai.requests if r.status == 200)
    assert load["requests"] == len(fake_openai.requests) == answered + fake_openai.rate_limited


def test_a_fault_of_one_kind_passes_requests_of_the_other_kind(
    fake_openai: FakeOpenAI, client: openai.OpenAI
) -> None:
    fake_openai.fail_next(1, status=429, retry_after=0.01, kind="chat")
    client.embeddings.create(model="fake", input=["an embedding goes through"])
    refusal(client, "the chat request takes the fault")
    ask(client, "and the next one is answered")
    assert [r.status for r in fake_openai.requests] == [200, 429, 200]
    with pytest.raises(ValueError):
        fake_openai.fail_next(1, kind="completions")
