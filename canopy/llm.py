"""The one client for OpenAI-compatible chat endpoints (design §7).

`ChatClient` adds what every LLM call in Canopy needs around `openai.AsyncOpenAI`:
- bounded concurrency (`LLMSettings.concurrency` requests in flight per event loop);
- retries with exponential backoff and jitter on 429, 5xx, timeouts and connection errors,
  honouring `Retry-After` / `retry-after-ms`; when retries run out, or at once on 401/403/404,
  `EndpointUnavailable` with a message naming the endpoint and the last status;
- structured outputs: `response_format` json_schema, falling back for good to JSON mode (schema
  in the system message) when an endpoint rejects it, pydantic validation, and one repair turn
  before `InvalidOutput`;
- a persistent response cache keyed by the full request (model, messages, response_format,
  temperature, max_tokens), so re-indexing unchanged text costs no calls;
- usage accounting per task (calls, cache hits, tokens, failures).

`call_with_retries` is the retry policy shared with the embedding client.
"""

from __future__ import annotations

import asyncio
import email.utils
import functools
import hashlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import openai
from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from canopy.errors import (
    CanopyError,
    ConfigError,
    EndpointUnavailable,
    InvalidOutput,
    ProviderError,
)
from canopy.providers.base import Usage, record_usage
from canopy.settings import LLMSettings
from prompts import render

__all__ = [
    "ChatClient",
    "PerLoop",
    "ResponseCache",
    "RetryPolicy",
    "UsageCounter",
    "call_with_retries",
    "json_schema_for",
    "parse_json",
    "retry_after",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_RETRY_STATUSES = frozenset({408, 409, 429})
_FATAL_STATUSES = {
    401: "rejected the API key (HTTP 401); check CANOPY_LLM_API_KEY / CANOPY_EMBED_API_KEY",
    403: "refused access (HTTP 403); the key lacks permission for this model or endpoint",
    404: "answered HTTP 404; check the base URL (usually ending in /v1) and the model {model!r}",
}


class ResponseCache(Protocol):
    """What the client needs from a cache; `canopy.store.Store` is one."""

    def cache_get(self, key: str) -> str | None: ...

    def cache_put(self, key: str, response: str) -> None: ...


# ---- retries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 5
    backoff_base: float = 1.0  # first wait in seconds; doubles per attempt, with jitter
    backoff_max: float = 60.0  # cap of any single wait, Retry-After included


def _status(exc: BaseException) -> int | None:
    return exc.status_code if isinstance(exc, openai.APIStatusError) else None


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes APITimeoutError
        return True
    status = _status(exc)
    return status is not None and (status in _RETRY_STATUSES or status >= 500)


def retry_after(exc: BaseException | None) -> float | None:
    """Seconds the server asked us to wait (retry-after-ms, Retry-After seconds or HTTP date)."""
    if not isinstance(exc, openai.APIStatusError):
        return None
    headers = exc.response.headers
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


def _describe(exc: BaseException) -> str:
    """A short, library-independent account of why a request failed."""
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"connection failed{detail}"[:300]
    status = _status(exc)
    if status is not None:
        return f"HTTP {status}"
    return type(exc).__name__


def _api_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, dict):
        err = body.get("error", body)
        msg = err.get("message") if isinstance(err, dict) else err
        if msg:
            return str(msg)[:500]
    return str(exc.message)[:500]


async def call_with_retries(
    call: Callable[[], Awaitable[T]], *, what: str, model: str, policy: RetryPolicy
) -> T:
    """Run `call` and retry transient failures; translate endpoint failures into Canopy errors.

    `what` names the endpoint in messages ("LLM endpoint http://.../v1"). Raises
    `EndpointUnavailable` when retries run out or on 401/403/404; other 4xx `APIStatusError`s
    are re-raised unchanged for the caller to interpret (e.g. a rejected response_format)."""

    def wait(state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after(exc)
        if asked is not None:
            return min(asked, policy.backoff_max)
        base = min(policy.backoff_base * 2 ** (state.attempt_number - 1), policy.backoff_max)
        return base / 2 + random.uniform(0, base / 2)  # "equal jitter"

    attempts = policy.max_retries + 1
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait,
            retry=retry_if_exception(_is_transient),
            reraise=True,
            sleep=asyncio.sleep,
        ):
            with attempt:
                result = await call()
        return result
    except openai.APIError as exc:
        status = _status(exc)
        if status in _FATAL_STATUSES:
            reason = _FATAL_STATUSES[status].format(model=model)
            raise EndpointUnavailable(f"{what} {reason}.") from None
        if _is_transient(exc):
            n = "attempt" if attempts == 1 else "attempts"
            raise EndpointUnavailable(
                f"{what} is unavailable: {attempts} {n} failed, the last with {_describe(exc)}."
            ) from None
        raise


