"""The rules a community report is written by (canopy.indexer.operations.report_context; Edge et
al. 2024 §2.1.5,
design §3 step 6), pinned on tiny hand-built communities.

Token counts come from `WordTokenizer` (one token per whitespace-separated word), so every cost
can be checked by hand: an entity or relationship whose description has n >= 1 words costs
n + 2 tokens (`ent`, `rel`), a sub-report whose summary has n words costs n + 6 (`report`).
Degrees are the graph's, set by hand for each fixture.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import cast

import pytest

from canopy.errors import InvalidOutput
from canopy.indexer.operations.report_context import (
    CommunityContent,
    ElementSizes,
    build_report_context,
    fingerprint,
    reports_only,
    reports_only_fingerprint,
    to_report,
)
from canopy.indexer.report_writer import write_report
from canopy.model import Claim, Community, Entity, Finding, Relationship, Report
from canopy.providers.base import FindingOut, Provider, ReportContext, ReportOut
from canopy.providers.report_prompt import report_tables
from canopy.tokenizer import Tokenizer


class WordTokenizer(Tokenizer):
    """One token per whitespace-separated word; counts how often it is asked."""

    def __init__(self) -> None:  # no vocabulary to load
        self.name = "words"
        self.calls = 0

    def count(self, text: str) -> int:
        self.calls += 1
        return len(text.split())


def words(n: int) -> str:
    return " ".join(["w"] * n)


def ent(eid: str, degree: int, n_words: int = 1, units: tuple[str, ...] = ()) -> Entity:
    """An entity costing n_words + 2 tokens."""
    return Entity(eid, eid.upper(), "person", words(n_words), units or (f"u-{eid}",), degree)


def rel(source: str, target: str, n_words: int = 1, weight: float = 1.0,
        units: tuple[str, ...] = ()) -> Relationship:
    """The relationship `source``target` (its id), costing n_words + 2 tokens."""
    rid = source + target
    return Relationship(rid, source, target, words(n_words), weight, units or (f"u-{rid}",))


def report(cid: str, n_words: int = 1, level: int = 1) -> Report:
    """A child report costing n_words + 6 tokens in a context."""
    return Report(cid, level, "t", words(n_words), 5.0, "", (), (f"u-{cid}",), f"fp-{cid}")


def content(entities: list[Entity], relationships: list[Relationship], *,
            cid: str = "c", level: int = 0, claims: list[Claim] | None = None,
            children: list[Community] | None = None,
            relationship_order: list[str] | None = None) -> CommunityContent:
    """A community holding exactly these elements (and, given children, their memberships)."""
    kids = children or []
    community = Community(cid, level, None, tuple(k.id for k in kids),
                          tuple(e.id for e in entities),
                          tuple(relationship_order or [r.id for r in relationships]), "fp-" + cid)
    return CommunityContent(community, {e.id: e for e in entities},
                            {r.id: r for r in relationships}, claims or [],
                            {k.id: k for k in kids})


def child(cid: str, entities: list[Entity], relationships: list[Relationship]) -> Community:
    return Community(cid, 1, "c", (), tuple(e.id for e in entities),
                     tuple(r.id for r in relationships))


def build(c: CommunityContent, budget: int,
          child_reports: dict[str, Report] | None = None) -> ReportContext:
    return build_report_context(c, child_reports or {}, ElementSizes(WordTokenizer()), budget)


def context_tokens(ctx: ReportContext) -> int:
    """Tokens of a context as the budget counts them."""
    sizes = ElementSizes(WordTokenizer())
    return (sum(sizes.entity(e) for e in ctx.entities)
            + sum(sizes.relationship(r) for r in ctx.relationships)
            + sum(len(r.full_text().split()) + 4 for r in ctx.sub_reports))


def ids(items: list[Entity] | list[Relationship]) -> list[str]:
    return [x.id for x in items]


# ---- leaf communities -------------------------------------------------------------------------

# a(3) - b(2), a - c(3), b - c, c - d(1); prominence: ac 6, ab 5, bc 5, cd 4. Every element
# costs 3 tokens; all of them 24.
A, B, C, D = ent("a", 3), ent("b", 2), ent("c", 3), ent("d", 1)
AB, AC, BC, CD = rel("a", "b"), rel("a", "c"), rel("b", "c"), rel("c", "d")
LEAF = content([A, B, C, D], [AB, AC, BC, CD])


class TestElementSizes:
    def test_an_element_costs_the_tokens_of_its_context_line_plus_two(self) -> None:
        sizes = ElementSizes(WordTokenizer())
        assert sizes.entity(ent("x", 1, n_words=4)) == 4 + 2
        assert sizes.relationship(rel("x", "y", n_words=7)) == 7 + 2

    def test_each_elements_size_is_counted_once(self) -> None:
        tok = WordTokenizer()
        sizes = ElementSizes(tok)
        for _ in range(3):
            sizes.entity(A)
            sizes.relationship(AB)
        assert tok.calls == 2


class TestRelationshipsComeByProminence:
    def test_relationships_are_ordered_by_source_plus_target_degree(self) -> None:
        assert ids(build(LEAF, 100).relationships) == ["ac", "ab", "bc", "cd"]

    def test_equally_prominent_relationships_come_in_id_order(self) -> None:
        listed_backwards = content([A, B, C, D], [AB, AC, BC, CD],
                                   relationship_order=["cd", "bc", "ac", "ab"])
        assert ids(build(listed_backwards, 100).relationships) == ["ac", "ab", "bc", "cd"]

    def test_prominence_is_degree_not_weight(self) -> None:
        heavy = content([A, B, C, D], [AB, AC, BC, rel("c", "d", weight=100.0)])
        assert ids(build(heavy, 100).relationships)[-1] == "cd"

    def test_relationships_outside_the_community_are_left_out(self) -> None:
        c = content([A, B, C, D], [AB, AC, BC, CD], relationship_order=["ab", "cd"])
        assert ids(build(c, 100).relationships) == ["ab", "cd"]


class TestRelationshipsFillTheBudgetWithTheirEndpoints:
    def test_a_relationship_comes_with_both_endpoints(self) -> None:
        ctx = build(LEAF, 9)  # ac 3 + a 3 + c 3
        assert ids(ctx.relationships) == ["ac"]
        assert ids(ctx.entities) == ["a", "c"]

    def test_an_endpoint_already_in_the_context_is_not_paid_for_again(self) -> None:
        ctx = build(LEAF, 18)  # ac 9, ab 6 (with b), bc 3 (both ends already in)
        assert ids(ctx.relationships) == ["ac", "ab", "bc"]
        assert ids(ctx.entities) == ["a", "c", "b"]

    def test_packing_stops_at_the_first_relationship_that_does_not_fit(self) -> None:
        x, y, z = ent("x", 5), ent("y", 4), ent("z", 1)
        # xy (prominence 9) costs 12 + 6 for its ends; xz (6) would fit with its ends (9).
        c = content([x, y, z], [rel("x", "y", n_words=10), rel("x", "z")])
        ctx = build(c, 10)
        assert ctx.relationships == []
        assert ids(ctx.entities) == ["x", "y", "z"]  # the budget goes to entities instead

    @pytest.mark.parametrize("budget", range(30))
    def test_the_context_never_exceeds_the_budget(self, budget: int) -> None:
        assert context_tokens(build(LEAF, budget)) <= budget


class TestRemainingEntitiesComeByDegree:
    def test_relationships_come_before_any_other_entity_however_high_its_degree(self) -> None:
        lone = ent("z", 9)
        c = content([ent("a", 1), ent("b", 1), lone], [rel("a", "b")])
        assert ids(build(c, 9).entities) == ["a", "b"]
        assert ids(build(c, 12).entities) == ["z", "a", "b"]

    def test_entities_without_a_chosen_relationship_follow_by_degree_then_id(self) -> None:
        c = content([ent("p", 0), ent("s", 1), ent("r", 2), ent("q", 2)], [])
        assert ids(build(c, 9).entities) == ["q", "r", "s"]

    def test_entity_packing_stops_at_the_first_entity_that_does_not_fit(self) -> None:
        c = content([ent("p", 0), ent("s", 1), ent("r", 2, n_words=5), ent("q", 2)], [])
        assert ids(build(c, 8).entities) == ["q"]  # r (7) does not fit; s and p would
        assert ids(build(c, 12).entities) == ["q", "r"]

    def test_entities_are_listed_by_degree_with_their_degrees(self) -> None:
        ctx = build(LEAF, 100)
        assert ids(ctx.entities) == ["a", "c", "b", "d"]
        assert ctx.degrees == {"a": 3, "c": 3, "b": 2, "d": 1}


class TestClaims:
    def test_only_claims_about_chosen_entities_are_included(self) -> None:
        a, b = ent("a", 2), ent("b", 1)
        claims = [Claim("k-a", "a", "", "fact", "TRUE", "x", ("u1",)),
                  Claim("k-b", "b", "", "fact", "TRUE", "x", ("u2",))]
        ctx = build(content([a, b], [], claims=claims), 3)  # room for a only
        assert [cl.id for cl in ctx.claims] == ["k-a"]

    def test_at_most_fifty_claims_in_id_order(self) -> None:
        claims = [Claim(f"k{i:02}", "a", "", "fact", "TRUE", "x", ("u1",)) for i in range(60)]
        ctx = build(content([ent("a", 1)], [], claims=list(reversed(claims))), 100)
        assert [cl.id for cl in ctx.claims] == [f"k{i:02}" for i in range(50)]


# ---- higher levels: sub-report substitution ---------------------------------------------------

# Community c has three children: k1 = {a, b, c; ab, bc} (15 tokens of elements), k2 = {d, e; de}
# (9) and k3 = {f} (3); 27 in all. Reports: k1 8 tokens, k2 7, k3 7.
HA, HB, HC, HD, HE, HF = (ent("a", 1), ent("b", 2), ent("c", 1), ent("d", 1), ent("e", 1),
                          ent("f", 0))
HAB, HBC, HDE = rel("a", "b"), rel("b", "c"), rel("d", "e")
K1 = child("k1", [HA, HB, HC], [HAB, HBC])
K2 = child("k2", [HD, HE], [HDE])
K3 = child("k3", [HF], [])
REPORTS = {"k1": report("k1", 2), "k2": report("k2", 1), "k3": report("k3", 1)}


def parent(*extra: Relationship) -> CommunityContent:
    return content([HA, HB, HC, HD, HE, HF], [HAB, HBC, HDE, *extra], children=[K1, K2, K3])


def subs(ctx: ReportContext) -> list[str]:
    return [r.community_id for r in ctx.sub_reports]


class TestHigherLevelsUseElementsWhenAllFit:
    def test_element_descriptions_are_used_when_they_all_fit(self) -> None:
        ctx = build(parent(), 27, REPORTS)
        assert ctx.sub_reports == []
        assert len(ctx.entities) == 6 and len(ctx.relationships) == 3


class TestChildReportsReplaceTheirElements:
    def test_the_largest_childs_report_is_substituted_first(self) -> None:
        ctx = build(parent(), 26, REPORTS)  # k1's report (8) + the rest (12) fits
        assert subs(ctx) == ["k1"]
        assert ids(ctx.relationships) == ["de"]
        assert sorted(ids(ctx.entities)) == ["d", "e", "f"]

    def test_children_are_substituted_until_the_rest_fits(self) -> None:
        short = {k: report(k, 0) for k in REPORTS}  # 6 tokens each: together they fit
        # 30 tokens of elements; k1 + rest = 6 + 15; k1 + k2 + rest (f) = 12 + 3
        ctx = build(parent(rel("c", "d")), 19, short)
        assert subs(ctx) == ["k1", "k2"]
        assert ids(ctx.entities) == ["f"] and ctx.relationships == []

    def test_only_children_whose_reports_exist_are_substituted(self) -> None:
        ctx = build(parent(), 26, {"k2": REPORTS["k2"], "k3": REPORTS["k3"]})
        assert subs(ctx) == ["k2"]  # 7 + 18

    def test_when_even_the_reports_overflow_it_is_written_from_the_largest_that_fit(
            self) -> None:
        ctx = build(parent(), 14, REPORTS)  # all three reports: 22; k1 + k2: 15; k1: 8
        assert subs(ctx) == ["k1"]
        # written from the reports alone: no element competes for what they leave
        assert ctx.entities == [] and ctx.relationships == [] and ctx.claims == []

    def test_written_from_reports_alone_the_largest_children_by_members_come_first(self) -> None:
        many = {"k1": report("k1", 2), "k2": report("k2", 1), "k3": report("k3", 9)}
        ctx = build(parent(), 26, many)  # 8 + 7 + 15 = 30: k1 (3 members) + k2 (2) fit, k3 not
        assert subs(ctx) == ["k1", "k2"] and ctx.entities == []

    def test_a_report_too_long_for_what_is_left_is_passed_over(self) -> None:
        long_first = {"k1": report("k1", 9), "k2": report("k2", 1), "k3": report("k3", 1)}
        assert subs(build(parent(), 14, long_first)) == ["k2", "k3"]  # k1 alone costs 15

    def test_when_no_report_fits_alone_the_smallest_are_dropped_for_elements(self) -> None:
        huge = {k: report(k, 20) for k in REPORTS}  # 26 tokens each
        ctx = build(parent(), 12, huge)
        assert ctx.sub_reports == [] and ctx.entities  # elements, as many as fit
        assert context_tokens(ctx) <= 12

    def test_a_relationship_between_two_children_stays_with_its_endpoints(self) -> None:
        ctx = build(parent(rel("c", "d")), 29, REPORTS)  # k1 (8) + rest (21)
        assert subs(ctx) == ["k1"]
        assert ids(ctx.relationships) == ["cd", "de"]
        assert sorted(ids(ctx.entities)) == ["c", "d", "e", "f"]

    @pytest.mark.parametrize("budget", range(30))
    def test_reports_and_elements_together_never_exceed_the_budget(self, budget: int) -> None:
        assert context_tokens(build(parent(rel("c", "d")), budget, REPORTS)) <= budget


# ---- the report from the provider's output ----------------------------------------------------


def out(*findings: FindingOut, title: str = "T") -> ReportOut:
    return ReportOut(title=title, summary=" S ", rating=7.5, rating_explanation="why",
                     findings=list(findings))


TA, TB = ent("a", 1, units=("u1", "u2")), ent("b", 1, units=("u3",))
TAB = rel("a", "b", units=("u4",))
TSUB = report("k1")  # units ("u-k1",)
TCLAIM = Claim("k", "a", "", "fact", "TRUE", "x", ("u5",))
TCTX = ReportContext("c", 0, [TA, TB], [TAB], [TCLAIM], [TSUB])
TCOMMUNITY = Community("c", 0, None, ("k1",), ("a", "b"), ("ab",), "fp-c")


class TestToReport:
    def test_finding_ids_map_back_to_the_artifacts_at_those_positions(self) -> None:
        f = FindingOut(summary="f", explanation="e", entity_ids=[1, 0], relationship_ids=[0])
        r = to_report(TCOMMUNITY, TCTX, out(f), 9)
        assert r.findings == (Finding("f", "e", ("b", "a"), ("ab",), ("u1", "u2", "u3", "u4")),)

    def test_out_of_range_ids_are_never_cited(self) -> None:
        f = FindingOut(summary="f", explanation="e", entity_ids=[-1, 2, 0],
                       relationship_ids=[1, -1], report_ids=[1, -1])
        (finding,) = to_report(TCOMMUNITY, TCTX, out(f), 9).findings
        assert finding.entity_ids == ("a",)
        assert finding.relationship_ids == ()
        assert finding.text_unit_ids == ("u1", "u2")

    def test_a_findings_units_include_those_of_the_sub_reports_it_cites(self) -> None:
        f = FindingOut(summary="f", explanation="e", report_ids=[0])
        (finding,) = to_report(TCOMMUNITY, TCTX, out(f), 9).findings
        assert finding.text_unit_ids == ("u-k1",)

    def test_the_reports_units_are_those_of_everything_in_its_context(self) -> None:
        r = to_report(TCOMMUNITY, TCTX, out(), 9)
        assert r.text_unit_ids == ("u-k1", "u1", "u2", "u3", "u4", "u5")

    def test_it_keeps_the_communitys_fingerprint_the_sub_reports_and_the_context_size(self) -> None:
        r = to_report(TCOMMUNITY, TCTX, out(), 9)
        assert (r.community_id, r.level, r.fingerprint) == ("c", 0, "fp-c")
        assert r.used_subreports == ("k1",) and r.context_tokens == 9
        assert (r.summary, r.rating, r.rating_explanation) == ("S", 7.5, "why")

    def test_a_blank_title_falls_back_to_the_community_id(self) -> None:
        assert to_report(TCOMMUNITY, TCTX, out(title="  "), 9).title == "c"
        assert to_report(TCOMMUNITY, TCTX, out(title=" Kestrel "), 9).title == "Kestrel"


# ---- write_report -----------------------------------------------------------------------------


class ScriptedReports:
    """A provider whose `report` replies with a fixed output (or raises), recording contexts."""

    name = "scripted"

    def __init__(self, *, fail: bool = False) -> None:
        self.fail = fail
        self.contexts: list[ReportContext] = []

    async def report(self, context: ReportContext, *, max_tokens: int) -> ReportOut:
        self.contexts.append(context)
        if self.fail:
            raise InvalidOutput("not a report")
        return out(FindingOut(summary="f", explanation="e", entity_ids=[0]))


class ChildReports:
    """The `child_reports` callback, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self) -> dict[str, Report]:
        self.calls += 1
        return dict(REPORTS)


