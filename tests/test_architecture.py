"""The import direction is one way: server -> (indexer, acl) -> canopy (kernel) -> prompts; within
the CLI package, the command modules never import the package that assembles them. Every layer
installs under the one namespace `canopy` (`canopy.server`, `canopy.indexer`, ...), and two modules
share a name only as one thing at two depths."""

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
LAYERS = tuple(layer for layer in ALLOWED if layer != "canopy")
CLI = REPO / "server" / "cli"


def _layer(module: str) -> str | None:
    """The layer an absolute module name belongs to: `canopy.server.x` -> server, `canopy.x` ->
    canopy (the kernel); None for modules outside the project. A top-level `server` or `indexer`
    would be another distribution's package (the namespace is there to avoid them)."""
    parts = module.split(".")
    if parts[0] != "canopy":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "canopy"


def _imports(path: Path) -> set[str]:
    """Layers imported by `path` (absolute imports; relative ones stay within a layer)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str | None] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {_layer(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "canopy":  # `from canopy import server` names a layer
                out |= {_layer(f"canopy.{a.name}") for a in node.names}
            else:
                out.add(_layer(node.module))
    return {layer for layer in out if layer is not None}


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_downwards(package: str) -> None:
    for path in (REPO / package).rglob("*.py"):
        bad = _imports(path) - ALLOWED[package] - {package}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


def test_everything_imports_through_the_one_namespace() -> None:
    """No module of the project, its tests or benchmarks imports `server`, `indexer`, `acl` or
    `prompts` as top-level packages: installed, those names belong to other distributions."""
    roots = [*ALLOWED, "tests", "benchmarks", "examples"]
    for root in roots:
        for path in (REPO / root).rglob("*.py"):
            bad = _top_level_imports(path) & set(LAYERS)
            assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)} at top level"


def test_layer_of_a_module_name() -> None:
    assert _layer("canopy.server.cli.common") == "server"
    assert _layer("canopy.store") == "canopy"
    assert _layer("canopy") == "canopy"
    assert _layer("server.cli") is None
    assert _layer("numpy") is None


def test_engines_reach_the_index_only_through_the_callers_reader() -> None:
    """The ACL prefilter is bound once, in canopy.acl.reader: code outside acl/ never touches the
    reader's snapshot or search tables, nor imports the store's or LanceDB's read side."""
    private = {"_snap", "_vectors"}
    for path in (REPO / "server").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in private | {"snap"}:
                pytest.fail(f"{path.relative_to(REPO)}:{node.lineno} reads a reader's .{node.attr}")
        if path.is_relative_to(REPO / "server" / "engines"):
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module in ("canopy.store",
                                                                          "canopy.store.reads"):
                    names = {a.name for a in node.names}
                    assert not names & {"GraphReads", "Snapshot", "Store"}, path


def test_library_code_never_prints() -> None:
    """stdout is the MCP protocol under `canopy serve`; only CLI modules may write to it."""
    for package in ALLOWED:
        for path in (REPO / package).rglob("*.py"):
            if path.is_relative_to(CLI):
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "print"):
                    pytest.fail(f"print() in {path.relative_to(REPO)}:{node.lineno}")


def test_importing_the_server_writes_nothing_to_stdout() -> None:
    code = ("import canopy.server.mcp_app, canopy.server.engines, canopy.server.http, "
            "canopy.indexer.pipeline, canopy.acl.reader, canopy.providers.builtin")
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""


