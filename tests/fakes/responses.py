"""Deterministic answers of the fake endpoint, synthesised from the prompt content.

Each function reads the sections of a Canopy prompt (`===== Name =====` headers, see prompts/)
and returns output that validates against the task's schema. Nothing here imports Canopy: the
fake must stay an independent model of "an LLM that follows the prompt".
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import struct
from typing import Any

import numpy as np

TASK_MARKER = re.compile(r"^Task: (\w+)[ \t]*$", re.MULTILINE)
_SECTION = "===== {name} =====\n(.*?)(?:\n===== |\\Z)"
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_CAPITALIZED = re.compile(r"[A-Z][\w'-]*(?:[ \t]+[A-Z][\w'-]*)*")
_LEADING = {
    "a",
    "after",
    "an",
    "and",
    "as",
    "at",
    "before",
    "but",
    "by",
    "during",
    "for",
    "from",
    "he",
    "her",
    "his",
    "if",
    "in",
    "it",
    "its",
    "last",
    "of",
    "on",
    "our",
    "she",
    "since",
    "the",
    "their",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "to",
    "today",
    "we",
    "when",
    "while",
    "with",
    "yesterday",
}
_STOP = _LEADING | {
    "about",
    "all",
    "also",
    "any",
    "are",
    "been",
    "can",
    "did",
    "does",
    "had",
    "has",
    "have",
    "how",
    "into",
    "is",
    "main",
    "most",
    "not",
    "over",
    "say",
    "said",
    "than",
    "that",
    "was",
    "were",
    "what",
    "which",
    "who",
    "why",
    "will",
    "would",
    "you",
    "your",
    "between",
    "themes",
    "theme",
    "data",
}
_TYPE_HINTS = {
    "organization": (
        "inc",
        "corp",
        "ltd",
        "company",
        "group",
        "institute",
        "university",
        "agency",
        "council",
        "bank",
        "labs",
        "foundation",
        "ministry",
        "department",
        "association",
    ),
    "geo": (
        "city",
        "river",
        "lake",
        "island",
        "county",
        "valley",
        "harbor",
        "port",
        "mount",
        "bay",
    ),
    "event": (
        "summit",
        "festival",
        "conference",
        "war",
        "election",
        "crisis",
        "treaty",
        "flood",
        "strike",
    ),
}
_CLAIM_WORDS = re.compile(
    r"\b(alleged|accused|announced|reported|fined|sued|claimed|denied)\b", re.I
)
_MONTH_NAMES = ("january february march april may june july august september october november "
                "december").split()
# Dates as a model reads them from a sentence: ISO dates, "10 January 2025", "January 2025".
_DATE = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b|\b(?:(\d{1,2}) )?(" + "|".join(_MONTH_NAMES)
                   + r")(?: (\d{1,2}),)? (\d{4})\b", re.I)


# ---- prompt reading ---------------------------------------------------------------------------


def user_texts(body: dict[str, Any]) -> list[str]:
    return [_content(m) for m in body.get("messages", []) if m.get("role") == "user"]


def _content(message: dict[str, Any]) -> str:
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def identify_task(body: dict[str, Any]) -> str:
    """The schema name of a json_schema request, else the last task marker of the conversation
    (a repair turn belongs to the task it repairs)."""
    from tests.fakes import graphrag_responses  # it imports this module: imported late

    fmt = body.get("response_format") or {}
    schema = str(fmt.get("json_schema", {}).get("name", "unknown"))
    if fmt.get("type") == "json_schema" and schema != graphrag_responses.REPORT_SCHEMA:
        return schema
    markers = [m for text in user_texts(body) for m in TASK_MARKER.findall(text) if m != "repair"]
    if markers:
        return markers[-1]
    # Microsoft GraphRAG's prompts (benchmarks/index_bench.py, the import-graphrag fixture)
    return graphrag_responses.identify_task(body, schema) or "unknown"


def section(text: str, name: str) -> str:
    found = re.search(_SECTION.format(name=re.escape(name)), text, re.DOTALL)
    return found.group(1).strip() if found else ""


def keywords(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z0-9]{3,}", text.lower()) if w not in _STOP}


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(" ".join(text.split())) if s.strip()]


def capitalized_phrases(sentence: str) -> list[str]:
    out: list[str] = []
    for match in _CAPITALIZED.findall(sentence):
        words = match.split()
        while words and words[0].lower() in _LEADING:
            words = words[1:]
        name = " ".join(words).strip("'-")
        if len(name) >= 2 and name not in out:
            out.append(name)
    return out


# ---- indexing tasks ---------------------------------------------------------------------------


def _entity_types(prompt: str) -> list[str]:
    found = re.search(r"whose type is one of: (.+?)\.\n", prompt)
    types = [t.strip() for t in found.group(1).split(",")] if found else []
    return [t for t in types if t] or ["organization", "person", "geo", "event"]


def _guess_type(name: str, allowed: list[str]) -> str:
    words = name.lower().split()
    for kind, hints in _TYPE_HINTS.items():
        if kind in allowed and any(w in hints for w in words):
            return kind
    if "person" in allowed and len(words) == 2:
        return "person"
    return allowed[0]


def extract(prompt: str) -> dict[str, Any]:
    text = section(prompt, "Text")
    types = _entity_types(prompt)
    claims_on = "Skip this step" not in prompt
    entities: dict[str, dict[str, str]] = {}
    together: dict[tuple[str, str], list[str]] = {}
    claims: list[dict[str, str]] = []
    for sent in sentences(text):
        names = capitalized_phrases(sent)
        for name in names:
            entities.setdefault(
                name,
                {
                    "name": name,
                    "type": _guess_type(name, types),
                    "description": f"{name} appears in the text: {sent}",
                },
            )
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                together.setdefault((a, b), []).append(sent)
        cue = _CLAIM_WORDS.search(sent) if claims_on and names else None
        if cue:
            status = "SUSPECTED" if re.search(r"alleged|accused|claimed", sent, re.I) else "TRUE"
            start, end = _claim_dates(sent)
            obj = names[1] if len(names) > 1 else ""
            claims.append(
                {
                    "subject": names[0],
                    "object": obj,
                    "type": "REPORTED_EVENT",
                    "status": status,
                    # a restatement, as a model writes it; the quote is the sentence itself
                    "description": f"{names[0]} {cue.group(1).lower()}"
                    + (f" (involving {obj})" if obj else "") + ", according to the text.",
                    "start_date": start,
                    "end_date": end,
                    "quote": sent,
                }
            )
    relationships = [
        {
            "source": a,
            "target": b,
            "description": f"{a} and {b} are mentioned together: {sents[0]}",
            "strength": min(10, 2 + 2 * len(sents)),
        }
        for (a, b), sents in together.items()
    ]
    return {"entities": list(entities.values()), "relationships": relationships, "claims": claims}


def _claim_dates(sentence: str) -> tuple[str, str]:
    """The first and last dates of a sentence, as a model writes them in GraphRAG's format
    ("2025-01-14T00:00:00"; month precision "2025-01"); "NONE" for a sentence without one."""
    found = []
    for m in _DATE.finditer(sentence):
        if m.group(1):
            found.append(f"{m.group(1)}-{m.group(2)}-{m.group(3)}T00:00:00")
        else:
            month = _MONTH_NAMES.index(m.group(5).lower()) + 1
            day = m.group(4) or m.group(6)
            found.append(f"{m.group(7)}-{month:02d}" + (f"-{int(day):02d}T00:00:00" if day else ""))
    return (found[0], found[-1]) if found else ("NONE", "NONE")


def glean(body: dict[str, Any]) -> dict[str, Any]:
    """One extra entity on the first gleaning turn of a unit, nothing on later turns."""
    users = user_texts(body)
    empty: dict[str, Any] = {"entities": [], "relationships": [], "claims": []}
    if sum(1 for t in users if "glean" in TASK_MARKER.findall(t)) != 1:
        return empty
    prompt = users[0]
    known = set()
    for m in body.get("messages", []):
        if m.get("role") == "assistant":
            try:
                known |= {e["name"].lower() for e in json.loads(_content(m)).get("entities", [])}
            except (ValueError, AttributeError, KeyError, TypeError):
                pass
    text = section(prompt, "Text")
    for sent in sentences(text):
        words = sorted(set(re.findall(r"\b[a-z]{6,}\b", sent)), key=lambda w: (-len(w), w))
        for word in words:
            name = word.capitalize()
            if word in _STOP or name.lower() in known:
                continue
            out = dict(empty)
            out["entities"] = [
                {
                    "name": name,
                    "type": _entity_types(prompt)[0],
                    "description": f"{name} is mentioned in the text: {sent}",
                }
            ]
            partners = [n for n in capitalized_phrases(sent) if n.lower() in known]
            if partners:
                out["relationships"] = [
                    {
                        "source": name,
                        "target": partners[0],
                        "strength": 3,
                        "description": f"{name} concerns {partners[0]}: {sent}",
                    }
                ]
            return out
    return empty


def resolve(prompt: str) -> dict[str, Any]:
    """A pair is one entity when the shorter name's capitals spell the longer's initials, or
    when it is the longer's last word and the passage writes it alone after the full name."""
    text = section(prompt, "Passage")
    out = []
    for line in section(prompt, "Pairs").splitlines():
        m = re.match(r"^(\d+)\. (.+?) \| (.+)$", line.strip())
        if not m:
            continue
        short, long = m.group(2), m.group(3)
        words = re.findall(r"\w+", long)
        initials = "".join(w[0] for w in words).upper()
        alone = re.sub(re.escape(long), "", text)
        same = (short.isupper() and short.replace(".", "") == initials) or (
            words[-1] == short and long in text and re.search(rf"\b{re.escape(short)}\b", alone)
            is not None)
        out.append({"id": int(m.group(1)), "same": bool(same)})
    return {"pairs": out}