def write(c: CommunityContent, provider: ScriptedReports, children: ChildReports, budget: int,
          fallback: ScriptedReports | None = None) -> Report:
    return asyncio.run(write_report(
        c, children, cast(Provider, provider), ElementSizes(WordTokenizer()),
        context_tokens=budget, max_tokens=500, fallback=cast(Provider | None, fallback)))


class TestWriteReport:
    def test_child_reports_are_not_read_when_the_elements_fit(self) -> None:
        provider, children = ScriptedReports(), ChildReports()
        r = write(parent(), provider, children, 27)
        assert children.calls == 0
        assert r.used_subreports == () and provider.contexts[0].sub_reports == []

    def test_child_reports_are_read_once_when_the_elements_do_not_fit(self) -> None:
        provider, children = ScriptedReports(), ChildReports()
        r = write(parent(), provider, children, 26)
        assert children.calls == 1
        assert r.used_subreports == ("k1",)

    def test_a_leaf_never_reads_child_reports(self) -> None:
        children = ChildReports()
        write(LEAF, ScriptedReports(), children, 5)
        assert children.calls == 0

    def test_the_report_records_its_context_size_as_the_budget_counted_it(self) -> None:
        provider = ScriptedReports()
        r = write(LEAF, provider, ChildReports(), 100)
        ctx = provider.contexts[0]
        assert r.context_tokens == ElementSizes(WordTokenizer()).context(ctx)
        # within the budget, and off the rendered count by a few tokens a row (row numbers,
        # table headers, names where the budget counted ids)
        rendered = len(report_tables(ctx).split())
        rows = len(ctx.entities) + len(ctx.relationships)
        assert 0 < r.context_tokens <= 100 and rows
        assert abs(rendered - r.context_tokens) <= 3 * (1 + rows)
        assert r.findings[0].entity_ids == ("a",)

    def test_invalid_output_is_written_by_the_fallback_when_there_is_one(self) -> None:
        fallback = ScriptedReports()
        r = write(LEAF, ScriptedReports(fail=True), ChildReports(), 100, fallback=fallback)
        assert len(fallback.contexts) == 1 and r.title == "T"
        with pytest.raises(InvalidOutput):
            write(LEAF, ScriptedReports(fail=True), ChildReports(), 100)


