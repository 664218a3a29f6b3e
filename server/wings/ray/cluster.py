"""The writer's connection to a Ray cluster for one build: `connect_ray` and `RayExecutor`.

`connect_ray(address)` joins (or, for "local", starts) a cluster, sends it the writer's Canopy
code (`[distributed] ship_code`: nodes then need only the dependencies installed), checks that
its workers run that code (the same code gives the same extraction and vectors, so the build
equals a local one), and returns the executor that `canopy.providers.make_provider` /
`make_embedder` route work through. Ray is imported here only when a writer asks for it: the
servers never import this package.

Every failure to get there is a `ConfigError` in one line: Ray not installed, the cluster not
reachable, or workers that cannot import Canopy or run other code.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from canopy.errors import ConfigError
from canopy.extras import install_hint

if TYPE_CHECKING:
    from canopy.endpoint import Endpoint, EndpointConfig
    from canopy.providers.base import Embedder, Provider
    from canopy.server.wings.ray.remote_endpoint import EndpointPool
    from canopy.settings import DistributedSettings, EmbedSettings

__all__ = ["RayExecutor", "RayStats", "code_fingerprint", "connect_ray"]

log = logging.getLogger(__name__)

INSTALL_HINT = install_hint("ray")
# Ray's switch for single-node clusters (meant for Windows and macOS): "0" keeps every Ray
# process of the node on 127.0.0.1.
LOOPBACK_ONLY = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_REACH_TIMEOUT_S = 3.0  # a TCP connect to the cluster before Ray's own 30 s of retries


# Subpackages of `canopy` the workers never run (the writer's side), but for this wing and the
# two packages above it; `canopy.prompts` they do run.
_WRITER_ONLY = ("server", "indexer", "acl")


def _worker_code() -> list[tuple[str, Path]]:
    """What runs on the workers, as (path in the installed layout, file): the kernel's modules,
    the prompt templates (`canopy/prompts/...`) and this wing (`canopy/server/wings/ray/...`,
    with the two package files above it), wherever this checkout or install keeps them (a
    checkout has prompts/ and server/ beside canopy/, a wheel inside it)."""
    import canopy
    import canopy.prompts
    import canopy.server

    kernel = Path(canopy.__file__).resolve().parent
    prompts = Path(canopy.prompts.__file__).resolve().parent
    server = Path(canopy.server.__file__).resolve().parent
    wing = Path(__file__).resolve().parent
    files = [(p.relative_to(kernel).as_posix(), p) for p in kernel.rglob("*.py")
             if p.relative_to(kernel).parts[0] not in (*_WRITER_ONLY, "prompts")]
    files += [(f"prompts/{p.relative_to(prompts).as_posix()}", p) for p in prompts.rglob("*")
              if p.is_file() and p.suffix in (".py", ".txt")]
    files += [("server/__init__.py", server / "__init__.py"),
              ("server/wings/__init__.py", server / "wings" / "__init__.py")]
    files += [(f"server/wings/ray/{p.relative_to(wing).as_posix()}", p) for p in wing.glob("*.py")]
    return sorted(files)


def code_fingerprint() -> str:
    """sha256 of the code the workers run (`_worker_code`: the kernel's modules, the prompt
    templates and this wing). The writer and every worker must agree, or the build would not be
    the local one."""
    digest = hashlib.sha256()
    for name, path in _worker_code():
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class RayStats:
    """What the cluster did for one build (printed by `canopy index --ray`, in --json)."""

    address: str
    workers: int
    cluster_cpus: int
    endpoint_calls: int = 0  # POSTs made by endpoint workers (retries included)
    overhead_ms_per_call: float = 0.0  # Ray's round trip less the POST itself, mean
    writer_wait_ms_per_call: float = 0.0  # reply in, the writer's loop busy, mean
    lost_calls: int = 0  # POSTs whose worker died (retried by the client's policy)
    startup_s: float = 0.0  # connecting, checking the workers' code, starting endpoint actors
    extract_tasks: int = 0
    embed_tasks: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def _check_reachable(address: str, *, found: bool = False) -> None:
    """A cluster named by host:port must accept a TCP connection within a few seconds (Ray
    itself would retry for 30 s and then print its own traceback). `found`: the address is
    the one `--ray auto` found (`_found_cluster`)."""
    target = address[len("ray://"):] if address.startswith("ray://") else address
    parts = urlsplit(f"//{target}")
    if not parts.hostname or parts.port is None:
        raise ConfigError(f"--ray {address!r}: expected auto, local, host:port or "
                          "ray://host:port")
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=_REACH_TIMEOUT_S):
            pass
    except OSError as exc:
        why = exc.strerror or exc
        if found:
            raise ConfigError(
                f"--ray auto found the Ray cluster at {address} (RAY_ADDRESS, or the file a "
                f"`ray start` leaves), but it does not answer ({why}): that cluster has "
                "stopped. Start it again (`ray start --head`), or use --ray local for a "
                "cluster of this build's own") from None
        raise ConfigError(f"cannot reach the Ray cluster at {address} ({why}): "
                          "is `ray start --head` running there, and is the port right?") from None


def _found_cluster() -> str | None:
    """The address `--ray auto` connects to, found as Ray finds it: RAY_ADDRESS, else the
    cluster file the last `ray start` on this machine wrote (`ray_current_cluster` in Ray's
    temporary folder), else a running cluster's GCS process. Ray itself spends minutes in
    connection retries when the file names a cluster that has stopped (a `ray start` killed
    rather than stopped with `ray stop`), so the caller checks the address first. None: this
    Ray finds clusters otherwise (left to Ray)."""
    named = os.environ.get("RAY_ADDRESS", "")
    if named and named != "auto":
        return named
    try:
        from ray._private.services import canonicalize_bootstrap_address
    except ImportError:
        return None
    try:
        found = canonicalize_bootstrap_address("auto")
    except ConnectionError:  # nothing found
        found = None
    if not found:
        raise ConfigError("--ray auto: no Ray cluster runs on this machine (start one with "
                          "`ray start --head`, name one with --ray HOST:PORT, or use --ray "
                          "local for a cluster of this build's own)")
    return str(found)


def _shipped_code(stage: Path) -> dict[str, Any]:
    """Ray's runtime_env that sends this writer's worker code with the job (`py_modules`): the
    kernel, its prompt templates and this wing, laid out under `stage` as installed (`canopy/`,
    with `canopy/prompts/` and `canopy/server/wings/ray/` inside), since Ray ships each module
    folder as one top-level package."""
    package = stage / "canopy"
    for name, path in _worker_code():
        target = package / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    return {"py_modules": [str(package)], "excludes": ["__pycache__", "*.pyc"]}


def connect_ray(address: str, settings: DistributedSettings) -> RayExecutor:
    """Join the Ray cluster at `address` ("auto", "local", "host:port", "ray://host:port") for
    one build (or several: the caller closes it). A process already connected to Ray (a test,
    a notebook) keeps its connection for "auto", "local" or that cluster's own address."""
    t0 = time.perf_counter()
    if address == "local":
        # A cluster started for one build serves this machine only: Ray then binds its
        # processes to the loopback address instead of the machine's network address (Ray
        # reads this when it is imported; an operator's own setting wins).
        os.environ.setdefault(LOOPBACK_ONLY, "0")
    ray = _import_ray()
    if address == "auto" and not ray.is_initialized():
        found = _found_cluster()
        if found is not None:
            _check_reachable(found, found=True)
    elif address not in ("auto", "local"):
        _check_reachable(address)
    owns = not ray.is_initialized()
    if not owns:
        current = ray.get_runtime_context().gcs_address
        if address not in ("auto", "local", current):
            raise ConfigError(f"--ray {address}: this process is already connected to the Ray "
                              f"cluster at {current}")
    else:
        options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
        stage: Path | None = None
        if address == "local":
            options["address"] = "local"  # a new cluster, whatever `ray start` runs here
            options["include_dashboard"] = False
            if settings.workers:
                options["num_cpus"] = settings.workers
        else:
            options["address"] = address
            if settings.ship_code:
                stage = Path(tempfile.mkdtemp(prefix="canopy-ray-code-"))
                options["runtime_env"] = _shipped_code(stage)
        try:
            joined(ray, options)  # uploads the runtime_env's modules before it returns
        except (ConnectionError, TimeoutError, RuntimeError) as exc:
            # Ray turns on token authentication by itself only for a cluster it finds ("auto");
            # for an address the driver needs RAY_AUTH_MODE=token and the token.
            hint = ("; if the cluster uses Ray's token authentication, set RAY_AUTH_MODE=token "
                    "and its token (RAY_AUTH_TOKEN, or ~/.ray/auth_token)"
                    if address != "auto" and not os.environ.get("RAY_AUTH_MODE") else "")
            raise ConfigError(f"cannot join the Ray cluster at {address}: "
                              f"{str(exc).splitlines()[0][:200]}{hint}") from None
        finally:
            if stage is not None:
                shutil.rmtree(stage, ignore_errors=True)
    executor = RayExecutor(address, settings, owns=owns)
    try:
        executor.check_workers()
    except BaseException:
        executor.close()
        raise
    executor.startup_s += time.perf_counter() - t0
    return executor


