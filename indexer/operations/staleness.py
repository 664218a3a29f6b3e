"""Which communities an update recomputes, and what becomes of each one's report (design §4).

A community is recomputed when
- the hierarchy step placed it anew (members or parent changed, or it is new) or moved its root
  aggregates (`CommunityChange.placed`);
- one of its members was rewritten or had its claims change (`entities`);
- a relationship with both ends in it was written, reweighted or removed (`edges`: its ends, by
  their communities in the new generation);
- a revocation left it stale, or its report failed before (`stale`, `retry`);
- or a child of it is recomputed: a child's fingerprint is part of its parent's, so every
  ancestor of a recomputed community is recomputed too, up to the root.
A fresh clustering (or a full build) recomputes every community (`everything`).

A recomputed community's report is then kept when its fingerprint is the committed one, reused
from whichever committed community had that fingerprint (a renumbered community), or written.

Pure: the stage reads the members' chains (entity -> level -> community) and the lineage of the
communities it names (canopy.store.GraphReads.community_lineage) and passes them in.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

__all__ = [
    "CommunityChange",
    "Lineage",
    "ReportFate",
    "communities_touched",
    "report_fate",
    "stale_communities",
    "with_ancestors",
]


@dataclass(frozen=True)
class Lineage:
    """Where a community stands: its level and its parent (None at the top)."""

    level: int
    parent: str | None


@dataclass(frozen=True)
class CommunityChange:
    """What an update changed, as the rule reads it."""

    placed: frozenset[str] = frozenset()  # communities the hierarchy step wrote or re-aggregated
    entities: frozenset[str] = frozenset()  # members rewritten, or whose claims changed
    edges: frozenset[tuple[str, str]] = frozenset()  # ends of relationships written or removed
    stale: frozenset[str] = frozenset()  # left stale by a revocation
    retry: frozenset[str] = frozenset()  # whose report failed before
    everything: bool = False  # a full build or a fresh clustering


def communities_touched(change: CommunityChange,
                        chains: Mapping[str, Mapping[int, str]]) -> set[str]:
    """The communities the change touches directly (before their ancestors are added).
    `chains`: each entity of `change.entities` and each end of `change.edges` -> its community at
    every level in the new generation (a removed entity has none: the communities it left are
    in `placed`)."""
    out = set(change.placed) | set(change.stale) | set(change.retry)
    for e in change.entities:
        out.update(chains.get(e, {}).values())
    for s, t in change.edges:
        cs, ct = chains.get(s, {}), chains.get(t, {})
        out.update(c for level, c in cs.items() if ct.get(level) == c)
    return out


def with_ancestors(ids: Iterable[str], lineage: Mapping[str, Lineage]) -> dict[int, set[str]]:
    """`ids` and every ancestor of theirs, by level; a community the lineage does not hold (no
    longer in the new generation) is dropped."""
    out: dict[int, set[str]] = defaultdict(set)
    seen: set[str] = set()
    todo = [i for i in ids if i in lineage]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        node = lineage[cid]
        out[node.level].add(cid)
        if node.parent is not None and node.parent in lineage:
            todo.append(node.parent)
    return dict(out)


def stale_communities(change: CommunityChange, chains: Mapping[str, Mapping[int, str]],
                      lineage: Mapping[str, Lineage]) -> dict[int, set[str]]:
    """The communities to recompute, by level (see the module docstring). With
    `change.everything`, `lineage` must hold every community of the new generation."""
    if change.everything:
        return with_ancestors(lineage, lineage)
    return with_ancestors(communities_touched(change, chains), lineage)


class ReportFate(Enum):
    """What a recomputed community's report becomes."""

    KEEP = "keep"  # the committed report stands (its ACL classes refreshed)
    REUSE = "reuse"  # a committed report with this fingerprint, renumbered to this community
    WRITE = "write"  # a new report


def report_fate(fingerprint: str, committed: str | None,
                reusable: Container[str]) -> ReportFate:
    """`committed`: the fingerprint of this community's committed report (None: it has none);
    `reusable`: fingerprints of committed reports anywhere in the index."""
    if committed == fingerprint:
        return ReportFate.KEEP
    if fingerprint in reusable:
        return ReportFate.REUSE
    return ReportFate.WRITE
