"""The indexing pipeline end to end: provenance, communities, reports, skips, providers,
failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from canopy.errors import EndpointUnavailable
from canopy.indexer.operations.clustering import is_partition
from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.status import index_status
from canopy.store import Store
from canopy.store.export import load_graph
from canopy.vectors import VectorStore
from tests.conftest import EXAMPLES, REPO, SHARED, require_shared


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = open_workspace(EXAMPLES, index_dir=tmp_path_factory.mktemp("idx"))
    build_index(ws)
    return ws


def _graph(ws: Workspace):  # type: ignore[no-untyped-def]
    store = Store(ws.index_dir)
    try:
        g = load_graph(store)
        return g, g.units, g.documents
    finally:
        store.close()


class TestBuiltinIndexOfTheExamples:
    def test_every_artifact_has_provenance_pointing_at_live_units(self, built: Workspace) -> None:
        g, units, _ = _graph(built)
        live = set(units)
        groups = {
            "entity": g.entities.values(),
            "relationship": g.relationships.values(),
            "claim": g.claims.values(),
            "report": g.reports.values(),
        }
        for kind, items in groups.items():
            for a in items:
                assert a.text_unit_ids, f"{kind} without provenance"
                assert set(a.text_unit_ids) <= live, f"{kind} cites a dead unit"
        for r in g.reports.values():
            for f in r.findings:
                assert set(f.text_unit_ids) <= set(r.text_unit_ids)
        for c in g.community_rows.values():
            assert c.gate.acl, "community without provenance"

    def test_vector_rows_are_exactly_the_live_artifacts_with_their_acl_classes(
        self, built: Workspace
    ) -> None:
        g, units, _ = _graph(built)
        vs = VectorStore(built.index_dir, built.settings.embed.dims)
        expected = {"text_units": set(units), "entities": set(g.entities),
                    "reports": set(g.reports)}
        for table, ids in expected.items():
            t = vs._table(table)
            assert t is not None
            rows = t.to_arrow().select(["id", "acl"]).to_pylist()
            assert {r["id"] for r in rows} == ids and len(rows) == len(ids)
            assert all(r["acl"] for r in rows)

    def test_levels_partition_entities_and_every_community_has_a_report(
        self, built: Workspace
    ) -> None:
        g, _, _ = _graph(built)
        levels = sorted({c.level for c in g.communities.values()})
        assert len(levels) >= 2
        for level in levels:
            part = [c.entity_ids for c in g.communities.values()
                    if c.level == level or (c.level < level and not c.children)]
            assert is_partition(part, set(g.entities))
        assert set(g.reports) == set(g.communities)

    def test_chinese_documents_contribute_chinese_entities(self, built: Workspace) -> None:
        g, _, _ = _graph(built)
        assert any(any("\u4e00" <= ch <= "\u9fff" for ch in e.name) for e in g.entities.values())

    def test_rerunning_index_changes_nothing_and_reuses_every_report(
        self, built: Workspace
    ) -> None:
        before = _graph(built)[0]
        result = build_index(built)
        assert result.stats["units_extracted"] == 0
        assert result.stats["reports_generated"] == 0
        after = _graph(built)[0]
        assert before.entities == after.entities and before.reports == after.reports

    def test_status_reports_counts_levels_and_provider(self, built: Workspace) -> None:
        store = Store(built.index_dir)
        try:
            st = index_status(store)
        finally:
            store.close()
        assert st.provider == "builtin"
        assert st.documents == len(list(p for p in EXAMPLES.rglob("*") if p.is_file()))
        assert sum(st.communities_by_level.values()) == st.communities == st.reports


def test_sub_community_reports_are_substituted_when_elements_exceed_the_budget(
    tmp_path: Path,
) -> None:
    ws = open_workspace(EXAMPLES, index_dir=tmp_path / "idx", reports={"max_context_tokens": 700})
    build_index(ws)
    g, _, _ = _graph(ws)
    substituted = [r for r in g.reports.values() if r.used_subreports]
    assert substituted, "no higher-level report used sub-community reports"
    for r in substituted:
        assert r.context_tokens <= 700 + 50  # rendering headers aside, within budget
        assert set(r.used_subreports) <= set(g.communities[r.community_id].children)


def test_bad_files_are_skipped_with_reasons_and_never_stop_the_rest(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nAlice Smith met Bob Jones in Paris.", encoding="utf-8")
    (docs / "binary.txt").write_bytes(b"\x00\x01\x02binary" * 100)
    (docs / "empty.txt").write_text("   \n", encoding="utf-8")
    (docs / "latin1.txt").write_bytes("Café society met José Álvarez in Málaga.".encode("latin-1"))
    (docs / "gbk.txt").write_bytes(
        ("深圳华光传感器有限公司为项目提供摄像头模组。" * 20).encode("gbk")
    )
    (docs / "big.txt").write_text("x" * 5000, encoding="utf-8")
    (docs / "canopy.toml").write_text("[input]\nmax_file_bytes = 4000\n", encoding="utf-8")
    (docs / "rows.csv").write_text(
        "name,city\nAlice Smith,Paris\nBob Jones,Berlin\n", encoding="utf-8"
    )
    (docs / "notes.jsonl").write_text(
        '{"title": "Note", "text": "Carol White visited Rome."}\nnot json\n', encoding="utf-8"
    )
    (docs / "page.html").write_text(
        "<html><body><script>x()</script><h1>Launch</h1><p>Dana Reed spoke.</p></body></html>",
        encoding="utf-8",
    )
    ws = open_workspace(docs, index_dir=docs / ".canopy")
    result = build_index(ws)
    skipped = {s.path: s.reason for s in result.skips}
    assert "binary" in skipped["binary.txt"]
    assert "no text" in skipped["empty.txt"]
    assert "max_file_bytes" in skipped["big.txt"]
    assert "canopy.toml" not in skipped and not any(p.startswith(".canopy") for p in skipped)
    _, units, docs_ = _graph(ws)
    paths = {d.path for d in docs_.values()}
    assert paths == {"good.md", "latin1.txt", "gbk.txt", "rows.csv", "notes.jsonl", "page.html"}
    text = " ".join(u.text for u in units.values())
    assert "深圳华光传感器有限公司" in text
    assert "José Álvarez" in text and "x()" not in text and "Dana Reed" in text


def test_a_2_mb_markdown_line_without_whitespace_is_indexed_beside_a_good_file(
        tmp_path: Path) -> None:
    """Issue 30, finding 2: the chunker recursed once per piece of such a line, so one file
    ended the whole build with RecursionError and nothing was indexed."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "good.md").write_text("# Good\n\nAlice Smith met Bob Jones in Paris.", encoding="utf-8")
    (docs / "table.md").write_text("|-" * 1_000_000, encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "index")
    result = build_index(ws)
    assert result.skips == []
    _, units, docs_ = _graph(ws)
    assert {d.path for d in docs_.values()} == {"good.md", "table.md"}
    assert sum(u.document_id == next(d.id for d in docs_.values() if d.path == "table.md")
               for u in units.values()) > 1000
    assert any("Alice Smith" in u.text for u in units.values())


