"""Name keys are memoized while a build runs, and only then (canopy.ids.memoized_names). Memoized
for the life of a process, the keys of every word run of every question filled the memo to its
bound in a server: tens of MB that a soak read as growth (benchmarks/soak.py)."""

from __future__ import annotations

import threading
from pathlib import Path

from canopy import ids
from canopy.ids import entity_key, fold_key, memoized_names, normalize_name
from canopy.server.api import Index


def _held() -> int:
    return ids._key_words.cache_info().currsize + ids._normalized_name.cache_info().currsize


def test_keys_are_memoized_inside_a_build_and_forgotten_when_the_last_one_ends() -> None:
    assert _held() == 0
    with memoized_names():
        fold_key("Helio Cells, Ltd.")
        with memoized_names():  # a watcher's build beside another
            normalize_name("Zürich")
        assert _held() >= 2  # the inner end keeps the outer build's memo
        assert ids._key_words.cache_info().hits == 0
        fold_key("Helio Cells, Ltd.")
        assert ids._key_words.cache_info().hits == 1
    assert _held() == 0
    assert fold_key("Helio Cells, Ltd.") == "heliocells" and _held() == 0
    assert entity_key("Helio Cells, Ltd.") == "heliocellsltd" and _held() == 0


def test_builds_on_two_threads_share_one_count() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with memoized_names():
            entity_key("Ada Lovelace")
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    entered.wait(10)
    with memoized_names():
        pass  # ends while the other build runs: its memo stays
    assert _held() > 0
    release.set()
    t.join()
    assert _held() == 0


def test_a_served_index_keeps_no_keys_of_its_questions(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Harbor\n\nAda Lovelace met Charles Babbage in London. "
                               "Babbage showed Lovelace the Difference Engine.\n")
    canopy = Index.open(docs, index_dir=tmp_path / "idx")
    canopy.update()
    assert _held() == 0  # the build's memo is gone with it
    for i in range(20):
        canopy.local_search(f"What did Ada Lovelace see in London in year {1830 + i}?")
    assert _held() == 0
