"""Provenance-gated visibility (design §2): the one rule every tool, resource and CLI query obeys.

> An artifact is served to a caller only if every text unit it was derived from is live (in the
> committed generation) and readable by that caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from acl.policy import Policy, Principal
from canopy.model import Document, TextUnit
from canopy.vectors import acl_class

__all__ = ["Visibility", "is_servable", "visibility_for"]


@dataclass(frozen=True)
class Visibility:
    principal: Principal
    readable_units: frozenset[str]
    hidden_acl: tuple[str, ...]  # ACL classes the caller may not read: retrieval prefilters on them
    readable_docs: frozenset[str]

    def can_see(self, unit_ids: Iterable[str]) -> bool:
        return is_servable(unit_ids, self.readable_units)

    @property
    def everything(self) -> bool:
        return not self.hidden_acl


def is_servable(unit_ids: Iterable[str], readable_units: frozenset[str]) -> bool:
    """True when the artifact has provenance and all of it is live and readable."""
    ids = list(unit_ids)
    return bool(ids) and all(u in readable_units for u in ids)


def visibility_for(
    principal: Principal, policy: Policy, documents: dict[str, Document], units: dict[str, TextUnit]
) -> Visibility:
    docs = frozenset(d.id for d in documents.values() if policy.readable(d.labels, principal))
    classes = {acl_class(d.labels): d.id in docs for d in documents.values()}
    hidden = tuple(sorted(c for c, ok in classes.items() if not ok))
    readable = frozenset(u.id for u in units.values() if u.document_id in docs)
    return Visibility(principal, readable, hidden, docs)
