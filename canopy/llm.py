"""The one client for OpenAI-compatible chat endpoints (design §7).

`ChatClient` adds what every LLM call in Canopy needs around one HTTP POST
(`canopy.endpoint.JsonEndpoint`, over the `openai` SDK's HTTP layer):
- adaptive concurrency (`canopy.limiter.AdaptiveLimiter`): one AIMD window of requests in flight,
  shared by every task, thread and event loop, between `min_concurrency` and `concurrency`;
  429/503/timeouts cut it to 70% and a Retry-After pauses every request until the time asked;
- retries with exponential backoff and jitter on 429, 5xx, timeouts and connection errors,
  honouring `Retry-After` / `retry-after-ms`; when retries run out, or at once on 401/403/404,
  `EndpointUnavailable` with a message naming the endpoint and the last status;
- structured outputs: `response_format` json_schema, falling back for good to JSON mode (schema
  in the system message) when an endpoint rejects it, pydantic validation, and one repair turn
  before `InvalidOutput`;
- a persistent response cache keyed by the full request (model, messages, response_format,
  temperature, max_tokens), so re-indexing unchanged text costs no calls;
- usage accounting per task (calls, cache hits, tokens, failures), and the concurrency achieved
  (`ChatClient.concurrency()`: mean and peak in flight, window, 429s).

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
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from canopy.endpoint import (
    ConnectFailed,
    EndpointError,
    JsonEndpoint,
    RequestTimeout,
    StatusError,
)
from canopy.errors import (
    CanopyError,
    ConfigError,
    EndpointUnavailable,
    InvalidOutput,
    ProviderError,
)
from canopy.limiter import AdaptiveLimiter, LimiterStats, Permit
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
    "note_failure",
    "parse_json",
    "retry_after",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

_RETRY_STATUSES = frozenset({408, 409, 429})
# Replies that mean "too much load": the adaptive window shrinks on these (and on timeouts).
_OVERLOAD_STATUSES = frozenset({429, 503, 529})
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
    return exc.status if isinstance(exc, StatusError) else None


def _is_transient(exc: BaseException) -> bool:
    if isinstance(exc, (ConnectFailed, RequestTimeout)):
        return True
    status = _status(exc)
    return status is not None and (status in _RETRY_STATUSES or status >= 500)


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


def _describe(exc: BaseException) -> str:
    """A short, library-independent account of why a request failed."""
    if isinstance(exc, RequestTimeout):
        return "request timed out"
    if isinstance(exc, ConnectFailed):
        return f"connection failed ({exc})"[:300]
    status = _status(exc)
    if status is not None:
        return f"HTTP {status}"
    return type(exc).__name__


async def call_with_retries(
    call: Callable[[], Awaitable[T]], *, what: str, model: str, policy: RetryPolicy
) -> T:
    """Run `call` and retry transient failures; translate endpoint failures into Canopy errors.

    `what` names the endpoint in messages ("LLM endpoint http://.../v1"). Raises
    `EndpointUnavailable` when retries run out or on 401/403/404; other 4xx `StatusError`s
    are re-raised unchanged for the caller to interpret (e.g. a rejected response_format)."""

    def wait(exc: BaseException | None, attempt: int) -> float:
        asked = retry_after(exc)
        if asked is not None:
            return min(asked, policy.backoff_max)
        base = min(policy.backoff_base * 2 ** (attempt - 1), policy.backoff_max)
        return base / 2 + random.uniform(0, base / 2)  # "equal jitter"

    attempts = policy.max_retries + 1
    try:
        # The first attempt runs bare: most calls succeed, and tenacity's per-call set-up
        # costs more than the rest of the retry policy together.
        try:
            return await call()
        except EndpointError as exc:
            if attempts == 1 or not _is_transient(exc):
                raise
            await asyncio.sleep(wait(exc, 1))

        def later_wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return wait(exc, state.attempt_number + 1)

        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts - 1),
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
    """Objects that belong to one event loop (HTTP sessions and their pools), made lazily.

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
    try:
        return schema.model_validate_json(content)  # pydantic-core's parser: the common case
    except ValidationError:
        pass  # fenced, wrapped in prose, or invalid: the tolerant path says which
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


def _with_schema_instruction(messages: list[dict], schema_json: str) -> list[dict]:
    note = (
        "Reply with a single JSON object, and nothing else, that conforms to this JSON schema:\n"
        + schema_json
    )
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


_COMPACT = (",", ":")


