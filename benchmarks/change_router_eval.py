"""Where the router's rule for questions about change fires (server/engines/change_questions.py),
on the DEV questions of benchmarks/router_eval.py's data sets (the other fifth is never read).

    python benchmarks/change_router_eval.py

The rule runs before every other routing signal and sends a question to global_search, so on
these sets the router's choice can move only on the questions it fires on: per set, how many
those are and how many of them are labelled something else than global (an upper bound on
what the rule can cost router_eval's accuracy). It reads no index: seconds, not minutes.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.router_eval import HELDOUT_SETS, SETS, dev_questions  # noqa: E402


def main() -> None:
    from canopy.server.engines.change_questions import change_question

    print(f"{'data set':16} {'DEV':>5} {'fires':>5} {'not global':>10}")
    for name in [*HELDOUT_SETS, *SETS]:
        questions = dev_questions(name)
        fired = [(q, label) for q, label in questions if change_question(q)]
        against = [(q, label) for q, label in fired if label not in (None, "global")]
        print(f"{name:16} {len(questions):5} {len(fired):5} {len(against):10}")
        for q, label in fired:
            print(f"    [{label}] {q[:110]}  <- {change_question(q)}")


if __name__ == "__main__":
    main()
