"""Structured output: the JSON schema sent for a pydantic model, the response_format of each
JSON mode, the schema instruction for endpoints without schema support, and tolerant parsing
and validation of model answers (code fences, prose around one object)."""

from __future__ import annotations

import functools
import json
import re
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from canopy.llm.request import COMPACT

__all__ = [
    "JSON_MODES",
    "explain",
    "format_json",
    "json_schema_for",
    "parse_json",
    "schema_json",
    "with_schema_instruction",
]

M = TypeVar("M", bound=BaseModel)

# JSON modes from most to least constrained; the client moves down the list when rejected.
# json_object_schema is JSON mode with the schema beside it (`{"type": "json_object", "schema":
# ...}`): what llama-cpp-python's server (and Anyscale/Together-style endpoints) take for
# schema-constrained output where OpenAI's json_schema type is refused.
JSON_MODES = ("json_schema", "json_object_schema", "json_object", "prompt")


@functools.lru_cache(maxsize=64)
def json_schema_for(model: type[BaseModel]) -> dict[str, Any]:
    """The model's JSON schema in the shape strict structured-output decoders accept:
    references inlined, every property required, no additional properties, no defaults/titles."""
    raw = model.model_json_schema()
    defs = raw.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, list):
            return [walk(n) for n in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            target = walk(defs[node["$ref"].rsplit("/", 1)[-1]])
            extra = {k: walk(v) for k, v in node.items() if k not in ("$ref", "title", "default")}
            return {**target, **extra}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("title", "default"):
                continue
            if key == "properties":
                out[key] = {name: walk(sub) for name, sub in value.items()}
            else:
                out[key] = walk(value)
        if out.get("type") == "object" and "properties" in out:
            out["required"] = list(out["properties"])
            out["additionalProperties"] = False
        return out

    return walk(raw)


_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n?(.*?)\n?```\s*$", re.DOTALL)


def parse_json(content: str, schema: type[M]) -> M:
    """Validate a reply against `schema`, tolerating code fences and text around one object."""
    try:
        return schema.model_validate_json(content)  # pydantic-core's parser: the common case
    except ValidationError:
        pass  # fenced, wrapped in prose, or invalid: the tolerant path says which
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1).strip()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        start, end = text.find("{"), text.rfind("}")
        if start < 0 or end <= start:
            raise
        data = json.loads(text[start : end + 1])
    return schema.model_validate(data)


def explain(err: Exception) -> str:
    """Why a reply failed `parse_json`, for the repair turn and error messages."""
    if isinstance(err, ValidationError):
        parts = [
            f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in err.errors()[:10]
        ]
        return "the JSON does not match the schema: " + "; ".join(parts)
    return f"the reply is not valid JSON ({err})"


def with_schema_instruction(messages: list[dict], schema_json: str) -> list[dict]:
    """`messages` with an instruction to answer in JSON matching the schema, in the system
    message (for endpoints that take no json_schema response_format)."""
    note = (
        "Reply with a single JSON object, and nothing else, that conforms to this JSON schema:\n"
        + schema_json
    )
    if messages and messages[0].get("role") == "system":
        first = {**messages[0], "content": f"{messages[0]['content']}\n\n{note}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]


@functools.lru_cache(maxsize=64)
def schema_json(model: type[BaseModel]) -> str:
    return json.dumps(json_schema_for(model), ensure_ascii=False)


@functools.lru_cache(maxsize=256)
def format_json(mode: str, task: str, model: type[BaseModel]) -> str | None:
    """The response_format of a JSON request, serialized once per mode, task and schema."""
    if mode == "json_schema":
        spec = json_schema_for(model)
        fmt: dict[str, Any] = {
            "type": "json_schema",
            "json_schema": {"name": task, "schema": spec, "strict": False},
        }
    elif mode == "json_object_schema":
        fmt = {"type": "json_object", "schema": json_schema_for(model)}
    elif mode == "json_object":
        fmt = {"type": "json_object"}
    else:
        return None
    return json.dumps(fmt, sort_keys=True, ensure_ascii=False, separators=COMPACT)
