"""Prompt templates, one text file per task, and their loader.

Templates use `string.Template` syntax: `$name` or `${name}` is replaced, `$$` is a literal
dollar sign, and braces in templates or in substituted content need no escaping (documents,
JSON and code are full of them). Substitution is a single pass, so `$` inside a value is
never expanded.

Every template starts with a `Task: <name>` line; it tells a reader (and the test suite's fake
endpoint) which task a request belongs to.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from string import Template

__all__ = ["TASKS", "load_prompt", "render"]

TASKS = (
    "extract",
    "glean",
    "summarize",
    "report",
    "rate",
    "map",
    "reduce",
    "answer",
    "hyde",
    "drift",
    "route",
    "describe",
    "personas",
    "persona_tasks",
    "questions",
    "judge",
    "repair",
)


@cache
def load_prompt(name: str) -> str:
    """The raw template text of a task."""
    if name not in TASKS:
        raise ValueError(f"unknown prompt {name!r}; known prompts: {', '.join(TASKS)}")
    return resources.files(__package__).joinpath(f"{name}.txt").read_text(encoding="utf-8")


@cache
def _template(name: str) -> Template:
    return Template(load_prompt(name))


def render(name: str, /, **values: object) -> str:
    """The template filled with `values`; every placeholder must be given."""
    try:
        return _template(name).substitute({k: str(v) for k, v in values.items()})
    except KeyError as missing:
        raise ValueError(f"prompt {name!r} needs a value for {missing}") from None
