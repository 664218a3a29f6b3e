"""A fake OpenAI-compatible HTTP endpoint: real sockets on 127.0.0.1, deterministic answers.

    with FakeOpenAI() as server:          # or the `fake_openai` pytest fixture
        settings = LLMSettings(base_url=server.base_url, model="fake")
        ...
        server.count("extract"), server.requests[-1].task

Serves POST /v1/chat/completions and POST /v1/embeddings. The task of a chat request is the
json_schema name of its response_format, or else the `Task: <name>` marker of its prompt; the
answer is synthesised from the prompt (see `responses.py`), so it always validates.

Fault injection (each consumes the next matching requests, in order):
- `fail_next(n, status=429, retry_after=0.01, kind=None)`: HTTP errors, with Retry-After /
  retry-after-ms; `kind="chat"` or `"embeddings"` fails only requests of that kind;
- `malformed_next(n, kind="syntax"|"schema")`: 200 replies whose content is broken JSON, or
  JSON that matches no schema;
- `hang_next(n, seconds)`: replies delayed past a client's timeout;
- `latency = seconds`: every request sleeps (concurrency tests; `max_in_flight` records the peak
  and `in_flight_stats()` the time-weighted mean);
- `capacity = n` (with `capacity_retry_after`): a request arriving while n are being worked on is
  refused at once with 429, like an endpoint with a concurrency quota (`refused` counts them);
- `tpm = n` / `rpm = n` (with `rate_window_s`, default 60): a token and a request budget per
  fixed window, as OpenAI's rate limits: once the current window's budget is spent, a request
  is refused at once with 429 and a Retry-After of the time left in the window (`rate_limited`
  counts them). An admitted request is charged its prompt and completion tokens on arrival
  (under a token budget its reply is made then and sent after the latency), as OpenAI charges
  max_tokens on admission: the last request admitted may overshoot the budget. OpenAI
  enforces per-minute limits over shorter periods too ("60,000 requests/minute may be
  enforced as 1,000 requests/second"), so a short window with a budget scaled to it is a
  faithful stand-in in a benchmark of seconds;
- `serial = True`: requests are worked on one at a time, each for `latency` (a local server with
  one slot: latency grows with the queue, and nothing is ever refused);
- `float_embeddings = True`: embeddings as JSON float lists whatever `encoding_format` asks
  (a server that ignores it);
- `reject_json_schema = True`: 400 "response_format json_schema is not supported";
- `api_key = "..."` (401 otherwise) and `models = {...}` (404 for others); each request's
  headers are recorded (`requests[i].headers`, names in lower case).
Canned replies: `enqueue(task, content)` makes the next request of that task answer `content`
(a string, or an object sent as JSON) instead of the synthesised reply. `rating_cap = n`: every
relevance rating (task `rate`) is at most n, as from a model that finds nothing relevant enough.

Standalone, for benchmarks: `python -m tests.fakes.openai_server --port 0 --latency 0` prints
the base URL and serves until interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import struct
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.fakes import responses

__all__ = ["FakeOpenAI", "FakeRequest"]


@dataclass
class FakeRequest:
    path: str
    task: str
    body: dict[str, Any]
    status: int = 200
    time: float = field(default_factory=time.monotonic)  # arrival
    finished: float = 0.0  # when the reply was ready
    headers: dict[str, str] = field(default_factory=dict)  # names in lower case
    tokens: int = 0  # usage of an answered request (prompt + completion), 0 if refused


class FakeOpenAI:
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, latency: float = 0.0, dims: int = 64
    ) -> None:
        self.latency = latency
        self.dims = dims
        self.reject_json_schema = False
        self.api_key: str | None = None
        self.models: set[str] | None = None
        self.rating_cap: int | None = None  # every `rate` score at most this
        self.requests: list[FakeRequest] = []
        self.calls: Counter[str] = Counter()
        self.max_in_flight = 0
        self.capacity: int | None = None
        self.capacity_retry_after: float | None = 0.05
        self.refused = 0
        self.serial = False
        self.float_embeddings = False
        self.tpm: int | None = None  # tokens per rate window
        self.rpm: int | None = None  # requests per rate window
        self.rate_window_s = 60.0
        self.rate_limited = 0  # requests refused because the window's budget was spent
        self._window_start: float | None = None
        self._window_tokens = 0
        self._window_requests = 0
        self._in_flight = 0
        self._area = 0.0  # integral of requests in flight over time
        self._first: float | None = None
        self._mark = 0.0
        self._last = 0.0
        self._lock = threading.Lock()
        self._work = threading.Lock()  # the one slot of `serial` mode
        # (status, retry_after, code, kind): kind None matches any request, else "chat" or
        # "embeddings" only
        self._faults: deque[tuple[int, float | None, str | None, str | None]] = deque()
        self._malformed: deque[str] = deque()
        self._hangs: deque[float] = deque()
        self._canned: dict[str, deque[str]] = {}
        self._httpd = _Server((host, port), _Handler)
        self._httpd.fake = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    # ---- lifecycle ----------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> FakeOpenAI:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name="fake-openai",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- fault injection and inspection -------------------------------------------------------

    def fail_next(self, n: int = 1, status: int = 429, retry_after: float | None = 0.01,
                  code: str | None = None, kind: str | None = None) -> None:
        """The next `n` requests fail with `status`; `code` is the error's type and code
        (OpenAI's `insufficient_quota`, say), else rate_limit_exceeded / server_error. With
        `kind` ("chat" or "embeddings") only requests of that kind fail: a build sends its
        embedding requests during the chat stages, so "the next n requests" alone can't say
        which client's limiter sees the failures."""
        if kind not in (None, "chat", "embeddings"):
            raise ValueError("kind is None, 'chat' or 'embeddings'")
        with self._lock:
            self._faults.extend([(status, retry_after, code, kind)] * n)

    def _take_fault(self, task: str) -> tuple[int, float | None, str | None] | None:
        """The first queued fault this request matches, removed (caller holds the lock)."""
        kind = "embeddings" if task == "embeddings" else "chat"
        for i, (status, retry_after, code, only) in enumerate(self._faults):
            if only is None or only == kind:
                del self._faults[i]
                return status, retry_after, code
        return None

    def malformed_next(self, n: int = 1, kind: str = "syntax") -> None:
        if kind not in ("syntax", "schema"):
            raise ValueError("kind is 'syntax' or 'schema'")
        with self._lock:
            self._malformed.extend([kind] * n)

    def hang_next(self, n: int = 1, seconds: float = 5.0) -> None:
        with self._lock:
            self._hangs.extend([seconds] * n)

    def enqueue(self, task: str, content: str | dict[str, Any] | list[Any]) -> None:
        text = content if isinstance(content, str) else json.dumps(content)
        with self._lock:
            self._canned.setdefault(task, deque()).append(text)

    def count(self, task: str) -> int:
        """Requests received for a task (failed ones included)."""
        with self._lock:
            return self.calls[task]

    def tasks(self) -> list[str]:
        with self._lock:
            return [r.task for r in self.requests]

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.calls.clear()
            self._faults.clear()
            self._malformed.clear()
            self._hangs.clear()
            self._canned.clear()
            self.max_in_flight = 0
            self.refused = 0
            self.rate_limited = 0
            self._window_start, self._window_tokens, self._window_requests = None, 0, 0
            self._area, self._first, self._mark, self._last = 0.0, None, 0.0, 0.0

    def in_flight_stats(self) -> dict[str, float]:
        """Requests worked on at once: time-weighted mean from the first arrival to the last
        reply, and the peak (refused requests are not counted)."""
        with self._lock:
            span = self._last - self._first if self._first is not None else 0.0
            return {
                "mean": self._area / span if span > 0 else 0.0,
                "peak": float(self.max_in_flight),
                "span_s": span,
            }

    def tokens_served(self) -> int:
        """Tokens of the requests answered so far (prompt + completion, as their usage says)."""
        with self._lock:
            return sum(r.tokens for r in self.requests)

    def _roll_window(self, now: float) -> None:
        """Start a new rate window if the current one is over (lock held). Windows are fixed,
        aligned on the first request."""
        if self._window_start is None:
            self._window_start = now
        elif now - self._window_start >= self.rate_window_s:
            elapsed = (now - self._window_start) // self.rate_window_s
            self._window_start += elapsed * self.rate_window_s
            self._window_tokens = self._window_requests = 0

    def _over_budget(self, now: float, prompt_tokens: int) -> float | None:
        """Seconds until the window ends if its budget is spent, else None after charging the
        request and its prompt to it (lock held)."""
        if self.tpm is None and self.rpm is None:
            return None
        self._roll_window(now)
        assert self._window_start is not None
        spent = (self.tpm is not None and self._window_tokens >= self.tpm) or (
            self.rpm is not None and self._window_requests >= self.rpm
        )
        if spent:
            return max(0.001, self._window_start + self.rate_window_s - now)
        self._window_requests += 1
        self._window_tokens += prompt_tokens
        return None

    def _charge_completion(self, record: FakeRequest, payload: dict[str, Any]) -> None:
        """Record an answered request's tokens and charge its completion to the current
        window (its prompt was charged on arrival)."""
        usage = payload.get("usage") or {}
        record.tokens = int(usage.get("total_tokens") or 0)
        with self._lock:
            if self._window_start is not None:
                self._roll_window(time.monotonic())
                self._window_tokens += record.tokens - int(usage.get("prompt_tokens") or 0)

    def _tick(self, now: float) -> None:
        if self._first is None:
            self._first = self._mark = now
        self._area += self._in_flight * (now - self._mark)
        self._mark = self._last = now

    # ---- request handling (called from handler threads) ---------------------------------------

    def handle(
        self, path: str, headers: Any, body: dict[str, Any]
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        if path.endswith("/chat/completions"):
            task = responses.identify_task(body)
        elif path.endswith("/embeddings"):
            task = "embeddings"
        else:
            return 404, {}, _error(f"Unknown path {path}", "not_found")
        record = FakeRequest(path, task, body,
                             headers={k.lower(): v for k, v in dict(headers).items()})
        prompt_tokens = _prompt_tokens(task, body)
        with self._lock:
            self.requests.append(record)
            self.calls[task] += 1
            now = time.monotonic()
            refusal: tuple[int, float | None, str | None] | None = None
            if self.capacity is not None and self._in_flight >= self.capacity:
                self.refused += 1
                refusal = (429, self.capacity_retry_after, None)
            elif (wait := self._over_budget(now, prompt_tokens)) is not None:
                self.rate_limited += 1
                refusal = (429, round(wait, 3), None)
            else:
                self._tick(time.monotonic())
                self._in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self._in_flight)
                fault = self._take_fault(task)
                hang = self._hangs.popleft() if self._hangs else 0.0
        if refusal is not None:
            status, extra, payload = self._answer(task, headers, body, refusal)
            record.status, record.finished = status, time.monotonic()
            return status, extra, payload
        # Under a token budget the reply is made on arrival and its completion charged with its
        # prompt, as OpenAI charges a request's max_tokens when it admits it: charged at reply
        # time instead, the completions in flight overshot a window's budget by a quarter.
        early = self._answer(task, headers, body, fault) if self.tpm is not None else None
        if early is not None and early[0] == 200:
            self._charge_completion(record, early[2])
        try:
            if self.serial:
                with self._work:
                    time.sleep(self.latency + hang)
            elif self.latency or hang:
                time.sleep(self.latency + hang)
            status, extra, payload = early or self._answer(task, headers, body, fault)
        finally:
            with self._lock:
                self._tick(time.monotonic())
                self._in_flight -= 1
        if early is None and status == 200:
            self._charge_completion(record, payload)
        record.status, record.finished = status, time.monotonic()
        return status, extra, payload

    def _answer(
        self, task: str, headers: Any, body: dict[str, Any],
        fault: tuple[int, float | None, str | None] | None,
    ) -> tuple[int, dict[str, str], dict[str, Any]]:
        if self.api_key is not None and headers.get("Authorization") != f"Bearer {self.api_key}":
            return (
                401,
                {},
                _error(
                    "Incorrect API key provided.", "invalid_request_error", code="invalid_api_key"
                ),
            )
        if fault is not None:
            status, wait, code = fault
            extra = (
                {}
                if wait is None
                else {"retry-after-ms": str(int(wait * 1000)), "retry-after": f"{wait:g}"}
            )
            kind = code or ("rate_limit_exceeded" if status == 429 else "server_error")
            return status, extra, _error(f"Injected failure {status}.", kind, code=code)
        model = str(body.get("model", ""))
        if self.models is not None and model not in self.models:
            return (
                404,
                {},
                _error(
                    f"The model `{model}` does not exist.",
                    "invalid_request_error",
                    code="model_not_found",
                ),
            )
        if task == "embeddings":
            return 200, {}, self._embeddings(body)
        fmt = body.get("response_format") or {}
        if self.reject_json_schema and fmt.get("type") == "json_schema":
            return (
                400,
                {},
                _error(
                    "response_format of type json_schema is not supported by this model.",
                    "invalid_request_error",
                    param="response_format",
                ),
            )
        with self._lock:
            broken = self._malformed.popleft() if self._malformed else None
            canned = self._canned.get(task) if broken is None else None
            scripted = canned.popleft() if canned else None
        if broken == "syntax":
            content = '{"answer": "this reply is cut off'
        elif broken == "schema":
            content = "[1, 2, 3]"
        elif scripted is not None:
            content = scripted
        else:
            content = responses.chat_content(task, body)
            if task == "rate" and self.rating_cap is not None:
                content = responses.capped_ratings(content, self.rating_cap)
        usage = {
            "prompt_tokens": _prompt_tokens(task, body),
            "completion_tokens": len(content) // 4 + 1,
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return (
            200,
            {},
            {
                "id": f"chatcmpl-fake-{len(self.requests)}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            },
        )

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        dims = int(body.get("dimensions") or self.dims)
        data = []
        for i, text in enumerate(texts):
            vec = responses.embedding(text, dims)
            if body.get("encoding_format") == "base64" and not self.float_embeddings:
                value: Any = base64.b64encode(struct.pack(f"<{dims}f", *vec)).decode("ascii")
            else:
                value = vec
            data.append({"object": "embedding", "index": i, "embedding": value})
        tokens = _prompt_tokens("embeddings", body)
        return {
            "object": "list",
            "data": data,
            "model": body.get("model", ""),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }


def _prompt_tokens(task: str, body: dict[str, Any]) -> int:
    """The prompt tokens a request's usage reports (about four characters a token)."""
    if task == "embeddings":
        inputs = body.get("input", [])
        texts = [inputs] if isinstance(inputs, str) else [str(t) for t in inputs]
        return sum(len(t) for t in texts) // 4
    return sum(len(json.dumps(m.get("content", ""))) for m in body.get("messages", [])) // 4


def _error(
    message: str, kind: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default 5 drops bursts of connections (1 s SYN retry)

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client process that exits drops its idle keep-alive connections: not an error of
        # the server's, and the default handler prints a traceback for it.
        if isinstance(sys.exc_info()[1], ConnectionResetError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK (~40 ms on Linux), which made every request cost ~50 ms at "zero latency".
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:  # noqa: N802 (http.server naming)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, {}, _error("Request body is not JSON.", "invalid_request_error"))
            return
        fake: FakeOpenAI = self.server.fake  # type: ignore[attr-defined]
        status, extra, payload = fake.handle(self.path, self.headers, body)
        self._send(status, extra, payload)

    def _send(self, status: int, extra: dict[str, str], payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode("utf-8")
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in extra.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout test)
            pass

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - silence request logs
        pass


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Fake OpenAI-compatible endpoint (deterministic answers)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = an ephemeral port")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds of delay per request")
    parser.add_argument("--dims", type=int, default=64, help="embedding dimensions")
    parser.add_argument("--tpm", type=int, help="tokens per rate window (429 beyond)")
    parser.add_argument("--rpm", type=int, help="requests per rate window (429 beyond)")
    parser.add_argument("--window", type=float, default=60.0, help="rate window in seconds")
    args = parser.parse_args(argv)
    server = FakeOpenAI(args.host, args.port, latency=args.latency, dims=args.dims)
    server.tpm, server.rpm, server.rate_window_s = args.tpm, args.rpm, args.window
    server.start()
    print(f"http://{args.host}:{server.port}/v1", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
