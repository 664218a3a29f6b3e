"""`canopy import-graphrag`: a new index of a folder from a Microsoft GraphRAG output folder
(canopy.server.wings.graphrag.ingest)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR, duration, tqdm_progress

__all__ = ["import_graphrag"]


@click.command("import-graphrag")
@click.argument("output_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="Print what was imported as JSON.")
def import_graphrag(output_dir: Path, docs: Path, index_dir: Path | None, config: Path | None,
                    as_json: bool) -> None:
    """Build the index of DOCS from GraphRAG's OUTPUT_DIR, then keep it with `canopy index`.

    OUTPUT_DIR is a GraphRAG project's output folder (or the project root): its parquet tables
    documents, text_units, entities, relationships, communities and community_reports, and
    covariates (claims) when GraphRAG extracted them. DOCS holds the source documents GraphRAG
    indexed (its input folder, or the folder it was copied from): Canopy chunks them itself and
    lays GraphRAG's units, entities, relationships, communities, reports and claims onto its own
    units. Documents or passages GraphRAG did not have are extracted by the configured provider,
    as `canopy index` would. DOCS must have no index yet.

    \b
    Examples:
      canopy import-graphrag ~/ragtest/output ~/ragtest/input
      canopy import-graphrag ~/ragtest ~/docs --index-dir /tmp/docs-index
    """
    from canopy.server.runtime import open_workspace
    from canopy.server.wings.graphrag.import_index import import_graphrag_index

    ws = open_workspace(docs, index_dir, config)
    result = import_graphrag_index(ws, output_dir, progress=tqdm_progress)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    s, r = result.index.stats, result.replay
    click.echo(f"Imported {result.source} into {ws.index_dir} (generation "
               f"{result.index.generation}, {duration(result.index.elapsed_s)}):")
    click.echo(f"  documents: {result.documents_matched} matched, {result.documents_new} not in "
               f"GraphRAG's output, {len(result.documents_left_out)} of GraphRAG's not in {docs}")
    click.echo(f"  text units: GraphRAG {result.graphrag_units} ({result.graphrag_units_located} "
               f"found in the documents, {result.graphrag_units_identical} identical to a Canopy "
               f"unit); Canopy {result.canopy_units} ({r.units_replayed} from GraphRAG's "
               f"extractions, {r.units_extracted} extracted by the provider)")
    click.echo(f"  graph: {s.get('entities', 0)} entities, {s.get('relationships', 0)} "
               f"relationships, {s.get('communities', 0)} communities "
               f"({result.communities_kept} of GraphRAG's {result.communities_given} as they "
               f"were), {s.get('reports', 0)} reports ({r.reports_imported} GraphRAG's, "
               f"{r.reports_written} written by the provider)")
    if result.graphrag_claims:
        click.echo(f"  claims: {s.get('claims', 0)} ({result.claims_placed} of GraphRAG's "
                   f"{result.graphrag_claims} placed, {result.claims_left_out} left out: unit not "
                   "found or subject not an entity)")
    if result.documents_left_out:
        shown = ", ".join(result.documents_left_out[:5])
        more = len(result.documents_left_out) - 5
        click.echo(f"  left out (no such file in {docs}): {shown}"
                   + (f" and {more} more" if more > 0 else ""))
