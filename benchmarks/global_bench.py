"""Global search: what it reads of the corpus and what it costs, dynamic selection against fixed
levels, side by side in one run.

    python benchmarks/global_bench.py                          # both parts
    python benchmarks/global_bench.py --part fake --articles 100 --questions 20
    python benchmarks/global_bench.py --part offline --index-dir /tmp/mh/idx
    python benchmarks/global_bench.py --part fake --levels none --fake-index /tmp/gl/fake100

Part `fake`: the first N MultiHop-RAG articles (default 100, one .md each, as
benchmarks/index_bench.py writes them) indexed against the test suite's fake OpenAI-compatible
server at zero latency (tests/fakes/openai_server.py, in this process, behind the real `openai`
client); then every question is asked with dynamic selection and at each fixed level. Questions:
the first N DEV MultiHop-RAG questions (int(sha256(q), 16) % 5 != 0; never the others) and two
sensemaking questions. Printed per mode: LLM calls and prompt tokens per question (the fake counts
prompt characters / 4), of them the rating calls and their prompt tokens (from the fake's request
log, so the figure does not depend on what the result reports), whether every question mapped at
least one community, and for dynamic selection whether every top-level community the caller may
read was considered. `--fake-index DIR` keeps the built index there (built if missing) and asks
the questions over a fresh copy each run, so that the index's response cache never answers one
run from another. Reference: Microsoft GraphRAG 3.3.0's dynamic selection on the same 100
articles with a zero-latency mock, 966k prompt tokens per question (measured by the project,
issue 15).

Part `offline`: the 609-article builtin index of benchmarks/retrieval_eval.py; the sensemaking
questions with the builtin provider: how many different top-level communities the answer's
citations fall under, and the coverage line.

Part `themes` (issue 31, offline sensemaking): the first N MultiHop-RAG articles (default 100)
indexed with the builtin provider (`--builtin-index DIR` keeps the index); each question of
THEMES asked with dynamic selection, plain and with words that say nothing added ("across these
articles"). Printed per question: the MultiHop-RAG categories (corpus metadata, one per article)
of the articles behind the cited communities (`any`: a category one of their text units has;
`most`: each cited community's most frequent category), the top-level communities cited, the
map points kept that share no content word with a question that has some (a point chosen for
a stop word, a function word or scaffolding), and whether the worded question cites what the
plain one does. Content words here are the question's words less lexicon.STOPWORDS,
FUNCTION_WORDS and GENERIC_QUERY_WORDS, counted by this script apart from the engine.

Output: markdown on stdout (progress on stderr), JSON in benchmarks/results/global_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.index_bench import FAKE_LLM, materialize_multihop
from benchmarks.multihop import CORPUS
from benchmarks.retrieval_eval import (
    RESULTS,
    load_questions,
    machine,
    multihop_index,
    open_context,
)

SENSEMAKING = ("What are the main themes?", "What are the top 5 topics of these documents?")
# (plain, worded): the worded one adds only words that say nothing about what is asked.
THEMES = (
    ("What are the main themes?", "What are the main themes across these articles?"),
    ("What are the top 5 topics of these documents?",
     "What are the top 5 topics throughout these documents?"),
    ("What antitrust cases are reported?",
     "What antitrust cases are reported across the articles?"),
    ("Which players were injured?", "Which players among these were injured?"),
)
GRAPHRAG_DYNAMIC_PROMPT_TOKENS = 966_000  # per question, 100 articles, zero-latency mock


def root_of(ctx: Any, community_id: str) -> str:
    """The top-level community above `community_id` (itself for a root)."""
    cid = community_id
    while True:
        row = ctx.reader.community_rows([cid]).get(cid)
        if row is None or row.parent is None:
            return cid
        cid = row.parent


async def ask(ctx: Any, question: str, level: int | None, fake: Any = None) -> dict[str, Any]:
    """One global search and what it cost and read. With `fake` (the FakeOpenAI answering it),
    the rating calls and their prompt tokens are counted from the fake's request log."""
    from canopy.server.engines import global_search

    seen = len(fake.requests) if fake is not None else 0
    t0 = time.perf_counter()
    r = await global_search(ctx, question, community_level=level)
    cov = r.coverage
    assert cov is not None
    roots = {root_of(ctx, c.id) for c in r.citations}
    row = {
        "question": question, "level": level, "ms": round((time.perf_counter() - t0) * 1000),
        "llm_calls": r.usage.llm_calls, "prompt_tokens": r.usage.prompt_tokens,
        "completion_tokens": r.usage.completion_tokens, "citations": len(r.citations),
        "cited_roots": len(roots), "coverage": cov.model_dump(), "coverage_line": cov.line(),
        "top_considered": cov.levels[0].considered if cov.levels and cov.levels[0].level == 0
        else 0,
        "mapped": sum(c.mapped for c in cov.levels),
        "answered": bool(r.citations),
    }
    if fake is not None:
        from tests.fakes.openai_server import _prompt_tokens

        rates = [q for q in fake.requests[seen:] if q.task == "rate"]
        row["rating_calls"] = len(rates)
        row["rating_prompt_tokens"] = sum(_prompt_tokens(q.task, q.body) for q in rates)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = {
        "questions": len(rows),
        "llm_calls_per_q": round(statistics.fmean(r["llm_calls"] for r in rows), 1),
        "prompt_tokens_per_q": round(statistics.fmean(r["prompt_tokens"] for r in rows)),
        "max_prompt_tokens": max(r["prompt_tokens"] for r in rows),
        "p50_ms": round(statistics.median(r["ms"] for r in rows)),
        "answered": sum(r["answered"] for r in rows),
        "mapped_some": sum(r["mapped"] > 0 for r in rows),
        "cited_roots_mean": round(statistics.fmean(r["cited_roots"] for r in rows), 1),
    }
    if all("rating_calls" in r for r in rows):
        out |= {
            "rating_calls_per_q": round(statistics.fmean(r["rating_calls"] for r in rows), 1),
            "max_rating_calls": max(r["rating_calls"] for r in rows),
            "rating_prompt_tokens_per_q": round(
                statistics.fmean(r["rating_prompt_tokens"] for r in rows)),
            "max_rating_prompt_tokens": max(r["rating_prompt_tokens"] for r in rows),
        }
    return out


