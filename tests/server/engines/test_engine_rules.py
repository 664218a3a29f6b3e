"""The selection and ordering rules of the query engines (design §6), each pinned on hand-built
inputs: which map points reach the reduce (`_best_points`), how reports are batched for the map
(`map_batches`), which reports dynamic selection picks (`select_reports`, over a fake reader and
scripted ratings), and which follow-up questions DRIFT asks next.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Iterable
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest

import canopy.server.engines.global_engine as ge
from canopy.acl.reader import CallerReader
from canopy.errors import InvalidOutput
from canopy.ids import normalize_name
from canopy.model import Report
from canopy.providers.base import MapPoint, Provider
from canopy.server.context import QueryContext
from canopy.server.engines.budget import tokenizer
from canopy.server.engines.drift_engine import _next_questions, _open_questions, _Step
from canopy.server.engines.global_engine import (
    _best_points,
    _map_tokens,
    map_batches,
    select_reports,
)
from canopy.settings import QuerySettings
from canopy.vectors import Hit


def report(cid: str, n_words: int = 3) -> Report:
    return Report(cid, cid.count("."), f"Report {cid}", " ".join(["word"] * n_words), 5.0, "",
                  (), (f"u-{cid}",), f"fp-{cid}")


# ---- reduce: which map points are kept ---------------------------------------------------------


def point(text: str, score: int) -> MapPoint:
    return MapPoint(description=text, score=score, report_ids=[])


def costs(points: list[MapPoint]) -> list[int]:
    """Reduce-context tokens of each point, as ranked, measured on an unbounded selection."""
    _, text = _best_points(points, 10**9)
    return [tokenizer().count(part) + 2 for part in text.split("\n\n")]


class TestBestPoints:
    def test_zero_score_points_are_dropped(self) -> None:
        kept, text = _best_points([point("useless", 0), point("useful", 10)], 10**9)
        assert [p.description for p in kept] == ["useful"]
        assert "useless" not in text

    def test_nothing_scored_above_zero_keeps_nothing(self) -> None:
        assert _best_points([point("a", 0), point("b", 0)], 10**9) == ([], "")

    def test_points_come_best_first_and_equal_scores_keep_their_order(self) -> None:
        points = [point("tie z", 40), point("best", 90), point("tie a", 40), point("worst", 10)]
        kept, _ = _best_points(points, 10**9)
        assert [p.description for p in kept] == ["best", "tie z", "tie a", "worst"]

    def test_the_context_numbers_the_points_in_rank_order_with_their_score(self) -> None:
        _, text = _best_points([point("low", 20), point("high", 80)], 10**9)
        assert text.split("\n\n") == ["----- Analyst point 1 (importance 80) -----\nhigh",
                                      "----- Analyst point 2 (importance 20) -----\nlow"]

    def test_points_are_kept_while_they_fit_the_reduce_budget(self) -> None:
        points = [point("first " * 30, 90), point("second " * 30, 80), point("third", 70)]
        first, second, _ = costs(points)
        assert len(_best_points(points, first + second)[0]) == 2
        assert len(_best_points(points, first + second - 1)[0]) == 1
        assert _best_points(points, first - 1) == ([], "")

    def test_selection_stops_at_the_first_point_that_does_not_fit(self) -> None:
        points = [point("big " * 200, 90), point("small", 10)]
        kept, _ = _best_points(points, costs(points)[1] + 5)  # room for "small" only
        assert kept == []


# ---- map: batches -----------------------------------------------------------------------------

REPORTS = [report(f"c{i}", n) for i, n in enumerate([5, 40, 12, 25, 8, 30, 3, 18, 22, 9])]


def flat(batches: list[list[Report]]) -> list[str]:
    return [r.community_id for b in batches for r in b]


def size(batch: list[Report]) -> int:
    return sum(_map_tokens(r) for r in batch)


class TestMapBatchOrder:
    def test_reports_are_shuffled_from_id_order_with_the_seed(self) -> None:
        expected = sorted(r.community_id for r in REPORTS)
        random.Random(7).shuffle(expected)
        assert flat(map_batches(REPORTS, seed=7, batch_tokens=10**6)) == expected

    def test_the_input_order_does_not_matter(self) -> None:
        shuffled = REPORTS[::-1]
        assert map_batches(shuffled, seed=3, batch_tokens=120) == map_batches(
            REPORTS, seed=3, batch_tokens=120)

    def test_another_seed_gives_another_order(self) -> None:
        assert flat(map_batches(REPORTS, seed=1, batch_tokens=10**6)) != flat(
            map_batches(REPORTS, seed=2, batch_tokens=10**6))

    def test_every_report_is_in_exactly_one_batch(self) -> None:
        got = flat(map_batches(REPORTS, seed=5, batch_tokens=100))
        assert sorted(got) == sorted(r.community_id for r in REPORTS)

    def test_no_reports_make_no_batches(self) -> None:
        assert map_batches([], seed=1, batch_tokens=100) == []


class TestMapBatchPacking:
    @pytest.mark.parametrize("budget", [60, 100, 150, 400])
    def test_batches_fit_the_budget_and_close_only_when_the_next_report_would_not(
            self, budget: int) -> None:
        batches = map_batches(REPORTS, seed=11, batch_tokens=budget)
        assert all(size(b) <= budget for b in batches)
        for batch, after in itertools.pairwise(batches):
            assert size(batch) + _map_tokens(after[0]) > budget

    def test_an_oversized_report_travels_alone(self) -> None:
        big = report("big", 300)
        budget = 100
        assert _map_tokens(big) > budget
        batches = map_batches([*REPORTS, big], seed=1, batch_tokens=budget)
        (alone,) = [b for b in batches if big in b]
        assert alone == [big]
        at = batches.index(alone)
        assert 0 < at < len(batches) - 1  # with batches on both sides: neither joined it
        assert all(size(b) <= budget for b in batches if b != alone)


# ---- dynamic selection ------------------------------------------------------------------------

# r0 ── r0.0 ── r0.0.0
#   │       └── r0.0.1
#   └── r0.1
# r1 ── r1.0
# r2
TREE = {"r0": ["r0.0", "r0.1"], "r0.0": ["r0.0.0", "r0.0.1"], "r1": ["r1.0"]}
ROOTS = ["r0", "r1", "r2"]
QUERY = "What are the main risks?"


class FakeReader:
    """What dynamic selection reads through a CallerReader, over TREE. `hidden` communities
    are not servable; `similar` is the hybrid search's ranking of the reports."""

    embedder = None  # not lexical: the vector ranking weighs in full

    def __init__(self, *, hidden: Iterable[str] = (), similar: Iterable[str] = (),
                 words: int = 3) -> None:
        self.words = words  # of each report's summary
        self.hidden = set(hidden)
        self.similar = list(similar)
        self.partitions: list[int] = []  # levels whose partition was asked for
        self.searches: list[tuple[str, str | None]] = []

    def level_of(self, cid: str) -> int:
        return cid.count(".")

    def community_rows(self, ids: Iterable[str]) -> dict[str, SimpleNamespace]:
        parent = {c: p for p, cs in TREE.items() for c in cs}
        return {c: SimpleNamespace(id=c, level=self.level_of(c), parent=parent.get(c))
                for c in ids}

    def roots(self) -> list[str]:
        return self.servable_tops(ROOTS)

    async def reports(self, ids: Iterable[str]) -> dict[str, Report]:
        return {c: report(c, self.words) for c in ids if c not in self.hidden}

    def child_ids(self, ids: Iterable[str]) -> dict[str, list[str]]:
        return {c: TREE[c] for c in ids if c in TREE}

    def servable_tops(self, ids: Iterable[str]) -> list[str]:
        out: list[str] = []
        for c in ids:
            out += self.servable_tops(TREE.get(c, [])) if c in self.hidden else [c]
        return sorted(out)

    def level_partition(self, level: int) -> list[str]:
        self.partitions.append(level)
        every = [*ROOTS, *(c for cs in TREE.values() for c in cs)]
        return sorted(c for c in every if c not in self.hidden and (
            self.level_of(c) == level or (self.level_of(c) < level and c not in TREE)))

    async def search(self, table: str, *, vector: np.ndarray | None, text: str | None, k: int,
                     level: int | None = None, vector_weight: float = 1.0) -> list[Hit]:
        self.searches.append((table, text))
        return [Hit(c, 1.0) for c in self.similar[:k]]

    async def embed(self, text: str) -> np.ndarray:
        return np.zeros(4, dtype=np.float32)


