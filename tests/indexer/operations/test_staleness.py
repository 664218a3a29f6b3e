"""Which communities an update recomputes (canopy.indexer.operations.staleness), case by case on
one small hierarchy, and what becomes of each recomputed community's report.

The hierarchy (level: community [members], parent):

    0: R1 [a b c d e x]            0: R2 [f g]   (childless)
    1: A [a b] < R1                1: B [c d e] < R1   (x is in R1 only)
    2: B1 [c d] < B                2: B2 [e] < B
"""

from __future__ import annotations

import pytest

from canopy.indexer.operations.staleness import (
    CommunityChange,
    Lineage,
    ReportFate,
    communities_touched,
    report_fate,
    stale_communities,
    with_ancestors,
)

LINEAGE = {
    "R1": Lineage(0, None), "R2": Lineage(0, None),
    "A": Lineage(1, "R1"), "B": Lineage(1, "R1"),
    "B1": Lineage(2, "B"), "B2": Lineage(2, "B"),
}
CHAINS = {
    "a": {0: "R1", 1: "A"}, "b": {0: "R1", 1: "A"},
    "c": {0: "R1", 1: "B", 2: "B1"}, "d": {0: "R1", 1: "B", 2: "B1"},
    "e": {0: "R1", 1: "B", 2: "B2"},
    "x": {0: "R1"},
    "f": {0: "R2"}, "g": {0: "R2"},
}

# After e is deleted: the hierarchy step emptied B2 (deleted) and rewrote B.
AFTER_DELETION = {k: v for k, v in LINEAGE.items() if k != "B2"}
CHAINS_AFTER_DELETION = {k: v for k, v in CHAINS.items() if k != "e"}
# After h is added under R2, which gains a child N [h] (R2 is rewritten, N is new).
AFTER_ADDITION = {**LINEAGE, "N": Lineage(1, "R2")}
CHAINS_AFTER_ADDITION = {**CHAINS, "h": {0: "R2", 1: "N"}}
# After a new leaf B3 is split off under B (only B3 is placed: B keeps its members).
AFTER_SPLIT = {**LINEAGE, "B3": Lineage(2, "B")}


def edges(*pairs: str) -> frozenset[tuple[str, str]]:
    return frozenset((p[0], p[1]) for p in pairs)


CASES = [
    # (name, change, chains, lineage, expected by level)
    ("no change", CommunityChange(), CHAINS, LINEAGE, {}),
    ("an edit of a member of a deepest leaf recomputes the leaf and every ancestor",
     CommunityChange(entities=frozenset({"c"})), CHAINS, LINEAGE,
     {2: {"B1"}, 1: {"B"}, 0: {"R1"}}),
    ("an edit of a member of a level-1 leaf recomputes it and its root",
     CommunityChange(entities=frozenset({"a"})), CHAINS, LINEAGE, {1: {"A"}, 0: {"R1"}}),
    ("an edit of an entity only the parent holds recomputes the parent alone",
     CommunityChange(entities=frozenset({"x"})), CHAINS, LINEAGE, {0: {"R1"}}),
    ("an edit in a childless root recomputes that root alone",
     CommunityChange(entities=frozenset({"f"})), CHAINS, LINEAGE, {0: {"R2"}}),
    ("a relationship inside a leaf recomputes the leaf and its ancestors",
     CommunityChange(edges=edges("cd")), CHAINS, LINEAGE, {2: {"B1"}, 1: {"B"}, 0: {"R1"}}),
    ("a relationship between two leaves recomputes their common ancestors only",
     CommunityChange(edges=edges("ce")), CHAINS, LINEAGE, {1: {"B"}, 0: {"R1"}}),
    ("a relationship across subtrees recomputes the root they share",
     CommunityChange(edges=edges("ac")), CHAINS, LINEAGE, {0: {"R1"}}),
    ("a relationship between two roots recomputes neither",
     CommunityChange(edges=edges("af")), CHAINS, LINEAGE, {}),
    ("a deletion: the rewritten parent and its root; the deleted leaf is gone",
     CommunityChange(placed=frozenset({"B", "B2"})), CHAINS_AFTER_DELETION, AFTER_DELETION,
     {1: {"B"}, 0: {"R1"}}),
    ("a removed entity has no chain: it names no community by itself",
     CommunityChange(entities=frozenset({"e"})), CHAINS_AFTER_DELETION, AFTER_DELETION, {}),
    ("an addition creating a new community recomputes it and its rewritten parent",
     CommunityChange(placed=frozenset({"N", "R2"}), entities=frozenset({"h"})),
     CHAINS_AFTER_ADDITION, AFTER_ADDITION, {1: {"N"}, 0: {"R2"}}),
    ("a new leaf alone recomputes its ancestors too (their fingerprints hold its own)",
     CommunityChange(placed=frozenset({"B3"})), CHAINS, AFTER_SPLIT,
     {2: {"B3"}, 1: {"B"}, 0: {"R1"}}),
    ("a relabel-only change: the communities the revocation left stale, and their ancestors",
     CommunityChange(stale=frozenset({"B1"})), CHAINS, LINEAGE,
     {2: {"B1"}, 1: {"B"}, 0: {"R1"}}),
    ("a report that failed before is retried with its ancestors",
     CommunityChange(retry=frozenset({"B2"})), CHAINS, LINEAGE,
     {2: {"B2"}, 1: {"B"}, 0: {"R1"}}),
    ("root aggregates that moved recompute that root",
     CommunityChange(placed=frozenset({"R2"})), CHAINS, LINEAGE, {0: {"R2"}}),
    ("a stale community the new generation no longer has is dropped",
     CommunityChange(stale=frozenset({"gone"})), CHAINS, LINEAGE, {}),
    ("edits in two subtrees recompute both paths to the top",
     CommunityChange(entities=frozenset({"e", "g"})), CHAINS, LINEAGE,
     {2: {"B2"}, 1: {"B"}, 0: {"R1", "R2"}}),
    ("a fresh clustering or a full build recomputes every community",
     CommunityChange(everything=True), {}, LINEAGE,
     {0: {"R1", "R2"}, 1: {"A", "B"}, 2: {"B1", "B2"}}),
]