def communities_in(index: Path) -> int:
    import sqlite3

    with sqlite3.connect(index / "canopy.sqlite") as con:
        return int(con.execute("SELECT count(*) FROM communities").fetchone()[0])


def part_fake(args: argparse.Namespace) -> dict[str, Any]:
    from canopy.server.runtime import build_index, open_workspace
    from canopy.server.service import CanopyService
    from tests.fakes.openai_server import FakeOpenAI

    out: dict[str, Any] = {"articles": args.articles}
    with tempfile.TemporaryDirectory(prefix="canopy-global-") as tmp, \
            FakeOpenAI(latency=0.0) as fake:
        keep = args.fake_index.resolve() if args.fake_index else None
        built_at = keep or Path(tmp) / "built"
        docs, index = built_at / "docs", built_at / "index"
        llm = {"base_url": fake.base_url, **FAKE_LLM}
        if not (index / "canopy.sqlite").exists():
            materialize_multihop(docs, args.articles)
            t0 = time.perf_counter()
            build_index(open_workspace(docs, index_dir=index, llm=llm), full=True)
            out["build_s"] = round(time.perf_counter() - t0, 1)
            print(f"built {args.articles} articles in {out['build_s']} s", file=sys.stderr)
        if keep is not None:  # a fresh copy: no response cached by an earlier run answers
            shutil.copytree(index, Path(tmp) / "index")
            index = Path(tmp) / "index"
        ws = open_workspace(docs, index_dir=index, llm=llm)
        fake.rating_cap = args.rating_cap
        out["rating_cap"] = args.rating_cap
        service = CanopyService(ws)
        try:
            with service.context(None) as ctx:
                roots = len(ctx.reader.roots())
                out["communities"] = communities_in(index)
                levels = list(range(ctx.reader.deepest_level() + 1))
                out["roots"] = roots
                questions = [q["query"] for q in load_questions("dev")[:args.questions]]
                questions += list(SENSEMAKING)
                modes: dict[str, list[dict[str, Any]]] = {}
                if args.levels is not None:
                    levels = [lv for lv in levels if lv in args.levels]
                for mode in ["dynamic", *(f"level {lv}" for lv in levels)]:
                    level = None if mode == "dynamic" else int(mode.split()[1])
                    rows = []
                    for i, q in enumerate(questions):
                        rows.append(asyncio.run(ask(ctx, q, level, fake)))
                        print(f"  {mode} {i + 1}/{len(questions)}: {rows[-1]['llm_calls']} "
                              f"calls, {rows[-1]['prompt_tokens']} prompt tokens, "
                              f"{rows[-1]['rating_calls']} rating calls, "
                              f"{rows[-1]['mapped']} mapped", file=sys.stderr)
                    modes[mode] = rows
                out["modes"] = {m: summarize(rows) for m, rows in modes.items()}
                out["every_top_considered"] = all(
                    r["top_considered"] == roots for r in modes["dynamic"])
                out["rows"] = modes
        finally:
            service.close()
    return out


