"""`canopy token`: the static bearer-token file for `canopy serve --http` (small teams).

Only a SHA-256 of each token is stored (see canopy.acl.bearer_tokens); the token itself is printed
once, by `add`. A running server re-reads the file when it changes, so `revoke` applies at once.
"""

from __future__ import annotations

from pathlib import Path

import click

__all__ = ["token"]

TOKEN_FILE = click.argument("file", type=click.Path(dir_okay=False, path_type=Path))


@click.group()
def token() -> None:
    """Manage the bearer tokens of HTTP callers (a file of hashed tokens -> principals).

    \b
    Examples:
      canopy token add ~/canopy/tokens.jsonl alice    # prints alice's new token, once
      canopy token list ~/canopy/tokens.jsonl
      canopy token revoke ~/canopy/tokens.jsonl alice
      canopy serve team-docs --http --host 0.0.0.0 --tokens ~/canopy/tokens.jsonl
    """


@token.command("add")
@TOKEN_FILE
@click.argument("principal")
def add(file: Path, principal: str) -> None:
    """Create a token for PRINCIPAL (a name in the [acl] principals) and print it once.

    The file is created if missing (mode 0600) and keeps only the token's hash: store the printed
    token now, it cannot be shown again. A principal may hold several tokens.
    """
    from canopy.acl.bearer_tokens import add_token

    click.echo(add_token(file, principal))
    click.echo(f"Token for {principal} added to {file}. It is shown only this once; send it as "
               "'Authorization: Bearer <token>'.", err=True)


@token.command("list")
@TOKEN_FILE
def list_tokens(file: Path) -> None:
    """List the tokens in FILE: principal, token id (start of its hash) and creation time."""
    from canopy.acl.bearer_tokens import read_tokens

    records = read_tokens(file)
    if not records:
        click.echo(f"No tokens in {file}.", err=True)
    for r in records:
        click.echo(f"{r.principal}\t{r.id}\t{r.created}")


@token.command("revoke")
@TOKEN_FILE
@click.argument("principal")
@click.option("--id", "token_id",
              help="Revoke only the token whose id (from `list`) starts with this.")
def revoke(file: Path, principal: str, token_id: str | None) -> None:
    """Revoke every token of PRINCIPAL (or one, with --id). Running servers refuse it at once."""
    from canopy.acl.bearer_tokens import revoke_tokens

    gone = revoke_tokens(file, principal, token_id)
    if not gone:
        with_id = f" with id {token_id}" if token_id else ""
        raise click.ClickException(f"no token of {principal!r}{with_id} in {file}")
    click.echo(f"Revoked {len(gone)} token(s) of {principal}: {', '.join(r.id for r in gone)}")
