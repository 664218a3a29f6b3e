"""Writing collected tables as parquet, CSV or GraphML, and the folder they go to.

- parquet: one file per table, with the types of `export.columns` (lists stay lists);
- csv: one file per table, UTF-8 with a header; list and struct columns as JSON text, and
  fields that hold newlines quoted (pandas reads them as they are; pyarrow needs
  `ParseOptions(newlines_in_values=True)`);
- graphml: `graph.graphml`, the entity graph (nodes: entities; edges: relationships) for
  networkx, Gephi or yEd, with each node's community per level; the tables themselves are
  what parquet and CSV are for.

Every file is written beside its final name and moved into place, so a reader never sees half a
table; `manifest.json` (written last) says what the folder holds.
"""

from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from canopy.errors import InvalidArgument
from canopy.server.wings.graphrag.export.collect import ExportTables
from canopy.server.wings.graphrag.export.columns import TABLES

__all__ = ["FORMATS", "GRAPHML", "MANIFEST", "prepare_out_dir", "write_tables"]

FORMATS = ("parquet", "csv", "graphml")
GRAPHML = "graph.graphml"
MANIFEST = "manifest.json"
_OURS = {MANIFEST, GRAPHML, *(f"{t}.{ext}" for t in TABLES for ext in ("parquet", "csv"))}


def prepare_out_dir(out_dir: Path, docs_dir: Path, *, overwrite: bool) -> None:
    """Create `out_dir`, or make room in it. Refused: a folder inside the documents folder
    (the next index run would index the export, under that folder's labels), a file, and a
    folder that is not empty unless `overwrite`, which removes the files of any earlier export
    there (of any format: no earlier caller's table is left beside this one) and nothing else."""
    out, docs = out_dir.resolve(), docs_dir.resolve()
    if out == docs or docs in out.parents:
        raise InvalidArgument(f"{out_dir} is inside the documents folder {docs_dir}: the next "
                              "`canopy index` would index the export; choose a folder outside it")
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"{out_dir} is a file: name a folder to export into")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise InvalidArgument(f"{out_dir} is not empty: choose a new folder, or pass "
                                  "--overwrite to replace the export in it")
        for name in _OURS:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def write_tables(tables: ExportTables, out_dir: Path, fmt: str) -> dict[str, int]:
    """Write `tables` in `fmt`; returns each written file's name with its row count (GraphML:
    its nodes and edges)."""
    if fmt == "graphml":
        _atomic(out_dir / GRAPHML, lambda path: _graphml(tables).write(
            path, encoding="utf-8", xml_declaration=True))
        return {GRAPHML: tables.count("entities") + tables.count("relationships")}
    written = {}
    for name, schema in TABLES.items():
        rows = tables.rows.get(name, [])
        path = out_dir / f"{name}.{fmt}"
        if fmt == "parquet":
            _atomic(path, partial(pq.write_table, pa.Table.from_pylist(rows, schema=schema)))
        elif fmt == "csv":
            _atomic(path, partial(pa_csv.write_csv, _flat(rows, schema)))
        else:
            raise InvalidArgument(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")
        written[path.name] = len(rows)
    return written


def _atomic(path: Path, write: Callable[[str], Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(str(tmp))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _nested(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_struct(t))


def _flat(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """The table with list and struct columns as JSON text (CSV has no lists)."""
    nested = {f.name for f in schema if _nested(f.type)}
    flat = pa.schema([pa.field(f.name, pa.string()) if f.name in nested else f for f in schema])
    return pa.Table.from_pylist(
        [{k: json.dumps(v, ensure_ascii=False) if k in nested else v for k, v in r.items()}
         for r in rows], schema=flat)


# ---- GraphML ----------------------------------------------------------------------------------

_NS = "http://graphml.graphdrawing.org/xmlns"
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_NODE = (("title", "string"), ("type", "string"), ("description", "string"), ("degree", "int"),
         ("frequency", "int"), ("text_unit_ids", "string"), ("document_ids", "string"))
_EDGE = (("description", "string"), ("weight", "double"), ("combined_degree", "int"),
         ("text_unit_ids", "string"), ("document_ids", "string"))


def _text(value: Any) -> str:
    if isinstance(value, list):
        value = json.dumps(value, ensure_ascii=False)  # GraphML has no lists: JSON text
    return _NOT_XML.sub("\ufffd", str(value))


def _community_by_level(tables: ExportTables) -> tuple[list[int], dict[str, dict[int, int]]]:
    """The exported levels, and each entity's community per level. Read as design §3.5 reads a
    level: an entity whose community at a shallower level has no children keeps it below."""
    deepest: dict[str, dict[int, int]] = {}
    for c in tables.rows.get("communities", []):
        for e in c["entity_ids"]:
            deepest.setdefault(e, {})[c["level"]] = c["community"]
    levels = sorted({c["level"] for c in tables.rows.get("communities", [])})
    out: dict[str, dict[int, int]] = {}
    for e, found in deepest.items():
        current: int | None = None
        for level in levels:
            current = found.get(level, current)
            if current is not None:
                out.setdefault(e, {})[level] = current
    return levels, out


def _graphml(tables: ExportTables) -> ET.ElementTree:
    root = ET.Element("graphml", {"xmlns": _NS})
    levels, membership = _community_by_level(tables)
    node_keys = [*_NODE, *((f"community_level_{lv}", "int") for lv in levels)]
    for scope, keys in (("node", node_keys), ("edge", _EDGE)):
        for name, kind in keys:
            ET.SubElement(root, "key", {"id": f"{scope[0]}_{name}", "for": scope,
                                        "attr.name": name, "attr.type": kind})
    graph = ET.SubElement(root, "graph", {"id": "canopy", "edgedefault": "undirected"})
    for e in tables.rows.get("entities", []):
        node = ET.SubElement(graph, "node", {"id": e["id"]})
        values = {name: e[name] for name, _ in _NODE}
        values |= {f"community_level_{lv}": c for lv, c in membership.get(e["id"], {}).items()}
        for name, value in values.items():
            ET.SubElement(node, "data", {"key": f"n_{name}"}).text = _text(value)
    for r in tables.rows.get("relationships", []):
        edge = ET.SubElement(graph, "edge", {"id": r["id"], "source": r["source_id"],
                                             "target": r["target_id"]})
        for name, _ in _EDGE:
            ET.SubElement(edge, "data", {"key": f"e_{name}"}).text = _text(r[name])
    ET.indent(root, space=" ")
    return ET.ElementTree(root)
