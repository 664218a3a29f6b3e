"""Canopy: one installed namespace.

`canopy` itself is the kernel (data model, settings, store, tokenizer, providers); its
subpackages `canopy.indexer`, `canopy.acl`, `canopy.server` and `canopy.prompts` are built on it.
Import direction is one way: server -> (indexer, acl) -> kernel -> prompts.

In a source checkout those four subpackages keep the top-level folders of the project's layout
(`server/`, `indexer/`, `acl/`, `prompts/`, beside `canopy/`); a wheel places them inside
`canopy/` (pyproject's package-dir). So that a checkout imports them from its own folders (a
test run, a worktree, `python -m canopy.server.cli` from the repository) rather than from
whatever an editable install points at, the checkout's root joins this package's search path.
Only the names of those four folders are importable that way.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path

_SUBPACKAGES = ("server", "indexer", "acl", "prompts")
_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """Finds `canopy.<subpackage>` in the checkout's top-level folder of that name."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        prefix, _, name = fullname.partition(".")
        if prefix != __name__ or name not in _SUBPACKAGES:
            return None
        return importlib.machinery.PathFinder.find_spec(fullname, [str(_ROOT)])


def _is_checkout() -> bool:
    """Running from a source tree (subpackages beside this folder), not from a wheel's layout."""
    return (not (_HERE / "server").is_dir() and (_ROOT / "pyproject.toml").is_file()
            and all((_ROOT / name / "__init__.py").is_file() for name in _SUBPACKAGES))


if _is_checkout() and not any(isinstance(f, _CheckoutFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutFinder())
