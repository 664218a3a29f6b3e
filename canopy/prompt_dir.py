"""`[prompts] dir`: a folder of templates that replace the packaged ones, checked file by file.

Every `*.txt` file in the folder must be named for a task (`extract.txt`, `report.txt`, ...)
and keep that task's required placeholders, and use no other placeholder; each problem is
one line naming the file and what is wrong. Other files (the README that `canopy prompts
export` writes, notes, editor backups) and hidden files are left alone. Templates the folder
does not hold stay the packaged ones.
"""

from __future__ import annotations

import logging
from pathlib import Path

from canopy.errors import ConfigError
from canopy.prompts import (
    MEANINGS,
    TASKS,
    PromptSet,
    file_name,
    load_prompt,
    optional,
    placeholders,
    required,
)
from canopy.prompts.placeholders import bad_dollar_line, identifiers
from canopy.suggest import did_you_mean

__all__ = ["check_template", "export_prompts", "load_prompt_dir", "placeholder_guide", "task_of",
           "warn_if_indexed"]

log = logging.getLogger(__name__)

SUFFIX = ".txt"
GUIDE = "README.md"


def _listed(names: set[str] | frozenset[str]) -> str:
    return ", ".join(f"${n}" for n in sorted(names)) or "none"


def check_template(name: str, text: str, where: str | Path) -> None:
    """ConfigError (one line, starting with `where`) when `text` cannot serve as task `name`'s
    template: empty, a stray `$`, a placeholder the task does not fill in, or a required one
    left out."""
    if not text.strip():
        raise ConfigError(f"{where}: the template is empty")
    line = bad_dollar_line(text)
    if line is not None:
        raise ConfigError(f"{where}: line {line}: a '$' that starts no placeholder; write $$ "
                          "for a literal dollar sign")
    used = identifiers(text)
    known = placeholders(name)
    unknown = sorted(used - known)
    if unknown:
        raise ConfigError(f"{where}: unknown placeholder ${unknown[0]}"
                          f"{did_you_mean(unknown[0], known)} ({name} fills in "
                          f"{_listed(known)})")
    missing = required(name) - used
    if missing:
        raise ConfigError(f"{where}: missing placeholder{'s' * (len(missing) > 1)} "
                          f"{_listed(missing)} ({file_name(name)} must keep "
                          f"{_listed(required(name))})")


def task_of(path: Path) -> str:
    """The task a template file is named for; ConfigError with a did-you-mean otherwise."""
    if path.stem in TASKS:
        return path.stem
    files = [file_name(t) for t in TASKS]
    raise ConfigError(f"{path}: no template has this name{did_you_mean(path.name, files)} "
                      f"(known: {', '.join(files)})")


def load_prompt_dir(folder: Path | None) -> PromptSet:
    """The templates of `folder` over the packaged ones (the packaged ones alone for None),
    every file checked (module doc)."""
    if folder is None:
        return PromptSet()
    if not folder.is_dir():
        raise ConfigError(f"[prompts] dir {folder}: folder not found")
    overrides: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.suffix.lower() != SUFFIX or not path.is_file():
            continue
        name = task_of(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        check_template(name, text, path)
        overrides[name] = text
    return PromptSet(overrides, str(folder))


def warn_if_indexed(folder: Path, docs_dir: Path | None) -> None:
    """A prompts folder inside the documents folder would have its templates indexed as
    documents unless its name (or a parent's, below DOCS) starts with '.'."""
    if docs_dir is None:
        return
    try:
        inside = folder.resolve().relative_to(Path(docs_dir).resolve())
    except ValueError:
        return
    if not any(part.startswith(".") for part in inside.parts):
        log.warning("[prompts] dir %s is inside the documents folder: its templates will be "
                    "indexed as documents; move it out or give it a name starting with '.'",
                    folder)


def placeholder_guide() -> str:
    """The README written beside exported templates: what each file must keep, and what
    Canopy puts in each placeholder. It is never sent to a model."""
    out = ["# Canopy prompt templates", "",
           "Edit any `.txt` file here and point `[prompts] dir` in canopy.toml (or",
           "`CANOPY_PROMPTS__DIR`) at this folder; delete the files you do not change (a file",
           "identical to the packaged template changes nothing either way). Every command that",
           "loads settings checks these files first: a file named for no task, an unknown",
           "placeholder or a missing required one stops it with a one-line error.", "",
           "Syntax: `$name` or `${name}` is a placeholder, `$$` is a literal dollar sign.",
           "Changing `extract.txt` or `glean.txt` extracts every text unit again on the next",
           "`canopy index`; `summarize.txt` rewrites merged descriptions; `report.txt`",
           "rewrites the community reports; the query templates apply to the next question.",
           "", "| file | must keep | may drop |", "|---|---|---|"]
    for name in TASKS:
        out.append(f"| {file_name(name)} | {_listed(required(name))} | "
                   f"{_listed(optional(name)) if optional(name) else '-'} |")
    out += ["", "## What Canopy puts in each placeholder", ""]
    used = sorted({p for name in TASKS for p in placeholders(name)})
    out += [f"- `${p}`: {MEANINGS.get(p, '')}" for p in used]
    return "\n".join(out) + "\n"


def export_prompts(folder: Path, *, force: bool = False) -> list[Path]:
    """Write every packaged template, and the placeholder guide, into `folder`; an existing
    file is replaced only with `force` (ConfigError names the first one otherwise)."""
    targets = [(folder / file_name(t), load_prompt(t)) for t in TASKS]
    targets.append((folder / GUIDE, placeholder_guide()))
    if not force:
        for path, _ in targets:
            if path.exists():
                raise ConfigError(f"{path} exists; pass --force to replace the files in {folder}")
    folder.mkdir(parents=True, exist_ok=True)
    for path, text in targets:
        path.write_text(text, encoding="utf-8")
    return [p for p, _ in targets]
