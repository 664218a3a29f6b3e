"""`canopy mcp-config`: the agent-host configuration works the first time, from a bare
environment with an empty PATH (as Claude Desktop starts servers), without a shell to expand `~`
or find `canopy`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from canopy.server.cli import main
from tests.conftest import EXAMPLES


def _config(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = CliRunner(env=env).invoke(main, ["mcp-config", *args, "--host", "claude-desktop"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def _rpc(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> dict[str, Any] | None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(message).encode() + b"\n")
    proc.stdin.flush()
    if "id" not in message:
        return None
    while True:  # skip notifications (logging, progress) until the answer to this id
        line = proc.stdout.readline()
        assert line, "the server closed stdout"
        reply = json.loads(line)
        if reply.get("id") == message["id"]:
            return reply


def test_the_claude_desktop_config_starts_the_server_with_an_empty_path_and_a_bare_env(
        examples_index: Path, tmp_path: Path) -> None:
    entry = _config(str(EXAMPLES), "--index-dir", str(examples_index))["mcpServers"]["canopy"]
    assert Path(entry["command"]).is_absolute() and entry["command"] != "canopy"
    # the environment it runs in: what the config gives it, an empty PATH, nothing else
    env = {**entry["env"], "PATH": ""}
    proc = subprocess.Popen([entry["command"], *entry["args"]], env=env, cwd="/",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=(tmp_path / "stderr").open("wb"))
    try:
        init = _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "claude-desktop-like", "version": "0"}}})
        assert init is not None and init["result"]["serverInfo"]["name"] == "canopy", init
        _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        called = _rpc(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                             "params": {"name": "index_status", "arguments": {}}})
        assert called is not None and not called["result"].get("isError"), called
        assert called["result"]["structuredContent"]["documents"] == 17
    finally:
        proc.kill()
        proc.wait(10)


def test_paths_are_absolute_and_the_endpoint_goes_with_the_config_but_never_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {"CANOPY_LLM_BASE_URL": "http://127.0.0.1:11434/v1", "CANOPY_LLM_MODEL": "qwen2.5",
           "OPENAI_API_KEY": "sk-not-to-be-printed"}
    monkeypatch.chdir(tmp_path)
    entry = _config("~/docs", "--index-dir", "~/idx", env=env)["mcpServers"]["canopy"]
    assert entry["args"][-4:] == ["serve", str(docs.resolve()), "--index-dir",
                                  str((tmp_path / "idx").resolve())]
    assert entry["env"]["CANOPY_LLM_BASE_URL"] == "http://127.0.0.1:11434/v1"
    assert entry["env"]["CANOPY_LLM_MODEL"] == "qwen2.5"
    assert entry["env"]["CANOPY_LLM_API_KEY"] == "<your API key>"  # named, not copied
    every = CliRunner(env=env).invoke(main, ["mcp-config", "docs"])
    assert every.exit_code == 0 and "sk-not-to-be-printed" not in every.output
    # Claude Code takes the key from the variable that holds it here
    assert '"CANOPY_LLM_API_KEY=$OPENAI_API_KEY"' in every.stdout
    assert '"CANOPY_LLM_API_KEY": "${OPENAI_API_KEY}"' in every.stdout


def test_a_policy_needs_a_known_principal(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "canopy.toml").write_text("[acl.principals]\nalice = ['staff']\n", encoding="utf-8")
    done = CliRunner().invoke(main, ["mcp-config", str(docs), "--principal", "mallory"])
    assert done.exit_code == 1 and "unknown principal 'mallory'" in done.output
    entry = _config(str(docs), "--principal", "alice")["mcpServers"]["canopy"]
    assert entry["args"][-2:] == ["--principal", "alice"]


def test_the_command_runs_this_interpreter() -> None:
    entry = _config(str(EXAMPLES))["mcpServers"]["canopy"]
    assert entry["command"] == str(Path(sys.executable).absolute())
    assert entry["args"][:3] == ["-m", "canopy.server.cli", "serve"]
    assert os.path.isabs(entry["args"][3])