class ScriptedRatings:
    """A provider rating each report from a script (0 unless scripted), recording the order and
    the calls; a call holding a report of `fail` raises InvalidOutput."""

    name = "scripted"
    endpoint = False  # True: rated as by an endpoint (bounded by dynamic_max_rating_calls)

    def __init__(self, scores: dict[str, int], fail: Iterable[str] = ()) -> None:
        self.scores = scores
        self.fail = set(fail)
        self.rated: list[str] = []
        self.calls: list[list[str]] = []

    def concurrency(self) -> object | None:
        """Not None for an endpoint (its limiter's statistics, which selection never reads)."""
        return SimpleNamespace() if self.endpoint else None

    async def rate(self, query: str, reports: list[Report]) -> list[int]:
        assert query == QUERY
        ids = [r.community_id for r in reports]
        self.calls.append(ids)
        self.rated += ids
        if self.fail & set(ids):
            raise InvalidOutput("no score")
        return [self.scores.get(c, 0) for c in ids]


def select(scores: dict[str, int], *, reader: FakeReader | None = None,
           fail: Iterable[str] = (), endpoint: bool = False, **settings: int
           ) -> tuple[list[str], ScriptedRatings, FakeReader, ge._Tally]:
    """The selected community ids, the ratings made, the reader and the coverage tally.
    Each report is rated in a call of its own unless `rate_batch_tokens` says otherwise;
    `endpoint`: the provider calls an endpoint (its rating calls are bounded)."""
    reader = reader or FakeReader()
    provider = ScriptedRatings(scores, fail)
    provider.endpoint = endpoint
    ctx = QueryContext(cast(CallerReader, reader), cast(Provider, provider),
                       QuerySettings(**{"rate_batch_tokens": 1, **settings}))
    tally = ge._Tally("dynamic")
    chosen = asyncio.run(select_reports(ctx, QUERY, tally))
    return [r.community_id for r in chosen], provider, reader, tally


