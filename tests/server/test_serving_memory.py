"""A serving process's memory under updates (issue 30's soak): what a generation leaves in the
caches is released once a newer one is served, or held within a budget that is soon reached;
and the opt-in diagnostics report that shows it."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import pytest

import canopy.vectors
from canopy.llm.loops import PerLoop
from canopy.server.context import BoundedCache, EngineCaches
from canopy.server.diagnostics import cache_report, memory_report
from canopy.server.engines import basic_search, local_search
from canopy.server.engines.budget import tokenizer
from canopy.server.engines.evidence import excerpt, unit_evidence
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService, _CallLoops
from canopy.vectors import VectorRow, VectorStore


def _cached_units(svc: CanopyService) -> set[str]:
    return {key[0] for key in svc.caches.unit_evidence.keys()}


def test_a_newer_generation_drops_the_analyses_of_units_it_no_longer_has(
        example_docs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = open_workspace(example_docs, tmp_path / "index")
    build_index(ws)
    svc = CanopyService(ws)
    try:
        for q in ("Who supplies the cranes?", "What did the research team find?"):
            asyncio.run(svc.run(None, lambda c, q=q: local_search(c, q)))
            asyncio.run(svc.run(None, lambda c, q=q: basic_search(c, q, k=5)))
        cached = _cached_units(svc)
        with svc.store.snapshot() as snap:
            paths = {uid: doc.path for uid, (_, doc) in snap.unit_documents(cached).items()}
        assert len(set(paths.values())) >= 2, paths  # analyses of units of several documents
        gone = sorted(set(paths.values()))[0]
        (example_docs / gone).unlink()
        build_index(open_workspace(example_docs, tmp_path / "index"))
        before = svc.caches.unit_evidence.size
        trims: list[bool] = []
        monkeypatch.setattr("canopy.server.service.release_free", lambda: trims.append(True))

        with svc.context(None):  # the first call of the new generation
            pass
        with svc.context(None):  # and a second one
            pass

        assert trims == [True]  # malloc's free memory handed back once, at the first

        left = _cached_units(svc)
        dead = {uid for uid, path in paths.items() if path == gone}
        assert dead and not left & dead  # the deleted document's analyses are released
        assert left == cached - dead  # the live units' analyses stay
        assert svc.caches.unit_evidence.size < before
        assert svc.caches.unit_evidence.size == sum(
            svc.caches.unit_evidence._items[k][1] for k in svc.caches.unit_evidence.keys())
    finally:
        svc.close()


def test_engine_caches_retire_each_generation_once_and_never_an_older_one() -> None:
    caches = EngineCaches.within(1 << 20)
    for uid in ("a", "b", "c"):
        caches.unit_evidence.put((uid, "h"), uid, 100)
    asked: list[list[str]] = []

    def live(ids: list[str]) -> list[str]:
        asked.append(ids)
        return [i for i in ids if i != "b"]

    assert caches.retire(2, live) == 100
    assert {k[0] for k in caches.unit_evidence.keys()} == {"a", "c"}
    assert caches.unit_evidence.size == 200
    assert caches.retire(2, live) is None and caches.retire(1, live) is None  # once; not back
    assert asked == [["a", "b", "c"]]


def test_bytes_added_to_a_cached_value_count_against_the_budget() -> None:
    cache = BoundedCache(1000)
    for key in ("a", "b", "c"):
        cache.put(key, key, 300)
    cache.grow("a", 200)  # "a" is now the most recent, and the budget is passed
    assert cache.keys() == ["c", "a"] and cache.size == 800
    cache.grow("gone", 10_000)  # not held: nothing counted
    assert cache.size == 800 == sum(cache._items[k][1] for k in cache.keys())


def test_an_excerpt_counts_the_sentences_it_adds_to_the_units_analysis(
        examples_service: CanopyService) -> None:
    """The sentences and their token counts an excerpt adds to a cached unit analysis are in the
    cache's bytes: they were not, and a server's analyses outgrew what their budget said."""
    with examples_service.context(None) as ctx:
        ctx.caches = EngineCaches.within(32 << 20)
        long_units = [(u, d) for batch in ctx.reader.iter_units() for u, d in batch
                      if tokenizer().count(u.text) > 300]
        assert long_units
        unit, doc = long_units[0]
        stored = ctx.reader.sentence_terms([unit.id]).get(unit.id, "")
        unit_evidence(ctx, unit, doc, stored)  # as ranking analyses it: no sentence strings
        cache = ctx.caches.unit_evidence
        (key,) = cache.keys()
        before = cache._items[key][1]
        assert cache._items[key][0].sentences is None
        cut = excerpt(ctx, unit, doc, "Who leads the project?", 80)
        ev, size = cache._items[key]
        assert cut != unit.text and ev.sentences and ev.sentence_tokens
        assert size >= before + len(unit.text) + len(ev.sentences) * 60
        assert cache.size == size
        excerpt(ctx, unit, doc, "What does it cost?", 80)  # the second excerpt adds nothing
        assert cache._items[key][1] == size


def _rows(n: int, step: int) -> list[VectorRow]:
    rng = np.random.default_rng(step)
    return [VectorRow(f"r{step}_{i}", f"word{i % 50} other{step} text", f"h{step}_{i}",
                      rng.random(8, dtype=np.float32), (0,)) for i in range(n)]


def test_readers_moving_through_many_versions_keep_lancedb_metadata_within_its_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Each version's manifest and deletion files enter LanceDB's metadata cache and nothing
    # evicts a retired version's; uncapped (a quarter of these 8 MB), 60 versions of this table
    # held ~1.8 MB of them.
    monkeypatch.setattr(canopy.vectors, "METADATA_CACHE_MAX", 128 << 10)
    writer = VectorStore(tmp_path, 8)
    writer.write("text_units", [], _rows(3000, 0))
    writer.maintain("text_units")
    served = VectorStore(tmp_path, 8, cache_bytes=8 << 20)
    assert served.session is not None
    query = np.full(8, 0.5, dtype=np.float32)
    for step in range(1, 61):
        writer.write("text_units", [f"r0_{step}"], _rows(5, step))
        with served.reading(writer.versions()) as reader:
            asyncio.run(reader.search("text_units", vector=query, text="word3", k=5))
    assert served.session.size_bytes < 1 << 20


def test_the_diagnostics_report_counts_the_caches_and_the_readers(
        examples_index: Path) -> None:
    from tests.conftest import EXAMPLES

    svc = CanopyService(open_workspace(EXAMPLES, examples_index))
    try:
        asyncio.run(svc.run(None, lambda c: local_search(c, "Who supplies the cranes?")))
        caches = cache_report(svc)
        assert caches["unit_evidence"]["entries"] == svc.caches.unit_evidence.entries > 0
        assert caches["unit_evidence"]["bytes"] == svc.caches.unit_evidence.size
        assert caches["lance_session"]["bytes"] > 0
        report = memory_report(svc, objects=True)
        assert report["vector_sets"]["sets"] >= 1 and report["vector_sets"]["users"] == 0
        assert report["watched"].get("canopy.store.store.Store", 0) >= 1  # objects=1 only
        assert "watched" not in memory_report(svc)
        assert report["by_type"]
    finally:
        svc.close()


def test_closing_the_call_loops_closes_what_each_loop_opened() -> None:
    # PerLoop closes a loop's HTTP session (aiohttp's) when the loop finalises its async
    # generators; call loops closed without that left sessions "unclosed" at exit.
    closed = threading.Event()

    async def close(_: object) -> None:
        closed.set()

    sessions = PerLoop(object, close)
    lanes = _CallLoops(2, 4, "test-call")

    async def calls() -> None:
        await asyncio.gather(*(lanes.run(sessions.get) for _ in range(2)))

    asyncio.run(calls())
    lanes.close()
    assert closed.wait(10)


MALLOC_INFO = """<malloc version="1">
<heap nr="0">
<sizes>
  <size from="33" to="48" total="480" count="10"/>
  <size from="3985" to="4080" total="4000" count="1"/>
  <size from="65537" to="131072" total="100000" count="1"/>
  <unsorted from="8193" to="8193" total="8193" count="1"/>
