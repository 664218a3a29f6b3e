"""The JSON schemas a `tools/list` publishes, kept small: hosts that forward them to the model pay
for every token on every turn.

pydantic's schema of a result model repeats each nested model under `$defs` in every tool, gives
every property a `title` that restates its name and spells each optional field as an `anyOf`
with null. What a tool publishes instead (`lean_output`): the top-level fields with their JSON
types and, where asked, their descriptions and the nested objects' fields by name and type (the
five search tools share one result model, whose fields are described once, on `search`). It is
still a JSON Schema that the full result validates against (no `additionalProperties`, no
`required`), so MCP clients that check `structuredContent` against the declared schema accept
every result. The full model schemas stay in the REST API's OpenAPI document, which is read
once, not every turn.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["lean_input", "lean_output"]

JsonSchema = dict[str, Any]


def lean_output(model: type[BaseModel], *, described: bool, nested: bool = False) -> JsonSchema:
    """`model`'s schema as published in a tool listing: its fields and their types, with their
    descriptions when `described` and the fields of nested objects when `nested`."""
    full = model.model_json_schema()
    return _lean(full, full.get("$defs", {}), depth=0, deepest=2 if nested else 1,
                 described=described)


def lean_input(schema: JsonSchema) -> JsonSchema:
    """A tool's argument schema without the `title` pydantic gives the model and each property
    (a property's name is its title); bounds, defaults and descriptions stay: they are what the
    model reads to call the tool right."""
    out = {k: v for k, v in schema.items() if k != "title"}
    if "properties" in out:
        out["properties"] = {name: _plain_optional({k: v for k, v in prop.items()
                                                    if k != "title"})
                             for name, prop in out["properties"].items()}
    return out


def _plain_optional(prop: JsonSchema) -> JsonSchema:
    """pydantic's `str | None` without bounds (`anyOf` of two bare types) as one type list;
    an alternative with bounds stays as pydantic wrote it."""
    alternatives = prop.get("anyOf")
    if not alternatives or any(set(a) != {"type"} for a in alternatives):
        return prop
    return {"type": [a["type"] for a in alternatives],
            **{k: v for k, v in prop.items() if k != "anyOf"}}


def _lean(node: JsonSchema, defs: dict[str, JsonSchema], *, depth: int, deepest: int,
          described: bool) -> JsonSchema:
    description = node.get("description")
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in node:  # pydantic's `X | None`: one type plus null
        alternatives = [a for a in node["anyOf"] if a.get("type") != "null"]
        if len(alternatives) != 1:
            return {"description": description} if described and description else {}
        out = _lean(alternatives[0], defs, depth=depth, deepest=deepest, described=False)
        if "type" in out and len(alternatives) < len(node["anyOf"]):
            out["type"] = [out["type"], "null"]
    else:
        out = {"type": node["type"]} if "type" in node else {}
        if node.get("type") == "object" and "properties" in node and depth < deepest:
            out["properties"] = {
                name: _lean(prop, defs, depth=depth + 1, deepest=deepest,
                            described=described and depth == 0)
                for name, prop in node["properties"].items()}
        elif node.get("type") == "array" and "items" in node and depth < deepest:
            items = _lean(node["items"], defs, depth=depth, deepest=deepest, described=False)
            if items.get("properties") or items.get("type") != "object":
                out["items"] = items
    if described and description and depth > 0:
        out["description"] = description
    return out
