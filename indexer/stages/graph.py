"""Entities, relationships and claims of the new generation, re-merged where instances changed.

Only entities and relationships with an instance in a changed unit (added, removed, relabelled or
re-extracted) are merged again, plus those a revocation left stale; every other row is the
committed one. A relationship instance needs both endpoints in its unit, so every entity whose
degree changes has an instance in a changed unit too: degrees are counted with the merge, from
the instances. Rows equal to the committed ones are not rewritten, so later stages see exactly
what changed (`GraphDelta`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from canopy.ids import content_hash, entity_id
from canopy.indexer.descriptions import BatchDescriber, Pending, describe
from canopy.indexer.operations.merging import (
    EntityDraft,
    RelationshipDraft,
    entity_row,
    merge_entities,
    merge_relationships,
    relationship_row,
)
from canopy.indexer.stages.build import Build
from canopy.model import Claim
from canopy.providers.builtin import BuiltinProvider
from canopy.providers.builtin.processes import summary_processes
from canopy.store import ClaimRow, EntityRow, Gate, RelationshipRow
from canopy.tasks import side_by_side

__all__ = ["GraphDelta", "stage_graph"]

_BATCH = 2000
# Batches whose summaries are awaited together: most elements need no summary now (their
# descriptions fit the budget joined), so one batch at a time left the window nearly empty and
# paid a round of endpoint latency per batch (30 articles at 500 ms: a wave per 2,000 rows).
_BATCHES_IN_FLIGHT = 4
_T = TypeVar("_T")
# a batch merged, with its committed rows and descriptions: (keys, drafts, [degrees,] before, ...)
# ..., and the drafts whose rows are still to be written (those that waited for a summary)
_EntityBatch = tuple[list[str], dict[str, EntityDraft], dict[str, int], dict[str, EntityRow],
                     dict[str, str], dict[str, EntityDraft]]
_RelationshipBatch = tuple[list[str], dict[str, RelationshipDraft], dict[str, RelationshipRow],
                           dict[str, str], dict[str, RelationshipDraft]]


@dataclass
class GraphDelta:
    """What the new generation's graph changed (full builds: everything is new)."""

    entities: set[str] = field(default_factory=set)  # written: new or changed rows
    removed_entities: set[str] = field(default_factory=set)
    new_entities: set[str] = field(default_factory=set)  # absent from the committed generation
    relationships: set[str] = field(default_factory=set)  # written
    removed_relationships: set[str] = field(default_factory=set)
    changed_edges: set[tuple[str, str]] = field(default_factory=set)  # endpoints, weight changed
    claim_subjects: set[str] = field(default_factory=set)  # entities whose claims changed


def _streams(b: Build) -> bool:
    """Whether the merge works while the summary requests run: the rows that need no summary
    are written (`describe(settled=...)`) and the report contexts' element sizes counted. So
    with an endpoint, whose requests wait on the network. The builtin provider's summaries are
    computed in the writer, with no waiting (`in_process`): there each batch's rows are written
    in one go, as merged (a 609-article build's merge took 14.3 s in slices of 250 and 11.6 s
    so, one run each side by side), and the reports count only the elements they read (a
    relationship whose ends are in two leaf communities under a parent written from its
    children's reports alone is never counted)."""
    return not b.computes_here


def _describer(b: Build, elements: int) -> BatchDescriber | None:
    """The builtin provider's summaries over the run's worker processes, for a merge of many
    elements: the summaries then run beside the merging of the next batches (four at a time:
    `_overlapped`) instead of in the writer."""
    if not isinstance(b.provider, BuiltinProvider):
        return None
    processes = summary_processes(b.settings.extract.processes, elements)
    return b.provider.describer(b.workers(processes)) if processes else None


