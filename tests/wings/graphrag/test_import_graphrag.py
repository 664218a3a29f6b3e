"""`canopy import-graphrag` (canopy.server.wings.graphrag.ingest): a Microsoft GraphRAG output
folder becomes a Canopy index that answers from GraphRAG's entities and reports and that `canopy
index` keeps current.

The fixture (tests/fixtures/graphrag, README there) is real GraphRAG 3.3.0 output for two
documents, made against the fake endpoint with 300-token units, so GraphRAG's units differ from
Canopy's and the import must lay one onto the other. Everything after the import runs with the
builtin provider: what GraphRAG wrote (upper-case entity titles, "X and Y community" report
titles) is told apart from what Canopy's builtin provider would write."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from canopy.claims import iso_date, period
from canopy.ids import entity_key, normalize_name
from canopy.model import Claim
from canopy.server.api import Index
from canopy.server.cli import main
from canopy.store import Store
from canopy.store.export import load_graph
from tests.conftest import REPO, offline_env
from tests.fakes import graphrag_responses, responses

FIXTURE = REPO / "tests" / "fixtures" / "graphrag"
OUTPUT = FIXTURE / "output"


def _column(table: str, column: str) -> list[str]:
    return [str(v) for v in pq.read_table(OUTPUT / f"{table}.parquet").column(column).to_pylist()]


def _import(docs: Path, *extra: str, output: Path = OUTPUT) -> dict[str, object]:
    result = CliRunner().invoke(main, ["import-graphrag", str(output), str(docs), "--json",
                                       *extra])
    assert result.exit_code == 0, result.output
    data: dict[str, object] = json.loads(result.stdout)
    return data


def _fresh_docs(root: Path) -> Path:
    docs = root / "docs"
    shutil.copytree(FIXTURE / "input", docs)
    return docs


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, object]]]:
    with offline_env():
        docs = _fresh_docs(tmp_path_factory.mktemp("import-graphrag"))
        yield docs, _import(docs)


def test_import_lays_graphrag_units_onto_canopy_units(
        imported: tuple[Path, dict[str, object]]) -> None:
    _, summary = imported
    assert summary["documents_matched"] == 2 and summary["documents_left_out"] == []
    # GraphRAG's 300-token units are all found in the documents, none is a Canopy unit as is,
    # and every Canopy unit is replayed from them: no extraction by the provider
    assert summary["graphrag_units"] == summary["graphrag_units_located"] == 6
    assert summary["graphrag_units_identical"] == 0
    replay = summary["replay"]
    assert isinstance(replay, dict)
    assert replay["units_replayed"] == summary["canopy_units"] and replay["units_extracted"] == 0
    assert replay["reports_imported"] == summary["communities_kept"] > 0
    stats = summary["stats"]
    assert isinstance(stats, dict)
    # every GraphRAG entity is kept, names merging by Canopy's merge key ("CELLS LTD" and
    # "CELLS": a legal form dropped, canopy.ids.entity_key) and by the links a document makes
    # between a short form and its one longer name ("QA" and "ROBOTICS QA": canopy.aliases)
    docs, _ = imported
    merged = _merged_keys(docs)
    keys = {entity_key(t) for t in _column("entities", "title")}
    assert set(merged) == keys  # every GraphRAG name is an instance
    assert stats["entities"] == len(set().union(*merged.values()))
    assert merged["qa"] == {"qa", "roboticsqa"}  # "QA" beside "ROBOTICS QA" in one unit


def test_local_search_answers_with_imported_entities(
        imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    titles = set(_column("entities", "title"))
    with offline_env(), Index.open(docs) as ix:
        result = ix.local_search("Who supplies battery cells from Sheffield: Helio Cells Ltd?")
    cited = [c.title for c in result.citations if c.kind == "entity"]
    assert "HELIO CELLS LTD" in cited  # GraphRAG's upper-case title, with its description
    assert set(cited) <= titles


def test_global_search_cites_imported_reports(imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    titles = set(_column("community_reports", "title"))
    summaries = set(zip(_column("community_reports", "title"),
                        _column("community_reports", "summary"), strict=True))
    with offline_env(), Index.open(docs) as ix:
        result = ix.global_search("What are the main risks across suppliers and projects?")
        reports = [c for c in result.citations if c.kind == "report"]
        ours = [c for c in reports if c.title in titles]
        assert ours, [c.title for c in reports]
        card = ix.drill_down(community_id=ours[0].id)
    assert card.community is not None
    assert (card.community.title, card.community.summary) in summaries  # GraphRAG's text


def test_edit_then_index_reextracts_only_the_edited_document(tmp_path: Path) -> None:
    docs = _fresh_docs(tmp_path)
    _import(docs)
    with Index.open(docs) as ix:
        noop = ix.update()
        assert noop.stats["noop"] is True  # the import is the index `canopy index` would keep
        kestrel = docs / "projects" / "kestrel.md"
        kestrel.write_text(kestrel.read_text(encoding="utf-8").replace(
            "Maria Okafor", "Ingrid Vasquez"), encoding="utf-8")
        result = ix.update()
        local = ix.local_search("Who is Ingrid Vasquez?")
        helio = ix.local_search("Helio Cells Ltd Sheffield")
    s = result.stats
    assert s["documents_rechunked"] == 1
    # only the edited document's new units go to the (builtin) provider
    assert s["units_extracted"] == result.usage["extract"]["calls"] >= 1
    assert s["units_extracted"] <= s["text_units"] - 1
    names = [c.title for c in local.citations if c.kind == "entity"]
    assert "Ingrid Vasquez" in names  # the builtin provider's extraction of the edit
    assert "HELIO CELLS LTD" in [c.title for c in helio.citations]  # GraphRAG's, kept


def test_an_existing_index_is_not_overwritten(imported: tuple[Path, dict[str, object]]) -> None:
    docs, _ = imported
    result = CliRunner().invoke(main, ["import-graphrag", str(OUTPUT), str(docs)])
    assert result.exit_code == 1
    assert result.output.count("\n") == 1 and "already holds an index" in result.output


@pytest.mark.parametrize("broken", ["not_graphrag", "missing_table", "missing_column",
                                    "claims_column"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, broken: str) -> None:
    docs = _fresh_docs(tmp_path)
    out = tmp_path / "output"
    if broken == "not_graphrag":
        out = docs / "projects"
        expected = "documents.parquet is missing"
    else:
        shutil.copytree(OUTPUT, out)
        if broken == "missing_table":
            (out / "community_reports.parquet").unlink()
            expected = "community_reports.parquet is missing"
        elif broken == "claims_column":  # covariates.parquet is optional, but read if there
            table = pq.read_table(out / "covariates.parquet").drop_columns(["subject_id"])
            pq.write_table(table, out / "covariates.parquet")
            expected = "covariates.parquet lacks the column(s) subject_id"
        else:
            table = pq.read_table(out / "entities.parquet").drop_columns(["title"])
            pq.write_table(table, out / "entities.parquet")
            expected = "lacks the column(s) title"
    result = CliRunner().invoke(main, ["import-graphrag", str(out), str(docs)])
    assert result.exit_code == 1
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert expected in result.output
    assert not (docs / ".canopy").exists()


def test_fake_answers_graphrag_prompts_and_only_those() -> None:
    prompt = ("-Goal-\n...\n######################\n-Real Data-\n######################\n"
              "Entity_types: organization,person\nText: Maria Okafor leads Project Kestrel at "
              "Northwind Robotics.\n######################\nOutput:")
    body = {"messages": [{"role": "user", "content": prompt}]}
    assert responses.identify_task(body) == "graphrag_extract"
    out = graphrag_responses.chat_content("graphrag_extract", body)
    assert out.endswith("<|COMPLETE|>")
    records = [r.strip() for r in out.split("##")]
    assert '("entity"<|>MARIA OKAFOR<|>PERSON<|>' in records[0]
    assert any(r.startswith('("relationship"<|>MARIA OKAFOR<|>PROJECT KESTREL<|>')
               for r in records)
    glean = {"messages": [*body["messages"], {"role": "assistant", "content": out},
                          {"role": "user", "content": "MANY entities and relationships were "
                                                      "missed in the last extraction."}]}
    assert responses.identify_task(glean) == "graphrag_glean"
    # GraphRAG's claim prompt (extract_claims): one tuple per sentence with a name and an event
    # or a date, GraphRAG's delimiters and date shape
    claims = ("-Target activity-\n...\n-Real Data-\nUse the following input for your answer.\n"
              "Entity specification: ['organization', 'person']\nClaim description: Any claims\n"
              "Text: Verdant Grocers announced an order for Antwerp. Kestrel K2 was launched on "
              "12 March 2024 in Hamburg. It is blue.\nOutput:")
    body = {"messages": [{"role": "user", "content": claims}]}
    assert responses.identify_task(body) == "graphrag_claims"
    out = graphrag_responses.chat_content("graphrag_claims", body)
    assert out.endswith("<|COMPLETE|>")
    assert [r.strip() for r in out.removesuffix("<|COMPLETE|>").split("##")] == [
        "(VERDANT GROCERS<|>ANTWERP<|>REPORTED EVENT<|>TRUE<|>NONE<|>NONE<|>Verdant Grocers "
        "announced (involving Antwerp), according to the text<|>Verdant Grocers announced an "
        "order for Antwerp.)",
        "(KESTREL K2<|>MARCH<|>DATED FACT<|>TRUE<|>2024-03-12T00:00:00<|>2024-03-12T00:00:00<|>"
        "A dated fact about Kestrel K2 (involving March), according to the text<|>Kestrel K2 "
        "was launched on 12 March 2024 in Hamburg.)"]
    # Canopy's own prompts keep their tasks
    canopy = {"messages": [{"role": "user", "content": "Task: summarize\n===== Descriptions "
                                                       "=====\n- a\n- b"}]}
    assert responses.identify_task(canopy) == "summarize"


# ---- claims (GraphRAG's covariates.parquet) ---------------------------------------------------


def _squash(text: str) -> str:
    return " ".join(text.split())


def _merged_keys(docs: Path) -> dict[str, set[str]]:
    """For each name's merge key (canopy.ids.entity_key), the keys of the entities its instances
    ended on: its own, or a longer name's its unit or document links it to (canopy.aliases)."""
    db = sqlite3.connect(docs / ".canopy" / "canopy.sqlite")
    try:
        out: dict[str, set[str]] = {}
        for name, key in db.execute("SELECT DISTINCT name, key FROM entity_instances"):
            out.setdefault(entity_key(name), set()).add(key)
        return out
    finally:
        db.close()


