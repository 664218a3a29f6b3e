"""ChatClient against a real HTTP endpoint (the fake), through the real openai client."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import numpy as np
import pytest
from pydantic import BaseModel

from canopy.errors import EndpointUnavailable, InvalidOutput, ProviderError
from canopy.llm import ChatClient, json_schema_for
from canopy.prompts import render
from canopy.providers.base import ExtractionOut, MapOut
from canopy.providers.embed import OpenAIEmbedder
from canopy.settings import EmbedSettings, LLMSettings
from tests.fakes.openai_server import FakeOpenAI

EXTRACT = [
    {
        "role": "user",
        "content": render(
            "extract",
            entity_types="organization, person",
            claims_switch="Skip this step.",
            text="Acme Corp hired Jane Doe. Jane Doe works with Nova Labs.",
        ),
    }
]


class DictCache:
    def __init__(self) -> None:
        self.data: dict[str, str] = {}

    def cache_get(self, key: str) -> str | None:
        return self.data.get(key)

    def cache_put(self, key: str, response: str) -> None:
        self.data[key] = response


def make_client(
    server: FakeOpenAI,
    cache: DictCache | None = None,
    *,
    backoff_base: float = 0.001,
    backoff_max: float = 60.0,
    **settings: object,
) -> ChatClient:
    values: dict[str, object] = {
        "base_url": server.base_url,
        "model": "fake-model",
        "max_retries": 3,
        **settings,
    }
    return ChatClient(
        LLMSettings(**values), cache, backoff_base=backoff_base, backoff_max=backoff_max
    )


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


# ---- retries ----------------------------------------------------------------------------------


def test_a_429_is_retried_after_the_servers_retry_after_and_counts_one_successful_call(fake_openai):
    fake_openai.fail_next(1, status=429, retry_after=0.2)
    client = make_client(fake_openai, backoff_base=20.0)  # only Retry-After can make this fast
    start = time.monotonic()
    out = asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    elapsed = time.monotonic() - start
    assert 0.2 <= elapsed < 5
    assert {e.name for e in out.entities} >= {"Acme Corp", "Jane Doe", "Nova Labs"}
    assert [r.status for r in fake_openai.requests] == [429, 200]
    usage = client.usage()["extract"]
    assert (usage.calls, usage.failures) == (1, 0)
    assert usage.prompt_tokens > 0 and usage.completion_tokens > 0


def test_server_errors_are_retried_with_backoff_until_success(fake_openai):
    fake_openai.fail_next(2, status=503, retry_after=None)
    client = make_client(fake_openai)
    text = asyncio.run(
        client.text("hyde", [{"role": "user", "content": render("hyde", query="solar")}])
    )
    assert "solar" in text
    assert [r.status for r in fake_openai.requests] == [503, 503, 200]
    assert client.usage()["hyde"].calls == 1


def test_a_retry_after_longer_than_the_cap_is_capped(fake_openai):
    fake_openai.fail_next(1, status=429, retry_after=100)
    client = make_client(fake_openai, backoff_max=0.05)
    start = time.monotonic()
    asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))
    assert time.monotonic() - start < 5


def test_exhausted_retries_raise_endpoint_unavailable_naming_endpoint_and_last_status(fake_openai):
    fake_openai.fail_next(10, status=500, retry_after=None)
    client = make_client(fake_openai, max_retries=2)
    with pytest.raises(EndpointUnavailable) as caught:
        asyncio.run(client.text("reduce", [{"role": "user", "content": "Task: reduce"}]))
    message = str(caught.value)
    assert fake_openai.base_url in message and "HTTP 500" in message and "3 attempts" in message
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert fake_openai.count("reduce") == 3
    assert client.usage()["reduce"].failures == 1


def test_a_dead_endpoint_raises_endpoint_unavailable_quickly_with_a_clear_message():
    url = closed_port_url()
    client = ChatClient(LLMSettings(base_url=url, max_retries=2, timeout_s=2), backoff_base=0.001)
    start = time.monotonic()
    with pytest.raises(EndpointUnavailable) as caught:
        asyncio.run(client.text("answer", [{"role": "user", "content": "hello"}]))
    assert time.monotonic() - start < 5
    assert url in str(caught.value) and "connection failed" in str(caught.value)


def test_an_endpoint_that_never_answered_is_reported_within_a_second_at_default_settings():
    """Nothing listens at base_url: no minutes of backoff before the user hears of it."""
    url = closed_port_url()
    client = ChatClient(LLMSettings(base_url=url))  # max_retries 5, backoff from 1 s
    start = time.monotonic()
    with pytest.raises(EndpointUnavailable) as caught:
        asyncio.run(client.text("answer", [{"role": "user", "content": "hello"}]))
    assert time.monotonic() - start < 3
    assert str(caught.value).startswith(f"LLM endpoint {url} cannot be reached")
    assert "is the server running" in str(caught.value)


def test_an_endpoint_that_answered_before_gets_every_retry_when_it_goes_away():
    from tests.fakes.openai_server import FakeOpenAI

    fake = FakeOpenAI().start()
    client = ChatClient(LLMSettings(base_url=fake.base_url, api_key="t", max_retries=3),
                        backoff_base=0.01)
    messages = [{"role": "user", "content": "Task: hyde\nwhat"}]
    assert asyncio.run(client.text("hyde", messages))
    fake.stop()  # a restart, say: the same address refuses connections for a while
    with pytest.raises(EndpointUnavailable, match=r"is unavailable: 4 attempts failed, the last "
                                                  r"with connection failed"):
        asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde\nanother"}]))


def test_timeouts_are_retried(fake_openai):
    fake_openai.hang_next(1, seconds=1.0)
    client = make_client(fake_openai, timeout_s=0.3)
    assert asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))
    assert fake_openai.count("hyde") == 2


def test_a_bad_request_fails_at_once_without_echoing_the_endpoints_text(fake_openai):
    fake_openai.fail_next(1, status=400, retry_after=None)
    client = make_client(fake_openai)
    with pytest.raises(ProviderError) as caught:
        asyncio.run(client.text("answer", [{"role": "user", "content": "Task: answer"}]))
    assert not isinstance(caught.value, EndpointUnavailable)
    assert "HTTP 400" in str(caught.value) and "Injected" not in str(caught.value)
    assert fake_openai.count("answer") == 1


def test_a_wrong_api_key_fails_at_once_without_retrying(fake_openai):
    fake_openai.api_key = "sk-right"
    client = make_client(fake_openai, api_key="sk-wrong", max_retries=5)
    with pytest.raises(EndpointUnavailable, match="API key"):
        asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))
    assert fake_openai.count("hyde") == 1


def test_the_api_key_is_sent_as_a_bearer_token(fake_openai):
    fake_openai.api_key = "sk-right"
    client = make_client(fake_openai, api_key="sk-right")
    assert asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))


def test_an_unknown_model_fails_at_once_with_a_message_naming_it(fake_openai):
    fake_openai.models = {"some-other-model"}
    client = make_client(fake_openai)
    with pytest.raises(EndpointUnavailable, match="fake-model"):
        asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    assert fake_openai.count("extract") == 1


# ---- structured output ------------------------------------------------------------------------


def test_json_requests_carry_the_task_name_and_a_strict_compatible_schema(fake_openai):
    client = make_client(fake_openai)
    asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    fmt = fake_openai.requests[0].body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == "extract" and fmt["json_schema"]["strict"] is False
    schema = fmt["json_schema"]["schema"]
    assert schema == json_schema_for(ExtractionOut)
    assert "$defs" not in json.dumps(schema)
    assert schema["required"] == ["entities", "relationships", "claims"]
    assert schema["properties"]["entities"]["items"]["additionalProperties"] is False


def test_malformed_json_is_repaired_with_one_extra_call(fake_openai):
    fake_openai.malformed_next(1)
    client = make_client(fake_openai)
    out = asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    assert out.entities
    assert fake_openai.count("extract") == 2
    repair = fake_openai.requests[1].body["messages"]
    assert repair[-2]["role"] == "assistant" and "cut off" in repair[-2]["content"]
    assert (
        repair[-1]["content"].startswith("Task: repair")
        and "not valid JSON" in repair[-1]["content"]
    )
    assert client.usage()["extract"].calls == 2


def test_output_that_violates_the_schema_is_repaired_with_the_validation_error(fake_openai):
    fake_openai.malformed_next(1, kind="schema")
    client = make_client(fake_openai)
    asyncio.run(client.json("map", [{"role": "user", "content": "Task: map"}], MapOut))
    assert "does not match the schema" in fake_openai.requests[1].body["messages"][-1]["content"]


def test_output_that_stays_malformed_raises_invalid_output(fake_openai):
    fake_openai.malformed_next(2)
    client = make_client(fake_openai)
    with pytest.raises(InvalidOutput, match="extract"):
        asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    assert fake_openai.count("extract") == 2
    assert client.usage()["extract"].failures == 1


def test_code_fences_around_json_are_accepted(fake_openai):
    fake_openai.enqueue("map", '```json\n{"points": [{"description": "x", "score": 5}]}\n```')
    client = make_client(fake_openai)
    out = asyncio.run(client.json("map", [{"role": "user", "content": "Task: map"}], MapOut))
    assert out.points[0].score == 5 and fake_openai.count("map") == 1


def test_json_schema_rejection_falls_back_to_json_mode_for_good(fake_openai):
    fake_openai.reject_json_schema = True
    client = make_client(fake_openai)
    first = asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    second = asyncio.run(client.json("map", [{"role": "user", "content": "Task: map"}], MapOut))
    assert first.entities and isinstance(second, MapOut)
    # JSON mode with the schema beside it: schema-constrained where json_schema is refused
    assert client.json_mode == "json_object_schema"
    formats = [r.body["response_format"]["type"] for r in fake_openai.requests]
    assert formats == ["json_schema", "json_object", "json_object"]
    assert all("schema" in r.body["response_format"] for r in fake_openai.requests[1:])
    system = fake_openai.requests[1].body["messages"][0]
    assert system["role"] == "system" and '"entities"' in system["content"]


def test_json_mode_is_used_from_the_start_when_json_schema_is_disabled(fake_openai):
    client = make_client(fake_openai, json_schema=False)
    asyncio.run(client.json("extract", EXTRACT, ExtractionOut))
    assert fake_openai.requests[0].body["response_format"] == {"type": "json_object"}


# ---- cache, accounting, concurrency -----------------------------------------------------------


def test_a_cache_hit_makes_no_request_and_counts_as_cached(fake_openai):
    cache = DictCache()
    first = asyncio.run(make_client(fake_openai, cache).json("extract", EXTRACT, ExtractionOut))
    again = make_client(fake_openai, cache)  # a new process, same persistent cache
    second = asyncio.run(again.json("extract", EXTRACT, ExtractionOut))
    assert first == second
    assert fake_openai.count("extract") == 1
    usage = again.usage()["extract"]
    assert (usage.calls, usage.cached, usage.prompt_tokens) == (0, 1, 0)


def test_the_cache_key_covers_max_tokens_and_messages(fake_openai):
    cache = DictCache()
    client = make_client(fake_openai, cache)
    msgs = [{"role": "user", "content": "Task: hyde"}]
    asyncio.run(client.text("hyde", msgs, max_tokens=10))
    asyncio.run(client.text("hyde", msgs, max_tokens=20))
    asyncio.run(
        client.text("hyde", [{"role": "user", "content": "Task: hyde\nother"}], max_tokens=10)
    )
    asyncio.run(client.text("hyde", msgs, max_tokens=10))
    assert fake_openai.count("hyde") == 3 and client.usage()["hyde"].cached == 1


def test_repaired_output_is_cached_under_the_original_request(fake_openai):
    cache = DictCache()
    fake_openai.malformed_next(1)
    asyncio.run(make_client(fake_openai, cache).json("extract", EXTRACT, ExtractionOut))
    asyncio.run(make_client(fake_openai, cache).json("extract", EXTRACT, ExtractionOut))
    assert fake_openai.count("extract") == 2  # original + repair, then a cache hit


def test_concurrent_calls_overlap_so_wall_time_stays_well_below_the_serial_time(fake_openai):
    fake_openai.latency = 0.5
    # Wide latency tolerance: on a loaded machine the limiter would otherwise back off (that
    # rule has its own tests in test_llm_concurrency.py).
    client = make_client(fake_openai, concurrency=8, latency_tolerance=10.0)

    async def run() -> list[str]:
        return await asyncio.gather(
            *(
                client.text("hyde", [{"role": "user", "content": f"Task: hyde\n{i}"}])
                for i in range(8)
            )
        )

    start = time.monotonic()
    assert len(asyncio.run(run())) == 8
    assert time.monotonic() - start < 2.0  # serial would be 4 s
    assert fake_openai.max_in_flight >= 4
    assert client.usage()["hyde"].calls == 8


def test_the_concurrency_limit_bounds_requests_in_flight(fake_openai):
    fake_openai.latency = 0.05
    client = make_client(fake_openai, concurrency=2)

    async def run() -> None:
        await asyncio.gather(
            *(
                client.text("hyde", [{"role": "user", "content": f"Task: hyde\n{i}"}])
                for i in range(6)
            )
        )

    asyncio.run(run())
    assert fake_openai.max_in_flight == 2


def test_one_client_serves_several_event_loops_in_turn(fake_openai):
    client = make_client(fake_openai)
    for i in range(3):
        asyncio.run(client.text("hyde", [{"role": "user", "content": f"Task: hyde\n{i}"}]))
    assert client.usage()["hyde"].calls == 3


class Pair(BaseModel):
    a: int
    b: list[str] = []


def test_usage_is_reported_per_task(fake_openai):
    fake_openai.enqueue("pair", {"a": 1, "b": ["x"]})
    client = make_client(fake_openai)
    asyncio.run(client.json("pair", [{"role": "user", "content": "give a pair"}], Pair))
    asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))
    assert set(client.usage()) == {"pair", "hyde"}
    assert client.usage()["pair"].as_dict()["calls"] == 1


# ---- embeddings -------------------------------------------------------------------------------


def test_embeddings_are_batched_normalised_float32_and_deterministic(fake_openai):
    embedder = OpenAIEmbedder(
        EmbedSettings(base_url=fake_openai.base_url, model="fake-embed", batch_size=2)
    )
    texts = ["solar panels", "solar panel factory", "river delta", "", "wind"]
    vectors = asyncio.run(embedder.embed(texts))
    assert vectors.shape == (5, 64) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert fake_openai.count("embeddings") == 3
    assert np.array_equal(vectors, asyncio.run(embedder.embed(texts)))
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]
    assert embedder.name == "openai:fake-embed" and embedder.dims == 64
    assert asyncio.run(embedder.embed([])).shape == (0, 64)


def test_embeddings_are_asked_as_base64_and_read_as_floats_from_a_server_that_ignores_it(
        fake_openai):
    from canopy.providers.embed import normalize_rows
    from tests.fakes import responses

    texts = ["solar panels", "river delta"]
    expected = normalize_rows(np.asarray([responses.embedding(t, 64) for t in texts]))
    embedder = OpenAIEmbedder(EmbedSettings(base_url=fake_openai.base_url, model="fake-embed"))
    packed = asyncio.run(embedder.embed(texts))
    assert fake_openai.requests[-1].body["encoding_format"] == "base64"
    fake_openai.float_embeddings = True
    floats = asyncio.run(embedder.embed(texts))
    assert np.allclose(packed, expected, atol=1e-6) and np.allclose(floats, expected, atol=1e-6)


def test_embeddings_use_the_same_retry_policy(fake_openai):
    fake_openai.fail_next(1, status=429, retry_after=0.01)
    embedder = OpenAIEmbedder(EmbedSettings(base_url=fake_openai.base_url), backoff_base=0.001)
    assert asyncio.run(embedder.embed(["a"])).shape == (1, 64)
    dead = OpenAIEmbedder(
        EmbedSettings(base_url=closed_port_url()), max_retries=1, backoff_base=0.001
    )
    with pytest.raises(EndpointUnavailable, match="Embedding endpoint"):
        asyncio.run(dead.embed(["a"]))


def test_a_used_up_quota_fails_at_once_instead_of_retrying_as_a_rate_limit(fake_openai):
    """OpenAI answers 429 `insufficient_quota` when the account has no credit: no wait cures
    it, so it is not retried like a rate limit (which would take minutes of backoff)."""
    fake_openai.fail_next(1, status=429, retry_after=0.01, code="insufficient_quota")
    client = make_client(fake_openai, max_retries=5)
    with pytest.raises(EndpointUnavailable, match=r"no quota left \(HTTP 429 insufficient_quota\)"):
        asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde"}]))
    assert fake_openai.count("hyde") == 1
    fake_openai.fail_next(1, status=429, retry_after=0.01)  # a rate limit is still retried
    assert asyncio.run(client.text("hyde", [{"role": "user", "content": "Task: hyde\nagain"}]))


def test_a_5xx_that_is_a_validation_error_of_the_request_is_refused_not_retried():
    """llama-cpp-python's server answers a response_format it does not know with HTTP 500 and
    FastAPI's validation error (tests/canopy/llm/test_inference_server.py meets it for real): the
    same bytes get the same answer, so it is a refusal, not an outage to wait out."""
    from canopy.endpoint import StatusError
    from canopy.llm.retries import _is_transient, invalid_request

    body = json.dumps({"error": {"message": "1 validation error:\n  {'type': 'literal_error', "
                                 "'loc': ('body', 'response_format', 'type'), 'msg': \"Input "
                                 "should be 'text' or 'json_object'\"}", "type":
                                 "internal_server_error"}}).encode()
    refused = StatusError(500, {}, body)
    assert invalid_request(refused) and not _is_transient(refused)
    outage = StatusError(500, {}, b'{"error": {"message": "CUDA out of memory"}}')
    assert not invalid_request(outage) and _is_transient(outage)
    assert invalid_request(StatusError(400, {}, b"{}"))


def test_json_mode_with_the_schema_beside_it_sends_the_schema():
    from canopy.llm.structured import JSON_MODES, format_json, json_schema_for

    assert JSON_MODES == ("json_schema", "json_object_schema", "json_object", "prompt")
    fmt = json.loads(format_json("json_object_schema", "extract", ExtractionOut))
    assert fmt == {"type": "json_object", "schema": json_schema_for(ExtractionOut)}
