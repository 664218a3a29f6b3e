"""`canopy eval`: retrieval quality of the tools on questions whose supporting documents are
known (`retrieval`), or, with --answers, the GraphRAG paper's head-to-head answer
evaluation of two methods by an LLM judge (canopy.server.wings.eval.answers)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from canopy.server.cli.common import CONFIG, DOCS, INDEX_DIR

if TYPE_CHECKING:
    from canopy.server.runtime import Workspace
    from canopy.server.wings.eval.answers import CriterionScore, EvalQuestion, Judgment

__all__ = ["eval_command"]

NO_LLM = ("answer evaluation needs an LLM endpoint (its judge and question generator are a "
          "model): set [llm] base_url in canopy.toml or CANOPY_LLM_BASE_URL")


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
@click.argument("questions", required=False,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@INDEX_DIR
@CONFIG
@click.option("--format", "fmt", type=click.Choice(["jsonl", "multihop-rag", "musique"]),
              default="jsonl", show_default=True, help="How QUESTIONS names its gold documents.")
@click.option("--split", type=click.Choice(["dev", "test", "all"]), default=None,
              help="Questions by sha256(question) % 5: 0 is test, else dev. Default: dev for "
                   "the benchmark formats (multihop-rag, musique), all for your own jsonl file.")
@click.option("--tools", default="local,basic,bm25", show_default=True,
              help="Comma-separated: local and basic (local_search's and basic_search's results "
                   "as an MCP client receives them, after fitting to the result limit), bm25 "
                   "(plain BM25 over the same passages), local-ranking (local_search's ranking "
                   "before assembly), fts (the index's full-text search alone).")
@click.option("--k", "ks", default="2,5,10", show_default=True, help="Cut-offs, comma-separated.")
@click.option("--limit", type=int, default=None, help="Only the first N questions of the split.")
@click.option("--answers", is_flag=True,
              help="Answer evaluation instead of retrieval: two methods' answers compared by an "
                   "LLM judge (needs an LLM endpoint). Questions are generated unless QUESTIONS "
                   "is given.")
@click.option("--methods", default="global,local", show_default=True,
              help="--answers: the two methods, A,B: global, global:LEVEL, local, drift, basic.")
@click.option("--personas", type=click.IntRange(1, 20), default=3, show_default=True,
              help="--answers: personas generated from the corpus.")
@click.option("--tasks", "n_tasks", type=click.IntRange(1, 20), default=2, show_default=True,
              help="--answers: tasks per persona.")
@click.option("--questions", "n_questions", type=click.IntRange(1, 20), default=2,
              show_default=True, help="--answers: questions per task.")
@click.option("--repeats", type=click.IntRange(1, 20), default=2, show_default=True,
              help="--answers: judgments per question, criterion and order (the judge sees "
                   "every pair in both orders).")
@click.option("--principal", envvar="CANOPY_PRINCIPAL", default=None,
              help="Whose permissions apply (under an [acl] policy).")
@click.option("--json", "as_json", is_flag=True, help="Print the scores as JSON.")
@click.option("--details", "details_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Also write one JSON line per question to this file: its gold "
                                 "documents and each tool's first documents, in order.")
def eval_command(docs: Path, questions: Path | None, index_dir: Path | None,
                 config: Path | None, fmt: str, split: str | None, tools: str, ks: str,
                 limit: int | None, answers: bool, methods: str, personas: int, n_tasks: int,
                 n_questions: int, repeats: int, principal: str | None, as_json: bool,
                 details_path: Path | None) -> None:
    """Score the tools' retrieval on QUESTIONS against the index of DOCS: R@k, Hits@k, All@k;
    or, with --answers, compare two methods' answers with an LLM judge.

    \b
    Gold documents are named by path or title. Formats:
      jsonl         {"question": "...", "gold": ["suppliers/helio.md", ...]} per line
      multihop-rag  MultiHopRAG.json (gold: evidence titles; null queries skipped)
      musique       HippoRAG's MuSiQue files (gold: supporting paragraph titles)
    Tune on --split dev only; keep test for a final look.

    \b
    Answer evaluation (Edge et al. 2024 §3): personas x tasks x questions sensemaking
    questions generated from the top-level community reports (or those of QUESTIONS: one per
    line, or JSONL with "question"; gold is not needed), answered by both methods; the judge
    compares each pair on
    comprehensiveness, diversity, empowerment and directness, in both orders, --repeats
    times; printed: method A's win rate per criterion with a 95% bootstrap interval.

    \b
    Examples:
      canopy eval ~/docs questions.jsonl
      canopy eval news/ MultiHopRAG.json --format multihop-rag --k 4,10 --limit 200
      canopy eval ~/docs --answers --methods global,local --personas 3 --tasks 2 --questions 2
      canopy eval ~/docs --answers --methods global:1,basic --repeats 3 --json
    """
    from canopy.server.cli.common import check_principal
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService
    from canopy.server.wings.eval.retrieval import (
        as_dict,
        default_split,
        details,
        evaluate,
        load_questions,
        score_table,
        split_of,
    )

    ws = open_workspace(docs, index_dir, config)
    check_principal(ws.settings.acl, principal)
    split = split or default_split(fmt)
    if answers:
        from canopy.server.wings.eval.answers import read_questions

        asked_file = None
        if questions is not None:
            texts = (read_questions(questions) if fmt == "jsonl"
                     else [q.text for q in load_questions(questions, fmt)])
            asked_file = [q for q in texts if split == "all" or split_of(q) == split][:limit]
        _answer_eval(ws, principal, [m.strip() for m in methods.split(",") if m.strip()],
                     asked_file, (personas, n_tasks, n_questions), repeats, as_json)
        return
    if questions is None:
        raise click.UsageError("give QUESTIONS (a question file) for retrieval evaluation, or "
                               "--answers for answer evaluation")
    chosen = [t.strip() for t in tools.split(",") if t.strip()]
    cutoffs = _ints(ks)
    asked = [q for q in load_questions(questions, fmt)
             if split == "all" or split_of(q.text) == split][:limit]
    if not asked:
        raise click.ClickException(f"no {split} question in {questions}")
    service = CanopyService(ws)
    try:
        scores = evaluate(service, asked, chosen, cutoffs, principal=principal,
                          progress=lambda m: click.echo(m, err=True))
    finally:
        service.close()
    if details_path is not None:
        details_path.write_text("".join(line + "\n" for line in details(asked, scores)),
                                encoding="utf-8")
    if as_json:
        click.echo(json.dumps({"questions": len(asked), "split": split, "format": fmt,
                               "result_token_limit": ws.settings.query.result_token_limit,
                               "scores": [as_dict(s) for s in scores]}, indent=2))
        return
    click.echo(f"{len(asked)} {split} questions from {questions} ({fmt}), index {ws.index_dir}, "
               f"provider {service.provider.name}, results fitted to "
               f"{ws.settings.query.result_token_limit} tokens")
    for line in score_table(scores, cutoffs):
        click.echo(line)
    if scores and scores[0].unmatched_gold:
        click.echo(f"Note: {scores[0].unmatched_gold} gold entries name no document you may read "
                   "in this index (by path or title); they count as not found.", err=True)


def _answer_eval(ws: Workspace, principal: str | None, methods: list[str],
                 asked: list[str] | None, shape: tuple[int, int, int], repeats: int,
                 as_json: bool) -> None:
    """`canopy eval --answers`: generate (or take) questions, answer, judge, print."""
    from canopy.providers.llm_provider import LLMProvider
    from canopy.server.service import CanopyService
    from canopy.server.wings.eval.answers import (
        EvalQuestion,
        answer_all,
        check_methods,
        corpus_reports,
        generate_questions,
        judge_all,
        score,
    )

    if not ws.settings.llm.enabled:
        raise click.ClickException(NO_LLM)
    a, b = check_methods(methods)
    if asked is not None and not asked:
        raise click.ClickException("no question to evaluate in QUESTIONS (after --split)")
    service = CanopyService(ws)
    try:
        provider = service.provider
        assert isinstance(provider, LLMProvider)  # llm.enabled: make_provider's choice
        client = provider.client

        def say(message: str) -> None:
            click.echo(message, err=True)

        async def run() -> tuple[str, list[EvalQuestion], list[str], list[str], list[Judgment]]:
            with service.context(principal) as ctx:
                if asked is None:
                    description, qs = await generate_questions(
                        client, await corpus_reports(ctx), personas=shape[0], tasks=shape[1],
                        questions=shape[2], progress=say)
                else:
                    description, qs = "", [EvalQuestion(q) for q in asked]
                if not qs:
                    raise click.ClickException("the model generated no usable question")
                ans_a = await answer_all(ctx, qs, a, progress=say)
                ans_b = await answer_all(ctx, qs, b, progress=say)
            judged = await judge_all(client, qs, ans_a, ans_b, repeats=repeats, progress=say)
            return description, qs, ans_a, ans_b, judged

        description, qs, ans_a, ans_b, judged = asyncio.run(run())
        usage = client.usage()
    finally:
        service.close()
    scores = score(judged, seed=ws.settings.query.seed)
    origin = (f"generated: {shape[0]} personas x {shape[1]} tasks x {shape[2]} questions"
              if asked is None else "from QUESTIONS")
    if as_json:
        click.echo(json.dumps(_as_json(a, b, origin, repeats, description, qs, ans_a, ans_b,
                                       judged, scores, usage, client.model), indent=2))
        return
    click.echo(f"Answer evaluation, provider openai:{client.model}: {a} (A) vs {b} (B) on "
               f"{len(qs)} questions ({origin}), {repeats} repeat{'s' * (repeats != 1)} x 2 "
               "orders per criterion")
    click.echo(f"| criterion | {a} wins | {b} wins | ties | malformed | {a} win rate [95% CI] "
               "| judge chose the first shown |")
    click.echo("|---|---|---|---|---|---|---|")
    for c in scores:
        first = "-" if c.first_chosen is None else f"{c.first_chosen:.0%}"
        click.echo(f"| {c.criterion} | {c.a_wins} | {c.b_wins} | {c.ties} | {c.malformed} | "
                   f"{c.win_rate:.2f} [{c.ci_low:.2f}, {c.ci_high:.2f}] | {first} |")
    malformed = sum(c.malformed for c in scores)
    if malformed:
        click.echo(f"{malformed} judgments were unreadable (after one repair turn) and are left "
                   "out of the win rates.")
    calls = sum(u.calls for u in usage.values())
    cached = sum(u.cached for u in usage.values())
    tokens = sum(u.prompt_tokens + u.completion_tokens for u in usage.values())
    per_task = ", ".join(f"{t} {u.calls + u.cached}" for t, u in sorted(usage.items())
                         if u.calls + u.cached)
    reused = f" ({cached} more answered from the response cache)" if cached else ""
    click.echo(f"LLM usage: {calls} calls{reused}, {tokens} tokens; requests by task: "
               f"{per_task}")


def _as_json(a: str, b: str, origin: str, repeats: int, description: str,
             qs: list[EvalQuestion], ans_a: list[str], ans_b: list[str],
             judged: list[Judgment], scores: list[CriterionScore], usage: dict[str, Any],
             model: str) -> dict[str, Any]:
    return {
        "methods": {"A": a, "B": b}, "questions_from": origin, "repeats": repeats,
        "provider": f"openai:{model}", "description": description,
        "questions": [{**asdict(q), "answer_a": x, "answer_b": y}
                      for q, x, y in zip(qs, ans_a, ans_b, strict=True)],
        "scores": [{k: v for k, v in asdict(c).items() if k != "per_question"} for c in scores],
        "judgments": [asdict(j) for j in judged],
        "usage": {t: u.as_dict() for t, u in sorted(usage.items())},
    }
