"""Routing accuracy of the `search` router (server/engines/router.py) on labelled questions.

    python benchmarks/router_eval.py                        # indexes in a temp folder (~3 min)
    python benchmarks/router_eval.py --work /tmp/router     # keep (or reuse) the indexes there
    python benchmarks/router_eval.py --modes offline        # the offline rules only

Data sets, each routed against a builtin index of its own corpus, DEV questions only
(canopy.server.wings.eval.retrieval.split_of: int(sha256(question), 16) % 5 != 0; the others
are never loaded). Two groups:

Held out, the rules were NOT written from these: benchmarks/data/router_heldout.jsonl, each
question labelled basic, local or global by hand by a rule written first (benchmarks/data/README.md
says how and by whom); scored three ways and as global against the rest:
- `carol`: A Christmas Carol (one file), questions written for this set;
- `dulce`: Operation Dulce (microsoft/graphrag's fixture), written ones and the fixture's queries;
- `medical`: GraphRAG-Bench's medical guides (one file), written ones and GraphRAG-Bench questions;
- `musique`: the 1,890 MuSiQue paragraphs (one `# title` file each), MuSiQue questions.

The rules were written from (and tuned on) these, labelled per set (global or not):
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

Printed per data set and mode: accuracy against the labels, the engines chosen and ms per
question; per group and mode a confusion matrix of label by engine chosen; the misrouted
questions. JSON in benchmarks/results/router_eval.json.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import re
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
HELDOUT = REPO / "benchmarks" / "data" / "router_heldout.jsonl"
ENGINES = ("basic", "local", "global")
HELD_OUT = "held out (rules not written from these)"
SEEN = "rules were written from these"
# Sets the rules were written from: name -> (corpus, question file, label of every question:
# "global", "not global" or None for unscored)
SETS: dict[str, tuple[str, str, str | None]] = {
    "multihop-rag": ("multihop", "MultiHopRAG.json", "not global"),
    "podcast": ("podcast", "kevin_scott_questions.csv", "global"),
    "earnings": ("earnings", "msft_multi_transcript_questions.csv", "global"),
    "earnings-single": ("earnings", "msft_single_transcript_questions.csv", None),
}
# Held-out sets (router_heldout.jsonl, a label per question), each named for its corpus
HELDOUT_SETS = ("carol", "dulce", "medical", "musique")
ZIPS = {"podcast": "kevin_scott_podcast_transcripts.zip",
        "earnings": "msft_earnings_transcripts.zip"}


def dev_questions(name: str) -> list[tuple[str, str | None]]:
    """(question, label) of the DEV questions of one data set, in file order (the other fifth
    is filtered out as it is read)."""
    from canopy.server.wings.eval.retrieval import split_of

    if name in HELDOUT_SETS:
        labelled = heldout_questions(name)
    else:
        _, file, label = SETS[name]
        if name == "multihop-rag":
            rows = json.loads((MULTIHOP / file).read_text(encoding="utf-8"))
            texts = [str(q["query"]) for q in rows]
        else:
            with (BENCH / file).open(encoding="utf-8-sig", newline="") as fh:
                texts = [r["question_text"].strip() for r in csv.DictReader(fh)]
        labelled = [(q, label) for q in texts if q]
    return [(q, label) for q, label in labelled if split_of(q) == "dev"]


def heldout_questions(corpus: str, path: Path = HELDOUT) -> list[tuple[str, str]]:
    """(question, label) of one corpus of the held-out set, all splits, in file order; a
    question given by id is read from the eval-data file its row names."""
    files: dict[str, dict[str, str]] = {}
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        row = json.loads(line) if line.strip() else None
        if row is None or row["corpus"] != corpus:
            continue
        if row["label"] not in ENGINES:
            raise ValueError(f"{path}: label {row['label']!r} is none of {ENGINES}")
        text = row.get("question")
        if text is None:
            source = row["from"]
            if source not in files:
                data = json.loads((DATA / source).read_text(encoding="utf-8"))
                files[source] = {str(q["id"]): str(q["question"]) for q in data}
            text = files[source][row["id"]]
        out.append((text.strip(), row["label"]))
    return out


def write_corpus(corpus: str, docs: Path) -> None:
    """The documents of `corpus` written into the empty folder `docs`."""
    if corpus == "multihop":
        from benchmarks.incremental_bench import write_articles

        write_articles(docs, json.loads((MULTIHOP / "corpus.json").read_text("utf-8")))
    elif corpus in ZIPS:
        with zipfile.ZipFile(BENCH / ZIPS[corpus]) as z:
            for info in z.infolist():
                if not info.is_dir():
                    (docs / Path(info.filename).name).write_bytes(z.read(info))
    elif corpus == "carol":
        shutil.copy(DATA / "books" / "christmas_carol_pg24022.txt", docs)
    elif corpus == "dulce":
        shutil.copy(DATA / "msgraphrag-fixtures" / "text" / "input" / "dulce.txt", docs)
    elif corpus == "medical":
        rows = json.loads((DATA / "graphrag-bench" / "medical_corpus.json").read_text("utf-8"))
        (docs / "medical.txt").write_text("\n\n".join(r["context"] for r in rows), "utf-8")
    elif corpus == "musique":
        paragraphs = json.loads((DATA / "multihop-qa" / "musique" /
                                 "musique_train_100_corpus.json").read_text("utf-8"))
        for i, p in enumerate(paragraphs):
            slug = re.sub(r"[^a-z0-9]+", "-", p["title"].lower()).strip("-")[:50]
            (docs / f"{i:04d}-{slug}.md").write_text(f"# {p['title']}\n\n{p['text']}", "utf-8")
    else:
        raise ValueError(f"unknown corpus {corpus!r}")


def corpus_index(corpus: str, work: Path) -> tuple[Path, Path]:
    """(docs, index) of a corpus under `work`, written and indexed with the builtin provider
    when missing."""
    from canopy.server.runtime import build_index, open_workspace

    docs, index = work / f"{corpus}-docs", work / f"{corpus}-idx"
    if not docs.is_dir():
        docs.mkdir(parents=True)
        write_corpus(corpus, docs)
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
    names = [*HELDOUT_SETS, *SETS]
    ap.add_argument("--sets", default=",".join(names), help="comma-separated subset of "
                    + ", ".join(names))
    ap.add_argument("--out", type=Path, default=RESULTS / "router_eval.json")
    args = ap.parse_args()
    _clean_env()
    from canopy.llm import ChatClient
    from canopy.providers.llm_provider import LLMProvider
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
            corpus = name if name in HELDOUT_SETS else SETS[name][0]
            labelled = dev_questions(name)
            questions = [q for q, _ in labelled]
            labels = [label for _, label in labelled]
            group = HELD_OUT if name in HELDOUT_SETS else SEEN
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
                            group, questions, engines, labels, ms)
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


def _right(label: str | None, engine: str) -> bool | None:
    """Whether `engine` is right for `label` (a set-wide "not global" accepts basic and local),
    None for an unscored question."""
    if label is None:
        return None
    return engine != "global" if label == "not global" else engine == label


def _summary(group: str, questions: list[str], engines: list[str], labels: list[str | None],
             ms: float) -> dict[str, Any]:
    pairs = list(zip(questions, engines, labels, strict=True))
    scored = [(q, e, lab) for q, e, lab in pairs if lab is not None]
    right = [q for q, e, lab in scored if _right(lab, e)]
    two_way = [q for q, e, lab in scored if (e == "global") == (lab == "global")]
    chosen = Counter(engines)
    confusion: dict[str, dict[str, int]] = {}
    for _, e, lab in scored:
        row = confusion.setdefault(str(lab), dict.fromkeys(ENGINES, 0))
        row[e] += 1
    return {"group": group, "questions": len(questions),
            "labels": dict(Counter("unscored" if lab is None else lab for lab in labels)),
            "accuracy": round(len(right) / len(scored), 4) if scored else None,
            "global_vs_rest": round(len(two_way) / len(scored), 4) if scored else None,
            "routed": {e: chosen.get(e, 0) for e in ENGINES}, "confusion": confusion,
            "ms_per_question": round(ms, 1),
            "misrouted": [{"question": q, "label": lab, "routed": e}
                          for q, e, lab in scored if not _right(lab, e)]}


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _print(out: dict[str, Any]) -> None:
    for group in (HELD_OUT, SEEN):
        sets = {name: modes for name, modes in out["sets"].items()
                if next(iter(modes.values()))["group"] == group}
        if not sets:
            continue
        print(f"\n{group[0].upper() + group[1:]}, DEV questions:\n")
        print("| data set | mode | questions | labels | accuracy | global vs rest | -> basic "
              "| -> local | -> global | ms/question |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, modes in sets.items():
            for mode, s in modes.items():
                labels = ", ".join(f"{n} {lab}" for lab, n in sorted(s["labels"].items()))
                r = s["routed"]
                print(f"| {name} | {mode} | {s['questions']} | {labels} | {_acc(s['accuracy'])} "
                      f"| {_acc(s['global_vs_rest'])} | {r['basic']} | {r['local']} "
                      f"| {r['global']} | {s['ms_per_question']} |")
        for mode in sorted({m for modes in sets.values() for m in modes}):
            rows: dict[str, Counter[str]] = {}
            for modes in sets.values():
                for label, row in modes.get(mode, {}).get("confusion", {}).items():
                    rows.setdefault(label, Counter()).update(row)
            if not rows:
                continue
            total = sum(sum(r.values()) for r in rows.values())
            good = sum(n for label, row in rows.items() for e, n in row.items()
                       if _right(label, e))
            two = sum(n for label, row in rows.items() for e, n in row.items()
                      if (e == "global") == (label == "global"))
            print(f"\nConfusion matrix, {group}, {mode} (accuracy {good}/{total} = "
                  f"{good / total:.3f}; global vs rest {two}/{total} = {two / total:.3f}):\n")
            print("| label \\ routed to | basic | local | global | right |")
            print("|---|---|---|---|---|")
            for label in sorted(rows, key=lambda x: (x not in ENGINES, x)):
                row = rows[label]
                n = sum(row.values())
                ok = sum(v for e, v in row.items() if _right(label, e))
                print(f"| {label} | {row['basic']} | {row['local']} | {row['global']} "
                      f"| {ok}/{n} |")
    for name, modes in out["sets"].items():
        for mode, s in modes.items():
            if s["misrouted"]:
                print(f"\n{name}/{mode}, misrouted ({len(s['misrouted'])}):")
                for m in s["misrouted"][:12]:
                    print(f"- [{m['label']} -> {m['routed']}] {m['question']}")


if __name__ == "__main__":
    main()
