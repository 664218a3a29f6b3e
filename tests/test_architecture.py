"""The import direction is one way: server -> (indexer, acl) -> canopy (kernel) -> prompts."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

ALLOWED = {
    "prompts": set(),
    "canopy": {"prompts"},
    "indexer": {"canopy", "prompts"},
    "acl": {"canopy", "prompts", "indexer"},
    "server": {"canopy", "prompts", "indexer", "acl"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downwards(package: str) -> None:
    for path in (REPO / package).rglob("*.py"):
        bad = (_imports(path) & set(ALLOWED)) - ALLOWED[package] - {package}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_library_code_never_prints() -> None:
    """stdout is the MCP protocol under `canopy serve`; only CLI modules may write to it."""
    for package in ALLOWED:
        for path in (REPO / package).rglob("*.py"):
            if path.name.startswith("cli"):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                    pytest.fail(f"print() in {path.relative_to(REPO)}:{node.lineno}")


def test_importing_the_server_writes_nothing_to_stdout() -> None:
    code = "import server.mcp_app, server.engines, indexer.pipeline, acl.visibility, canopy.providers.builtin"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""
