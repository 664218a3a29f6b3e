"""Who the caller is: hashed static tokens, JWTs, `canopy serve --http` with bearer tokens, the
stdio principal, and policy edits that apply to a running server.

The HTTP tests run `canopy serve --http` on 127.0.0.1 over a copy of examples/multi-tenant:
alice reads public + finance, bob public only, carol public + hr.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest
import uvicorn
from click.testing import CliRunner
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from canopy.acl.auth import JwtVerifier, verifier_from_settings
from canopy.acl.bearer_tokens import TokenFile, add_token, hash_token, read_tokens, revoke_tokens
from canopy.acl.policy import Principal
from canopy.errors import ConfigError
from canopy.server.cli import main
from canopy.server.mcp_app import build_server
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import AuthSettings
from tests.conftest import REPO, offline_env
from tests.net import free_port, wait_for_port

MULTI = REPO / "examples" / "multi-tenant"
DEMO = {  # the demo-only tokens of examples/multi-tenant/tokens.jsonl (its README prints them too)
    "alice": "cnpy_demo_alice_xvbRAsuIrTUPzlAyLDaMHsCWsoCPXAAG",
    "bob": "cnpy_demo_bob_BIAMx-F4BJm2FXhNXG--hR8Gpb19fvhb",
    "carol": "cnpy_demo_carol_ZZJb1ZJ2SVRkSncH-HSRSi2J-JoGa8VF",
}
DOCUMENTS = {"alice": 9, "bob": 7, "carol": 8}  # 7 public, 2 finance, 1 hr
FINANCE_QUESTION = "What was the revenue in 2024, and what is the 2025 budget?"
FINANCE_FACTS = ("64.8", "11.07")  # written only in restricted/finance/
HR_QUESTION = "How large is the Juniper retention pool?"
HR_FACT = "212,400"  # written only in hr/

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def text_of(result: Any) -> str:
    return "\n".join(getattr(block, "text", "") for block in result.content)


def clean_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("CANOPY_", "OPENAI_"))},
            "PYTHONPATH": str(REPO)}


def multi_tenant_copy(root: Path) -> Path:
    """examples/multi-tenant copied under `root`, indexed into root/index; returns the docs
    folder."""
    shutil.copytree(MULTI, root / "multi-tenant", ignore=shutil.ignore_patterns(".canopy"))
    docs = root / "multi-tenant" / "docs"
    build_index(open_workspace(docs, index_dir=root / "index"))
    return docs


@contextmanager
def canopy_serve_http(docs: Path, index_dir: Path, log_path: Path, *extra: str) -> Iterator[str]:
    """`canopy serve DOCS --http` in a subprocess on a free loopback port; yields its /mcp URL."""
    port = free_port()
    args = [sys.executable, "-m", "canopy.server.cli", "-v", "serve", str(docs),
            "--index-dir", str(index_dir), "--http", "--port", str(port), *extra]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            args, cwd=REPO, env=clean_env(), stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for_port(port, proc)
            yield f"http://127.0.0.1:{port}/mcp"
        finally:
            proc.terminate()
            proc.wait(10)


@asynccontextmanager
async def http_client(url: str, token: str, **headers: str) -> AsyncIterator[Client]:
    auth = {"Authorization": f"Bearer {token}", **headers}
    async with (httpx2.AsyncClient(headers=auth, timeout=60) as http,
                Client(streamable_http_client(url, http_client=http)) as client):
        yield client


async def post_initialize(url: str, headers: dict[str, str]) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        return await http.post(
            url, json=body, headers={"Accept": "application/json, text/event-stream", **headers}
        )


async def documents_seen(url: str, token: str) -> int:
    async with http_client(url, token) as c:
        return int((await c.call_tool("index_status", {})).structured_content["documents"])


# ---- the token file -------------------------------------------------------------------------


def test_a_new_token_is_printed_once_and_only_its_hash_is_stored(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    done = CliRunner().invoke(main, ["token", "add", str(path), "alice"])
    assert done.exit_code == 0, done.output
    token = done.stdout.strip()
    assert token.startswith("cnpy_") and len(token) >= 45  # 32 random bytes, url-safe base64
    stored = path.read_text()
    assert token not in stored and hash_token(token) in stored
    assert json.loads(stored)["principal"] == "alice"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    listed = CliRunner().invoke(main, ["token", "list", str(path)])
    assert listed.exit_code == 0 and listed.stdout.startswith(f"alice\t{hash_token(token)[:12]}\t")
    assert token not in listed.output


def test_each_token_names_its_principal_and_anything_else_names_nobody(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    alice, bob, alice2 = add_token(path, "alice"), add_token(path, "bob"), add_token(path, "alice")
    verifier = TokenFile(path)
    assert [verifier.principal_of(t) for t in (alice, bob, alice2)] == ["alice", "bob", "alice"]
    for wrong in ("", alice[:-1], alice + "x", hash_token(alice), "x" * 100_000, bob.upper()):
        assert verifier.principal_of(wrong) is None


async def test_the_token_file_verifier_gives_the_sdk_an_access_token_whose_subject_is_the_principal(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tokens.jsonl"
    token = add_token(path, "alice@example.com")
    found = await TokenFile(path).verify_token(token)
    assert found is not None and found.subject == "alice@example.com" and found.token == token
    assert await TokenFile(path).verify_token("cnpy_not-a-token") is None


def test_a_revoked_token_is_refused_by_a_running_verifier_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    alice, bob = add_token(path, "alice"), add_token(path, "bob")
    verifier = TokenFile(path)
    assert verifier.principal_of(alice) == "alice"
    done = CliRunner().invoke(main, ["token", "revoke", str(path), "alice"])
    assert done.exit_code == 0 and "Revoked 1 token(s) of alice" in done.output
    assert verifier.principal_of(alice) is None
    assert verifier.principal_of(bob) == "bob"
    carol = add_token(path, "carol")  # additions apply at once too
    assert verifier.principal_of(carol) == "carol"
    again = CliRunner().invoke(main, ["token", "revoke", str(path), "alice"])
    assert again.exit_code == 1 and "no token of 'alice'" in again.output


def test_revoking_by_id_removes_only_that_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    first, second = add_token(path, "alice"), add_token(path, "alice")
    gone = revoke_tokens(path, "alice", hash_token(first)[:12])
    assert [r.sha256 for r in gone] == [hash_token(first)]
    verifier = TokenFile(path)
    assert verifier.principal_of(first) is None and verifier.principal_of(second) == "alice"


def test_a_token_file_that_turns_malformed_refuses_every_token_until_fixed(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    token = add_token(path, "alice")
    good = path.read_text()
    verifier = TokenFile(path)
    path.write_text(good + "{not json\n")
    assert verifier.principal_of(token) is None  # fail closed, never "keep the old tokens"
    path.unlink()
    assert verifier.principal_of(token) is None
    path.write_text(good)
    assert verifier.principal_of(token) == "alice"


@pytest.mark.parametrize(("content", "message"), [
    (None, "token file not found"),
    ('{"principal": "alice"}\n', ":1: not a token record"),
    ('# comment\n\n{"principal": "a b", "sha256": "' + "0" * 64 + '"}\n', ":3: not a token record"),
    ('{"principal": "alice", "sha256": "abc"}\n', ":1: sha256 must be 64 hex digits"),
])
def test_an_unusable_token_file_is_a_clear_error_at_start(
    tmp_path: Path, content: str | None, message: str
) -> None:
    path = tmp_path / "tokens.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        TokenFile(path)


def test_the_bundled_demo_tokens_match_the_hashed_example_file() -> None:
    verifier = TokenFile(MULTI / "tokens.jsonl")
    assert {name: verifier.principal_of(token) for name, token in DEMO.items()} == {
        n: n for n in DEMO
    }
    assert all(token not in (MULTI / "tokens.jsonl").read_text() for token in DEMO.values())
    assert {r.principal for r in read_tokens(MULTI / "tokens.jsonl")} == set(DEMO)


# ---- JWT ---------------------------------------------------------------------------------------

ISSUER, AUDIENCE = "https://id.example.test/", "canopy-test"
HS_KEY = "k" * 48


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def public_pem(key: rsa.RSAPrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    base = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 600}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def rs256(key: rsa.RSAPrivateKey, kid: str | None = None, **changes: Any) -> str:
    return jwt.encode(
        claims(**changes), key, algorithm="RS256", headers={"kid": kid} if kid else None
    )


def rs_verifier(key: rsa.RSAPrivateKey, **kwargs: Any) -> JwtVerifier:
    return JwtVerifier(
        issuer=ISSUER, audience=AUDIENCE, algorithms=["RS256"], key=public_pem(key), **kwargs
    )


def unsigned(**changes: Any) -> str:
    import base64

    def b64(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims(**changes))}."


async def test_a_valid_rs256_jwt_names_its_principal(rsa_key: rsa.RSAPrivateKey) -> None:
    token = rs256(rsa_key, scope="read search")
    found = await rs_verifier(rsa_key).verify_token(token)
    assert found is not None
    assert found.subject == "alice" and found.scopes == ["read", "search"]
    # accepted until its expiry plus the leeway (30 s by default), as the SDK reads expires_at
    assert found.expires_at == jwt.decode(token, options={"verify_signature": False})["exp"] + 30
    assert found.claims == {"iss": ISSUER}


async def test_the_principal_comes_from_the_configured_claim(rsa_key: rsa.RSAPrivateKey) -> None:
    verifier = rs_verifier(rsa_key, principal_claim="email")
    found = await verifier.verify_token(rs256(rsa_key, email="bob@example.com"))
    assert found is not None and found.subject == "bob@example.com"
    assert await verifier.verify_token(rs256(rsa_key)) is None  # no such claim: refused
    assert await verifier.verify_token(rs256(rsa_key, email=["bob"])) is None  # not a string


@pytest.mark.parametrize("make", [
    pytest.param(lambda k, o: rs256(k, exp=int(time.time()) - 3600), id="expired"),
    pytest.param(lambda k, o: rs256(k, exp=None), id="no-expiry"),
    pytest.param(lambda k, o: rs256(k, aud="another-app"), id="wrong-audience"),
    pytest.param(lambda k, o: rs256(k, aud=None), id="no-audience"),
    pytest.param(lambda k, o: rs256(k, iss="https://evil.example.test/"), id="wrong-issuer"),
    pytest.param(lambda k, o: rs256(k, nbf=int(time.time()) + 3600), id="not-yet-valid"),
    pytest.param(lambda k, o: rs256(o), id="signed-by-another-key"),
    pytest.param(lambda k, o: unsigned(), id="alg-none"),
    pytest.param(lambda k, o: jwt.encode(claims(), HS_KEY, algorithm="HS256"),
                 id="hs256-not-allowed"),
    pytest.param(lambda k, o: rs256(k)[:-4] + "AAAA", id="tampered-signature"),
    pytest.param(lambda k, o: "not.a.jwt", id="garbage"),
])
async def test_a_jwt_that_fails_any_check_is_refused(rsa_key: rsa.RSAPrivateKey, make: Any) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert await rs_verifier(rsa_key).verify_token(make(rsa_key, other)) is None


async def test_an_hs256_jwt_with_the_shared_key_is_accepted_and_alg_none_is_not() -> None:
    verifier = verifier_from_settings(
        AuthSettings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_key=HS_KEY), Path("."))
    assert verifier is not None
    found = await verifier.verify_token(jwt.encode(claims(sub="carol"), HS_KEY, algorithm="HS256"))
    assert found is not None and found.subject == "carol"
    assert await verifier.verify_token(unsigned(sub="carol")) is None
    assert await verifier.verify_token(jwt.encode(claims(), "x" * 48, algorithm="HS256")) is None


@pytest.mark.parametrize(("settings", "message"), [
    ({"jwt_audience": AUDIENCE, "jwt_key": HS_KEY}, "issuer"),
    ({"jwt_issuer": ISSUER, "jwt_key": HS_KEY}, "audience"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE}, "exactly one"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_key": HS_KEY,
      "jwt_jwks_url": "https://id.example.test/jwks"}, "exactly one"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_key": HS_KEY,
      "jwt_algorithms": ["none"]}, "never accepted"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_key": HS_KEY,
      "jwt_algorithms": ["RS256"]}, "do not fit"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_key": "short"}, "too short"),
    ({"jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, "jwt_jwks_url": "http://id.example.test/jwks"},
     "https"),
])
def test_unsafe_jwt_settings_are_refused_at_start(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        verifier_from_settings(AuthSettings(**settings), Path("."))


def test_a_public_key_is_never_used_as_an_hmac_secret(
    rsa_key: rsa.RSAPrivateKey, tmp_path: Path
) -> None:
    """The classic algorithm confusion: an HS256 token 'signed' with the server's public key."""
    pem = tmp_path / "idp.pem"
    pem.write_text(public_pem(rsa_key))
    with pytest.raises(ConfigError, match="do not fit"):
        verifier_from_settings(AuthSettings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE,
                                            jwt_public_key_file=Path("idp.pem"),
                                            jwt_algorithms=["HS256"]),
                               tmp_path)
    verifier = verifier_from_settings(AuthSettings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE,
                                                   jwt_public_key_file=Path("idp.pem")), tmp_path)
    assert isinstance(verifier, JwtVerifier) and verifier.algorithms == ["RS256", "ES256"]
    forged = jwt.api_jws.PyJWS()  # bypass PyJWT's own refusal to HMAC-sign with a PEM key
    forged._algorithms["HS256"].prepare_key = lambda key: key  # type: ignore[method-assign]
    token = forged.encode(
        json.dumps(claims()).encode(), public_pem(rsa_key).encode(), algorithm="HS256"
    )
    assert verifier.access_token(token) is None
    assert verifier.access_token(rs256(rsa_key)) is not None


