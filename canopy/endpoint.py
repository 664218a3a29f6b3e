"""JSON over HTTP to an OpenAI-compatible endpoint, through the `openai` SDK's HTTP layer.

Canopy's clients (`canopy.llm.ChatClient`, `canopy.providers.embed.OpenAIEmbedder`) do their own
retries, Retry-After handling, adaptive concurrency and reply parsing, so all they need is "POST
this JSON, give me the body or the failure". The `openai` SDK stays the transport (design §7:
base URLs, keys, proxies and Azure-style endpoints are its job), but requests go through its raw
`post` with pre-encoded bytes and come back as raw responses: its parameter transform and typed
response models cost more CPU per request than the rest of a request's handling together, which
is the indexing time against a fast endpoint.

Failures are three exception types the retry policy classifies: `StatusError` (any status other
than 2xx, with headers and body), `RequestTimeout`, and `ConnectFailed`.

`Endpoint` is that seam as a protocol, and `EndpointFactory` how a client gets one for an
`EndpointConfig`: `JsonEndpoint` in this process by default, or a stand-in that sends the POST
to a worker elsewhere (`canopy.distributed`, `canopy index --ray`), behind the same client.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import openai

try:  # the HTTP library the installed openai SDK is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - openai releases before 3
    import httpx  # type: ignore[no-redef]

__all__ = ["ConnectFailed", "Endpoint", "EndpointConfig", "EndpointError", "EndpointFactory",
           "JsonEndpoint", "RequestTimeout", "StatusError", "local_endpoint"]


class EndpointError(Exception):
    """A request to the endpoint failed (see the subclasses)."""


class StatusError(EndpointError):
    """The endpoint answered with a status other than 2xx."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.headers = headers  # names in lower case
        self.body = body

    @property
    def message(self) -> str:
        """The endpoint's own explanation (OpenAI's `{"error": {"message": ...}}`), or its text."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return self.body.decode("utf-8", "replace")[:500]
        err = data.get("error", data) if isinstance(data, dict) else data
        msg = err.get("message") if isinstance(err, dict) else err
        return str(msg or "")[:500]


class RequestTimeout(EndpointError):
    """No complete reply within the configured timeout."""


class ConnectFailed(EndpointError):
    """The connection could not be made or broke before a reply (the cause is chained)."""


@dataclass(frozen=True)
class EndpointConfig:
    """What a connection to one endpoint needs (the key is secret: it stays out of repr)."""

    base_url: str
    api_key: str = field(repr=False)
    timeout_s: float
    connections: int  # pool size: the most requests a client sends at once


class Endpoint(Protocol):
    """POST JSON, get the body of a 2xx reply or `StatusError` / `RequestTimeout` /
    `ConnectFailed`. Made and used inside one event loop (`canopy.llm.PerLoop`)."""

    async def post(self, path: str, data: bytes) -> bytes: ...

    async def close(self) -> None: ...


EndpointFactory = Callable[[EndpointConfig], Endpoint]


def local_endpoint(config: EndpointConfig) -> JsonEndpoint:
    """The default `EndpointFactory`: requests leave from this process."""
    return JsonEndpoint(config.base_url, config.api_key, timeout_s=config.timeout_s,
                        connections=config.connections)


_JSON = {"Content-Type": "application/json", "Accept": "application/json"}


class JsonEndpoint:
    """POSTs JSON to `base_url` + path with the key. Made and used inside one event loop."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float, connections: int) -> None:
        limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
        self._client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s,
            http_client=openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout_s))

    async def post(self, path: str, data: bytes) -> bytes:
        """POST a JSON body (already encoded): the body of a 2xx reply, or `StatusError`,
        `RequestTimeout` or `ConnectFailed`."""
        try:
            response = await self._client.post(path, cast_to=httpx.Response, content=data,
                                               options={"headers": _JSON})
        except openai.APITimeoutError as exc:
            raise RequestTimeout("request timed out") from exc
        except openai.APIConnectionError as exc:
            cause = exc.__cause__ or exc.__context__
            detail = f"{type(cause).__name__}: {cause}" if cause else "connection error"
            raise ConnectFailed(detail[:300]) from exc
        except openai.APIStatusError as exc:
            headers = {k.lower(): v for k, v in exc.response.headers.items()}
            raise StatusError(exc.status_code, headers, exc.response.content) from None
        return response.content

    async def close(self) -> None:
        await self._client.close()
