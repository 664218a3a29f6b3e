"""The code a writer ships to its Ray workers (`[distributed] ship_code`) is what they import:
the kernel, the prompt templates and the Ray wing with the two packages above it, laid out as
installed, with the writer's own source fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from canopy.server.wings.ray.cluster import _shipped_code, _worker_code, code_fingerprint


@pytest.mark.heavy  # the Ray wing's tests run where its extra is (the heavy command)
def test_the_shipped_code_imports_the_wing_and_has_the_writers_fingerprint(
        tmp_path: Path) -> None:
    names = {name for name, _ in _worker_code()}
    assert {"server/__init__.py", "server/wings/__init__.py", "server/wings/ray/cluster.py",
            "server/wings/ray/builtin_work.py", "server/wings/ray/remote_endpoint.py",
            "prompts/extract.txt", "providers/__init__.py"} <= names
    assert not any(n.startswith(("server/cli", "server/wings/rest", "indexer/", "acl/"))
                   for n in names)
    env = _shipped_code(tmp_path)
    assert env["py_modules"] == [str(tmp_path / "canopy")]
    code = ("import canopy.server.wings.ray.cluster as c\n"
            "print(c.__file__)\nprint(c.code_fingerprint())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120,
                         env={"PYTHONPATH": str(tmp_path), "PATH": os.environ.get("PATH", "")})
    assert out.returncode == 0, out.stderr
    where, fingerprint = out.stdout.split()
    assert Path(where).is_relative_to(tmp_path)
    assert fingerprint == code_fingerprint()


class _FlakyRay:
    """A stand-in for the ray module: its init fails `failures` times with `error`."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error = failures, error
        self.inits = self.shutdowns = 0

    def init(self, **options: object) -> None:
        self.inits += 1
        if self.inits <= self.failures:
            raise self.error

    def shutdown(self) -> None:
        self.shutdowns += 1


@pytest.mark.heavy  # the Ray wing's tests run where its extra is (the heavy command)
def test_joining_is_tried_again_only_when_ray_clients_server_failed_to_start_a_session(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from canopy.server.wings.ray import cluster

    monkeypatch.setattr(cluster, "JOIN_WAIT_S", 0.0)
    start = ConnectionAbortedError("Initialization failure from server:\nTraceback ...")
    ray = _FlakyRay(2, start)
    cluster.joined(ray, {"address": "ray://127.0.0.1:1"})
    assert (ray.inits, ray.shutdowns) == (3, 2)
    ray = _FlakyRay(3, start)
    with pytest.raises(ConnectionAbortedError):
        cluster.joined(ray, {"address": "ray://127.0.0.1:1"})
    assert ray.inits == cluster.JOIN_ATTEMPTS
    refused = ConnectionError("Could not find any running Ray instance")
    ray = _FlakyRay(1, refused)
    with pytest.raises(ConnectionError, match="Could not find"):
        cluster.joined(ray, {"address": "127.0.0.1:1"})
    assert (ray.inits, ray.shutdowns) == (1, 0)
