"""Distributed indexing on a local Ray cluster (issue 13 item 3): `canopy index --ray` builds the
index a local build makes, with the same accounting, retries and rate-limit behaviour.

One Ray cluster serves the module (`ray.init(num_cpus=2)`, about 10 s to start here); each build
pairs a local run with a Ray run of the same documents and settings, and every stored artifact
of the two is compared: extractions, entities, relationships, claims, communities, reports with
their fingerprints, and the embedding vectors.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from canopy.errors import ConfigError
from canopy.health import DB_NAME
from canopy.server.cli import main
from canopy.server.runtime import build_index, open_workspace
from canopy.server.wings.ray import connect_ray
from canopy.server.wings.ray.cluster import LOOPBACK_ONLY
from canopy.settings import DistributedSettings
from canopy.store import Store
from canopy.store.export import load_graph
from canopy.vectors import TABLES
from tests.conftest import EXAMPLES, REPO, offline_env, require_heavy, wait_until
from tests.fakes.openai_server import FakeOpenAI


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local Ray cluster of 2 CPUs for the module, on 127.0.0.1 only (LOOPBACK_ONLY: Ray
    reads it on import), its logs under the test's temporary folder; every build joins it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(LOOPBACK_ONLY, "0")
        require_heavy("ray")  # imports it: after LOOPBACK_ONLY, which Ray reads on import
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
                 logging_level="WARNING", _temp_dir=str(tmp_path_factory.mktemp("ray")))
        try:
            assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
            yield ray
        finally:
            ray.shutdown()


def snapshot(index_dir: Path) -> dict[str, Any]:
    """Everything a build stores that a second build must reproduce byte for byte."""
    import lancedb

    store = Store(index_dir)
    try:
        g = load_graph(store)
    finally:
        store.close()
    db = sqlite3.connect(f"file:{index_dir / DB_NAME}?mode=ro", uri=True)
    try:
        extractions = {t: sorted(db.execute(f"SELECT * FROM {t}")) for t in (
            "extracted", "entity_instances", "relationship_instances", "claim_instances")}
        vectors = sorted(db.execute("SELECT key, vector FROM embeddings"))
    finally:
        db.close()
    lance = lancedb.connect(str(index_dir / "lance"))
    search_rows = {name: sorted((r["id"], r["hash"], r["text"], tuple(r["vector"]), r["level"])
                                for r in lance.open_table(name).to_arrow().to_pylist())
                   for name in TABLES}
    return {
        "extractions": extractions,
        "search_rows": search_rows,
        "entities": sorted((e.id, e.name, e.type, e.description, e.degree, e.text_unit_ids)
                           for e in g.entities.values()),
        "relationships": sorted((r.id, r.source, r.target, r.description, r.weight,
                                 r.text_unit_ids) for r in g.relationships.values()),
        "claims": sorted((c.id, c.subject, c.description, c.text_unit_ids)
                         for c in g.claims.values()),
        "communities": sorted((c.id, c.level, c.parent, tuple(c.children), tuple(c.entity_ids),
                               c.fingerprint) for c in g.communities.values()),
        "reports": sorted((r.community_id, r.title, r.summary, r.rating, r.full_text(),
                           r.fingerprint) for r in g.reports.values()),
        "vectors": vectors,
    }


def _copy_examples(root: Path) -> Path:
    docs = root / "docs"
    shutil.copytree(EXAMPLES, docs)
    return docs


def _llm(fake: FakeOpenAI) -> dict[str, Any]:
    """The fake as chat and embedding endpoint, retries quick (a 429 here names its wait)."""
    return {"llm": {"base_url": fake.base_url, "model": "fake", "backoff_s": 0.01},
            "embed": {"base_url": fake.base_url, "model": "fake-embed"}}


# ---- the builtin provider: extraction and embedding batches as Ray tasks ------------------------


@pytest.fixture(scope="module")
def builtin_builds(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
                   ) -> dict[str, Any]:
    """The examples indexed locally, and through the CLI with `--ray` (the builtin provider)."""
    root = tmp_path_factory.mktemp("builtin")
    with offline_env():
        local_ws = open_workspace(_copy_examples(root / "local"), root / "local" / "index")
        local = build_index(local_ws)
        docs = _copy_examples(root / "ray")
        cli = CliRunner().invoke(main, ["index", str(docs), "--index-dir",
                                        str(root / "ray" / "index"), "--ray", "local", "--json"])
    assert cli.exit_code == 0, cli.output
    return {"local": local, "local_dir": root / "local" / "index",
            "ray": json.loads(cli.stdout), "ray_dir": root / "ray" / "index"}


def test_a_builtin_build_on_ray_stores_what_the_local_build_stores(
        builtin_builds: dict[str, Any]) -> None:
    local, ray = snapshot(builtin_builds["local_dir"]), snapshot(builtin_builds["ray_dir"])
    # the hashing embedder's vectors are in the search rows (it caches none in SQLite)
    assert local["entities"] and local["reports"] and all(local["search_rows"].values())
    for part in local:
        assert ray[part] == local[part], part


def test_a_builtin_build_on_ray_sends_its_cpu_work_to_the_cluster_and_counts_it_as_local(
        builtin_builds: dict[str, Any]) -> None:
    stats = builtin_builds["ray"]["stats"]
    units = stats["text_units"]
    # 16 units a task, 2 workers: every unit went out in a batch, every vector in a chunk.
    assert stats["ray"]["extract_tasks"] == -(-units // 16)
    assert stats["ray"]["embed_tasks"] >= 3  # units, entities, reports: a task each at least
    assert stats["ray"]["workers"] == 2 and stats["ray"]["endpoint_calls"] == 0
    assert builtin_builds["ray"]["llm_usage"] == {
        task: u.as_dict() if hasattr(u, "as_dict") else u
        for task, u in builtin_builds["local"].usage.items()}
    assert builtin_builds["ray"]["llm_usage"]["extract"]["calls"] == units


# ---- an LLM endpoint: its requests through Ray actors, paced by the writer's one window --------


@pytest.fixture(scope="module")
def llm_builds(ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        dict[str, Any]]:
    """The examples indexed against the fake LLM (chat and embeddings) locally, then on Ray
    with six 429s (Retry-After 0.3 s) injected into its first requests; then an edit and a
    deletion applied to both, the Ray copy's through Ray."""
    root = tmp_path_factory.mktemp("llm")
    out: dict[str, Any] = {}
    with offline_env(), FakeOpenAI() as fake:
        local_ws = open_workspace(_copy_examples(root / "local"), root / "local" / "index",
                                  **_llm(fake))
        out["local"] = build_index(local_ws)
        out["local_requests"] = fake.tasks()
        out["local_snapshot"] = snapshot(local_ws.index_dir)
        fake.reset()
        ray_ws = open_workspace(_copy_examples(root / "ray"), root / "ray" / "index",
                                **_llm(fake))
        # One executor for both Ray builds, as a long-lived writer would keep it: the endpoint
        # actors start once. It joins the module's cluster ("local" reuses a connection).
        cluster = connect_ray("local", ray_ws.settings.distributed)
        fake.fail_next(6, status=429, retry_after=0.3, kind="chat")
        out["ray"] = build_index(ray_ws, ray=cluster)
        out["ray_requests"] = fake.tasks()
        out["ray_answered"] = [r.task for r in fake.requests if r.status == 200]
        out["ray_refused"] = [r.task for r in fake.requests if r.status == 429]
        out["ray_snapshot"] = snapshot(ray_ws.index_dir)
        for ws in (local_ws, ray_ws):
            edited = ws.docs_dir / "projects" / "kestrel.md"
            edited.write_text(edited.read_text(encoding="utf-8")
                              + "\n\nIn May, the Kestrel team met Helio Cells in Lisbon to "
                              "review the battery contract.\n", encoding="utf-8")
            (ws.docs_dir / "suppliers" / "bluewater_logistics.txt").unlink()
        fake.reset()
        out["local_update"] = build_index(local_ws)
        out["local_update_requests"] = fake.tasks()
        fake.reset()
        try:
            out["ray_update"] = build_index(ray_ws, ray=cluster)
        finally:
            cluster.close()
        out["ray_update_requests"] = fake.tasks()
        out["local_dir"], out["ray_dir"] = local_ws.index_dir, ray_ws.index_dir
    yield out