@contextmanager
def jwks_server(jwks: dict[str, Any]) -> Iterator[tuple[str, list[str]]]:
    """A JWKS endpoint on 127.0.0.1; yields its URL and the list of paths requested."""
    requests: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            requests.append(self.path)
            body = json.dumps(jwks).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json", requests
    finally:
        server.shutdown()
        server.server_close()


async def test_jwts_are_checked_against_the_identity_providers_jwks_which_is_cached(
    rsa_key: rsa.RSAPrivateKey,
) -> None:
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa_key.public_key()))
    keys = {"keys": [{**jwk, "kid": "k1", "use": "sig", "alg": "RS256"}]}
    with jwks_server(keys) as (url, requests):
        verifier = verifier_from_settings(
            AuthSettings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_jwks_url=url), Path("."))
        assert verifier is not None
        for who in ("alice", "bob"):
            found = await verifier.verify_token(rs256(rsa_key, kid="k1", sub=who))
            assert found is not None and found.subject == who
        assert len(requests) == 1  # the key set is fetched once, then cached
        assert await verifier.verify_token(rs256(rsa_key, kid="k2")) is None  # unknown key id
        assert await verifier.verify_token(rs256(rsa_key, kid="k1", exp=1)) is None
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        assert await verifier.verify_token(rs256(other, kid="k1")) is None
        assert len(requests) <= 2  # unknown kids do not hammer the provider