class TestAgainstTheFakeOpenAIServer:
    def _ws(self, tmp_path: Path, base_url: str, **llm: object) -> Workspace:
        docs = tmp_path / "docs"
        shutil.copytree(EXAMPLES / "suppliers", docs)
        settings = {"base_url": base_url, "max_retries": 2, "backoff_s": 0.01, **llm}
        return open_workspace(docs, index_dir=tmp_path / "idx", llm=settings)

    def test_extraction_gleaning_summaries_and_reports_go_through_the_endpoint(
        self, tmp_path: Path, fake_openai
    ) -> None:  # type: ignore[no-untyped-def]
        ws = self._ws(tmp_path, fake_openai.base_url)
        result = build_index(ws)
        for task in ("extract", "glean", "report"):
            assert fake_openai.count(task) > 0, task
        assert result.usage["extract"]["calls"] == fake_openai.count("extract")
        assert result.usage["report"]["prompt_tokens"] > 0
        g, _, _ = _graph(ws)
        assert g.entities and set(g.reports) == set(g.communities)
        store = Store(ws.index_dir)
        try:
            assert index_status(store).provider.startswith("openai:")
        finally:
            store.close()
        # A second run is answered from stored extractions and the response cache: no new calls.
        before = len(fake_openai.requests)
        build_index(ws)
        assert len(fake_openai.requests) == before

    def test_a_429_then_success_is_retried_transparently(self, tmp_path: Path, fake_openai) -> None:  # type: ignore[no-untyped-def]
        ws = self._ws(tmp_path, fake_openai.base_url)
        fake_openai.fail_next(2, status=429, retry_after=0.01)
        result = build_index(ws)
        assert result.stats["units_failed"] == 0 and not result.failures
        assert [r.status for r in fake_openai.requests[:2]] == [429, 429]

    def test_malformed_json_fails_one_unit_visibly_and_is_retried_next_run(
        self, tmp_path: Path, fake_openai
    ) -> None:  # type: ignore[no-untyped-def]
        ws = self._ws(tmp_path, fake_openai.base_url, concurrency=1)
        fake_openai.malformed_next(2)  # the first unit's answer and its repair are both invalid
        result = build_index(ws)
        assert result.stats["units_failed"] == 1
        store = Store(ws.index_dir)
        try:
            st = index_status(store)
        finally:
            store.close()
        assert len(st.failures) == 1 and st.failures[0].task == "extract"
        again = build_index(ws)
        assert again.stats["units_extracted"] == 1 and again.stats["units_failed"] == 0

    def test_a_dead_endpoint_gives_a_clear_error_and_leaves_the_index_intact(
        self, tmp_path: Path, fake_openai
    ) -> None:  # type: ignore[no-untyped-def]
        ws = self._ws(tmp_path, fake_openai.base_url)
        build_index(ws)
        before = _graph(ws)
        (ws.docs_dir / "new.md").write_text(
            "# New\n\nZed Quinn joined Helio Cells Ltd in Sheffield.", encoding="utf-8"
        )
        dead = open_workspace(
            ws.docs_dir,
            index_dir=ws.index_dir,
            llm={"base_url": "http://127.0.0.1:9/v1", "max_retries": 1, "backoff_s": 0.01},
        )
        with pytest.raises(EndpointUnavailable) as info:
            build_index(dead)
        assert "127.0.0.1:9" in str(info.value)
        after = _graph(ws)
        assert after[0].entities == before[0].entities and after[1] == before[1]


