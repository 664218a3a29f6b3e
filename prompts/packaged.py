"""The templates that ship with Canopy: one text file per task in this package."""

from __future__ import annotations

from functools import cache
from importlib import resources

__all__ = ["TASKS", "file_name", "load_prompt"]

TASKS = (
    "extract",
    "glean",
    "resolve",
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
    "tune",
)


def file_name(name: str) -> str:
    """The file a task's template lives in, here and in a `[prompts] dir` folder."""
    return f"{name}.txt"


@cache
def load_prompt(name: str) -> str:
    """The packaged template text of a task."""
    if name not in TASKS:
        raise ValueError(f"unknown prompt {name!r}; known prompts: {', '.join(TASKS)}")
    return resources.files(__package__).joinpath(file_name(name)).read_text(encoding="utf-8")
