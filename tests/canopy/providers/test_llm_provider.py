"""LLMProvider: the Provider tasks as prompts, against the fake endpoint over real HTTP."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from canopy.errors import InvalidOutput
from canopy.llm import ChatClient
from canopy.model import Entity, Finding, Relationship, Report, TextUnit
from canopy.prompts import TASKS, load_prompt, render
from canopy.providers.base import ContextBlock, DriftOut, MapOut, MapPoint, ReportContext, ReportOut
from canopy.providers.llm_provider import NO_DATA_ANSWER, LLMProvider
from canopy.settings import LLMSettings
from tests.fakes import responses
from tests.fakes.openai_server import FakeOpenAI

TYPES = ["organization", "person", "geo", "event"]
TEXT = (
    "Helio Cells hired Mara Quinn in Lisbon Harbor. Mara Quinn later founded Vento Labs with "
    "support from Helio Cells. The merger was announced at the Porto Summit."
)
UNIT = TextUnit("tu-1", "doc-1", 0, TEXT, 40, 0, len(TEXT))


def provider_for(server: FakeOpenAI, **settings: object) -> LLMProvider:
    values: dict[str, object] = {
        "base_url": server.base_url,
        "model": "fake-model",
        "max_retries": 2,
        **settings,
    }
    return LLMProvider(ChatClient(LLMSettings(**values), backoff_base=0.001))


def report(cid: str, title: str, summary: str) -> Report:
    return Report(cid, 0, title, summary, 5.0, "", (Finding("Point", summary),), ("tu-1",), "fp")


# ---- prompts ----------------------------------------------------------------------------------


def test_every_prompt_names_its_task_on_the_first_line():
    for name in TASKS:
        assert load_prompt(name).splitlines()[0] == f"Task: {name}"


def test_render_is_safe_against_braces_and_dollars_in_values():
    text = render("hyde", query='What does {"a": 1} cost in $USD and ${x}?')
    assert '{"a": 1} cost in $USD and ${x}?' in text


def test_render_names_a_missing_value():
    with pytest.raises(ValueError, match="query"):
        render("hyde")


# ---- extraction -------------------------------------------------------------------------------


def test_extract_gleans_and_stops_as_soon_as_a_pass_adds_nothing(fake_openai):
    provider = provider_for(fake_openai)
    ex = asyncio.run(provider.extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=4))
    assert fake_openai.tasks() == ["extract", "glean", "glean"]
    assert ex.passes == 3 and ex.unit_id == "tu-1"
    names = [e.name for e in ex.entities]
    assert {"Helio Cells", "Mara Quinn", "Lisbon Harbor", "Vento Labs", "Porto Summit"} <= set(
        names
    )
    assert len(names) == 6  # plus the one entity the first gleaning pass found
    assert {e.type for e in ex.entities} <= set(TYPES)
    assert all({r.source, r.target} <= set(names) for r in ex.relationships)
    assert ex.claims == ()
    usage = provider.usage()
    assert usage["extract"].calls == 1 and usage["glean"].calls == 2


def test_gleaning_turns_continue_the_extraction_conversation(fake_openai):
    asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=1)
    )
    roles = [m["role"] for m in fake_openai.requests[1].body["messages"]]
    assert roles == ["user", "assistant", "user"]
    assert fake_openai.requests[1].body["messages"][2]["content"].startswith("Task: glean")


def test_a_gleaning_turn_quotes_the_previous_answer_by_name_without_its_descriptions(
        fake_openai):
    """The answer is several times the unit's text: quoted whole, it made the gleaning
    prompt the largest part of a build's prompt tokens."""
    asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=1)
    )
    first = json.loads(responses.chat_content("extract", fake_openai.requests[0].body))
    quoted = json.loads(fake_openai.requests[1].body["messages"][1]["content"])
    assert first["entities"] and first["relationships"]
    assert quoted["entities"] == [{"name": e["name"], "type": e["type"]}
                                  for e in first["entities"]]
    assert quoted["relationships"] == [{"source": r["source"], "target": r["target"]}
                                       for r in first["relationships"]]


def test_extract_without_gleanings_runs_one_pass(fake_openai):
    ex = asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=0)
    )
    assert ex.passes == 1 and fake_openai.tasks() == ["extract"]


def test_extract_returns_claims_only_when_asked(fake_openai):
    ex = asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=True, max_gleanings=0)
    )
    assert ex.claims and ex.claims[0].status in {"TRUE", "FALSE", "SUSPECTED"}
    assert "Skip this step" not in fake_openai.requests[0].body["messages"][0]["content"]


