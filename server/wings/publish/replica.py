"""`canopy serve --index-uri URI`: a stateless replica of a published index.

A replica owns nothing but a cache, and its MCP sessions are stateless (any replica answers any
request, so a load balancer needs no stickiness): it opens the newest complete generation at the
URI (its files downloaded into a local folder, `replica_cache`), serves it like a local
index, polls the URI every `[publish] poll_s` and switches to a newer generation atomically (the
slot hands the new service to the next call; calls in flight finish on the one they started
with, which is closed `_DRAIN_S` later). Auth, views and caches are per replica.

The revocation handshake. The writer publishes a deletion or revocation the way it publishes
anything: a new manifest at the URI, written last. A replica serves a request only while its
generation is *confirmed*: a check of the URI that began at most `[publish]
revocation_bound_s` (B) ago found no newer manifest. The check lists the URI's manifests, and
S3 (and a local folder) list every object whose write completed before the listing began. So
if a manifest was published at time p, any check that began after p sees it, and a replica
that has not switched to it by p + B has no check that began after p to its name: it refuses
("cannot confirm") instead of answering from older data. The bound needs no clock shared
between machines (each replica measures B on its own monotonic clock), and a replica that
loses the object store, or cannot download the new generation within B, fails closed. Normal
operation keeps it confirmed: it checks every poll_s (a LIST and, on news, a GET), and poll_s
plus the time to download a new generation's changed files must stay below B.

A request's snapshot is taken when it starts: one that began before the bound ran out finishes
on its generation, as requests do on one machine while an update commits.

What a replica keeps of a superseded generation goes with the URI's copies: its folder, its
assembled database, its page map (the keys of its pages) and the blobs only it used are
deleted once its calls have drained, `_DRAIN_S` after the switch or
sooner, so that it is gone by the writer's `grace_s` after the generation that superseded it
was published (the replica switched within B of that: it drains for `grace_s` - B at most).
A replica that starts deletes whatever a previous run left in its cache but the generation it
opens, whose files it checks against the manifest first
(canopy.server.wings.publish.replica_cache).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from canopy.acl.policy import Policy
from canopy.errors import IndexMissing, IndexStale
from canopy.server.first_build import ServiceSlot
from canopy.server.runtime import Workspace
from canopy.server.service import CanopyService
from canopy.server.wings.publish.location import Location, open_location
from canopy.server.wings.publish.manifest import Manifest
from canopy.server.wings.publish.replica_cache import materialize, prune_cache, remove_generation
from canopy.server.wings.publish.writer import newest_manifest, published_seqs
from canopy.settings import Settings

if TYPE_CHECKING:
    from mcp.server import MCPServer

__all__ = ["ReplicaSlot", "replica_settings", "serve_replica"]

log = logging.getLogger(__name__)

_DRAIN_S = 120.0  # a superseded generation stays open this long for the calls still using it


def replica_settings(published: dict[str, Any], local: Settings) -> Settings:
    """The writer's published settings (policy, embedder, query...) with what is this
    replica's own: its callers' authentication, its [publish] section, and credentials from
    its environment (the manifest holds none)."""
    data = {**published, "auth": local.auth.model_dump(), "publish": local.publish.model_dump()}
    merged = Settings.model_validate(data)  # not the environment: the writer's settings hold
    return merged.model_copy(update={
        "llm": merged.llm.model_copy(update={"api_key": local.llm.api_key}),
        "embed": merged.embed.model_copy(update={"api_key": local.embed.api_key})})


def default_cache_dir(uri: str, port: int) -> Path:
    """One folder per URI and port: replicas on one machine never share a cache."""
    tag = hashlib.sha256(uri.encode()).hexdigest()[:12]
    user = os.environ.get("USER") or str(os.getuid() if hasattr(os, "getuid") else "user")
    return Path(tempfile.gettempdir()) / f"canopy-replica-{user}" / f"{tag}-{port}"


@dataclass
class _Serving:
    manifest: Manifest
    service: CanopyService
    confirmed_at: float  # monotonic start of the last check that found no newer manifest


@dataclass
class _Retired:
    manifest: Manifest
    service: CanopyService
    drain_s: float  # closed and deleted this long after `at`
    at: float = field(default_factory=time.monotonic)


def drain_seconds(newest: Manifest, bound_s: float) -> float:
    """How long a generation superseded by `newest` stays open (module doc)."""
    if newest.grace_s is None:
        return _DRAIN_S
    return max(0.0, min(_DRAIN_S, newest.grace_s - bound_s))


class ReplicaSlot(ServiceSlot):
    """The service of the newest published generation, while it is confirmed (module doc)."""

    def __init__(self, location: Location, local: Settings, cache_dir: Path) -> None:
        super().__init__(docs=location.uri)
        self.location = location
        self.local = local
        self.cache_dir = cache_dir
        self.bound_s = local.publish.revocation_bound_s
        self.poll_s = local.publish.poll_s
        self._serving: _Serving | None = None
        self._retired: list[_Retired] = []
        self._problem: str | None = None  # why the last check failed (the log has details)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- what callers see ------------------------------------------------------------------

    @property
    def service(self) -> CanopyService:
        with self._lock:
            serving = self._serving
        if serving is None:
            raise IndexMissing(self.describe())
        age = time.monotonic() - serving.confirmed_at
        if age > self.bound_s:
            raise IndexStale(
                f"This Canopy replica cannot confirm that its index is current: its last "
                f"successful check of the published index was {age:.0f} s ago, and it answers "
                f"only within {self.bound_s:.0f} s of one (a deletion or permission change may "
                "have been published since). Try again shortly or use another replica.")
        return serving.service

    def describe(self) -> str:
        with self._lock:
            problem = self._problem
        why = f" (the last attempt failed: {problem})" if problem else ""
        return ("This Canopy replica has not loaded a published index yet" + why
                + "; call again in a minute.")

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether calls are answered now, and the facts a load balancer or operator needs."""
        with self._lock:
            serving = self._serving
        if serving is None:
            return False, {"ready": False, "manifest": None, "generation": None}
        age = time.monotonic() - serving.confirmed_at
        ready = age <= self.bound_s
        return ready, {"ready": ready, "manifest": serving.manifest.seq,
                       "generation": serving.manifest.generation,
                       "confirmed_s_ago": round(age, 3), "bound_s": self.bound_s}

    # ---- following the URI -----------------------------------------------------------------

    def check(self) -> bool:
        """One check of the URI: confirm the generation served, or switch to a newer one.
        Returns whether the replica is now confirmed."""
        began = time.monotonic()
        try:
            seqs = published_seqs(self.location)
            with self._lock:
                serving = self._serving
                if serving is not None and seqs and seqs[-1] == serving.manifest.seq:
                    serving.confirmed_at = began  # one LIST confirms it
                    self._problem = None
                    return True
            newest = newest_manifest(self.location, seqs)
        except Exception as exc:  # unreachable store, credentials, a malformed manifest
            self._failed("the published index cannot be read", exc)
            return False
        if newest is None:
            self._failed("nothing is published at the index URI yet", None)
            return False
        try:
            service = self._open(newest)
        except Exception as exc:
            self._failed(f"generation {newest.generation} cannot be loaded", exc)
            return False
        with self._lock:
            old, self._serving = self._serving, _Serving(newest, service, began)
            self._problem = None
            if old is not None:
                self._retired.append(_Retired(old.manifest, old.service,
                                              drain_seconds(newest, self.bound_s)))
        log.warning("replica of %s now serves generation %d (manifest %d)", self.location.uri,
                    newest.generation, newest.seq)
        return True

    def _failed(self, what: str, exc: Exception | None) -> None:
        with self._lock:
            self._problem = what
        if exc is not None:  # the store's own text runs to pages: its first line says it
            log.error("%s (%s): %s", what, self.location.uri,
                      (str(exc).strip().splitlines() or [type(exc).__name__])[0])
        else:
            log.info("%s (%s)", what, self.location.uri)

    def _open(self, manifest: Manifest) -> CanopyService:
        folder, fetched = materialize(self.location, manifest, self.cache_dir)
        log.info("generation %d (manifest %d): %d bytes downloaded into %s", manifest.generation,
                 manifest.seq, fetched, folder)
        settings = replica_settings(manifest.settings, self.local)
        ws = Workspace(folder, folder, settings, Policy(settings.acl))
        return CanopyService(ws, warm=True)

    def _close_drained(self, force: bool = False) -> None:
        """Close the superseded services whose calls have had `_DRAIN_S` to finish (all of
        them with `force`), and delete their folders and the blobs only they used."""
        now = time.monotonic()
        with self._lock:
            done = [r for r in self._retired
                    if force or now - r.at >= min(r.drain_s, _DRAIN_S)]
            self._retired = [r for r in self._retired if r not in done]
            still = [r.manifest for r in self._retired]
            if self._serving is not None:
                still.append(self._serving.manifest)
        for r in done:
            r.service.close()
        for r in done:
            remove_generation(self.cache_dir, r.manifest.seq)
        if done:
            prune_cache(self.cache_dir, still)

    def _sweep(self) -> None:
        """Delete what a previous run of this replica left in the cache (no download runs:
        this is the checking thread, between checks)."""
        with self._lock:
            serving = self._serving.manifest if self._serving is not None else None
        for folder in sorted((self.cache_dir / "generations").glob("*")):
            if serving is None or folder.name != f"{serving.seq:012d}":
                shutil.rmtree(folder, ignore_errors=True)
        prune_cache(self.cache_dir, [] if serving is None else [serving], partial=True)

    def start(self) -> ReplicaSlot:
        """Check now and then every poll_s, on a daemon thread: the server listens meanwhile,
        and calls before the first generation is loaded are told so."""
        self._thread = threading.Thread(target=self._loop, daemon=True, name="canopy-replica")
        self._thread.start()
        return self

    def _loop(self) -> None:
        self.check()
        self._sweep()
        while not self._stop.wait(self.poll_s):
            self.check()
            self._close_drained()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._close_drained(force=True)
        with self._lock:
            serving, self._serving = self._serving, None
        if serving is not None:
            serving.service.close()


