"""The query engines over the example corpus, built once per module with the builtin provider.

Each engine must answer, cite only what resolves (drill_down for report ids, source_span for
text units), obey the serving rule, stay under the result limit, and count only its own usage.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from canopy.errors import InvalidArgument, NotFound
from canopy.llm import ChatClient
from canopy.providers.base import render_blocks
from canopy.providers.llm_provider import LLMProvider
from canopy.server.cli import main
from canopy.server.context import QueryContext
from canopy.server.engines import (
    basic_search,
    drift_search,
    drill,
    drill_down,
    global_search,
    list_servable_reports,
    local_search,
    report_markdown,
    source_span,
)
from canopy.server.engines.budget import (
    NOTHING_FOUND,
    context_budget,
    delivered_tokens,
    tokenizer,
)
from canopy.server.engines.global_engine import map_batches, reports_at_level
from canopy.server.engines.local_engine import local_unit_ranking
from canopy.server.results import SearchResult
from canopy.server.runtime import Workspace, build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.settings import LLMSettings, QuerySettings
from canopy.store.export import Graph, load_graph
from tests.conftest import EXAMPLES, indexed_examples, report_reads

SUPPLY_RISKS = "What are the main risks across the supply chain?"
CELLS = "Which supplier makes the battery cells?"
HIDDEN_DOC = "suppliers/helio_cells.md"


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


POLICY = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "suppliers/helio_cells.md"
labels = ["supply"]

[[acl.rules]]
glob = "projects/heron.txt"
labels = ["staff", "heron"]

[acl.principals]
admin = ["staff", "supply"]
bob = ["staff"]
eve = ["heron"]
"""


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The examples under a policy: admin reads everything, bob all but the Helio Cells supplier
    profile, eve the Heron project file only."""
    return indexed_examples(tmp_path_factory.mktemp("engines"), POLICY)


@pytest.fixture(scope="module")
def service(workspace: Workspace) -> Iterator[CanopyService]:
    svc = CanopyService(workspace)
    yield svc
    svc.close()


@pytest.fixture(scope="module")
def g(service: CanopyService) -> Graph:
    return load_graph(service.store)


@pytest.fixture
def ctx(service: CanopyService) -> Iterator[QueryContext]:
    """A caller who reads everything."""
    with service.context("admin") as c:
        yield c


@pytest.fixture
def restricted(service: CanopyService) -> Iterator[QueryContext]:
    """A caller who may not read the Helio Cells supplier profile."""
    with service.context("bob") as c:
        yield c


def hidden_units(g: Graph) -> set[str]:
    return {u.id for u in g.units.values() if g.documents[u.document_id].path == HIDDEN_DOC}


def partition(g: Graph, level: int) -> set[str]:
    return {c.id for c in g.communities.values()
            if c.level == level or (c.level < level and not c.children)}


def assert_citations_resolve(ctx: QueryContext, result: SearchResult) -> None:
    assert result.citations, "an answer with no citations"
    for c in result.citations:
        if c.kind == "report":
            assert run(drill_down(ctx, community_id=c.id)).community.id == c.id
        elif c.kind == "text_unit":
            span = source_span(ctx, c.id)
            assert span.document == c.document and span.text
        elif c.kind == "entity":
            assert run(drill_down(ctx, entity=c.id)).entity.id == c.id


def markdown_and_reads(service: CanopyService, who: str, cid: str) -> tuple[str, list[list[str]]]:
    """`who`'s Markdown of report `cid`, and the ids of each read of reports it made."""
    with service.context(who) as c, report_reads(c.reader) as reads:
        return run(report_markdown(c, cid)), reads


def listed_children(markdown: str) -> list[str]:
    """The ids a report's Markdown lists under "Sub-communities:"."""
    if "\nSub-communities:\n" not in markdown:
        return []
    section = markdown.split("\nSub-communities:\n", 1)[1].split("\n\n", 1)[0]
    return [line.split("`")[1] for line in section.splitlines()]


def served_provenance(ctx: QueryContext, kind: str, item_id: str) -> tuple[str, ...]:
    """Provenance of the artifact as served to ctx's caller (canonical or a view)."""
    if kind == "text_unit":
        return (item_id,)
    r = ctx.reader
    if kind == "claim":
        row = r.snap.claims([item_id])[item_id]
        return {c.id: c for c in r.claims_of([row.claim.subject])}[item_id].text_unit_ids
    fetch = {"report": r.reports, "entity": r.entities, "relationship": r.relationships}[kind]
    served = run(fetch([item_id])).get(item_id)
    assert served is not None, (kind, item_id)
    return served.text_unit_ids