def summarize(prompt: str) -> str:
    lines = section(prompt, "Descriptions").splitlines()
    items = [ln[2:].strip() for ln in lines if ln.startswith("- ")]
    return " ".join(dict.fromkeys(items))


def _table(context: str, name: str) -> list[list[str]]:
    """Rows of one `-----Name-----` CSV-like table of a report context (header skipped)."""
    found = re.search(rf"-----{name}-----\n[^\n]*\n(.*?)(?:\n-----|\Z)", context, re.DOTALL)
    if not found:
        return []
    return [ln.split(",") for ln in found.group(1).splitlines() if re.match(r"^\d+,", ln)]


def report(prompt: str) -> dict[str, Any]:
    context = section(prompt, "Data")
    entities = [
        (int(r[0]), r[1], ",".join(r[2:-1]), int(r[-1]) if r[-1].isdigit() else 0)
        for r in _table(context, "Entities")
        if len(r) >= 3
    ]
    rels = [(int(r[0]), r[1], r[2]) for r in _table(context, "Relationships") if len(r) >= 3]
    subs = [(int(r[0]), r[1]) for r in _table(context, "Reports") if len(r) >= 2]
    ranked = sorted(entities, key=lambda e: (-e[3], e[0]))
    names = [e[1] for e in ranked] or [s[1] for s in subs] or ["Unnamed community"]
    findings = []
    for i, name, desc, _ in ranked[:6]:
        rel_ids = [j for j, s, t in rels if name in (s, t)][:5]
        findings.append(
            {
                "summary": f"The role of {name}",
                "explanation": desc or f"{name} is a member.",
                "entity_ids": [i],
                "relationship_ids": rel_ids,
                "report_ids": [subs[len(findings) % len(subs)][0]] if subs else [],
            }
        )
    for k, title in subs[: max(0, 5 - len(findings))]:
        findings.append(
            {
                "summary": f"Sub-community: {title}",
                "explanation": f"It contains the sub-community {title}.",
                "entity_ids": [],
                "relationship_ids": [],
                "report_ids": [k],
            }
        )
    if not findings:
        findings.append(
            {
                "summary": "An empty community",
                "explanation": "The data lists no members.",
                "entity_ids": [],
                "relationship_ids": [],
                "report_ids": [],
            }
        )
    return {
        "title": " and ".join(names[:2]) + " community",
        "summary": f"The community links {', '.join(names[:5])} through {len(rels)} relationships.",
        "rating": float(min(10, 2 + len(entities) // 2 + len(subs))),
        "rating_explanation": f"It has {len(entities)} entities and {len(rels)} relationships.",
        "findings": findings,
    }


# ---- query tasks ------------------------------------------------------------------------------


def rate(prompt: str) -> dict[str, Any]:
    """Each listed report scored by the keywords its digest shares with the question: one shared
    keyword makes it relevant (5), as a digest holds few words."""
    query = keywords(section(prompt, "Question"))
    parts = re.split(r"^\[Report ([^\]]+)\] ", section(prompt, "Reports"), flags=re.MULTILINE)
    return {"scores": [{"id": rid, "score": min(10, 5 * len(query & keywords(text)))}
                       for rid, text in zip(parts[1::2], parts[2::2], strict=True)]}


def capped_ratings(content: str, cap: int) -> str:
    """A `rate` reply with every score at most `cap`."""
    out = json.loads(content)
    for s in out["scores"]:
        s["score"] = min(s["score"], cap)
    return json.dumps(out)


def map_points(prompt: str) -> dict[str, Any]:
    query = keywords(section(prompt, "Question"))
    body = section(prompt, "Reports")
    parts = re.split(r"^\[Report ([^\]]+)\] ", body, flags=re.MULTILINE)
    points = []
    for rid, text in zip(parts[1::2], parts[2::2], strict=True):
        overlap = sorted(query & keywords(text))
        if overlap:
            title = text.strip().splitlines()[0].lstrip("# ").strip()
            points.append(
                {
                    "description": f"{title} is about {', '.join(overlap)} [Data: Reports ({rid})]",
                    "score": min(100, 25 * len(overlap)),
                    "report_ids": [rid],
                }
            )
    if not points:
        points = [
            {
                "description": "These reports do not address the question.",
                "score": 0,
                "report_ids": [],
            }
        ]
    return {"points": points}


def reduce(prompt: str) -> str:
    query = section(prompt, "Question")
    lines = [ln.strip() for ln in section(prompt, "Analyst points").splitlines()]
    points = [ln for ln in lines if ln and not ln.startswith("-----")]
    return f"## Answer to: {query}\n\n" + "\n".join(f"- {p}" for p in points)


def _blocks(context: str) -> list[tuple[str, str, str]]:
    return re.findall(r"^\[(\w+) ([^\]]+)\] ?(.*)$", context, re.MULTILINE)


def answer(prompt: str) -> str:
    query = keywords(section(prompt, "Question"))
    context = section(prompt, "Data")
    cited = [
        f"{title or kind} [Data: {kind} ({bid})]"
        for kind, bid, title in _blocks(context)
        if query & keywords(title)
    ] or [f"{t or k} [Data: {k} ({b})]" for k, b, t in _blocks(context)[:3]]
    if not cited:
        return "The data does not answer the question."
    return "Based on the data: " + "; ".join(cited[:5]) + "."


def hyde(prompt: str) -> str:
    query = section(prompt, "Question")
    topics = ", ".join(sorted(keywords(query))) or "the topic"
    return f"A report answering '{query}' would discuss {topics}."


def drift(prompt: str) -> dict[str, Any]:
    query = keywords(section(prompt, "Question"))
    blocks = _blocks(section(prompt, "Data"))
    relevant = [(k, b, t) for k, b, t in blocks if query & keywords(t)]
    answer_text = (
        "; ".join(f"{t} [Data: {k} ({b})]" for k, b, t in relevant[:5])
        or "The data says little about this."
    )
    follow = [f"What else is known about {t}?" for _, _, t in (relevant or blocks)[:2] if t]
    return {
        "intermediate_answer": answer_text,
        "score": min(100, 20 * len(relevant)),
        "follow_up_queries": follow,
    }


_ACROSS = re.compile(
    r"\b(themes?|topics|trends?|overview|summar\w*|main|across|often|frequently|common|"
    r"recurring|generally|typically|overall|any|many|various|different|views|perspectives|"
    r"evolved?|consistently)\b", re.IGNORECASE)
# "What recurring topics ...", "Which episodes ...", "How do guests ...", "Are there ...":
# a plural subject within the first words asks about many documents at once.
_PLURAL_HEAD = re.compile(
    r"^\s*(?:(?:what|which)(?:\s+\w+){0,2}?\s+\w{3,}s\b(?!\s+(?:is|was|has|does)\b)|"
    r"(?:how|what)\s+(?:do|have|are|were)\b|(?:are|do|were|have)\s+(?!you\b|i\b|we\b))",
    re.IGNORECASE)
_VALUE = re.compile(r"^\s*(how many|how much|how long|when|where|what year|what date)\b",
                    re.IGNORECASE)


def route(prompt: str) -> dict[str, Any]:
    """An engine by the prompt's own definitions: a listed name in under half the passages ->
    local; a count, time or place -> basic; words or a plural subject asking about the whole
    collection -> global; any other listed name -> local; else basic."""
    question = section(prompt, "Question")
    names = [ln[2:] for ln in section(prompt, "Names of the index in the question").splitlines()
             if ln.startswith("- ")]
    shares = [int(m.group(1)) for n in names for m in [re.search(r"in (\d+)% of", n)] if m]
    if any(share < 50 for share in shares):
        return {"engine": "local", "reason": "The question names a particular entity."}
    if _VALUE.search(question):
        return {"engine": "basic", "reason": "The question asks for one value."}
    if _ACROSS.search(question) or _PLURAL_HEAD.search(question):
        return {"engine": "global", "reason": "The question asks about the whole collection."}
    if names:
        return {"engine": "local", "reason": "The question names an entity of the index."}
    return {"engine": "basic", "reason": "The question asks for one fact."}


# ---- answer evaluation ------------------------------------------------------------------------


def _count(prompt: str) -> int:
    found = re.search(r"exactly (\d+) entries", prompt)
    return int(found.group(1)) if found else 1


def tune(prompt: str) -> dict[str, Any]:
    """A domain from the passages' most frequent words, and the kinds of their capitalized
    names (as the extraction fake guesses them)."""
    text = section(prompt, "Passages")
    counts: dict[str, int] = {}
    for word in re.findall(r"[a-z]{4,}", text.lower()):
        if word not in _STOP and word != "passage":
            counts[word] = counts.get(word, 0) + 1
    top = [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:3]] or ["text"]
    kinds = [*_TYPE_HINTS, "person"]
    found = {_guess_type(n, kinds) for s in sentences(text) for n in capitalized_phrases(s)}
    return {"domain": "texts on " + ", ".join(top), "role": f"an analyst of {top[0]}",
            "entity_types": [k for k in kinds if k in found] or ["organization", "person"]}


def describe(prompt: str) -> str:
    lines = [ln[2:].split(":")[0] for ln in section(prompt, "Reports").splitlines()
             if ln.startswith("- ")]
    return "A collection about " + ", ".join(lines[:5] or ["various subjects"]) + "."


def personas(prompt: str) -> dict[str, Any]:
    return {"personas": [{"name": f"Reader {i}", "description": f"Reader {i} wants an overview."}
                         for i in range(1, _count(prompt) + 1)]}


def persona_tasks(prompt: str) -> dict[str, Any]:
    who = section(prompt, "User").split(":")[0]
    return {"tasks": [f"{who} task {i}" for i in range(1, _count(prompt) + 1)]}


def questions(prompt: str) -> dict[str, Any]:
    task = section(prompt, "Task")
    subject = section(prompt, "Description").removeprefix("A collection about ").split(",")[0]
    return {"questions": [f"What are the main themes of {subject.strip(' .')} for {task} "
                          f"(question {i})?" for i in range(1, _count(prompt) + 1)]}


def judge(prompt: str) -> dict[str, Any]:
    """A position-blind judge: by the criterion named, the answer with more words
    (comprehensiveness), more distinct words (diversity), more citations (empowerment) or
    fewer words (directness) wins; equal measures tie."""
    criterion = re.search(r"^Criterion: (\w+)", prompt, re.MULTILINE)
    name = criterion.group(1).lower() if criterion else ""
    answers = [section(prompt, "Answer 1"), section(prompt, "Answer 2")]
    if name == "diversity":
        measures = [len(set(a.lower().split())) for a in answers]
    elif name == "empowerment":
        measures = [a.count("[Data:") for a in answers]
    elif name == "directness":
        measures = [-len(a.split()) for a in answers]
    else:
        measures = [len(a.split()) for a in answers]
    winner = 0 if measures[0] == measures[1] else 1 if measures[0] > measures[1] else 2
    return {"reasoning": f"By {name or 'the criterion'}: {measures[0]} against {measures[1]}.",
            "winner": winner}


# ---- dispatch ---------------------------------------------------------------------------------


def chat_content(task: str, body: dict[str, Any]) -> str:
    """The assistant message content for one request."""
    users = user_texts(body)
    prompt = users[0] if users else ""
    json_tasks = {
        "extract": extract,
        "resolve": resolve,
        "report": report,
        "rate": rate,
        "map": map_points,
        "drift": drift,
        "route": route,
        "personas": personas,
        "persona_tasks": persona_tasks,
        "questions": questions,
        "judge": judge,
        "tune": tune,
    }
    text_tasks = {"summarize": summarize, "reduce": reduce, "answer": answer, "hyde": hyde,
                  "describe": describe}
    if task == "glean":
        return json.dumps(glean(body))
    if task.startswith("graphrag_"):
        from tests.fakes import graphrag_responses

        return graphrag_responses.chat_content(task, body)
    if task in json_tasks:
        return json.dumps(json_tasks[task](prompt))
    if task in text_tasks:
        return text_tasks[task](prompt)
    return (
        json.dumps({"answer": prompt[:200]})
        if body.get("response_format")
        else f"Echo: {prompt[:200]}"
    )


def embedding(text: str, dims: int) -> list[float]:
    """Bag-of-words hashing: texts sharing words get similar vectors (not normalised)."""
    vec = np.zeros(dims)
    words = re.findall(r"\w+", text.lower()) or [text]
    for word in words:
        vec += _word_vector(word, dims)  # in word order: the sums of a plain loop, to the bit
    return vec.tolist()  # type: ignore[no-any-return]


@functools.lru_cache(maxsize=100_000)
def _word_vector(word: str, dims: int) -> np.ndarray:
    """One word's part of `embedding`, computed once: benchmarks send the fake hundreds of
    long texts a second, and its embedding CPU was showing in their walls."""
    digest = hashlib.sha256(word.encode("utf-8")).digest()
    while len(digest) < dims * 2:
        digest += hashlib.sha256(digest).digest()
    out = np.array([v / 32768.0 for (v,) in struct.iter_unpack("<h", digest[: dims * 2])])
    out.setflags(write=False)
    return out