def test_an_llm_build_on_ray_stores_what_the_local_build_stores(
        llm_builds: dict[str, Any]) -> None:
    local, ray = llm_builds["local_snapshot"], llm_builds["ray_snapshot"]
    # the hashing embedder's vectors are in the search rows (it caches none in SQLite)
    assert local["entities"] and local["reports"] and all(local["search_rows"].values())
    for part in local:
        assert ray[part] == local[part], part


def test_an_llm_build_on_ray_sends_every_request_through_the_cluster_with_the_same_accounting(
        llm_builds: dict[str, Any]) -> None:
    local, ray = llm_builds["local"], llm_builds["ray"]
    assert ray.usage == local.usage  # calls, cache hits and tokens per task
    assert set(local.usage) >= {"extract", "glean", "summarize", "report"}
    # The same requests were answered (the six refusals came on top, and were retried), every
    # one of them sent by a Ray worker.
    assert sorted(llm_builds["ray_answered"]) == sorted(llm_builds["local_requests"])
    assert len(llm_builds["ray_requests"]) == len(llm_builds["local_requests"]) + 6
    assert ray.stats["ray"]["endpoint_calls"] == len(llm_builds["ray_requests"])
    assert ray.stats["ray"]["lost_calls"] == 0


def test_injected_429s_are_retried_and_paused_through_the_one_window(
        llm_builds: dict[str, Any]) -> None:
    ray = llm_builds["ray"]
    assert len(llm_builds["ray_refused"]) == 6
    window = ray.stats["llm_concurrency"]
    assert window["throttled"] == 6  # every worker's 429 reached the writer's window
    assert window["backoffs"] >= 1  # ... which was cut
    assert window["paused_s"] >= 0.3  # ... and held every request for the Retry-After
    assert ray.failures == [] and ray.stats["units_failed"] == 0


