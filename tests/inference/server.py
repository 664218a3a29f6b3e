"""Start llama-cpp-python's OpenAI-compatible server on the tiny model, and a small fault proxy
to put in front of it.

The server is the real thing (`python -m llama_cpp.server`, FastAPI + uvicorn over llama.cpp):
its tokenizer counts the prompt, its grammar enforces the JSON schema, its errors are its own.
The proxy only passes bytes on, except for the faults a test asks for, each once per request:
a reply whose JSON content is cut short (`malform`), a reply whose connection closes halfway
through its body (`cut`), and a first byte that comes late (`delay`).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

__all__ = ["FaultProxy", "MODEL", "llama_server"]

MODEL = "canopy-tiny"  # the alias the server lists and answers as


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def llama_server(model: Path, log: Path, *, n_ctx: int = 16384) -> Iterator[str]:
    """The server on `model` at a free loopback port; yields its base URL (…/v1)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--host",
           "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx), "--model_alias", MODEL,
           # One thread: llama.cpp's threads wait for each other spinning, and on a busy
           # 2-core machine two of them took 100 ms a token against 2-3 ms for one
           "--seed", "7", "--n_threads", "1", "--n_threads_batch", "1"]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited ({proc.returncode}): "
                                   + log.read_text(errors="replace")[-2000:])
            try:
                with urllib.request.urlopen(f"{base}/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("llama_cpp.server did not answer in 120 s") from None
                time.sleep(0.3)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class FaultProxy:
    """An HTTP proxy to `upstream` (a base URL) on a free loopback port. Faults are consumed
    by the chat completions that follow, in order; `usage` collects the `usage` of every reply
    it passed on whole."""

    upstream: str
    malform: int = 0  # replies whose message content is cut to half (invalid JSON)
    cut: int = 0  # replies whose connection closes after half of the body
    delay: int = 0  # replies whose first byte waits `delay_s`
    delay_s: float = 2.0
    usage: list[dict[str, int]] = field(default_factory=list)
    faults: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._forward(None)

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                self._forward(self.rfile.read(n))

            def _forward(self, body: bytes | None) -> None:
                url = proxy.upstream.rsplit("/v1", 1)[0] + self.path
                req = urllib.request.Request(url, data=body, method=self.command, headers={
                    k: v for k, v in self.headers.items() if k.lower() in (
                        "content-type", "authorization")})
                try:
                    with urllib.request.urlopen(req, timeout=600) as r:
                        status, data, ctype = r.status, r.read(), r.headers.get("content-type")
                except urllib.error.HTTPError as err:
                    status, data, ctype = err.code, err.read(), err.headers.get("content-type")
                fault = proxy._take() if self.path.endswith("/chat/completions") else None
                if fault == "delay":
                    time.sleep(proxy.delay_s)
                if fault == "malform" and status == 200:
                    reply = json.loads(data)
                    content = reply["choices"][0]["message"]["content"] or ""
                    reply["choices"][0]["message"]["content"] = content[:len(content) // 2]
                    data = json.dumps(reply).encode()
                elif status == 200 and fault != "cut":
                    try:
                        proxy.usage.append(json.loads(data).get("usage") or {})
                    except ValueError:
                        pass
                self.send_response(status)
                self.send_header("content-type", ctype or "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                if fault == "cut":
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _take(self) -> str | None:
        with self._lock:
            for kind in ("malform", "cut", "delay"):
                if getattr(self, kind) > 0:
                    setattr(self, kind, getattr(self, kind) - 1)
                    self.faults.append(kind)
                    return kind
        return None

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