def _slices(items: list[_T], size: int = 250) -> Iterator[list[_T]]:
    """Rows written between two turns of the event loop (a few milliseconds of writes)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _batches(items: list[str]) -> Iterator[list[str]]:
    size = _BATCH
    for i in range(0, len(items), size):
        yield items[i:i + size]


async def _overlapped(items: list[str], merged: Callable[[list[str]], Awaitable[_T]],
                      stage: Callable[[_T], None]) -> None:
    """`stage(await merged(batch))` for every batch, with up to `_BATCHES_IN_FLIGHT` batches'
    `merged` running at once (their summary requests share the window); staged in batch order."""
    pending: deque[asyncio.Task[_T]] = deque()
    try:
        for batch in _batches(items):
            pending.append(asyncio.ensure_future(merged(batch)))
            if len(pending) >= _BATCHES_IN_FLIGHT:
                stage(await pending.popleft())
        while pending:
            stage(await pending.popleft())
    finally:
        for task in pending:
            task.cancel()


async def stage_graph(b: Build, changed_units: Iterable[str], *, keys: Iterable[str] = (),
                      rids: Iterable[str] = ()) -> GraphDelta:
    """Merge and stage what `changed_units` (and stale rows) touch, and the entities `keys`
    and relationships `rids` (those rekeyed instances had: canopy.indexer.stages.resolve);
    everything in a full build."""
    delta = GraphDelta()
    changed_units = sorted(set(changed_units))
    if b.full:
        b.store.element_tokens_clear()  # counted afresh as rows are written: gone ones go too
        keys, rids = b.reads.instance_keys_of_units()
    else:
        extra_keys, extra_rids = set(keys), set(rids)
        keys, rids = b.store.instance_keys(changed_units)
        keys |= extra_keys
        rids |= extra_rids
        committed = b.committed
        keys |= {r.key for r in committed.entities(committed.stale_ids("entities")).values()}
        rids |= set(committed.stale_ids("relationships"))
    # Every entity and relationship the change touches is merged; only those with several
    # distinct descriptions cost a summary call, so the stage counts what it merges (a count
    # named "summarize" read as thousands of calls the build never made).
    advance = b.progress("merge", len(keys) + len(rids))
    # Entities and relationships are merged and summarised side by side (one wave of summary
    # requests, not two: issue 35); a relationship's summary prompt names its endpoints, which
    # the entity merge decides before any entity summary returns.
    names = _Names(b)
    describer = _describer(b, len(keys) + len(rids))
    await side_by_side([_stage_entities(b, sorted(keys), delta, advance, names, describer),
                        _stage_relationships(b, sorted(rids), delta, advance, names, describer)])
    _stage_claims(b, changed_units, delta)
    return delta


class _Names:
    """Display names of the entities this merge writes, known once every entity batch is
    merged (before their summaries), with the staged rows' names for the other entities."""

    def __init__(self, b: Build) -> None:
        self.b = b
        self._merged: dict[str, str] = {}
        self._done = asyncio.Event()

    def merged(self, drafts: Iterable[EntityDraft]) -> None:
        self._merged.update((d.id, d.name) for d in drafts)

    def all_merged(self) -> None:
        self._done.set()

    async def of(self, ids: set[str]) -> dict[str, str]:
        await self._done.wait()
        out = {i: self._merged[i] for i in ids if i in self._merged}
        out.update(self.b.reads.entity_names(ids - out.keys()))
        return out