class TestDescentFromTheRoots:
    def test_the_roots_are_rated_first(self) -> None:
        _, provider, _, _ = select({"r1": 9})
        assert provider.rated[:3] == ROOTS

    def test_a_relevant_child_replaces_its_parent(self) -> None:
        chosen, _, _, _ = select({"r0": 8, "r0.0": 6})
        assert chosen == ["r0.0"]

    def test_every_relevant_child_of_a_parent_is_kept(self) -> None:
        chosen, _, _, _ = select({"r0": 8, "r0.0": 6, "r0.1": 6})
        assert chosen == ["r0.0", "r0.1"]

    def test_a_relevant_report_stays_when_none_of_its_children_is_relevant(self) -> None:
        chosen, provider, _, _ = select({"r1": 7, "r1.0": 4})
        assert chosen == ["r1"] and "r1.0" in provider.rated

    def test_the_descent_goes_on_below_a_relevant_child(self) -> None:
        chosen, provider, _, _ = select({"r0": 8, "r0.0": 6, "r0.0.1": 9})
        assert chosen == ["r0.0.1"] and "r0.0.0" in provider.rated

    def test_children_of_irrelevant_reports_are_never_rated(self) -> None:
        _, provider, _, _ = select({"r1": 7})
        assert sorted(provider.rated) == ["r0", "r1", "r1.0", "r2"]

    def test_a_report_is_relevant_from_the_threshold_up(self) -> None:
        threshold = ge.RELEVANCE_THRESHOLD
        chosen, provider, _, _ = select({"r0": threshold, "r1": threshold - 1})
        assert chosen == ["r0"]
        assert {"r0.0", "r0.1"} <= set(provider.rated) and "r1.0" not in provider.rated

    def test_a_hidden_child_is_replaced_by_its_servable_children(self) -> None:
        chosen, provider, _, _ = select({"r0": 8, "r0.0.1": 9}, reader=FakeReader(hidden={"r0.0"}))
        assert "r0.0" not in provider.rated and {"r0.0.0", "r0.0.1"} <= set(provider.rated)
        assert chosen == ["r0.0.1"]  # and it replaces r0, its nearest servable ancestor

    def test_a_rating_that_fails_counts_as_irrelevant(self) -> None:
        chosen, provider, _, _ = select({"r0": 9, "r1": 7}, fail={"r0"})
        assert chosen == ["r1"]
        assert not {"r0.0", "r0.1"} & set(provider.rated)

    def test_the_selection_is_in_community_id_order(self) -> None:
        chosen, _, _, _ = select({"r0": 9, "r1": 9, "r2": 9},
                              reader=FakeReader(similar=["r2", "r1", "r0"]))
        assert chosen == ["r0", "r1", "r2"]


