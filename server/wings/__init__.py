"""The wings: optional features over the core, and the one table through which the core reaches
them.

Each wing is a subpackage here with an extra of its own in pyproject.toml (named like it) and
tests of its own under tests/wings/; it imports the core and never the other way round:

- `rest`: the REST API at /api/v1 of an HTTP server (the MCP tools as JSON endpoints);
- `web`: the web view at /ui/;
- `publish`: published generations (`canopy publish`, `--publish`) and the replicas that serve
  them (`canopy serve --index-uri`);
- `ray`: a build's endpoint requests and builtin CPU work on a Ray cluster (`canopy index --ray`);
- `graphrag`: Microsoft GraphRAG interop (`canopy export`, `canopy import-graphrag`);
- `eval`: the evaluation tools (`canopy eval`).

This module is the core's side of them: no core module imports a wing's module, lazily or not
(tests/test_architecture.py), but names it here and asks `wing_module` for it where the feature
is wanted (a CLI command or option, the HTTP server's mounts). A table of module names rather
than entry points because the wings ship in the one distribution, so there is nothing to
discover, and entry points of an editable install change only when it is reinstalled.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from types import ModuleType

from canopy.errors import ConfigError
from canopy.extras import extra_hint

__all__ = ["COMMANDS", "WINGS", "Wing", "missing_libraries", "wing_module"]


@dataclass(frozen=True)
class Wing:
    """One wing: its subpackage here and its extra in pyproject.toml are both `name`."""

    name: str
    feature: str  # what it adds, as a message names it
    libraries: tuple[str, ...] = ()  # import names of what its extra installs (none: core only)
    # `canopy` commands it adds: name -> "module:attribute" of the click command in the wing
    commands: tuple[tuple[str, str], ...] = ()


WINGS: dict[str, Wing] = {wing.name: wing for wing in (
    Wing("rest", "the REST API"),
    Wing("web", "the web view"),
    Wing("publish", "publishing and replicas", ("obstore",), (("publish", "publish_cli:publish"),)),
    Wing("ray", "distributed indexing on Ray", ("ray",)),
    Wing("graphrag", "GraphRAG export and import", (),
         (("export", "export_cli:export"), ("import-graphrag", "import_cli:import_graphrag"))),
    Wing("eval", "canopy eval", ("bm25s",), (("eval", "eval_cli:eval_command"),)),
)}
# command name -> (wing, "module:attribute"): what the CLI group lists beside its own commands
COMMANDS: dict[str, tuple[str, str]] = {
    command: (wing.name, target) for wing in WINGS.values() for command, target in wing.commands}


def missing_libraries(name: str) -> list[str]:
    """The libraries of wing `name`'s extra that this environment lacks."""
    return [lib for lib in WINGS[name].libraries if importlib.util.find_spec(lib) is None]


def wing_module(name: str, module: str = "", *, wanted_by: str | None = None) -> ModuleType:
    """`canopy.server.wings.<name>.<module>` (the wing's package without `module`), imported
    now; ConfigError naming what to install
    when the wing's extra is missing. `wanted_by`: the option or command that asks for it, as
    the message names it (default: the wing's feature)."""
    missing = missing_libraries(name)
    if missing:
        raise ConfigError(f"{wanted_by or WINGS[name].feature} needs the [{name}] extra, "
                          f"which is not installed here ({', '.join(missing)} is missing): "
                          f"{extra_hint(name)}")
    return importlib.import_module(".".join(filter(None, (__name__, name, module))))
