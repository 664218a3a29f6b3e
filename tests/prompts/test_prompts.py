"""Prompts you can own: `canopy prompts export`, `[prompts] dir` (checked at start-up, part of
the fingerprints) and `canopy prompts tune`, against the fake OpenAI-compatible endpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from canopy.errors import ConfigError
from canopy.indexer.operations.report_context import fingerprint, reports_only_fingerprint
from canopy.prompt_dir import check_template, load_prompt_dir
from canopy.prompts import TASKS, PromptSet, file_name, load_prompt
from canopy.server.cli import main
from canopy.settings import load_settings
from tests.fakes.openai_server import FakeOpenAI

DOCS = {
    "deal.md": "Helio Cells signed a supply deal with Vento Labs in Lisbon Harbor. Mara Quinn "
               "leads the project at Helio Cells. The deal is worth $4 million a year.",
    "site.md": "Vento Labs opened a research site near the Porto Summit venue. Mara Quinn "
               "presented the first results at the Porto Summit.",
    "people.md": "Ana Ruiz joined Vento Labs as chief scientist. Helio Cells and Vento Labs "
                 "share a battery patent that Ana Ruiz filed.",
}
MARKER = "Pay special attention to supply contracts."


def make_docs(tmp_path: Path, config: str = "") -> Path:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in DOCS.items():
        (docs / name).write_text(text + "\n", encoding="utf-8")
    (docs / "canopy.toml").write_text(config, encoding="utf-8")
    return docs


def llm_config(fake: FakeOpenAI, extra: str = "") -> str:
    return (f'[llm]\nbase_url = "{fake.base_url}"\nmodel = "fake"\nmax_retries = 1\n'
            f"backoff_s = 0.01\n{extra}")


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def user_prompts(fake: FakeOpenAI, task: str) -> list[str]:
    return [m["content"] for r in fake.requests if r.task == task
            for m in r.body["messages"][:1]]


def index_json(docs: Path) -> dict:
    done = run("index", docs, "--json")
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


# ---- export -----------------------------------------------------------------------------------


def test_export_writes_every_template_and_a_guide_and_keeps_existing_files(tmp_path: Path) -> None:
    out = tmp_path / "mine"
    done = run("prompts", "export", out)
    assert done.exit_code == 0, done.output
    for task in TASKS:
        assert (out / file_name(task)).read_text(encoding="utf-8") == load_prompt(task)
    guide = (out / "README.md").read_text(encoding="utf-8")
    assert "| extract.txt | $claims_switch, $entity_types, $text | - |" in guide
    assert "| summarize.txt | $descriptions, $name | $max_words |" in guide
    # An unedited export replaces nothing: it loads, and overrides no template.
    assert dict(load_prompt_dir(out).overrides) == {}
    (out / "extract.txt").write_text("edited $text $entity_types $claims_switch")
    again = run("prompts", "export", out)
    assert again.exit_code == 1 and "exists; pass --force" in again.output
    assert (out / "extract.txt").read_text() == "edited $text $entity_types $claims_switch"
    assert run("prompts", "export", out, "--force").exit_code == 0
    assert (out / "extract.txt").read_text() == load_prompt("extract")


# ---- override round trip ----------------------------------------------------------------------


def test_an_edited_exported_template_reaches_the_llm(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        docs = make_docs(tmp_path, llm_config(fake, '[prompts]\ndir = ".prompts"\n'))
        assert run("prompts", "export", docs / ".prompts").exit_code == 0
        extract = docs / ".prompts" / "extract.txt"
        extract.write_text(extract.read_text().replace(
            "Step 1 - entities.", f"{MARKER}\n\nStep 1 - entities."), encoding="utf-8")
        index_json(docs)
        sent = user_prompts(fake, "extract")
        assert len(sent) == len(DOCS)
        assert all(MARKER in p and p.startswith("Task: extract") for p in sent)
        # the other exported copies are the packaged templates: reports use those
        assert user_prompts(fake, "report") and not any(MARKER in p
                                                        for p in user_prompts(fake, "report"))
        # the index holds nothing from the templates: they were not indexed as documents
        assert index_json(docs)["stats"]["documents"] == len(DOCS)


def test_the_environment_names_the_folder_too(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "hyde.txt").write_text("Task: hyde\nImagine an answer to: $query\n")
    monkeypatch.setenv("CANOPY_PROMPTS__DIR", str(folder))
    settings = load_settings(make_docs(tmp_path))
    assert settings.prompts.dir == folder
    assert load_prompt_dir(settings.prompts.dir).render("hyde", query="why?") == (
        "Task: hyde\nImagine an answer to: why?\n")


# ---- validation -------------------------------------------------------------------------------


def _extract_without(placeholder: str, instead: str = "") -> str:
    return load_prompt("extract").replace(f"${placeholder}", instead)


@pytest.mark.parametrize(("name", "text", "expected"), [
    pytest.param("extract.txt", _extract_without("text"),
                 "extract.txt: missing placeholder $text (extract.txt must keep $claims_switch, "
                 "$entity_types, $text)", id="missing"),
    pytest.param("extract.txt", _extract_without("text", "$txt"),
                 "extract.txt: unknown placeholder $txt; did you mean 'text'? (extract fills in "
                 "$claims_switch, $entity_types, $text)", id="unknown-placeholder"),
    pytest.param("extact.txt", load_prompt("extract"),
                 "extact.txt: no template has this name; did you mean 'extract.txt'? (known: "
                 "extract.txt, ", id="unknown-file"),
    pytest.param("report.txt", "Task: report\nBudget: $5 per report.\n$context\n",
                 "report.txt: line 2: a '$' that starts no placeholder; write $$ for a literal "
                 "dollar sign", id="stray-dollar"),
    pytest.param("map.txt", "  \n", "map.txt: the template is empty", id="empty"),
])
@pytest.mark.parametrize("command", ["index", "query", "serve", "status"])
def test_a_bad_template_stops_every_command_with_one_line(tmp_path: Path, name: str, text: str,
                                                          expected: str, command: str) -> None:
    docs = make_docs(tmp_path, '[prompts]\ndir = "../mine"\n')
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / name).write_text(text, encoding="utf-8")
    (folder / "README.md").write_text("notes: $whatever")  # not a template: never read
    args = [command, docs, *(["what is this?"] if command == "query" else [])]
    done = run(*args)
    assert done.exit_code == 1
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: {folder / name}: ")
    assert expected in lines[0]
    assert not (docs / ".canopy").exists()  # stopped before anything was built


def test_an_empty_setting_means_no_folder(tmp_path: Path) -> None:
    assert load_settings(make_docs(tmp_path, '[prompts]\ndir = ""\n')).prompts.dir is None


def test_a_missing_folder_is_one_line_too(tmp_path: Path) -> None:
    docs = make_docs(tmp_path, '[prompts]\ndir = "nowhere"\n')
    done = run("index", docs)
    assert done.exit_code == 1
    assert done.output.strip() == f"Error: [prompts] dir {docs / 'nowhere'}: folder not found"


def test_optional_placeholders_may_go_and_every_packaged_template_passes(tmp_path: Path) -> None:
    (tmp_path / "summarize.txt").write_text("Task: summarize\nMerge for $name:\n$descriptions\n")
    prompts = load_prompt_dir(tmp_path)
    assert set(prompts.overrides) == {"summarize"}
    assert prompts.render("summarize", name="X", descriptions="- a", max_words=10) == (
        "Task: summarize\nMerge for X:\n- a\n")
    for task in TASKS:
        check_template(task, load_prompt(task), task)  # raises on a problem
    with pytest.raises(ConfigError, match="glean.txt: missing placeholder"):
        (tmp_path / "glean.txt").write_text("Task: glean\nAgain, please.\n")
        load_prompt_dir(tmp_path)


# ---- fingerprints -----------------------------------------------------------------------------


def test_replaced_templates_are_part_of_the_fingerprints_and_packaged_ones_add_nothing() -> None:
    packaged = PromptSet({"report": load_prompt("report")})
    assert packaged.fingerprint("report") == "" and dict(packaged.overrides) == {}
    edited = PromptSet({"report": load_prompt("report") + "\nBe brief."})
    key = edited.fingerprint("report")
    assert key and edited.fingerprint("extract", "glean") == ""
    parts = (1, ["e1"], ["r1"], [], ["c1"])
    assert fingerprint(*parts) == fingerprint(*parts, packaged.fingerprint("report"))
    assert fingerprint(*parts) != fingerprint(*parts, key)
    assert reports_only_fingerprint(2, ["a"]) != reports_only_fingerprint(2, ["a"], key)


def test_a_changed_extraction_prompt_extracts_again_and_an_unchanged_one_does_not(
        tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        docs = make_docs(tmp_path, llm_config(fake))
        first = index_json(docs)
        assert fake.count("extract") == len(DOCS) and first["stats"]["reports_generated"] > 0
        # pointing at an unedited export changes nothing
        assert run("prompts", "export", docs / ".prompts").exit_code == 0
        (docs / "canopy.toml").write_text(llm_config(fake, '[prompts]\ndir = ".prompts"\n'))
        assert index_json(docs)["stats"].get("noop") is True
        assert fake.count("extract") == len(DOCS)

        extract = docs / ".prompts" / "extract.txt"
        extract.write_text(extract.read_text() + f"\n{MARKER}\n")
        changed = index_json(docs)["stats"]
        assert changed["units_extracted"] == len(DOCS)
        assert fake.count("extract") == 2 * len(DOCS)
        assert all(MARKER in p for p in user_prompts(fake, "extract")[len(DOCS):])

        unchanged = index_json(docs)["stats"]
        assert unchanged.get("noop") is True and fake.count("extract") == 2 * len(DOCS)

        # a new report template rewrites the reports, and extracts nothing again
        reports_before = fake.count("report")
        report = docs / ".prompts" / "report.txt"
        report.write_text(report.read_text().replace("Rules:", "Rules:\n- Be concise."))
        rewritten = index_json(docs)["stats"]
        assert fake.count("extract") == 2 * len(DOCS)
        assert rewritten["units_extracted"] == 0
        assert rewritten["reports_generated"] == rewritten["reports"] > 0
        assert fake.count("report") - reports_before == rewritten["reports"]
        assert all("Be concise." in p for p in user_prompts(fake, "report")[reports_before:])

        # back to the packaged report template: written afresh again, never a stale reuse
        report.unlink()
        assert index_json(docs)["stats"]["reports_generated"] == rewritten["reports"]


# ---- tuning -----------------------------------------------------------------------------------


def test_tune_needs_an_endpoint_and_says_so_in_one_line(tmp_path: Path) -> None:
    docs = make_docs(tmp_path)
    done = run("prompts", "tune", docs)
    assert done.exit_code == 1
    assert done.output.strip().splitlines() == [
        "Error: prompt tuning needs an LLM endpoint (a model proposes the domain, entity types "
        "and examples): set [llm] base_url in canopy.toml or CANOPY_LLM_BASE_URL"]
    assert not (docs / ".prompts").exists()


def test_tune_writes_valid_templates_that_the_next_index_uses(tmp_path: Path) -> None:
    with FakeOpenAI() as fake:
        docs = make_docs(tmp_path, llm_config(fake))
        fake.enqueue("tune", {"domain": "supplier news of a battery maker ($ figures)",
                              "role": "a procurement analyst",
                              "entity_types": ["Organization", "person", "geo, place",
                                               "person"]})
        done = run("prompts", "tune", docs, "--sample", "3", "--examples", "2")
        assert done.exit_code == 0, done.output
        assert fake.tasks() == ["tune", "extract", "extract"]
        tune_prompt = user_prompts(fake, "tune")[0]
        assert all(text.split(".")[0] in tune_prompt for text in DOCS.values())

        folder = docs / ".prompts"
        tuned = load_prompt_dir(folder)  # the validator accepts them
        assert set(tuned.overrides) == {"extract", "report"}
        extract = tuned.text("extract")
        assert "$entity_types" in extract and "$text" in extract
        assert "supplier news of a battery maker ($$ figures)" in extract
        assert "===== Example 1: text =====" in extract
        assert "===== Example 2: reply =====" in extract
        assert "a procurement analyst" in tuned.text("report")
        # the examples are replies to the packaged extraction prompt with the tuned types
        first_reply = extract.split("===== Example 1: reply =====\n")[1].split("\n=====")[0]
        example = json.loads(first_reply.replace("$$", "$"))
        assert example["entities"] and {e["type"] for e in example["entities"]} <= {
            "organization", "person", "geo place"}

        lines = done.stdout.splitlines()
        assert "  entity types: organization, person, geo place" in lines
        snippet = "\n".join(lines[lines.index(next(x for x in lines if x == "[prompts]")):])
        assert snippet == ('[prompts]\ndir = ".prompts"\n[extract]\n'
                           'entity_types = ["organization", "person", "geo place"]')
        again = run("prompts", "tune", docs)
        assert again.exit_code == 1 and "exists; pass --force" in again.output

        (docs / "canopy.toml").write_text(llm_config(fake, snippet + "\n"))
        before = len(fake.requests)
        stats = index_json(docs)["stats"]
        assert stats["documents"] == len(DOCS) and stats["entities"] > 0
        sent = [m["content"] for r in fake.requests[before:] if r.task == "extract"
                for m in r.body["messages"][:1]]
        assert len(sent) == len(DOCS)
        for prompt in sent:
            assert prompt.startswith("Task: extract\nThe collection holds supplier news")
            assert "===== Example 1: text =====" in prompt
            assert "whose type is one of: organization, person, geo place." in prompt
        reports = [m["content"] for r in fake.requests[before:] if r.task == "report"
                   for m in r.body["messages"][:1]]
        assert reports and all("a procurement analyst" in p for p in reports)
