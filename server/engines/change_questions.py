"""Questions about change over time ("how did X evolve", "what changed since June"), recognised
by their grammar, not by a list fitted to one corpus (issue 31, "Time").

A question asks about change when
1. it asks how or what with a verb of change in a perfect, past or progressive form ("how has
   X changed", "how did the policy evolve", "what is shifting", "what changed"), or names
   evolution or a timeline outright ("the evolution of", "a timeline of"); or
2. it pairs a word of change (a verb or noun: change, shift, trend, growth ...; or what
   happened, what is new) with a span of time: "over time", "over the past year", "since
   <a time or an event>", "from <a time> to <a time>",
   "between <a time> and <a time>", "before and after".
The verbs of change and the time words are English grammar (a closed class of the language),
so the rule holds for any folder. Global search answers such questions period by period
(canopy.server.engines.global_engine); the router sends them there.
"""

from __future__ import annotations

import re

__all__ = ["change_question"]

_CHANGE = (r"chang|evolv|evolution|develop|shift|transform|progress|grow|grew|grown|trend"
           r"|declin|rose|risen|rise|rising|fell|fall(?:en|ing)?|increas|decreas|improv"
           r"|worsen|expand|shrank|shrink")
# with a span of time, what happened or is new in it is a change too
_WORD_OF_CHANGE = re.compile(rf"\b(?:{_CHANGE}|happen|new\b|latest|updat)\w*", re.IGNORECASE)
# verbs of change, as verbs: base, past, participle and progressive forms (not "growth")
_VERB = (r"(?:chang|evolv|develop|shift|transform|progress|declin|increas|decreas|improv"
         r"|worsen|expand)(?:e|es|ed|ing|s)?|grow(?:s|n|ing)?|grew|ris(?:e|es|en|ing)|rose"
         r"|fall(?:s|en|ing)?|fell|shr[ai]nk(?:s|ing)?|shrunk|trend(?:ed|ing)")
_PUT_IN_TIME = r"(?:has|have|had|did|was|were|been|'s|'ve)"
_HOW = re.compile(
    rf"\b(?:how|what|in\s+what\s+ways?)\b(?:\W+\w+){{0,8}}?\W+(?:{_VERB})\b", re.IGNORECASE)
_TIMED = re.compile(rf"\b{_PUT_IN_TIME}\b|\b\w+(?:ed|ing)$|\b(?:grew|rose|fell|shrank|shrunk)$",
                    re.IGNORECASE)
_OUTRIGHT = re.compile(r"\b(?:evolution|evolv\w*|timeline|chronolog\w*|history\s+of)\b",
                       re.IGNORECASE)
_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_UNIT = r"(?:days?|weeks?|months?|quarters?|years?|decades?)"
_TIME = (rf"(?:(?:the\s+)?(?:early|late|mid-?)?\s*(?:1[89]|2[01])\d\d(?:s)?"
         rf"|{_MONTH}(?:\s+\d{{4}}|\s+\d{{1,2}}(?:,?\s+\d{{4}})?)?"
         rf"|(?:the\s+)?(?:last|past|previous|this)\s+(?:\w+\s+)?{_UNIT}"
         r"|yesterday|today|then|the\s+start|the\s+beginning|q[1-4](?:\s+\d{4})?)")
_SPAN = re.compile(
    rf"\bover\s+time\b|\bover\s+(?:the\s+)?(?:last|past|recent|previous|coming)\s+(?:\w+\s+)?"
    rf"{_UNIT}|\bover\s+(?:the\s+)?{_UNIT}\b|\bsince\s+(?:{_TIME}|(?:the\s+|a\s+)?\w+)|\b(?:this|last|past)\s+{_UNIT}"
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
    how = _HOW.search(query)
    if how and _TIMED.search(how.group(0)):
        return f"'{' '.join(how.group(0).split())}'"
    return None
