"""Multi-hop evidence for local search: Personalized PageRank over the entity–unit graph
(HippoRAG, Gutiérrez et al. 2024 §2; HippoRAG 2, 2025), computed on demand from the store.

The graph joins each text unit to the entities it mentions (the extraction's instances). A
question's entities and its best lexical units are the seeds; a random walk that restarts at
the seeds with probability 1 - DAMPING ranks every unit it reaches. A unit that states the
second hop of a question ("the association that published the journal" -> its first president)
shares no word with the question's subject but shares an entity with the unit that names it,
so the walk reaches it in two steps.

Edges are weighted by the entity's specificity, idf = log(1 + units / units mentioning it)
(HippoRAG's node specificity): a unit passes most of its score to the rare names it mentions,
little to "United States". Entity seeds are weighted the same way.

Bounded work: the walk is the forward push of Andersen, Chung and Lang (2006). Only nodes whose
residual score is at least EPSILON times their degree are expanded, so the edges read are at
most 1 / ((1 - DAMPING) * EPSILON), whatever the size of the index; a hub entity is expanded
only when a large share of the score reaches it. Adjacency is read from the store in one batch
per round (canopy.store.reads: unit_mentions, mention_counts, mentioning_units), never the
whole graph.

The walk also scores the entities it passes through: the question's own and those its best
units lead to (the bridge of a two-hop question). local_search uses them to find entity pages,
units of documents titled by one of the best-scored entities (server/engines/evidence.py).

Permissions: every read is of units the caller may read (live ones, of readable ACL classes),
and every degree and idf counts those units only; seeds are units and entities the caller is
served. A hidden unit is neither a node nor part of a count, so it moves no score.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from canopy.acl.reader import CallerReader

__all__ = ["DAMPING", "EPSILON", "Propagation", "UnitGraph", "graph_evidence",
           "personalized_pagerank", "propagate", "specificity"]

DAMPING = 0.5  # HippoRAG's: follow an edge with this probability, else restart at the seeds
EPSILON = 2e-3  # push a node while its residual >= EPSILON * its degree
MAX_ROUNDS = 12  # pushes happen in rounds (one store read each); residual left is small
UNIT_SEED_SHARE = 0.5  # of the seed weight on units (the rest on the question's entities)


def specificity(mentions: int, units: int) -> float:
    """idf of an entity mentioned in `mentions` of `units` units."""
    return math.log(1 + units / max(1, mentions))


class UnitGraph:
    """The entity-unit graph of the units a caller may read, read from the store as needed
    and kept for one query."""

    def __init__(self, reader: CallerReader) -> None:
        self.reader = reader
        self.units = reader.term_stats([])[1]  # units the caller may read
        self.mentions: dict[str, list[str]] = {}  # unit -> entity keys
        self.counts: dict[str, int] = {}  # entity key -> units mentioning it
        self.mentioning: dict[str, list[str]] = {}  # entity key -> units

    def learn_units(self, units: list[str]) -> None:
        todo = [u for u in units if u not in self.mentions]
        if todo:
            self.mentions.update({u: [] for u in todo})
            self.mentions.update(self.reader.unit_mentions(todo))
            self.learn_counts({k for u in todo for k in self.mentions[u]})

    def learn_counts(self, keys: set[str]) -> None:
        todo = keys - self.counts.keys()
        if todo:
            got = self.reader.mention_counts(todo)
            self.counts.update({k: got.get(k, 0) for k in todo})

    def learn_entities(self, keys: list[str]) -> None:
        todo = [k for k in keys if k not in self.mentioning]
        if todo:
            self.mentioning.update({k: [] for k in todo})
            self.mentioning.update(self.reader.mentioning_units(todo))

    def edges(self, unit: str) -> dict[str, float]:
        """The unit's entities with the share of its score each receives (by specificity)."""
        weights = {k: specificity(self.counts[k], self.units) for k in self.mentions[unit]
                   if self.counts.get(k)}
        norm = sum(weights.values())
        return {k: w / norm for k, w in weights.items()}

    def degree(self, kind: str, node: str) -> int:
        return len(self.mentions[node]) if kind == "u" else self.counts.get(node, 0)

    def returning(self, unit: str) -> float:
        """Probability that two steps from `unit` lead back to it (through an entity it shares
        with fewer units, more)."""
        return sum(share / max(1, self.counts[k]) for k, share in self.edges(unit).items())


def personalized_pagerank(graph: UnitGraph, entity_seeds: dict[str, float],
                          unit_seeds: dict[str, float]) -> dict[str, float]:
    """PPR score of each unit reached from the seeds (entity keys and unit ids, weights >= 0,
    normalized together to sum 1)."""
    return _walk(graph, entity_seeds, unit_seeds)[0]