# Ray Client's server starts a server process per driver; when that start is slow (a loaded
# head, a runtime_env to set up) the driver gets "Initialization failure from server" although
# a second attempt joins (seen in this repo's Ray tests on a 2-core machine).
_CLIENT_START_FAILURE = "Initialization failure from server"
JOIN_ATTEMPTS = 3
JOIN_WAIT_S = 2.0


def _client_start_failed(exc: BaseException) -> bool:
    return isinstance(exc, ConnectionError) and str(exc).startswith(_CLIENT_START_FAILURE)


def joined(ray: Any, options: dict[str, Any]) -> None:
    """`ray.init(**options)`, tried again (up to JOIN_ATTEMPTS, JOIN_WAIT_S apart) when Ray
    Client's server failed to start this driver's session; other errors are raised at once."""
    from tenacity import (
        RetryCallState,
        Retrying,
        retry_if_exception,
        stop_after_attempt,
        wait_fixed,
    )

    def again(state: RetryCallState) -> None:
        log.info("Ray Client's server did not start a session; joining again")
        ray.shutdown()  # a failed client init leaves its half-made connection behind

    for attempt in Retrying(stop=stop_after_attempt(JOIN_ATTEMPTS), wait=wait_fixed(JOIN_WAIT_S),
                            retry=retry_if_exception(_client_start_failed), before_sleep=again,
                            reraise=True):
        with attempt:
            ray.init(**options)