def build_replica(uri: str, local: Settings, cache_dir: Path) -> ReplicaSlot:
    p = local.publish
    location = open_location(uri, endpoint_url=p.endpoint_url, region=p.region)
    return ReplicaSlot(location, local, cache_dir)


def add_health_route(server: MCPServer, slot: ReplicaSlot) -> None:
    """GET /healthz: 200 while the replica answers, 503 while it cannot (not loaded yet, or not
    confirmed within the bound), so a load balancer can take it out of rotation."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response

    @server.custom_route("/healthz", methods=["GET"])
    async def healthz(request: Request) -> Response:
        ready, facts = slot.health()
        return JSONResponse(facts, status_code=200 if ready else 503)


def serve_replica(uri: str, *, use_http: bool, host: str, port: int, principal: str | None,
                  tokens_file: Path | None, config: Path | None, insecure_no_auth: bool) -> None:
    """Serve the index published at `uri` until interrupted (module doc)."""
    import click

    from canopy.server.http_auth import http_auth, is_loopback
    from canopy.server.mcp_app import build_server, run_stdio
    from canopy.settings import load_settings

    local = load_settings(None, config)
    cache_dir = Path(local.publish.cache_dir or default_cache_dir(uri, port if use_http else 0))
    cache_dir.mkdir(parents=True, exist_ok=True)
    verifier, auth_settings = None, None
    if use_http:
        # No documents: a relative token file is found from the working folder.
        here = Workspace(Path.cwd(), cache_dir, local, Policy(local.acl))
        verifier, auth_settings = http_auth(here, config, tokens_file, host, port,
                                            documents=False)
        if verifier is None and not is_loopback(host) and not insecure_no_auth:
            raise click.ClickException(
                f"refusing to serve {uri} on {host} without authentication: set [auth] "
                "tokens_file or jwt_* in the replica's settings, pass --tokens FILE, serve on "
                "127.0.0.1, or pass --insecure-no-auth")
    # The policy arrives with the first generation: a --principal it does not name is logged by
    # the service at the first call (and sees nothing), as for HTTP callers it does not know.
    slot = build_replica(uri, local, cache_dir).start()
    try:
        server = build_server(slot, principal_name=principal, auth=verifier,
                              auth_settings=auth_settings, host=host, port=port)
        if not use_http:
            run_stdio(server)
            return
        import uvicorn

        from canopy.server.http import mount_beside_mcp, stateless_app

        add_health_route(server, slot)
        mount_beside_mcp(server, slot, docs=uri.rstrip("/").rsplit("/", 1)[-1] or uri,
                         principal=principal, auth_required=verifier is not None, host=host)
        how = "bearer tokens required" if verifier is not None else "no authentication"
        click.echo(f"Canopy replica of {uri} at http://{host}:{port}/mcp ({how}; checks every "
                   f"{slot.poll_s:g} s, revocation bound {slot.bound_s:g} s)\n"
                   f"REST API at http://{host}:{port}/api/v1, web view at "
                   f"http://{host}:{port}/ui/, health at http://{host}:{port}/healthz", err=True)
        # Stateless sessions: behind a load balancer, any replica answers any request.
        app = stateless_app(server, host)
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
        uvicorn.run(app, host=host, port=port,
                    log_level=level if level in ("debug", "info", "warning") else "warning")
    finally:
        slot.close()