# ---- per-event-loop resources -----------------------------------------------------------------


class PerLoop:
    """Objects that belong to one event loop (HTTP connection pools, semaphores), made lazily.

    With `close`, each object is closed when its loop shuts down: a parked async generator is
    finalised by `asyncio.run` (loop.shutdown_asyncgens), so callers need no cleanup call and
    no connection outlives its loop. Entries of closed loops are dropped."""

    def __init__(
        self, factory: Callable[[], Any], close: Callable[[Any], Awaitable[None]] | None = None
    ) -> None:
        self._factory = factory
        self._close = close
        self._lock = threading.Lock()
        self._items: dict[int, tuple[asyncio.AbstractEventLoop, Any, Any]] = {}

    async def get(self) -> Any:
        loop = asyncio.get_running_loop()
        with self._lock:
            for key, (old, _, _) in list(self._items.items()):
                if old.is_closed():
                    del self._items[key]
            entry = self._items.get(id(loop))
            if entry is not None and entry[0] is loop:
                return entry[1]
            value = self._factory()
            keeper = self._keeper(loop, value) if self._close is not None else None
            self._items[id(loop)] = (loop, value, keeper)
        if keeper is not None:
            await keeper.asend(None)  # registers it with the loop's async-generator hooks
        return value

    async def _keeper(self, loop: asyncio.AbstractEventLoop, value: Any) -> Any:
        try:
            yield
        finally:
            with self._lock:
                entry = self._items.get(id(loop))
                if entry is not None and entry[1] is value:
                    del self._items[id(loop)]
            assert self._close is not None
            await self._close(value)

    async def close(self) -> None:
        """Close the running loop's object now (if any)."""
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._items.pop(id(loop), None)
        if entry is not None and entry[2] is not None:
            await entry[2].aclose()