def test_extract_drops_dangling_relationships_maps_types_and_merges_names(fake_openai):
    fake_openai.enqueue(
        "extract",
        {
            "entities": [
                {"name": "Helio Cells", "type": "ORGANIZATION", "description": "A maker of cells."},
                {"name": "Mara Quinn", "type": "persons", "description": "An engineer."},
                {"name": "HELIO CELLS", "type": "organization", "description": "Duplicate."},
                {"name": "Lisbon", "type": "city", "description": "A place."},
            ],
            "relationships": [
                {
                    "source": "helio cells",
                    "target": "Mara Quinn",
                    "description": "Employer.",
                    "strength": 8,
                },
                {
                    "source": "Mara Quinn",
                    "target": "Ghost Corp",
                    "description": "Unknown.",
                    "strength": 3,
                },
                {
                    "source": "Mara Quinn",
                    "target": "Mara Quinn",
                    "description": "Self.",
                    "strength": 3,
                },
            ],
            "claims": [
                {"subject": "Ghost Corp", "type": "x", "status": "TRUE", "description": "dangling"},
                {
                    "subject": "Mara Quinn",
                    "type": "hire",
                    "status": "maybe",
                    "description": "Hired.",
                },
            ],
        },
    )
    ex = asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=True, max_gleanings=0)
    )
    assert [(e.name, e.type) for e in ex.entities] == [
        ("Helio Cells", "organization"),
        ("Mara Quinn", "person"),
        ("Lisbon", "organization"),
    ]
    assert [(r.source, r.target, r.strength) for r in ex.relationships] == [
        ("Helio Cells", "Mara Quinn", 8.0)
    ]
    assert [(c.subject, c.type, c.status) for c in ex.claims] == [
        ("Mara Quinn", "HIRE", "SUSPECTED")
    ]


def test_extract_raises_invalid_output_when_the_output_stays_malformed(fake_openai):
    fake_openai.malformed_next(2)
    with pytest.raises(InvalidOutput):
        asyncio.run(
            provider_for(fake_openai).extract(
                UNIT, entity_types=TYPES, claims=False, max_gleanings=1
            )
        )


def test_extract_works_in_json_mode_when_json_schema_is_rejected(fake_openai):
    fake_openai.reject_json_schema = True
    ex = asyncio.run(
        provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=2)
    )
    assert ex.passes == 3 and len(ex.entities) == 6
    assert fake_openai.tasks() == ["extract", "extract", "glean", "glean"]


# ---- summaries and reports --------------------------------------------------------------------


def test_summarize_merges_several_descriptions(fake_openai):
    text = asyncio.run(
        provider_for(fake_openai).summarize(
            "Helio Cells",
            ["Makes solar cells.", "Based in Lisbon.", "Makes solar cells."],
            max_tokens=6,  # the two distinct descriptions are 8 tokens: over the budget
        )
    )
    assert text == "Makes solar cells. Based in Lisbon."
    prompt = fake_openai.requests[0].body["messages"][0]["content"]
    assert '"Helio Cells"' in prompt and fake_openai.requests[0].body["max_tokens"] == 6


def test_descriptions_that_fit_the_summary_budget_stand_joined_without_a_call(fake_openai):
    descriptions = ["Makes solar cells.", "Based in Lisbon.", "Makes solar cells."]
    text = asyncio.run(
        provider_for(fake_openai).summarize("Helio Cells", descriptions, max_tokens=8))
    assert text == "Makes solar cells. Based in Lisbon." and fake_openai.requests == []


def test_summarize_of_one_description_needs_no_call(fake_openai):
    text = asyncio.run(
        provider_for(fake_openai).summarize("X", ["Only one.", "Only one."], max_tokens=50)
    )
    assert text == "Only one." and fake_openai.requests == []


def _context() -> ReportContext:
    ents = [
        Entity("e1", "Helio Cells", "organization", "A solar cell maker.", ("tu-1",), 2),
        Entity("e2", "Mara Quinn", "person", "An engineer.", ("tu-1",), 1),
        Entity("e3", "Vento Labs", "organization", "A startup.", ("tu-1",), 1),
    ]
    rels = [
        Relationship("r1", "e1", "e2", "Helio Cells hired Mara Quinn.", 8, ("tu-1",)),
        Relationship("r2", "e2", "e3", "Mara Quinn founded Vento Labs.", 9, ("tu-1",)),
    ]
    return ReportContext("c-1", 0, ents, rels)


def test_report_returns_a_valid_report_citing_records_of_its_context(fake_openai):
    out = asyncio.run(provider_for(fake_openai).report(_context(), max_tokens=1500))
    assert isinstance(out, ReportOut) and 0 <= out.rating <= 10
    assert "Helio Cells" in out.title and out.findings
    for f in out.findings:
        assert all(0 <= i < 3 for i in f.entity_ids) and all(0 <= i < 2 for i in f.relationship_ids)
    prompt = fake_openai.requests[0].body["messages"][0]["content"]
    assert "-----Entities-----" in prompt and "0,Helio Cells,A solar cell maker.,2" in prompt


