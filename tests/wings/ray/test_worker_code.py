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
