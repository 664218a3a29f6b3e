"""One install namespace: pyproject installs the kernel `canopy` with the project's top-level
folders server/, indexer/, acl/ and prompts/ as `canopy.server`, ... (package-dir), and a source
checkout imports them from its own folders (canopy/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import REPO

SUBPACKAGES = ("server", "indexer", "acl", "prompts")


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"]


def _packages_on_disk() -> set[str]:
    names = set()
    for root in ("canopy", *SUBPACKAGES):
        for init in (REPO / root).rglob("__init__.py"):
            parts = init.parent.relative_to(REPO).parts
            names.add(".".join(parts) if root == "canopy" else ".".join(("canopy", *parts)))
    return names


def test_every_package_is_listed_and_mapped() -> None:
    """A package missing from the explicit list would be absent from the wheel (and the
    wheel-check in CI would only see it if the demo happened to import it)."""
    tool = _setuptools()
    assert set(tool["packages"]) == _packages_on_disk()
    assert tool["package-dir"] == {f"canopy.{name}": name for name in SUBPACKAGES}


def test_a_checkout_imports_its_own_folders(tmp_path: Path) -> None:
    """Run from anywhere with the checkout on the path, `canopy.server` is the checkout's
    server/ (not an editable install's target elsewhere), and the folders are not importable
    under any other name through canopy."""
    code = ("import importlib.util, sys, canopy, canopy.server, canopy.indexer.pipeline, "
            "canopy.acl, canopy.prompts\n"
            "print(canopy.server.__file__)\n"
            "print(canopy.indexer.pipeline.__file__)\n"
            "print(importlib.util.find_spec('canopy.tests'))\n"
            "print(importlib.util.find_spec('canopy.benchmarks'))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert out.returncode == 0, out.stderr
    server, pipeline, tests, benchmarks = out.stdout.splitlines()
    assert Path(server) == REPO / "server" / "__init__.py"
    assert Path(pipeline) == REPO / "indexer" / "pipeline.py"
    assert tests == benchmarks == "None"


def test_the_checkout_finder_is_inert_in_an_installed_layout(tmp_path: Path) -> None:
    """In a wheel's layout (subpackages inside canopy/) the finder is not installed: the
    packages import from where they lie."""
    site = tmp_path / "site"
    (site / "canopy" / "server").mkdir(parents=True)
    (site / "canopy" / "__init__.py").write_text((REPO / "canopy" / "__init__.py").read_text())
    (site / "canopy" / "server" / "__init__.py").write_text("WHERE = 'installed'\n")
    code = ("import sys, canopy, canopy.server\n"
            "print(canopy.server.WHERE, any(type(f).__name__ == '_CheckoutFinder' "
            "for f in sys.meta_path))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PYTHONPATH": str(site), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["installed", "False"]


def test_pdf_and_docx_load_with_the_default_install() -> None:
    """PDF and DOCX are in Canopy's own dependencies (pypdf is pure Python, python-docx small),
    not in an extra the Quick start does not install."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = {d.split(">")[0].split("[")[0].strip() for d in project["dependencies"]}
    assert {"pypdf", "python-docx"} <= names


def test_install_hints_name_the_package_itself_at_the_declared_version() -> None:
    """`pip install 'canopy-graphrag[x]'` resolves nowhere (no registry has the name); a hint
    names the package and the version pyproject asks for, which works from a checkout and from
    a wheel alike."""
    from canopy.extras import extra_hint, install_hint
    from canopy.providers.builtin.static import MISSING
    from canopy.server.wings.ray.cluster import INSTALL_HINT

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert INSTALL_HINT == f"pip install '{extras['ray'][0]}'"
    assert MISSING.endswith(f"pip install '{extras['static'][0]}'")
    assert install_hint("pypdf", "python-docx") == "pip install 'pypdf>=4' 'python-docx>=1.1'"
    assert extra_hint("publish") == f"pip install '{extras['publish'][0]}'"
    assert extra_hint("heavy").startswith("pip install 'schemathesis")  # not Canopy itself
    sources = [p.read_text(encoding="utf-8") for folder in ("canopy", "server", "indexer", "acl")
               for p in (REPO / folder).rglob("*.py")]
    assert not any("pip install 'canopy-graphrag[" in s or "pip install canopy-graphrag[" in s
                   for s in sources)
