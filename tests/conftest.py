"""Shared fixtures. Every test runs with a clean environment: no real endpoint can leak in.

The folders mirror the package: a test module sits in the folder that mirrors where the code it
mostly checks lives, tests/canopy/ (the kernel), tests/indexer/, tests/acl/, tests/server/,
tests/prompts/ or tests/wings/<wing>/, and in a subfolder (canopy/llm, canopy/providers,
indexer/operations, server/engines) where several modules check one subpackage. Tests of the
whole system stay at the top (the import rules, packaging, the docs and their rendered tables,
erasure from disk, update compositions), with the suite's test of its own fake endpoint
(test_fake_rate_limit) and the helpers every folder shares (this file, fakes/, compositions.py,
net.py, inference/)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from canopy.acl.reader import CallerReader
    from canopy.server.runtime import Workspace
    from canopy.server.service import CanopyService

pytest_plugins = ["tests.fakes.fixtures"]

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "eval-data"
EXAMPLES = REPO / "examples" / "docs"
CAROL = SHARED / "books" / "christmas_carol_pg24022.txt"
NEWS = SHARED / "multihop-rag" / "corpus.json"


# Fixtures that bring what only the [heavy] extra or a browser has (Ray, moto's S3 server,
# chromium, llama-cpp-python's server): a test that uses one is `heavy`, run by the second test
# command (`python -m pytest -m heavy`, which .ci/run runs too), not by the default one.
# A fixture parametrized over "folder" and "s3" reaches the S3 server at run time
# (request.getfixturevalue): its "s3" cases are heavy too.
HEAVY_FIXTURES = frozenset({"ray_cluster", "s3", "chromium", "tiny_model"})
HEAVY_PARAM = "s3"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads -n (addopts' `-n auto`)
def pytest_cmdline_main(config: pytest.Config) -> None:
    """The heavy command (`-m heavy`) runs in one process: its fixtures are one Ray cluster, one
    S3 server, one browser and one compiled inference server for the whole run, and each xdist
    worker would start its own."""
    expr = config.option.markexpr or ""
    if "heavy" in expr.replace("not heavy", "") and getattr(config.option, "numprocesses", None):
        config.option.numprocesses = 0


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if (HEAVY_FIXTURES & set(getattr(item, "fixturenames", ()))
                or any(isinstance(v, str) and v == HEAVY_PARAM for v in params)):
            item.add_marker(pytest.mark.heavy)


def require_heavy(module: str) -> None:
    """Import `module` (a package of the [heavy] extra) or skip; under REQUIRE_HEAVY=1 (.ci/run)
    fail instead: a skip there would hide the test."""
    try:
        __import__(module)
    except ImportError:
        if os.environ.get("REQUIRE_HEAVY"):
            pytest.fail(f"{module} is not installed, and REQUIRE_HEAVY is set (.ci/run "
                        "installs the [heavy] extra)")
        pytest.skip(f"{module} is not installed: pip install -e '.[heavy]'")


def require_wing(wing: str) -> None:
    """Skip unless wing `wing`'s extra is installed (canopy.server.wings.WINGS: the libraries
    it brings); fail instead when REQUIRE_WINGS names it ("all", or a comma-separated list, as
    .ci/run sets it after installing those extras): a skip there would hide the wing's tests.
    tests/wings/conftest.py calls it for every test under tests/wings/<wing>/."""
    from canopy.server.wings import missing_libraries

    missing = missing_libraries(wing)
    if not missing:
        return
    from canopy.extras import extra_hint

    required = os.environ.get("REQUIRE_WINGS", "")
    why = f"the {wing} wing's extra is not installed ({', '.join(missing)}): {extra_hint(wing)}"
    if required == "all" or wing in required.split(","):
        pytest.fail(f"{why}, and REQUIRE_WINGS={required} (.ci/run installs it)")
    pytest.skip(why)


@contextmanager
def offline_env() -> Iterator[None]:
    """No CANOPY_ or OPENAI_ variable (no real endpoint can leak in), and `canopy index` and
    the watchers tidying inline, as `build_index` does: a detached tidy outliving a test would
    race its clean-up (tests of the background tidy set it back). Every test runs in it; module
    fixtures, which run before that, enter it themselves."""
    with pytest.MonkeyPatch.context() as mp:
        for key in list(os.environ):
            if key.startswith(("CANOPY_", "OPENAI_")):
                mp.delenv(key)
        mp.setenv("CANOPY_STORAGE__TIDY", "inline")
        yield


def indexed_examples(root: Path, policy: str, extra: dict[str, str] | None = None) -> Workspace:
    """The examples copied to `root/docs` under `policy` (a canopy.toml), plus `extra` files
    (relative path -> text), indexed offline into `root/index`: the workspace module fixtures
    of the engine tests share."""
    from canopy.server.runtime import build_index, open_workspace

    shutil.copytree(EXAMPLES, root / "docs")
    for rel, text in (extra or {}).items():
        (root / "docs" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "docs" / rel).write_text(text, encoding="utf-8")
    (root / "docs" / "canopy.toml").write_text(policy, encoding="utf-8")
    with offline_env():
        ws = open_workspace(root / "docs", root / "index")
        build_index(ws)
    return ws


@pytest.fixture(scope="session")
def examples_index(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled examples indexed offline once for the whole run, into a temporary folder.
    Read only: a test that updates an index copies this one first."""
    from canopy.server.runtime import build_index, open_workspace

    index_dir = tmp_path_factory.mktemp("examples-index")
    with offline_env():
        build_index(open_workspace(EXAMPLES, index_dir=index_dir))
    return index_dir