class TestGlobalSearch:
    def test_a_fixed_level_answers_from_the_level_partition_and_cites_resolvable_reports(self, ctx,
                                                                                         g):
        result = run(global_search(ctx, SUPPLY_RISKS, community_level=1))
        assert result.method == "global" and result.community_level == 1
        assert result.answer.strip() and result.answer != NOTHING_FOUND
        assert {c.id for c in result.citations} <= partition(g, 1)
        assert all(c.kind == "report" for c in result.citations)
        assert_citations_resolve(ctx, result)

    def test_level_l_means_communities_at_l_plus_childless_shallower_ones(self, ctx, g):
        ids = {r.community_id for r in run(reports_at_level(ctx, 1))}
        assert ids == {c.id for c in g.communities.values()
                       if c.level == 1 or (c.level == 0 and not c.children)}

    def test_dynamic_selection_rates_from_the_roots_and_reports_progress(self, ctx, g):
        seen: list[tuple[float, float | None, str]] = []

        async def progress(done: float, total: float | None, message: str) -> None:
            seen.append((done, total, message))

        ctx.progress = progress
        result = run(global_search(ctx, SUPPLY_RISKS))
        assert result.community_level is None and result.answer != NOTHING_FOUND
        assert_citations_resolve(ctx, result)
        assert any("rating" in m for *_, m in seen) and any("map" in m for *_, m in seen)
        cov = result.coverage
        assert cov is not None and cov.rating_calls >= 1 and cov.map_calls >= 1
        assert result.usage.llm_calls == cov.rating_calls + cov.map_calls + 1  # and the reduce

    @pytest.mark.parametrize("question", ["What are the main themes?",
                                          "What are the top 5 topics of these documents?",
                                          "What are the main themes across these documents?"])
    def test_a_sensemaking_question_gets_an_overview_citing_most_of_the_top(self, ctx, g,
                                                                             question):
        """Offline: every top-level community is rated, and the answer's citations fall under
        most of them, so its sources span the corpus."""
        result = run(global_search(ctx, question))
        assert result.answer != NOTHING_FOUND and result.coverage is not None
        roots = {c.id for c in g.communities.values() if c.parent is None}
        assert result.coverage.levels[0].considered == result.coverage.levels[0].rated == len(
            roots)

        def root_of(cid: str) -> str:
            while g.communities[cid].parent is not None:
                cid = g.communities[cid].parent  # type: ignore[assignment]
            return cid

        cited = {root_of(c.id) for c in result.citations}
        assert len(cited) >= len(roots) // 2 + 1, (len(cited), len(roots))

    def test_the_main_themes_are_the_top_communities_whatever_function_words_it_has(self, ctx,
                                                                                   g):
        """Offline, "main themes" cites top-level communities, and "across these documents"
        changes nothing: no report or point is chosen for a word that says nothing."""
        plain = run(global_search(ctx, "What are the main themes?"))
        worded = run(global_search(ctx, "What are the main themes across these documents?"))
        assert plain.citations and worded.citations == plain.citations
        assert worded.answer == plain.answer
        assert all(g.communities[c.id].parent is None for c in plain.citations)

    def test_a_question_about_nothing_in_the_corpus_says_nothing_relevant_was_found(self, ctx):
        for level in (None, 0):
            result = run(global_search(ctx, "What is the capital of Mongolia?",
                                       community_level=level))
            assert result.answer == NOTHING_FOUND and "No relevant information" in result.answer
            assert result.citations == []

    def test_batches_are_a_seeded_shuffle_within_the_token_budget(self, ctx):
        reports = run(reports_at_level(ctx, 1))
        a = map_batches(reports, seed=7, batch_tokens=1500)
        assert a == map_batches(list(reversed(reports)), seed=7, batch_tokens=1500)
        assert sorted(r.community_id for b in a for r in b) == sorted(
            r.community_id for r in reports)
        assert len(a) > 1
        assert [r.community_id for b in a for r in b] != [
            r.community_id for b in map_batches(reports, seed=8, batch_tokens=1500) for r in b]


class TestLocalSearch:
    def test_finds_helio_cells_context_for_the_battery_cell_question(self, ctx):
        result = run(local_search(ctx, CELLS))
        assert "Helio Cells Ltd" in result.answer
        assert any(c.kind == "entity" and c.title == "Helio Cells Ltd" for c in result.citations)
        assert_citations_resolve(ctx, result)

    def test_context_mixes_every_kind_within_the_budget(self, ctx):
        result = run(local_search(ctx, "Who leads Project Kestrel?"))
        kinds = {c.kind for c in result.citations}
        assert {"report", "entity", "text_unit"} <= kinds
        assert "-----relationships-----\n[relationship rel-" in result.context  # by its id
        assert "relationship" not in kinds  # no tool opens one: its id in the context does
        budget = context_budget(ctx, configured=ctx.settings.local_context_tokens)
        assert tokenizer().count(result.context) <= budget * 1.05 and not result.truncated
        assert result.usage.llm_calls == 1 and result.usage.provider == "builtin"

    def test_citations_follow_the_ranking_text_units_first(self, ctx):
        """The delivered order is the retrieval order: the text units of the context, in the
        order local_search ranked them, then entities, then reports; the extractive answer
        quotes those units from the top down, whatever words lower ones share."""
        q = "Which supplier makes the battery cells?"
        result = run(local_search(ctx, q))
        kinds = [c.kind for c in result.citations]
        assert kinds == sorted(kinds, key=["text_unit", "entity", "report"].index)
        ranking = run(local_unit_ranking(ctx, q))
        units = [c.id for c in result.citations if c.kind == "text_unit"]
        assert units == ranking[:len(units)] and len(units) >= 5
        quoted = [m for m in re.findall(r"\[text_unit (tu-[0-9a-f]+)\]", result.answer)]
        assert quoted and quoted == [u for u in units if u in quoted]  # in rank order
        assert result.context.index("[text_unit ") < result.context.index("[entity ")

    def test_exact_entity_names_in_the_question_come_first(self, ctx):
        result = run(local_search(ctx, "Who leads Project Kestrel?"))
        first_entity = next(c for c in result.citations if c.kind == "entity")
        assert first_entity.title == "Project Kestrel"


