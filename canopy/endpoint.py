"""JSON over HTTP to an OpenAI-compatible endpoint: one aiohttp session per event loop.

Canopy's clients (`canopy.llm.ChatClient`, `canopy.providers.embed.OpenAIEmbedder`) do their own
retries, Retry-After handling, concurrency and reply parsing, so all they need from HTTP is "POST
this JSON, give me the status, headers and body". The openai SDK did that at about 2.5 ms of CPU
per request (its parameter transform, typed response models and httpx), and its import costs
about 1.5 s; aiohttp does it at about 0.3 ms and imports in a third of the time. On a zero-latency
endpoint that CPU is the indexing time.

Failures are three exception types the retry policy classifies: `StatusError` (any status other
than 2xx, with headers and body), `RequestTimeout`, and `ConnectFailed`.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
import urllib.request

import aiohttp

__all__ = ["ConnectFailed", "EndpointError", "JsonEndpoint", "RequestTimeout", "StatusError"]


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


class JsonEndpoint:
    """POSTs JSON to `base_url` + path with a bearer key. Made and used inside one event loop."""

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float, connections: int) -> None:
        self._base = base_url.rstrip("/")
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        # HTTP(S)_PROXY / NO_PROXY are honoured as the openai SDK (httpx) did, but read once:
        # aiohttp's trust_env looks them (and ~/.netrc) up in a worker thread on every request.
        self._proxy = _env_proxy(self._base)
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=connections),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        )

    async def post(self, path: str, data: bytes) -> bytes:
        """POST a JSON body (already encoded): the body of a 2xx reply, or `StatusError`,
        `RequestTimeout` or `ConnectFailed`."""
        try:
            async with self._session.post(
                self._base + path,
                data=data,
                headers=self._headers,
                proxy=self._proxy,
                allow_redirects=False,
            ) as resp:
                raw = await resp.read()
                if resp.status >= 300:
                    headers = {k.lower(): v for k, v in resp.headers.items()}
                    raise StatusError(resp.status, headers, raw)
                return raw
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            raise RequestTimeout("request timed out") from exc
        except aiohttp.ClientError as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc}"[:300]) from exc

    async def close(self) -> None:
        await self._session.close()


def _env_proxy(url: str) -> str | None:
    """The proxy the environment names for `url` (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), if any."""
    parts = urllib.parse.urlsplit(url)
    proxies = urllib.request.getproxies()
    if not proxies or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxies.get(parts.scheme)
