"""Pre-building per-caller views (`canopy warm`): every view a caller would be served, built now
so that their first questions do not wait for provider calls.

The same thing at two depths: this is the engine call for one caller (`warm_views`);
canopy.server.cli.warm is the `canopy warm` command, which runs it for each principal it names.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from canopy.acl.access import State
from canopy.server.context import QueryContext

__all__ = ["KINDS", "warm_views"]

KINDS = ("report", "entity", "relationship")
_BATCH = 200


async def warm_views(ctx: QueryContext, kinds: Iterable[str] = KINDS) -> dict[str, Any]:
    """Build every view of these kinds the caller is served: how many were needed, how many were
    built now (the rest came from the cache), the provider calls it took, and the time."""
    reader = ctx.reader
    kinds = tuple(kinds)
    inventory = reader.inventory
    needed: dict[str, list[str]] = {k: [] for k in kinds}
    if not reader.trivial:
        if "entity" in kinds:
            ids = inventory.partly_readable("entities")
            needed["entity"] = [e for e, s in reader.entity_states(ids).items() if s == State.VIEW]
        if "relationship" in kinds:
            ids = inventory.partly_readable("relationships")
            needed["relationship"] = [r for r, s in reader.relationship_states(ids).items()
                                      if s == State.VIEW]
        if "report" in kinds:
            ids = inventory.community_ids()
            needed["report"] = [c for c, s in reader.community_states(ids).items()
                                if s == State.VIEW]
    out: dict[str, Any] = {f"{k}_views": len(needed[k]) for k in kinds}
    cache = reader.views.cache
    before = dict(cache.stats)
    started = time.perf_counter()
    fetch = {"entity": reader.entities, "relationship": reader.relationships,
             "report": reader.reports}
    for kind in kinds:
        ids = needed[kind]
        for start in range(0, len(ids), _BATCH):
            await fetch[kind](ids[start:start + _BATCH])
    out["built"] = {k.removeprefix("built_"): n - before.get(k, 0) for k, n in cache.stats.items()
                    if k.startswith("built_") and n - before.get(k, 0)}
    out["offline"] = cache.stats["provisional"] - before.get("provisional", 0)
    out["usage"] = {task: u.as_dict() for task, u in sorted(reader.view_usage.items())}
    out["seconds"] = round(time.perf_counter() - started, 3)
    return out