class TestRatingCallsAndBudget:
    def test_every_root_is_rated_with_no_similarity_gate(self) -> None:
        _, provider, reader, tally = select({"r1": 9}, reader=FakeReader(similar=["r1"]))
        assert set(ROOTS) <= set(provider.rated)
        assert reader.searches == []  # within the budget nothing is ranked by similarity
        assert tally.coverage().levels[0].considered == tally.coverage().levels[0].rated == 3

    def test_several_reports_share_a_rating_call(self) -> None:
        _, provider, _, tally = select({"r1": 9}, rate_batch_tokens=10_000)
        assert provider.calls[0] == ROOTS and tally.rating_calls == len(provider.calls) == 2

    def test_a_rating_call_holds_at_most_the_batch_tokens(self) -> None:
        one = tokenizer().count(f"[Report r0] {report('r0').digest()}") + 2
        _, provider, _, _ = select({}, rate_batch_tokens=2 * one)
        assert [len(c) for c in provider.calls[:2]] == [2, 1]

    def test_beyond_the_budget_the_most_similar_are_rated_and_the_rest_counted(self) -> None:
        chosen, provider, reader, tally = select(
            {"r2": 9}, reader=FakeReader(similar=["r2", "r0"]), dynamic_max_rated=2)
        assert provider.rated == ["r2", "r0"] and chosen == ["r2"]
        assert reader.searches == [("reports", QUERY)]
        cov = tally.coverage()
        assert cov.unrated == 1 and not cov.complete  # r1, the least similar root
        assert "incomplete" in cov.line()

    def test_candidates_outside_the_similarity_ranking_follow_it_in_id_order(self) -> None:
        _, provider, _, _ = select({"r2": 9}, reader=FakeReader(similar=["r2"]),
                                   dynamic_max_rated=2)
        assert provider.rated == ["r2", "r0"]

    def test_coverage_counts_considered_rated_and_relevant_per_level(self) -> None:
        _, _, _, tally = select({"r0": 8, "r0.0": 6, "r0.1": 2})
        cov = tally.coverage()
        assert [(c.level, c.considered, c.rated, c.relevant) for c in cov.levels] == [
            (0, 3, 3, 1), (1, 2, 2, 1), (2, 2, 2, 0)]
        assert cov.complete and cov.rating_calls == 7  # one report per call here


class TestFallbackToWholeLevels:
    def test_no_level_is_rated_whole_when_a_root_is_relevant(self) -> None:
        _, _, reader, _ = select({"r2": 9})
        assert reader.partitions == []

    def test_when_no_root_is_relevant_the_next_level_is_rated(self) -> None:
        chosen, provider, reader, _ = select({"r1.0": 7})
        assert reader.partitions == [1]
        assert chosen == ["r1.0"]
        assert provider.rated.count("r2") == 1  # a childless root is not rated again

    def test_the_descent_goes_on_below_what_the_fallback_finds(self) -> None:
        chosen, _, _, _ = select({"r0.0": 7, "r0.0.1": 8})
        assert chosen == ["r0.0.1"]

    def test_levels_are_rated_down_to_the_fallback_limit_and_no_further(
            self, monkeypatch: pytest.MonkeyPatch) -> None:
        _, provider, reader, _ = select({})
        assert reader.partitions == [1, 2]
        assert sorted(provider.rated) == sorted(set(provider.rated))
        monkeypatch.setattr(ge, "DYNAMIC_FALLBACK_MAX_LEVEL", 1)
        _, _, reader, _ = select({})
        assert reader.partitions == [1]


