"""`canopy index` and `canopy status`: build or update the index of a folder, and show what it
holds."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING

import click

from canopy.server.cli.build_plan import PlanLines, calls_line
from canopy.server.cli.common import (
    CONFIG,
    DOCS,
    INDEX_DIR,
    duration,
    index_command,
    tqdm_progress,
)

if TYPE_CHECKING:
    from canopy.server.runtime import Workspace

__all__ = ["index", "status"]


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--full", is_flag=True,
              help="Rebuild from scratch instead of updating incrementally. A damaged index is "
                   "moved aside into INDEX_DIR/damaged-<time>/ first.")
@click.option("--json", "as_json", is_flag=True, help="Print the run summary as JSON.")
@click.option("--estimate", is_flag=True,
              help="Build nothing: run the real pipeline on a sample of the text units in a "
                   "throwaway index and print the expected calls, tokens, cost and time of a "
                   "full build, by task (the sample's own calls are real).")
@click.option("--sample", type=click.IntRange(1, 10_000), default=40, show_default=True,
              help="Text units the estimate builds for real.")
@click.option("--publish", "publish_uri", metavar="URI",
              help="Then publish the committed generation there for replicas (a folder or "
                   "s3://bucket/prefix; default: [publish] uri, if set).")
@click.option("--ray", "ray_address", metavar="ADDRESS",
              help="Fan the LLM and embedding requests (or, with the builtin provider, its "
                   "extraction and embedding) out over a Ray cluster: auto (the one `ray start` "
                   "runs here), host:port, ray://host:10001, or local (start one in this "
                   "process). Needs the [ray] extra; default: [distributed] ray_address.")
def index(docs: Path, index_dir: Path | None, config: Path | None, full: bool,
          as_json: bool, estimate: bool, sample: int, publish_uri: str | None,
          ray_address: str | None) -> None:
    """Build or update the GraphRAG index of DOCS.

    \b
    Examples:
      canopy index examples/docs
      canopy index ~/papers --index-dir /tmp/papers-index
      CANOPY_LLM_BASE_URL=http://localhost:11434/v1 CANOPY_LLM_MODEL=qwen2.5 canopy index docs/
      canopy index docs/ --ray auto          # on the Ray cluster started by `ray start --head`
    """
    from canopy.server.runtime import build_index, open_workspace, start_background_tidy
    from canopy.server.wings import wing_module

    ws = open_workspace(docs, index_dir, config)
    ray_address = ray_address or ws.settings.distributed.ray_address
    if estimate:
        if ray_address:
            raise click.UsageError("--estimate runs in this process: drop --ray.")
        _print_estimate(ws, docs, sample, as_json)
        return
    inline = full or ws.settings.storage.tidy == "inline"
    publish_uri = publish_uri or ws.settings.publish.uri
    on_revoked = None
    publishing = (wing_module("publish", "publishing", wanted_by="--publish / [publish] uri")
                  if publish_uri else None)
    if publishing is not None:
        publishing.check_publish_target(ws, publish_uri)  # a missing bucket: one line now
        on_revoked = publishing.revocation_publisher(
            ws, publish_uri, lambda line: click.echo(f"canopy: {line}", err=True))
    plans = PlanLines()  # the plan and projection lines of a build that calls an LLM (stderr)
    cluster = None
    if ray_address:
        cluster = wing_module("ray", "cluster", wanted_by="--ray").connect_ray(
            ray_address, ws.settings.distributed)
    try:
        result = build_index(ws, full=full, progress=tqdm_progress, tidy=inline,
                             on_revoked=on_revoked, on_plan=plans, ray=cluster)
    except KeyboardInterrupt:
        raise click.ClickException(
            _interrupted(ws.index_dir, index_command(docs, index_dir, config))) from None
    finally:
        if cluster is not None:
            cluster.close()
    if result.recovered:
        click.echo(f"canopy: {result.recovered}", err=True)
    if publishing is not None:  # before the tidy: the snapshot needs the writer lock a moment
        published = publishing.publish_index(ws, publish_uri)
        click.echo(f"canopy: {publishing.describe_publish(published, publish_uri)}", err=True)
    # The search tables' periodic tidy would cost a whole-table rewrite on large indexes: it
    # runs detached, and gives way to the next writer ([storage] tidy = "inline" keeps it here).
    tidy_pid = None if inline else start_background_tidy(ws, config)
    if tidy_pid is not None:
        click.echo(f"canopy: tidying the search tables in the background (pid {tidy_pid}, log "
                   f"{ws.index_dir / 'tidy.log'})", err=True)
    if as_json:
        click.echo(json.dumps({"generation": result.generation,
                               "elapsed_s": round(result.elapsed_s, 3),
                               "stats": result.stats, "llm_usage": result.usage,
                               "plan": plans.as_dict(),
                               "skipped": [s.__dict__ for s in result.skips],
                               "failures": [f.__dict__ for f in result.failures]}, indent=2))
        return
    s = result.stats
    provider = ("builtin (offline)" if not ws.settings.llm.enabled
                else f"openai-compatible {ws.settings.llm.model}")
    click.echo(f"Indexed {s['documents']} documents into {ws.index_dir} in {result.elapsed_s:.1f}s "
               f"(generation {result.generation}, provider: {provider})")
    click.echo(f"  text units {s['text_units']} ({s['units_extracted']} extracted, "
               f"{s['units_failed']} failed)")
    click.echo(f"  entities {s['entities']}, relationships {s['relationships']}, "
               f"claims {s['claims']}")
    click.echo(f"  communities {s['communities']} by level {s['communities_by_level']}")
    click.echo(f"  reports {s['reports']} ({s['reports_generated']} generated, "
               f"{s['reports_reused']} reused)")
    stages = s.get("seconds") or {}
    if stages:  # tidy: the periodic search-table maintenance after the commit
        click.echo("  seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    if isinstance(s.get("llm_concurrency"), dict):
        from canopy.server.status import ConcurrencyInfo, concurrency_line

        click.echo(f"  {concurrency_line(ConcurrencyInfo.model_validate(s['llm_concurrency']))}")
    if isinstance(s.get("ray"), dict):
        click.echo(f"  {_ray_line(s['ray'])}")
    for skip in result.skips:
        click.echo(f"  skipped {skip.path}: {skip.reason}")
    for f in result.failures:
        click.echo(f"  failed {f.task} {f.unit_id}: {f.error}")
    if ws.settings.llm.enabled:  # last, to compare with the plan printed when the build began
        click.echo(f"  {calls_line(result.usage, plans)}")


def _ray_line(ray: dict) -> str:
    """What the Ray cluster did, in one line of the build summary."""
    work = []
    if ray.get("endpoint_calls"):
        work.append(f"{ray['endpoint_calls']:,} endpoint requests, Ray's round trip "
                    f"{ray['overhead_ms_per_call']:.1f} ms a request over the request itself"
                    + (f", {ray['lost_calls']} lost and retried" if ray.get("lost_calls") else ""))
    if ray.get("extract_tasks"):
        work.append(f"{ray['extract_tasks']:,} extraction tasks")
    if ray.get("embed_tasks"):
        work.append(f"{ray['embed_tasks']:,} embedding tasks")
    return (f"ray: {ray['workers']} workers at {ray['address']} ({ray['cluster_cpus']} CPUs; "
            f"start-up {ray['startup_s']:.1f}s): " + ("; ".join(work) or "nothing to send"))


def _print_estimate(ws: Workspace, docs: Path, sample: int, as_json: bool) -> None:
    from canopy.server.estimate import estimate_build

    llm = ws.settings.llm
    est = estimate_build(ws, sample=sample, price_in=llm.price_input_per_mtok,
                         price_out=llm.price_output_per_mtok)
    if as_json:
        click.echo(json.dumps({**est.model_dump(), "calls": est.calls,
                               "prompt_tokens": est.prompt_tokens,
                               "completion_tokens": est.completion_tokens, "cost": est.cost},
                              indent=2))
        return
    click.echo(f"{docs}: {est.documents} documents, {est.units:,} text units "
               f"({est.unit_tokens:,} tokens)")
    if not est.tasks:
        click.echo("No LLM endpoint is configured: the builtin offline provider makes no calls "
                   "and costs nothing. Set [llm] base_url (or CANOPY_LLM_BASE_URL) to estimate "
                   "a build with a model.")
        return
    priced = est.cost is not None
    click.echo(f"Estimate of a full build with {est.provider}, from {est.sample_units} of the "
               f"text units built for real in {est.sample_wall_s:.0f} s:")
    rows = [(t.task, t.calls, t.prompt_tokens, t.completion_tokens, t.cost) for t in est.tasks]
    rows.append(("total", est.calls, est.prompt_tokens, est.completion_tokens, est.cost))
    click.echo(f"  {'task':<12}{'calls':>10}{'prompt tokens':>16}{'completion tokens':>20}"
               + (f"{'cost':>12}" if priced else ""))
    for task, calls, p, c, cost in rows:
        click.echo(f"  {task:<12}{calls:>10,}{p:>16,}{c:>20,}"
                   + (f"{cost:>12,.2f}" if priced and cost is not None else ""))
    click.echo(f"  wall time about {duration(est.wall_s)} at the sample's pace")
    if not priced:
        click.echo("  (set [llm] price_input_per_mtok and price_output_per_mtok for a cost)")
    click.echo("Extraction and gleaning scale with the units; summaries and reports depend on "
               "how entities recur across documents and are the rough part. The sample's own "
               f"{est.spent_calls:,} calls (two samples, half and whole) were real.")


def _interrupted(index_dir: Path, resume: str) -> str:
    """What Ctrl-C kept: the last committed generation, and every extraction already saved."""
    from canopy.health import check_database

    try:  # read-only: the interrupted writer may have left its connection mid-transaction
        facts = check_database(index_dir)
    except sqlite3.Error:  # busy or locked: say nothing about generations
        facts = "unreadable"
    generation = facts.generation if not isinstance(facts, str) else 0
    kept = (f"the index still answers from generation {generation}, its last commit"
            if generation else "no index has been committed yet")
    return (f"interrupted: {kept}. Extractions and LLM responses finished so far are saved; "
            f"`{resume}` resumes without redoing them.")


@click.command()
@DOCS
@INDEX_DIR
@CONFIG
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--check", is_flag=True,
              help="Also verify every database page and open every search table at its "
                   "committed version (about 2 s more, plus 0.5 s per 600 MB of database).")
def status(docs: Path, index_dir: Path | None, config: Path | None, as_json: bool,
           check: bool) -> None:
    """Show what the index of DOCS holds: counts, levels, skips, failures, provider, LLM usage.

    A damaged index is reported in one line, with the command that rebuilds it, and exit
    code 1. Without --check this takes milliseconds at any size: the database is opened and
    counted, the search tables' files are looked at but not opened."""
    from canopy.server.runtime import open_workspace
    from canopy.server.status import concurrency_line, index_status

    ws = open_workspace(docs, index_dir, config)
    _check_health(ws.index_dir, ws.docs_dir, thorough=check)
    store = ws.store(must_exist=True)
    try:
        st = index_status(store)
    finally:
        store.close()
    if as_json:
        click.echo(st.model_dump_json(indent=2))
        return
    if st.generation == 0:
        click.echo(f"Index {st.index_dir}: nothing committed yet. A first build that was "
                   f"interrupted resumes with `{index_command(docs, index_dir, config)}`, "
                   "keeping the extractions "
                   "it saved.")
        return
    configured = ("builtin (offline, no LLM endpoint configured)" if st.provider == "builtin"
                  else st.provider)
    click.echo(f"Index {st.index_dir} (generation {st.generation})")
    click.echo(f"  provider: {configured}; embeddings: {st.embedder}")
    click.echo(f"  documents {st.documents}, text units {st.text_units}")
    click.echo(f"  entities {st.entities}, relationships {st.relationships}, claims {st.claims}")
    click.echo(f"  communities {st.communities} by level {st.communities_by_level}, "
               f"reports {st.reports}")
    for label, usage in (("last run", st.llm_usage), ("all runs", st.llm_usage_total)):
        if usage:
            click.echo(f"  LLM usage, {label}:")
        for task, u in usage.items():
            click.echo(f"    {task}: {u.get('calls', 0)} calls ({u.get('cached', 0)} cached), "
                       f"{u.get('prompt_tokens', 0)} prompt + {u.get('completion_tokens', 0)} "
                       "completion tokens")
    if st.llm_concurrency is not None:
        click.echo(f"  {concurrency_line(st.llm_concurrency)}")
    for s in st.skipped:
        click.echo(f"  skipped {s.path}: {s.reason}")
    if st.ignored_types:
        kinds = ", ".join(f"{ext} {n}" for ext, n in sorted(st.ignored_types.items(),
                                                             key=lambda kv: (-kv[1], kv[0])))
        click.echo(f"  not indexed (type not in [input] extensions): {kinds}")
    for f in st.failures:
        click.echo(f"  failed {f.task} {f.id}: {f.error}")


def _check_health(index_dir: Path, docs: Path, *, thorough: bool) -> None:
    """IndexDamaged (one line, via CanopyGroup) when the index exists and is damaged."""
    from canopy.errors import IndexDamaged
    from canopy.health import DB_NAME, raise_if_damaged

    if not (index_dir / DB_NAME).exists():
        return  # `ws.store(must_exist=True)` says there is no index
    try:
        raise_if_damaged(index_dir, thorough=thorough)
    except IndexDamaged as exc:
        raise exc.for_docs(docs, index_dir) from None