def test_an_edit_and_a_deletion_applied_through_ray_equal_the_local_update(
        llm_builds: dict[str, Any]) -> None:
    local, ray = snapshot(llm_builds["local_dir"]), snapshot(llm_builds["ray_dir"])
    for part in local:
        assert ray[part] == local[part], part
    assert llm_builds["ray_update"].usage == llm_builds["local_update"].usage
    assert sorted(llm_builds["ray_update_requests"]) == sorted(llm_builds["local_update_requests"])
    # Only what changed was asked for (the rest came from the response cache).
    assert 0 < len(llm_builds["ray_update_requests"]) < len(llm_builds["ray_requests"]) / 2


def test_a_request_whose_worker_dies_is_retried_by_the_clients_policy(ray_cluster: Any) -> None:
    """A Ray worker lost in the middle of a request is a connection failure like any other: the
    writer's retry policy sends it again (to the restarted actor), and only the answered
    request is counted."""
    import asyncio

    from canopy.llm import ChatClient
    from canopy.settings import LLMSettings

    with FakeOpenAI() as fake:
        cluster = connect_ray("local", DistributedSettings(workers=1))
        try:
            client = ChatClient(LLMSettings(base_url=fake.base_url, model="fake", backoff_s=0.01),
                                backoff_base=0.01, endpoints=cluster.endpoints)
            question = [{"role": "user", "content": "Task: answer\nWho leads Project Kestrel?"}]

            async def run() -> tuple[str, str]:
                first = await client.text("answer", question)  # the actor is up
                fake.hang_next(1, seconds=3.0)
                pending = asyncio.ensure_future(client.text("answer", question + [
                    {"role": "user", "content": "Again."}]))
                assert await asyncio.to_thread(wait_until, lambda: len(fake.requests) == 2, 10)
                (pool,) = cluster._pools.values()  # the one actor, holding that request
                ray_cluster.kill(pool.actors[0], no_restart=False)
                return first, await pending

            first, again = asyncio.run(run())
            stats = cluster.stats()
        finally:
            cluster.close()
    assert first and again
    # Lost: the hung request, and any retry sent while the actor was restarting.
    assert stats.lost_calls >= 1 and stats.endpoint_calls == 2
    assert client.usage()["answer"].calls == 2 and client.usage()["answer"].failures == 0
    assert len(fake.requests) == 3  # the first, the hung one, then its retry that got through


# ---- errors, and what the servers import ------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.heavy
def test_an_unreachable_cluster_is_one_line_at_once(example_docs: Path) -> None:
    port = _closed_port()
    for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{port}"):
        result = CliRunner().invoke(main, ["index", str(example_docs), "--ray", address])
        assert result.exit_code == 1
        assert result.output.splitlines() == [
            f"Error: cannot reach the Ray cluster at {address} (Connection refused): is `ray "
            "start --head` running there, and is the port right?"]
    assert not (example_docs / ".canopy").exists()  # nothing was built


