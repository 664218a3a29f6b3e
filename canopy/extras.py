"""Install hints for optional packages that name a command that works.

An extra such as `canopy-graphrag[ray]` installs only where that name resolves, and no registry
has it: from a checkout or a wheel the command fails. What always works is installing the
package itself, at the version Canopy asks for: `pip install 'ray[client]>=2.60'`. The
requirement comes from the checkout's pyproject.toml when running from one, else from the
installed distribution's metadata, so a hint never drifts from what the project declares.
"""

from __future__ import annotations

import re
import tomllib
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

__all__ = ["extra_hint", "install_hint"]

DISTRIBUTION = "canopy-graphrag"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")


def install_hint(*packages: str) -> str:
    """`pip install '<requirement>' ...` for `packages` (distribution names as Canopy declares
    them, in its dependencies or an extra), each with the version Canopy asks for."""
    declared = _declared()
    wanted = [declared.get(_normal(p), p) for p in packages]
    return "pip install " + " ".join(f"'{r}'" for r in wanted)


def extra_hint(extra: str) -> str:
    """`pip install '<requirement>' ...` for every package Canopy's extra `extra` declares: what
    installing the extra by Canopy's name would bring, where that name resolves."""
    wanted = _extras().get(extra, [])
    return "pip install " + " ".join(f"'{r}'" for r in wanted)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@lru_cache(maxsize=1)
def _declared() -> dict[str, str]:
    """Every requirement Canopy declares (dependencies first, then extras), by package name."""
    out: dict[str, str] = {}
    for requirement in _requirements():
        spec = requirement.split(";", 1)[0].strip()
        name = _NAME.match(spec)
        if name is not None:
            out.setdefault(_normal(name.group()), spec)
    return out


def _requirements() -> list[str]:
    import canopy

    pyproject = Path(canopy.__file__).resolve().parents[1] / "pyproject.toml"
    if canopy._is_checkout():
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        extras = project.get("optional-dependencies", {})
        return [*project.get("dependencies", []), *(r for reqs in extras.values() for r in reqs)]
    try:
        return requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return []


@lru_cache(maxsize=1)
def _extras() -> dict[str, list[str]]:
    """Each extra's own requirements (without the marker an installed distribution's metadata
    adds, `; extra == "ray"`), leaving out those that name Canopy itself."""
    import canopy

    out: dict[str, list[str]] = {}
    if canopy._is_checkout():
        pyproject = Path(canopy.__file__).resolve().parents[1] / "pyproject.toml"
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
        for extra, reqs in project.get("optional-dependencies", {}).items():
            out[extra] = [r for r in reqs if not r.startswith(DISTRIBUTION)]
        return out
    try:
        declared = requires(DISTRIBUTION) or []
    except PackageNotFoundError:
        return out
    for requirement in declared:
        spec, _, marker = requirement.partition(";")
        extra = _EXTRA.search(marker)
        if extra is not None and not spec.strip().startswith(DISTRIBUTION):
            out.setdefault(extra.group(1), []).append(spec.strip())
    return out