class UsageCounter:
    """Thread-safe per-task `Usage` totals (also added to the caller's open `usage_scope`s)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_task: dict[str, Usage] = {}

    def add(self, task: str, **counts: int) -> None:
        with self._lock:
            usage = self._by_task.setdefault(task, Usage())
            for name, n in counts.items():
                setattr(usage, name, getattr(usage, name) + n)
        record_usage(task, **counts)

    def snapshot(self) -> dict[str, Usage]:
        with self._lock:
            return {task: Usage(**u.as_dict()) for task, u in self._by_task.items()}


# ---- structured output helpers ----------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def json_schema_for(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in the shape strict structured-output decoders accept:
    references inlined, every property required, no additional properties, no defaults/titles."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            extra = {k: walk(v) for k, v in node.items() if k not in ("$ref", "title", "default")}
            return {**target, **extra}
        out = {}
        for key, value in node.items():
            if key in ("title", "default"):
                continue
            if key == "properties":
                out[key] = {name: walk(sub) for name, sub in value.items()}
            else:
                out[key] = walk(value)
        if out.get("type") == "object" and "properties" in out:
            out["required"] = list(out["properties"])
            out["additionalProperties"] = False
        return out

    return walk(raw)


_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_json(content: str, schema: type[M]) -> M:
    """Validate a reply against `schema`, tolerating code fences and text around one object."""
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise
        data = json.loads(text[start : end + 1])
    return schema.model_validate(data)


def _explain(err: Exception) -> str:
    if isinstance(err, ValidationError):
        parts = [
            f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in err.errors()[:10]
        ]
        return "the JSON does not match the schema: " + "; ".join(parts)
    return f"the reply is not valid JSON ({err})"


def _with_schema_instruction(messages: list[dict], schema: dict[str, Any]) -> list[dict]:
    note = (
        "Reply with a single JSON object, and nothing else, that conforms to this JSON schema:\n"
        + json.dumps(schema, ensure_ascii=False)
    )
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


class _FormatRejected(Exception):
    """The endpoint refused the response_format we sent."""


# JSON modes from most to least constrained; the client moves down the list when rejected.
_JSON_MODES = ("json_schema", "json_object", "prompt")


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
    ) -> None:
        if not settings.base_url:
            raise ConfigError(
                "No LLM endpoint configured: set [llm] base_url or CANOPY_LLM_BASE_URL."
            )
        self.settings = settings
        self.model = settings.model
        self.endpoint = settings.base_url
        self.what = f"LLM endpoint {settings.base_url}"
        self._cache = cache
        self._policy = RetryPolicy(settings.max_retries, backoff_base, backoff_max)
        self._mode = "json_schema" if settings.json_schema else "json_object"
        self._usage = UsageCounter()
        self._api_key = settings.api_key.get_secret_value() if settings.api_key else "not-needed"
        self._loop_state = PerLoop(self._new_loop_state, lambda state: state[0].close())

    @property
    def json_mode(self) -> str:
        """How structured output is requested now: json_schema, json_object or prompt."""
        return self._mode

    def usage(self) -> dict[str, Usage]:
        return self._usage.snapshot()

    def _new_loop_state(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        client = openai.AsyncOpenAI(
            base_url=self.endpoint,
            api_key=self._api_key,
            max_retries=0,
            timeout=self.settings.timeout_s,
        )
        return client, asyncio.Semaphore(self.settings.concurrency)

    async def aclose(self) -> None:
        """Close the running event loop's connection pool now (optional: it is closed anyway
        when the loop shuts down through asyncio.run)."""
        await self._loop_state.close()

    # ---- public calls -------------------------------------------------------------------------

    async def text(self, task: str, messages: list[dict], max_tokens: int | None = None) -> str:
        request = self._request(messages, None, max_tokens)
        key = self._key(request)
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
        spec = json_schema_for(schema)
        while True:
            mode = self._mode
            if mode == "json_schema":
                fmt: dict[str, Any] | None = {
                    "type": "json_schema",
                    "json_schema": {"name": task, "schema": spec, "strict": False},
                }
                msgs = messages
            else:
                fmt = {"type": "json_object"} if mode == "json_object" else None
                msgs = _with_schema_instruction(messages, spec)
            request = self._request(msgs, fmt, None)
            key = self._key(request)
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
                content, result = await self._repair(task, request, content, err, schema, spec)
            self._cache_put(key, content)
            return result

    def _downgrade(self, mode: str) -> None:
        if mode == _JSON_MODES[-1]:
            raise ProviderError(f"{self.what} rejects every way of requesting JSON output.")
        if self._mode == mode:
            self._mode = _JSON_MODES[_JSON_MODES.index(mode) + 1]
            log.warning(
                "%s rejected response_format %s; using %s from now on", self.what, mode, self._mode
            )

    async def _repair(
        self,
        task: str,
        request: dict[str, Any],
        bad: str,
        err: Exception,
        schema: type[M],
        spec: dict[str, Any],
    ) -> tuple[str, M]:
        problem = _explain(err)
        follow_up = render("repair", error=problem, schema=json.dumps(spec, ensure_ascii=False))
        messages = [
            *request["messages"],
            {"role": "assistant", "content": bad},
            {"role": "user", "content": follow_up},
        ]
        try:
            content = await self._send(task, {**request, "messages": messages})
        except _FormatRejected:
            raise InvalidOutput(
                f"{task}: invalid output from {self.model} ({problem[:300]})"
            ) from None
        try:
            return content, parse_json(content, schema)
        except (ValueError, ValidationError) as again:
            raise InvalidOutput(
                f"{task}: {self.model} returned invalid output twice (after one repair turn): "
                f"{_explain(again)[:400]}"
            ) from None

    # ---- plumbing -----------------------------------------------------------------------------

    def _request(
        self, messages: list[dict], fmt: dict[str, Any] | None, max_tokens: int | None
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.settings.temperature,
        }
        if fmt is not None:
            request["response_format"] = fmt
        if max_tokens is not None:
            request["max_tokens"] = max_tokens
        return request

    @staticmethod
    def _key(request: dict[str, Any]) -> str:
        material = {
            k: request.get(k)
            for k in ("model", "messages", "response_format", "temperature", "max_tokens")
        }
        blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return "chat:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def _cache_get(self, key: str) -> str | None:
        return self._cache.cache_get(key) if self._cache is not None else None

    def _cache_put(self, key: str, content: str) -> None:
        if self._cache is not None:
            self._cache.cache_put(key, content)

    async def _send(self, task: str, request: dict[str, Any]) -> str:
        client, semaphore = await self._loop_state.get()

        async def once() -> Any:
            async with semaphore:
                return await client.chat.completions.create(**request)

        try:
            response = await call_with_retries(
                once, what=self.what, model=self.model, policy=self._policy
            )
        except openai.APIStatusError as exc:
            message = _api_message(exc)
            if (
                "response_format" in request
                and exc.status_code in (400, 422)
                and re.search(
                    r"response_format|json_schema|json_object|structured", message, re.IGNORECASE
                )
            ):
                raise _FormatRejected(message) from None
            # The endpoint's own text may quote the prompt, so it goes to the operator's log only.
            log.warning(
                "%s refused a %s request (HTTP %s): %s", self.what, task, exc.status_code, message
            )
            raise ProviderError(
                f"{self.what} refused the {task} request (HTTP {exc.status_code}); see the log."
            ) from None
        except openai.APIError as exc:
            raise ProviderError(
                f"{self.what} sent an unusable reply to the {task} request: {_describe(exc)}"
            ) from None
        usage = getattr(response, "usage", None)
        self._usage.add(
            task,
            calls=1,
            prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        )
        choices = getattr(response, "choices", None) or []
        return (choices[0].message.content or "") if choices else ""