class TestDriftAndBasic:
    def test_drift_follows_up_with_local_searches_and_is_deterministic(self, ctx):
        seen: list[str] = []

        async def progress(done: float, total: float | None, message: str) -> None:
            seen.append(message)

        ctx.progress = progress
        first = run(drift_search(ctx, "What caused the Tern recall?"))
        ctx.progress = None
        second = run(drift_search(ctx, "What caused the Tern recall?"))
        assert first.answer == second.answer and first.citations == second.citations
        assert "HC-2311" in first.answer
        assert any("depth 1" in m for m in seen)
        # hyde + primer + follow-ups + reduce
        assert first.usage.llm_calls >= 3 + min(ctx.settings.drift_breadth, 1)
        assert_citations_resolve(ctx, first)

    def test_basic_search_answers_from_cited_text_units(self, ctx):
        result = run(basic_search(ctx, "How many Tern packs were recalled?", k=5))
        assert "340" in result.answer
        assert {c.kind for c in result.citations} == {"text_unit"} and len(result.citations) <= 5
        assert_citations_resolve(ctx, result)


class TestDrillDown:
    def test_no_arguments_lists_the_roots(self, ctx, g):
        result = run(drill_down(ctx, limit=100))
        assert result.community is None and result.children
        assert {c.id for c in result.children} == {
            c.id for c in g.communities.values() if c.parent is None}

    def test_pages_of_the_roots_follow_each_other_and_say_how_to_get_the_next(self, ctx, g):
        roots = [c.id for c in run(drill_down(ctx, limit=100)).children]
        assert len(roots) > 4
        seen: list[str] = []
        offset = 0
        while offset < len(roots):
            page = run(drill_down(ctx, limit=3, offset=offset))
            seen += [c.id for c in page.children]
            if offset + 3 < len(roots):
                assert page.truncated and page.note and (
                    f"Showing top-level communities {offset + 1}-{offset + 3} of {len(roots)}: "
                    f"call drill_down(limit=3, offset={offset + 3}) for the next ones."
                    in page.note)
            else:
                assert not page.truncated
            offset += 3
        assert seen == roots  # every root once, in the listing's order
        past = run(drill_down(ctx, limit=3, offset=len(roots) + 5))
        assert past.children == [] and past.note and "past the" in past.note
        with pytest.raises(InvalidArgument):
            run(drill_down(ctx, offset=-1))

    def test_an_entitys_relationships_page_too(self, ctx, g):
        hub = max(g.entities.values(), key=lambda e: e.degree)
        first = run(drill_down(ctx, entity=hub.name, limit=2))
        second = run(drill_down(ctx, entity=hub.name, limit=2, offset=2))
        assert len(first.relationships) == 2 and second.relationships
        assert not {r.id for r in first.relationships} & {r.id for r in second.relationships}
        assert first.note and f"entity={hub.name!r}, limit=2, offset=2" in first.note

    def test_a_community_shows_its_report_parents_children_and_members(self, ctx, g):
        child = next(c for c in g.communities.values() if c.level == 2)
        result = run(drill_down(ctx, community_id=child.parent))
        assert result.community.id == child.parent and result.findings
        assert child.id in {c.id for c in result.children}
        assert [p.id for p in result.parents] == [g.communities[child.parent].parent]
        assert result.entities and result.relationships
        below = run(drill_down(ctx, community_id=child.id))
        assert [p.id for p in below.parents][-1] == child.parent

    def test_a_communitys_lists_are_its_heaviest_relationships_and_best_connected_members(
            self, service, ctx, g):
        """The stored orderings a caller who reads everything is paged from agree with the graph,
        and with the edge-by-edge path every other caller takes."""
        top = max((c for c in g.communities.values() if c.children),
                  key=lambda c: len(c.entity_ids))
        inside = set(top.entity_ids)
        among = [r for r in g.relationships.values() if {r.source, r.target} <= inside]
        heaviest = [r.id for r in sorted(among, key=lambda r: (-r.weight, r.id))]
        ranked = [e.id for e in sorted((g.entities[e] for e in inside),
                                       key=lambda e: (-e.degree, e.name, e.id))]
        ctx.settings = ctx.settings.model_copy(update={"result_token_limit": 30_000})
        assert ctx.reader.trivial
        for offset in (0, 3):
            fast = run(drill_down(ctx, community_id=top.id, limit=3, offset=offset))
            assert [r.id for r in fast.relationships] == heaviest[offset:offset + 3]
            assert [e.id for e in fast.entities] == ranked[offset:offset + 3]
            assert fast.note and f"relationships {offset + 1}-" in fast.note
            assert f"of {len(among)}" in fast.note and f"of {len(inside)}" in fast.note
            assert [c.id for c in fast.children] == sorted(top.children)[offset:offset + 3]
            with service.context("admin") as slow_ctx:
                slow_ctx.settings = ctx.settings
                slow_ctx.reader.trivial = False  # the edge-by-edge path, same rights
                slow = run(drill_down(slow_ctx, community_id=top.id, limit=3, offset=offset))
            assert slow.model_dump(exclude={"usage"}) == fast.model_dump(exclude={"usage"})

    def test_an_entity_leads_to_its_deepest_community_and_its_card(self, ctx, g):
        result = run(drill_down(ctx, entity="  helio CELLS ltd. "))
        assert result.entity.name == "Helio Cells Ltd"
        deepest = ctx.reader.communities_of([result.entity.id])[result.entity.id][0]
        assert result.community.id == deepest
        supporting = g.entities[result.entity.id].text_unit_ids
        assert result.sources and all(s.text_unit_id in supporting for s in result.sources)

    def test_a_leaf_community_shows_the_source_spans_behind_it(self, ctx, g):
        leaf = next(c for c in sorted(g.communities.values(), key=lambda c: c.id)
                    if not c.children and c.level > 0)
        # Room for whole spans: this is about where they come from, not about the size limit.
        ctx.settings = ctx.settings.model_copy(update={"result_token_limit": 30_000})
        result = run(drill_down(ctx, community_id=leaf.id, limit=3))
        assert 0 < len(result.sources) <= 3
        for span in result.sources:
            unit = g.units[span.text_unit_id]
            assert span.char_end - span.char_start == len(span.text)
            assert unit.text.endswith(span.text)

    def test_a_finding_shows_the_sources_that_support_it(self, ctx, g):
        report = next(r for r in g.reports.values()
                      if r.findings and r.findings[0].text_unit_ids)
        # Room for every span (each names its document's date now): this is about provenance.
        ctx.settings = ctx.settings.model_copy(update={"result_token_limit": 30_000})
        result = run(drill_down(ctx, community_id=report.community_id, finding=0, limit=100))
        assert not result.truncated
        assert {s.text_unit_id for s in result.sources} == set(report.findings[0].text_unit_ids)

    def test_lists_are_capped_by_limit_with_a_note_naming_the_next_call(self, ctx, g):
        big = max(g.communities.values(), key=lambda c: len(c.entity_ids))
        result = run(drill_down(ctx, community_id=big.id, limit=1))
        assert len(result.entities) == 1 and len(result.relationships) == 1
        assert result.truncated and f"drill_down(community_id={big.id!r}, limit=" in result.note

    def test_reports_are_listed_and_rendered_as_markdown(self, ctx, g):
        cards = run(list_servable_reports(ctx))
        assert len(cards) == len(g.reports)
        md = run(report_markdown(ctx, cards[0].id))
        assert md.startswith(f"# {cards[0].title}") and cards[0].id in md

    @pytest.mark.parametrize(("who", "size"), [("admin", 2), ("eve", 1)])
    def test_a_reports_markdown_lists_drill_downs_first_page_of_sub_communities(
            self, service, g, monkeypatch, who, size):
        """A top community at 10k articles has ~960 sub-communities: the resource lists the
        first page of drill_down's, reads only their reports, and names the drill_down call
        for the next page, counting only what the caller sees (eve: not the hidden ones)."""
        monkeypatch.setattr(drill, "REPORT_CHILDREN", size)
        cut, fewer = [], []
        for cid in sorted(c.id for c in g.communities.values() if c.children):
            with service.context(who) as c:
                c.settings = c.settings.model_copy(update={"result_token_limit": 30_000})
                try:
                    every = [k.id for k in run(drill_down(c, community_id=cid, limit=100)).children]
                except NotFound:
                    continue
                paged = run(drill_down(c, community_id=cid, limit=size))
                next_page = run(drill_down(c, community_id=cid, limit=size, offset=size))
                run(report_markdown(c, cid))  # builds eve's views first (they read reports)
            md, reads = markdown_and_reads(service, who, cid)
            assert listed_children(md) == every[:size], cid
            call = f"drill_down(community_id={cid!r}, limit={size}, offset={size})"
            if len(every) > size:
                cut.append(cid)
                assert f"Showing sub-communities 1-{size} of {len(every)}: call {call} " \
                       "for the next ones." in md.splitlines()
                assert paged.note and call in paged.note  # the call drill_down names itself
                assert [k.id for k in next_page.children] == every[size:2 * size]
            else:
                assert "Showing sub-communities" not in md and "drill_down(" not in md
            if len(every) < len(g.communities[cid].children):
                fewer.append(cid)
            # Only the report itself, its parent's, and the listed sub-communities' are read.
            own = {cid, g.communities[cid].parent}
            assert all(len(ids) <= max(size, 1) for ids in reads), reads
            assert [k for ids in reads for k in ids if k not in own] == every[:size], reads
        assert cut  # positive controls: some lists are cut, some of eve's hide sub-communities
        assert fewer if who == "eve" else not fewer


