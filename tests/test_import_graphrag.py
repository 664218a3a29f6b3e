"""`canopy import-graphrag` (canopy.indexer.graphrag): a Microsoft GraphRAG output folder becomes a
Canopy index that answers from GraphRAG's entities and reports and that `canopy index` keeps
current.

The fixture (tests/fixtures/graphrag, README there) is real GraphRAG 3.3.0 output for two
documents, made against the fake endpoint with 300-token units, so GraphRAG's units differ from
Canopy's and the import must lay one onto the other. Everything after the import runs with the
builtin provider: what GraphRAG wrote (upper-case entity titles, "X and Y community" report
titles) is told apart from what Canopy's builtin provider would write."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from canopy.server.api import Index
from canopy.server.cli import main
from tests.conftest import REPO, offline_env
from tests.fakes import graphrag_responses, responses

FIXTURE = REPO / "tests" / "fixtures" / "graphrag"
OUTPUT = FIXTURE / "output"


def _column(table: str, column: str) -> list[str]:
    return [str(v) for v in pq.read_table(OUTPUT / f"{table}.parquet").column(column).to_pylist()]


def _import(docs: Path, *extra: str) -> dict[str, object]:
    result = CliRunner().invoke(main, ["import-graphrag", str(OUTPUT), str(docs), "--json",
                                       *extra])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def _fresh_docs(root: Path) -> Path:
    docs = root / "docs"
    shutil.copytree(FIXTURE / "input", docs)
    return docs


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, object]]]:
    with offline_env():
        docs = _fresh_docs(tmp_path_factory.mktemp("import-graphrag"))
        yield docs, _import(docs)


def test_import_lays_graphrag_units_onto_canopy_units(
        imported: tuple[Path, dict[str, object]]) -> None:
    _, summary = imported
    assert summary["documents_matched"] == 2 and summary["documents_left_out"] == []
    # GraphRAG's 300-token units are all found in the documents, none is a Canopy unit as is,
    # and every Canopy unit is replayed from them: no extraction by the provider
    assert summary["graphrag_units"] == summary["graphrag_units_located"] == 6
    assert summary["graphrag_units_identical"] == 0
    replay = summary["replay"]
    assert isinstance(replay, dict)
    assert replay["units_replayed"] == summary["canopy_units"] and replay["units_extracted"] == 0
    assert replay["reports_imported"] == summary["communities_kept"] > 0
    stats = summary["stats"]
    assert isinstance(stats, dict)
    # every GraphRAG entity is kept (names merge as Canopy's normalized names do)
    assert stats["entities"] == len(set(_column("entities", "title")))


def test_local_search_answers_with_imported_entities(
        imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    titles = set(_column("entities", "title"))
    with offline_env(), Index.open(docs) as ix:
        result = ix.local_search("Who supplies battery cells from Sheffield: Helio Cells Ltd?")
    cited = [c.title for c in result.citations if c.kind == "entity"]
    assert "HELIO CELLS LTD" in cited  # GraphRAG's upper-case title, with its description
    assert set(cited) <= titles


def test_global_search_cites_imported_reports(imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    titles = set(_column("community_reports", "title"))
    summaries = set(zip(_column("community_reports", "title"),
                        _column("community_reports", "summary"), strict=True))
    with offline_env(), Index.open(docs) as ix:
        result = ix.global_search("What are the main risks across suppliers and projects?")
        reports = [c for c in result.citations if c.kind == "report"]
        ours = [c for c in reports if c.title in titles]
        assert ours, [c.title for c in reports]
        card = ix.drill_down(community_id=ours[0].id)
    assert card.community is not None
    assert (card.community.title, card.community.summary) in summaries  # GraphRAG's text


def test_edit_then_index_reextracts_only_the_edited_document(tmp_path: Path) -> None:
    docs = _fresh_docs(tmp_path)
    _import(docs)
    with Index.open(docs) as ix:
        noop = ix.update()
        assert noop.stats["noop"] is True  # the import is the index `canopy index` would keep
        kestrel = docs / "projects" / "kestrel.md"
        kestrel.write_text(kestrel.read_text(encoding="utf-8").replace(
            "Maria Okafor", "Ingrid Vasquez"), encoding="utf-8")
        result = ix.update()
        local = ix.local_search("Who is Ingrid Vasquez?")
        helio = ix.local_search("Helio Cells Ltd Sheffield")
    s = result.stats
    assert s["documents_rechunked"] == 1
    # only the edited document's new units go to the (builtin) provider
    assert s["units_extracted"] == result.usage["extract"]["calls"] >= 1
    assert s["units_extracted"] <= s["text_units"] - 1
    names = [c.title for c in local.citations if c.kind == "entity"]
    assert "Ingrid Vasquez" in names  # the builtin provider's extraction of the edit
    assert "HELIO CELLS LTD" in [c.title for c in helio.citations]  # GraphRAG's, kept


def test_an_existing_index_is_not_overwritten(imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    result = CliRunner().invoke(main, ["import-graphrag", str(OUTPUT), str(docs)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "already holds an index" in result.output


@pytest.mark.parametrize("broken", ["not_graphrag", "missing_table", "missing_column"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, broken: str) -> None:
    docs = _fresh_docs(tmp_path)
    out = tmp_path / "output"
    if broken == "not_graphrag":
        out = docs / "projects"
        expected = "documents.parquet is missing"
    else:
        shutil.copytree(OUTPUT, out)
        if broken == "missing_table":
            (out / "community_reports.parquet").unlink()
            expected = "community_reports.parquet is missing"
        else:
            table = pq.read_table(out / "entities.parquet").drop_columns(["title"])
            pq.write_table(table, out / "entities.parquet")
            expected = "lacks the column(s) title"
    result = CliRunner().invoke(main, ["import-graphrag", str(out), str(docs)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert expected in result.output
    assert not (docs / ".canopy").exists()


def test_fake_answers_graphrag_prompts_and_only_those() -> None:
    prompt = ("-Goal-\n...\n######################\n-Real Data-\n######################\n"
              "Entity_types: organization,person\nText: Maria Okafor leads Project Kestrel at "
              "Northwind Robotics.\n######################\nOutput:")
    body = {"messages": [{"role": "user", "content": prompt}]}
    assert responses.identify_task(body) == "graphrag_extract"
    out = graphrag_responses.chat_content("graphrag_extract", body)
    assert out.endswith("<|COMPLETE|>")
    records = [r.strip() for r in out.split("##")]
    assert '("entity"<|>MARIA OKAFOR<|>PERSON<|>' in records[0]
    assert any(r.startswith('("relationship"<|>MARIA OKAFOR<|>PROJECT KESTREL<|>')
               for r in records)
    glean = {"messages": [*body["messages"], {"role": "assistant", "content": out},
                          {"role": "user", "content": "MANY entities and relationships were "
                                                      "missed in the last extraction."}]}
    assert responses.identify_task(glean) == "graphrag_glean"
    # Canopy's own prompts keep their tasks
    canopy = {"messages": [{"role": "user", "content": "Task: summarize\n===== Descriptions "
                                                       "=====\n- a\n- b"}]}
    assert responses.identify_task(canopy) == "summarize"