def test_a_christmas_carol_indexes_offline_with_two_levels_and_a_report_per_community(
    tmp_path: Path,
) -> None:
    ws = open_workspace(require_shared(SHARED / "books"), index_dir=tmp_path / "carol")
    result = build_index(ws)
    assert len(result.stats["communities_by_level"]) >= 2
    g, _, _ = _graph(ws)
    assert set(g.reports) == set(g.communities)
    assert json.loads(json.dumps(result.stats))  # the summary is plain data


def test_docx_files_are_loaded_paragraph_by_paragraph(tmp_path: Path) -> None:
    docx = pytest.importorskip("docx")
    from canopy.indexer.loaders import load_file

    doc = docx.Document()
    doc.add_paragraph("Quarterly review")
    doc.add_paragraph("Maria Okafor presented Project Kestrel to Verdant Grocers.")
    path = tmp_path / "review.docx"
    doc.save(str(path))
    assert (
        load_file(path)
        == "Quarterly review\n\nMaria Okafor presented Project Kestrel to Verdant Grocers."
    )


def test_missing_shared_data_skips_with_its_reason_and_fails_where_it_is_required(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "eval-data" / "corpus.json"
    monkeypatch.delenv("REQUIRE_EVAL_DATA", raising=False)
    with pytest.raises(pytest.skip.Exception, match="shared eval data not found at .*SOURCES.md"):
        require_shared(missing)
    monkeypatch.setenv("REQUIRE_EVAL_DATA", "1")
    with pytest.raises(pytest.fail.Exception, match=r"REQUIRE_EVAL_DATA=1"):
        require_shared(missing)
    assert require_shared(tmp_path) == tmp_path


def test_tests_reach_the_shared_data_only_through_require_shared() -> None:
    """A test that builds its own path to ../shared and skips by itself would skip in CI too,
    unseen (REQUIRE_EVAL_DATA=1 fails only require_shared's skips). So only conftest.py names
    that folder: no other test module spells it out or climbs above the repository (past
    `parents[1]` from tests/, `parents[2]` from tests/<folder>/, ...), and one that imports
    conftest's SHARED, CAROL or NEWS also uses require_shared (carol_text and news_articles
    call it for you)."""
    import ast
    import re

    shared = re.compile(r"(?:^|[/\\])shared(?:[/\\]|$)")  # a path part named shared
    gated = {"SHARED", "CAROL", "NEWS"}
    offenders = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        if path.name == "conftest.py":
            continue
        name = path.relative_to(REPO).as_posix()
        repository = len(path.relative_to(REPO).parts) - 1  # path.parents[repository] is REPO
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and shared.search(node.value)):
                offenders.append(f"{name}:{node.lineno} names the shared folder")
            elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
                  and node.value.attr == "parents" and isinstance(node.slice, ast.Constant)
                  and isinstance(node.slice.value, int) and node.slice.value > repository):
                offenders.append(f"{name}:{node.lineno} climbs above the repository")
            elif (isinstance(node, ast.ImportFrom) and node.module == "tests.conftest"
                  and gated & {a.name for a in node.names} and "require_shared" not in names):
                offenders.append(f"{name}:{node.lineno} imports shared paths without "
                                 "require_shared")
    assert not offenders, offenders