def _entity_keys(docs: Path) -> dict[str, str]:
    db = sqlite3.connect(docs / ".canopy" / "canopy.sqlite")
    try:
        return dict(db.execute("SELECT id, key FROM entities").fetchall())
    finally:
        db.close()


def _claims(docs: Path) -> tuple[list[Claim], dict[str, str], dict[str, str]]:
    """The index's claims, entity names by id, and unit texts by id."""
    store = Store(docs / ".canopy")
    try:
        g = load_graph(store)
        return (sorted(g.claims.values(), key=lambda c: c.id),
                {e.id: e.name for e in g.entities.values()},
                {u.id: u.text for u in g.units.values()})
    finally:
        store.close()


def test_claims_are_imported_with_entities_iso_dates_and_verified_quotes(
        imported: tuple[Path, dict[str, object]]) -> None:
    docs, summary = imported
    rows = pq.read_table(OUTPUT / "covariates.parquet").to_pylist()
    assert summary["graphrag_claims"] == summary["claims_placed"] == len(rows)
    assert summary["claims_left_out"] == 0
    claims, names, units = _claims(docs)
    # GraphRAG's duplicates (one sentence in two overlapping units) are one claim each
    distinct = {(r["subject_id"], r["object_id"], r["type"], r["description"]) for r in rows}
    assert len(claims) == len(distinct) < len(rows)
    text = _squash("\n".join(p.read_text(encoding="utf-8")
                             for p in sorted((FIXTURE / "input").rglob("*.md"))))
    got = {(names[c.subject], names.get(c.object, ""), c.type, c.status, c.description,
            c.start_date, c.end_date, c.quote) for c in claims}
    merged = _merged_keys(docs)
    key_of = _entity_keys(docs)
    got = sorted((key_of[c.subject], key_of.get(c.object, ""), c.type, c.status, c.description,
                  c.start_date, c.end_date, c.quote) for c in claims)
    expected = set()
    for r in rows:
        quote = _squash(r["source_text"]) if _squash(r["source_text"]) in text else ""
        # subject and object are GraphRAG's entity titles (upper case), found by Canopy's key
        # and by the links its resolution made (a name may end on a longer one's entity)
        expected.add((r["subject_id"], r["object_id"], r["type"], r["status"], r["description"],
                      *period(r["start_date"], r["end_date"]), quote))
    assert len(got) == len(expected)
    unmatched = list(got)
    for subject, obj, *rest in sorted(expected):
        match = next((g for g in unmatched if g[2:] == tuple(rest)
                      and g[0] in merged[entity_key(subject)]
                      and (g[1] in merged[entity_key(obj)] if obj else g[1] == "")), None)
        assert match is not None, (subject, obj, rest)
        unmatched.remove(match)
    for c in claims:
        assert c.subject and c.object  # every fixture claim names two imported entities
        assert c.start_date == "" or iso_date(c.start_date) == c.start_date
        assert c.quote == "" or c.quote in _squash(units[c.text_unit_ids[0]])
    launched = [c for c in claims if names[c.subject] == "KESTREL K2"]
    assert [(c.start_date, c.end_date) for c in launched] == [("2024-03-12", "2024-03-12")]
    # GraphRAG wrote "2024-03-12T00:00:00" and "NONE": both normalised
    assert {r["start_date"] for r in rows} >= {"2024-03-12T00:00:00", "NONE"}
    # the fake had to drop a "##" heading marker from one quote: not verbatim, so not kept
    assert any(not c.quote for c in claims) and any(c.quote for c in claims)
    with offline_env(), Index.open(docs) as ix:
        card = ix.drill_down(entity="KESTREL K2")
    shown = [(cl.subject, cl.object, cl.start_date, cl.quote) for cl in card.claims]
    assert ("KESTREL K2", "MARCH", "2024-03-12", "The Kestrel K2 was launched on 12 March 2024 "
            "at the Automate EMEA Summit in Hamburg.") in shown


