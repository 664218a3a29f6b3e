"""`canopy watch`: keep an index current as files change."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR, describe_batch

__all__ = ["watch"]


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--debounce", type=float, default=1.0, show_default=True,
              help="Seconds of quiet before a batch of changes is applied.")
@click.option("--publish", "publish_uri", metavar="URI",
              help="Publish every committed generation there for replicas (a folder or "
                   "s3://bucket/prefix; default: [publish] uri, if set).")
def watch(docs: Path, index_dir: Path | None, config: Path | None, debounce: float,
          publish_uri: str | None) -> None:
    """Index DOCS, then apply every change (add, edit, rename, delete, policy edit) as it happens.

    \b
    Example:
      canopy watch ~/team-docs --index-dir ~/.cache/canopy/team-docs
    """
    from canopy.server.runtime import open_workspace, workspace_watcher

    ws = open_workspace(docs, index_dir, config)
    target = publish_uri or ws.settings.publish.uri
    if target:
        from canopy.server.wings import wing_module

        # a missing extra or bucket: one line now, not per batch
        publishing = wing_module("publish", "publishing", wanted_by="--publish / [publish] uri")
        publishing.check_publish_target(ws, target)
    logging.getLogger("canopy").setLevel(logging.INFO)
    # Settings (and so the ACL policy) are re-read each batch: canopy.toml edits apply too.
    watcher = workspace_watcher(docs, index_dir, config, debounce=debounce,
                                on_applied=lambda paths, r: click.echo(describe_batch(paths, r),
                                                                       err=True),
                                publish=publish_uri)
    watcher.observe()  # before the first update: a change made while it runs is applied next
    first = watcher.apply()
    click.echo(f"Indexed {first.stats['documents']} documents (generation {first.generation}); "
               f"watching {docs} - Ctrl-C to stop", err=True)
    watcher.start()
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