def test_a_new_builtin_extraction_version_extracts_every_unit_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from canopy.providers.builtin.provider import BuiltinProvider

    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(3):
        (docs / f"n{i}.md").write_text(f"# Note {i}\n\nIvo Marsh met Teodora Quill in Brno.\n",
                                       encoding="utf-8")
    ws = open_workspace(docs, index_dir=tmp_path / "idx")
    first = build_index(ws)
    assert first.stats["units_extracted"] == first.stats["text_units"] > 0
    again = build_index(ws)
    assert again.stats["units_extracted"] == 0  # same rules: nothing to redo
    monkeypatch.setattr(BuiltinProvider, "extraction_version", "test-next")
    changed = build_index(ws)
    assert changed.stats["units_extracted"] == first.stats["text_units"]


def test_the_sdk_is_imported_while_documents_are_chunked_and_lancedb_only_after(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 35: a build's first request waited 2.6 s behind two imports taking turns with
    the chunking; the SDK goes first, LanceDB once the documents stage is done."""
    import threading as th

    from canopy.indexer import pipeline

    order: list[str] = []
    sdk_done = th.Event()
    lance_done = th.Event()
    monkeypatch.setattr(pipeline, "preload_sdk",
                        lambda: (order.append("sdk"), sdk_done.set()))
    monkeypatch.setattr(pipeline, "import_lancedb",
                        lambda: (order.append("lancedb"), lance_done.set()))
    imports = pipeline._ImportsAhead.start(endpoint=True)
    assert sdk_done.wait(5)
    assert not lance_done.wait(0.2) and order == ["sdk"]  # still chunking
    imports.documents_done()
    assert lance_done.wait(5) and order == ["sdk", "lancedb"]

    order.clear()
    offline = pipeline._ImportsAhead.start(endpoint=False)  # the builtin provider: no SDK
    offline.documents_done()
    th.Event().wait(0.2)
    assert "sdk" not in order
