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

Permissions: every read is of units the caller may read (live ones, of readable ACL classes),
and every degree and idf counts those units only; seeds are units and entities the caller is
served. A hidden unit is neither a node nor part of a count, so it moves no score.
"""

from __future__ import annotations

import math
from collections import defaultdict

from acl.reader import CallerReader

__all__ = ["DAMPING", "EPSILON", "graph_evidence", "personalized_pagerank", "specificity"]

DAMPING = 0.5  # HippoRAG's: follow an edge with this probability, else restart at the seeds
EPSILON = 1e-3  # push a node while its residual >= EPSILON * its degree
MAX_ROUNDS = 12  # pushes happen in rounds (one store read each); residual left is small


UNIT_SEED_SHARE = 0.5  # of the seed weight on units (the rest on the question's entities)


def graph_evidence(reader: CallerReader, entities: list[str], unit_scores: dict[str, float]
                   ) -> dict[str, float]:
    """How strongly the graph links each unit it reaches to the question, 0..1 (the best 1).

    Seeds: the question's entities (keys), each weighted by its specificity, and the best units
    by their scores, the two halves of the seed weight (all of it on one when the other is
    empty). A unit's own restart share is left out: a seed's score says it matches the
    question, its graph evidence says what else leads to it."""
    units = reader.term_stats([])[1]
    counts = reader.mention_counts(entities)
    entity_seeds = {k: specificity(counts[k], units) for k in entities if k in counts}
    unit_seeds = {u: w for u, w in unit_scores.items() if w > 0}
    e_total, u_total = sum(entity_seeds.values()), sum(unit_seeds.values())
    if e_total and u_total:
        entity_seeds = {k: w * (1 - UNIT_SEED_SHARE) / e_total for k, w in entity_seeds.items()}
        unit_seeds = {u: w * UNIT_SEED_SHARE / u_total for u, w in unit_seeds.items()}
    total = sum(entity_seeds.values()) + sum(unit_seeds.values())
    if total <= 0:
        return {}
    ppr = personalized_pagerank(reader, entity_seeds, unit_seeds, units=units)
    graph = {u: v - (1 - DAMPING) * unit_seeds.get(u, 0.0) / total for u, v in ppr.items()}
    top = max(graph.values(), default=0.0)
    if top <= 1e-12:
        return {}
    return {u: g / top for u, g in graph.items() if g > 1e-12 * top}


def specificity(mentions: int, units: int) -> float:
    """idf of an entity mentioned in `mentions` of `units` units."""
    return math.log(1 + units / max(1, mentions))


def personalized_pagerank(reader: CallerReader, entity_seeds: dict[str, float],
                          unit_seeds: dict[str, float], *, units: int
                          ) -> dict[str, float]:
    """PPR score of each unit reached from the seeds (entity keys and unit ids, each weight
    >= 0; the two are normalized together to sum 1). `units`: how many units the caller may
    read (for idf)."""
    total = sum(entity_seeds.values()) + sum(unit_seeds.values())
    if total <= 0:
        return {}
    # Nodes: ("e", key) or ("u", unit id).
    residual: dict[tuple[str, str], float] = defaultdict(float)
    for k, w in entity_seeds.items():
        if w > 0:
            residual[("e", k)] += w / total
    for u, w in unit_seeds.items():
        if w > 0:
            residual[("u", u)] += w / total
    score: dict[tuple[str, str], float] = defaultdict(float)
    mentions: dict[str, list[str]] = {}  # unit -> entity keys
    counts: dict[str, int] = {}  # entity key -> units mentioning it
    mentioning: dict[str, list[str]] = {}  # entity key -> units

    def learn_counts(keys: set[str]) -> None:
        todo = keys - counts.keys()
        if todo:
            got = reader.mention_counts(todo)
            counts.update({k: got.get(k, 0) for k in todo})

    learn_counts({k for kind, k in residual if kind == "e"})
    for _ in range(MAX_ROUNDS):
        unit_todo = [n for kind, n in residual if kind == "u" and n not in mentions]
        if unit_todo:
            mentions.update({u: [] for u in unit_todo})
            mentions.update(reader.unit_mentions(unit_todo))
            learn_counts({k for u in unit_todo for k in mentions[u]})

        def degree(node: tuple[str, str]) -> int:
            kind, n = node
            return len(mentions[n]) if kind == "u" else counts.get(n, 0)

        active = [v for v, r in residual.items() if r >= EPSILON * max(1, degree(v))]
        if not active:
            break
        keys = [n for kind, n in active if kind == "e" and n not in mentioning]
        if keys:
            mentioning.update({k: [] for k in keys})
            mentioning.update(reader.mentioning_units(keys))
        pushed = {v: residual.pop(v) for v in active}
        for (kind, n), r in pushed.items():
            score[(kind, n)] += (1 - DAMPING) * r
            if kind == "u":
                weights = {k: specificity(counts.get(k, 0), units) for k in mentions[n]
                           if counts.get(k, 0)}
                norm = sum(weights.values())
                for k, w in weights.items():
                    residual[("e", k)] += DAMPING * r * w / norm
            else:
                near = mentioning[n]
                for u in near:
                    residual[("u", u)] += DAMPING * r / len(near)
    out = {n: s for (kind, n), s in score.items() if kind == "u"}
    for (kind, n), r in residual.items():  # what was not pushed still ranks its unit
        if kind == "u":
            out[n] = out.get(n, 0.0) + (1 - DAMPING) * r
    return out
