"""How far `canopy index --estimate` is from the build it estimates (issue "Ecosystem", item 6).

For each corpus: the estimate (the real pipeline on a sample of the units, scaled by units), then
the real full build, both against the suite's fake OpenAI-compatible server at zero latency, in
this process. Prints, per task, estimated and real calls and tokens and the relative error.

    python benchmarks/estimate_bench.py                       # carol + 100 MultiHop-RAG articles
    python benchmarks/estimate_bench.py --articles 300 --sample 60

The fake answers deterministically from the prompt (entities are the text's capitalised words),
so the error measures the scaling, not a model's variance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.index_bench import CAROL_DIR, RESULTS, materialize_multihop  # noqa: E402
from canopy.server.estimate import estimate_build  # noqa: E402
from canopy.server.runtime import build_index, open_workspace  # noqa: E402
from tests.fakes.openai_server import FakeOpenAI  # noqa: E402

FAKE_LLM = {"max_retries": 2, "backoff_s": 0.01}


def one(name: str, docs: Path, sample: int, base_url: str, work: Path) -> dict[str, Any]:
    ws = open_workspace(docs, index_dir=work / f"{name}-index",
                        llm={"base_url": base_url, **FAKE_LLM})
    t0 = time.perf_counter()
    est = estimate_build(ws, sample=sample)
    est_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    real = build_index(ws)
    build_s = time.perf_counter() - t0
    rows = []
    for t in est.tasks:
        u = real.usage.get(t.task, {})
        rows.append({"task": t.task,
                     **{f"est_{k}": getattr(t, k) for k in ("calls", "prompt_tokens",
                                                            "completion_tokens")},
                     **{f"real_{k}": int(u.get(k, 0)) for k in ("calls", "prompt_tokens",
                                                                "completion_tokens")}})
    total = {k: sum(r[k] for r in rows) for k in rows[0] if k != "task"} if rows else {}
    return {"corpus": name, "units": est.units, "sample_units": est.sample_units,
            "estimate_s": round(est_s, 1), "build_s": round(build_s, 1),
            "est_wall_s": est.wall_s, "tasks": rows, "total": total}


def err(est: float, real: float) -> str:
    return "-" if not real else f"{100 * (est - real) / real:+.0f}%"


def render(results: list[dict[str, Any]]) -> str:
    out = ["| corpus | task | calls est / real | error | prompt tokens est / real | error | "
           "completion tokens est / real | error |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for row in [*r["tasks"], {"task": "**total**", **r["total"]}]:
            cells = []
            for k in ("calls", "prompt_tokens", "completion_tokens"):
                e, a = row[f"est_{k}"], row[f"real_{k}"]
                cells += [f"{e:,} / {a:,}", err(e, a)]
            out.append(f"| {r['corpus']} ({r['sample_units']} of {r['units']} units) | "
                       f"{row['task']} | " + " | ".join(cells) + " |")
    out.append("")
    out.append("| corpus | estimate took s | build took s | estimated build wall s |")
    out.append("|---|---|---|---|")
    for r in results:
        out.append(f"| {r['corpus']} | {r['estimate_s']} | {r['build_s']} | {r['est_wall_s']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--articles", type=int, default=100, help="MultiHop-RAG articles")
    ap.add_argument("--sample", type=int, default=40, help="units the estimate builds")
    ap.add_argument("--corpus", choices=("carol", "multihop", "all"), default="all")
    ap.add_argument("--out", type=Path, default=RESULTS / "estimate_bench.json")
    args = ap.parse_args(argv)
    for key in [k for k in os.environ if k.startswith(("CANOPY_", "OPENAI_"))]:
        del os.environ[key]
    work = Path(tempfile.mkdtemp(prefix="canopy-estimate-bench-"))
    results = []
    try:
        corpora = []
        if args.corpus in ("carol", "all"):
            corpora.append(("A Christmas Carol", CAROL_DIR))
        if args.corpus in ("multihop", "all"):
            docs = work / "multihop"
            materialize_multihop(docs, args.articles)
            corpora.append((f"MultiHop-RAG {args.articles}", docs))
        with FakeOpenAI(latency=0.0) as fake:
            for name, docs in corpora:
                print(f"[estimate] {name}", file=sys.stderr, flush=True)
                results.append(one(name.split()[0].lower(), docs, args.sample, fake.base_url,
                                   work))
                results[-1]["corpus"] = name
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(render(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2), encoding="utf-8")
    print(f"\nJSON: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