def test_report_drops_ids_that_are_not_in_the_context(fake_openai):
    fake_openai.enqueue(
        "report",
        {
            "title": "T",
            "summary": "S",
            "rating": 4,
            "rating_explanation": "E",
            "findings": [
                {
                    "summary": "F",
                    "explanation": "X",
                    "entity_ids": [0, 7, 0],
                    "relationship_ids": [1, -1],
                    "report_ids": [0],
                }
            ],
        },
    )
    out = asyncio.run(provider_for(fake_openai).report(_context(), max_tokens=500))
    f = out.findings[0]
    assert (f.entity_ids, f.relationship_ids, f.report_ids) == ([0], [1], [])


# ---- query tasks ------------------------------------------------------------------------------


REPORTS = [
    report("c-solar", "Solar manufacturing", "Helio Cells makes solar panels in Lisbon."),
    report("c-fish", "Fishing fleet", "Trawlers work the northern banks."),
]


def test_map_scores_relevant_reports_and_sends_them_with_their_community_ids(fake_openai):
    out = asyncio.run(
        provider_for(fake_openai).map(
            "Who makes solar panels?", REPORTS, response_type="one paragraph"
        )
    )
    assert isinstance(out, MapOut)
    assert [p.report_ids for p in out.points] == [["c-solar"]] and out.points[0].score > 0
    prompt = fake_openai.requests[0].body["messages"][0]["content"]
    assert "[Report c-solar] # Solar manufacturing" in prompt and "[Report c-fish]" in prompt


def test_map_answers_zero_when_no_report_is_relevant(fake_openai):
    out = asyncio.run(
        provider_for(fake_openai).map("quantum chromodynamics", REPORTS, response_type="list")
    )
    assert [p.score for p in out.points] == [0]


def test_map_keeps_only_report_ids_of_its_batch(fake_openai):
    fake_openai.enqueue(
        "map", {"points": [{"description": "d", "score": 50, "report_ids": ["c-solar", "c-zzz"]}]}
    )
    out = asyncio.run(provider_for(fake_openai).map("solar", REPORTS, response_type="list"))
    assert out.points[0].report_ids == ["c-solar"]


def test_reduce_ranks_points_by_score_and_keeps_their_citations(fake_openai):
    points = [
        MapPoint(description="Minor [Data: Reports (c-fish)]", score=10),
        MapPoint(description="Irrelevant", score=0),
        MapPoint(description="Major [Data: Reports (c-solar)]", score=90),
    ]
    text = asyncio.run(
        provider_for(fake_openai).reduce("solar?", points, response_type="two bullet points")
    )
    prompt = fake_openai.requests[0].body["messages"][0]["content"]
    assert prompt.index("Major") < prompt.index("Minor") and "Irrelevant" not in prompt
    assert "two bullet points" in prompt
    assert "[Data: Reports (c-solar)]" in text and "[Data: Reports (c-fish)]" in text


def test_reduce_without_useful_points_answers_without_a_call(fake_openai):
    text = asyncio.run(
        provider_for(fake_openai).reduce(
            "q", [MapPoint(description="x", score=0)], response_type="p"
        )
    )
    assert text == NO_DATA_ANSWER and fake_openai.requests == []


BLOCKS = [
    ContextBlock("entity", "3", "Helio Cells", "A solar panel maker."),
    ContextBlock("text_unit", "tu-1", "", "Helio Cells hired Mara Quinn.", source="news.md"),
]


def test_answer_hyde_rate_and_drift_return_their_types(fake_openai):
    provider = provider_for(fake_openai)
    answer = asyncio.run(
        provider.answer("What is Helio Cells?", BLOCKS, response_type="one sentence")
    )
    assert "[Data: entity (3)]" in answer
    assert "solar" in asyncio.run(provider.hyde("Who builds solar farms?"))
    high, low = asyncio.run(provider.rate("solar panels", REPORTS[:2]))
    assert high > low
    # a report the model leaves out of its answer is rated 0
    fake_openai.enqueue("rate", {"scores": [{"id": REPORTS[1].community_id, "score": 9}]})
    assert asyncio.run(provider.rate("solar panels", REPORTS[:2])) == [0, 9]
    drift = asyncio.run(provider.drift("What is Helio Cells?", BLOCKS))
    assert isinstance(drift, DriftOut) and 0 <= drift.score <= 100 and drift.follow_up_queries
    assert fake_openai.tasks() == ["answer", "hyde", "rate", "rate", "drift"]
    assert set(provider.usage()) == {"answer", "hyde", "rate", "drift"}
    assert provider.name == "openai:fake-model"


def test_every_request_is_identifiable_by_its_task_marker(fake_openai):
    provider = provider_for(fake_openai, json_schema=False)
    asyncio.run(provider.extract(UNIT, entity_types=TYPES, claims=False, max_gleanings=1))
    asyncio.run(provider.map("solar", REPORTS, response_type="list"))
    for req in fake_openai.requests:
        users = [m["content"] for m in req.body["messages"] if m["role"] == "user"]
        assert re.match(r"Task: \w+", users[-1])
    assert fake_openai.tasks() == ["extract", "glean", "map"]
