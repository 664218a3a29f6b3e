"""The search tables (canopy.vectors): diff writes, versions pinned per generation, crash
recovery, index maintenance and ACL prefiltering."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import canopy.vectors as vectors_module
from canopy.vectors import Hit, VectorReader, VectorRow, VectorStore

DIMS = 16


def _row(i: int, acl: tuple[int, ...] = (1,), text: str | None = None) -> VectorRow:
    v = np.zeros(DIMS, dtype=np.float32)
    v[i % DIMS] = 1.0
    v[(i * 7 + 3) % DIMS] += 0.5
    v /= np.linalg.norm(v)
    return VectorRow(f"u{i}", text or f"passage number {i} about topic{i % 5}", f"h{i}", v, acl)


def test_a_reader_keeps_its_generations_versions_while_the_writer_moves_on(tmp_path: Path) -> None:
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(10)])
    vs.maintain("text_units")
    committed = vs.versions()
    vs.write("text_units", ["u3"], [_row(3, text="rewritten passage about zebras")])
    old = vs.reader(committed)
    hits = _search(old, "text_units", vector=None, text="zebras", k=5)
    assert not hits  # the old generation never had that text
    new = VectorStore(tmp_path, DIMS).reader(vs.versions())
    assert [h.id for h in _search(new, "text_units", vector=None, text="zebras", k=5)] == ["u3"]


def test_restore_undoes_what_a_crashed_writer_wrote(tmp_path: Path) -> None:
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(5)])
    committed = vs.versions()
    crashed = VectorStore(tmp_path, DIMS)
    crashed.write("text_units", ["u1"], [_row(1), _row(99)])  # then the process dies
    again = VectorStore(tmp_path, DIMS)
    again.restore(committed)
    again.write("text_units", ["u1"], [_row(1), _row(99)])  # the same diff, replayed
    ids = again._table("text_units").to_arrow().column("id").to_pylist()
    assert sorted(ids) == sorted(["u0", "u1", "u2", "u3", "u4", "u99"])  # nothing duplicated


def test_search_prefilters_hidden_acl_classes_before_ranking(tmp_path: Path) -> None:
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i, acl=(1,) if i % 2 else (1, 2)) for i in range(20)])
    vs.maintain("text_units")
    reader = vs.reader(vs.versions())
    query = _row(4).vector
    everyone = _search(reader, "text_units", vector=query, text="topic4", k=20)
    hidden = _search(reader, "text_units", vector=query, text="topic4", k=20, hidden_acl=[2])
    assert any(h.id == "u4" for h in everyone)
    assert hidden and all(int(h.id[1:]) % 2 for h in hidden)  # class 2 rows never ranked


def test_a_lancedb_without_the_async_table_behind_the_sync_one_still_searches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Searches await the asynchronous table behind LanceDB's synchronous one (a private
    attribute); where a LanceDB keeps it elsewhere, the reader opens one at the same version."""
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(20)])
    vs.maintain("text_units")
    committed = vs.versions()
    vs.write("text_units", ["u3"], [_row(3, text="rewritten passage about zebras")])
    query = {"vector": _row(4).vector, "text": "topic4", "k": 10}
    behind = _search(vs.reader(committed), "text_units", **query)
    monkeypatch.setattr(vectors_module, "_async_table", lambda t: None)
    old = VectorStore(tmp_path, DIMS).reader(committed)
    assert _search(old, "text_units", **query) == behind
    assert not _search(old, "text_units", vector=None, text="zebras", k=5)  # its version's rows


def test_a_large_table_gets_a_vector_index_and_appended_rows_are_still_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors_module, "VECTOR_INDEX_MIN", 200)
    vs = VectorStore(tmp_path, DIMS)
    vs.write("entities", [], [_row(i) for i in range(400)])
    vs.maintain("entities")
    t = vs._table("entities")
    assert {tuple(i.columns) for i in t.list_indices()} == {("text",), ("vector",)}
    vs.write("entities", [], [_row(1000, text="a brand new passage about quasars")])
    vs.maintain("entities")  # few appended rows: searched unindexed until they are many
    reader = vs.reader(vs.versions())
    assert _search(reader, "entities", vector=_row(1000).vector, text=None, k=50)
    hits = _search(reader, "entities", vector=None, text="quasars", k=3)
    assert [h.id for h in hits] == ["u1000"]


