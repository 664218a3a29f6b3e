"""What a build that calls an LLM will do, said up front and projected from its first extractions.

A long build used to show only per-stage progress: 800 extraction calls, then 9,997 summaries
nobody expected. So the extraction stage reports two things to the caller's `PlanSink`:
- an `ExtractionPlan` before the first request: the units to extract and the calls they imply
  (one extraction each, plus one to `max_gleanings` gleaning passes: gleaning stops early when a
  pass adds nothing). These numbers are what the stage will request, not a guess;
- a `Projection` once the first units are in (`checkpoint`): the tasks that follow extraction,
  measured on the sample and scaled to every unit, and the time left at the request rate so far.
  Summaries: one call per entity or relationship with several distinct descriptions (below that
  the provider writes none). Reports: one per community of the sample graph, clustered as the
  build clusters it. Neither grows linearly (entities recur across documents), so each is
  measured on the first half of the sample and on all of it and extrapolated by tokens along
  the power law through the two (`extrapolate`).
The sample is `canopy index --estimate`'s: the same units (the first by `sample_key`, which the
extraction stage feeds first), as many (`DEFAULT_SAMPLE`, all of a smaller build) and the same
extrapolation, so the build's projection and the estimate agree. A smaller sample read 2.4 times
the real count: a power law through 4 and 8 units is mostly noise, clamped at its steepest.
The projection assumes a build from an empty graph: on an update, summaries and reports also
depend on the committed graph, so the caller labels it as the rough number it is.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from canopy.aliases import alias_candidates
from canopy.ids import entity_id
from canopy.indexer.operations.clustering import (
    ClusterParams,
    EdgeArrays,
    Isolated,
    build_hierarchy,
)
from canopy.indexer.operations.grouping import top_size
from canopy.model import Extraction
from canopy.providers.base import Usage
from canopy.providers.llm_provider import joined_fits
from canopy.settings import Settings
from canopy.store.instances import extraction_rows
from canopy.tokenizer import get_tokenizer

__all__ = ["DEFAULT_SAMPLE", "ExtractionPlan", "Forecast", "PlanEvent", "PlanSink",
           "Projection", "checkpoint", "extrapolate", "sample_key"]

# Text units `canopy index --estimate` builds by default, and the units the build's projection
# waits for (all of them in a smaller build).
DEFAULT_SAMPLE = 40


def sample_key(unit_id: str) -> str:
    """The order samples are drawn in: a hash of the unit's id (itself a content hash), so a
    sample is spread over the documents, the same on every run, and stable when unrelated
    documents are added."""
    return hashlib.sha256(unit_id.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ExtractionPlan:
    """The calls extraction will request: known before the first one."""

    units: int
    max_gleanings: int
    model: str

    @property
    def extract_calls(self) -> int:
        return self.units

    @property
    def glean_calls(self) -> tuple[int, int]:
        """Fewest and most gleaning calls: the first pass always runs, later ones only while
        the previous pass found something new (canopy.providers.llm_provider)."""
        return (self.units if self.max_gleanings else 0), self.units * self.max_gleanings


@dataclass(frozen=True)
class Projection:
    """The whole build's calls by task, projected from the first `sample_units` extractions."""

    sample_units: int
    units: int
    calls: dict[str, int]  # extract, glean, summarize, report: projected for the whole build
    calls_made: int  # requests sent so far (cache hits excluded)
    rate: float  # requests per second so far
    elapsed_s: float
    fresh: bool  # a build from an empty graph (else an update: see the module doc)

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    @property
    def eta_s(self) -> float | None:
        """Seconds of extraction (and gleaning) left at the rate so far; None before any
        request went out. Only the stage being measured is timed: summary and report calls
        differ too much from extraction calls in size (short summaries, long reports) for its
        pace to time them (on the example corpus it said 48 s for a 6 s build)."""
        if self.rate <= 0:
            return None
        extraction = sum(self.calls.get(t, 0) for t in ("extract", "glean", "resolve"))
        return max(0, extraction - self.calls_made) / self.rate