class TestNothingRelevant:
    """No rating reaches the threshold: the best-rated reports are read anyway, and said so."""

    def test_the_best_rated_are_selected_and_the_coverage_notes_it(self) -> None:
        below = ge.RELEVANCE_THRESHOLD - 1
        chosen, _, _, tally = select({"r1.0": below, "r2": below - 1, "r0.0.1": below - 2})
        assert chosen[0] == "r1.0" or "r1.0" in chosen
        cov = tally.coverage()
        assert cov.note is not None and "read anyway" in cov.note
        assert f"the best rating was {below}" in cov.note and cov.note in cov.line()

    def test_best_first_and_never_a_report_with_its_ancestor_or_descendant(self) -> None:
        chosen, _, _, _ = select({"r0.0.1": 4, "r0.0": 3, "r0": 2, "r1": 1},
                                 map_batch_tokens=500)
        assert "r0.0.1" in chosen and not {"r0.0", "r0"} & set(chosen)
        assert {"r1", "r2"} <= set(chosen) and "r1.0" not in chosen  # ties: the broader one

    def test_as_many_as_one_map_call_holds_and_at_least_one(self) -> None:
        one = ge._map_tokens(report("r0", 400))
        chosen, _, _, tally = select({"r2": 4, "r1": 3}, reader=FakeReader(words=400),
                                     map_batch_tokens=one + one // 2)
        assert one + one // 2 >= 500
        assert chosen == ["r2"]
        assert tally.coverage().note is not None and "1 best-rated report was" in (
            tally.coverage().note or "")

    def test_when_every_rating_fails_the_top_communities_are_read(self) -> None:
        chosen, _, _, tally = select({}, fail=set(ROOTS) | {"r0.0", "r0.1", "r1.0",
                                                            "r0.0.0", "r0.0.1"})
        assert chosen and set(chosen) <= set(ROOTS)
        assert "no rating succeeded" in (tally.coverage().note or "")

    def test_a_relevant_report_means_no_note(self) -> None:
        _, _, _, tally = select({"r2": 9})
        assert tally.coverage().note is None


class TestRatingCallBound:
    """`[query] dynamic_max_rating_calls` bounds the rating calls to an endpoint per question."""

    def test_the_bound_holds_and_the_most_similar_candidates_are_rated(self) -> None:
        reader = FakeReader(similar=["r2", "r0.0", "r1.0"])
        chosen, provider, _, tally = select({}, reader=reader, endpoint=True,
                                            dynamic_max_rating_calls=4)
        assert len(provider.calls) == tally.rating_calls == 4
        assert provider.rated[:3] == ROOTS  # the roots first, then the most similar of level 1
        assert provider.rated[3] == "r0.0"
        cov = tally.coverage()
        assert cov.rating_bound == 4 and cov.unrated > 0 and "bound of 4 rating calls" in (
            cov.line())
        assert chosen  # and still an answer: the best-rated, read anyway

    def test_relevant_reports_found_before_the_bound_are_kept(self) -> None:
        chosen, provider, _, tally = select({"r0": 9, "r0.0": 8}, endpoint=True,
                                            dynamic_max_rating_calls=4)
        assert len(provider.calls) == 4 and chosen == ["r0.0"]
        assert tally.coverage().note is None

    def test_without_an_endpoint_ratings_are_not_bounded_by_calls(self) -> None:
        _, provider, _, tally = select({}, dynamic_max_rating_calls=2)
        assert len(provider.calls) > 2 and tally.coverage().rating_bound is None


# ---- DRIFT: which follow-ups are asked next ----------------------------------------------------


def step(score: int, *follow_ups: str) -> _Step:
    return _Step("q", 0, answer="a", score=score, follow_ups=list(follow_ups))


class TestOpenQuestions:
    def test_follow_ups_of_better_scored_answers_come_first(self) -> None:
        steps = [step(20, "low 1", "low 2"), step(80, "high 1", "high 2"), step(50, "mid")]
        assert _open_questions(steps, set()) == ["high 1", "high 2", "mid", "low 1", "low 2"]

    def test_equal_scores_keep_the_order_in_which_questions_were_raised(self) -> None:
        steps = [step(50, "b", "a"), step(50, "d", "c")]
        assert _open_questions(steps, set()) == ["b", "a", "d", "c"]

    def test_questions_already_asked_are_dropped_compared_normalized(self) -> None:
        steps = [step(50, "Who leads KESTREL?", "Who funds Kestrel?")]
        asked = {normalize_name("who leads kestrel")}
        assert _open_questions(steps, asked) == ["Who funds Kestrel?"]

    def test_a_question_raised_twice_is_kept_once_where_it_ranks_best(self) -> None:
        steps = [step(20, "Who funds Kestrel?", "other"), step(80, "who funds  kestrel")]
        assert _open_questions(steps, set()) == ["who funds  kestrel", "other"]

    def test_blank_questions_are_dropped_and_the_rest_stripped(self) -> None:
        steps = [step(50, "  ", "?!", "  Where is Heron built?  ")]
        assert _open_questions(steps, set()) == ["Where is Heron built?"]

    def test_listing_open_questions_asks_none_of_them(self) -> None:
        asked = {"x"}
        _open_questions([step(50, "y")], asked)
        assert asked == {"x"}


class TestNextQuestions:
    def test_at_most_breadth_questions_are_chosen_the_best_first(self) -> None:
        steps = [step(20, "low"), step(80, "high 1", "high 2")]
        assert _next_questions(steps, set(), 2) == ["high 1", "high 2"]

    def test_chosen_questions_are_never_chosen_again(self) -> None:
        steps = [step(80, "one", "two", "three")]
        asked = {normalize_name("the question")}
        assert _next_questions(steps, asked, 2) == ["one", "two"]
        steps.append(step(90, "ONE?", "four"))
        assert _next_questions(steps, asked, 2) == ["four", "three"]
        assert _next_questions(steps, asked, 2) == []


# ---- local and basic search: rules of the ranking and of the result's cut ---------------------


def test_a_documents_second_unit_raises_its_units_and_a_single_unit_document_is_unchanged() -> None:
    from canopy.server.engines.evidence import DOC_SECOND, with_document_evidence

    doc = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "c1": "C"}
    scores = {"a1": 10.0, "a2": 4.0, "a3": 1.0, "b1": 11.0, "c1": 0.0}
    out = with_document_evidence(scores, doc.__getitem__)
    assert out["b1"] == 11.0 and out["c1"] == 0.0  # one unit / no match: as it was
    assert out["a1"] == 10.0 + DOC_SECOND * 4.0 and out["a3"] == 1.0 + DOC_SECOND * 4.0
    assert (out["a1"] > out["b1"]) == (10.0 + DOC_SECOND * 4.0 > 11.0)


def test_the_cut_order_keeps_the_ranked_passages_head_to_the_end() -> None:
    from canopy.providers.base import ContextBlock
    from canopy.server.engines.budget import _cut_order

    kinds = ["text_unit"] * 3 + ["entity"] * 2 + ["relationship"] * 2 + ["report"] * 2
    blocks = [ContextBlock(k, f"{k}{i}", "", "x") for i, k in enumerate(kinds)]
    order = [blocks[i].id for i in _cut_order(blocks)]
    # per kind from its tail, the least specific kind first; then the first of each kind; the
    # best passage never
    assert order == ["relationship6", "entity4", "report8", "text_unit2", "text_unit1",
                     "relationship5", "entity3", "report7"]


def test_names_made_only_of_numerals_honorifics_or_initials_select_no_entity() -> None:
    from canopy.server.engines.local_engine import names_something

    for key in ("ii", "xiv", "sir", "st", "jr", "2", "3rd", "j", "the"):
        assert not names_something(key), key
    for key in ("lothair ii", "henry viii", "civil", "mix", "t2", "the verge"):
        assert names_something(key), key