async def _stage_entities(b: Build, keys: list[str], delta: GraphDelta,
                          advance: Callable[[int], None], names: _Names,
                          describer: BatchDescriber | None) -> None:
    x = b.settings.extract
    batches = -(-len(keys) // _BATCH)
    if not batches:
        names.all_merged()

    def put(drafts: Iterable[EntityDraft], degrees: dict[str, int],
            before: dict[str, EntityRow], descriptions: dict[str, str]) -> None:
        rows = []
        sizes: dict[str, int] = {}  # of the rows written, for the reports (and later updates)
        counting = _streams(b)  # the report contexts' sizes, while summaries are asked
        for d in drafts:
            old = before.get(d.id)
            row = entity_row(d, descriptions[d.id], degrees.get(d.key, 0))
            if old is None or old.values() != row.values():
                rows.append(row.values())
                delta.entities.add(d.id)
                if counting:
                    sizes[f"{b.tok.name}:{row.hash}"] = b.sizes.entity(row.entity)
            if old is None:
                delta.new_entities.add(d.id)
        b.staging.put("entities", rows)
        b.store.element_tokens_put(sizes)

    async def merged(batch: list[str]) -> _EntityBatch:
        nonlocal batches
        drafts = merge_entities(b.reads.entity_instances(batch))
        names.merged(drafts.values())
        batches -= 1
        if not batches:
            names.all_merged()
        degrees = b.reads.instance_degrees(batch)
        ids = {entity_id(k) for k in batch}
        before = {} if b.full else b.committed.entities(ids)
        early: set[str] = set()

        async def settled(known: dict[str, str]) -> None:  # written while summaries are asked
            early.update(known)
            for part in _slices([d for d in drafts.values() if d.id in known]):
                put(part, degrees, before, known)
                await asyncio.sleep(0)  # the summary requests go out meanwhile

        descriptions = await describe(
            {d.id: Pending(d.name, d.descriptions, tuple(u for u, _ in d.unit_acl))
             for d in drafts.values()},
            b.provider, b.tok, max_tokens=x.summary_max_tokens, memo=b.memo,
            concurrency=b.concurrency, settled=settled if _streams(b) else None,
            batch=describer)
        later = {k: d for k, d in drafts.items() if d.id not in early}
        return batch, drafts, degrees, before, descriptions, later

    def stage(done: _EntityBatch) -> None:
        batch, drafts, degrees, before, descriptions, later = done
        put(later.values(), degrees, before, descriptions)
        gone = {i for i in before if i not in {d.id for d in drafts.values()}}
        b.staging.delete("entities", gone)
        delta.removed_entities |= gone
        advance(len(batch))

    await _overlapped(keys, merged, stage)


async def _stage_relationships(b: Build, rids: list[str], delta: GraphDelta,
                               advance: Callable[[int], None], entity_names: _Names,
                               describer: BatchDescriber | None) -> None:
    x = b.settings.extract

    def put(drafts: Iterable[RelationshipDraft], before: dict[str, RelationshipRow],
            descriptions: dict[str, str]) -> None:
        rows = []
        sizes: dict[str, int] = {}  # of the rows written, for the reports (and later updates)
        counting = _streams(b)  # the report contexts' sizes, while summaries are asked
        for d in drafts:
            old = before.get(d.id)
            row = relationship_row(d, descriptions[d.id])
            if old is None or old.values() != row.values():
                rows.append(row.values())
                delta.relationships.add(d.id)
                if counting:
                    sizes[f"{b.tok.name}:{row.hash}"] = b.sizes.relationship(row.relationship)
                if old is None or old.relationship.weight != d.weight:
                    delta.changed_edges.add((d.source, d.target))
        b.staging.put("relationships", rows)
        b.store.element_tokens_put(sizes)

    async def merged(batch: list[str]) -> _RelationshipBatch:
        drafts = merge_relationships(b.reads.relationship_instances(batch))
        before = {} if b.full else b.committed.relationships(batch)
        names = await entity_names.of({e for d in drafts.values() for e in (d.source, d.target)})
        early: set[str] = set()

        async def settled(known: dict[str, str]) -> None:  # written while summaries are asked
            early.update(known)
            for part in _slices([d for d in drafts.values() if d.id in known]):
                put(part, before, known)
                await asyncio.sleep(0)  # the summary requests go out meanwhile

        descriptions = await describe(
            {d.id: Pending(f"{names.get(d.source, '')} -- {names.get(d.target, '')}",
                           d.descriptions, tuple(u for u, _ in d.unit_acl))
             for d in drafts.values()},
            b.provider, b.tok, max_tokens=x.summary_max_tokens, memo=b.memo,
            concurrency=b.concurrency, settled=settled if _streams(b) else None,
            batch=describer)
        later = {k: d for k, d in drafts.items() if d.id not in early}
        return batch, drafts, before, descriptions, later

    def stage(done: _RelationshipBatch) -> None:
        batch, drafts, before, descriptions, later = done
        put(later.values(), before, descriptions)
        gone = [rid for rid in before if rid not in drafts]
        b.staging.delete("relationships", gone)
        for rid in gone:
            r = before[rid].relationship
            delta.changed_edges.add((r.source, r.target))
        delta.removed_relationships |= set(gone)
        advance(len(batch))

    await _overlapped(rids, merged, stage)


def _stage_claims(b: Build, changed_units: list[str], delta: GraphDelta) -> None:
    """Claims are per unit: those of changed units are rewritten, those of removed units go."""
    if b.full:
        units = b.reads.keys("text_units")
    else:
        units = changed_units
        old = b.committed.claim_ids_of_units(units)
        b.staging.delete("claims", old)
        delta.claim_subjects |= {c.claim.subject for c in b.committed.claims(old).values()}
    for batch in _batches(units):
        live = b.reads.unit_acl(batch)
        instances = b.store.claim_instances(u for u in batch if u in live)
        if not instances:
            continue
        keys_by_unit = b.store.entity_keys_by_unit(batch)
        rows = []
        for uid, _, subject, obj, kind, status, description, start, end, quote in instances:
            cid = "cl-" + content_hash(uid, subject, obj, kind, description)
            obj_id = entity_id(obj) if obj and obj in keys_by_unit.get(uid, ()) else ""
            claim = Claim(cid, entity_id(subject), obj_id, kind, status, description, (uid,),
                          start, end, quote)
            # Reports are regenerated when a member's claim hash changes; a claim without a
            # period or quote hashes as before they existed, so migrated indexes stay current.
            extra = (start, end, quote) if start or end or quote else ()
            rows.append(ClaimRow(claim, Gate(frozenset({live[uid]}), "", False),
                                 content_hash(cid, status, *extra)).values())
            delta.claim_subjects.add(claim.subject)
        b.staging.put("claims", rows)