class RayExecutor:
    """What one build keeps on the cluster: endpoint actors per endpoint, and the builtin
    provider's tasks. `close()` ends them (and the connection, when this executor made it)."""

    def __init__(self, address: str, settings: DistributedSettings, *, owns: bool) -> None:
        import ray

        self._ray = ray
        self.address = address
        self._owns = owns
        self.cluster_cpus = int(ray.cluster_resources().get("CPU", 0))
        self.workers = settings.workers or max(1, self.cluster_cpus)
        self.batch_units = settings.batch_units
        self.startup_s = 0.0
        self._pools: dict[EndpointConfig, EndpointPool] = {}
        self._lock = threading.Lock()
        self._provider: Any = None
        self._embedder: Any = None

    def check_workers(self, expected: str | None = None) -> None:
        """ConfigError unless a worker imports Canopy and runs the writer's code (`expected`:
        its `code_fingerprint`, this process's by default)."""
        remote = self._ray.remote(num_cpus=0)(code_fingerprint)
        try:
            theirs = self._ray.get(remote.remote(), timeout=120)
        except Exception as exc:  # a worker that cannot import canopy fails to unpickle it
            cause = str(exc).strip().splitlines()[-1][:200] if str(exc).strip() else ""
            raise ConfigError(
                f"the Ray workers at {self.address} cannot run Canopy ({type(exc).__name__}"
                f"{': ' + cause if cause else ''}): install the writer's version on every node "
                f"({INSTALL_HINT})") from None
        ours = expected or code_fingerprint()
        if theirs != ours:
            raise ConfigError(
                f"the Ray workers at {self.address} run other Canopy code than this writer "
                f"(source fingerprint {theirs}, here {ours}): install the same version on "
                "every node, or results would differ from a local build")

    # ---- what make_provider / make_embedder route through ------------------------------------

    def endpoints(self, config: EndpointConfig) -> Endpoint:
        """`canopy.endpoint.EndpointFactory`: this endpoint's requests, through its actors."""
        from canopy.server.wings.ray.remote_endpoint import EndpointPool, RemoteEndpoint

        with self._lock:
            pool = self._pools.get(config)
            if pool is None:
                pool = self._pools[config] = EndpointPool(config, self.workers)
        return RemoteEndpoint(pool)

    def builtin_provider(self) -> Provider:
        from canopy.server.wings.ray.builtin_work import RayBuiltinProvider

        self._provider = RayBuiltinProvider(batch_units=self.batch_units,
                                            in_flight=self.workers)
        return self._provider

    def builtin_embedder(self, local: Embedder, settings: EmbedSettings) -> Embedder:
        from canopy.server.wings.ray.builtin_work import RayEmbedder

        self._embedder = RayEmbedder(local, settings, self.workers)
        return self._embedder

    # ---- accounting and shutdown ---------------------------------------------------------------

    def stats(self) -> RayStats:
        out = RayStats(self.address, self.workers, self.cluster_cpus)
        overhead = waited = 0.0
        startup = self.startup_s
        for pool in self._pools.values():
            out.endpoint_calls += pool.stats.calls
            out.lost_calls += pool.stats.lost
            overhead += pool.stats.overhead_s
            waited += pool.stats.waited_s
            startup += pool.stats.startup_s
        if out.endpoint_calls:
            out.overhead_ms_per_call = round(1000 * overhead / out.endpoint_calls, 3)
            out.writer_wait_ms_per_call = round(1000 * waited / out.endpoint_calls, 3)
        out.startup_s = round(startup, 3)
        if self._provider is not None:
            out.extract_tasks = self._provider.tasks
        if self._embedder is not None:
            out.embed_tasks = self._embedder.tasks
        return out

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
        if self._owns and self._ray.is_initialized():
            self._ray.shutdown()