def part_offline(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with multihop_index(args.index_dir) as (docs, index):
        service, ctx = open_context(docs, index)
        try:
            out["roots"] = len(ctx.reader.roots())
            out["rows"] = [asyncio.run(ask(ctx, q, None)) for q in SENSEMAKING]
        finally:
            service.close()
    return out


def _words(text: str) -> set[str]:
    from canopy.providers.builtin import lexicon as lx
    from canopy.providers.builtin.text import terms

    empty = lx.STOPWORDS | getattr(lx, "FUNCTION_WORDS", frozenset()) | lx.GENERIC_QUERY_WORDS
    drop = {t for w in empty for t in terms(w)}
    return {t for t in terms(text) if t not in drop and not t.isdigit()}


async def ask_themes(ctx: Any, question: str, categories: list[str]) -> dict[str, Any]:
    """One builtin global search: the categories behind what it cites, and its points chosen
    for no content word."""
    import collections

    from canopy.server.engines import global_search

    # Every kept point in the context, uncut by the result limit: the points are what is read.
    whole = dataclasses.replace(ctx, settings=ctx.settings.model_copy(
        update={"result_token_limit": 1_000_000}))
    t0 = time.perf_counter()
    r = await global_search(whole, question)
    ms = round((time.perf_counter() - t0) * 1000)
    ids = [c.id for c in r.citations]
    reports = await ctx.reader.reports(ids)
    any_cat: set[str] = set()
    most_cat: set[str] = set()
    for cid in ids:
        units = ctx.reader.units(reports[cid].text_unit_ids)
        counts = collections.Counter(categories[int(Path(d.path).name[:4])]
                                     for _, d in units.values())
        any_cat |= set(counts)
        if counts:
            most_cat.add(counts.most_common(1)[0][0])
    asked = _words(question)
    points = [p.split("-----", 1)[-1].strip()
              for p in r.context.split("----- Analyst point ")[1:]]
    empty = sum(1 for p in points if not (_words(p) & asked)) if asked else 0
    return {"question": question, "ms": ms, "citations": ids,
            "cited_roots": len({root_of(ctx, c) for c in ids}),
            "categories_any": sorted(any_cat), "categories_most": sorted(most_cat),
            "points": points, "points_without_content_word": empty,
            "content_words": sorted(asked), "coverage_line": r.coverage.line()
            if r.coverage else ""}


def part_themes(args: argparse.Namespace) -> dict[str, Any]:
    from canopy.server.runtime import build_index, open_workspace

    corpus = json.loads(CORPUS.read_text(encoding="utf-8"))
    categories = [a["category"] for a in corpus]
    out: dict[str, Any] = {"articles": args.articles,
                           "corpus_categories": sorted(set(categories[:args.articles]))}
    with tempfile.TemporaryDirectory(prefix="canopy-themes-") as tmp:
        root = args.builtin_index.resolve() if args.builtin_index else Path(tmp)
        docs, index = root / "docs", root / "index"
        if not (index / "canopy.sqlite").exists():
            materialize_multihop(docs, args.articles)
            build_index(open_workspace(docs, index_dir=index), full=True)
        service, ctx = open_context(docs, index)
        try:
            out["roots"] = len(ctx.reader.roots())
            pairs = []
            for plain, worded in THEMES:
                a = asyncio.run(ask_themes(ctx, plain, categories))
                b = asyncio.run(ask_themes(ctx, worded, categories))
                pairs.append({"plain": a, "worded": b,
                              "same_citations": a["citations"] == b["citations"],
                              "points_not_in_plain": len(set(b["points"]) - set(a["points"]))})
                print(f"  {plain!r}: {len(a['categories_any'])} categories, "
                      f"same citations worded: {pairs[-1]['same_citations']}", file=sys.stderr)
            out["pairs"] = pairs
        finally:
            service.close()
    return out


def render(report: dict[str, Any]) -> str:
    lines = ["## Global search coverage and cost", "",
             f"Run: {report['machine']['date']}, commit {report['machine'].get('commit', '?')}",
             ""]
    fake = report.get("fake")
    if fake:
        cap = fake.get("rating_cap")
        lines += [f"Fake LLM, {fake['articles']} MultiHop-RAG articles"
                  + (f" (every rating capped at {cap})" if cap is not None else "")
                  + f": {fake['communities']} "
                  f"communities, {fake['roots']} top-level; every top-level community considered "
                  f"by dynamic selection for every question: {fake['every_top_considered']}", "",
                  "| mode | questions | LLM calls/q | prompt tokens/q | max prompt tokens | "
                  "vs GraphRAG dynamic (966k/q) | rating calls/q (max) | "
                  "rating prompt tokens/q (max) | mapped ≥ 1 | answered | "
                  "cited top-level communities/q | p50 ms |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for mode, s in fake["modes"].items():
            ratio = s["prompt_tokens_per_q"] / GRAPHRAG_DYNAMIC_PROMPT_TOKENS
            rating = (f"{s['rating_calls_per_q']} ({s['max_rating_calls']}) | "
                      f"{s['rating_prompt_tokens_per_q']:,} ({s['max_rating_prompt_tokens']:,})"
                      if "rating_calls_per_q" in s else "— | —")
            lines.append(f"| {mode} | {s['questions']} | {s['llm_calls_per_q']} | "
                         f"{s['prompt_tokens_per_q']:,} | {s['max_prompt_tokens']:,} | "
                         f"{ratio:.3f} | {rating} | {s.get('mapped_some', '—')} | "
                         f"{s['answered']} | {s['cited_roots_mean']} | {s['p50_ms']} |")
        lines.append("")
    themes = report.get("themes")
    if themes:
        n = len(themes["corpus_categories"])
        lines += [f"Builtin provider, the first {themes['articles']} MultiHop-RAG articles "
                  f"({themes['roots']} top-level communities, {n} categories):", "",
                  "| question | citations | top-level cited | categories (any / most) of "
                  f"{n} | points sharing no content word | worded: points not the plain one's "
                  "| worded: same citations |", "|---|---|---|---|---|---|---|"]
        for pair in themes["pairs"]:
            for key in ("plain", "worded"):
                r = pair[key]
                added = "" if key == "plain" else str(pair["points_not_in_plain"])
                same = "" if key == "plain" else str(pair["same_citations"])
                lines.append(f"| {r['question']} | {len(r['citations'])} | {r['cited_roots']} | "
                             f"{len(r['categories_any'])} / {len(r['categories_most'])} | "
                             f"{r['points_without_content_word']} of {len(r['points'])} | "
                             f"{added} | {same} |")
        lines.append("")
    offline = report.get("offline")
    if offline:
        lines += [f"Builtin provider, 609 articles ({offline['roots']} top-level communities):",
                  "", "| question | ms | citations | different top-level communities cited | "
                  "coverage |", "|---|---|---|---|---|"]
        for r in offline["rows"]:
            lines.append(f"| {r['question']} | {r['ms']} | {r['citations']} | "
                         f"{r['cited_roots']} | {r['coverage_line']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["fake", "offline", "themes", "all"], default="all")
    ap.add_argument("--articles", type=int, default=100)
    ap.add_argument("--questions", type=int, default=20, help="DEV MultiHop-RAG questions")
    ap.add_argument("--levels", type=lambda v: [] if v == "none" else [int(x) for x in
                                                                        v.split(",")],
                    default=None, help="fixed levels to compare, comma-separated, or 'none' "
                    "for dynamic selection alone (default: every level)")
    ap.add_argument("--rating-cap", type=int, default=None,
                    help="the fake rates no report above this (e.g. 4: below the relevance "
                    "threshold, as from a model that finds nothing relevant enough)")
    ap.add_argument("--fake-index", type=Path, default=None,
                    help="keep the fake-LLM index here (built if missing); each run queries a "
                    "fresh copy of it")
    ap.add_argument("--builtin-index", type=Path, default=None,
                    help="part themes: keep the builtin index of the first --articles here")
    ap.add_argument("--index-dir", type=Path, default=None,
                    help="the 609-article builtin index (built there if missing)")
    ap.add_argument("--out", type=Path, default=RESULTS / "global_bench.json")
    args = ap.parse_args()
    report: dict[str, Any] = {"machine": machine(), "command": " ".join(sys.argv),
                              "settings": vars(args) | {
        "index_dir": str(args.index_dir), "out": str(args.out),
        "fake_index": str(args.fake_index), "builtin_index": str(args.builtin_index)}}
    if args.part in ("fake", "all"):
        report["fake"] = part_fake(args)
    if args.part in ("offline", "all"):
        report["offline"] = part_offline(args)
    if args.part in ("themes", "all"):
        report["themes"] = part_themes(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1), encoding="utf-8")
    print(render(report))
    print(f"\nJSON: {args.out}")


if __name__ == "__main__":
    main()