# ---- canopy serve --http ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi_tenant(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A private, indexed copy of examples/multi-tenant: (docs folder, index folder)."""
    root = tmp_path_factory.mktemp("multi-tenant")
    with offline_env():
        docs = multi_tenant_copy(root)
    return docs, root / "index"


@pytest.fixture(scope="module")
def served(
    multi_tenant: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`canopy serve --http` over the example, tokens from its canopy.toml [auth]; yields the
    URL."""
    docs, index_dir = multi_tenant
    log_path = tmp_path_factory.mktemp("serve-log") / "server.log"
    with canopy_serve_http(docs, index_dir, log_path) as url:
        yield url


@pytest.mark.parametrize("headers", [
    pytest.param({}, id="no-token"),
    pytest.param({"Authorization": "Bearer cnpy_demo_alice_wrong"}, id="wrong-token"),
    pytest.param({"Authorization": "Bearer " + jwt.encode(claims(), HS_KEY, algorithm="HS256")},
                 id="jwt"),
    pytest.param({"Authorization": DEMO["alice"]}, id="token-without-bearer"),
    pytest.param({"X-Canopy-Principal": "alice"}, id="principal-header"),
])
async def test_a_request_without_a_valid_bearer_token_gets_401(
    served: str, headers: dict[str, str]
) -> None:
    response = await post_initialize(served, headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert "oauth-protected-resource" in response.headers["www-authenticate"]


async def test_two_users_get_their_own_views_from_the_same_server_at_the_same_time(
    served: str,
) -> None:
    async def session(who: str) -> dict[str, Any]:
        async with http_client(served, DEMO[who]) as c:
            status, finance, hr, local = await asyncio.gather(
                c.call_tool("index_status", {}),
                c.call_tool("basic_search", {"query": FINANCE_QUESTION, "k": 20}),
                c.call_tool("basic_search", {"query": HR_QUESTION, "k": 20}),
                c.call_tool(
                    "local_search", {"query": "What does the 2025 budget give Project Tern?"}
                ),
            )
        assert not any(r.is_error for r in (status, finance, hr, local)), who
        return {"documents": status.structured_content["documents"],
                "finance": text_of(finance) + json.dumps(finance.structured_content),
                "hr": text_of(hr) + json.dumps(hr.structured_content),
                "local": local.structured_content}

    alice, bob, carol = await asyncio.gather(session("alice"), session("bob"), session("carol"))
    seen = {"alice": alice["documents"], "bob": bob["documents"], "carol": carol["documents"]}
    assert seen == DOCUMENTS
    assert all(fact in alice["finance"] for fact in FINANCE_FACTS)
    for other in (bob, carol):
        assert not any(fact in other[key] for fact in FINANCE_FACTS for key in ("finance", "hr"))
        assert "restricted/" not in json.dumps(other["local"])
    assert HR_FACT in carol["hr"] and "hr/retention_plan_2025.md" in carol["hr"]
    for other in (alice, bob):
        everything = json.dumps(other)
        assert HR_FACT not in everything and "Halvorsen" not in everything  # only hr/ has them
        assert "hr/retention_plan_2025.md" not in everything
    cited = {c.get("document") for c in alice["local"]["citations"]}
    assert any(str(d).startswith("restricted/finance/") for d in cited), cited


async def test_identity_comes_from_the_token_never_from_headers_or_tool_arguments(
    served: str,
) -> None:
    async with http_client(
        served, DEMO["bob"], **{"X-Canopy-Principal": "alice", "X-User": "alice"}
    ) as c:
        status = await c.call_tool("index_status", {"principal": "alice", "user": "alice"})
        found = await c.call_tool("basic_search", {"query": FINANCE_QUESTION, "principal": "alice"})
    assert status.structured_content["documents"] == DOCUMENTS["bob"]
    assert not any(fact in text_of(found) for fact in FINANCE_FACTS)


async def test_a_session_cannot_be_taken_over_with_another_users_token(served: str) -> None:
    response = await post_initialize(served, {"Authorization": f"Bearer {DEMO['bob']}"})
    assert response.status_code == 200
    session = response.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "index_status", "arguments": {}}}
    async with httpx2.AsyncClient(timeout=30) as http:
        hijack = await http.post(served, json=call, headers={
            "Authorization": f"Bearer {DEMO['alice']}", "Mcp-Session-Id": session,
            "MCP-Protocol-Version": "2025-06-18", "Accept": "application/json, text/event-stream"})
    assert hijack.status_code in (401, 403, 404)
    assert str(DOCUMENTS["alice"]) not in hijack.text


async def test_a_token_revoked_while_the_server_runs_gets_401_on_its_next_request(
    served: str, multi_tenant: tuple[Path, Path]
) -> None:
    tokens = multi_tenant[0].parent / "tokens.jsonl"
    extra = add_token(tokens, "bob")  # this test's own token: the demo tokens stay as they were
    assert await documents_seen(served, extra) == DOCUMENTS["bob"]
    assert CliRunner().invoke(main, ["token", "revoke", str(tokens), "bob", "--id",
                                     hash_token(extra)[:12]]).exit_code == 0
    assert (await post_initialize(served, {"Authorization": f"Bearer {extra}"})).status_code == 401
    assert await documents_seen(served, DEMO["bob"]) == DOCUMENTS["bob"]


async def test_a_policy_edit_applies_to_the_running_server_without_a_restart(
    tmp_path: Path,
) -> None:
    docs = await asyncio.to_thread(multi_tenant_copy, tmp_path)
    index_dir = tmp_path / "index"
    with canopy_serve_http(docs, index_dir, tmp_path / "server.log") as url:
        assert await documents_seen(url, DEMO["bob"]) == DOCUMENTS["bob"]
        toml = docs / "canopy.toml"
        toml.write_text(toml.read_text().replace('bob = ["staff"]', 'bob = ["staff", "finance"]'))
        await asyncio.to_thread(build_index, open_workspace(docs, index_dir=index_dir))
        assert await documents_seen(url, DEMO["bob"]) == DOCUMENTS["alice"]
        async with http_client(url, DEMO["bob"]) as c:
            found = await c.call_tool("basic_search", {"query": FINANCE_QUESTION, "k": 20})
        assert all(
            fact in text_of(found) + json.dumps(found.structured_content) for fact in FINANCE_FACTS
        )
        # A rule edit relabels documents: it applies when the update that relabels them commits.
        toml.write_text(toml.read_text().replace('"restricted/finance/**"', '"nowhere/**"'))
        assert await documents_seen(url, DEMO["alice"]) == DOCUMENTS["alice"]
        await asyncio.to_thread(build_index, open_workspace(docs, index_dir=index_dir))
        assert (
            await documents_seen(url, DEMO["alice"]) == DOCUMENTS["bob"]
        )  # finance/ matches no rule now
        assert await documents_seen(url, DEMO["bob"]) == DOCUMENTS["bob"]
    assert "policy reloaded" in (tmp_path / "server.log").read_text()


async def test_a_jwt_caller_over_http_is_identified_by_its_claim(
    multi_tenant: tuple[Path, Path],
) -> None:
    docs, index_dir = multi_tenant
    verifier = verifier_from_settings(
        AuthSettings(jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwt_key=HS_KEY), Path("."))
    service = CanopyService(open_workspace(docs, index_dir=index_dir))
    port = free_port()
    server = build_server(service, auth=verifier, port=port)
    config = uvicorn.Config(server.streamable_http_app(host="127.0.0.1"), host="127.0.0.1",
                            port=port, log_level="warning")
    uv = uvicorn.Server(config)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        wait_for_port(port)
        for who in ("alice", "carol"):
            token = jwt.encode(claims(sub=who), HS_KEY, algorithm="HS256")
            assert await documents_seen(url, token) == DOCUMENTS[who]
        expired = jwt.encode(claims(exp=int(time.time()) - 3600), HS_KEY, algorithm="HS256")
        assert (
            await post_initialize(url, {"Authorization": f"Bearer {expired}"})
        ).status_code == 401
        # Issue 30, finding 7: within `[auth] jwt_leeway_s` (30 s) of its expiry a token is
        # still accepted end to end (the SDK's middleware checked expiry with no leeway).
        skewed = jwt.encode(claims(sub="carol", exp=int(time.time()) - 10), HS_KEY,
                            algorithm="HS256")
        assert await documents_seen(url, skewed) == DOCUMENTS["carol"]
        past = jwt.encode(claims(sub="carol", exp=int(time.time()) - 45), HS_KEY,
                          algorithm="HS256")
        assert (await post_initialize(url, {"Authorization": f"Bearer {past}"})).status_code == 401
        assert (
            await post_initialize(url, {"Authorization": f"Bearer {unsigned()}"})
        ).status_code == 401
    finally:
        uv.should_exit = True
        thread.join(10)
        service.close()


# ---- canopy serve: start-up rules, stdio ------------------------------------------------------


def test_http_on_a_non_loopback_host_without_auth_is_refused(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "examples" / "docs" / "projects", docs)
    done = CliRunner().invoke(main, ["serve", str(docs), "--http", "--host", "0.0.0.0"])
    assert done.exit_code == 1
    assert "refusing to serve" in done.output and "--insecure-no-auth" in done.output
    assert not (docs / ".canopy").exists()  # refused before building anything


def test_serve_wires_the_token_file_and_the_insecure_flag_as_asked(
    multi_tenant: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from canopy.server import http

    docs, index_dir = multi_tenant
    plain = tmp_path / "plain"
    shutil.copytree(docs, plain, ignore=shutil.ignore_patterns("canopy.toml", ".canopy"))
    calls: list[tuple[Any, str]] = []

    def serving(server: Any, host: str, port: int, *, on_listening: Any = None) -> None:
        calls.append((server, host))
        if on_listening is not None:  # the port "accepts": the banner follows
            on_listening()

    monkeypatch.setattr(http, "serve_in_process", serving)
    tokens = tmp_path / "t.jsonl"
    add_token(tokens, "alice")
    args = ["serve", str(plain), "--index-dir", str(index_dir), "--http", "--host", "0.0.0.0"]
    done = CliRunner().invoke(main, [*args, "--tokens", str(tokens)])
    assert done.exit_code == 0, done.output
    assert "bearer tokens required" in done.output
    server, host = calls[-1]
    assert host == "0.0.0.0" and server.settings.auth is not None
    assert (
        isinstance(server._token_verifier, TokenFile)
        and server._token_verifier.path == tokens.resolve()
    )
    done = CliRunner().invoke(main, [*args, "--insecure-no-auth"])
    assert done.exit_code == 0, done.output
    assert "no authentication" in done.output and calls[-1][0].settings.auth is None
    done = CliRunner().invoke(
        main, ["serve", str(plain), "--index-dir", str(index_dir), "--tokens", str(tokens)]
    )
    assert done.exit_code == 2 and "--tokens applies to --http only" in done.output


async def test_the_stdio_caller_is_the_principal_named_at_start_up(
    multi_tenant: tuple[Path, Path],
) -> None:
    docs, index_dir = multi_tenant
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "canopy.server.cli", "serve", str(docs), "--index-dir", str(index_dir)],
        env={**clean_env(), "CANOPY_PRINCIPAL": "carol"},
        cwd=str(REPO),
    )
    async with Client(params) as client:
        status = await client.call_tool("index_status", {"principal": "alice"})
        found = await client.call_tool("basic_search", {"query": HR_QUESTION})
    assert status.structured_content["documents"] == DOCUMENTS["carol"]
    assert HR_FACT in text_of(found)


# ---- policy reload in the service ---------------------------------------------------------------


@pytest.fixture
def tenant_service(tmp_path: Path) -> Iterator[tuple[CanopyService, Path]]:
    """A CanopyService over a private indexed copy of examples/multi-tenant: (service, docs)."""
    docs = multi_tenant_copy(tmp_path)
    service = CanopyService(open_workspace(docs, index_dir=tmp_path / "index"))
    yield service, docs
    service.close()


def seen_by(service: CanopyService, who: str | Principal) -> int:
    with service.context(who) as ctx:
        return ctx.reader.inventory.count_readable("documents")


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_a_change_of_who_holds_which_labels_applies_at_the_next_request(
    tenant_service: tuple[CanopyService, Path],
) -> None:
    service, docs = tenant_service
    assert seen_by(service, "bob") == DOCUMENTS["bob"]
    stale = service.principal("bob")
    edit(docs / "canopy.toml", 'bob = ["staff"]', 'bob = ["staff", "hr"]')
    # resolved under the old policy, used right after the edit: re-resolved under the new one
    assert seen_by(service, stale) == DOCUMENTS["carol"]
    assert seen_by(service, "bob") == DOCUMENTS["carol"]
    edit(docs / "canopy.toml", 'bob = ["staff", "hr"]', "bob = []")  # revocation needs no re-index
    assert seen_by(service, "bob") == 0


def test_a_change_of_document_labels_applies_when_the_relabelling_update_commits(
    tenant_service: tuple[CanopyService, Path],
) -> None:
    service, docs = tenant_service
    toml = docs / "canopy.toml"
    original = toml.read_text()
    edit(toml, 'glob = "restricted/finance/**"\nlabels = ["finance"]',
         'glob = "restricted/finance/**"\nlabels = ["staff"]')
    assert seen_by(service, "bob") == DOCUMENTS["bob"]  # documents still carry their old labels
    build_index(open_workspace(docs, index_dir=docs.parent.parent / "index"))
    assert seen_by(service, "bob") == DOCUMENTS["alice"]
    assert seen_by(service, "carol") == 10
    # Deleting the [acl] section (or an editor's half-written file) is not "everyone reads
    # everything" until the update that removes the labels commits.
    toml.write_text(original.split("[acl]")[0])
    assert seen_by(service, "nobody") == 0
    build_index(open_workspace(docs, index_dir=docs.parent.parent / "index"))
    assert seen_by(service, "nobody") == 10


def test_an_unreadable_settings_file_fails_closed_until_it_is_fixed(
    tenant_service: tuple[CanopyService, Path], tmp_path: Path
) -> None:
    """A half-written or broken policy must not keep granting what it may have revoked."""
    service, docs = tenant_service
    toml = docs / "canopy.toml"
    good = toml.read_text()
    toml.write_text(
        good.replace('bob = ["staff"]', 'bob = ["staff"') + "\n[acl.principals.broken\n"
    )
    for who in ("bob", "alice"):
        with pytest.raises(ConfigError, match="cannot be read, so nothing is served"):
            seen_by(service, who)
    toml.write_text(good)
    assert seen_by(service, "bob") == DOCUMENTS["bob"]
    assert seen_by(service, "alice") == DOCUMENTS["alice"]


def test_a_policy_given_in_code_is_not_replaced_by_the_settings_file(tmp_path: Path) -> None:
    docs = multi_tenant_copy(tmp_path)
    acl = {"enabled": True, "rules": [{"glob": "**", "labels": ["all"]}],
           "principals": {"bob": ["all"]}}
    build_index(open_workspace(docs, index_dir=tmp_path / "index", acl=acl))
    service = CanopyService(open_workspace(docs, index_dir=tmp_path / "index", acl=acl))
    try:
        assert seen_by(service, "bob") == 10
        build_index(open_workspace(docs, index_dir=tmp_path / "index", acl=acl))
        assert seen_by(service, "bob") == 10
    finally:
        service.close()
