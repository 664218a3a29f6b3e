"""The update-composition property test's longer profile (issue 30; tests/compositions.py).

    python benchmarks/compositions_bench.py                        # 60 examples, seed 0
    python benchmarks/compositions_bench.py --examples 200 --seed 7 --max-steps 12
    python benchmarks/compositions_bench.py --out benchmarks/results/compositions.json

The default suite runs 6 derandomized examples of up to 7 steps plus two explicit ones
(tests/test_update_compositions.py, about 20 s). This runs `--examples` random ones of up to
`--max-steps` steps (edits, appends, renames, moves between folders, deletions, additions and
policy edits, built in random batch groupings), with Hypothesis's shrinking on, so a failure is
reported as the smallest composition that still fails. After every build each principal's
served units, entities, relationships, claims, reports and search hits must derive only from
units the policy lets it read (and every unit it may read is served), and the final index must
equal a fresh build of the final state, access classes and search rows included.

Prints the examples run, builds, artifacts checked, operations by kind, the time taken and the
failure (if any) with the composition Hypothesis shrank it to; exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.compositions import run_composition  # noqa: E402
from tests.conftest import offline_env  # noqa: E402
from tests.test_update_compositions import OPERATION  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=60)
    ap.add_argument("--max-steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    figures: dict[str, Any] = {"examples": 0, "builds": 0, "checked": 0, "claims": 0,
                               "operations": Counter(), "failure": None}
    steps = st.lists(st.tuples(OPERATION, st.integers(0, 2).map(lambda n: n == 0)),
                     min_size=1, max_size=args.max_steps)

    @seed(args.seed)
    @settings(max_examples=args.examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(corpus_seed=st.integers(0, 10_000), composition=steps)
    def prop(corpus_seed: int, composition: list[tuple[tuple[Any, ...], bool]]) -> None:
        root = Path(tempfile.mkdtemp(prefix="canopy-compose-"))
        try:
            out = run_composition(root, corpus_seed, composition)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        figures["examples"] += 1
        figures["builds"] += out.builds
        figures["checked"] += out.checked
        figures["claims"] += out.claims
        figures["operations"].update(op[0] for op, _ in composition)

    began = time.monotonic()
    failed = False
    with offline_env():
        try:
            prop()
        except Exception as exc:  # the shrunk failure: shown, and the run fails
            failed = True
            figures["failure"] = f"{type(exc).__name__}: {exc}"[:4000]
    figures["seconds"] = round(time.monotonic() - began, 1)
    figures["operations"] = dict(sorted(figures["operations"].items()))
    print(f"{figures['examples']} examples (hypothesis seed {args.seed}, up to {args.max_steps} "
          f"steps), {figures['builds']} builds, {figures['checked']:,} served artifacts checked, "
          f"{figures['claims']} claims in the final indexes, {figures['seconds']} s")
    print(f"operations: {figures['operations']}")
    print("failure: " + (figures["failure"] or "none"))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
