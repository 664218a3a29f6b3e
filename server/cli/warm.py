"""`canopy warm`: pre-build the per-caller views (design §2, "fallback views") of the principals
in the index's policy, so their first queries do not wait for the provider.

Views are built lazily on first use anyway; warming moves that cost (one report call per view of
a community, one summary call per entity or relationship view with several visible descriptions)
to a moment you choose, e.g. right after `canopy index`. Views are cached in the index folder by
content, so warming twice, or warming principals who see the same documents, costs nothing more.

The same thing at two depths: this is the command; canopy.server.engines.warm is the engine call
it runs for each principal (`warm_views`), which builds one caller's views.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR

__all__ = ["warm"]

KINDS = ("report", "entity", "relationship")


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--principal", "principals", multiple=True,
              help="A principal of the [acl] policy whose views to build (repeatable).")
@click.option("--all-principals", is_flag=True,
              help="Every principal of the policy (the default when no --principal is given).")
@click.option("--reports-only", is_flag=True,
              help="Build report views only; entity and relationship views are then built as "
                   "those reports need them and on first use.")
@click.option("--prune", is_flag=True,
              help="Also drop cached views of artifacts no longer indexed.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def warm(docs: Path, index_dir: Path | None, config: Path | None, principals: tuple[str, ...],
         all_principals: bool, reports_only: bool, prune: bool, as_json: bool) -> None:
    """Pre-build the report (and entity) views of the principals of DOCS's policy.

    \b
    Examples:
      canopy warm team-docs --all-principals
      canopy warm team-docs --principal alice --principal bob --reports-only
    """
    from canopy.server.engines.warm import warm_views
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService

    ws = open_workspace(docs, index_dir, config)
    policy = ws.policy
    if principals and all_principals:
        raise click.UsageError("pass --principal NAME ... or --all-principals, not both.")
    if principals:
        names: list[str | None] = list(principals)
    elif policy.enabled:
        names = [*sorted(policy.settings.principals)]
    else:
        names = [None]  # no policy: the local user (views only during a revocation generation)
    unknown = [n for n in names if n is not None and n not in policy.settings.principals]
    if unknown:
        raise click.UsageError(f"not a principal of the [acl] policy: {', '.join(unknown)}")
    kinds = KINDS[:1] if reports_only else KINDS
    service = CanopyService(ws)
    rows = []
    try:
        for name in names:
            with service.context(name) as ctx:
                figures = asyncio.run(warm_views(ctx, kinds))
                documents = ctx.reader.inventory.count_readable("documents")
            rows.append({"principal": name or "(local user)", "documents": documents, **figures})
        pruned = service.store.views_prune() if prune else None
    finally:
        service.close()
    if as_json:
        click.echo(json.dumps({"principals": rows, "pruned": pruned}, indent=2))
        return
    for r in rows:
        calls = sum(u["calls"] for u in r["usage"].values())
        tokens = sum(u["prompt_tokens"] + u["completion_tokens"] for u in r["usage"].values())
        built = sum(r["built"].values())
        needed = sum(r[f"{k}_views"] for k in kinds)
        views = ", ".join(f"{r[f'{k}_views']} {k}" for k in kinds)
        click.echo(f"{r['principal']}: {r['documents']} documents; views {views}: "
                   f"{built} built, {needed - min(built, needed)} cached; provider calls {calls}"
                   + (f" ({tokens} tokens)" if tokens else "")
                   + (" — " + ", ".join(f"{t} {u['calls']}" for t, u in r["usage"].items())
                      if calls else "")
                   + f"; {r['seconds']:.1f}s")
    offline = sum(r.get("offline", 0) for r in rows)
    if offline:
        click.echo(f"warning: the LLM endpoint was unavailable: {offline} views were written "
                   "offline and not cached; run `canopy warm` again when it is back.", err=True)
    if pruned is not None:
        click.echo(f"pruned {pruned} cached views of artifacts no longer indexed")