# ---- fingerprints -----------------------------------------------------------------------------

PARTS: tuple[int, list[str], list[str], list[str], list[str]] = (
    1, ["e1", "e2"], ["r1", "r2"], ["k1", "k2"], ["fp1", "fp2"])


class TestFingerprint:
    def test_the_order_of_elements_does_not_matter(self) -> None:
        level, *lists = PARTS
        assert fingerprint(level, *(reversed(x) for x in lists)) == fingerprint(*PARTS)

    def test_it_takes_no_community_id_so_a_renumbered_community_keeps_it(self) -> None:
        params = list(inspect.signature(fingerprint).parameters)
        assert params == ["level", "entity_hashes", "relationship_hashes", "claim_hashes",
                          "child_fingerprints", "prompt"]

    @pytest.mark.parametrize("part", [1, 2, 3, 4])
    def test_it_changes_when_any_element_changes_appears_or_goes(self, part: int) -> None:
        hashes = PARTS[part]
        assert isinstance(hashes, list)
        for changed in ([hashes[0] + "'", *hashes[1:]], [*hashes, "new"], hashes[1:]):
            parts = list(PARTS)
            parts[part] = changed
            assert fingerprint(*parts) != fingerprint(*PARTS), changed  # type: ignore[arg-type]

    def test_it_changes_with_the_level(self) -> None:
        assert fingerprint(2, *PARTS[1:]) != fingerprint(*PARTS)