@pytest.fixture(scope="module")
def examples_service(examples_index: Path) -> Iterator[CanopyService]:
    """A service over the shared examples index, one per test module (read only, offline)."""
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    with offline_env():
        svc = CanopyService(open_workspace(EXAMPLES, index_dir=examples_index))
    yield svc
    svc.close()


@pytest.fixture(autouse=True)
def _clean_env() -> Iterator[None]:
    with offline_env():
        yield


@pytest.fixture
def example_docs(tmp_path: Path) -> Path:
    """A private copy of the bundled example corpus (tests may edit it)."""
    dst = tmp_path / "docs"
    shutil.copytree(EXAMPLES, dst)
    return dst


def require_shared(path: Path) -> Path:
    """`path` in ../shared/eval-data, or a skip that says what is missing and why it matters.
    With REQUIRE_EVAL_DATA=1 (set by .ci/run) a missing file fails the test instead: CI has
    the data, so a skip there would hide tests that never ran."""
    if path.exists():
        return path
    why = (f"shared eval data not found at {path}: this test runs on real public corpora, "
           "kept next to the repository in ../shared/eval-data (see its SOURCES.md)")
    if os.environ.get("REQUIRE_EVAL_DATA") == "1":
        pytest.fail(why + " (REQUIRE_EVAL_DATA=1)")
    pytest.skip(why)


def news_articles(first: int, n: int) -> list[tuple[str, str]]:
    """(title, body) of MultiHop-RAG articles first..first+n-1 (real news, for tests that need
    a corpus larger than the examples)."""
    require_shared(NEWS)
    import json

    return [(a["title"], a["body"])
            for a in json.loads(NEWS.read_text(encoding="utf-8"))[first:first + n]]


def carol_text() -> str:
    return require_shared(CAROL).read_text(encoding="utf-8")


def wait_until(predicate: Callable[[], object], timeout: float = 30.0) -> bool:
    """Poll `predicate` every 50 ms until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@contextmanager
def report_reads(reader: CallerReader) -> Iterator[list[list[str]]]:
    """The ids of each `reader.reports` call made inside the block, in order."""
    reads: list[list[str]] = []
    reports = reader.reports

    async def counted(ids: Iterable[str]) -> Any:
        reads.append(list(ids))
        return await reports(reads[-1])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reader, "reports", counted)
        yield reads