def test_claim_rows_are_mapped_by_canopy_rules(tmp_path: Path) -> None:
    """GraphRAG's claim fields as a real model writes them: a paraphrased quote is dropped, a
    malformed date is empty, an unknown object is none, status is one of Canopy's, and a claim
    whose subject is no entity GraphRAG kept is left out (Canopy keeps a claim only with its
    subject)."""
    out = tmp_path / "output"
    shutil.copytree(OUTPUT, out)
    rows = pq.read_table(out / "covariates.parquet").to_pylist()
    launch = next(r for r in rows if r["subject_id"] == "KESTREL K2")
    unit = launch["text_unit_id"]
    changed = [
        {**launch, "subject_id": "Kestrel K2", "object_id": "NONE", "status": "**suspected**",
         "start_date": "sometime in 2024", "end_date": "2024-13-01", "type": "launch",
         "description": "A paraphrase", "source_text": "Kestrel K2 launched in Hamburg."},
        {**launch, "subject_id": "NO SUCH ENTITY", "description": "An unknown subject"},
        {**launch, "object_id": "SOMEONE GRAPHRAG DID NOT KEEP", "status": "PROBABLY",
         "description": "An unknown object", "start_date": "March 12, 2024",
         "end_date": "2024-03-01"},
    ]
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(changed, schema=pq.read_schema(out / "covariates.parquet")),
                   out / "covariates.parquet")
    docs = _fresh_docs(tmp_path)
    summary = _import(docs, output=out)
    assert (summary["graphrag_claims"], summary["claims_placed"], summary["claims_left_out"]) \
        == (3, 2, 1)
    claims, names, _ = _claims(docs)
    got = sorted((names[c.subject], c.object, c.type, c.status, c.start_date, c.end_date,
                  c.quote, c.description) for c in claims)
    assert got == [
        ("KESTREL K2", "", "DATED FACT", "SUSPECTED", "2024-03-12", "",  # end before start
         "The Kestrel K2 was launched on 12 March 2024 at the Automate EMEA Summit in Hamburg.",
         "An unknown object"),
        ("KESTREL K2", "", "LAUNCH", "SUSPECTED", "", "", "", "A paraphrase"),
    ]
    assert all(c.text_unit_ids for c in claims) and unit


