"""Answers to Microsoft GraphRAG's indexing prompts, so the fake endpoint can serve GraphRAG too.

benchmarks/index_bench.py (`--graphrag-python`) indexes the same corpus with GraphRAG against
the same fake server as Canopy, and the `canopy import-graphrag` fixture was generated that way.
GraphRAG's prompts carry no `Task:` marker; each is recognised by its own wording, and answered
in the format GraphRAG parses:
- graph extraction: `("entity"<|>NAME<|>TYPE<|>description)` and
  `("relationship"<|>SOURCE<|>TARGET<|>description<|>strength)` records joined by `##`, ending
  with `<|COMPLETE|>` (one entity per capitalised phrase of a sentence, one relationship per pair
  of phrases in a sentence: the same model of "an LLM" as responses.extract);
- claim extraction (extract_claims enabled): `(SUBJECT<|>OBJECT<|>TYPE<|>STATUS<|>START<|>END<|>
  description<|>source text)` records joined by `##`, ending with `<|COMPLETE|>`: one claim per
  sentence that names something and reports an event (a cue word, as responses.extract) or
  states a date; subject and object are its first two capitalised phrases in upper case (as the
  graph extraction writes them, so they name its entities), dates in GraphRAG's
  `2024-03-12T00:00:00` shape (`2024-10` at month precision, `NONE` without one), the sentence
  itself as the source text;
- a gleaning turn ("MANY entities ... were missed", for graph or claims): nothing more; the loop
  question: `N`;
- description summaries: the distinct descriptions, joined;
- community reports (response_format named CommunityReportResponse): JSON with title, summary,
  rating, rating_explanation and findings citing `[Data: Entities (ids)]` from the context.
Nothing here imports GraphRAG or Canopy.
"""

from __future__ import annotations

import csv
import io
import json
import re
from typing import Any

from tests.fakes.responses import (
    _CLAIM_WORDS,
    _DATE,
    _claim_dates,
    _guess_type,
    capitalized_phrases,
    sentences,
    user_texts,
)

__all__ = ["REPORT_SCHEMA", "chat_content", "identify_task"]

REPORT_SCHEMA = "CommunityReportResponse"  # GraphRAG's response model for community reports
_REAL_DATA = re.compile(r"-Real Data-.*?Entity_types:\s*(.*?)\nText:\s*(.*?)\n#{6,}\nOutput:",
                        re.DOTALL)
# GraphRAG's claim prompt ends with its entity specification, claim description and the text
_CLAIMS_DATA = re.compile(r"-Real Data-.*?Entity specification:.*?\nClaim description:.*?\n"
                          r"Text:\s*(.*?)\nOutput:\s*\Z", re.DOTALL)
_TUPLE, _RECORD, _DONE = "<|>", "\n##\n", "<|COMPLETE|>"


def identify_task(body: dict[str, Any], schema: str | None) -> str | None:
    """The GraphRAG task of a chat request, or None when it is not one of GraphRAG's prompts."""
    if schema == REPORT_SCHEMA:
        return "graphrag_report"
    users = user_texts(body)
    if not users:
        return None
    last = users[-1]
    if last.startswith("It appears some entities") and "Answer Y" in last:
        return "graphrag_loop"
    if last.startswith("MANY entities"):
        return "graphrag_glean"
    if _REAL_DATA.search(users[0]):
        return "graphrag_extract"
    if _CLAIMS_DATA.search(users[0]):
        return "graphrag_claims"
    if "Description List:" in users[0] and "comprehensive summary" in users[0]:
        return "graphrag_summarize"
    return None


def _clean(text: str) -> str:
    """Text safe inside a record: no delimiters, no parentheses at the ends."""
    return " ".join(text.replace(_TUPLE, " ").replace("##", " ").split()).strip("()")


def extract(prompt: str) -> str:
    found = _REAL_DATA.search(prompt)
    if not found:
        return _DONE
    allowed = [t.strip().lower() for t in found.group(1).split(",") if t.strip()] or ["person"]
    seen: dict[str, str] = {}
    pairs: dict[tuple[str, str], list[str]] = {}
    for sent in sentences(found.group(2)):
        names = [n for n in capitalized_phrases(sent) if _clean(n)]
        for name in names:
            seen.setdefault(name, f"{name} appears in the text: {_clean(sent)}")
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pairs.setdefault((a, b), []).append(sent)
    records = [f'("entity"{_TUPLE}{_clean(n).upper()}{_TUPLE}'
               f'{_guess_type(n, allowed).upper()}{_TUPLE}{d})' for n, d in seen.items()]
    records += [f'("relationship"{_TUPLE}{_clean(a).upper()}{_TUPLE}{_clean(b).upper()}{_TUPLE}'
                f'{_clean(a)} and {_clean(b)} are mentioned together: {_clean(sents[0])}'
                f'{_TUPLE}{min(10, 2 + 2 * len(sents))})' for (a, b), sents in pairs.items()]
    return _RECORD.join(records) + ("\n" if records else "") + _DONE


