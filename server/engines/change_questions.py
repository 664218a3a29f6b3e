"""Questions about change over time ("how did X evolve", "what changed since June"), recognised
by their grammar, not by a list fitted to one corpus (issue 31, "Time").

A question asks about change when
1. it asks how a verb of change happened, the verb put in time by an auxiliary ("how has X
   changed", "how did the policy evolve", "how is X shifting"), or asks what changed ("what
   changed", "what has shifted"); or names evolution or a timeline outright ("the evolution
   of", "a timeline of"); or
2. it pairs a word of change (a verb or noun: change, shift, trend, growth ...; what
   happened) with a span of time: "over time", "over the past year", "since <a time or an
   event>", "from <a time> to <a time>", "between <a time> and <a time>", "before and after".
The words of change and of time are English grammar (closed classes and the verbs of change
with their forms), so the rule holds for any folder. Global search answers such questions
period by period (canopy.server.engines.global_engine); the router sends them there.
Where it fires on benchmarks/router_eval.py's DEV questions: benchmarks/change_router_eval.py.
"""

from __future__ import annotations

import re

__all__ = ["change_question"]

# Verbs of change with their forms (base, -s, past, participle, progressive) and their nouns.
_VERB = (r"chang(?:e|es|ed|ing)|evol(?:ve|ves|ved|ving)|develop(?:s|ed|ing)?"
         r"|shift(?:s|ed|ing)?|transform(?:s|ed|ing)?|progress(?:es|ed|ing)?"
         r"|grow(?:s|n|ing)?|grew|trend(?:s|ed|ing)|declin(?:e|es|ed|ing)|ris(?:e|es|en|ing)"
         r"|rose|fall(?:s|en|ing)?|fell|increas(?:e|es|ed|ing)|decreas(?:e|es|ed|ing)"
         r"|improv(?:e|es|ed|ing)|worsen(?:s|ed|ing)?|expand(?:s|ed|ing)?|shr[ai]nk(?:s|ing)?"
         r"|shrunk")
_PAST = (r"chang(?:ed)|evolved|developed|shifted|transformed|progressed|grown|grew|trended"
         r"|declined|risen|rose|fallen|fell|increased|decreased|improved|worsened|expanded"
         r"|shrank|shrunk")
_NOUN = (r"changes?|evolution|developments?|shifts?|transformations?|progress|growth|trends?"
         r"|declines?|rises?|falls?|increases?|decreases?|improvements?|expansion")
_WORD_OF_CHANGE = re.compile(rf"\b(?:{_VERB}|{_NOUN}|happen(?:s|ed|ing)?)\b", re.IGNORECASE)
_ASKED = [
    # how + an auxiliary that puts the verb in time + its subject + the verb
    re.compile(rf"\b(?:how|in\s+what\s+ways?)\s+(?:has|have|had|did|was|were)\b"
               rf"(?:\W+[\w'’]+){{0,8}}?\W+(?:{_VERB})\b", re.IGNORECASE),
    # how/what ... is/are + a progressive verb of change
    re.compile(rf"\b(?:how|what)\b(?:\W+[\w'’]+){{0,8}}?\W+(?:is|are|was|were)\s+"
               rf"(?:{_VERB})\b(?<=ing)", re.IGNORECASE),
    # what (has) changed
    re.compile(rf"\bwhat\s+(?:has\s+|have\s+|had\s+)?(?:{_PAST})\b", re.IGNORECASE),
]
_OUTRIGHT = re.compile(r"\b(?:evolution|timelines?|chronolog(?:y|ical))\b", re.IGNORECASE)
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_UNIT = r"(?:days?|weeks?|months?|quarters?|years?|decades?)"
_TIME = (rf"(?:(?:the\s+)?(?:early|late|mid-?)?\s*(?:1[89]|2[01])\d\d(?:s)?"
         rf"|{_MONTH}(?:\s+\d{{4}}|\s+\d{{1,2}}(?:,?\s+\d{{4}})?)?"
         rf"|(?:the\s+)?(?:last|past|previous|this)\s+(?:\w+\s+)?{_UNIT}"
         r"|yesterday|today|then|the\s+start|the\s+beginning|q[1-4](?:\s+\d{4})?)")
_SPAN = re.compile(
    rf"\bover\s+time\b|\bover\s+(?:the\s+)?(?:last|past|recent|previous|coming)\s+(?:\w+\s+)?"
    rf"{_UNIT}|\bover\s+the\s+{_UNIT}\b|\bsince\s+(?:{_TIME}|the\s+\w+)"
    rf"|\bfrom\s+{_TIME}\s+(?:to|until|through|till)\s+{_TIME}"
    rf"|\bbetween\s+{_TIME}\s+and\s+{_TIME}|\bbefore\s+and\s+after\b"
    rf"|\b(?:year|month|week|quarter)\s+(?:over|by|to)\s+(?:year|month|week|quarter)\b",
    re.IGNORECASE)


def change_question(query: str) -> str | None:
    """The words of `query` that make it a question about change over time (quoted for the
    route's reason), or None."""
    span = _SPAN.search(query)
    word = _WORD_OF_CHANGE.search(query) or _OUTRIGHT.search(query)
    if span and word:
        return f"'{word.group(0)}' with '{span.group(0)}'"
    outright = _OUTRIGHT.search(query)
    if outright:
        return f"'{outright.group(0)}'"
    for pattern in _ASKED:
        asked = pattern.search(query)
        if asked:
            return f"'{' '.join(asked.group(0).split())}'"
    return None
