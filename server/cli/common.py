"""What the `canopy` commands share: the DOCS / --index-dir / --config parameters, the progress
bar factory, the group class that turns Canopy errors into one line, and the version.

Every command module imports this module only, never the package `canopy.server.cli`: the package
imports the command modules to assemble the group, so an import back would be a cycle
(tests/test_architecture.py checks it). Keep it light: `canopy serve` imports it before the MCP
server starts, so heavy imports belong inside the commands that need them.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from canopy.errors import CanopyError

if TYPE_CHECKING:
    from canopy.settings import AclSettings

__all__ = ["CONFIG", "DISTRIBUTION", "DOCS", "INDEX_DIR", "STARTED", "CanopyGroup",
           "canopy_version", "check_principal", "describe_batch", "duration", "index_command",
           "tqdm_progress"]

STARTED = time.perf_counter()  # when the CLI's modules loaded: `canopy demo` times from here
DISTRIBUTION = "canopy-graphrag"  # the name in pyproject.toml, which `canopy --version` reports

DOCS = click.argument("docs", type=click.Path(exists=True, file_okay=False, path_type=Path))
INDEX_DIR = click.option("--index-dir", type=click.Path(file_okay=False, path_type=Path),
                         envvar="CANOPY_INDEX_DIR",
                         help="Index folder (default: DOCS/.canopy). "
                              "Use it when DOCS is read-only.")
CONFIG = click.option("--config", type=click.Path(dir_okay=False, path_type=Path),
                      envvar="CANOPY_CONFIG",
                      help="Settings file (default: DOCS/canopy.toml if present).")


def index_command(docs: Path, index_dir: Path | None, config: Path | None) -> str:
    """The `canopy index` command line that resumes or updates this very index: the folder, and
    the --index-dir and --config the command was given (without them it would build another
    index beside DOCS and ignore the saved work)."""
    import shlex

    words = ["canopy", "index", str(docs)]
    if index_dir is not None:
        words += ["--index-dir", str(index_dir)]
    if config is not None:
        words += ["--config", str(config)]
    return shlex.join(words)


def check_principal(acl: AclSettings, name: str | None) -> None:
    """Under an [acl] policy (`acl`: its AclSettings) the caller named on the command line must
    be one of its principals: an unknown or missing name would see nothing, without a word.
    The operator configured both, so saying which names exist leaks nothing."""
    if not acl.enabled:
        return
    from canopy.errors import ConfigError
    from canopy.suggest import did_you_mean

    known = sorted(acl.principals)
    listed = ", ".join(known) or "none"
    if not name:
        raise ConfigError("the [acl] policy is on: name the caller with --principal or "
                          f"CANOPY_PRINCIPAL (its principals: {listed})")
    if name not in acl.principals:
        raise ConfigError(f"unknown principal {name!r}{did_you_mean(name, known)} "
                          f"([acl.principals] names: {listed})")


LOG_EVERY_S = 10.0  # plain progress lines when stderr is not a terminal (CI logs, `nohup`)


def tqdm_progress(stage: str, total: int) -> Callable[[int], None]:
    """A progress callback for `build_index` on stderr (stdout carries results only, and is the
    MCP protocol under `serve`): a tqdm bar, with its rate and ETA, on a terminal; elsewhere
    plain lines (`extract: 120/800 (15%), 3.1/s, about 3m40s left`) at most every LOG_EVERY_S
    and when the stage ends, so that a build whose output goes to a file is not silent."""
    if total <= 0:
        return lambda n: None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=total, desc=f"{stage:>9}", unit="it", file=sys.stderr, leave=False)

        def advance(n: int) -> None:
            bar.update(n)
            if bar.n >= total:
                bar.close()

        return advance
    began = last = time.monotonic()
    done = 0
    print(f"{stage}: {total} to do", file=sys.stderr, flush=True)

    def log_line(n: int) -> None:
        nonlocal done, last
        done += n
        now = time.monotonic()
        if done < total and now - last < LOG_EVERY_S:
            return
        last = now
        rate = done / max(now - began, 1e-9)
        left = f", about {duration((total - done) / rate)} left" if 0 < done < total else ""
        print(f"{stage}: {done}/{total} ({100 * done // total}%), {rate:.1f}/s{left}",
              file=sys.stderr, flush=True)

    return log_line


def duration(seconds: float) -> str:
    """`3m40s`, `1h02m`, `12s`: how long, for people."""
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (
        f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def describe_batch(paths: set[Path], result: Any) -> str:
    """One log line per applied batch: files, units extracted, reports regenerated, LLM calls.

    Shared by `canopy watch` and `canopy serve --watch`."""
    s = result.stats
    calls = sum(u.get("calls", 0) for t, u in result.usage.items())
    return (f"applied {len(paths)} changed path(s) -> generation {result.generation}: "
            f"{s['units_extracted']} units extracted, "
            f"{s['reports_generated']} reports regenerated, "
            f"{calls} provider calls, {result.elapsed_s:.1f}s")


def canopy_version() -> str:
    """The installed distribution's version; from a checkout that is not installed (PYTHONPATH),
    the version in its pyproject.toml."""
    import importlib.metadata

    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return _checkout_version()


def _checkout_version() -> str:
    import tomllib

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    except (OSError, tomllib.TOMLDecodeError, KeyError):
        return "unknown"
    return str(project.get("version", "unknown"))


class CanopyGroup(click.Group):
    """Canopy errors become one clear line and exit code 1, with no traceback."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except CanopyError as exc:
            raise click.ClickException(str(exc)) from exc