class TestServingRule:
    def test_hidden_and_unknown_ids_give_the_same_not_found_message(self, service, g):
        # Hidden: nothing of it is visible (a partly visible artifact is served as a view), so
        # this caller (eve) reads one document only.
        shown = next(d.id for d in g.documents.values() if d.path == "projects/heron.txt")
        hidden = {u.id for u in g.units.values() if u.document_id != shown}
        report = next(r for r in g.reports.values() if all(
            set(g.entities[e].text_unit_ids) <= hidden
            for e in g.communities[r.community_id].entity_ids))
        entity = next(e for e in g.entities.values() if set(e.text_unit_ids) <= hidden)
        unit = min(hidden)
        with service.context("eve") as restricted:
            pairs = [
                (lambda i: run(drill_down(restricted, community_id=i)), report.community_id,
                 "c9-0000000000"),
                (lambda i: run(drill_down(restricted, entity=i)), entity.name, "Nobody Such"),
                (lambda i: run(report_markdown(restricted, i)), report.community_id,
                 "c1-ffffffffff"),
                (lambda i: source_span(restricted, i), unit, "tu-0000000000000000"),
            ]
            for call, hidden_id, unknown_id in pairs:
                messages = []
                for i in (hidden_id, unknown_id):
                    with pytest.raises(NotFound) as err:
                        call(i)
                    messages.append(str(err.value).replace(repr(i), "<id>"))
                assert messages[0] == messages[1]

    def test_no_engine_serves_anything_derived_from_an_unreadable_document(self, restricted, g):
        hidden = hidden_units(g)
        results = [
            run(global_search(restricted, SUPPLY_RISKS, community_level=1)),
            run(global_search(restricted, SUPPLY_RISKS)),
            run(local_search(restricted, CELLS)),
            run(drift_search(restricted, "What caused the Tern recall?")),
            run(basic_search(restricted, CELLS)),
        ]
        for result in results:
            for c in result.citations:
                assert not hidden & set(served_provenance(restricted, c.kind, c.id)), (
                    result.method, c)
        drilled = [run(drill_down(restricted, limit=100))]
        listed = run(list_servable_reports(restricted))
        assert listed and any(  # some reports are views of communities that touch the hidden doc
            hidden & set(g.reports[c.id].text_unit_ids) for c in listed)
        drilled += [run(drill_down(restricted, community_id=c.id, limit=100)) for c in listed]
        for d in drilled:
            for card in [*d.children, *d.parents, *([d.community] if d.community else [])]:
                assert not hidden & set(served_provenance(restricted, "report", card.id))
            for e in d.entities:
                assert not hidden & set(served_provenance(restricted, "entity", e.id))
            assert not hidden & {s.text_unit_id for s in d.sources}


