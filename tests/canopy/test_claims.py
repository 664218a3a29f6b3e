"""Claims as in Edge et al. 2024 §2.1.2: subject, object, type, status, period and source quote,
from the model's output through the store to local_search and drill_down (issue 12 item 7).

Dates a model returns are normalised to ISO 8601 or dropped; a quote is kept only if it occurs
in its unit's text (whitespace aside), so no tool shows a made-up quote. The fake endpoint's
claims carry GraphRAG-style dates ("2025-01-14T00:00:00", "NONE") and the sentence as the quote.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from canopy.claims import claim_period, iso_date, period, verified_quote
from canopy.llm.structured import json_schema_for
from canopy.model import TextUnit
from canopy.providers.base import ExtractionOut
from canopy.server.engines import drill_down
from canopy.server.engines.local_engine import build_local_context
from canopy.server.runtime import build_index, open_workspace
from canopy.server.service import CanopyService
from canopy.server.tool_text import drill_text
from canopy.store import Store
from canopy.store.export import load_graph
from tests.canopy.providers.test_llm_provider import TYPES, provider_for
from tests.fakes.openai_server import FakeOpenAI

# ---- normalisation (pure) -------------------------------------------------------------------


class TestIsoDate:
    @pytest.mark.parametrize(("raw", "iso"), [
        ("2022-01-10", "2022-01-10"),
        ("2022-01-10T00:00:00", "2022-01-10"),  # GraphRAG's prompt asks for this shape
        ("2022-01-10T08:30:00+02:00", "2022-01-10"),
        ("2022/1/10", "2022-01-10"),
        ("January 10, 2022", "2022-01-10"),
        ("10 Jan 2022", "2022-01-10"),
        ("March 2021", "2021-03"),  # reduced precision is ISO 8601 too
        ("2021", "2021"),
    ])
    def test_dates_a_model_writes_become_iso_8601(self, raw: str, iso: str) -> None:
        assert iso_date(raw) == iso

    @pytest.mark.parametrize("raw", ["", "NONE", "unknown", "2024-02-30", "2021-13",
                                     "31/31/2024", "last spring", "2022-01-10 or so"])
    def test_a_missing_or_malformed_date_becomes_empty_not_an_error(self, raw: str) -> None:
        assert iso_date(raw) == ""

    def test_an_end_before_its_start_is_dropped(self) -> None:
        assert period("2022-03-01", "2022-01-31") == ("2022-03-01", "")
        assert period("2022-03-01", "2022") == ("2022-03-01", "2022")  # same year: consistent
        assert period("NONE", "2022-05-01") == ("", "2022-05-01")


class TestVerifiedQuote:
    TEXT = "Helio Cells Ltd was fined\n  on 10 January 2022.\n\nIt denied wrongdoing."

    def test_a_quote_that_occurs_modulo_whitespace_is_kept_collapsed(self) -> None:
        assert verified_quote("Helio Cells Ltd was fined on 10 January 2022.", self.TEXT) == \
            "Helio Cells Ltd was fined on 10 January 2022."
        assert verified_quote('"It denied wrongdoing."', self.TEXT) == "It denied wrongdoing."

    @pytest.mark.parametrize("quote", [
        "Helio Cells Ltd was fined on 11 January 2022.",  # one character off: not verbatim
        "helio cells ltd was fined",  # case is part of a verbatim quote
        "Helio Cells admitted wrongdoing.",
        "   ",
    ])
    def test_a_quote_that_does_not_occur_is_dropped(self, quote: str) -> None:
        assert verified_quote(quote, self.TEXT) == ""


class TestBuiltinPeriod:
    """The builtin extractor dates a claim only where the sentence is unambiguous."""

    def test_one_full_date_is_a_one_day_period(self) -> None:
        assert claim_period("Helio Cells was fined on 10 January 2022 in Leeds.") == \
            ("2022-01-10", "2022-01-10")

    def test_an_explicit_range_is_start_and_end(self) -> None:
        assert claim_period("The recall ran from March 3, 2024 to 2024-04-30.") == \
            ("2024-03-03", "2024-04-30")

    @pytest.mark.parametrize("sentence", [
        "It was sued in May 2024.",  # month precision: not reliable enough to guess a day
        "Filed on 2024-01-01 and again on 2024-02-02.",  # two dates, no range stated
        "Sued by Quillon Trust.",
    ])
    def test_anything_else_has_no_period(self, sentence: str) -> None:
        assert claim_period(sentence) == ("", "")


# ---- extraction through the real openai client ------------------------------------------------

UNIT_TEXT = ("Helio Cells Ltd supplies cells to Northwind Robotics.\nQuillon Trust sued\n"
             "Helio Cells Ltd on 14 January 2025 over recalled packs. Helio Cells Ltd denied it.")
UNIT = TextUnit("tu-claims", "doc-1", 0, UNIT_TEXT, 30, 0, len(UNIT_TEXT))


def _entity(name: str) -> dict[str, str]:
    return {"name": name, "type": "organization", "description": f"{name}."}


def test_the_extraction_schema_asks_for_dates_and_a_quote() -> None:
    claim = json_schema_for(ExtractionOut)["properties"]["claims"]["items"]
    assert {"start_date", "end_date", "quote"} <= set(claim["required"])


def test_model_dates_are_normalised_and_only_verbatim_quotes_are_kept(fake_openai) -> None:
    claim = {"subject": "Quillon Trust", "object": "Helio Cells Ltd", "type": "lawsuit",
             "status": "TRUE"}
    fake_openai.enqueue("extract", {
        "entities": [_entity("Helio Cells Ltd"), _entity("Quillon Trust")],
        "relationships": [],
        "claims": [
            {**claim, "description": "Quillon Trust sued Helio Cells Ltd.",
             "start_date": "2025-01-14T00:00:00", "end_date": "2025-01-14T00:00:00",
             # the unit breaks this sentence over a line: whitespace does not matter
             "quote": "Quillon Trust sued Helio Cells Ltd on 14 January 2025 over recalled packs."},
            {**claim, "description": "A made-up quote and dates.", "start_date": "31/31/2025",
             "end_date": "soon", "quote": "Quillon Trust won 3 million pounds in damages."},
            {**claim, "type": "denial", "description": "Helio Cells Ltd denied the claim.",
             "start_date": "2025-02-01", "end_date": "2025-01-01", "quote": ""},
        ],
    })
    ex = asyncio.run(provider_for(fake_openai).extract(UNIT, entity_types=TYPES, claims=True,
                                                       max_gleanings=0))
    got = [(c.type, c.start_date, c.end_date, c.quote) for c in ex.claims]
    assert got == [
        ("LAWSUIT", "2025-01-14", "2025-01-14",
         "Quillon Trust sued Helio Cells Ltd on 14 January 2025 over recalled packs."),
        ("LAWSUIT", "", "", ""),  # a malformed date is empty, the invented quote is gone
        ("DENIAL", "2025-02-01", "", ""),  # an end before the start is dropped
    ]


# ---- end to end: index, store, local_search, drill_down ---------------------------------------

DOCS = {
    "suppliers.md": "# Suppliers\n\nHelio Cells Ltd makes battery cells in Sheffield for "
                    "Northwind Robotics.\nNorthwind Robotics buys cells from Helio Cells Ltd.\n",
    "legal.md": "Quillon Trust sued Helio Cells Ltd on 14 January 2025 over\n"
                "recalled Tern packs. Helio Cells Ltd denied the claims of Quillon Trust in "
                "March 2025.\n",
}


def write_docs(root: Path, docs: dict[str, str] = DOCS) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, text in docs.items():
        (root / name).write_text(text, encoding="utf-8")
    return root


def workspace(docs: Path, index_dir: Path, fake: FakeOpenAI) -> Any:
    return open_workspace(docs, index_dir=index_dir, extract={"claims": True, "max_gleanings": 0},
                          llm={"base_url": fake.base_url, "max_retries": 0})


@pytest.fixture
def claims_index(tmp_path: Path, fake_openai: FakeOpenAI) -> Iterator[CanopyService]:
    ws = workspace(write_docs(tmp_path / "docs"), tmp_path / "index", fake_openai)
    build_index(ws)
    svc = CanopyService(ws)
    yield svc
    svc.close()


def test_every_stored_quote_occurs_in_its_unit_and_dates_are_iso(claims_index) -> None:
    g = load_graph(claims_index.store)
    assert g.claims, "the fake endpoint extracted no claim"
    for c in g.claims.values():
        unit = " ".join(g.units[c.text_unit_ids[0]].text.split())
        assert c.quote and c.quote in unit
        assert c.start_date == "" or iso_date(c.start_date) == c.start_date
    sued = [c for c in g.claims.values() if "sued" in c.quote]
    assert [(c.start_date, c.end_date) for c in sued] == [("2025-01-14", "2025-01-14")]
    denied = [c for c in g.claims.values() if "denied" in c.quote]
    assert [(c.start_date, c.end_date) for c in denied] == [("2025-03", "2025-03")]


def test_report_prompts_give_each_claim_its_object_and_period(
        claims_index, fake_openai: FakeOpenAI) -> None:
    """The community report sees who did what to whom and when, as GraphRAG's covariates do."""
    prompts = ["\n".join(str(m.get("content", "")) for m in r.body.get("messages", []))
               for r in fake_openai.requests if r.task == "report"]
    tables = [p.split("-----Claims-----\n", 1)[1] for p in prompts if "-----Claims-----" in p]
    assert tables, "no report prompt carried a claims table"
    rows = [line for t in tables for line in t.splitlines()]
    assert "id,subject,object,type,status,start_date,end_date,description" in rows
    assert any(",Quillon Trust,Helio Cells Ltd,REPORTED_EVENT,TRUE,2025-01-14,2025-01-14," in r
               for r in rows)


