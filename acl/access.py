"""What an artifact is for a caller: absent, a view of its readable part, or itself (design §2).

> An artifact is served to a caller only if every text unit it was derived from is live and
> readable by that caller.

Decided from the artifact's provenance gate (canopy.store.Gate: the ACL classes of its source
units, and whether a revocation left it stale) without reading its sources, except for stale
artifacts, whose live units are looked up.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum

from canopy.store import Gate

__all__ = ["State", "community_state", "state"]


class State(IntEnum):
    NONE = 0  # does not exist for the caller (exactly like a missing id)
    VIEW = 1  # served as a view derived from the caller's readable live units
    FULL = 2  # the canonical artifact is served


def state(gate: Gate, readable: frozenset[int], live_readable: Callable[[], bool]) -> State:
    """State of an entity, relationship or claim; `live_readable()` answers, for a stale
    artifact, whether any of its source units is still live and readable."""
    if not gate.stale:
        if gate.acl <= readable:
            return State.FULL
        return State.NONE if gate.acl.isdisjoint(readable) else State.VIEW
    return State.VIEW if live_readable() else State.NONE


def community_state(community: Gate, report: Gate | None, fresh: bool, readable: frozenset[int],
                    any_member: Callable[[], bool]) -> State:
    """FULL: its report is current and readable; VIEW: a report is re-derived from its visible
    part; NONE: no member exists for the caller, or its report is missing while nothing of it is
    hidden (there is nothing to route around). `fresh`: the report's fingerprint is the
    community's; `any_member()`: some member exists for the caller (stale communities)."""
    if fresh and report is not None and report.readable_by(readable) and not community.stale:
        return State.FULL
    if not community.stale:
        if community.acl.isdisjoint(readable):
            return State.NONE
        if not fresh and community.acl <= readable:
            return State.NONE
        return State.VIEW
    return State.VIEW if any_member() else State.NONE