class TestArgumentsAndLimits:
    @pytest.mark.parametrize("call", [
        lambda c: global_search(c, "  "),
        lambda c: local_search(c, ""),
        lambda c: drift_search(c, "\n"),
        lambda c: basic_search(c, " "),
        lambda c: global_search(c, SUPPLY_RISKS, community_level=99),
        lambda c: global_search(c, SUPPLY_RISKS, community_level=-1),
        lambda c: basic_search(c, CELLS, k=0),
        lambda c: drill_down(c, limit=0),
        lambda c: drill_down(c, community_id="x", entity="y"),
        lambda c: drill_down(c, finding=0),
    ])
    def test_bad_arguments_raise_invalid_argument(self, ctx, call):
        with pytest.raises(InvalidArgument):
            run(call(ctx))

    def test_a_finding_out_of_range_is_an_invalid_argument(self, ctx, g):
        report = next(iter(g.reports.values()))
        with pytest.raises(InvalidArgument, match="finding must be from 0"):
            run(drill_down(ctx, community_id=report.community_id, finding=len(report.findings)))

    @pytest.mark.parametrize("method", ["global", "local", "drift", "basic"])
    def test_a_tiny_result_limit_truncates_and_names_the_next_call(self, ctx, method):
        ctx.settings = ctx.settings.model_copy(update={"result_token_limit": 600})
        engine = {"global": global_search, "local": local_search, "drift": drift_search,
                  "basic": basic_search}[method]
        result = run(engine(ctx, SUPPLY_RISKS))
        assert result.truncated and result.note
        assert any(call in result.note for call in ("drill_down(", "local_search(", "basic_search"))
        assert delivered_tokens(result) <= 600  # its text and structured content together

    def test_the_smallest_result_limit_shortens_drill_down_sources_and_lists(self, ctx):
        """At the floor of [query] result_token_limit: one item of each list, shortened
        texts, and for each list still the exact call for its next page."""
        floor = QuerySettings.model_fields["result_token_limit"].metadata[0].ge
        ctx.settings = ctx.settings.model_copy(update={"result_token_limit": floor})
        result = run(drill_down(ctx, entity="Helio Cells Ltd", limit=5))
        assert result.truncated and "canopy://units/tu-" in result.note
        assert delivered_tokens(result) <= floor
        assert len(result.relationships) == 1
        assert "drill_down(entity='Helio Cells Ltd', limit=1, offset=1)" in result.note


