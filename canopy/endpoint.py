"""JSON over HTTP to an OpenAI-compatible endpoint, through the `openai` SDK's HTTP layer.

Canopy's clients (`canopy.llm.ChatClient`, `canopy.providers.embed.OpenAIEmbedder`) do their own
retries, Retry-After handling, adaptive concurrency and reply parsing, so all they need is "POST
this JSON, give me the body or the failure". The `openai` SDK stays the transport (design §7:
base URLs, keys, default and auth headers, timeouts, proxies and Azure-style endpoints are its
job), and against a fast endpoint the client's CPU per request is the indexing time, so:

- the SDK's HTTP client runs on aiohttp (`openai.DefaultAioHttpClient`, the SDK's `aiohttp`
  extra) when that is installed: its C parser and connection pool cost about a fifth of the
  CPU of httpcore's pure-Python HTTP/1.1 (`benchmarks/client_overhead.py`);
- the SDK builds each path's request once (URL with its query, every header, the timeout), and
  every post sends that request with its new body through the SDK's HTTP client: the SDK's
  per-request option models, header merging and URL parsing would otherwise cost more CPU than
  the HTTP exchange itself. For a client with a fixed API key (the only kind Canopy makes) the
  SDK builds the same request every time; `tests/canopy/test_endpoint.py` checks that what goes
  on the wire is what the SDK's own `post` sends.

Failures are three exception types the retry policy classifies: `StatusError` (any status other
than 2xx, with headers and body), `RequestTimeout`, and `ConnectFailed`.

`Endpoint` is that seam as a protocol, and `EndpointFactory` how a client gets one for an
`EndpointConfig`: `JsonEndpoint` in this process by default, or a stand-in that sends the POST
to a worker elsewhere (`canopy.server.wings.ray`, `canopy index --ray`), behind the same client.
"""

from __future__ import annotations

import functools
import json
import types
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import httpx2 as httpx

__all__ = [
    "ConnectFailed",
    "Endpoint",
    "EndpointConfig",
    "EndpointError",
    "EndpointFactory",
    "JsonEndpoint",
    "RequestTimeout",
    "StatusError",
    "Transport",
    "local_endpoint",
    "preload_sdk",
    "transport_name",
]

# The HTTP library under the SDK's client.
Transport = Literal["aiohttp", "httpx2"]


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
# Set from each request's own body, never from the template's.
_PER_BODY = {"content-length", "transfer-encoding"}



@dataclass(frozen=True)
class _Sdk:
    """The SDK and the HTTP libraries under it. Imported on first use, not with this module:
    `import openai` is most of a second of CPU, which an offline build (the builtin provider),
    `canopy status` and a server's start would pay for nothing."""

    openai: types.ModuleType
    httpx: types.ModuleType
    aiohttp: types.ModuleType | None  # the SDK's aiohttp extra (`pip install openai[aiohttp]`)
    request_options: Any  # openai._models.FinalRequestOptions
    aiohttp_errors: tuple[type[BaseException], ...]
    # What a send raises when no reply came: httpx's errors (also the SDK's aiohttp adapter's),
    # and what escapes that adapter's mapping.
    transport_errors: tuple[type[BaseException], ...]


@functools.cache
def _sdk() -> _Sdk:
    import openai
    from openai._models import FinalRequestOptions

    try:  # the HTTP library the installed openai SDK is built on
        import httpx2 as httpx_module
    except ImportError:  # pragma: no cover - openai releases before 3
        import httpx as httpx_module  # type: ignore[no-redef]
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - exercised where the extra is not installed
        aiohttp = None  # type: ignore[assignment]
    aiohttp_errors: tuple[type[BaseException], ...] = (
        (aiohttp.ClientError,) if aiohttp is not None else ())
    return _Sdk(openai, httpx_module, aiohttp, FinalRequestOptions, aiohttp_errors,
                (httpx_module.TransportError, OSError, TimeoutError, *aiohttp_errors))