def test_a_claim_of_a_restricted_unit_is_not_shown_to_a_caller_who_cannot_read_it(
        tmp_path: Path) -> None:
    """Imported claims are gated by their Canopy unit, as extracted ones are: SOFIA BRANDT is
    named in both documents, so `staff` sees the entity, but the claim from the supplier profile
    (restricted) is shown only to `buyer`, who may read it."""
    docs = _fresh_docs(tmp_path)
    # The documents are dated by their files' time (no front matter): a checkout made this month
    # would date them 2026-12 like the secret claim, so they get a time of their own.
    for path in docs.rglob("*"):
        os.utime(path, (1592179200, 1592179200))  # 2020-06-15
    (docs / "canopy.toml").write_text(
        '[acl]\ndefault = ["staff"]\n\n[[acl.rules]]\nglob = "suppliers/**"\n'
        'labels = ["procurement"]\n\n[acl.principals]\nbuyer = ["staff", "procurement"]\n'
        'staff = ["staff"]\n', encoding="utf-8")
    _import(docs)
    claims, names, _ = _claims(docs)
    secret = [c for c in claims if names[c.subject] == "SOFIA BRANDT"]
    assert len(secret) == 1 and secret[0].start_date == "2026-12"
    tokens = ("December 2026", "2026-12", secret[0].id)

    def seen(principal: str) -> str:
        with offline_env(), Index.open(docs) as ix:
            results = [ix.drill_down(entity="SOFIA BRANDT", limit=100, principal=principal),
                       ix.local_search("When does Sofia Brandt's contract run to?",
                                       principal=principal),
                       ix.search("Sofia Brandt signed the contract", principal=principal)]
        return "\n".join(r.model_dump_json() for r in results)

    buyer = seen("buyer")
    assert all(t in buyer for t in tokens), [t for t in tokens if t not in buyer]
    staff = seen("staff")
    assert "SOFIA BRANDT" in staff  # the entity is served (the kestrel document names her)
    assert [t for t in tokens if t in staff] == []