class TestUsage:
    def test_concurrent_calls_on_one_provider_count_only_their_own_calls(self, ctx):
        async def both():  # type: ignore[no-untyped-def]
            return await asyncio.gather(global_search(ctx, SUPPLY_RISKS, community_level=0),
                                        local_search(ctx, CELLS))

        alone = [run(global_search(ctx, SUPPLY_RISKS, community_level=0)),
                 run(local_search(ctx, CELLS))]
        together = run(both())
        assert [r.usage.llm_calls for r in together] == [r.usage.llm_calls for r in alone]
        assert together[1].usage.llm_calls == 1

    def test_global_map_calls_to_an_llm_run_concurrently(self, ctx, fake_openai):
        """With 0.3 s per request, the map batches must overlap: the wall time stays far below
        the sum of the request latencies, and each result counts only its own requests."""
        fake_openai.latency = 0.3
        endpoint = LLMSettings(base_url=fake_openai.base_url, model="fake", concurrency=16)
        client = ChatClient(endpoint, backoff_base=0.01)
        settings = ctx.settings.model_copy(update={"map_batch_tokens": 500})
        llm = QueryContext(ctx.reader, LLMProvider(client), settings)
        n_batches = len(map_batches(run(reports_at_level(llm, 1)), seed=settings.seed,
                                    batch_tokens=500))
        assert n_batches >= 4

        start = time.perf_counter()
        first = run(global_search(llm, SUPPLY_RISKS, community_level=1))
        wall = time.perf_counter() - start
        assert fake_openai.count("map") == n_batches
        n_requests = len(fake_openai.requests)
        assert first.usage.llm_calls == n_requests == n_batches + fake_openai.count("reduce")
        assert wall < 0.5 * 0.3 * first.usage.llm_calls
        assert fake_openai.max_in_flight >= 4
        assert first.usage.prompt_tokens > 0 and first.usage.provider == "openai:fake"

        before = len(fake_openai.requests)

        async def pair():  # type: ignore[no-untyped-def]
            return await asyncio.gather(
                global_search(llm, SUPPLY_RISKS, community_level=1),
                global_search(llm, "Who supplies the motors?", community_level=0))

        a, b = run(pair())
        assert a.usage.llm_calls == first.usage.llm_calls
        assert a.usage.llm_calls + b.usage.llm_calls == len(fake_openai.requests) - before
        assert sum(u.calls for u in llm.provider.usage().values()) == len(fake_openai.requests)


class TestCli:
    def test_query_prints_the_answer_then_its_sources(self, workspace):
        args = ["query", str(workspace.docs_dir), "--index-dir", str(workspace.index_dir),
                "--principal", "admin", "-m", "local",
                CELLS]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0, out.output
        answer, _, sources = out.stdout.partition("\nSources:\n")
        assert "Helio Cells Ltd" in answer and "[text_unit tu-" in sources

    def test_query_json_is_a_search_result(self, workspace):
        args = ["query", str(workspace.docs_dir), "--index-dir", str(workspace.index_dir),
                "--principal", "admin", "--level", "0",
                "--json", SUPPLY_RISKS]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        assert data["method"] == "global" and data["community_level"] == 0 and data["citations"]

    def test_query_errors_are_one_line_without_a_traceback(self, workspace):
        args = ["query", str(workspace.docs_dir), "--index-dir", str(workspace.index_dir),
                "--principal", "admin", "--level", "9",
                "x"]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 1 and "community_level must be" in out.output
        assert "Traceback" not in out.output

    def test_an_unknown_principal_under_no_policy_still_reads_everything(self, workspace):
        args = ["query", str(EXAMPLES), "--index-dir", str(workspace.index_dir), "-m", "basic",
                "--principal", "nobody", "--json", CELLS]
        out = CliRunner().invoke(main, args)
        assert out.exit_code == 0 and json.loads(out.stdout)["citations"]


MULTI_PART = ("Who leads Project Tern, who is the key account manager at Helio Cells Ltd, and how "
              "many Tern packs were recalled?")