def preload_sdk() -> None:
    """Import the SDK and its HTTP libraries now (a build does it in a thread while it chunks
    documents, so that its first request does not wait for them)."""
    _sdk()


def transport_name(prefer_aiohttp: bool = True) -> Transport:
    """The HTTP library under the SDK's client: "aiohttp" when the extra is installed (and
    preferred), else "httpx2" (the SDK's default). aiohttp speaks to HTTP proxies only, so a
    SOCKS proxy in the environment (ALL_PROXY=socks5://..., read as httpx reads it) keeps the
    SDK's default client, as before."""
    sdk = _sdk()
    if (not prefer_aiohttp or sdk.aiohttp is None
            or not hasattr(sdk.openai, "DefaultAioHttpClient")):
        return "httpx2"  # the extra is missing, or the SDK predates its aiohttp client
    if any(str(url).lower().startswith("socks") for url in urllib.request.getproxies().values()):
        return "httpx2"
    return "aiohttp"


def _http_client(transport: Transport, connections: int, timeout_s: float) -> Any:
    sdk = _sdk()
    limits = sdk.httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    if transport == "aiohttp":
        return sdk.openai.DefaultAioHttpClient(limits=limits, timeout=timeout_s)
    return sdk.openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout_s)


@dataclass(frozen=True)
class _Template:
    """What the SDK puts in every JSON POST to one path: URL (with its query), headers but
    those that depend on the body, and extensions (the timeout)."""

    url: httpx.URL
    headers: httpx.Headers
    extensions: dict[str, Any]


def _timed_out(exc: BaseException) -> bool:
    """Whether a transport failure is a timeout. The SDK's aiohttp adapter reports every
    connection failure (refused, reset, DNS) as httpx's ConnectTimeout, so its cause decides."""
    sdk = _sdk()
    cause = exc.__cause__
    if (isinstance(exc, sdk.httpx.TimeoutException)
            and not isinstance(cause, sdk.aiohttp_errors)):
        return True
    return isinstance(cause, TimeoutError) or isinstance(exc, TimeoutError)


class JsonEndpoint:
    """POSTs JSON to `base_url` + path with the key. Made and used inside one event loop.

    `transport`: "aiohttp" or "httpx2" (`transport_name()`, the default, picks aiohttp when it
    is installed)."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float, connections: int,
                 transport: Transport | None = None) -> None:
        self._sdk = sdk = _sdk()
        self.transport: Transport = transport or transport_name()
        self._http = _http_client(self.transport, connections, timeout_s)
        self._client = sdk.openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                          timeout=timeout_s, http_client=self._http)
        self._templates: dict[str, _Template] = {}

    def _template(self, path: str) -> _Template:
        """The request the SDK makes for a JSON POST to `path` (its body aside)."""
        sdk = self._sdk
        built = self._client._build_request(
            sdk.request_options.construct(method="post", url=path, headers=_JSON, content=b""))
        headers = sdk.httpx.Headers(
            [(k, v) for k, v in built.headers.multi_items() if k.lower() not in _PER_BODY])
        template = self._templates[path] = _Template(built.url, headers, built.extensions)
        return template

    async def post(self, path: str, data: bytes) -> bytes:
        """POST a JSON body (already encoded): the body of a 2xx reply, or `StatusError`,
        `RequestTimeout` or `ConnectFailed`."""
        t = self._templates.get(path) or self._template(path)
        request = self._sdk.httpx.Request("POST", t.url, headers=t.headers, content=data,
                                          extensions=t.extensions)
        try:
            response = await self._http.send(request)
        except self._sdk.transport_errors as exc:
            if _timed_out(exc):
                raise RequestTimeout("request timed out") from exc
            cause = exc.__cause__ or exc
            raise ConnectFailed(f"{type(cause).__name__}: {cause}"[:300]) from exc
        if not 200 <= response.status_code < 300:
            headers = {k.lower(): v for k, v in response.headers.items()}
            raise StatusError(response.status_code, headers, response.content)
        return response.content

    async def close(self) -> None:
        await self._client.close()