def _imports_of_the_cli_package(path: Path) -> list[int]:
    """Lines of `path` that import the package `canopy.server.cli` itself (its `__init__`), in any
    spelling; imports of a submodule by its full name (`from canopy.server.cli.common import X`) are
    fine."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            if any(a.name == "canopy.server.cli" for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom):
            absolute = node.level == 0 and (
                node.module == "canopy.server.cli"
                or (node.module == "canopy.server" and any(a.name == "cli" for a in node.names)))
            relative = node.level == 1 and node.module is None  # `from . import x`
            if absolute or relative:
                lines.append(node.lineno)
    return lines


def test_cli_command_modules_never_import_the_package() -> None:
    """`server/cli/__init__.py` imports the command modules to assemble the group; if one of them
    imported the package back, the import cycle of the old `server/cli_*.py` files would return."""
    # The package assembles the group; `__main__` runs it, and nothing imports `__main__`.
    modules = [p for p in sorted(CLI.glob("*.py")) if p.stem not in ("__init__", "__main__")]
    assert {p.stem for p in modules} >= {"common", "index", "query", "serve", "tokens", "warm",
                                         "watch", "demo"}
    for path in modules:
        lines = _imports_of_the_cli_package(path)
        assert not lines, (f"{path.relative_to(REPO)}:{lines} imports the package "
                           "canopy.server.cli: import from canopy.server.cli.common (or the "
                           "command module) instead")


def test_every_cli_module_imports_first_in_a_fresh_interpreter() -> None:
    """Whichever module of the package is imported first (a test, `python -m canopy.server.cli`, an
    entry point), the package and every command import completely: a cycle would fail here."""
    names = sorted(f"canopy.server.cli.{p.stem}" for p in CLI.glob("*.py") if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for name in {['canopy.server.cli', *names]!r}:\n"
            "    for loaded in [m for m in sys.modules if m.startswith('canopy.server.cli')]:\n"
            "        del sys.modules[loaded]\n"
            "    importlib.import_module(name)\n"
            "    assert sys.modules['canopy.server.cli'].main.commands, name\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == ""


def test_importing_the_cli_loads_no_engine_store_or_mcp_code() -> None:
    """The commands import what they need when they run, so `canopy --help` is quick and
    `canopy serve` starts its stdio server sooner."""
    heavy = ["canopy.acl", "canopy.indexer", "lancedb", "mcp", "openai", "canopy.settings",
             "canopy.store", "canopy.server.engines", "canopy.server.mcp_app",
             "canopy.server.runtime", "canopy.server.service", "tqdm"]
    code = ("import sys, canopy.server.cli\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_no_module_imports_a_posix_only_module_at_load_time() -> None:
    """Windows has no fcntl, resource, termios, pwd or grp: Canopy's modules may use them only
    inside functions, behind an ImportError fallback (the writer lock uses filelock; peak memory
    reads 0). Checked on the source, so it holds on any CI platform. The file listing's dir_fd /
    O_NOFOLLOW reads are POSIX-only at run time, which this does not cover."""
    posix_only = {"fcntl", "resource", "termios", "pwd", "grp"}
    found = []
    for package in ("canopy", "indexer", "server", "acl", "prompts"):
        for path in (REPO / package).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            todo: list[ast.AST] = list(tree.body)
            while todo:  # module level, including under if / try / with, not in functions
                node = todo.pop()
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                if isinstance(node, ast.Import):
                    names = {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    names = {(node.module or "").split(".")[0]}
                else:
                    todo += list(ast.iter_child_nodes(node))
                    continue
                found += [f"{path.relative_to(REPO)}: {n}" for n in names & posix_only]
    assert found == []


# ---- the module graph: the wings hang off the core, and nothing goes round in a circle --------

# Where each installed package's modules live in the checkout (pyproject's package-dir).
PACKAGE_DIRS = {"canopy": REPO / "canopy", **{f"canopy.{n}": REPO / n for n in LAYERS}}
WINGS_PACKAGE = "canopy.server.wings"
# The wings a wing may import besides the core (none so far).
WING_USES: dict[str, set[str]] = {}


def _modules() -> dict[str, Path]:
    """Every module of the project by its installed name (a package by its `__init__`)."""
    out: dict[str, Path] = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if package == "canopy" and parts[0] in LAYERS:
                continue  # never there in a checkout; a wheel's layout is not read here
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            out[".".join((package, *parts))] = path
    return out


MODULES = _modules()


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def _module_of(name: str) -> str | None:
    """The project module `name` names, or the nearest package above it (`canopy.x.Y`, a class
    imported from `canopy.x`, is canopy.x); None outside the project."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imported(name: str, *, type_only: bool) -> set[str]:
    """The project modules `name` imports anywhere in it, in functions too; with
    `type_only=False`, not those it imports only for type annotations."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = set() if type_only else _type_only(tree)
    here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str | None] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {_module_of(a.name) for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*here[:len(here) - node.level + 1], *filter(None, [base])])
            for alias in node.names:  # `from canopy.server import cli` names a module
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else _module_of(base))
    return {m for m in found if m is not None and m != name}


def _wing(module: str) -> str | None:
    """The wing `module` belongs to; None for the core (the table canopy.server.wings too)."""
    prefix = WINGS_PACKAGE + "."
    return module[len(prefix):].split(".")[0] if module.startswith(prefix) else None


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_module_graph_sees_every_kind_of_import() -> None:
    """The checks below see imports inside functions (cli.index imports runtime when it runs),
    names imported from a package (`from canopy.server.cli import demo` is the module demo) and,
    when asked, imports only for type annotations."""
    assert "canopy.server.runtime" in _imported("canopy.server.cli.index", type_only=False)
    assert "canopy.server.cli.demo" in _imported("canopy.server.cli", type_only=False)
    assert "canopy.providers.fanout" in _imported("canopy.server.runtime", type_only=True)
    assert "canopy.providers.fanout" not in _imported("canopy.server.runtime", type_only=False)
    assert _wing("canopy.server.wings.rest.endpoints") == "rest"
    assert _wing("canopy.server.wings") is None and _wing("canopy.server.http") is None
    assert _circles({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [["a", "b"]]


def test_no_core_module_imports_a_wing() -> None:
    """The core (model, store, settings, LLM client, providers, index, ACL, engines, MCP, CLI)
    reaches a wing only through canopy.server.wings, by name, where the feature is asked for: not
    by an import, in a function, or for a type annotation."""
    found = [f"{m} imports {w}" for m in sorted(MODULES) if _wing(m) is None
             for w in sorted(_imported(m, type_only=True)) if _wing(w) is not None]
    assert found == []


def test_wings_import_the_core_and_no_other_wing() -> None:
    found = [f"{m} imports {w}" for m in sorted(MODULES) if (wing := _wing(m)) is not None
             for w in sorted(_imported(m, type_only=True))
             if _wing(w) not in (None, wing, *WING_USES.get(wing, ()))]
    assert found == []


def test_the_import_graph_has_no_circle() -> None:
    """No module imports, at run time and however lazily, a module that imports it back. Imports
    only for type annotations (`if TYPE_CHECKING:`) are not counted: they never run, and they
    are how a module names a type of a module that uses it (acl.views annotates the
    CallerReader that calls it)."""
    graph = {m: _imported(m, type_only=False) for m in MODULES}
    assert _circles(graph) == []

def _project_imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module, names, line) of every absolute `canopy...` import in `path`, lazy ones (inside
    functions or under TYPE_CHECKING) included."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("canopy")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "canopy" or node.module.startswith("canopy."):
                names = [a.name for a in node.names]
                if node.module == "canopy":  # `from canopy import indexer` names a module
                    out += [(f"canopy.{n}", [], node.lineno) for n in names]
                else:
                    out.append((node.module, names, node.lineno))
    return out


def test_the_indexer_never_imports_the_server() -> None:
    """Not even lazily: the server asks the indexer for a build, never the reverse."""
    found = [f"{p.relative_to(REPO)}:{line} imports {module}"
             for p in sorted((REPO / "indexer").rglob("*.py"))
             for module, _, line in _project_imports(p)
             if module == "canopy.server" or module.startswith("canopy.server.")]
    assert found == []


# One update, from `canopy index` to the commit, by depth: a module calls only deeper ones.
UPDATE_PATH = {
    "canopy.server.cli.index": 5,
    "canopy.server.runtime": 4,
    "canopy.indexer.index_writer": 3,
    "canopy.indexer.pipeline": 2,
    "canopy.indexer.stages": 1,
    "canopy.indexer.operations": 0,
}


def _depth(module: str) -> int | None:
    """The depth of a module on the update path (a package's modules share its depth)."""
    for name, depth in UPDATE_PATH.items():
        if module == name or module.startswith(name + "."):
            return depth
    return None


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"]
    return ".".join(parts if parts[0] == "canopy" else ["canopy", *parts])


def test_an_update_goes_down_the_layers_and_never_climbs_back() -> None:
    """Each module on the update path imports (lazily too) only modules deeper on it, or of its
    own depth (a stage may use another stage's result type): the writer lock and recovery sit
    beside the pipeline, so nothing below the server calls back up to it."""
    modules = [p for p in sorted((REPO / "server").rglob("*.py")) + sorted(
        (REPO / "indexer").rglob("*.py")) if _depth(_module_name(p)) is not None]
    assert {_depth(_module_name(p)) for p in modules} == set(UPDATE_PATH.values())
    climbing = []
    for path in modules:
        own = _depth(_module_name(path))
        assert own is not None
        for module, _, line in _project_imports(path):
            depth = _depth(module)
            if depth is not None and depth > own:
                climbing.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    assert climbing == []


def test_the_depth_of_a_module_on_the_update_path() -> None:
    assert _depth("canopy.indexer.stages.reports") == 1
    assert _depth("canopy.indexer.operations") == 0
    assert _depth("canopy.indexer.pipeline") == 2
    assert _depth("canopy.indexer.pipelines") is None
    assert _depth("canopy.server.cli.export") is None
    assert _module_name(REPO / "indexer" / "stages" / "__init__.py") == "canopy.indexer.stages"
    assert _module_name(REPO / "canopy" / "store" / "reads.py") == "canopy.store.reads"


# What the operations may read of the kernel: data types and pure helpers, never the store, the
# providers, the settings or the LLM client.
OPERATIONS_MAY_IMPORT = {
    "canopy.ids": None, "canopy.model": None, "canopy.tokenizer": None,
    "canopy.aliases": {"display_name"},  # the name an entity is shown under: names in, a name out
    "canopy.store.rows": None,
    "canopy.store.reads": {"EntityInstanceRow", "RelationshipInstanceRow"},
    "canopy.providers.base": {"ReportContext", "ReportOut", "FindingOut"},
}


def test_operations_are_pure_functions_of_plain_data() -> None:
    bad = []
    for path in sorted((REPO / "indexer" / "operations").rglob("*.py")):
        for module, names, line in _project_imports(path):
            if module.startswith("canopy.indexer.operations"):
                continue
            if module not in OPERATIONS_MAY_IMPORT:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {module}")
                continue
            allowed = OPERATIONS_MAY_IMPORT[module]
            if allowed is not None and not set(names) <= allowed:
                bad.append(f"{path.relative_to(REPO)}:{line} imports {sorted(set(names) - allowed)}"
                           f" from {module}")
    assert bad == []


def test_stages_run_no_sql_of_their_own() -> None:
    """A stage reads its input tables through the store's methods (named for what they return)
    and stages its output: no `execute` call in indexer/stages/ or the pipeline."""
    paths = [*sorted((REPO / "indexer" / "stages").rglob("*.py")), REPO / "indexer" / "pipeline.py"]
    calls = [f"{p.relative_to(REPO)}:{node.lineno}" for p in paths
             for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr in ("execute", "executemany", "executescript")]
    assert calls == []


def _same_names() -> dict[str, list[str]]:
    """Module file names that more than one library module has (a package's `__init__.py` and
    `__main__.py` aside), each with the installed names of those modules."""
    by_name: dict[str, list[str]] = {}
    for module, path in sorted(MODULES.items()):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(module)
    return {name: modules for name, modules in by_name.items() if len(modules) > 1}


def test_two_modules_share_a_name_only_as_one_thing_at_two_depths() -> None:
    """Names say their level (issue 33): two library modules have one file name only when they
    are the same thing at two depths (a store's rows and the stage that writes them, a command
    and the engine call it runs), and then each one's docstring says so and names the other."""
    unexplained = []
    for modules in _same_names().values():
        for module in modules:
            doc = ast.get_docstring(ast.parse(MODULES[module].read_text(encoding="utf-8"))) or ""
            said = " ".join(doc.split())  # the phrase may break across lines
            others = [m for m in modules if m != module]
            if "two depths" not in said or any(m not in said for m in others):
                unexplained.append(f"{module} (beside {', '.join(others)})")
    assert unexplained == []


def test_the_names_that_repeat_are_found() -> None:
    """The test above sees modules of one name anywhere in the library (or it would pass on
    nothing): the `canopy warm` command and its engine call are two of them."""
    assert _same_names()["warm.py"] == ["canopy.server.cli.warm", "canopy.server.engines.warm"]
    assert "__init__.py" not in _same_names()