class TestLocalRanking:
    """local_search's text units: evidence ranking, document diversity, excerpts (tuned on
    MultiHop-RAG with benchmarks/retrieval_eval.py)."""

    def test_a_name_inside_a_longer_name_in_the_question_is_not_an_entity_of_its_own(self, ctx):
        from canopy.server.engines.local_engine import named_entities

        def names(query: str) -> list[str]:
            return [ctx.reader.entity_rows([e])[e].entity.name for e in named_entities(ctx, query)]

        assert names("Who leads Project Kestrel?") == ["Project Kestrel"]
        found = names(MULTI_PART)
        assert found[:2] == ["Helio Cells Ltd", "Project Tern"] and "Tern" in found  # 2nd mention

    def test_a_multi_part_question_gets_units_of_many_documents_each_once_first(self, ctx, g):
        from canopy.server.engines.local_engine import DIVERSE_DOCS, build_local_context

        local = run(build_local_context(ctx, MULTI_PART, budget=8000))
        docs = [g.units[b.id].document_id for b in local.blocks if b.kind == "text_unit"]
        head = docs[:DIVERSE_DOCS]
        assert len(set(head)) == len(head) >= 6
        paths = [g.documents[d].path for d in docs[:4]]
        assert {"projects/tern.md", "suppliers/helio_cells.md"} <= set(paths)
        assert tokenizer().count(render_blocks(local.blocks)) <= 8000 * 1.05

    def test_candidates_are_scored_from_their_stored_analyses_not_their_text(
            self, ctx, g, monkeypatch):
        """The indexer stores each unit's terms piece by piece (builtin.text.sentence_terms);
        ranking reads them and analyses no candidate's text (analysing them at every query was
        the largest part of local_search's CPU at 10,000 articles). The evidence is the same
        either way; an analysis stored by another version of it is not used."""
        import canopy.server.engines.evidence as evidence
        from canopy.providers.builtin.text import ANALYSIS_TAG, sentence_terms
        from canopy.server.context import BoundedCache

        analysed: list[str] = []

        def split(text: str) -> list[str]:
            analysed.append(text)
            return original(text)

        original = evidence.split_at_stops
        monkeypatch.setattr(evidence, "split_at_stops", split)
        monkeypatch.setattr(ctx.caches, "unit_evidence", BoundedCache(32 << 20))
        vector = run(ctx.reader.embed(MULTI_PART))
        ranked = run(evidence.rank_units(ctx, MULTI_PART, vector))
        assert len(ranked) >= 10 and analysed == []
        stored = ctx.reader.sentence_terms(ranked)
        assert set(stored) == set(ranked)
        for u in ranked[:10]:
            unit = g.units[u]
            doc = g.documents[unit.document_id]
            monkeypatch.setattr(ctx.caches, "unit_evidence", BoundedCache(32 << 20))
            from_index = evidence.unit_evidence(ctx, unit, doc, stored[u])
            monkeypatch.setattr(ctx.caches, "unit_evidence", BoundedCache(32 << 20))
            from_text = evidence.unit_evidence(ctx, unit, doc)
            assert stored[u] == sentence_terms(unit.text)
            assert (from_index.sentence_terms, from_index.windows, from_index.tf,
                    from_index.bigrams, from_index.length) == (
                from_text.sentence_terms, from_text.windows, from_text.tf, from_text.bigrams,
                from_text.length)
        analysed.clear()
        other = stored[ranked[0]].replace(ANALYSIS_TAG, ANALYSIS_TAG + "-older", 1)
        evidence.unit_evidence(ctx, g.units[ranked[0]], g.documents[
            g.units[ranked[0]].document_id], other)
        assert analysed == [g.units[ranked[0]].text]  # another version's terms: from the text

    def test_units_longer_than_their_share_are_cut_to_the_sentences_that_match(self, ctx, g):
        from canopy.server.engines.evidence import excerpt

        unit = next(u for u in g.units.values()
                    if "key account manager" in u.text and tokenizer().count(u.text) > 300)
        doc = g.documents[unit.document_id]
        cut = excerpt(ctx, unit, doc, "Who is the key account manager at Helio Cells Ltd?", 80)
        assert "Hannah Whitcombe" in cut and "…" in cut
        assert tokenizer().count(cut) <= 80 + 10
        assert excerpt(ctx, unit, doc, "anything", 5000) == unit.text

    def test_idf_weights_count_only_units_the_caller_may_read(self, ctx, restricted, g):
        from canopy.providers.builtin.text import lexical_terms
        from canopy.server.engines.evidence import term_weights

        hidden = hidden_units(g)
        hidden_text = " ".join(g.units[u].text for u in hidden)
        visible_text = " ".join(u.text for u in g.units.values() if u.id not in hidden)
        only_hidden = next(t for t in lexical_terms(hidden_text)
                           if t not in set(lexical_terms(visible_text)))
        everyone, _ = term_weights(ctx, [only_hidden])
        bob, _ = term_weights(restricted, [only_hidden])
        assert bob[only_hidden] > everyone[only_hidden]  # df 0 for bob

    def test_each_clause_gets_a_unit_before_a_covered_clause_gets_a_second(self):
        from canopy.server.engines.evidence import COVER, cover_clauses

        # a1, b1 state clause 0 (the better matches); c1 states clause 1; a2 is a1's document.
        ranked = ["a1", "a2", "b1", "c1"]
        scores = {"a1": 10.0, "a2": 9.9, "b1": 9.5, "c1": 8.0}
        masses = {"a1": [5.0, 0.0], "a2": [5.0, 0.0], "b1": [4.5, 0.0], "c1": [0.0, 3.0]}
        doc = {"a1": "A", "a2": "A", "b1": "B", "c1": "C"}.__getitem__
        assert 8.0 + COVER * 3.0 > 9.5
        assert cover_clauses(ranked, scores, masses, doc) == ["a1", "c1", "b1", "a2"]
        assert cover_clauses(ranked, scores, masses, doc, docs=1) == ["a1", "a2", "b1", "c1"]
        no_clauses = {u: [] for u in ranked}
        assert cover_clauses(ranked, scores, no_clauses, doc) == ranked

    def test_the_document_header_counts_in_every_sentence_window(self, tmp_path):
        """"According to the Nordwind Gazette, ... cranes": the source is in the front matter,
        the fact in the third paragraph; the window scoring that clause sees both."""
        from canopy.providers.builtin.text import lexical_terms
        from canopy.server.engines.evidence import unit_evidence

        docs = tmp_path / "docs"
        docs.mkdir()
        (docs / "a.md").write_text("---\nsource: Nordwind Gazette\n---\n# Port news\n\n"
                                   "Ships arrived. Weather was calm.\n\nThe union met.\n\n"
                                   "Twelve cranes were moved along the quay.\n", encoding="utf-8")
        (docs / "b.md").write_text(
            "# Other\n\nCranes were moved at another quay.\n", encoding="utf-8"
        )
        ws = open_workspace(docs, index_dir=tmp_path / "idx")
        build_index(ws)
        svc = CanopyService(ws)
        try:
            g = load_graph(svc.store)
            unit = next(u for u in g.units.values() if "Twelve" in u.text)
            with svc.context(None) as c:
                ev = unit_evidence(c, unit, g.documents[unit.document_id])
            clause = set(lexical_terms("the Nordwind Gazette cranes"))
            assert any(clause <= w for w in ev.windows)
            assert not any(clause <= set(lexical_terms(s)) for s in ev.sentences)
        finally:
            svc.close()

    def test_the_builtin_embedders_vectors_weigh_a_tenth_in_hybrid_search(self, ctx):
        from canopy.server.engines.evidence import LEXICAL_VECTOR_WEIGHT, vector_weight
        from canopy.vectors import rrf

        assert vector_weight(ctx) == LEXICAL_VECTOR_WEIGHT < 1
        text = [f"t{i}" for i in range(10)] + ["both"]
        fused = [h.id for h in rrf(["v1", "both"], text, weights=[0.1, 1.0])]
        assert fused[-1] == "v1"  # vector-only rows follow every full-text row
        assert fused.index("both") < text.index("both")  # rows found by both move up


