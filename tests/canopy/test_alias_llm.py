"""The LLM confirmation of alias pairs, end to end against the fake OpenAI-compatible server
(issue 31): the prompt, one request per unit with all its open pairs, the merge it makes, the
response cache on a rebuild, the accounting and the estimate."""

from __future__ import annotations

import json
import re
from pathlib import Path

from canopy.ids import entity_id
from canopy.server.estimate import estimate_build
from canopy.server.runtime import build_index, open_workspace
from canopy.store.export import load_graph
from canopy.store.store import Store
from tests.fakes.openai_server import FakeOpenAI
from tests.fakes.responses import user_texts

# "HC" (two capitals) is a pair the unit's offline rules leave open (the document's rule for two
# capitals settles it too, once every unit of the document is extracted: canopy.aliases.
# document_links); "PSA", the initials of a name of three words, is one they settle (no request
# for it).
NOTE = ("Helio Cells (HC) hired Mara Quinn in Lisbon Harbor. HC pays Mara Quinn well. The Porto "
        "Summit Association (PSA) invited Helio Cells, and PSA paid Vento Labs.")
OTHER = "Porto Summit hosted Vento Labs and Helio Cells. Jonas Brandt spoke at Porto Summit."


def _workspace(tmp_path: Path, server: FakeOpenAI):  # type: ignore[no-untyped-def]
    docs = tmp_path / "docs"
    docs.mkdir(exist_ok=True)
    (docs / "note.md").write_text(NOTE, encoding="utf-8")
    (docs / "other.md").write_text(OTHER, encoding="utf-8")
    return open_workspace(docs, index_dir=tmp_path / "idx",
                          llm={"base_url": server.base_url, "max_retries": 2, "backoff_s": 0.01})


def _resolve_prompts(server: FakeOpenAI) -> list[str]:
    return [t for r in server.requests if r.task == "resolve" for t in user_texts(r.body)]


def test_open_pairs_are_confirmed_in_one_request_per_unit_and_merged(tmp_path, fake_openai):
    ws = _workspace(tmp_path, fake_openai)
    result = build_index(ws)
    prompts = _resolve_prompts(fake_openai)
    # one request per unit whose names leave pairs open, every pair of the unit in it
    assert len(prompts) == fake_openai.count("resolve") == 1
    (prompt,) = prompts
    assert prompt.startswith("Task: resolve") and NOTE in prompt
    pairs = re.findall(r"^\d+\. (.+) \| (.+)$", prompt, re.MULTILINE)
    assert ("HC", "Helio Cells") in pairs and not [p for p in pairs if p[0] == "PSA"]
    assert result.usage["resolve"]["calls"] == 1
    store = Store(ws.index_dir)
    try:
        g = load_graph(store)
        names = {e.name for e in g.entities.values()}
        assert "Helio Cells" in names and "HC" not in names  # confirmed: merged
        assert "Vento Labs" in names
        rows = store.writer.execute(
            "SELECT name FROM entity_instances WHERE key = 'heliocells'").fetchall()
        assert {"HC", "Helio Cells"} <= {r[0] for r in rows}
        assert "PSA" not in names  # the rules' own link
    finally:
        store.close()


def test_a_rebuild_reuses_the_cached_confirmation(tmp_path, fake_openai):
    ws = _workspace(tmp_path, fake_openai)
    build_index(ws)
    before = load_graph_entities(ws.index_dir)
    fake_openai.reset()
    result = build_index(ws, full=True)
    assert fake_openai.count("resolve") == 0 and fake_openai.count("extract") == 0
    assert result.usage.get("resolve", {}).get("calls", 0) == 0
    assert load_graph_entities(ws.index_dir) == before


def test_unusable_confirmation_output_confirms_nothing_and_fails_no_unit(tmp_path, fake_openai):
    for _ in range(10):  # every attempt and repair of the confirmation
        fake_openai.enqueue("resolve", "{not json")
    ws = _workspace(tmp_path, fake_openai)
    result = build_index(ws)
    assert not result.failures
    store = Store(ws.index_dir)
    try:  # nothing confirmed: the unit keeps "HC" apart; only its document links it
        rows = store.writer.execute(
            "SELECT unit_key, key FROM entity_instances WHERE name = 'HC'").fetchall()
    finally:
        store.close()
    assert rows and {r[0] for r in rows} == {"hc"} and {r[1] for r in rows} == {"heliocells"}


def test_the_estimate_counts_the_confirmations(tmp_path, fake_openai):
    ws = _workspace(tmp_path, fake_openai)
    est = estimate_build(ws)
    tasks = {t.task: t for t in est.tasks}
    assert tasks["resolve"].calls >= 1
    assert json.loads(est.model_dump_json())["tasks"]


def load_graph_entities(index_dir: Path) -> dict[str, str]:
    store = Store(index_dir)
    try:
        return {e.id: e.name for e in load_graph(store).entities.values()}
    finally:
        store.close()


def test_entity_ids_follow_the_merge_key() -> None:
    assert entity_id("HC") != entity_id("Helio Cells Ltd") == entity_id("HELIO CELLS, LTD.")
    assert entity_id("Helio Cells") != entity_id("Helio Cells Ltd")  # linked by a document
