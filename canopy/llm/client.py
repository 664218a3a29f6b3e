"""The one client for OpenAI-compatible chat endpoints (design §7).

`ChatClient` adds what every LLM call in Canopy needs around one HTTP POST
(`canopy.endpoint.JsonEndpoint`, over the `openai` SDK's HTTP layer; with `canopy index --ray`,
the same POST made by a Ray worker, `canopy.server.wings.ray`):
- adaptive concurrency (`canopy.limiter.AdaptiveLimiter`): one AIMD window of requests in flight,
  shared by every task, thread and event loop, between `min_concurrency` and `concurrency`;
  429/503/timeouts cut it to 70% and a Retry-After pauses every request until the time asked;
- retries (`canopy.llm.retries`): exponential backoff and jitter on 429, 5xx, timeouts and
  connection errors, honouring `Retry-After`; `EndpointUnavailable` when they run out;
- structured outputs (`canopy.llm.structured`): `response_format` json_schema, falling back for
  good to JSON mode (schema in the system message) when an endpoint rejects it, pydantic
  validation, and one repair turn before `InvalidOutput`;
- a persistent response cache keyed by the full request (`canopy.llm.request`), so re-indexing
  unchanged text costs no calls;
- usage accounting per task (`canopy.llm.accounting`: calls, cache hits, tokens, failures), and
  the concurrency achieved (`ChatClient.concurrency()`: mean and peak in flight, window, 429s).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from canopy.endpoint import (
    Endpoint,
    EndpointConfig,
    EndpointError,
    EndpointFactory,
    StatusError,
    local_endpoint,
)
from canopy.errors import CanopyError, ConfigError, InvalidOutput, ProviderError
from canopy.limiter import AdaptiveLimiter, LimiterStats
from canopy.llm.accounting import UsageCounter
from canopy.llm.loops import PerLoop
from canopy.llm.request import ChatRequest, ResponseCache
from canopy.llm.retries import (
    RetryPolicy,
    call_with_retries,
    describe,
    invalid_request,
    note_failure,
)
from canopy.llm.structured import (
    JSON_MODES,
    explain,
    format_json,
    parse_json,
    schema_json,
    with_schema_instruction,
)
from canopy.prompts import DEFAULT_PROMPTS, PromptSet
from canopy.providers.base import Usage
from canopy.settings import LLMSettings

__all__ = ["ChatClient"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


class _FormatRejected(Exception):
    """The endpoint refused the response_format we sent."""


class ChatClient:
    """Chat completions against one OpenAI-compatible endpoint. Safe to share across tasks,
    threads and event loops."""

    def __init__(
        self,
        settings: LLMSettings,
        cache: ResponseCache | None = None,
        *,
        backoff_base: float = 1.0,
        backoff_max: float = 60.0,
        prompts: PromptSet = DEFAULT_PROMPTS,
        endpoints: EndpointFactory = local_endpoint,
    ) -> None:
        """`endpoints` makes the HTTP seam the POSTs go through: this process's own by default,
        a Ray cluster's workers with `canopy index --ray` (canopy.server.wings.ray). Everything else
        above stays here either way: cache, window, retries, parsing and accounting."""
        if not settings.base_url:
            raise ConfigError(
                "No LLM endpoint configured: set [llm] base_url or CANOPY_LLM_BASE_URL."
            )
        self.settings = settings
        self.prompts = prompts  # the templates of every request made through this client
        self.model = settings.model
        self.endpoint = settings.base_url
        self.what = f"LLM endpoint {settings.base_url}"
        self._cache = cache
        self._policy = RetryPolicy(settings.max_retries, backoff_base, backoff_max)
        self._reached = False  # has the endpoint answered once? (call_with_retries' first_contact)
        self._mode = "json_schema" if settings.json_schema else "json_object"
        self._usage = UsageCounter()
        api_key = settings.api_key.get_secret_value() if settings.api_key else "not-needed"
        self._config = EndpointConfig(settings.base_url, api_key, settings.timeout_s,
                                      settings.concurrency)
        self._endpoints = endpoints
        self._loop_state = PerLoop(self._new_endpoint, lambda endpoint: endpoint.close())
        self._limiter = AdaptiveLimiter(
            ceiling=settings.concurrency,
            initial=settings.initial_concurrency,
            floor=settings.min_concurrency,
            adaptive=settings.adaptive,
            latency_tolerance=settings.latency_tolerance,
            max_pause=backoff_max,
        )

    @property
    def json_mode(self) -> str:
        """How structured output is requested now: json_schema, json_object or prompt."""
        return self._mode

    def usage(self) -> dict[str, Usage]:
        return self._usage.snapshot()

    def concurrency(self) -> LimiterStats:
        """Requests in flight achieved so far: mean, peak, the window now, 429s seen."""
        return self._limiter.stats()

    def _new_endpoint(self) -> Endpoint:
        return self._endpoints(self._config)

    async def aclose(self) -> None:
        """Close the running event loop's connection pool now (optional: it is closed anyway
        when the loop shuts down through asyncio.run)."""
        await self._loop_state.close()

    # ---- public calls -------------------------------------------------------------------------

    async def text(self, task: str, messages: list[dict], max_tokens: int | None = None) -> str:
        request = self._request(messages, None, max_tokens)
        key = request.key()
        hit = self._cache_get(key)
        if hit is not None:
            self._usage.add(task, cached=1)
            return hit
        try:
            content = await self._send(task, request)
        except CanopyError:
            self._usage.add(task, failures=1)
            raise
        self._cache_put(key, content)
        return content

    async def json(self, task: str, messages: list[dict], schema: type[M]) -> M:
        try:
            return await self._json(task, messages, schema)
        except CanopyError:
            self._usage.add(task, failures=1)
            raise

    async def _json(self, task: str, messages: list[dict], schema: type[M]) -> M:
        while True:
            mode = self._mode
            if mode == "json_schema":
                msgs = messages
            else:
                msgs = with_schema_instruction(messages, schema_json(schema))
            request = self._request(msgs, format_json(mode, task, schema), None)
            key = request.key()
            hit = self._cache_get(key)
            if hit is not None:
                try:
                    result = parse_json(hit, schema)
                except (ValueError, ValidationError):
                    pass  # a stale entry written under an older schema: ask again
                else:
                    self._usage.add(task, cached=1)
                    return result
            try:
                content = await self._send(task, request)
            except _FormatRejected:
                self._downgrade(mode)
                continue
            try:
                result = parse_json(content, schema)
            except (ValueError, ValidationError) as err:
                content, result = await self._repair(task, request, content, err, schema)
            self._cache_put(key, content)
            return result

    def _downgrade(self, mode: str) -> None:
        if mode == JSON_MODES[-1]:
            raise ProviderError(f"{self.what} rejects every way of requesting JSON output.")
        if self._mode == mode:
            self._mode = JSON_MODES[JSON_MODES.index(mode) + 1]
            log.warning(
                "%s rejected response_format %s; using %s from now on", self.what, mode, self._mode
            )

    async def _repair(
        self,
        task: str,
        request: ChatRequest,
        bad: str,
        err: Exception,
        schema: type[M],
    ) -> tuple[str, M]:
        problem = explain(err)
        follow_up = self.prompts.render("repair", error=problem, schema=schema_json(schema))
        messages = [
            *request.messages,
            {"role": "assistant", "content": bad},
            {"role": "user", "content": follow_up},
        ]
        try:
            content = await self._send(task, request.with_messages(messages))
        except _FormatRejected:
            raise InvalidOutput(
                f"{task}: invalid output from {self.model} ({problem[:300]})"
            ) from None
        try:
            return content, parse_json(content, schema)
        except (ValueError, ValidationError) as again:
            raise InvalidOutput(
                f"{task}: {self.model} returned invalid output twice (after one repair turn): "
                f"{explain(again)[:400]}"
            ) from None

    # ---- plumbing -----------------------------------------------------------------------------

    def _request(
        self, messages: list[dict], fmt_json: str | None, max_tokens: int | None
    ) -> ChatRequest:
        return ChatRequest(self.model, messages, self.settings.temperature, fmt_json, max_tokens)

    def _cache_get(self, key: str) -> str | None:
        return self._cache.cache_get(key) if self._cache is not None else None

    def _cache_put(self, key: str, content: str) -> None:
        if self._cache is not None:
            self._cache.cache_put(key, content)

    async def _send(self, task: str, request: ChatRequest) -> str:
        endpoint: Endpoint = await self._loop_state.get()

        async def once() -> tuple[str, dict[str, Any]]:
            async with self._limiter.slot(task) as permit:
                try:
                    raw = await endpoint.post("/chat/completions", request.body())
                except EndpointError as exc:
                    note_failure(permit, exc)
                    raise
                content, usage = _reply(raw, self.what, task)
                permit.succeeded(usage.get("completion_tokens") or 0)
                self._reached = True
                return content, usage

        try:
            content, usage = await call_with_retries(
                once, what=self.what, model=self.model, policy=self._policy,
                first_contact=not self._reached, progress=self._limiter.successes,
            )
        except StatusError as exc:
            message = exc.message
            if (
                request.fmt_json is not None
                and invalid_request(exc)
                and re.search(
                    r"response_format|json_schema|json_object|structured", message, re.IGNORECASE
                )
            ):
                raise _FormatRejected(message) from None
            # The endpoint's own text may quote the prompt, so it goes to the operator's log only.
            log.warning(
                "%s refused a %s request (HTTP %s): %s", self.what, task, exc.status, message
            )
            raise ProviderError(
                f"{self.what} refused the {task} request (HTTP {exc.status}); see the log."
            ) from None
        except EndpointError as exc:
            raise ProviderError(
                f"{self.what} sent an unusable reply to the {task} request: {describe(exc)}"
            ) from None
        self._usage.add(
            task,
            calls=1,
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
        )
        return content


def _int(value: object) -> int:
    try:
        return int(value or 0)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return 0


def _reply(raw: bytes, what: str, task: str) -> tuple[str, dict[str, Any]]:
    """The first choice's text and the usage block of a chat completion body."""
    try:
        data = json.loads(raw)
        choices = data.get("choices") or []
        content = (choices[0].get("message") or {}).get("content") if choices else ""
        usage = data.get("usage") or {}
    except (ValueError, AttributeError, TypeError) as exc:
        raise ProviderError(
            f"{what} sent an unusable reply to the {task} request: not a chat completion "
            f"({type(exc).__name__})"
        ) from None
    if not isinstance(usage, dict):
        usage = {}
    return (content if isinstance(content, str) else ""), usage
