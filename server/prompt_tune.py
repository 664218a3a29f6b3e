"""`canopy prompts tune`: extraction and report templates adapted to one corpus, by its LLM.

In the spirit of GraphRAG's prompt tuning (auto-templating from the corpus's own text):
1. sample text units deterministically (`canopy.server.sampling`, as the build estimate does);
2. ask the model, with the `tune` template, what the collection holds, who would read it, and
   which entity types matter in it;
3. run Canopy's own extraction template, with those types, on short excerpts of a few sampled
   units: the replies, checked against the extraction schema and the types, become few-shot
   examples in exactly the output format the index expects;
4. write `extract.txt` (a domain line, then the packaged instructions, then the examples) and
   `report.txt` (a domain and role line, then the packaged instructions), checked by the same
   validator as any `[prompts] dir`.
The tuned templates start from the packaged ones, so tuning twice does not stack. They keep
`$entity_types`: the proposed types take effect once `[extract] entity_types` names them (the
extraction output is checked against that setting), which the command prints.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, Field

from canopy.errors import ConfigError
from canopy.llm import ChatClient
from canopy.model import TextUnit
from canopy.prompt_dir import check_template, load_prompt_dir
from canopy.prompts import DEFAULT_PROMPTS, file_name, load_prompt
from canopy.providers.base import ExtractionOut, Usage
from canopy.providers.llm_provider import CLAIMS_OFF, CLAIMS_ON
from canopy.server.runtime import Workspace
from canopy.server.sampling import corpus_units, spread_sample
from canopy.tokenizer import get_tokenizer

__all__ = ["TunedPrompts", "tune_prompts", "write_tuned"]

MAX_TYPES = 8
PASSAGE_TOKENS = 600  # of each sampled unit shown to the model in the tuning request
EXAMPLE_TOKENS = 300  # of an excerpt the few-shot examples are made from (sent on every unit)
EXAMPLE_ITEMS = 8  # entities, and relationships, an example shows at most (claims: 3)
_TEXT_HEADER = "===== Text ====="
_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s|\n")


class TuneOut(BaseModel):
    domain: str = Field(description='What the collection holds: completes "The collection '
                                    'holds ..."')
    role: str = Field(description="The expert best placed to read it, with its article")
    entity_types: list[str] = Field(description="Kinds of entity to record, most important first")


@dataclass
class TunedPrompts:
    domain: str
    role: str
    entity_types: list[str]
    units: int  # sampled
    examples: int
    templates: dict[str, str] = field(default_factory=dict)  # task -> text
    usage: dict[str, Usage] = field(default_factory=dict)


def _user(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _literal(text: str) -> str:
    """Text placed into a template as is: a `$` in it must not read as a placeholder."""
    return text.replace("$", "$$")


def _clean(text: str) -> str:
    return " ".join(text.split()).strip().rstrip(".")


def entity_types_of(raw: list[str], limit: int = MAX_TYPES) -> list[str]:
    """The proposed types as `[extract] entity_types` can hold them: lowercase, one line, no
    comma (the template lists them comma-separated), no repeats."""
    out: list[str] = []
    for t in raw:
        name = " ".join(t.replace(",", " ").split()).lower()
        if name and name not in out:
            out.append(name)
    return out[:limit]


def excerpt(text: str, max_tokens: int) -> str:
    """The start of `text` within `max_tokens`, ended at a sentence end when one falls in its
    second half."""
    cut = get_tokenizer().truncate(text.strip(), max_tokens)
    if cut == text.strip():
        return cut
    ends = [m.start() for m in _SENTENCE_END.finditer(cut)]
    return cut[:ends[-1]].strip() if ends and ends[-1] > len(cut) // 2 else cut.strip()


def _example(out: ExtractionOut, types: list[str], claims: bool) -> ExtractionOut | None:
    """The reply as a few-shot example: entities of the tuned types only, relationships and
    claims between them; None when nothing is left."""
    allowed = {t.casefold() for t in types}
    entities = [e for e in out.entities if e.type.strip().casefold() in allowed][:EXAMPLE_ITEMS]
    names = {e.name.strip().casefold() for e in entities}
    if not entities:
        return None
    rels = [r for r in out.relationships
            if {r.source.strip().casefold(), r.target.strip().casefold()} <= names]
    kept = [c for c in out.claims if c.subject.strip().casefold() in names] if claims else []
    return ExtractionOut(entities=entities, relationships=rels[:EXAMPLE_ITEMS], claims=kept[:3])


def _reply_json(out: ExtractionOut) -> str:
    """The example reply as JSON with one item per line: readable, and short in tokens."""
    parts = []
    for key, items in out.model_dump().items():
        lines = ",\n  ".join(json.dumps(i, ensure_ascii=False) for i in items)
        parts.append(f'"{key}": [' + (f"\n  {lines}\n" if items else "") + "]")
    return "{" + ",\n".join(parts) + "}"


def tuned_extract(domain: str, role: str, examples: list[tuple[str, ExtractionOut]]) -> str:
    """The packaged extraction template with a domain line and the few-shot examples."""
    task, body = load_prompt("extract").split("\n", 1)
    before, found, after = body.partition(_TEXT_HEADER)
    if not found:  # the packaged template names its input section; a test guards it
        raise ConfigError(f"the packaged {file_name('extract')} has no {_TEXT_HEADER!r} line")
    shots = ["Examples. Replies to this request for passages of this collection look like "
             "this:", ""]
    for i, (text, out) in enumerate(examples, 1):
        reply = _reply_json(out)
        shots += [f"===== Example {i}: text =====", _literal(text),
                  f"===== Example {i}: reply =====", _literal(reply),
                  f"===== End of example {i} =====", ""]
    head = (f"The collection holds {_literal(domain)}. Read the text as {_literal(role)} "
            "would.")
    middle = "\n".join(shots) + "\n" if examples else ""
    return f"{task}\n{head}\n{before}{middle}{found}{after}"


def tuned_report(domain: str, role: str) -> str:
    """The packaged report template with a line saying whose collection it is and who writes."""
    task, body = load_prompt("report").split("\n", 1)
    head = (f"The documents behind this knowledge graph hold {_literal(domain)}. Write the "
            f"briefing as {_literal(role)} would, for readers who work with such documents.")
    return f"{task}\n{head}\n{body}"


async def _tune(client: ChatClient, units: list[TextUnit], n_examples: int, claims: bool,
                max_types: int) -> TunedPrompts:
    passages = "\n\n".join(f"----- Passage {i} -----\n{excerpt(u.text, PASSAGE_TOKENS)}"
                           for i, u in enumerate(units, 1))
    prompt = client.prompts.render("tune", samples=passages, max_types=max_types)
    found = await client.json("tune", _user(prompt), TuneOut)
    domain, role = _clean(found.domain), _clean(found.role)
    types = entity_types_of(found.entity_types, max_types)
    if not domain or not role or not types:
        raise ConfigError("the model proposed no usable domain, role or entity types; "
                          "try again with more --sample units or another model")
    switch = CLAIMS_ON if claims else CLAIMS_OFF
    excerpts = [excerpt(u.text, EXAMPLE_TOKENS) for u in units]
    shown = excerpts[:n_examples]
    # The packaged extraction template, which the tuned one is built from.
    replies = await asyncio.gather(*(client.json("extract", _user(DEFAULT_PROMPTS.render(
        "extract", entity_types=", ".join(types), claims_switch=switch, text=text)),
        ExtractionOut) for text in shown))
    examples = [(text, ex) for text, out in zip(shown, replies, strict=True)
                if (ex := _example(out, types, claims)) is not None]
    templates = {"extract": tuned_extract(domain, role, examples),
                 "report": tuned_report(domain, role)}
    for name, text in templates.items():
        check_template(name, text, f"tuned {file_name(name)}")
    return TunedPrompts(domain, role, types, len(units), len(examples), templates,
                        client.usage())


def tune_prompts(ws: Workspace, *, sample: int = 8, examples: int = 2,
                 max_types: int = MAX_TYPES) -> TunedPrompts:
    """Tuned templates for the workspace's corpus, from `sample` units and `examples` example
    extractions, by the configured endpoint (ConfigError without one, or without text)."""
    if not ws.settings.llm.enabled:
        raise ConfigError("prompt tuning needs an LLM endpoint (a model proposes the domain, "
                          "entity types and examples): set [llm] base_url in canopy.toml or "
                          "CANOPY_LLM_BASE_URL")
    _, units = corpus_units(ws)
    if not units:
        raise ConfigError(f"no text to tune on in {ws.docs_dir}")
    chosen = spread_sample(units, sample)
    client = ChatClient(ws.settings.llm, backoff_base=ws.settings.llm.backoff_s,
                        prompts=load_prompt_dir(ws.settings.prompts.dir))

    async def run() -> TunedPrompts:
        try:
            return await _tune(client, chosen, examples, ws.settings.extract.claims, max_types)
        finally:
            await client.aclose()

    return asyncio.run(run())


def write_tuned(tuned: TunedPrompts, out: Path, *, force: bool = False) -> list[Path]:
    """Write the tuned templates into `out`; existing ones are replaced only with `force`."""
    paths = {name: out / file_name(name) for name in tuned.templates}
    if not force:
        for path in paths.values():
            if path.exists():
                raise ConfigError(f"{path} exists; pass --force to replace it")
    out.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        path.write_text(tuned.templates[name], encoding="utf-8")
    return list(paths.values())
