"""`canopy watch`: keep an index current as files change."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import click

from server.cli.common import CONFIG, DOCS, INDEX_DIR, describe_batch

__all__ = ["watch"]


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--debounce", type=float, default=1.0, show_default=True,
              help="Seconds of quiet before a batch of changes is applied.")
def watch(docs: Path, index_dir: Path | None, config: Path | None, debounce: float) -> None:
    """Index DOCS, then apply every change (add, edit, rename, delete, policy edit) as it happens.

    \b
    Example:
      canopy watch ~/team-docs --index-dir ~/.cache/canopy/team-docs
    """
    from indexer.watcher import Watcher
    from server.runtime import build_index, open_workspace

    ws = open_workspace(docs, index_dir, config)
    logging.getLogger("canopy").setLevel(logging.INFO)

    def apply() -> Any:
        # Settings (and so the ACL policy) are re-read each batch: canopy.toml edits apply too.
        return build_index(open_workspace(docs, index_dir, config))

    first = apply()
    click.echo(f"Indexed {first.stats['documents']} documents (generation {first.generation}); "
               f"watching {docs} - Ctrl-C to stop", err=True)
    watcher = Watcher(ws.docs_dir, ws.index_dir, apply, debounce=debounce,
                      on_applied=lambda paths, r: click.echo(describe_batch(paths, r),
                                                             err=True)).start()
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