@pytest.mark.parametrize("claims_on", [True, False])
def test_edit_then_index_rederives_the_edited_units_claims_and_keeps_the_others(
        tmp_path: Path, claims_on: bool) -> None:
    """Imported claims are stored extractions like any other: an edited unit is extracted
    again by the provider (with claims when `[extract] claims` is on) and its GraphRAG claims
    go; the other document's are kept as imported."""
    docs = _fresh_docs(tmp_path)
    if claims_on:
        (docs / "canopy.toml").write_text("[extract]\nclaims = true\n", encoding="utf-8")
    _import(docs)
    before, names_before, units = _claims(docs)
    kestrel_doc = next(uid for uid, t in units.items() if "Project Kestrel" in t[:40])
    kept = {c.id: c for c in before if c.text_unit_ids[0] != kestrel_doc}
    edited = [c for c in before if c.text_unit_ids[0] == kestrel_doc]
    assert kept and edited
    kestrel = docs / "projects" / "kestrel.md"
    kestrel.write_text(kestrel.read_text(encoding="utf-8").replace(
        "Maria Okafor", "Ingrid Vasquez") + "\nIngrid Vasquez reported a recall of 12 Kestrel "
        "K2 robots on 3 February 2025.\n", encoding="utf-8")
    with offline_env(), Index.open(docs) as ix:
        result = ix.update()
    assert result.stats["units_extracted"] >= 1
    after, names, units = _claims(docs)
    assert {c.id: c for c in after if c.id in kept} == kept  # the other document's, as they were
    new = [c for c in after if c.id not in kept]
    assert not {c.id for c in edited} & {c.id for c in new}  # GraphRAG's claims of the edit: gone
    for c in new:  # what is there is the builtin provider's, from the edited document's units
        assert "Ingrid Vasquez" in units[c.text_unit_ids[0]]
    if claims_on:
        recall = [c for c in new if "3 February 2025" in c.quote]
        assert recall and recall[0].start_date == "2025-02-03"
        assert any(normalize_name(names[c.subject]) == "ingrid vasquez" for c in new)
    else:
        assert new == []