def test_drill_down_shows_an_entitys_claims_with_period_and_quote(claims_index) -> None:
    with claims_index.context(None) as ctx:
        r = asyncio.run(drill_down(ctx, entity="Quillon Trust"))
    sued = next(c for c in r.claims if c.start_date)
    assert (sued.subject, sued.object, sued.type, sued.status) == \
        ("Quillon Trust", "Helio Cells Ltd", "REPORTED_EVENT", "TRUE")
    assert (sued.start_date, sued.end_date) == ("2025-01-14", "2025-01-14")
    assert sued.quote == ("Quillon Trust sued Helio Cells Ltd on 14 January 2025 over recalled "
                          "Tern packs.")
    text = drill_text(r)
    assert "Quillon Trust → Helio Cells Ltd: REPORTED_EVENT (TRUE, 2025-01-14)" in text
    assert f'Quote: "{sued.quote}"' in text


def test_drill_down_pages_claims_like_every_other_list(claims_index) -> None:
    with claims_index.context(None) as ctx:
        first = asyncio.run(drill_down(ctx, entity="Helio Cells Ltd", limit=1))
        second = asyncio.run(drill_down(ctx, entity="Helio Cells Ltd", limit=1, offset=1))
    assert len(first.claims) == 1 and len(second.claims) == 1
    assert first.claims[0].id != second.claims[0].id
    assert first.truncated and "claims 1-1 of 2" in (first.note or "")