class TestReportsOnly:
    def test_none_when_the_childrens_reports_fit_together(self) -> None:
        assert reports_only(REPORTS, {"k1": 3, "k2": 2, "k3": 1}, WordTokenizer(), 22) is None

    def test_none_when_not_one_report_fits_alone(self) -> None:
        assert reports_only(REPORTS, {"k1": 3, "k2": 2, "k3": 1}, WordTokenizer(), 6) is None

    def test_the_largest_childrens_reports_that_fit_ties_by_id(self) -> None:
        got = reports_only(REPORTS, {"k1": 1, "k2": 2, "k3": 2}, WordTokenizer(), 21)
        assert [r.community_id for r in got or []] == ["k2", "k3"]  # 7 + 7; k1 (8) would not fit

    def test_its_fingerprint_follows_the_child_reports_and_the_level_not_their_order(
            self) -> None:
        fps = ["fp1", "fp2", "fp3"]
        assert reports_only_fingerprint(1, fps) == reports_only_fingerprint(1, reversed(fps))
        for changed in (["fp1'", "fp2", "fp3"], fps[1:], [*fps, "fp4"]):
            assert reports_only_fingerprint(1, changed) != reports_only_fingerprint(1, fps)
        assert reports_only_fingerprint(2, fps) != reports_only_fingerprint(1, fps)
        assert reports_only_fingerprint(1, fps) != fingerprint(1, [], [], [], fps)
