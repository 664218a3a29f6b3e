"""`canopy eval`: retrieval quality of the tools on questions whose supporting documents are
known (server.evaluation)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from server.cli.common import CONFIG, DOCS, INDEX_DIR

__all__ = ["eval_command"]


def _ints(value: str) -> list[int]:
    try:
        out = sorted({int(v) for v in value.split(",") if v.strip()})
    except ValueError:
        raise click.BadParameter("use comma-separated integers, e.g. 2,5,10") from None
    if not out or out[0] < 1:
        raise click.BadParameter("use comma-separated integers from 1, e.g. 2,5,10")
    return out


@click.command("eval")
@DOCS
@click.argument("questions", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@INDEX_DIR
@CONFIG
@click.option("--format", "fmt", type=click.Choice(["jsonl", "multihop-rag", "musique"]),
              default="jsonl", show_default=True, help="How QUESTIONS names its gold documents.")
@click.option("--split", type=click.Choice(["dev", "test", "all"]), default="dev",
              show_default=True, help="Questions by sha256(question) % 5: 0 is test, else dev.")
@click.option("--tools", default="local,basic,bm25", show_default=True,
              help="Comma-separated: local (local_search's context), basic (basic_search's), "
                   "bm25 (the full-text index alone).")
@click.option("--k", "ks", default="2,5,10", show_default=True, help="Cut-offs, comma-separated.")
@click.option("--limit", type=int, default=None, help="Only the first N questions of the split.")
@click.option("--principal", envvar="CANOPY_PRINCIPAL", default=None,
              help="Whose permissions apply (under an [acl] policy).")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
def eval_command(docs: Path, questions: Path, index_dir: Path | None, config: Path | None,
                 fmt: str, split: str, tools: str, ks: str, limit: int | None,
                 principal: str | None, as_json: bool) -> None:
    """Score the tools' retrieval on QUESTIONS against the index of DOCS: R@k, Hits@k, All@k.

    \b
    Gold documents are named by path or title. Formats:
      jsonl         {"question": "...", "gold": ["suppliers/helio.md", ...]} per line
      multihop-rag  MultiHopRAG.json (gold: evidence titles; null queries skipped)
      musique       HippoRAG's MuSiQue files (gold: supporting paragraph titles)
    Tune on --split dev only; keep test for a final look.

    \b
    Examples:
      canopy eval ~/docs questions.jsonl
      canopy eval news/ MultiHopRAG.json --format multihop-rag --k 4,10 --limit 200
    """
    from server.cli.common import check_principal
    from server.evaluation import evaluate, load_questions, split_of
    from server.runtime import open_workspace
    from server.service import CanopyService

    ws = open_workspace(docs, index_dir, config)
    check_principal(ws.settings.acl, principal)
    chosen = [t.strip() for t in tools.split(",") if t.strip()]
    cutoffs = _ints(ks)
    asked = [q for q in load_questions(questions, fmt)
             if split == "all" or split_of(q.text) == split][:limit]
    if not asked:
        raise click.ClickException(f"no {split} question in {questions}")
    service = CanopyService(ws)
    try:
        with service.context(principal) as ctx:
            scores = evaluate(ctx, asked, chosen, cutoffs,
                              progress=lambda m: click.echo(m, err=True))
    finally:
        service.close()
    if as_json:
        click.echo(json.dumps({"questions": len(asked), "split": split, "format": fmt,
                               "scores": [asdict(s) for s in scores]}, indent=2))
        return
    click.echo(f"{len(asked)} {split} questions from {questions} ({fmt}), index {ws.index_dir}")
    head = " | ".join(f"R@{k} | Hits@{k} | All@{k}" for k in cutoffs)
    click.echo(f"| tool | {head} | ms/question |")
    click.echo("|---|" + "---|" * (3 * len(cutoffs) + 1))
    for s in scores:
        cells = " | ".join(f"{s.recall[k]:.3f} | {s.hits[k]:.3f} | {s.all[k]:.3f}"
                           for k in cutoffs)
        click.echo(f"| {s.tool} | {cells} | {s.ms_per_question:.0f} |")
    if scores and scores[0].unmatched_gold:
        click.echo(f"Note: {scores[0].unmatched_gold} gold entries name no document you may read "
                   "in this index (by path or title); they count as not found.", err=True)