def claims(prompt: str) -> str:
    found = _CLAIMS_DATA.search(prompt)
    if not found:
        return _DONE
    records = []
    for sent in sentences(found.group(1)):
        names = [n for n in capitalized_phrases(sent) if _clean(n)]
        cue = _CLAIM_WORDS.search(sent)
        if not names or not (cue or _DATE.search(sent)):
            continue
        subject = _clean(names[0]).upper()
        obj = _clean(names[1]).upper() if len(names) > 1 else "NONE"
        status = "SUSPECTED" if re.search(r"alleged|accused|claimed", sent, re.I) else "TRUE"
        start, end = _claim_dates(sent)
        kind = "REPORTED EVENT" if cue else "DATED FACT"
        what = f"{names[0]} {cue.group(1).lower()}" if cue else f"A dated fact about {names[0]}"
        records.append(_TUPLE.join([
            f"({subject}", obj, kind, status, start, end,
            f"{what}{f' (involving {names[1]})' if len(names) > 1 else ''}, according to "
            "the text", f"{_clean(sent)})"]))
    return _RECORD.join(records) + ("\n" if records else "") + _DONE


def summarize(prompt: str) -> str:
    found = re.search(r"Description List:\s*(.*?)\n#{3,}", prompt, re.DOTALL)
    raw = found.group(1).strip() if found else ""
    try:
        items = [str(x) for x in json.loads(raw)]
    except ValueError:
        items = [raw]
    return " ".join(dict.fromkeys(i.strip() for i in items if i.strip()))


def _table(prompt: str, name: str) -> list[dict[str, str]]:
    found = re.search(rf"-----{name}-----\n(.*?)(?:\n\s*\n|\n-----|\Z)", prompt, re.DOTALL)
    if not found:
        return []
    return list(csv.DictReader(io.StringIO(found.group(1))))


def report(prompt: str) -> dict[str, Any]:
    entities = _table(prompt, "Entities")
    rels = _table(prompt, "Relationships")

    def degree(e: dict[str, str]) -> int:
        return int(e.get("degree") or 0) if (e.get("degree") or "").isdigit() else 0

    def rid(row: dict[str, str]) -> str:
        return row.get("human_readable_id") or row.get("id") or ""

    ranked = sorted(entities, key=lambda e: (-degree(e), e.get("title", "")))
    names = [e["title"] for e in ranked if e.get("title")] or ["Unnamed community"]
    findings = []
    for e in ranked[:5]:
        name = e.get("title", "")
        rel_ids = [rid(r) for r in rels if name in (r.get("source"), r.get("target"))][:5]
        refs = f"Entities ({rid(e)})" + (f"; Relationships ({', '.join(rel_ids)})"
                                         if rel_ids else "")
        findings.append({"summary": f"The role of {name}",
                         "explanation": f"{e.get('description', '')} [Data: {refs}]"})
    if not findings:
        findings.append({"summary": "An empty community",
                         "explanation": "The data lists no members."})
    return {
        "title": " and ".join(names[:2]) + " community",
        "summary": f"The community links {', '.join(names[:5])} through {len(rels)} "
                   "relationships.",
        "rating": float(min(10, 2 + len(entities) // 2)),
        "rating_explanation": f"It has {len(entities)} entities and {len(rels)} relationships.",
        "findings": findings,
    }


def chat_content(task: str, body: dict[str, Any]) -> str:
    users = user_texts(body)
    prompt = users[0] if users else ""
    if task == "graphrag_extract":
        return extract(prompt)
    if task == "graphrag_claims":
        return claims(prompt)
    if task == "graphrag_glean":
        return _DONE
    if task == "graphrag_loop":
        return "N"
    if task == "graphrag_summarize":
        return summarize(prompt)
    if task == "graphrag_report":
        return json.dumps(report(prompt))
    raise ValueError(f"not a GraphRAG task: {task}")
