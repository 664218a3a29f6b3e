"""Who is asking, and which ACL classes (label sets) of text units they may read (design §2, §5).

A caller's identity comes from the transport (canopy.server.mcp_app); this module turns it into the
set of ACL classes the policy lets them read. Every decision about what they are served is made
against that set (canopy.acl.access), and retrieval prefilters on its complement.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from canopy.acl.policy import Policy, Principal

__all__ = ["Caller", "caller_for"]


@dataclass(frozen=True)
class Caller:
    principal: Principal
    readable: frozenset[int]  # ACL classes whose units the caller may read
    hidden: frozenset[int]  # every other ACL class of the index: search prefilters on these

    @property
    def reads_everything(self) -> bool:
        return not self.hidden


def caller_for(principal: Principal, policy: Policy,
               classes: Mapping[int, tuple[str, ...]]) -> Caller:
    """The caller's readable classes among the index's (`classes`: id -> labels)."""
    readable = frozenset(c for c, labels in classes.items() if policy.readable(labels, principal))
    return Caller(principal, readable, frozenset(classes) - readable)
