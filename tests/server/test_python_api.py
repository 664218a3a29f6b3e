"""The Python API (canopy.server.api.Index): each method is the CLI's or a tool's machinery,
returning the tools' result models; importing it is light and silent; examples/python_api.py
runs."""

from __future__ import annotations

import asyncio
import runpy
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from canopy.errors import ConfigError, IndexMissing, NotFound
from canopy.server.api import Index
from canopy.server.results import DrillResult, SearchResult
from canopy.server.status import IndexStatus
from tests.conftest import EXAMPLES, REPO, offline_env


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """The bundled examples (read only), indexed with `update()` into a temporary folder."""
    with offline_env():
        canopy = Index.open(EXAMPLES, index_dir=tmp_path_factory.mktemp("api") / "index")
        with pytest.raises(IndexMissing):
            canopy.status()
        run = canopy.update()
        assert run.generation == 1 and run.stats["documents"] == 17
        yield canopy
        canopy.close()


def test_status_counts_the_index(index: Index) -> None:
    st = index.status()
    assert isinstance(st, IndexStatus)
    assert st.documents == 17 and st.entities > 0 and st.reports == st.communities
    assert st.provider == "builtin"


def test_the_searches_return_the_tools_results(index: Index) -> None:
    calls = {
        "global": index.global_search("What are the main risks across the supply chain?"),
        "local": index.local_search("Which supplier makes the battery cells?"),
        "drift": index.drift_search("How did the Tern recall change the supplier plans?"),
        "basic": index.basic_search("How large is the 2025 budget?", k=3),
    }
    for method, result in calls.items():
        assert isinstance(result, SearchResult) and result.method == method
        assert result.answer and result.citations, method
    assert "Helio Cells" in calls["local"].answer
    assert len([c for c in calls["basic"].citations if c.kind == "text_unit"]) <= 3
    assert calls["global"].coverage is not None
    level = index.global_search("What themes run through the projects?", community_level=1)
    assert level.community_level == 1
    routed = index.search("How many battery packs were recalled?")
    assert routed.method == "basic" and routed.route is not None and routed.route.by == "rules"


def test_drill_down_navigates_the_hierarchy(index: Index) -> None:
    roots = index.drill_down()
    assert isinstance(roots, DrillResult) and roots.children
    top = roots.children[0]
    one = index.drill_down(community_id=top.id, limit=3)
    assert one.community is not None and one.community.id == top.id
    assert 0 < len(one.entities) <= 3
    by_name = index.drill_down(entity=one.entities[0].name)
    assert by_name.entity is not None and by_name.entity.id == one.entities[0].id
    with pytest.raises(NotFound):
        index.drill_down(community_id="c0-0000000000")


def test_export_writes_what_status_counts(index: Index, tmp_path: Path) -> None:
    result = index.export(tmp_path / "out", format="csv")
    st = index.status()
    assert result.rows["entities"] == st.entities and result.rows["documents"] == st.documents
    assert (tmp_path / "out" / "entities.csv").exists()
    assert result.principal is None and result.generation == st.generation


def test_a_call_inside_a_running_event_loop_still_blocks_and_answers(index: Index) -> None:
    """A notebook cell runs in an event loop: the call runs on a thread of its own."""

    async def in_a_notebook() -> SearchResult:
        return index.basic_search("Who leads Project Tern?", k=2)

    assert asyncio.run(in_a_notebook()).citations


def test_build_rebuilds_and_update_then_has_nothing_to_do(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Alpha\n\nAda Lovelace met Charles Babbage in London.\n",
                               encoding="utf-8")
    (docs / "b.md").write_text("# Beta\n\nCharles Babbage designed the Analytical Engine.\n",
                               encoding="utf-8")
    with Index.open(docs, index_dir=tmp_path / "index") as canopy:
        first = canopy.build()
        again = canopy.update()
        assert again.stats["units_extracted"] == 0
        rebuilt = canopy.build()
        assert rebuilt.generation > first.generation
        assert canopy.status().documents == 2


def test_a_missing_folder_or_a_bad_config_fails_at_open(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Index.open(tmp_path / "nowhere")
    with pytest.raises(ConfigError):
        Index.open(tmp_path, config=tmp_path / "missing.toml")


def test_importing_the_api_loads_no_engine_store_or_mcp_code_and_prints_nothing() -> None:
    heavy = ["lancedb", "mcp", "openai", "pyarrow", "canopy.store", "canopy.server.engines",
             "canopy.server.runtime", "canopy.server.service", "canopy.indexer"]
    code = ("import sys, canopy.server.api\n"
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_example_script_runs_offline_and_prints_real_output(
        index: Index, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Run in this process (as `python examples/python_api.py INDEX_DIR` would run it) on the
    module's index, so the update has nothing to do."""
    monkeypatch.setattr(sys, "argv", ["python_api.py", str(index.index_dir)])
    runpy.run_path(str(REPO / "examples" / "python_api.py"), run_name="__main__")
    out = capsys.readouterr().out
    for line in ("update: generation 1", "local_search (builtin", "global_search: level 0",
                 "drill_down: ", "export (parquet)"):
        assert line in out
    assert "Helio Cells" in out
