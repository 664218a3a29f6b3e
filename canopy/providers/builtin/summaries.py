"""Extractive summaries of an entity's or relationship's descriptions (Edge et al. 2024 §2.1.3,
without a model): the most central sentences, chosen within a token budget, in original order.
Deterministic: ties are broken by position.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

from canopy.providers.builtin.text import split_sentences, terms
from canopy.tokenizer import Tokenizer

__all__ = ["summarize_descriptions"]

_NORM = re.compile(r"\W+")


def summarize_descriptions(descriptions: Sequence[str], max_tokens: int,
                           tokenizer: Tokenizer) -> str:
    """Extractive summary: distinct sentences ranked by centrality (how many other descriptions
    share each of their terms), chosen greedily within `max_tokens`, original order kept."""
    if max_tokens <= 0:
        return ""
    sents: list[tuple[int, str, set[str]]] = []
    seen: set[str] = set()
    for di, d in enumerate(descriptions):
        for s in split_sentences(d):
            key = _NORM.sub(" ", s.casefold()).strip()
            if key and key not in seen:
                seen.add(key)
                sents.append((di, s, set(terms(s))))
    if not sents:
        return ""
    per_description: dict[int, set[str]] = {}
    for di, _, t in sents:
        per_description.setdefault(di, set()).update(t)
    df = Counter(t for ts in per_description.values() for t in ts)
    scores = []
    for i, (di, _, ti) in enumerate(sents):
        central = sum(df[t] - 1 for t in ti) / math.sqrt(len(ti)) if ti else 0.0
        lead = 0.1 if i == 0 or sents[i - 1][0] != di else 0.0
        scores.append(central + lead)
    chosen: list[int] = []
    used = 0
    for i in sorted(range(len(sents)), key=lambda i: (-scores[i], i)):
        cost = tokenizer.count(sents[i][1]) + 1
        if used + cost <= max_tokens:
            chosen.append(i)
            used += cost
    if not chosen:
        best = sents[min(range(len(sents)), key=lambda i: (-scores[i], i))][1]
        cut = tokenizer.truncate(best, max_tokens)
        return cut[: cut.rfind(" ")] if " " in cut else cut.replace("\ufffd", "")
    chosen.sort()
    out = " ".join(sents[i][1] for i in chosen)
    while tokenizer.count(out) > max_tokens and len(chosen) > 1:
        chosen.remove(min(chosen, key=lambda i: (scores[i], -i)))
        out = " ".join(sents[i][1] for i in chosen)
    return out