# ---- crafted output folders (issue 30) -------------------------------------------------------

CANARY = "CANARY-gr-51f0"


def _rewrite(out: Path, table: str, column: str, fn: Any) -> None:
    """Rewrite one column of `out/table.parquet` as fn(value, row) of each row."""
    import pyarrow as pa

    t = pq.read_table(out / f"{table}.parquet")
    rows = t.to_pylist()
    values = [fn(r[column], r) for r in rows]
    t = t.set_column(t.schema.get_field_index(column), column, pa.array(values))
    pq.write_table(t, out / f"{table}.parquet")


def _restricted_names(out: Path) -> tuple[set[str], set[str]]:
    """(GraphRAG entity ids, unit ids) known only from the supplier profile."""
    docs = pq.read_table(out / "documents.parquet").to_pylist()
    helio = {d["id"] for d in docs if "helio" in str(d["title"])}
    units = {u["id"] for u in pq.read_table(out / "text_units.parquet").to_pylist()
             if u["document_id"] in helio}
    only = {e["id"] for e in pq.read_table(out / "entities.parquet").to_pylist()
            if set(e["text_unit_ids"]) <= units}
    return only, units


def test_a_crafted_output_folder_leaks_no_restricted_canary(tmp_path: Path) -> None:
    """GraphRAG's texts planted with a canary where only the restricted document (the supplier
    profile) justifies them: an entity known only from it, the reports of communities with such
    a member; its document and unit ids rewritten as path traversals ("../../../etc/passwd"),
    its weights and ranks written as numeric strings. The import takes it (ids are never
    paths), and `staff`, who may not read the supplier profile, meets the canary in no answer,
    citation or drill_down; `buyer`, who may, does (the check is not vacuous)."""
    docs = _fresh_docs(tmp_path)
    (docs / "canopy.toml").write_text(
        '[acl]\ndefault = ["staff"]\n\n[[acl.rules]]\nglob = "suppliers/**"\n'
        'labels = ["procurement"]\n\n[acl.principals]\nbuyer = ["staff", "procurement"]\n'
        'staff = ["staff"]\n', encoding="utf-8")
    out = tmp_path / "output"
    shutil.copytree(OUTPUT, out)
    only, _ = _restricted_names(out)
    assert only
    _rewrite(out, "entities", "description",
             lambda v, r: f"{v} {CANARY} is its code." if r["id"] in only else v)
    marked = {c["community"] for c in pq.read_table(out / "communities.parquet").to_pylist()
              if only & set(c["entity_ids"])}
    _rewrite(out, "community_reports", "summary",
             lambda v, r: f"{v} The file is {CANARY}." if r["community"] in marked else v)
    traversal = {d["id"]: f"../../../etc/passwd/{i}" for i, d in
                 enumerate(pq.read_table(out / "documents.parquet").to_pylist())}
    _rewrite(out, "documents", "id", lambda v, r: traversal[v])
    _rewrite(out, "text_units", "document_id", lambda v, r: traversal[v])
    _rewrite(out, "relationships", "weight", lambda v, r: str(v))
    _rewrite(out, "community_reports", "rank", lambda v, r: str(v))
    summary = _import(docs, output=out)
    assert summary["documents_matched"] == 2
    assert not (tmp_path / "etc").exists() and not Path("/etc/passwd/0").exists()

    def seen(principal: str) -> str:
        with offline_env(), Index.open(docs) as ix:
            results: list[Any] = [
                ix.global_search("What are the main risks across suppliers and projects?",
                                 principal=principal),
                ix.local_search("Which code is Hannah Whitcombe's? Who is she?",
                                principal=principal),
                ix.basic_search("the file code of Helio Cells Ltd", principal=principal),
                ix.search("What is the code of the supplier file?", principal=principal)]
            roots = ix.drill_down(principal=principal, limit=100)
            results.append(roots)
            queue = [c.id for c in roots.children]
            opened: set[str] = set()
            while queue:
                cid = queue.pop()
                if cid in opened:
                    continue
                opened.add(cid)
                card = ix.drill_down(community_id=cid, principal=principal, limit=100)
                results.append(card)
                queue += [c.id for c in card.children]
                for e in card.entities:
                    results.append(ix.drill_down(entity=e.name, principal=principal, limit=100))
        return "\n".join(r.model_dump_json() for r in results)

    assert CANARY in seen("buyer")
    staff = seen("staff")
    assert CANARY not in staff


