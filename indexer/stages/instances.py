"""Extract entities, relationships and claims of the units that have no stored extraction.

Workers pull units a batch at a time from the generation being built, so memory holds the units
in flight, not the corpus. A provider that extracts in batches (`BatchExtractor`: the builtin
provider on a Ray cluster) is handed up to its batch size of queued units per call.

Each extraction is saved the moment it exists (canopy.store), so a crash or an outage never
loses LLM work. A unit whose extraction fails (invalid output after repair, a refused request,
an endpoint that stays unavailable for it, or a lost Ray batch) is recorded as a failure, stays
live, and is retried by the next run; the run goes on with the rest. Only when every unit
of the run failed because the endpoint is unreachable does the run stop, with that error.

The same thing at two depths: this stage writes extraction instances, canopy.store.instances
defines their rows.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from canopy.errors import EndpointUnavailable, ProviderError
from canopy.indexer.forecast import Forecast, sample_key
from canopy.indexer.stages.build import Build
from canopy.model import Extraction, TextUnit, UnitFailure
from canopy.providers.base import BatchExtractor
from canopy.providers.builtin import BuiltinProvider
from canopy.providers.builtin.processes import ProcessExtractor, extraction_processes
from canopy.store.sources import cache_sources

__all__ = ["ExtractOutcome", "extract_units"]

log = logging.getLogger(__name__)

_BATCH = 256
# Extractions per transaction with the builtin provider (cheap to redo: a crash loses at most
# these); an endpoint's are saved one by one, as each arrives. Each commit writes the instance
# tables' dirtied index pages again: 1,639 units' rows took 3.4 s of CPU and 12 s of wall in
# transactions of 16, 2.2 s and 6.5 s in transactions of 256.
_SAVE_EVERY = 256


@dataclass
class ExtractOutcome:
    extracted: list[str] = field(default_factory=list)
    failures: list[UnitFailure] = field(default_factory=list)


async def extract_units(b: Build, unit_ids: Iterable[str]) -> ExtractOutcome:
    """Extract these units (ids of units in the new generation), `concurrency` at a time."""
    # The estimate's sample order (canopy.indexer.forecast): its first units are the sample the
    # projection is made from, as soon as they are in.
    todo = sorted(set(unit_ids), key=sample_key)
    out = ExtractOutcome()
    forecast = None
    if b.on_plan is not None and b.settings.llm.enabled and todo:  # the builtin provider: no calls
        tokens: dict[str, int] = {}
        for start in range(0, len(todo), _BATCH * 16):
            tokens.update(b.reads.unit_tokens(todo[start:start + _BATCH * 16]))
        forecast = Forecast(todo, b.settings, b.provider.usage, b.on_plan, fresh=b.full,
                            tokens=tokens)
        forecast.start()
    advance = b.progress("extract", len(todo))
    x = b.settings.extract
    unavailable: list[EndpointUnavailable] = []
    done: list[Extraction] = []  # saved a few at a time (one transaction each)

    def record(unit: TextUnit, ex: Extraction | None, exc: ProviderError | None) -> None:
        if isinstance(exc, EndpointUnavailable):
            unavailable.append(exc)
        if exc is not None:  # invalid output after repair, or a refused request
            out.failures.append(UnitFailure(unit.id, "extract", str(exc)[:300]))
        elif ex is not None:
            done.append(ex)
            out.extracted.append(unit.id)
            if len(done) >= (1 if b.settings.llm.enabled else _SAVE_EVERY):
                b.store.save_extractions(done)
                done.clear()
        if not isinstance(exc, EndpointUnavailable):
            # A unit the endpoint never answered is not done (the next run retries it): the
            # progress must not read 100% before "the endpoint cannot be reached".
            advance(1)
        if forecast is not None:
            forecast.finished(unit.id, ex)

    async def one(unit: TextUnit) -> None:
        try:
            with cache_sources([unit.id]):  # its requests quote the unit's text
                ex = await b.provider.extract(unit, entity_types=x.entity_types, claims=x.claims,
                                              max_gleanings=x.max_gleanings)
        except ProviderError as exc:
            record(unit, None, exc)
        else:
            record(unit, ex, None)

    batcher: BatchExtractor | None = (b.provider if isinstance(b.provider, BatchExtractor)
                                      else None)
    if batcher is None and isinstance(b.provider, BuiltinProvider):
        processes = extraction_processes(x.processes, len(todo))
        if processes:
            batcher = ProcessExtractor(b.workers(processes), b.provider._count)  # noqa: SLF001

    async def several(units: list[TextUnit]) -> None:
        """One batch (a provider that extracts in batches: the builtin one on Ray)."""
        assert batcher is not None
        try:
            got = await batcher.extract_batch(units, entity_types=x.entity_types,
                                              claims=x.claims, max_gleanings=x.max_gleanings)
        except ProviderError as exc:  # the batch was lost: each unit is a failure, retried
            for unit in units:
                record(unit, None, exc)
        else:
            for unit, ex in zip(units, got, strict=True):
                record(unit, ex, None)

    queue: asyncio.Queue[TextUnit] = asyncio.Queue(maxsize=2 * _BATCH)

    async def feed() -> None:
        for start in range(0, len(todo), _BATCH):
            rows = b.reads.units(todo[start:start + _BATCH])
            for uid in todo[start:start + _BATCH]:
                if uid in rows:
                    await queue.put(rows[uid].unit)

    per_call = batcher.extract_batch_size if batcher is not None else 1

    async def work() -> None:
        while True:
            units = [await queue.get()]
            while len(units) < per_call and not queue.empty():
                units.append(queue.get_nowait())
            try:
                await (several(units) if batcher is not None else one(units[0]))
            finally:
                for _ in units:
                    queue.task_done()

    in_flight = batcher.extract_batches_in_flight if batcher is not None else b.concurrency
    workers = [asyncio.create_task(work()) for _ in range(max(1, in_flight))]
    try:
        await feed()
        await queue.join()
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        b.store.save_extractions(done)
    if todo and unavailable and len(unavailable) == len(todo):
        raise unavailable[0]  # nothing got through: say so instead of indexing nothing
    if unavailable:
        log.warning(
            "%d of %d extractions failed because the endpoint was unavailable; they are "
            "recorded in `canopy status` and retried by the next run",
            len(unavailable),
            len(todo),
        )
    return out
