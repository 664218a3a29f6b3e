"""`canopy init`: write a commented canopy.toml with every setting and its default."""

from __future__ import annotations

from pathlib import Path

import click

from canopy.server.cli.common import DOCS

__all__ = ["init"]


@click.command()
@DOCS
@click.option("--force", is_flag=True, help="Replace an existing canopy.toml.")
def init(docs: Path, force: bool) -> None:
    """Write DOCS/canopy.toml: every section and setting with its default and what it does, all
    commented out, so that the file changes nothing until you uncomment a line.

    \b
    Examples:
      canopy init ~/docs
      canopy init ~/docs --force      # start again from the defaults
    """
    from canopy.settings import CONFIG_FILENAME, commented_toml, load_settings

    path = docs / CONFIG_FILENAME
    if path.exists() and not force:
        raise click.ClickException(f"{path} exists; pass --force to replace it with the defaults")
    path.write_text(commented_toml(), encoding="utf-8")
    load_settings(docs)  # the file as written must load (it is all comments)
    click.echo(f"Wrote {path}: every setting, commented out. Uncomment a [section] and the "
               "lines under it to change them; `canopy index` reads it.")
