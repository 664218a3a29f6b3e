"""The order reports are written in: bottom-up (Edge et al. 2024 §2.1.5), so a parent's context
can substitute its children's reports, in chunks of at most `max_communities` communities and
`max_members` members (one community larger than that is a chunk of its own), so memory follows
the largest community, not the corpus.

`report_plan` orders by height, not level: a community is written once the communities under it
that are being rewritten are (a leaf at level 0 goes with the deepest leaves), and each chunk
names the earlier chunks it waits for, so a scheduler can start a chunk the moment those are
done instead of waiting for a whole level."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

__all__ = ["ReportChunk", "by_member_budget", "levels_deepest_first", "report_batches",
           "report_plan"]


def levels_deepest_first(ids_by_level: Mapping[int, set[str]]) -> list[tuple[int, list[str]]]:
    """Each level's communities, by id, deepest level first."""
    return [(level, sorted(ids_by_level[level])) for level in sorted(ids_by_level, reverse=True)]


def report_batches(ids: list[str], max_communities: int) -> Iterator[list[str]]:
    """`ids` in order, cut into batches of at most `max_communities`."""
    for start in range(0, len(ids), max_communities):
        yield ids[start:start + max_communities]


def by_member_budget(ids: list[str], members: Mapping[str, int],
                     max_members: int) -> Iterator[list[str]]:
    """`ids` in order, cut where the next community would take a chunk past `max_members`
    members (`members`: each community's member count; a missing one counts 0)."""
    chunk: list[str] = []
    total = 0
    for cid in ids:
        n = members.get(cid, 0)
        if chunk and total + n > max_members:
            yield chunk
            chunk, total = [], 0
        chunk.append(cid)
        total += n
    if chunk:
        yield chunk


@dataclass(frozen=True)
class ReportChunk:
    """Communities written together, after the chunks `after` (indices into the plan) that hold
    a child of one of them."""

    ids: tuple[str, ...]
    after: tuple[int, ...]
    height: int  # 0: none of its communities has a child being rewritten


def report_plan(ids_by_level: Mapping[int, set[str]], parent: Mapping[str, str | None],
                members: Mapping[str, int], max_communities: int,
                max_members: int) -> list[ReportChunk]:
    """The chunks to write `ids_by_level`'s communities in, lowest height first (by level,
    deepest first, then id within a height), each after the chunks holding its communities'
    children among them. `parent`: each community's parent (None at the top); children not
    being rewritten keep their committed reports and are waited for by nobody."""
    height: dict[str, int] = {}
    for _level, ids in levels_deepest_first(ids_by_level):  # children are one level deeper
        for cid in ids:
            height.setdefault(cid, 0)
            up = parent.get(cid)
            if up is not None:
                height[up] = max(height.get(up, 0), height[cid] + 1)
    level = {cid: lv for lv, ids in ids_by_level.items() for cid in ids}
    height = {cid: h for cid, h in height.items() if cid in level}
    kids: dict[str, list[str]] = {}
    for cid in level:
        up = parent.get(cid)
        if up is not None:
            kids.setdefault(up, []).append(cid)
    by_height: dict[int, list[str]] = {}
    for cid, h in height.items():
        by_height.setdefault(h, []).append(cid)
    plan: list[ReportChunk] = []
    chunk_of: dict[str, int] = {}
    for h in sorted(by_height):
        ids = sorted(by_height[h], key=lambda c: (-level[c], c))
        for part in report_batches(ids, max_communities):
            for chunk in by_member_budget(part, members, max_members):
                after = sorted({chunk_of[k] for cid in chunk for k in kids.get(cid, ())})
                plan.append(ReportChunk(tuple(chunk), tuple(after), h))
                for cid in chunk:
                    chunk_of[cid] = len(plan) - 1
    return plan
