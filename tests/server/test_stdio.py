"""`canopy serve` over stdio answers every malformed request and keeps serving (issue 9, case 11:
a lone surrogate, `params` as a list or deep nesting got no reply at all from mcp 2.3's transport).

The real server is spawned and fed raw bytes, the way a broken or hostile client would write them.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw-test", "version": "1"}}}


class RawClient:
    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.pending = b""
        self.probes = 0

    def send(self, line: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + b"\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 20.0) -> dict[str, Any]:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, "no reply from the server"
            chunk = os.read(fd, 1 << 16)
            assert chunk, "the server closed stdout"
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def replies_until_probe(self) -> list[dict[str, Any]]:
        """Every reply before the answer to a fresh ping (which proves the server still serves)."""
        self.probes += 1
        probe = f"probe-{self.probes}"
        self.send(json.dumps({"jsonrpc": "2.0", "id": probe, "method": "ping"}).encode())
        replies = []
        while (reply := self.recv()).get("id") != probe:
            replies.append(reply)
        assert reply.get("result") == {}
        return replies


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RawClient]:
    docs = tmp_path_factory.mktemp("stdio-docs")
    (docs / "a.txt").write_text("Maria Okafor leads Project Kestrel.", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-m", "canopy.server.cli", "serve", str(docs)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, cwd=REPO)
    raw = RawClient(proc)
    raw.send(json.dumps(INIT).encode())
    assert raw.recv(timeout=120)["result"]["serverInfo"]["name"] == "canopy"
    raw.send(b'{"jsonrpc":"2.0","method":"notifications/initialized"}')
    yield raw
    assert proc.stdin is not None
    proc.stdin.close()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.mark.parametrize("line, code, request_id", [
    (b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"basic_search",'
     b'"arguments":{"query":"\\ud800"}}}', -32700, 2),
    (b'{"jsonrpc":"2.0","id":3,"method":"tools/list","params":[]}', -32602, 3),
    (b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"basic_search","arguments":'
     b'{"query":' + b"[" * 5000 + b"]" * 5000 + b"}}}", -32600, None),
    (b'{"jsonrpc":"2.0","id":5,"method":"tools/list","params":{"x":'
     + b"[" * 200 + b"]" * 200 + b"}}", -32600, 5),
    (b"not json", -32700, None),
    (b'\xff{"jsonrpc":"2.0","id":6,"method":"tools/list"}', -32700, None),
    (b"[1, 2]", -32600, None),
    (b'{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}', -32600, None),
])
def test_each_malformed_request_gets_one_json_rpc_error_and_the_server_keeps_serving(
        client: RawClient, line: bytes, code: int, request_id: int | None) -> None:
    client.send(line)
    replies = client.replies_until_probe()
    assert len(replies) == 1
    assert replies[0]["error"]["code"] == code and replies[0]["id"] == request_id


def test_malformed_notifications_and_responses_get_no_reply(client: RawClient) -> None:
    client.send(b'{"jsonrpc":"2.0","method":"notifications/x","params":[]}')
    client.send(b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"\\udc00"}}')
    assert client.replies_until_probe() == []


# Lines an attacker would try: arbitrary bytes, and JSON-RPC-shaped objects with hostile fields.
JSON_LEAF = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                      st.text(max_size=8), st.sampled_from(["\ud800", "\udfff", "a\udc80b"]))
JSON_VALUE = st.recursive(JSON_LEAF, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=12)
HOSTILE = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "id": st.one_of(st.integers(), JSON_LEAF),
     "method": st.sampled_from(["tools/call", "tools/list", "resources/read", "ping", "x"])},
    optional={"params": JSON_VALUE})


def _encode(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=True).encode()  # \\ud800 escapes survive as text


JUNK = st.binary(max_size=60).map(lambda b: b.replace(b"\n", b" "))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(JUNK, HOSTILE.map(_encode)))
def test_no_line_silences_the_server_and_each_request_gets_at_most_one_reply(client: RawClient,
                                                                               line: bytes) -> None:
    client.send(line)
    replies = client.replies_until_probe()
    assert len(replies) == _expected_replies(line)
    for reply in replies:
        assert reply["jsonrpc"] == "2.0" and ("result" in reply or "error" in reply)


def _expected_replies(line: bytes) -> int:
    """One reply to anything but a blank line, a notification or a response (JSON-RPC 2.0 §4.1,
    §5: invalid messages are answered with id null)."""
    if not line.strip():
        return 0
    try:
        message = json.loads(line)
    except ValueError:
        return 1
    if isinstance(message, dict) and (
            "id" not in message and isinstance(message.get("method"), str)
            or "method" not in message and ("result" in message or "error" in message)):
        return 0
    return 1
