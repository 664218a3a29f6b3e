"""`did_you_mean`: the hint a message about a mistyped name ends with (a settings key, a prompt
template, a principal). Its own module because both the settings and the prompt folder they
validate use it (canopy.settings imports canopy.prompt_dir: no circle back)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["did_you_mean"]

# What other tools call an endpoint setting (Microsoft GraphRAG and LiteLLM: api_base; the
# openai client: base_url): spelling matches alone would offer 'api_key' for 'api_base'.
_SYNONYMS = {"api_base": "base_url", "base_uri": "base_url", "endpoint": "base_url",
             "url": "base_url", "api_url": "base_url", "model_name": "model",
             "deployment_name": "model"}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """"; did you mean 'x'?" for the closest of `known` to a mistyped `name` (or the name of
    `known` that other tools give it, _SYNONYMS), else ""."""
    known = list(known)
    if _SYNONYMS.get(name.lower()) in known:
        return f"; did you mean {_SYNONYMS[name.lower()]!r}?"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