@pytest.mark.heavy  # Ray's own search for clusters, so Ray installed
def test_auto_with_the_cluster_file_of_a_stopped_cluster_is_one_line_at_once(
        example_docs: Path, tmp_path: Path) -> None:
    """A `ray start` that was killed rather than stopped leaves its cluster file behind: `--ray
    auto` checks the address it names as it checks a given one, instead of spending minutes in
    Ray's retries. A fresh process (this one may be connected to Ray), with Ray's temporary
    folder of its own and its search for other clusters' processes on this machine turned off
    (other test runs may have some)."""
    import time

    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_closed_port()}")
    code = ("import functools, sys, ray._private.services as s\n"
            "s.find_gcs_addresses = functools.lru_cache(lambda: [])\n"  # Ray clears its cache
            "from canopy.server.cli import main\n"
            "main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "TMPDIR")}
    env.update(RAY_TMPDIR=str(tmp_path), PYTHONPATH=str(REPO))

    def index_on_auto() -> tuple[list[str], float]:
        began = time.monotonic()
        done = subprocess.run([sys.executable, "-c", code, "index", str(example_docs), "--ray",
                               "auto"], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 1, done.stderr
        return done.stderr.splitlines(), time.monotonic() - began

    lines, took = index_on_auto()
    assert len(lines) == 1 and lines[0].startswith("Error: --ray auto found the Ray cluster at ")
    assert "but it does not answer (Connection refused): that cluster has stopped" in lines[0]
    assert took < 30  # Ray's own retries took over 90 s
    (tmp_path / "ray" / "ray_current_cluster").unlink()
    lines, _ = index_on_auto()
    assert lines == ["Error: --ray auto: no Ray cluster runs on this machine (start one with "
                     "`ray start --head`, name one with --ray HOST:PORT, or use --ray local for "
                     "a cluster of this build's own)"]
    assert not (example_docs / ".canopy").exists()  # nothing was built


def test_workers_running_other_canopy_code_are_refused(ray_cluster: Any) -> None:
    cluster = connect_ray("local", DistributedSettings())
    try:
        with pytest.raises(ConfigError, match="run other Canopy code than this writer"):
            cluster.check_workers(expected="0" * 16)
    finally:
        cluster.close()


# ---- `ray start --head` on this machine, and `canopy index --ray ADDRESS` from another process ---


@pytest.mark.slow
@pytest.mark.heavy
def test_the_cli_indexes_on_a_cluster_started_with_ray_start(tmp_path: Path) -> None:
    """A cluster as an operator starts one (`ray start --head`, here on 127.0.0.1 with its own
    ports and temporary folder), and `canopy index DOCS --ray HOST:PORT` in another process: the
    index equals a local build's, and the cluster is still up afterwards (the writer only
    disconnects)."""
    port = _closed_port()
    client_port = next(p for p in iter(_closed_port, None) if p != port)
    # Token authentication as Ray sets it up by default, with a token of the test's own: a
    # driver given an address must name the mode and the token.
    env = {**os.environ, LOOPBACK_ONLY: "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    # Ray's sockets live under its temporary folder, whose path must stay short (AF_UNIX).
    ray_tmp = tempfile.mkdtemp(prefix="canopy-ray-")
    head = subprocess.Popen(
        ["ray", "start", "--head", f"--port={port}", f"--ray-client-server-port={client_port}",
         "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats", "--block",
         f"--temp-dir={ray_tmp}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        assert wait_until(lambda: _accepts(port), timeout=120), "ray start did not come up"
        local = _copy_examples(tmp_path / "local")
        on_ray = _copy_examples(tmp_path / "ray")
        canopy = [sys.executable, "-m", "canopy.server.cli", "index"]
        done = subprocess.run([*canopy, str(local)], cwd=REPO, capture_output=True, text=True,
                              timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        for address in (f"127.0.0.1:{port}", f"ray://127.0.0.1:{client_port}"):
            shutil.rmtree(on_ray / ".canopy", ignore_errors=True)
            done = subprocess.run([*canopy, str(on_ray), "--ray", address], cwd=REPO,
                                  capture_output=True, text=True, timeout=300, env=env)
            assert done.returncode == 0, done.stderr
            line = next(ln for ln in done.stdout.splitlines() if ln.strip().startswith("ray:"))
            assert f"2 workers at {address} (2 CPUs" in line and "extraction tasks" in line
            local_rows, ray_rows = snapshot(local / ".canopy"), snapshot(on_ray / ".canopy")
            for part in local_rows:
                assert ray_rows[part] == local_rows[part], (address, part)
        assert head.poll() is None  # the cluster outlives the writer's connection
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start` and every process it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait(timeout=30)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False