def test_local_search_context_carries_the_claim_period_and_quote(claims_index) -> None:
    with claims_index.context(None) as ctx:
        local = asyncio.run(build_local_context(ctx, "Who sued Helio Cells Ltd?", budget=4000))
    claims = [b for b in local.blocks if b.kind == "claim"]
    titles = [b.title for b in claims]
    assert "Quillon Trust → Helio Cells Ltd: REPORTED_EVENT (TRUE, 2025-01-14)" in titles
    sued = claims[titles.index("Quillon Trust → Helio Cells Ltd: REPORTED_EVENT (TRUE, "
                               "2025-01-14)")]
    assert sued.text.endswith('Quote: "Quillon Trust sued Helio Cells Ltd on 14 January 2025 '
                              'over recalled Tern packs."')


# ---- existing indexes open, and updates stay equal to a fresh build ---------------------------


def _downgrade(index_dir: Path) -> None:
    """Make the index look like one written before m007: no claim period or quote columns."""
    db = sqlite3.connect(index_dir / "canopy.sqlite")
    for table in ("claims", "claim_instances"):
        for col in ("start_date", "end_date", "quote"):
            db.execute(f"ALTER TABLE {table} DROP COLUMN {col}")
    db.execute("DELETE FROM _migrations WHERE name = 'm007_claim_periods_and_quotes'")
    db.commit()
    db.close()


def test_an_index_from_before_claim_periods_opens_and_keeps_its_claims(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    ws = workspace(write_docs(tmp_path / "docs"), tmp_path / "index", fake_openai)
    build_index(ws)
    store = Store(ws.index_dir)
    before = {c.id: c.description for c in load_graph(store).claims.values()}
    store.close()
    _downgrade(ws.index_dir)
    store = Store(ws.index_dir)  # migrates
    try:
        claims = load_graph(store).claims
        assert {c.id: c.description for c in claims.values()} == before
        assert all((c.start_date, c.end_date, c.quote) == ("", "", "") for c in claims.values())
    finally:
        store.close()
    # an edit re-extracts its units, whose claims now get their period and quote
    (ws.docs_dir / "legal.md").write_text(DOCS["legal.md"] + "\nQuillon Trust is in Leeds.\n",
                                          encoding="utf-8")
    build_index(ws)
    store = Store(ws.index_dir)
    try:
        assert any(c.quote for c in load_graph(store).claims.values())
    finally:
        store.close()


def _claims_of(index_dir: Path) -> list[tuple[str, ...]]:
    store = Store(index_dir)
    try:
        g = load_graph(store)
        return sorted((c.subject, c.object, c.type, c.status, c.description, c.start_date,
                       c.end_date, c.quote, g.units[c.text_unit_ids[0]].text)
                      for c in g.claims.values())
    finally:
        store.close()


def test_incremental_claims_equal_a_fresh_build(tmp_path: Path, fake_openai: FakeOpenAI) -> None:
    docs = write_docs(tmp_path / "docs")
    ws = workspace(docs, tmp_path / "incremental", fake_openai)
    build_index(ws)
    (docs / "legal.md").write_text(DOCS["legal.md"].replace("14 January 2025", "2 February 2025"),
                                   encoding="utf-8")
    (docs / "appeal.md").write_text("Quillon Trust reported an appeal on 2025-04-01.\n",
                                    encoding="utf-8")
    build_index(ws)
    fresh = workspace(docs, tmp_path / "fresh", fake_openai)
    build_index(fresh)
    got = _claims_of(ws.index_dir)
    assert got == _claims_of(fresh.index_dir)
    assert {"2025-02-02", "2025-04-01"} <= {c[5] for c in got}  # the update's claims are in
