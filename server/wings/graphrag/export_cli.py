"""`canopy export`: write the index of a folder out as tables or a graph, as one caller sees it
(canopy.server.wings.graphrag.export)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR, check_principal

__all__ = ["export"]

# canopy.server.wings.graphrag.export.FORMATS, without importing pyarrow here
FORMATS = ("parquet", "csv", "graphml")


@click.command()
@DOCS
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default="parquet",
              show_default=True,
              help="parquet or csv: GraphRAG-shaped tables (entities, relationships, "
                   "communities, community_reports, covariates, text_units, documents); "
                   "graphml: the entity graph with each node's community per level.")
@click.option("--principal", envvar="CANOPY_PRINCIPAL", default=None,
              help="Whose permissions apply (a principal of the config's [acl] policy): the "
                   "export holds only what they may read.")
@click.option("--overwrite", is_flag=True,
              help="Export into a folder that holds an earlier export, replacing its files.")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
@INDEX_DIR
@CONFIG
def export(docs: Path, out_dir: Path, fmt: str, principal: str | None, overwrite: bool,
           as_json: bool, index_dir: Path | None, config: Path | None) -> None:
    """Export the index of DOCS into OUT_DIR, with provenance (text unit and document ids).

    Under an [acl] policy the export is what --principal may read, as the MCP tools serve it:
    nothing derived from a document they cannot read, not even a name or a count.

    \b
    Examples:
      canopy export examples/docs /tmp/canopy-tables
      canopy export examples/docs /tmp/canopy-csv --format csv
      canopy export examples/docs /tmp/canopy-graph -f graphml
      canopy export examples/multi-tenant/docs /tmp/bob --principal bob
    """
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService
    from canopy.server.wings.graphrag.export import export_tables, prepare_out_dir

    ws = open_workspace(docs, index_dir, config)
    check_principal(ws.settings.acl, principal)
    service = CanopyService(ws, config=config)
    try:
        prepare_out_dir(out_dir, ws.docs_dir, overwrite=overwrite)
        with service.context(principal) as ctx:
            result = asyncio.run(export_tables(ctx, out_dir, fmt))
    finally:
        service.close()
    if as_json:
        click.echo(result.model_dump_json(indent=2))
        return
    who = f" as {result.principal}" if result.principal else ""
    click.echo(f"Exported generation {result.generation}{who} to {out_dir} ({fmt}):")
    click.echo("  " + ", ".join(f"{name} {n}" for name, n in result.rows.items()))
    click.echo("  files: " + ", ".join(sorted(result.files)) + ", manifest.json")
