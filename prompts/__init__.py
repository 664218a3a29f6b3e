"""Prompt templates, one text file per task, and their loader.

Templates use `string.Template` syntax: `$name` or `${name}` is replaced, `$$` is a literal
dollar sign, and braces in templates or in substituted content need no escaping (documents,
JSON and code are full of them). Substitution is a single pass, so `$` inside a value is
never expanded.

Every packaged template starts with a `Task: <name>` line; it tells a reader (and the test
suite's fake endpoint) which task a request belongs to.

A user may replace any template with a file of the same name in a `[prompts] dir` folder
(`canopy.prompt_dir` validates and reads it into a `PromptSet`); `placeholders` says which
placeholders each must keep. `render` here always uses the packaged templates.
"""

from __future__ import annotations

from canopy.prompts.packaged import TASKS, file_name, load_prompt
from canopy.prompts.placeholders import MEANINGS, OPTIONAL, optional, placeholders, required
from canopy.prompts.prompt_set import PromptSet

__all__ = ["DEFAULT_PROMPTS", "MEANINGS", "OPTIONAL", "TASKS", "PromptSet", "file_name",
           "load_prompt", "optional", "placeholders", "render", "required"]

DEFAULT_PROMPTS = PromptSet()


def render(name: str, /, **values: object) -> str:
    """A packaged template filled with `values`; every placeholder must be given."""
    return DEFAULT_PROMPTS.render(name, **values)
