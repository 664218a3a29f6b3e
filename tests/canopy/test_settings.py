"""Settings errors are one line naming the file or variable, the key and what is allowed;
unknown keys are errors with a did-you-mean (issue 11)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from canopy.errors import ConfigError
from canopy.server.cli import main
from canopy.settings import load_settings
from tests.conftest import EXAMPLES


def _with(tmp_path: Path, toml: str) -> Path:
    (tmp_path / "canopy.toml").write_text(toml, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(("toml", "expected"), [
    ("[chunkin]\nchunk_tokens = 600\n", "unknown key [chunkin]; did you mean 'chunking'?"),
    ("[llm]\nmodle = 'gpt-4o'\n", "unknown key 'llm.modle'; did you mean 'model'?"),
    ("[acl]\ndefault = ['staff']\n[[acl.rules]]\nglob = '*.md'\nlabelz = ['hr']\n",
     "unknown key 'acl.rules[0].labelz'; did you mean 'labels'?"),
    ("[chunking]\nchunk_tokens = 'many'\n", "chunking.chunk_tokens: Input should be a valid "
     "integer"),
    ("[chunking\nchunk_tokens = 600\n", "not valid TOML: Expected ']'"),
    # GraphRAG's name for the endpoint: the spelling alone would suggest 'api_key'
    ("[llm]\napi_base = 'http://localhost:11434/v1'\n",
     "unknown key 'llm.api_base'; did you mean 'base_url'?"),
    ("[llm]\nbase_url = 'localhost:11434/v1'\n", "llm.base_url: an endpoint URL needs its "
     "scheme: write 'http://localhost:11434/v1' (or https://...) (got 'localhost:11434/v1')"),
    ("[embed]\nbase_url = 'ftp://host/v1'\n", "embed.base_url: an endpoint URL is http:// or "
     "https://, not ftp://"),
])
def test_a_bad_settings_file_is_named_with_its_key_and_what_is_allowed(
        tmp_path: Path, toml: str, expected: str) -> None:
    docs = _with(tmp_path, toml)
    with pytest.raises(ConfigError) as err:
        load_settings(docs)
    message = str(err.value)
    assert message.startswith(f"{docs / 'canopy.toml'}: ") and expected in message
    assert "\n" not in message


def test_an_unknown_key_lists_the_keys_its_section_has(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"known here: chunk_tokens, encoding, overlap_tokens"):
        load_settings(_with(tmp_path, "[chunking]\nsize = 3\n"))


def test_a_bad_environment_variable_is_named(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CANOPY_CHUNKING__CHUNK_TOKENS", "lots")
    with pytest.raises(ConfigError, match=r"^environment variable CANOPY_CHUNKING__CHUNK_TOKENS: "
                                          r"Input should be a valid integer, .* \(got 'lots'\)$"):
        load_settings(tmp_path)
    monkeypatch.delenv("CANOPY_CHUNKING__CHUNK_TOKENS")
    monkeypatch.setenv("CANOPY_CHUNKNG__CHUNK_TOKENS", "600")
    with pytest.raises(ConfigError, match=r"^environment variable CANOPY_CHUNKNG__CHUNK_TOKENS: "
                                          r"unknown key \[chunkng\]; did you mean 'chunking'\?"):
        load_settings(tmp_path)


def test_an_endpoint_url_without_scheme_in_the_environment_is_one_line_naming_the_variable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.md").write_text("# A\n\nText.\n", encoding="utf-8")
    monkeypatch.setenv("CANOPY_LLM_BASE_URL", "127.0.0.1:11434/v1")
    result = CliRunner().invoke(main, ["index", str(tmp_path)])
    assert result.exit_code != 0 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [
        "Error: environment variable CANOPY_LLM_BASE_URL: an endpoint URL needs its scheme: "
        "write 'http://127.0.0.1:11434/v1' (or https://...) (got '127.0.0.1:11434/v1')"]


def test_valid_files_still_load(tmp_path: Path) -> None:
    docs = _with(tmp_path, "[chunking]\nchunk_tokens = 600\n[acl.principals]\nalice = ['hr']\n"
                           "[[acl.rules]]\nglob = 'hr/*'\nlabels = ['hr']\n")
    settings = load_settings(docs)
    assert settings.chunking.chunk_tokens == 600 and settings.acl.enabled
    assert settings.acl.principals == {"alice": ["hr"]}
    load_settings(EXAMPLES)  # the bundled example's own canopy.toml, if it has one


def test_the_cli_prints_one_line_and_no_traceback(tmp_path: Path) -> None:
    docs = _with(tmp_path, "[chunkin]\nchunk_tokens = 600\n")
    (docs / "a.md").write_text("# A\n\nText.\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["index", str(docs)])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f"Error: {docs / 'canopy.toml'}: unknown key [chunkin]; did you mean 'chunking'? "
        "(known here: acl, auth, chunking, communities, distributed, embed, extract, input, llm, "
        "prompts, publish, query, reports, storage, time)"]
    assert "Traceback" not in result.output


def test_init_writes_every_setting_commented_out_and_the_file_changes_nothing(
        tmp_path: Path) -> None:
    from canopy.settings import Settings

    runner = CliRunner()
    done = runner.invoke(main, ["init", str(tmp_path)])
    assert done.exit_code == 0, done.output
    text = (tmp_path / "canopy.toml").read_text(encoding="utf-8")
    assert all(line == "" or line.startswith("#") for line in text.splitlines())
    for section, field in Settings.model_fields.items():
        assert f"# [{section}]" in text
        if section != "acl":
            for name in field.annotation.model_fields:  # type: ignore[union-attr]
                assert f"\n# {name} = " in text, (section, name)
    assert load_settings(tmp_path).model_dump() == Settings().model_dump()  # nothing changed
    again = runner.invoke(main, ["init", str(tmp_path)])
    assert again.exit_code != 0 and "exists; pass --force" in again.output
    # Uncommenting a section and a line is all it takes to change a setting.
    edited = text.replace("# [chunking]", "[chunking]").replace(
        "# chunk_tokens = 1200", "chunk_tokens = 600")
    (tmp_path / "canopy.toml").write_text(edited, encoding="utf-8")
    assert load_settings(tmp_path).chunking.chunk_tokens == 600
    assert runner.invoke(main, ["init", str(tmp_path), "--force"]).exit_code == 0
    assert load_settings(tmp_path).chunking.chunk_tokens == 1200