def _search(reader: VectorReader, name: str, **kwargs: Any) -> list[Hit]:
    return asyncio.run(reader.search(name, **kwargs))


def _random_rows(n: int, seed: int, start: int = 0) -> list[VectorRow]:
    rng = np.random.default_rng(seed)
    vectors = rng.standard_normal((n, DIMS)).astype(np.float32)
    return [VectorRow(f"r{start + i}", f"row {start + i}", f"h{start + i}", v, (1,))
            for i, v in enumerate(vectors)]


def _vector_indexes(vs: VectorStore, name: str) -> list[tuple[str, str]]:
    t = vs._table(name)
    assert t is not None
    return [(i.name, i.index_type) for i in t.list_indices() if tuple(i.columns) == ("vector",)]


def test_the_vector_index_is_scalar_quantized_and_probed_by_its_partition_count(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """IVF_SQ, named for the rows it was trained on; a reader probes 60% of the partitions
    (at least 20) and ranks what they give by exact distances, so the nearest rows are found."""
    monkeypatch.setattr(vectors_module, "VECTOR_INDEX_MIN", 500)
    vs = VectorStore(tmp_path, DIMS)
    rows = _random_rows(2500, seed=1)
    vs.write("entities", [], rows)
    vs.maintain("entities")
    assert _vector_indexes(vs, "entities") == [("vector_sq_r2500", "IvfSq")]
    reader = vs.reader(vs.versions())
    asked: list[int] = []
    table = reader.tables["entities"]
    async_table = vectors_module._async_table(table)  # the table the reader queries
    real_query = async_table.query

    def query() -> object:  # the vector query's nprobes, as LanceDB is asked
        q = real_query()
        real_nearest = q.nearest_to

        def nearest_to(vector: object) -> object:
            vq = real_nearest(vector)
            real_nprobes = vq.nprobes

            def nprobes(n: int) -> object:
                asked.append(n)
                return real_nprobes(n)

            vq.nprobes = nprobes
            return vq

        q.nearest_to = nearest_to
        return q

    monkeypatch.setattr(async_table, "query", query)
    found = 0
    for r in rows[:50]:
        hits = _search(reader, "entities", vector=r.vector, text=None, k=5)
        found += bool(hits) and hits[0].id == r.id
    assert asked and set(asked) == {20}  # ~1 partition of 2,000 rows: at least 20
    # 60% of the ~2,000-row partitions: 10,000 articles' entities and text units
    assert (vectors_module.probes(397_514), vectors_module.probes(37_579)) == (120, 20)
    assert found >= 48  # each row is its own nearest neighbour


def test_an_old_or_outgrown_vector_index_is_replaced_by_tidy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An IVF_FLAT index (before IVF_SQ), or one trained on under a quarter of today's rows, is
    noted by `maintain` and trained anew by `tidy` once it has compacted the table (mid-run,
    LanceDB samples training rows one read at a time). Appended rows below that only join the
    index."""
    from lancedb.index import IvfFlat

    monkeypatch.setattr(vectors_module, "VECTOR_INDEX_MIN", 500)
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], _random_rows(600, seed=2))
    t = vs._table("text_units")
    assert t is not None
    t.create_index("vector", config=IvfFlat(distance_type="l2", num_partitions=16))

    def tidy() -> None:
        vs.tidy(vs.versions(), None, due=False, record=lambda v, name: None, retrain=vs.retrain)
        vs.retrain.clear()

    vs.maintain("text_units")
    assert vs.retrain == {"text_units"}
    assert _vector_indexes(vs, "text_units") == [("vector_idx", "IvfFlat")]  # not mid-run
    tidy()
    assert _vector_indexes(vs, "text_units") == [("vector_sq_r600", "IvfSq")]
    vs.write("text_units", [], _random_rows(1800, seed=3, start=600))  # 2,400 <= 4 x 600
    vs.maintain("text_units")
    assert not vs.retrain
    vs.write("text_units", [], _random_rows(100, seed=4, start=2400))  # 2,500 > 4 x 600
    vs.maintain("text_units")
    assert vs.retrain == {"text_units"}
    tidy()
    assert _vector_indexes(vs, "text_units") == [("vector_sq_r2500", "IvfSq")]
    probe = _random_rows(100, seed=4, start=2400)[7].vector
    assert _search(vs.reader(vs.versions()), "text_units", vector=probe, text=None,
                   k=3)[0].id == "r2407"


def test_tidy_rewrites_only_the_fragments_that_rows_were_deleted_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Deleted rows stay in their data file until it is rewritten; the writer notes which
    fragments it deleted from, and tidy rewrites those alone (a fragment holds one write's
    rows), then prunes: the cost follows the deletions, not the table."""
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(40)])  # first write: fragment 0
    vs.maintain("text_units")
    vs.write("text_units", [], [_row(i) for i in range(40, 50)])  # second write: fragment 1
    first = vs.versions()
    vs.tidy(first, None, due=True, record=lambda v, name: None)
    vs.scrub.clear()
    vs.write("text_units", ["u41", "u42"], [])
    assert vs.scrub == {"text_units": {1}}

    rewritten: list[list[int] | None] = []
    real = VectorStore._rewrite

    def spy(self: VectorStore, t: object, version: int, fragments: list[int] | None,
            stop: Callable[[], bool]) -> bool:
        rewritten.append(fragments)
        return real(self, t, version, fragments, stop)

    monkeypatch.setattr(VectorStore, "_rewrite", spy)
    committed = vs.versions()
    final = vs.tidy(committed, None, due=True, record=lambda v, name: None, scrub=vs.scrub)
    assert rewritten == [[1]]  # not the table: fragment 0 kept its rows and files
    t = vs._table("text_units")
    assert t.list_versions()[-1]["metadata"]["total_deletion_file_rows"] == "0"
    ids = {r["id"] for r in t.search().limit(None).select(["id"]).to_list()}
    assert ids == {f"u{i}" for i in range(50)} - {"u41", "u42"}
    hits = _search(vs.reader(final), "text_units", vector=None, text="passage number 47", k=3)
    assert "u47" in [h.id for h in hits]