@pytest.mark.parametrize(("craft", "expected"), [
    ("ids_not_a_list", "entities.parquet row 0: text_unit_ids 7 is not a list of ids"),
    ("weight_not_a_number", "relationships.parquet row 0: weight 'heavy' is not a finite number"),
    ("weight_nan", "relationships.parquet row 0: weight nan is not a finite number"),
    ("huge_description", "description holds 5,000,000 characters, more than the 200,000"),
    ("findings_nested", "findings '[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[... is JSON nested too"),
    ("parent_loop", "a parent is one level up"),
    ("community_twice", "communities.parquet: community 0 appears twice"),
])
def test_a_malformed_output_folder_is_one_line_naming_the_file_row_and_column(
        tmp_path: Path, craft: str, expected: str) -> None:
    """Wrong types, a huge field, findings nested 100,000 deep, a parent chain that loops (it
    made the import grow one list until memory ran out) and a community listed twice: one
    line naming the file, row and column, nothing written, no traceback."""
    docs = _fresh_docs(tmp_path)
    out = tmp_path / "output"
    shutil.copytree(OUTPUT, out)
    if craft == "ids_not_a_list":
        _rewrite(out, "entities", "text_unit_ids", lambda v, r: 7)
    elif craft == "weight_not_a_number":
        _rewrite(out, "relationships", "weight", lambda v, r: "heavy")
    elif craft == "weight_nan":
        _rewrite(out, "relationships", "weight", lambda v, r: float("nan"))
    elif craft == "huge_description":
        first = pq.read_table(out / "entities.parquet").column("id")[0].as_py()
        _rewrite(out, "entities", "description",
                 lambda v, r: "A" * 5_000_000 if r["id"] == first else v)
    elif craft == "findings_nested":
        _rewrite(out, "community_reports", "findings", lambda v, r: "[" * 100_000 + "]" * 100_000)
    elif craft == "parent_loop":
        _rewrite(out, "communities", "parent", lambda v, r: (r["community"] + 1) % 3)
        _rewrite(out, "communities", "level", lambda v, r: 0)
    else:
        _rewrite(out, "communities", "community", lambda v, r: 0)
    result = CliRunner().invoke(main, ["import-graphrag", str(out), str(docs)])
    assert result.exit_code == 1, result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1, result.output
    assert expected in result.output and "Traceback" not in result.output
    assert not (docs / ".canopy").exists()
