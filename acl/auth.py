"""Who an HTTP caller is: bearer tokens checked by verifiers that follow the MCP SDK's
`TokenVerifier` protocol (design §5).

The SDK's bearer middleware calls `verify_token` on every request to the Streamable HTTP endpoint;
`None` answers 401 before any tool runs. A verifier here returns an `AccessToken` whose `subject`
is the principal's name as the `[acl]` policy knows it, and which the MCP server reads back through
`get_access_token()`. Nothing a client sends besides the token (headers, tool arguments) names the
caller.

- `TokenFile` (canopy.acl.bearer_tokens): hashed static tokens for small teams.
- `JwtVerifier`: signed JWTs from an identity provider (OIDC access tokens) or a shared key. The
  signature, `iss`, `aud` and `exp` are always checked; the accepted algorithms are pinned (never
  `none`, never a symmetric algorithm with a public key); the principal is one configurable claim.
- `verifier_from_settings` builds what the `[auth]` settings ask for (both in turn when both are
  configured).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio.to_thread
import jwt
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_pem_public_key
from mcp.server.auth.provider import AccessToken, TokenVerifier

from canopy.acl.bearer_tokens import MAX_TOKEN_CHARS, TokenFile
from canopy.errors import ConfigError
from canopy.settings import AuthSettings

__all__ = ["ChainVerifier", "JwtVerifier", "resolve_path", "verifier_from_settings"]

log = logging.getLogger(__name__)

HMAC_ALGORITHMS = frozenset({"HS256", "HS384", "HS512"})
PUBLIC_KEY_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
                                   "ES256", "ES256K", "ES384", "ES512", "EdDSA"})
MIN_HMAC_KEY_BYTES = 32  # RFC 7518 §3.2: an HS256 key at least as long as the hash output


class JwtVerifier:
    """Verifies JWT bearer tokens; the `principal_claim` claim names the caller.

    Exactly one key source: `key` (an HMAC secret, or a PEM public key) or `jwks_url` (the identity
    provider's key set, fetched lazily, cached for five minutes, refetched at most every 30 s for
    an unknown `kid`).
    """

    def __init__(
        self,
        *,
        issuer: str,
        audience: str,
        algorithms: Sequence[str],
        key: str | bytes | None = None,
        jwks_url: str | None = None,
        principal_claim: str = "sub",
        leeway_s: float = 30.0,
    ) -> None:
        if not issuer or not audience:
            raise ConfigError("JWT verification needs both an issuer (auth.jwt_issuer) and an "
                              "audience (auth.jwt_audience): without them any token the provider "
                              "signs for any application would be accepted")
        if (key is None) == (jwks_url is None):
            raise ConfigError("JWT verification needs exactly one key: auth.jwt_key (shared "
                              "secret), auth.jwt_public_key_file (PEM) or auth.jwt_jwks_url")
        algorithms = list(algorithms)
        if not algorithms:
            raise ConfigError("auth.jwt_algorithms must name at least one algorithm")
        unknown = [a for a in algorithms if a not in HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS]
        if unknown:
            raise ConfigError(f"unsupported JWT algorithm(s) {unknown}: use one of "
                              f"{sorted(HMAC_ALGORITHMS | PUBLIC_KEY_ALGORITHMS)} "
                              "('none' is never accepted)")
        symmetric = bool(key is not None and not _is_pem(key))
        wrong = [a for a in algorithms if (a in HMAC_ALGORITHMS) != symmetric]
        if wrong:
            kind = "a shared secret (auth.jwt_key)" if symmetric else "a public key or JWKS"
            raise ConfigError(f"JWT algorithm(s) {wrong} do not fit {kind}: HS* need a shared "
                              "secret, RS*/PS*/ES*/EdDSA a public key")
        if symmetric and key is not None and len(_as_bytes(key)) < MIN_HMAC_KEY_BYTES:
            raise ConfigError(f"auth.jwt_key is too short: an HMAC key needs at least "
                              f"{MIN_HMAC_KEY_BYTES} bytes (e.g. `python -c 'import secrets; "
                              "print(secrets.token_urlsafe(48))'`)")
        self.issuer = issuer
        self.audience = audience
        self.algorithms = algorithms
        self.principal_claim = principal_claim
        self.leeway_s = leeway_s
        self._key: Any = key
        if key is not None and not symmetric:
            try:
                self._key = load_pem_public_key(_as_bytes(key))
            except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
                raise ConfigError(f"the JWT key is not a PEM public key: {exc}") from None
        self._jwks = (jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300, timeout=10)
                      if jwks_url is not None else None)

    def decode(self, token: str) -> dict[str, Any]:
        """The verified claims; raises `jwt.PyJWTError` for any token that must be refused."""
        key = self._jwks.get_signing_key_from_jwt(token) if self._jwks is not None else self._key
        return jwt.decode(
            token, key, algorithms=self.algorithms, audience=self.audience, issuer=self.issuer,
            leeway=self.leeway_s,
            options={"require": ["exp", "iss", "aud"], "verify_signature": True,
                     "enforce_minimum_key_length": True},
        )

    def access_token(self, token: str) -> AccessToken | None:
        if not token or len(token) > MAX_TOKEN_CHARS * 4:
            return None
        try:
            claims = self.decode(token)
        except jwt.PyJWTError as exc:  # expired, wrong iss/aud/signature/alg, unknown kid...
            log.info("JWT refused: %s", exc)  # the reason only: never the token
            return None
        except Exception:  # a JWKS endpoint down, a malformed key set: refuse, keep serving
            log.warning("JWT verification failed", exc_info=True)
            return None
        principal = claims.get(self.principal_claim)
        if not isinstance(principal, str) or not principal.strip():
            log.info("JWT refused: no string claim %r naming the principal", self.principal_claim)
            return None
        scopes = claims.get("scope", claims.get("scp", []))
        scopes = scopes.split() if isinstance(scopes, str) else [str(s) for s in scopes or []]
        client = claims.get("client_id") or claims.get("azp") or principal
        # The SDK's bearer middleware refuses a token whose `expires_at` has passed, with no
        # leeway of its own: it gets the moment the leeway ends (issue 30, finding 7).
        return AccessToken(token=token, client_id=str(client), subject=principal, scopes=scopes,
                           expires_at=int(claims["exp"] + self.leeway_s),
                           claims={"iss": claims["iss"]})

    async def verify_token(self, token: str) -> AccessToken | None:
        if self._jwks is not None:  # may fetch the key set over the network: off the event loop
            return await anyio.to_thread.run_sync(self.access_token, token)
        return self.access_token(token)


class ChainVerifier:
    """The first verifier that accepts the token names the caller."""

    def __init__(self, verifiers: Sequence[TokenVerifier]) -> None:
        self.verifiers = list(verifiers)

    async def verify_token(self, token: str) -> AccessToken | None:
        for verifier in self.verifiers:
            found = await verifier.verify_token(token)
            if found is not None:
                return found
        return None


def resolve_path(path: Path, base_dir: Path) -> Path:
    path = Path(path).expanduser()
    return path if path.is_absolute() else base_dir / path


def verifier_from_settings(auth: AuthSettings, base_dir: Path) -> TokenVerifier | None:
    """The verifier `[auth]` describes (relative paths against `base_dir`), or None if it names
    none. A setting that cannot work (a missing file, a weak key, a missing audience) is a
    ConfigError."""
    verifiers: list[TokenVerifier] = []
    if auth.tokens_file is not None:
        verifiers.append(TokenFile(resolve_path(auth.tokens_file, base_dir)))
    if auth.jwt_enabled:
        verifiers.append(_jwt_from_settings(auth, base_dir))
    if not verifiers:
        return None
    return verifiers[0] if len(verifiers) == 1 else ChainVerifier(verifiers)


def _jwt_from_settings(auth: AuthSettings, base_dir: Path) -> JwtVerifier:
    sources = [s for s in (auth.jwt_key, auth.jwt_public_key_file, auth.jwt_jwks_url) if s]
    if len(sources) != 1:
        raise ConfigError("JWT verification needs exactly one of auth.jwt_key, "
                          "auth.jwt_public_key_file and auth.jwt_jwks_url "
                          f"({len(sources)} set)")
    key: str | None = None
    if auth.jwt_key is not None:
        key = auth.jwt_key.get_secret_value()
        if _is_pem(key):
            raise ConfigError(
                "auth.jwt_key is a PEM key: put public keys in auth.jwt_public_key_file")
    elif auth.jwt_public_key_file is not None:
        path = resolve_path(auth.jwt_public_key_file, base_dir)
        try:
            key = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read auth.jwt_public_key_file {path}: {exc}") from None
        if not _is_pem(key):
            raise ConfigError(f"{path} is not a PEM public key")
    default = ["HS256"] if auth.jwt_key is not None else ["RS256", "ES256"]
    algorithms = auth.jwt_algorithms or default
    if auth.jwt_jwks_url is not None and not auth.jwt_jwks_url.startswith(
            ("https://", "http://127.", "http://localhost", "http://[::1]")):
        raise ConfigError("auth.jwt_jwks_url must be https:// (plain http only on localhost)")
    return JwtVerifier(issuer=auth.jwt_issuer or "", audience=auth.jwt_audience or "",
                       algorithms=algorithms, key=key, jwks_url=auth.jwt_jwks_url,
                       principal_claim=auth.principal_claim, leeway_s=auth.jwt_leeway_s)


def _as_bytes(key: str | bytes) -> bytes:
    return key.encode("utf-8") if isinstance(key, str) else key


def _is_pem(key: str | bytes) -> bool:
    return _as_bytes(key).lstrip().startswith(b"-----BEGIN ")
