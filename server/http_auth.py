"""Who may call an HTTP server: the bearer-token verifier `[auth]` (or --tokens) asks for, and
the MCP auth settings that advertise the server as an OAuth protected resource. Shared by
`canopy serve --http`, its worker processes (canopy.server.http) and a replica's server."""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mcp.server.auth.provider import TokenVerifier
    from mcp.server.auth.settings import AuthSettings as McpAuthSettings

    from canopy.server.runtime import Workspace

__all__ = ["http_auth", "is_loopback"]

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether `host` is this machine only (no other machine reaches a server bound there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def http_auth(ws: Workspace, config: Path | None, tokens_file: Path | None, host: str,
              port: int, *, documents: bool = True,
              ) -> tuple[TokenVerifier | None, McpAuthSettings | None]:
    """The bearer-token verifier `[auth]` (or --tokens) asks for, and the MCP auth settings that
    advertise this server as an OAuth protected resource. `documents=False`: `ws` has no
    documents folder to check the token file against (a replica: its policy comes with the
    published index, and its working folder is never indexed)."""
    from mcp.server.auth.settings import AuthSettings as McpAuthSettings

    from canopy.acl.auth import resolve_path, verifier_from_settings
    from canopy.errors import ConfigError
    from canopy.settings import find_config

    auth = ws.settings.auth
    if tokens_file is not None:
        auth = auth.model_copy(update={"tokens_file": tokens_file.resolve()})
    settings_file = find_config(ws.docs_dir, config)
    base_dir = (settings_file.resolve().parent if settings_file is not None
                else ws.docs_dir.resolve())
    verifier = verifier_from_settings(auth, base_dir)
    if verifier is None:
        return None, None
    if auth.tokens_file is not None and documents:
        _check_token_file(ws, resolve_path(auth.tokens_file, base_dir))
        log.info("HTTP callers: bearer tokens from %s", resolve_path(auth.tokens_file, base_dir))
    shown = "localhost" if host in ("0.0.0.0", "::") else f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    issuer = auth.jwt_issuer or ""
    if not issuer.startswith(("https://", "http://")):
        issuer = base
    try:
        # Validated from plain strings (pydantic parses the URLs); validate_token_resource=False:
        # the verifier checks `aud` itself.
        return verifier, McpAuthSettings.model_validate(
            {"issuer_url": issuer, "resource_server_url": auth.resource_url or f"{base}/mcp",
             "validate_token_resource": False})
    except ValueError as exc:  # pydantic's ValidationError: a malformed URL in [auth]
        raise ConfigError(f"[auth] resource_url / jwt_issuer must be http(s) URLs: {exc}") from None


def _check_token_file(ws: Workspace, path: Path) -> None:
    """Warnings for a token file that would be indexed, or that names principals the policy
    lacks."""
    from canopy.acl.bearer_tokens import read_tokens

    docs = ws.docs_dir.resolve()
    if path.resolve().is_relative_to(docs) and not path.name.startswith(".") \
            and path.suffix.lower() in ws.settings.input.extensions:
        log.warning("token file %s is inside the documents folder and will be indexed: move it out "
                    "or give it a name starting with '.'", path)
    if ws.policy.enabled:
        named = {r.principal for r in read_tokens(path)}
        unknown = sorted(named - set(ws.policy.settings.principals))
        if unknown:
            log.warning("token file %s names principals the [acl] policy does not list (they see "
                        "nothing): %s", path, ", ".join(unknown))
