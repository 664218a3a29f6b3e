"""LanceDB, imported without the REST namespace client it never needs for a local folder.

`import lancedb` (0.40) imports `lance_namespace`, which imports the generated OpenAPI client
`lance_namespace_urllib3_client`; that package's `__init__` builds every API class of the REST
namespace server, each method wrapped in pydantic's `validate_call`. Measured here, that is about
two thirds of the CPU of `import lancedb` (2.0 s of CPU against 0.7 s without it, 2 cores under
load), paid by every `canopy index`, `serve` and `query` although Canopy only opens local
tables. Only the package's `models` subpackage is used on the local path.

So the package is registered as a bare package (its `__path__`, so submodules such as `.models`
import normally) whose own `__init__` runs the first time anything reads an attribute of it
that is not a submodule: code that uses the REST client still gets all of it, on demand.
If anything about the package is not as expected, lancedb is imported the ordinary way.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import types
from typing import Any

from canopy.collector import freeze_imports

__all__ = ["import_lancedb"]

_CLIENT = "lance_namespace_urllib3_client"
_lock = threading.RLock()


class _DeferredPackage(types.ModuleType):
    """A package whose `__init__` runs on first attribute access (submodules import as usual)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # the import system probes dunders; answer them normally
            raise AttributeError(name)
        spec = self.__spec__
        with _lock:
            if not self.__dict__.get("_canopy_loaded"):
                self.__dict__["_canopy_loaded"] = True
                if spec is not None and spec.loader is not None:
                    spec.loader.exec_module(self)
        try:
            return self.__dict__[name]
        except KeyError:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from None


def _defer_rest_client() -> None:
    if _CLIENT in sys.modules:
        return
    try:
        spec = importlib.util.find_spec(_CLIENT)
    except (ImportError, ValueError):
        return
    if spec is None or not spec.submodule_search_locations or spec.loader is None:
        return
    module = _DeferredPackage(_CLIENT)
    module.__spec__ = spec
    module.__path__ = list(spec.submodule_search_locations)
    module.__file__ = spec.origin
    module.__loader__ = spec.loader
    module.__package__ = _CLIENT
    sys.modules[_CLIENT] = module


def import_lancedb() -> types.ModuleType:
    """The `lancedb` module (imported once per process, without the REST client's start-up)."""
    if "lancedb" not in sys.modules:
        with _lock:
            _defer_rest_client()
    import lancedb

    freeze_imports()  # its objects out of the GC's way (canopy.collector); once per process
    return lancedb
