"""Routing accuracy of the `search` router (server/engines/router.py) on labelled questions.

    python benchmarks/router_eval.py                        # indexes in a temp folder (~3 min)
    python benchmarks/router_eval.py --work /tmp/router     # keep (or reuse) the indexes there
    python benchmarks/router_eval.py --modes offline        # the offline rules only

Data sets, each routed against a builtin index of its own corpus, DEV questions only
(int(sha256(question), 16) % 5 != 0; the others are never loaded):
- `multihop-rag`: every DEV query of MultiHopRAG.json (null queries included), over the 609
  articles (benchmarks/retrieval_eval.py's index). Label: not global (they name entities and
  join facts: local or basic);
- `podcast`: the sensemaking questions of the paper's Kevin Scott podcast set
  (kevin_scott_questions.csv), over its 1,669 transcript files. Label: global;
- `earnings`: the paper's multi-transcript questions on Microsoft's earnings calls
  (msft_multi_transcript_questions.csv), over its 41 transcripts. Label: global;
- `earnings-single` (reported, not scored): the single-transcript questions, which ask what one
  call or one executive said ("What does Keith Bachman ask about gaming?"); they are not
  sensemaking questions, so no label fits them all, and the table shows where they went.
Questions are taken as written in the files, stripped of surrounding spaces.

Modes: `offline` (builtin provider: the rules) and `fake-llm` (the test suite's fake
OpenAI-compatible server, tests/fakes/openai_server.py, in this process behind the real client:
it answers the `route` prompt by a fixed reading of it, so this mode measures the LLM path's
plumbing and fallbacks, not a model's judgement).

Printed per data set and mode: accuracy against the label, a confusion matrix of label by engine
chosen, and ms per question; JSON in benchmarks/results/router_eval.json.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import shutil
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.retrieval_eval import RESULTS, _clean_env, machine  # noqa: E402

DATA = REPO.parent / "shared" / "eval-data"
MULTIHOP = DATA / "multihop-rag"
BENCH = DATA / "msgraphrag-benchmark"
ENGINES = ("basic", "local", "global")
# name -> (corpus, question file, label: "global", "not global" or None for unscored)
SETS: dict[str, tuple[str, str, str | None]] = {
    "multihop-rag": ("multihop", "MultiHopRAG.json", "not global"),
    "podcast": ("podcast", "kevin_scott_questions.csv", "global"),
    "earnings": ("earnings", "msft_multi_transcript_questions.csv", "global"),
    "earnings-single": ("earnings", "msft_single_transcript_questions.csv", None),
}
ZIPS = {"podcast": "kevin_scott_podcast_transcripts.zip",
        "earnings": "msft_earnings_transcripts.zip"}


def dev_questions(name: str) -> list[str]:
    """The DEV questions of one data set (the held-out part is filtered out as it is read)."""
    from canopy.server.evaluation import split_of

    _, file, _ = SETS[name]
    if name == "multihop-rag":
        rows = json.loads((MULTIHOP / file).read_text(encoding="utf-8"))
        texts = [str(q["query"]) for q in rows]
    else:
        with (BENCH / file).open(encoding="utf-8-sig", newline="") as fh:
            texts = [r["question_text"].strip() for r in csv.DictReader(fh)]
    return [q for q in texts if q and split_of(q) == "dev"]


def corpus_index(corpus: str, work: Path) -> tuple[Path, Path]:
    """(docs, index) of a corpus under `work`, written and indexed with the builtin provider
    when missing."""
    from canopy.server.runtime import build_index, open_workspace

    docs, index = work / f"{corpus}-docs", work / f"{corpus}-idx"
    if not docs.is_dir():
        docs.mkdir(parents=True)
        if corpus == "multihop":
            from benchmarks.incremental_bench import write_articles

            write_articles(docs, json.loads((MULTIHOP / "corpus.json").read_text("utf-8")))
        else:
            with zipfile.ZipFile(BENCH / ZIPS[corpus]) as z:
                for info in z.infolist():
                    if not info.is_dir():
                        (docs / Path(info.filename).name).write_bytes(z.read(info))
    if not (index / "canopy.sqlite").exists():
        print(f"indexing {corpus} into {index} …", file=sys.stderr)
        t0 = time.perf_counter()
        build_index(open_workspace(docs, index_dir=index), full=True)
        print(f"  {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return docs, index


def route_all(ctx: Any, questions: list[str]) -> tuple[list[str], float]:
    """The engine chosen for each question, and ms per question."""
    from canopy.server.engines.router import choose_route

    async def all_routes() -> list[str]:
        return [(await choose_route(ctx, q)).engine for q in questions]

    t0 = time.perf_counter()
    engines = asyncio.run(all_routes())
    return engines, (time.perf_counter() - t0) * 1000 / max(1, len(questions))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=None,
                    help="folder for the corpora and their indexes (reused when present); "
                         "default: a temp folder, removed afterwards")
    ap.add_argument("--modes", default="offline,fake-llm", help="offline, fake-llm or both")
    ap.add_argument("--sets", default=",".join(SETS), help="comma-separated subset of "
                    + ", ".join(SETS))
    ap.add_argument("--out", type=Path, default=RESULTS / "router_eval.json")
    args = ap.parse_args()
    _clean_env()
    from canopy.llm import ChatClient
    from canopy.providers.llm import LLMProvider
    from canopy.server.context import QueryContext
    from canopy.server.runtime import open_workspace
    from canopy.server.service import CanopyService
    from canopy.settings import LLMSettings
    from tests.fakes.openai_server import FakeOpenAI

    modes = [m for m in args.modes.split(",") if m]
    work = args.work or Path(tempfile.mkdtemp(prefix="canopy-router-"))
    out: dict[str, Any] = {"machine": machine(), "sets": {}}
    fake = FakeOpenAI().start() if "fake-llm" in modes else None
    try:
        for name in [s for s in args.sets.split(",") if s]:
            corpus, _, label = SETS[name]
            questions = dev_questions(name)
            docs, index = corpus_index(corpus, work)
            service = CanopyService(open_workspace(docs, index_dir=index))
            try:
                with service.context(None) as ctx:
                    for mode in modes:
                        routed_ctx = ctx
                        if mode == "fake-llm" and fake is not None:
                            client = ChatClient(LLMSettings(base_url=fake.base_url,
                                                            model="fake"))
                            routed_ctx = QueryContext(ctx.reader, LLMProvider(client),
                                                      ctx.settings)
                        engines, ms = route_all(routed_ctx, questions)
                        out["sets"].setdefault(name, {})[mode] = _summary(
                            questions, engines, label, ms)
                        print(f"{name}/{mode}: done", file=sys.stderr)
            finally:
                service.close()
    finally:
        if fake is not None:
            fake.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    _print(out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2), encoding="utf-8")


def _summary(questions: list[str], engines: list[str], label: str | None,
             ms: float) -> dict[str, Any]:
    chosen = Counter(engines)
    right = None
    if label is not None:
        right = sum((e == "global") == (label == "global") for e in engines)
    wrong = [q for q, e in zip(questions, engines, strict=True)
             if label is not None and (e == "global") != (label == "global")]
    return {"questions": len(questions), "label": label,
            "accuracy": None if right is None else round(right / len(questions), 4),
            "routed": {e: chosen.get(e, 0) for e in ENGINES}, "ms_per_question": round(ms, 1),
            "misrouted": wrong}


def _print(out: dict[str, Any]) -> None:
    print("| data set | mode | DEV questions | label | accuracy | -> basic | -> local "
          "| -> global | ms/question |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, modes in out["sets"].items():
        for mode, s in modes.items():
            acc = "-" if s["accuracy"] is None else f"{s['accuracy']:.3f}"
            r = s["routed"]
            print(f"| {name} | {mode} | {s['questions']} | {s['label'] or '(unscored)'} | {acc} "
                  f"| {r['basic']} | {r['local']} | {r['global']} | {s['ms_per_question']} |")
    for mode in sorted({m for modes in out["sets"].values() for m in modes}):
        rows = {"global": Counter(), "not global": Counter()}
        for modes in out["sets"].values():
            s = modes.get(mode)
            if s is not None and s["label"] is not None:
                rows[s["label"]].update(s["routed"])
        print(f"\nConfusion matrix, scored sets, {mode}:\n")
        print("| label \\ routed to | basic | local | global | accuracy |")
        print("|---|---|---|---|---|")
        for label, row in rows.items():
            n = sum(row.values())
            good = row["global"] if label == "global" else n - row["global"]
            acc = f"{good / n:.3f}" if n else "-"
            print(f"| {label} | {row['basic']} | {row['local']} | {row['global']} | {acc} |")
    for name, modes in out["sets"].items():
        for mode, s in modes.items():
            if s["misrouted"]:
                print(f"\n{name}/{mode}, misrouted ({len(s['misrouted'])}):")
                for q in s["misrouted"][:10]:
                    print(f"- {q}")


if __name__ == "__main__":
    main()
