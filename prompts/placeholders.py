"""What each template's placeholders are, which of them a replacement must keep, and what Canopy
puts in each: the contract between a template file and the code that fills it in.

A template's placeholders are those of its packaged version. A replacement may leave out only the
optional ones (wording the code supplies for convenience, such as a length hint); every other
placeholder carries the input of the task (the text to read, the question, the data) or a
setting the code relies on (the allowed entity types, which the extraction output is checked
against), so a template without it would silently ask the model about nothing.
"""

from __future__ import annotations

from functools import cache
from string import Template

from canopy.prompts.packaged import load_prompt

__all__ = ["MEANINGS", "OPTIONAL", "bad_dollar_line", "identifiers", "optional", "placeholders",
           "required"]

# Placeholders a replacement may drop: phrasing hints, never the task's input.
OPTIONAL = frozenset({"max_types", "max_words", "response_type"})

MEANINGS = {
    "answer1": "the first answer shown to the judge",
    "answer2": "the second answer shown to the judge",
    "claims_switch": "one sentence turning claim extraction on or off ([extract] claims)",
    "context": "the retrieved records (reports, entities, relationships, claims, passages) as "
               "tables under headers, each row with its id",
    "count": "how many items to produce",
    "criterion": "the name of the criterion judged",
    "definition": "what the criterion means",
    "description": "a description of the document collection",
    "descriptions": "the descriptions to merge, one per line, each starting with '- '",
    "entity_types": "the allowed entity types, comma-separated ([extract] entity_types); the "
                    "reply's types are checked against them",
    "error": "why the previous reply could not be used",
    "max_types": "the most entity types to propose",
    "max_words": "the length budget in words",
    "name": "the name of the entity or relationship described",
    "names": "index entity names found in the question, one per line",
    "pairs": "numbered pairs of names found in the text, one per line as 'N. name | name'",
    "persona": "one potential user of the collection",
    "points": "the analysts' points, most important first",
    "query": "the user's question",
    "question": "the question both answers respond to",
    "reports": "community reports, each under a '[Report <id>]' header",
    "response_type": "the form the answer should take, e.g. 'multiple paragraphs'",
    "run": "the repeat number (so that repeated judgments are separate requests)",
    "samples": "passages sampled from the collection, each under a header",
    "schema": "the JSON schema the reply must conform to",
    "task": "one task of that user",
    "text": "the text unit to read",
}

def identifiers(text: str) -> set[str]:
    """The placeholder names a template text uses."""
    return set(Template(text).get_identifiers())


def bad_dollar_line(text: str) -> int | None:
    """The line (from 1) of the first `$` that starts no placeholder and is not `$$`, if any:
    string.Template would refuse the whole template at render time."""
    for match in Template.pattern.finditer(text):
        if match.group("invalid") is not None:
            return text.count("\n", 0, match.start()) + 1
    return None


@cache
def placeholders(name: str) -> frozenset[str]:
    """Every placeholder a task's template may use: those of its packaged version."""
    return frozenset(identifiers(load_prompt(name)))


def required(name: str) -> frozenset[str]:
    return placeholders(name) - OPTIONAL


def optional(name: str) -> frozenset[str]:
    return placeholders(name) & OPTIONAL