PlanEvent = ExtractionPlan | Projection
PlanSink = Callable[[PlanEvent], None]


def checkpoint(units: int) -> int:
    """After how many extracted units the projection is made: the estimate's sample."""
    return min(units, DEFAULT_SAMPLE)


def extrapolate(q_small: float, t_small: float, q: float, t: float, t_total: float) -> float:
    """`q` (measured on size `t`; `q_small` on `t_small`) at size `t_total`, along the power law
    through the two samples (exponent clamped to [0.5, 2]; linear when there is no growth to
    fit)."""
    if q <= 0:
        return 0.0
    alpha = 1.0
    if q_small > 0 and t > t_small > 0:
        alpha = min(2.0, max(0.5, math.log(q / q_small) / math.log(t / t_small)))
    return q * (t_total / t) ** alpha


class Forecast:
    """Fed each finished unit by the extraction stage; tells `sink` the plan at `start()` and
    the projection once the first `checkpoint(units)` units (in feed order) are done."""

    def __init__(self, units: Sequence[str], settings: Settings,
                 usage: Callable[[], dict[str, Usage]], sink: PlanSink, *, fresh: bool = True,
                 tokens: dict[str, int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`units` in feed order (the stage feeds them by `sample_key`); `tokens`: each unit's
        token count (None: every unit counts one, as in the tests)."""
        self.units = len(units)
        self._tokens = tokens
        self.settings = settings
        self.fresh = fresh
        self._usage = usage
        self._sink = sink
        self._clock = clock
        # The sample is the first units in the order the stage feeds them (ids: hashes, so
        # spread over the documents), not the first to finish: the projection is then the same
        # on every run with a deterministic model.
        self._order = {uid: i for i, uid in enumerate(units[:checkpoint(len(units))])}
        self._all = list(units)
        self._sample: dict[str, Extraction | None] = {}
        self._said = False
        self._began = clock()
        self._before: dict[str, int] = {}

    def start(self) -> None:
        self._began = self._clock()
        self._before = _calls(self._usage())  # the rate counts this stage's requests only
        self._sink(ExtractionPlan(self.units, self.settings.extract.max_gleanings,
                                  self.settings.llm.model))

    def finished(self, unit_id: str, extraction: Extraction | None) -> None:
        """A unit is done: its extraction, or None when it failed."""
        if unit_id not in self._order or self._said:
            return
        self._sample[unit_id] = extraction
        if len(self._sample) == len(self._order):
            self._said = True
            if sum(ex is not None for ex in self._sample.values()) >= 2:
                self._sink(self.project())

    def project(self) -> Projection:
        """The projection from the sample so far (all of it, once `finished` said it)."""
        sample = [ex for uid, ex in sorted(self._sample.items(), key=lambda kv: self._order[kv[0]])
                  if ex is not None]
        k = len(sample)
        half = sample[:k // 2]
        n = self.units
        gleanings = sum(ex.passes - 1 for ex in sample)  # passes: extraction + gleanings
        # a unit whose names leave pairs open asks one confirmation (LLMProvider.extract)
        resolving = sum(bool(alias_candidates((e.name, e.type) for e in ex.entities))
                        for ex in sample)
        calls = {"extract": n, "glean": round(gleanings * n / max(1, k)),
                 "resolve": round(resolving * n / max(1, k))}
        size = self._size
        t_half, t_sample = size(ex.unit_id for ex in half), size(ex.unit_id for ex in sample)
        t_total = size(self._all)
        for task, measure in (("summarize", self._summaries), ("report", self._reports)):
            calls[task] = round(extrapolate(measure(half), t_half, measure(sample), t_sample,
                                            t_total))
        now = _calls(self._usage())
        sent = sum(c - self._before.get(t, 0) for t, c in now.items())
        elapsed = self._clock() - self._began
        return Projection(k, n, calls, sent, sent / elapsed if elapsed > 0 else 0.0, elapsed,
                          self.fresh)

    def _size(self, unit_ids: Iterable[str]) -> int:
        """Tokens of these units (units, without token counts)."""
        if self._tokens is None:
            return sum(1 for _ in unit_ids)
        return sum(self._tokens.get(u, 0) for u in unit_ids)

    def _summaries(self, sample: Sequence[Extraction]) -> int:
        if not self.settings.llm.enabled:
            return summaries(sample)
        tok = get_tokenizer(self.settings.chunking.encoding)
        budget = self.settings.extract.summary_max_tokens
        return summaries(sample, lambda descs: joined_fits(descs, tok, budget))

    def _reports(self, sample: Sequence[Extraction]) -> int:
        c = self.settings.communities
        # The top level bounded and grouped as a build of the sample alone would (the
        # estimate's sample build: each unit its own document); unbounded, the count ran 30%
        # over the estimate's on the example corpus.
        top = top_size(len(sample), c.max_cluster_size, c.max_top_level)
        return communities(sample, ClusterParams(c.max_cluster_size, c.seed, c.max_levels, top))


def _calls(usage: dict[str, Usage]) -> dict[str, int]:
    return {task: u.calls for task, u in usage.items()}


def summaries(sample: Sequence[Extraction],
              fits: Callable[[list[str]], bool] | None = None) -> int:
    """Summary calls the merge of these extractions makes: one per entity (by merge key, as
    the instance rows key it: canopy.store.instances) and per relationship with more than one
    distinct description, unless `fits` says its descriptions stand as they are (an LLM
    provider's `joined_fits`)."""
    entities: dict[str, dict[str, None]] = defaultdict(dict)
    relations: dict[str, dict[str, None]] = defaultdict(dict)
    for ex in sample:
        rows = extraction_rows(ex)
        for _unit, _pos, key, _name, _type, description, _unit_key in rows.entities:
            if description:
                entities[key][description.strip()] = None
        for _unit, _pos, rid, _a, _b, description, *_ in rows.relationships:
            if description:
                relations[rid][description.strip()] = None
    return sum(len(d) > 1 and not (fits and fits(list(d)))
               for d in (*entities.values(), *relations.values()))


def communities(sample: Sequence[Extraction], params: ClusterParams) -> int:
    """Communities (so reports) of the graph these extractions make, clustered the build's way:
    hierarchical Leiden over the relationships, entities without any joining the entities they
    share a unit with."""
    weights: dict[tuple[str, str], float] = defaultdict(float)
    in_unit: dict[str, list[str]] = {}
    for ex in sample:
        in_unit[ex.unit_id] = list(dict.fromkeys(entity_id(e.name) for e in ex.entities))
        for r in ex.relationships:
            a, b = sorted((entity_id(r.source), entity_id(r.target)))
            if a != b:
                weights[a, b] += float(r.strength)
    edges = EdgeArrays((a, b, w) for (a, b), w in sorted(weights.items()))
    connected = set(edges.names)
    alone: dict[str, list[str]] = defaultdict(list)
    first: dict[str, str] = {}
    for uid, ids in sorted(in_unit.items()):
        for eid in ids:
            if eid not in connected:
                alone[eid].extend(n for n in ids if n in connected)
                first.setdefault(eid, uid)
    units_of: dict[str, set[str]] = defaultdict(set)
    for uid, ids in in_unit.items():
        for eid in ids:
            units_of[eid].add(uid)
    for ex in sample:
        for r in ex.relationships:
            for name in (r.source, r.target):
                units_of[entity_id(name)].add(ex.unit_id)

    def sources() -> dict[str, tuple[list[str], list[str]]]:
        return {e: (sorted(us), sorted(us)) for e, us in units_of.items()}

    hierarchy = build_hierarchy(edges, Isolated(dict(alone), first), params, sources=sources)
    return len(hierarchy.placements)