@functools.lru_cache(maxsize=64)
def _schema_json(model: type[BaseModel]) -> str:
    return json.dumps(json_schema_for(model), ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def _format_json(mode: str, task: str, model: type[BaseModel]) -> str | None:
    """The response_format of a JSON request, serialized once per mode, task and schema."""
    if mode == "json_schema":
        spec = json_schema_for(model)
        fmt: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": task, "schema": spec, "strict": False},
        }
    elif mode == "json_object":
        fmt = {"type": "json_object"}
    else:
        return None
    return json.dumps(fmt, sort_keys=True, ensure_ascii=False, separators=_COMPACT)


@dataclass
class _Request:
    """One chat request. Its messages are serialized once, for both the cache key and the body."""

    model: str
    messages: list[dict]
    temperature: float
    fmt_json: str | None = None  # response_format, already JSON (canonical: sorted keys)
    max_tokens: int | None = None
    _messages_json: str | None = field(default=None, repr=False)

    def with_messages(self, messages: list[dict]) -> _Request:
        return _Request(self.model, messages, self.temperature, self.fmt_json, self.max_tokens)

    def _messages(self) -> str:
        if self._messages_json is None:
            self._messages_json = json.dumps(
                self.messages, sort_keys=True, ensure_ascii=False, separators=_COMPACT
            )
        return self._messages_json

    def key(self) -> str:
        """The response-cache key: sha256 of json.dumps({model, messages, response_format,
        temperature, max_tokens}, sort_keys=True, compact), byte for byte the key earlier
        versions wrote (so existing caches stay valid), assembled from the parts."""
        blob = "".join((
            '{"max_tokens":', json.dumps(self.max_tokens),
            ',"messages":', self._messages(),
            ',"model":', json.dumps(self.model, ensure_ascii=False),
            ',"response_format":', self.fmt_json if self.fmt_json is not None else "null",
            ',"temperature":', json.dumps(self.temperature),
            "}",
        ))
        return "chat:" + hashlib.sha256(blob.encode("utf-8")).hexdigest()

    def body(self) -> bytes:
        parts = [
            '{"model":', json.dumps(self.model, ensure_ascii=False),
            ',"messages":', self._messages(),
            ',"temperature":', json.dumps(self.temperature),
        ]
        if self.fmt_json is not None:
            parts += [',"response_format":', self.fmt_json]
        if self.max_tokens is not None:
            parts += [',"max_tokens":', json.dumps(self.max_tokens)]
        parts.append("}")
        return "".join(parts).encode("utf-8")


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

    def _new_endpoint(self) -> JsonEndpoint:
        return JsonEndpoint(
            self.endpoint,
            self._api_key,
            timeout_s=self.settings.timeout_s,
            connections=self.settings.concurrency,
        )

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
                msgs = _with_schema_instruction(messages, _schema_json(schema))
            request = self._request(msgs, _format_json(mode, task, schema), None)
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
        request: _Request,
        bad: str,
        err: Exception,
        schema: type[M],
    ) -> tuple[str, M]:
        problem = _explain(err)
        follow_up = render("repair", error=problem, schema=_schema_json(schema))
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
                f"{_explain(again)[:400]}"
            ) from None

    # ---- plumbing -----------------------------------------------------------------------------

    def _request(
        self, messages: list[dict], fmt_json: str | None, max_tokens: int | None
    ) -> _Request:
        return _Request(self.model, messages, self.settings.temperature, fmt_json, max_tokens)

    def _cache_get(self, key: str) -> str | None:
        return self._cache.cache_get(key) if self._cache is not None else None

    def _cache_put(self, key: str, content: str) -> None:
        if self._cache is not None:
            self._cache.cache_put(key, content)

    async def _send(self, task: str, request: _Request) -> str:
        endpoint: JsonEndpoint = await self._loop_state.get()

        async def once() -> tuple[str, dict[str, Any]]:
            async with self._limiter.slot(task) as permit:
                try:
                    raw = await endpoint.post("/chat/completions", request.body())
                except EndpointError as exc:
                    note_failure(permit, exc)
                    raise
                content, usage = _reply(raw, self.what, task)
                permit.succeeded(usage.get("completion_tokens") or 0)
                return content, usage

        try:
            content, usage = await call_with_retries(
                once, what=self.what, model=self.model, policy=self._policy
            )
        except StatusError as exc:
            message = exc.message
            if (
                request.fmt_json is not None
                and exc.status in (400, 422)
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
                f"{self.what} sent an unusable reply to the {task} request: {_describe(exc)}"
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
