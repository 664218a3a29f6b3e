"""Headless Chromium for tests, driven over the DevTools protocol on a pipe.

`--remote-debugging-pipe` makes Chromium read protocol messages (JSON, each ended by a NUL
byte) from its file descriptor 3 and write replies and events to descriptor 4; a shell maps
those to the pipes of our stdin and stdout. No websocket client, no driver binary, nothing to
download: Debian's `chromium` package is all it needs (`.ci/run` installs it).
"""

from __future__ import annotations

import base64
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Browser", "find_chromium", "require_chromium"]

FLAGS = (  # what a sandboxed, offline machine needs (see the machine notes): no network chatter
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", "--mute-audio",
)


def find_chromium() -> str | None:
    for name in (os.environ.get("CHROMIUM", ""), "chromium", "chromium-browser"):
        if name and (path := shutil.which(name)):
            return path
    return None


def require_chromium() -> str:
    """Chromium's path, or a skip saying why. With REQUIRE_CHROMIUM=1 (set by .ci/run, which
    installs it) a missing browser fails the test instead: a skip there would hide it."""
    path = find_chromium()
    if path is not None:
        return path
    why = ("chromium not found: the web view's browser tests need it "
           "(apt-get install chromium; or set CHROMIUM to its path)")
    if os.environ.get("REQUIRE_CHROMIUM") == "1":
        pytest.fail(why + " (REQUIRE_CHROMIUM=1)")
    pytest.skip(why)


class ProtocolError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page (a tab of `width` x `height` CSS pixels)."""

    def __init__(self, binary: str, profile: Path, log: Path, width: int = 1440,
                 height: int = 900) -> None:
        self._log = log.open("wb")
        args = [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                "--remote-debugging-pipe", "about:blank"]
        # fd 3 <- our stdin pipe, fd 4 -> our stdout pipe; Chromium's own stdout goes to the log.
        self._proc = subprocess.Popen(
            ["sh", "-c", 'exec "$0" "$@" 3<&0 4>&1 </dev/null 1>&2', *args],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        self._next = 0
        self._lock = threading.Lock()
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        threading.Thread(target=self._read, daemon=True, name="cdp-reader").start()
        try:
            target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
            self._session = self.send("Target.attachToTarget",
                                      {"targetId": target, "flatten": True})["sessionId"]
            self.page("Page.enable")
            self.page("Emulation.setDeviceMetricsOverride",
                      {"width": width, "height": height, "deviceScaleFactor": 1,
                       "mobile": False})
        except Exception:
            self.close()
            raise

    # ---- the protocol ---------------------------------------------------------------------------

    def _read(self) -> None:
        assert self._proc.stdout is not None
        buf = b""
        while chunk := self._proc.stdout.read1(1 << 16):
            buf += chunk
            *messages, buf = buf.split(b"\0")
            for raw in messages:
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        box = self._replies.get(msg["id"])
                    if box is not None:
                        box.put(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, *,
             session: str | None = None, timeout: float = 30) -> dict[str, Any]:
        with self._lock:
            self._next += 1
            ident = self._next
            box: queue.Queue[dict[str, Any]] = queue.Queue()
            self._replies[ident] = box
        msg: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            msg["sessionId"] = session
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(msg).encode() + b"\0")
        self._proc.stdin.flush()
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no reply to {method} in {timeout} s") from None
        finally:
            with self._lock:
                self._replies.pop(ident, None)
        if "error" in reply:
            raise ProtocolError(f"{method}: {reply['error']}")
        return dict(reply.get("result", {}))

    def page(self, method: str, params: dict[str, Any] | None = None,
             timeout: float = 30) -> dict[str, Any]:
        return self.send(method, params, session=self._session, timeout=timeout)

    # ---- what a test does -----------------------------------------------------------------------

    def goto(self, url: str) -> None:
        """Navigate and wait until the new document has loaded (its scripts have started)."""
        self.page("Page.navigate", {"url": url})
        self.wait_for(f"location.href === {json.dumps(url)} && document.readyState === 'complete'")

    def evaluate(self, expression: str) -> Any:
        """The JSON value of `expression` in the page (promises awaited)."""
        got = self.page("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True})
        if "exceptionDetails" in got:
            raise ProtocolError(f"{expression!r} threw: {got['exceptionDetails']}")
        return got["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30) -> Any:
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except ProtocolError:  # the page is between documents (a navigation under way)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} still false after {timeout} s")
            time.sleep(0.1)

    def click(self, selector: str) -> None:
        """A real mouse click (pressed and released) at the centre of the element."""
        box = self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)});"
            " if (!el) return null; el.scrollIntoView({block: 'center'});"
            " const r = el.getBoundingClientRect();"
            " return {x: r.left + r.width / 2, y: r.top + r.height / 2}; })()")
        if box is None:
            raise ProtocolError(f"nothing matches {selector!r}")
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.page("Input.dispatchMouseEvent",
                      {"type": kind, "x": box["x"], "y": box["y"], "button": "left",
                       "clickCount": 1 if kind != "mouseMoved" else 0})

    def type_text(self, text: str) -> None:
        self.page("Input.insertText", {"text": text})

    def screenshot(self) -> bytes:
        return base64.b64decode(self.page("Page.captureScreenshot", {"format": "png"})["data"])

    def close(self) -> None:
        try:
            if self._proc.poll() is None:
                self.send("Browser.close", timeout=5)
        except Exception:  # noqa: S110 - it is being stopped either way
            pass
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        self._log.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
