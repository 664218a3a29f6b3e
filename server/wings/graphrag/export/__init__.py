"""Exporting an index as one caller sees it (`canopy export`, `Index.export`): entities,
relationships, claims (covariates), communities, community reports, text units and documents,
each with its provenance (text unit ids and document ids), as parquet or CSV tables shaped like
Microsoft GraphRAG's outputs, or as a GraphML graph.

An export is served like a query (design §2): it reads through the caller's reader, so a
restricted caller's export holds only what they can read: the documents and units they may read,
entities and relationships as their views (names, descriptions, weights and provenance from
their units only), the communities with a member they see and the reports they are served
(canonical or re-derived from what they see), and counts over those rows alone. With no [acl]
policy everyone reads everything, and the export is the whole index.

The same thing at two depths as canopy.store.export: that module takes the generation out at the
store's depth, every row and no caller (for tests and benchmarks); this package exports what a
caller is served.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field

from canopy.server.context import QueryContext
from canopy.server.wings.graphrag.export.collect import ExportTables, collect_tables
from canopy.server.wings.graphrag.export.columns import TABLES
from canopy.server.wings.graphrag.export.write import (
    FORMATS,
    MANIFEST,
    prepare_out_dir,
    write_tables,
)

__all__ = ["FORMATS", "ExportResult", "ExportTables", "collect_tables", "export_tables",
           "prepare_out_dir"]


class ExportResult(BaseModel):
    """What an export wrote (also written to the folder as manifest.json)."""

    format: str = Field(description="parquet | csv | graphml")
    out_dir: str
    generation: int = Field(description="The committed index generation exported")
    principal: str | None = Field(description="Whose permissions applied (None: no policy)")
    files: dict[str, int] = Field(description="File name -> rows (GraphML: nodes plus edges)")
    rows: dict[str, int] = Field(description="Rows per table written (GraphML: entities are its "
                                 "nodes, relationships its edges)")


async def export_tables(ctx: QueryContext, out_dir: Path, fmt: str) -> ExportResult:
    """Collect what `ctx`'s caller is served and write it to `out_dir` (made ready by
    `prepare_out_dir`) in `fmt`."""
    tables = await collect_tables(ctx)
    files = write_tables(tables, out_dir, fmt)
    written = ("entities", "relationships") if fmt == "graphml" else TABLES  # nodes, edges
    who = ctx.caller.principal
    result = ExportResult(format=fmt, out_dir=str(out_dir), generation=ctx.reader.generation,
                          principal=None if who.unrestricted else who.name, files=files,
                          rows={t: tables.count(t) for t in written})
    (out_dir / MANIFEST).write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return result
