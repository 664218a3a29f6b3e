"""`canopy publish`: publish the committed generation of an index to a URI by hand."""

from __future__ import annotations

from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR

__all__ = ["publish"]


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--to", "uri", metavar="URI",
              help="A local folder or s3://bucket/prefix (default: [publish] uri).")
def publish(docs: Path, index_dir: Path | None, config: Path | None, uri: str | None) -> None:
    """Publish the committed generation of DOCS's index for `canopy serve --index-uri` replicas.

    Uploads only the files the URI lacks, writes the generation's manifest last, and removes
    generations superseded more than [publish] grace_s ago. `canopy index` and `canopy watch`
    do the same after every commit when [publish] uri (or their --publish) is set.

    \b
    Examples:
      canopy publish team-docs --to /srv/canopy/team-docs
      AWS_ENDPOINT_URL=http://minio:9000 canopy publish team-docs --to s3://canopy/team-docs
    """
    from canopy.server.runtime import open_workspace
    from canopy.server.wings.publish.publishing import describe_publish, publish_index

    ws = open_workspace(docs, index_dir, config)
    target = uri or ws.settings.publish.uri
    result = publish_index(ws, target)
    click.echo(describe_publish(result, target or ""))