</sizes>
<total type="fast" count="10" size="480"/>
<total type="rest" count="3" size="1160000"/>
<system type="current" size="4194304"/>
<system type="max" size="4194304"/>
</heap>
<heap nr="1">
<sizes>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="1" size="1048576"/>
<system type="current" size="67108864"/>
<system type="max" size="67108864"/>
<aspace type="subheaps" size="1"/>
</heap>
<total type="fast" count="10" size="480"/>
<total type="rest" count="4" size="2208576"/>
<total type="mmap" count="2" size="2097152"/>
<system type="current" size="71303168"/>
</malloc>
"""


def test_malloc_info_is_read_per_arena_with_the_free_space_a_trim_cannot_return() -> None:
    from canopy.server.diagnostics import parse_malloc_info

    parsed = parse_malloc_info(MALLOC_INFO)
    assert parsed["mmap_mb"] == 2.0
    main, other = parsed["arenas"]
    assert (main["nr"], main["system_mb"], main["free_chunks"]) == (0, 4.0, 13)
    assert main["free_mb"] == round((480 + 1_160_000) / 2**20, 1)
    # chunks smaller than a page share their pages with chunks in use: a trim keeps them
    assert main["small_free_mb"] == round((480 + 4000) / 2**20, 2)
    assert (other["nr"], other["system_mb"], other["free_mb"]) == (1, 64.0, 1.0)


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc's")
def test_the_diagnostics_report_has_each_malloc_arena() -> None:
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("malloc_info is glibc's")
    arenas = memory_report(None)["malloc_arenas"]
    assert [a["nr"] for a in arenas["arenas"]][:1] == [0]
    assert all(a["system_mb"] >= a["free_mb"] >= 0 for a in arenas["arenas"])
    assert arenas["heaps_rss_mb"] is not None and arenas["mmap_mb"] >= 0


PYMALLOC_STATS = """Small block threshold = 512, in 32 size classes.

class   size   num pools   blocks in use  avail blocks
-----   ----   ---------   -------------  ------------
    0     16           1             254             1

# arenas allocated total           =                   30
# arenas reclaimed                 =                    4
# arenas highwater mark            =                   28
# arenas allocated current         =                   26
26 arenas * 1048576 bytes/arena    =           27,262,976

# bytes in allocated blocks        =           20,971,520
# bytes in available blocks        =            1,048,576
10 unused pools * 16384 bytes      =              163,840
# bytes lost to pool headers       =               78,528
Total                              =           27,262,976

arena map counts
# arena map mid nodes              =                    1
Total                              =              655,360
"""


def test_pymalloc_totals_are_read_from_its_report() -> None:
    from canopy.server.diagnostics import parse_pymalloc_stats, pymalloc_mb

    assert parse_pymalloc_stats(PYMALLOC_STATS) == {
        "arenas_highwater": 28, "arenas": 26, "arenas_mb": 26.0, "allocated_mb": 20.0,
        "available_mb": 1.0, "unused_pools_mb": 0.2}
    live = pymalloc_mb()  # {} under PYTHONMALLOC=malloc
    assert not live or live["arenas_mb"] >= live["allocated_mb"] > 0
