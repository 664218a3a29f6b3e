"""`canopy prompts export|tune`: the prompt templates as files you can edit, and templates
tuned to a corpus by its LLM (`[prompts] dir` in canopy.toml puts either to use)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR

__all__ = ["prompts"]


@click.group()
def prompts() -> None:
    """Export the prompt templates to edit, or tune them to a corpus.

    \b
    Point `[prompts] dir` in canopy.toml (or CANOPY_PROMPTS__DIR) at a folder of templates:
    each file there replaces the packaged template of the same name, and every command checks
    them when it starts.
    """


@prompts.command("export")
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace files that exist in FOLDER.")
def export_command(folder: Path, force: bool) -> None:
    """Write every prompt template Canopy uses into FOLDER, with a README.md saying which
    placeholders each must keep (the README is never sent to a model).

    \b
    Examples:
      canopy prompts export ~/my-prompts
      canopy prompts export docs/.prompts --force
    """
    from canopy.prompt_dir import GUIDE, export_prompts

    written = export_prompts(folder, force=force)
    click.echo(f"Wrote {len(written) - 1} templates to {folder}, and {GUIDE} (the placeholders "
               "each must keep). Edit the ones you want, delete the others, and set "
               f'[prompts] dir = "{folder}" in canopy.toml.')


@prompts.command("tune")
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the tuned templates (default: DOCS/.prompts, which is not "
                   "indexed).")
@click.option("--sample", type=click.IntRange(1, 200), default=8, show_default=True,
              help="Text units sampled (by a hash of their ids: the same ones every run).")
@click.option("--examples", type=click.IntRange(0, 5), default=2, show_default=True,
              help="Few-shot example extractions put into extract.txt.")
@click.option("--force", is_flag=True, help="Replace tuned templates that exist in --out.")
@click.option("--json", "as_json", is_flag=True, help="Print what was tuned as JSON.")
def tune_command(docs: Path, index_dir: Path | None, config: Path | None, out: Path | None,
                 sample: int, examples: int, force: bool, as_json: bool) -> None:
    """Tune the extraction and report templates to the documents of DOCS with the configured
    LLM: it reads a sample of the text units, names the domain, a reader's role and the entity
    types that matter, and writes example extractions in Canopy's format.

    \b
    Examples:
      CANOPY_LLM_BASE_URL=http://localhost:11434/v1 canopy prompts tune ~/docs
      canopy prompts tune ~/docs --out ~/docs-prompts --sample 20 --examples 3
    """
    from canopy.server.prompt_tune import tune_prompts, write_tuned
    from canopy.server.runtime import open_workspace

    ws = open_workspace(docs, index_dir, config)
    folder = out if out is not None else docs / ".prompts"
    tuned = tune_prompts(ws, sample=sample, examples=examples)
    written = write_tuned(tuned, folder, force=force)
    calls = sum(u.calls for u in tuned.usage.values())
    tokens = sum(u.prompt_tokens + u.completion_tokens for u in tuned.usage.values())
    shown_dir = _as_setting(folder, docs, config)
    if as_json:
        click.echo(json.dumps({"domain": tuned.domain, "role": tuned.role,
                               "entity_types": tuned.entity_types, "sampled_units": tuned.units,
                               "examples": tuned.examples, "written": [str(p) for p in written],
                               "llm_calls": calls, "llm_tokens": tokens}, indent=2))
        return
    click.echo(f"Tuned {', '.join(p.name for p in written)} into {folder} from {tuned.units} "
               f"sampled text units ({tuned.examples} example extraction"
               f"{'s' * (tuned.examples != 1)}; {calls} LLM calls, {tokens} tokens).")
    click.echo(f"  domain: {tuned.domain}")
    click.echo(f"  role: {tuned.role}")
    click.echo(f"  entity types: {', '.join(tuned.entity_types)}")
    click.echo("To use them, put this in canopy.toml (the extraction checks types against "
               "[extract] entity_types):")
    click.echo(f"[prompts]\ndir = {json.dumps(shown_dir)}\n[extract]\n"
               f"entity_types = {json.dumps(tuned.entity_types, ensure_ascii=False)}")


def _as_setting(folder: Path, docs: Path, config: Path | None) -> str:
    """`folder` as `[prompts] dir` would name it: relative to canopy.toml's folder (DOCS when
    there is no --config) when it is inside it, else absolute."""
    base = (config.parent if config is not None else docs).resolve()
    try:
        return folder.resolve().relative_to(base).as_posix()
    except ValueError:
        return str(folder.resolve())
