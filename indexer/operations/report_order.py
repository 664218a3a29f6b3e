"""The order reports are written in: bottom-up (Edge et al. 2024 §2.1.5), deepest level first,
so a parent's context can substitute its children's reports; within a level by id, in chunks of
at most `max_communities` communities and `max_members` members (one community larger than that
is a chunk of its own), so memory follows the largest community, not the corpus."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

__all__ = ["by_member_budget", "levels_deepest_first", "report_batches"]


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
