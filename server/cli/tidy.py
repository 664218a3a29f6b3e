"""`canopy tidy`: tidy the search tables now (`canopy index` starts it in the background)."""

from __future__ import annotations

from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR

__all__ = ["tidy"]


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--if-idle", is_flag=True,
              help="Do nothing when another writer holds the index (what the background tidy "
                   "started by `canopy index` does); otherwise wait for it.")
def tidy(docs: Path, index_dir: Path | None, config: Path | None, if_idle: bool) -> None:
    """Fold new rows into the search indexes and, once per [storage] keep_versions_s, rewrite
    what stores erased rows and prune old versions. A writer that arrives meanwhile goes first:
    the tidy stops between steps, keeping what it finished.

    \b
    Example:
      canopy tidy ~/docs
    """
    from canopy.server.runtime import maintain_index, open_workspace

    ws = open_workspace(docs, index_dir, config)
    done = maintain_index(ws, wait=not if_idle)
    if done is None:
        click.echo("canopy tidy: another writer holds the index; it will tidy it", err=True)
    elif not done:
        click.echo("canopy tidy: gave way to a waiting writer; the next tidy finishes the work",
                   err=True)
    else:
        click.echo(f"canopy tidy: search tables of {ws.index_dir} tidy", err=True)
