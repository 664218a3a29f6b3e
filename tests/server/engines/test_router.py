"""The router behind the `search` tool and `canopy query -m auto` (server/engines/router.py).

The rules are checked directly on signals, then on the example corpus with made-up questions
that were written before the rules were first run on them and never used to tune them; the
labelled measurement on real question sets is benchmarks/router_eval.py. A restricted caller's
route must not depend on, or name, an entity they cannot read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from canopy.llm import ChatClient
from canopy.providers.llm_provider import LLMProvider
from canopy.server.cli import main
from canopy.server.context import QueryContext
from canopy.server.engines.router import (
    PERVASIVE_SHARE,
    Linked,
    choose_route,
    question_signals,
    routed_search,
    rule_route,
)
from canopy.server.runtime import Workspace
from canopy.server.service import CanopyService
from canopy.settings import LLMSettings
from tests.conftest import indexed_examples
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.responses import section, user_texts

POLICY = """
[acl]
default = ["staff"]

[[acl.rules]]
glob = "restricted/**"
labels = ["secret"]

[acl.principals]
admin = ["staff", "secret"]
intern = ["staff"]
"""
SECRET = """# Acquisition plan

Zebulon Quartzfield of Okonkwo Brightwater Holdings met Maria Okafor in Rotterdam.
Zebulon Quartzfield wants Okonkwo Brightwater Holdings to buy a share of Helio Cells Ltd.
"""


def run(coro):  # type: ignore[no-untyped-def]
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """The examples plus one restricted document that only admin may read."""
    return indexed_examples(tmp_path_factory.mktemp("router"), POLICY,
                            {"restricted/acquisition.md": SECRET})


@pytest.fixture(scope="module")
def service(workspace: Workspace) -> Iterator[CanopyService]:
    svc = CanopyService(workspace)
    yield svc
    svc.close()


@pytest.fixture
def admin(service: CanopyService) -> Iterator[QueryContext]:
    with service.context("admin") as c:
        yield c


@pytest.fixture
def intern(service: CanopyService) -> Iterator[QueryContext]:
    with service.context("intern") as c:
        yield c


def with_llm(ctx: QueryContext, fake: FakeOpenAI, **settings: object) -> QueryContext:
    client = ChatClient(LLMSettings(base_url=fake.base_url, model="fake"), backoff_base=0.01)
    return QueryContext(ctx.reader, LLMProvider(client), ctx.settings.model_copy(update=settings))


def route_of(ctx: QueryContext, question: str) -> tuple[str, str]:
    r = run(choose_route(ctx, question))
    return r.engine, r.reason


class TestRules:
    """rule_route on signals, without an index."""

    RARE = Linked("Helio Cells Ltd", 0.05, True)
    SUBJECT = Linked("Microsoft", 0.6, True)

    @pytest.mark.parametrize(("question", "linked", "engine"), [
        ("What are the main themes?", [], "global"),
        ("What are the top 5 topics of these documents?", [], "global"),
        ("What does Helio Cells Ltd make?", [RARE], "local"),
        ("Which risks do teams often mention about Helio Cells Ltd?", [RARE], "local"),
        ("How have Microsoft's revenue targets evolved over the years?", [SUBJECT], "global"),
        ("What did Microsoft announce about its cloud revenue?", [SUBJECT], "local"),
        ("How many robots were delivered late?", [], "basic"),
        ("The recall cost how much, and when was it announced?", [], "basic"),
        ("What obstacles do founders describe?", [], "global"),
        ("How is the decision process described by the guests?", [], "global"),
        ("Which company sued the publisher, lost the appeal in March, paid a fine, and later "
         "settled with all of the other plaintiffs?", [], "local"),
        ("What is the warranty period of the charger?", [], "basic"),
    ])
    def test_each_rule_routes_its_kind_of_question(self, question: str, linked: list[Linked],
                                                   engine: str) -> None:
        assert rule_route(question_signals(question, linked))[0] == engine

    def test_a_name_written_in_lower_case_is_not_taken_for_a_named_entity(self) -> None:
        lower = Linked("technology", 0.01, False)
        s = question_signals("How do guests talk about technology?", [lower])
        assert not s.specific and rule_route(s)[0] == "global"

    def test_the_collections_subject_is_the_share_threshold_and_up(self) -> None:
        assert Linked("X", PERVASIVE_SHARE, True).pervasive
        assert not Linked("X", PERVASIVE_SHARE - 0.01, True).pervasive

    def test_the_reason_quotes_the_questions_own_words_for_a_name(self) -> None:
        written = Linked("helio cells LTD", 0.05, True)
        _, reason = rule_route(question_signals("Who runs helio cells LTD?", [written]))
        assert "'helio cells LTD'" in reason and "local_search" in reason


# Written before the rules were first run on them; never used to tune the rules.
MADE_UP = {
    "global": ["What recurring problems do the suppliers cause?",
               "Summarize what the documents say about quality.",
               "Which concerns are shared by several teams?",
               "How do the projects differ in their goals?",
               "What are the biggest risks the company faces?"],
    "local": ["What happened between Northwind Robotics and Helio Cells Ltd?",
              "Who is Maria Okafor?",
              "What does Verdant Grocers buy from Northwind Robotics?"],
    "basic": ["How long did the deliveries stop?",
              "What year did the partnership start?",
              "How much money was budgeted for test benches?"],
}


@pytest.mark.parametrize(("engine", "question"),
                         [(e, q) for e, qs in MADE_UP.items() for q in qs])
def test_made_up_questions_go_to_the_engine_that_suits_them(admin: QueryContext, engine: str,
                                                            question: str) -> None:
    route = run(choose_route(admin, question))
    assert (route.engine, route.by) == (engine, "rules"), route.reason


def test_a_cjk_name_is_linked_inside_an_unspaced_question(admin: QueryContext) -> None:
    engine, reason = route_of(admin, "陈宇负责哪些供应商？")
    assert engine == "local" and "'陈宇'" in reason


def test_routed_search_answers_with_the_chosen_engine_and_says_why(admin: QueryContext) -> None:
    r = run(routed_search(admin, "How many Tern T2 battery packs were recalled?"))
    assert r.route is not None and r.method == r.route.engine == "local"
    assert "'Tern T2" in r.route.reason and "340" in r.answer + r.context
    g = run(routed_search(admin, "What are the main themes?"))
    assert g.method == "global" and g.coverage is not None and g.route is not None


def test_the_cli_routes_with_method_auto_and_prints_why(workspace: Workspace) -> None:
    done = CliRunner().invoke(main, ["query", str(workspace.docs_dir), "--index-dir",
                                     str(workspace.index_dir), "--principal", "admin", "-m",
                                     "auto", "How long did the deliveries stop?"])
    assert done.exit_code == 0, done.output
    assert "Routed to basic_search (offline rules): it asks for one value ('how long')" \
        in done.output


class TestPermissions:
    def test_a_hidden_entity_routes_like_a_name_that_does_not_exist(
            self, admin: QueryContext, intern: QueryContext) -> None:
        engine, reason = route_of(admin, "Who is Zebulon Quartzfield?")
        assert engine == "local" and "Zebulon Quartzfield" in reason
        hidden = route_of(intern, "Who is Zebulon Quartzfield?")
        assert hidden == route_of(intern, "Who is Nobody Suchperson?")
        assert "Zebulon" not in hidden[1]

    def test_the_llm_classifier_is_shown_only_names_the_caller_can_read(
            self, admin: QueryContext, intern: QueryContext, fake_openai: FakeOpenAI) -> None:
        question = "What does Zebulon Quartzfield want from Helio Cells Ltd?"
        run(choose_route(with_llm(intern, fake_openai), question))
        run(choose_route(with_llm(admin, fake_openai), question))
        intern_names, admin_names = (
            section(user_texts(r.body)[0], "Names of the index in the question")
            for r in fake_openai.requests if r.task == "route")
        assert "Helio Cells Ltd" in intern_names and "Zebulon" not in intern_names
        assert "Zebulon Quartzfield" in admin_names


class TestWithAnLLM:
    def test_the_model_classifies_and_its_call_is_counted(
            self, admin: QueryContext, fake_openai: FakeOpenAI) -> None:
        r = run(routed_search(with_llm(admin, fake_openai), "What are the recurring themes?"))
        assert r.route is not None and (r.route.by, r.route.engine) == ("llm", "global")
        assert fake_openai.count("route") == 1
        assert r.usage.llm_calls == len(fake_openai.requests)

    def test_an_unreadable_classification_falls_back_to_the_rules(
            self, admin: QueryContext, fake_openai: FakeOpenAI) -> None:
        fake_openai.malformed_next(2)  # the answer and its repair turn
        route = run(choose_route(with_llm(admin, fake_openai), "How long did deliveries stop?"))
        assert (route.by, route.engine) == ("rules", "basic")
        assert "offline rules decided" in route.reason

    def test_router_llm_off_keeps_the_rules_and_sends_nothing(
            self, admin: QueryContext, fake_openai: FakeOpenAI) -> None:
        route = run(choose_route(with_llm(admin, fake_openai, router_llm=False),
                                 "What are the recurring themes?"))
        assert route.by == "rules" and fake_openai.count("route") == 0


def test_the_held_out_router_set_is_labelled_dev_and_disjoint_from_the_tuning_sets() -> None:
    """benchmarks/data/router_heldout.jsonl: every row resolves to a question with a label,
    its DEV part is large enough to report, and none of its questions is one of the DEV
    questions the rules were written from."""
    from benchmarks import router_eval
    from canopy.server.wings.eval.retrieval import split_of
    from tests.conftest import SHARED, require_shared

    require_shared(SHARED / "graphrag-bench" / "medical_questions.json")
    held = [pair for corpus in router_eval.HELDOUT_SETS
            for pair in router_eval.heldout_questions(corpus)]
    assert len(held) == 243 and {label for _, label in held} == set(router_eval.ENGINES)
    assert len({q for q, _ in held}) == len(held)
    dev = [label for q, label in held if split_of(q) == "dev"]
    assert len(dev) == 213 and min(dev.count(e) for e in router_eval.ENGINES) >= 40
    assert sum(len(router_eval.dev_questions(c)) for c in router_eval.HELDOUT_SETS) == 213
    seen = {q.lower() for name in router_eval.SETS for q, _ in router_eval.dev_questions(name)}
    assert not {q.lower() for q, _ in held} & seen
