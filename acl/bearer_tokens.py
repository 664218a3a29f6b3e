"""Static bearer tokens for small teams: a JSON-lines file mapping token hashes to principals.

One line per token, `{"principal": "alice", "sha256": "<hex>", "created": "<UTC ISO time>"}`;
blank lines and lines starting with `#` are ignored. `canopy token add` prints a new token once
and stores only its hash.

Why a plain SHA-256 and no salt or slow KDF: the tokens are 32 random bytes from `secrets`
(256 bits of entropy), not passwords a person chose. Slow hashes (scrypt, PBKDF2) and salts exist
to make guessing low-entropy secrets expensive and to defeat precomputed tables; neither attack
applies when the search space is 2**256, so a fast hash loses nothing and keeps each request's
check to one SHA-256 (this is also how GitHub and PyPI store API tokens). The file is therefore
not secret, but it names who has access, so it is written 0600 and should live outside the
documents folder (or start with a dot, which the indexer skips).

`TokenFile` is the MCP SDK `TokenVerifier` over such a file. It re-reads the file whenever its
inode, size or modification time changes, so `canopy token revoke` takes effect on the next
request without a restart. A file that goes missing or becomes unreadable fails closed: no token
is accepted until it is fixed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from filelock import FileLock
from mcp.server.auth.provider import AccessToken

from canopy.errors import ConfigError

__all__ = ["TOKEN_PREFIX", "TokenFile", "TokenRecord", "add_token", "hash_token", "new_token",
           "read_tokens", "revoke_tokens"]

log = logging.getLogger(__name__)

TOKEN_PREFIX = "cnpy_"  # makes leaked tokens easy to recognize (secret scanners, logs)
MAX_TOKEN_CHARS = 4096  # anything longer is not one of ours; refuse before hashing
_PRINCIPAL = re.compile(r"^[^\s\x00-\x1f\x7f]{1,200}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class TokenRecord:
    principal: str
    sha256: str
    created: str

    @property
    def id(self) -> str:
        """A short, non-secret handle for one token (the start of its hash)."""
        return self.sha256[:12]


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def check_principal(name: str) -> str:
    if not _PRINCIPAL.match(name):
        raise ConfigError(f"invalid principal name {name!r}: 1-200 characters, no spaces or "
                          "control characters")
    return name


def read_tokens(path: Path) -> list[TokenRecord]:
    """The records of a token file; a malformed line is an error naming its line number."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"token file not found: {path} (create it with `canopy token add {path} "
                          "PRINCIPAL`)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token file {path}: {exc}") from None
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            row = json.loads(line)
            record = TokenRecord(check_principal(str(row["principal"])), str(row["sha256"]).lower(),
                                 str(row.get("created", "")))
        except (ValueError, KeyError, TypeError, ConfigError) as exc:
            raise ConfigError(f"{path}:{n}: not a token record ({exc})") from None
        if not _HEX64.match(record.sha256):
            raise ConfigError(f"{path}:{n}: sha256 must be 64 hex digits")
        records.append(record)
    return records


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serializes writers (two `canopy token` commands at once); readers never wait."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(path.name + ".lock")):
        yield


def _write(path: Path, records: list[TokenRecord]) -> None:
    """Atomic replace: a reader sees the old file or the new one, never half of either."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_token(path: Path, principal: str) -> str:
    """A new random token for `principal`; only its hash is stored. Returns the token itself."""
    path = Path(path)
    check_principal(principal)
    with _locked(path):
        records = read_tokens(path) if path.exists() else []
        token = new_token()
        created = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        _write(path, [*records, TokenRecord(principal, hash_token(token), created)])
    return token


def revoke_tokens(path: Path, principal: str, token_id: str | None = None) -> list[TokenRecord]:
    """Removes every token of `principal` (or only the one whose id starts with `token_id`)."""
    path = Path(path)
    with _locked(path):
        records = read_tokens(path)
        gone = [r for r in records if r.principal == principal
                and (token_id is None or r.sha256.startswith(token_id.lower()))]
        if gone:
            _write(path, [r for r in records if r not in gone])
    return gone


class TokenFile:
    """`TokenVerifier` over a token file: the token's principal becomes the caller's identity."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._records: list[TokenRecord] = read_tokens(self.path)  # at start-up, errors are fatal
        self._signature = self._stat()

    def _stat(self) -> tuple[int, int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns

    def records(self) -> list[TokenRecord]:
        """The current records, re-read if the file changed since the last call."""
        signature = self._stat()
        if signature != self._signature:
            self._signature = signature
            try:
                self._records = read_tokens(self.path)
                log.info("token file %s reloaded: %d tokens", self.path, len(self._records))
            except ConfigError as exc:
                self._records = []  # fail closed until the file is fixed
                log.error("token file unusable, refusing every token until it is fixed: %s", exc)
        return self._records

    def principal_of(self, token: str) -> str | None:
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest = hash_token(token)
        found = None
        for r in self.records():  # every record is compared: timing does not depend on the match
            if hmac.compare_digest(digest, r.sha256):
                found = r.principal
        return found

    async def verify_token(self, token: str) -> AccessToken | None:
        principal = self.principal_of(token)
        if principal is None:
            return None
        return AccessToken(token=token, client_id=principal, subject=principal, scopes=[])