def _walk(graph: UnitGraph, entity_seeds: dict[str, float], unit_seeds: dict[str, float]
          ) -> tuple[dict[str, float], dict[str, float]]:
    """PPR scores of the units and of the entities reached from the seeds."""
    total = sum(entity_seeds.values()) + sum(unit_seeds.values())
    if total <= 0:
        return {}, {}
    # Nodes: ("e", key) or ("u", unit id).
    residual: dict[tuple[str, str], float] = defaultdict(float)
    for k, w in entity_seeds.items():
        if w > 0:
            residual[("e", k)] += w / total
    for u, w in unit_seeds.items():
        if w > 0:
            residual[("u", u)] += w / total
    score: dict[tuple[str, str], float] = defaultdict(float)
    graph.learn_counts({k for kind, k in residual if kind == "e"})
    for _ in range(MAX_ROUNDS):
        graph.learn_units([n for kind, n in residual if kind == "u"])
        active = [v for v, r in residual.items() if r >= EPSILON * max(1, graph.degree(*v))]
        if not active:
            break
        graph.learn_entities([n for kind, n in active if kind == "e"])
        pushed = {v: residual.pop(v) for v in active}
        for (kind, n), r in pushed.items():
            score[(kind, n)] += (1 - DAMPING) * r
            if kind == "u":
                for k, share in graph.edges(n).items():
                    residual[("e", k)] += DAMPING * r * share
            else:
                near = graph.mentioning[n]
                for u in near:
                    residual[("u", u)] += DAMPING * r / len(near)
    units = {n: s for (kind, n), s in score.items() if kind == "u"}
    entities = {n: s for (kind, n), s in score.items() if kind == "e"}
    for (kind, n), r in residual.items():  # what was not pushed still ranks its node
        into = units if kind == "u" else entities
        into[n] = into.get(n, 0.0) + (1 - DAMPING) * r
    return units, entities


@dataclass
class Propagation:
    """What the walk from a question reached, each score 0..1 (the best 1)."""

    units: dict[str, float] = field(default_factory=dict)  # graph evidence of each unit
    entities: dict[str, float] = field(default_factory=dict)  # PPR score of each entity key


def graph_evidence(reader: CallerReader, entities: list[str], unit_scores: dict[str, float]
                   ) -> dict[str, float]:
    """How strongly the graph leads from the question to each unit it reaches, 0..1 (the
    best 1): `propagate(...).units`."""
    return propagate(reader, entities, unit_scores).units


def propagate(reader: CallerReader, entities: list[str], unit_scores: dict[str, float]
              ) -> Propagation:
    """The walk from the question: each unit's graph evidence and each entity's PPR score.

    Seeds: the question's entities (keys), each weighted by its specificity, and the best units
    by their scores, the two halves of the seed weight (all of it on one when the other is
    empty). What a seed unit gets back from its own seed weight (its restart share, and the
    walk's returns through its own entities every two steps) is left out: a seed's score already
    says that it matches the question; its graph evidence says what else leads to it."""
    graph = UnitGraph(reader)
    graph.learn_counts(set(entities))
    entity_seeds = {k: specificity(graph.counts[k], graph.units) for k in entities
                    if graph.counts.get(k)}
    unit_seeds = {u: w for u, w in unit_scores.items() if w > 0}
    e_total, u_total = sum(entity_seeds.values()), sum(unit_seeds.values())
    if e_total and u_total:
        entity_seeds = {k: w * (1 - UNIT_SEED_SHARE) / e_total for k, w in entity_seeds.items()}
        unit_seeds = {u: w * UNIT_SEED_SHARE / u_total for u, w in unit_seeds.items()}
    total = sum(entity_seeds.values()) + sum(unit_seeds.values())
    if total <= 0:
        return Propagation()
    ppr, reached = _walk(graph, entity_seeds, unit_seeds)
    best_entity = max(reached.values(), default=0.0)
    entity_scores = ({k: v / best_entity for k, v in reached.items()} if best_entity > 0
                     else {})
    # Restart share plus the returns through its own entities, every two steps: a geometric
    # series in DAMPING**2 * the two-step return probability.
    own = {u: (1 - DAMPING) * w / total / (1 - DAMPING * DAMPING * graph.returning(u))
           for u, w in unit_seeds.items()}
    evidence = {u: v - own.get(u, 0.0) for u, v in ppr.items()}
    top = max(evidence.values(), default=0.0)
    if top <= 1e-12:
        return Propagation({}, entity_scores)
    return Propagation({u: g / top for u, g in evidence.items() if g > 1e-9 * top},
                       entity_scores)
