"""`canopy mcp-config`: the agent-host configuration that starts this Canopy on these documents,
ready to paste (Claude Desktop, Claude Code, any MCP host that starts stdio servers).

What makes it work the first time, where a hand-written `"command": "canopy"` did not:
- the command is this Python interpreter's absolute path running `-m canopy.server.cli`, not a
  bare `canopy`: Claude Desktop starts servers with a minimal PATH, on which `canopy` is not;
- every path is absolute with `~` expanded: hosts start servers from a folder of their own and
  no shell expands `~` in a JSON file;
- the environment the index needs goes with it: the endpoint's base URL and model when they come
  from this shell's environment (a host does not inherit it), and the NAMES of the key
  variables, never their values (the key is not printed: Claude Code expands `${VAR}` from its
  own environment; for Claude Desktop the value is a placeholder to replace);
- run from a checkout that is not installed, PYTHONPATH names it (the interpreter would not find
  `canopy` from the host's folder otherwise).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any, Literal

import click

import canopy
from canopy.server.cli.common import CONFIG, INDEX_DIR

__all__ = ["mcp_config", "server_entry"]

Host = Literal["claude-desktop", "claude-code", "generic"]
HOSTS: tuple[Host, ...] = ("claude-desktop", "claude-code", "generic")
KEY_PLACEHOLDER = "<your API key>"

# (setting, the variable the server reads, the shell variables it may come from here)
_ENDPOINT_VARS = (
    ("llm.base_url", "CANOPY_LLM_BASE_URL", ("CANOPY_LLM_BASE_URL", "OPENAI_BASE_URL")),
    ("llm.model", "CANOPY_LLM_MODEL", ("CANOPY_LLM_MODEL",)),
    ("embed.base_url", "CANOPY_EMBED_BASE_URL", ("CANOPY_EMBED_BASE_URL",)),
    ("embed.model", "CANOPY_EMBED_MODEL", ("CANOPY_EMBED_MODEL",)),
)
_KEY_VARS = (("llm", "CANOPY_LLM_API_KEY", ("CANOPY_LLM_API_KEY", "OPENAI_API_KEY")),
             ("embed", "CANOPY_EMBED_API_KEY", ("CANOPY_EMBED_API_KEY",)))


def _absolute(path: Path) -> str:
    return str(path.expanduser().resolve())


def server_entry(docs: Path, index_dir: Path | None, config: Path | None,
                 principal: str | None) -> tuple[dict[str, Any], dict[str, str]]:
    """The stdio server entry (`command`, `args`, `env`) and the key variables the host must
    supply (each given a placeholder value in `env`), each with the variable of this shell that
    holds it."""
    from canopy.settings import load_settings

    args = ["-m", "canopy.server.cli", "serve", _absolute(docs)]
    if index_dir is not None:
        args += ["--index-dir", _absolute(index_dir)]
    if config is not None:
        args += ["--config", _absolute(config)]
    if principal:
        args += ["--principal", principal]
    settings = load_settings(docs.expanduser(), config.expanduser() if config else None)
    env: dict[str, str] = {}
    for _, target, sources in _ENDPOINT_VARS:
        value = next((os.environ[s] for s in sources if os.environ.get(s)), None)
        if value:
            env[target] = value
    keys: dict[str, str] = {}
    for section, target, sources in _KEY_VARS:
        held = next((s for s in sources if os.environ.get(s)), None)
        if getattr(settings, section).enabled and held is not None:
            env[target] = KEY_PLACEHOLDER  # the value stays in this shell
            keys[target] = held
    if canopy._is_checkout():  # found from this checkout's folder only: say where it is
        env["PYTHONPATH"] = str(Path(canopy.__file__).resolve().parents[1])
    # sys.executable as it is, not resolved: a virtualenv's python is a link whose target
    # would not see the environment's packages
    return {"command": str(Path(sys.executable).absolute()), "args": args, "env": env}, keys


def _claude_code_command(name: str, entry: dict[str, Any], keys: dict[str, str]) -> str:
    words = ["claude", "mcp", "add", name, "--scope", "user"]
    for var, value in entry["env"].items():
        words += ["-e", f"{var}={value}"]
    line = shlex.join([*words, "--", entry["command"], *entry["args"]])
    for var, held in keys.items():  # the shell puts the key in, not this output
        line = line.replace(shlex.quote(f"{var}={KEY_PLACEHOLDER}"), f'"{var}=${held}"')
    return line


def render(host: Host, name: str, entry: dict[str, Any], keys: dict[str, str]) -> str:
    """The configuration text for one host."""
    if host == "claude-desktop":
        return json.dumps({"mcpServers": {name: entry}}, indent=2)
    if host == "claude-code":
        project = {**entry, "env": {k: (f"${{{keys[k]}}}" if k in keys else v)
                                    for k, v in entry["env"].items()}}
        return (_claude_code_command(name, entry, keys) + "\n\n# or, in the project's .mcp.json:\n"
                + json.dumps({"mcpServers": {name: {"type": "stdio", **project}}}, indent=2))
    return json.dumps({name: {"transport": "stdio", **entry}}, indent=2)


_WHERE = {
    "claude-desktop": "Claude Desktop: claude_desktop_config.json (macOS: ~/Library/Application "
                      "Support/Claude/, Windows: %APPDATA%\\Claude\\), then restart it",
    "claude-code": "Claude Code: run this once (or put the JSON in the project's .mcp.json)",
    "generic": "Any MCP host that starts stdio servers: command, args and env of the server",
}


def _folder(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """DOCS with `~` expanded also when no shell did (a quoted '~/docs'), then checked."""
    folder = value.expanduser()
    if not folder.is_dir():
        raise click.BadParameter(f"{str(folder)!r} is not a folder.")
    return folder


@click.command("mcp-config")
@click.argument("docs", type=click.Path(file_okay=False, path_type=Path), callback=_folder)
@INDEX_DIR
@CONFIG
@click.option("--principal", envvar="CANOPY_PRINCIPAL",
              help="Serve as this principal of the [acl] policy (over stdio the caller is fixed).")
@click.option("--name", default="canopy", show_default=True, help="The server's name in the host.")
@click.option("--host", "hosts", type=click.Choice(HOSTS), multiple=True,
              help="Only this host's configuration, alone on stdout (repeatable; default: all "
                   "three, each under a heading).")
def mcp_config(docs: Path, index_dir: Path | None, config: Path | None, principal: str | None,
               name: str, hosts: tuple[Host, ...]) -> None:
    """Print the configuration that starts Canopy on DOCS from an agent host.

    The command is this Python's absolute path (hosts start servers without your shell's PATH),
    paths are absolute, and the endpoint settings of this shell's environment go with it (key
    variables by name only).

    \b
    Examples:
      canopy mcp-config ~/docs
      canopy mcp-config ~/docs --host claude-desktop > claude_desktop_config.json
      CANOPY_LLM_BASE_URL=http://localhost:11434/v1 CANOPY_LLM_MODEL=qwen2.5 \
        canopy mcp-config ~/docs
    """
    from canopy.server.cli.common import check_principal
    from canopy.settings import load_settings

    check_principal(load_settings(docs, config).acl, principal)
    entry, keys = server_entry(docs, index_dir, config, principal)
    if len(hosts) == 1:
        click.echo(render(hosts[0], name, entry, keys))
        return
    for i, host in enumerate(hosts or HOSTS):
        click.echo(("\n" if i else "") + f"# {_WHERE[host]}")
        click.echo(render(host, name, entry, keys))
    if keys:
        click.echo(f"\n# {', '.join(keys)}: replace {KEY_PLACEHOLDER!r} with the key (Claude "
                   "Desktop), or have it set where Claude Code runs.", err=True)
