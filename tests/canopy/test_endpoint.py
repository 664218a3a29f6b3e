"""`canopy.endpoint.JsonEndpoint` on each HTTP library the openai SDK can run on: it sends what
the SDK's own `post` sends, and its failures keep their kind (timeout, connection, status)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx2
import openai
import pytest

from canopy.endpoint import (
    ConnectFailed,
    JsonEndpoint,
    RequestTimeout,
    StatusError,
    transport_name,
)
from tests.fakes.openai_server import FakeOpenAI
from tests.net import free_port

try:
    import aiohttp  # noqa: F401
except ImportError:  # the SDK's aiohttp extra is a dependency; a broken install skips loudly
    TRANSPORTS = ["httpx2", pytest.param("aiohttp", marks=pytest.mark.skip("aiohttp missing"))]
else:
    TRANSPORTS = ["httpx2", "aiohttp"]

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "Task: hyde\nhi"}]},
                  separators=(",", ":")).encode()


class Recorder:
    """An HTTP server that records each request (request line, headers, body) and answers 200
    with a fixed JSON body: stands for an endpoint, or for a forward proxy (it then sees the
    absolute URL in the request line)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str], bytes]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                recorder.seen.append(
                    (self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                reply = b'{"ok":true}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if self.path.endswith("/gzip"):  # as hosted APIs compress their replies
                    reply = gzip.compress(reply)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    r = Recorder()
    yield r
    r.stop()


def post(endpoint_args: dict[str, Any], path: str = "/chat/completions",
         body: bytes = BODY) -> bytes:
    async def run() -> bytes:
        endpoint = JsonEndpoint(**{"api_key": "k", "timeout_s": 5, "connections": 4,
                                   **endpoint_args})
        try:
            return await endpoint.post(path, body)
        finally:
            await endpoint.close()

    return asyncio.run(run())


def test_the_default_transport_is_aiohttp_when_the_sdks_extra_is_installed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        assert transport_name() == "httpx2"
    else:
        assert transport_name() == "aiohttp"
    assert transport_name(prefer_aiohttp=False) == "httpx2"
    # aiohttp has no SOCKS support: such a proxy keeps the SDK's default client
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    assert transport_name() == "httpx2"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_what_goes_on_the_wire_is_what_the_sdks_own_post_sends(
        transport: str, recorder: Recorder) -> None:
    """URL (with a base URL's own path, as Azure OpenAI's v1 API has), every header the
    SDK sets (key, user agent, its platform headers, content type) and the body, byte for byte:
    the endpoint reuses the request the SDK builds, so any drift in the SDK shows here."""
    base = f"http://127.0.0.1:{recorder.port}/openai/v1/"

    async def sdk_post() -> None:
        client = openai.AsyncOpenAI(base_url=base, api_key="k", max_retries=0, timeout=5)
        await client.post("/chat/completions", cast_to=httpx2.Response, content=BODY,
                          options={"headers": {"Content-Type": "application/json",
                                               "Accept": "application/json"}})
        await client.close()

    asyncio.run(sdk_post())
    assert post({"base_url": base, "transport": transport}) == b'{"ok":true}'
    (sdk_line, sdk_headers, sdk_body), (line, headers, body) = recorder.seen
    assert line == sdk_line == "/openai/v1/chat/completions"
    assert body == sdk_body == BODY
    assert headers == sdk_headers  # key, user agent, platform headers, content type and length
    assert headers["authorization"] == "Bearer k"


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_compressed_reply_comes_back_decoded(transport: str, recorder: Recorder) -> None:
    base = f"http://127.0.0.1:{recorder.port}/v1"
    assert post({"base_url": base, "transport": transport}, path="/gzip") == b'{"ok":true}'
    assert "gzip" in recorder.seen[0][1]["accept-encoding"]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_status_other_than_2xx_raises_status_error_with_its_headers_and_body(
        transport: str) -> None:
    with FakeOpenAI() as fake:
        fake.fail_next(1, status=429, retry_after=0.5)
        with pytest.raises(StatusError) as caught:
            post({"base_url": fake.base_url, "transport": transport})
        assert post({"base_url": fake.base_url, "transport": transport})  # then answers
    err = caught.value
    assert err.status == 429 and err.headers["retry-after"] == "0.5"
    assert err.message == "Injected failure 429."


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_reply_slower_than_the_timeout_raises_request_timeout(transport: str) -> None:
    with FakeOpenAI() as fake:
        fake.hang_next(1, seconds=2.0)
        with pytest.raises(RequestTimeout):
            post({"base_url": fake.base_url, "transport": transport, "timeout_s": 0.3})


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_refused_connection_is_a_connection_failure_not_a_timeout(transport: str) -> None:
    """The SDK's aiohttp adapter reports a refused connection as httpx's ConnectTimeout; a
    timeout would cut the concurrency window and skip the quick first-contact failure."""
    with pytest.raises(ConnectFailed) as caught:
        post({"base_url": f"http://127.0.0.1:{free_port()}/v1", "transport": transport})
    assert "onnect" in str(caught.value)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_connection_closed_without_a_reply_is_a_connection_failure(transport: str) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def hang_up() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        with pytest.raises(ConnectFailed):
            post({"base_url": f"http://127.0.0.1:{listener.getsockname()[1]}/v1",
                  "transport": transport})
    finally:
        listener.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_requests_go_through_the_proxy_named_in_the_environment(
        transport: str, recorder: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{recorder.port}")
    target = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: only the proxy can
    assert post({"base_url": target, "transport": transport}) == b'{"ok":true}'
    [(line, headers, body)] = recorder.seen
    assert line == f"{target}/chat/completions" and body == BODY
    assert headers["authorization"] == "Bearer k"
