"""`PromptSet`: the templates one index uses - the packaged ones, with some replaced by the
files of a `[prompts] dir` folder (validated and read by `canopy.prompt_dir`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from string import Template
from types import MappingProxyType

from canopy.prompts.packaged import TASKS, load_prompt

__all__ = ["PromptSet"]


@lru_cache(maxsize=64)
def _compiled(text: str) -> Template:
    return Template(text)


@dataclass(frozen=True)
class PromptSet:
    """Template texts by task. `overrides` holds only the replacements that differ from the
    packaged text: a copied but unedited template changes nothing, fingerprints included."""

    overrides: Mapping[str, str] = field(default_factory=dict)
    source: str = ""  # the folder the overrides came from ("" = packaged templates only)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.overrides) - set(TASKS))
        if unknown:
            raise ValueError(f"unknown prompt(s) {', '.join(unknown)}")
        kept = {k: v for k, v in self.overrides.items() if v != load_prompt(k)}
        object.__setattr__(self, "overrides", MappingProxyType(kept))

    def text(self, name: str) -> str:
        """The template text a task uses."""
        return self.overrides.get(name) or load_prompt(name)

    def render(self, name: str, /, **values: object) -> str:
        """The template filled with `values`; every placeholder must be given. One pass:
        a `$` inside a value is never expanded."""
        try:
            return _compiled(self.text(name)).substitute({k: str(v) for k, v in values.items()})
        except KeyError as missing:
            raise ValueError(f"prompt {name!r} needs a value for {missing}") from None

    def fingerprint(self, *names: str) -> str:
        """A hash of the replaced templates among `names`, "" when none is replaced: what was
        derived with the packaged templates keeps its fingerprints and cache keys."""
        changed = [n for n in sorted(set(names)) if n in self.overrides]
        if not changed:
            return ""
        digest = hashlib.sha256()
        for name in changed:
            digest.update(f"{name}\0{self.overrides[name]}\0".encode())
        return "prompts:" + digest.hexdigest()[:16]
