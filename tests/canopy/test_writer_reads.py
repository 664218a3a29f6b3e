"""The store reads the writer's stages ask for (canopy.store.GraphReads), on the examples' index:
what each returns is what the stage's rule is given."""

from __future__ import annotations

from pathlib import Path

from canopy.store import Store


def test_the_lineage_of_a_deepest_community_reaches_its_root(examples_index: Path) -> None:
    """The stale-community rule walks up what this returns: every ancestor must be there."""
    store = Store(examples_index)
    try:
        with store.snapshot() as reads:
            levels = reads.community_levels()
            deepest = max(levels, key=lambda cid: (levels[cid], cid))
            assert levels[deepest] >= 1  # the examples have a hierarchy
            lineage = reads.community_lineage([deepest])
            chain = [deepest]
            while lineage[chain[-1]].parent is not None:
                chain.append(lineage[chain[-1]].parent)
            assert set(lineage) == set(chain)
            assert [lineage[c].level for c in chain] == list(range(levels[deepest], -1, -1))
            assert reads.community_lineage([]) == {}
    finally:
        store.close()


def test_generation_wide_reads_agree_with_the_row_reads(examples_index: Path) -> None:
    store = Store(examples_index)
    try:
        with store.snapshot() as reads:
            ids = reads.keys("communities")
            assert ids == sorted(ids) == reads.community_ids()
            assert set(reads.community_levels()) == set(ids)
            by_level = reads.all_memberships()
            members = reads.members(ids)
            assert {cid: set(ms) for level in by_level.values() for cid, ms in level.items()} == {
                cid: set(ms) for cid, ms in members.items()}
            assert reads.keys("reports") == sorted(reads.reports(ids))
            lonely = reads.unrelated_entity_ids()
            assert all(row.entity.degree == 0 for row in reads.entities(lonely).values())
    finally:
        store.close()