def test_tidy_rewrites_a_table_whose_deleted_rows_nobody_noted(tmp_path: Path) -> None:
    """An index written before fragments were noted: the whole table is rewritten once."""
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(20)])
    vs.maintain("text_units")
    vs.write("text_units", ["u3"], [])
    vs.tidy(vs.versions(), None, due=True, record=lambda v, name: None, scrub=None)
    t = vs._table("text_units")
    assert t.list_versions()[-1]["metadata"]["total_deletion_file_rows"] == "0"
    assert t.count_rows() == 19


def test_rows_superseded_by_an_addition_are_not_rewritten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer that erases nothing (an update that only added text: `erase=False`) notes no
    fragment, so the periodic tidy rewrites nothing: the rows it replaced were derived from
    text that is still indexed, and rewriting the fragments they sit in would make a small
    addition cost the whole table. Searches never see the replaced rows."""
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(30)])
    vs.maintain("text_units")
    vs.tidy(vs.versions(), None, due=True, record=lambda v, name: None, scrub={})
    adder = VectorStore(tmp_path, DIMS, erase=False)
    adder.write("text_units", ["u4"], [_row(4), _row(30)])  # u4 re-derived, u30 added
    assert adder.scrub == {}
    monkeypatch.setattr(VectorStore, "_rewrite", lambda *a: pytest.fail("rewrote a fragment"))
    final = adder.tidy(adder.versions(), None, due=True, record=lambda v, name: None,
                       scrub=adder.scrub)
    ids = [h.id for h in _search(adder.reader(final), "text_units", vector=None,
                                                     text="passage number 4", k=40)]
    assert ids.count("u4") == 1 and "u30" in ids


def test_tidy_gives_way_between_tables_and_records_what_it_finished(tmp_path: Path) -> None:
    """`should_stop` (a writer is waiting) ends the tidy after the table in progress; each
    finished table was recorded on its own, the others keep their committed versions."""
    vs = VectorStore(tmp_path, DIMS)
    for name in ("entities", "text_units"):
        vs.write(name, [], [_row(i) for i in range(10)])
        vs.maintain(name)
        vs.write(name, ["u1"], [])
    committed = vs.versions()
    recorded: list[str] = []
    final = vs.tidy(committed, None, due=True, scrub=vs.scrub,
                    record=lambda v, name: recorded.append(name),
                    should_stop=lambda: bool(recorded))
    assert recorded == ["entities"]
    assert final["entities"] != committed["entities"]
    assert final["text_units"] == committed["text_units"]


def test_warm_loads_the_index_pages_a_first_search_would_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vectors_module, "VECTOR_INDEX_MIN", 200)
    writer = VectorStore(tmp_path, DIMS)
    writer.write("text_units", [], [_row(i) for i in range(300)])
    writer.maintain("text_units")
    versions = writer.versions()
    server = VectorStore(tmp_path, DIMS, cache_bytes=64 << 20)
    assert server.session is not None
    server.reader(versions)  # tables opened: their metadata is cached, no index page yet
    cold = server.session.size_bytes
    server.warm(versions)
    assert server.session.size_bytes > cold  # the full-text and vector indexes' pages
    hits = _search(server.reader(versions), "text_units", vector=_row(7).vector, text="topic2", k=3)
    assert hits  # a warmed store searches as before


def test_warm_leaves_a_missing_table_for_the_searches_to_report(tmp_path: Path) -> None:
    writer = VectorStore(tmp_path, DIMS)
    writer.write("text_units", [], [_row(i) for i in range(5)])
    versions = {**writer.versions(), "reports": 3}  # a committed table that is gone
    VectorStore(tmp_path, DIMS, cache_bytes=1 << 20).warm(versions)  # no exception


def test_calls_reading_two_generations_at_once_on_one_thread_each_keep_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls running side by side on one event loop read through one thread: a call of the
    older generation keeps its versions while a newer one reads, and table objects that fall
    idle are moved to the next generation instead of opened anew."""
    vs = VectorStore(tmp_path, DIMS)
    vs.write("text_units", [], [_row(i) for i in range(10)])
    vs.maintain("text_units")
    first = vs.versions()
    vs.write("text_units", ["u3"], [_row(3, text="rewritten passage about zebras")])
    second = vs.versions()
    vs.write("text_units", ["u4"], [_row(4, text="a passage about walruses")])
    third = vs.versions()
    server = VectorStore(tmp_path, DIMS)
    opened: list[str] = []
    real = server._committed
    monkeypatch.setattr(server, "_committed",
                        lambda name, version: opened.append(name) or real(name, version))

    def ids(reader: VectorReader, text: str) -> list[str]:
        return [h.id for h in _search(reader, "text_units", vector=None, text=text, k=5)]

    with server.reading(first) as old:
        with server.reading(second) as new, server.reading(second) as same:
            assert same is new  # one generation's calls share a reader
            assert ids(new, "zebras") == ["u3"]
            assert not ids(old, "zebras")  # the older call still reads its own versions
            assert old.tables["text_units"] is not new.tables["text_units"]
        assert not ids(old, "zebras")
        assert len(opened) == 2  # one table object per generation in flight
        with server.reading(third) as newest:  # the second generation's objects, moved
            assert ids(newest, "walruses") == ["u4"] and ids(newest, "zebras") == ["u3"]
            assert not ids(old, "walruses")
    assert len(opened) == 2