@pytest.mark.parametrize(("change", "chains", "lineage", "expected"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_stale_community_rule(change: CommunityChange, chains: dict[str, dict[int, str]],
                                  lineage: dict[str, Lineage],
                                  expected: dict[int, set[str]]) -> None:
    assert stale_communities(change, chains, lineage) == expected


@pytest.mark.parametrize(("change", "chains", "lineage"), [c[1:4] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_every_recomputed_community_has_its_parent_recomputed(
        change: CommunityChange, chains: dict[str, dict[int, str]],
        lineage: dict[str, Lineage]) -> None:
    """A parent's fingerprint holds its children's: a recomputed child under a parent that is
    not recomputed would leave the parent's report describing the child's old content."""
    out = {cid for ids in stale_communities(change, chains, lineage).values() for cid in ids}
    for cid in out:
        parent = lineage[cid].parent
        assert parent is None or parent in out, (cid, parent)


def test_the_touched_communities_are_those_named_before_their_ancestors() -> None:
    """The stage reads the lineage of what the change touches: this set, not its ancestors."""
    change = CommunityChange(entities=frozenset({"c"}), edges=edges("ce"),
                             stale=frozenset({"A"}))
    assert communities_touched(change, CHAINS) == {"B1", "B", "R1", "A"}


def test_with_ancestors_walks_past_what_the_seeds_name() -> None:
    assert with_ancestors(["B2"], LINEAGE) == {2: {"B2"}, 1: {"B"}, 0: {"R1"}}
    assert with_ancestors([], LINEAGE) == {}


FATES = [
    ("the committed report's fingerprint: kept", "fp1", "fp1", set(), ReportFate.KEEP),
    ("kept even when another community had it too", "fp1", "fp1", {"fp1"}, ReportFate.KEEP),
    ("another community's committed report: reused", "fp1", "fp0", {"fp1"}, ReportFate.REUSE),
    ("a new community with a known fingerprint: reused", "fp1", None, {"fp1"},
     ReportFate.REUSE),
    ("changed and nowhere else: written", "fp1", "fp0", {"fp2"}, ReportFate.WRITE),
    ("a new community with a new fingerprint: written", "fp1", None, set(), ReportFate.WRITE),
]


@pytest.mark.parametrize(("fingerprint", "committed", "reusable", "fate"),
                         [f[1:] for f in FATES], ids=[f[0] for f in FATES])
def test_the_fate_of_a_recomputed_report(fingerprint: str, committed: str | None,
                                         reusable: set[str], fate: ReportFate) -> None:
    assert report_fate(fingerprint, committed, reusable) is fate