def test_dynamic_selection_rates_every_root_several_per_call_and_reports_its_coverage(
        ctx: QueryContext, g: Graph) -> None:
    """No similarity gate: every top community is rated, in fewer calls than reports, and the
    result says what was considered, rated and read at each level."""
    import dataclasses

    calls: list[list[str]] = []
    inner = ctx.provider

    class CountingRates:
        name = inner.name

        def __getattr__(self, attr: str):  # type: ignore[no-untyped-def]
            return getattr(inner, attr)

        async def rate(self, query: str, reports):  # type: ignore[no-untyped-def]
            calls.append([r.community_id for r in reports])
            return await inner.rate(query, reports)

    counting = dataclasses.replace(ctx, provider=CountingRates())
    result = run(global_search(counting, "Which supplier makes the battery cells?"))
    roots = {c.id for c in g.communities.values() if c.level == 0}
    rated = [c for call in calls for c in call]
    assert len(roots) > 2 and roots <= set(rated)
    assert len(rated) == len(set(rated))  # nothing rated twice
    assert len(calls) < len(rated)  # several reports per call
    cov = result.coverage
    assert cov is not None and cov.selection == "dynamic" and cov.complete
    top = cov.levels[0]
    assert top.level == 0 and top.considered == top.rated == len(roots)
    assert cov.rating_calls == len(calls)
    assert sum(c.mapped for c in cov.levels) >= len(result.citations) > 0


def test_when_every_rating_is_below_the_threshold_the_best_rated_are_read_within_the_bound(
        ctx: QueryContext, g: Graph, fake_openai) -> None:  # type: ignore[no-untyped-def]
    """A model that finds nothing relevant enough (the fake rates every report 4 of 10): the
    answer still comes from the best-rated reports, the coverage says so, the rating calls stay
    within [query] dynamic_max_rating_calls and their prompt tokens are what the endpoint
    counted."""
    from canopy.server.engines import global_engine as ge
    from tests.fakes.openai_server import _prompt_tokens

    fake_openai.rating_cap = ge.RELEVANCE_THRESHOLD - 1
    client = ChatClient(LLMSettings(base_url=fake_openai.base_url, model="fake"),
                        backoff_base=0.01)
    bound = 3
    settings = ctx.settings.model_copy(update={"rate_batch_tokens": 200,
                                               "dynamic_max_rating_calls": bound})
    llm = QueryContext(ctx.reader, LLMProvider(client), settings)
    unbounded = len(ge._rating_batches(llm, list(run(llm.reader.reports(llm.reader.roots()))
                                                  .values())))
    assert unbounded > bound  # the top level alone needs more calls than the bound allows

    result = run(global_search(llm, SUPPLY_RISKS))
    cov = result.coverage
    assert cov is not None
    rates = [r for r in fake_openai.requests if r.task == "rate"]
    assert len(rates) == cov.rating_calls == bound
    assert cov.rating_prompt_tokens == sum(_prompt_tokens(r.task, r.body) for r in rates) > 0
    assert cov.rating_bound == bound and cov.unrated > 0
    assert sum(c.mapped for c in cov.levels) >= 1 and fake_openai.count("map") >= 1
    assert cov.note is not None and "read anyway" in cov.note and cov.note in cov.line()
    assert "incomplete" in cov.line() and f"bound of {bound} rating calls" in cov.line()
    assert result.answer != NOTHING_FOUND and result.citations
    assert_citations_resolve(ctx, result)
