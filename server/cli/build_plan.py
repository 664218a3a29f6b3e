"""The plan of a build that calls an LLM, on stderr: one line before extraction (what it will
request), one once its first units are in (what the rest of the build is projected to cost,
and the time left), and the comparison in the run summary's last line (`calls_line`).

Plain lines whether or not stderr is a terminal: they are said once each, and a log keeps them.
Never stdout: `canopy index --json` prints its result there, and `canopy serve` its protocol.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from canopy.server.cli.common import duration

if TYPE_CHECKING:  # canopy.indexer.forecast imports the clustering code: only the build needs it
    from canopy.indexer.forecast import ExtractionPlan, PlanEvent, Projection

__all__ = ["PlanLines", "calls_line"]

# Tasks in pipeline order; any other task a provider reports follows in name order.
_ORDER = ("extract", "glean", "resolve", "summarize", "report")


@dataclass
class PlanLines:
    """A `PlanSink` (canopy.indexer.forecast) that prints each event as one line on stderr and keeps
    them for the run summary."""

    plan: ExtractionPlan | None = None
    projection: Projection | None = None
    lines: list[str] = field(default_factory=list)

    def __call__(self, event: PlanEvent) -> None:
        from canopy.indexer.forecast import ExtractionPlan

        if isinstance(event, ExtractionPlan):
            self.plan = event
            line = plan_line(event)
        else:
            self.projection = event
            line = projection_line(event)
        self.lines.append(line)
        print(line, file=sys.stderr, flush=True)

    def as_dict(self) -> dict[str, Any]:
        """For `canopy index --json`: what was planned and projected."""
        out: dict[str, Any] = {}
        if self.plan is not None:
            out["units"] = self.plan.units
            out["extract_calls"] = self.plan.extract_calls
            out["glean_calls"] = list(self.plan.glean_calls)
        if self.projection is not None:
            out["projected_calls"] = self.projection.calls
            out["projected_from_units"] = self.projection.sample_units
        return out


def plan_line(p: ExtractionPlan) -> str:
    low, high = p.glean_calls
    if not p.max_gleanings:
        glean, total = "no gleaning", f"{p.extract_calls:,}"
    elif low == high:
        glean = f"{low:,} gleaning calls (1 pass per unit)"
        total = f"{p.extract_calls + low:,}"
    else:
        glean = (f"{low:,} to {high:,} gleaning calls (up to {p.max_gleanings} passes per unit, "
                 "fewer when a pass finds nothing new)")
        total = f"{p.extract_calls + low:,} to {p.extract_calls + high:,}"
    return (f"plan: {p.units:,} text units to extract with {p.model}: {p.extract_calls:,} "
            f"extraction calls + {glean} = {total} requests; summaries and reports follow, "
            "projected once the first units are in")


def projection_line(p: Projection) -> str:
    c = p.calls
    parts = [f"{c.get('extract', 0):,} extraction", f"{c.get('glean', 0):,} gleaning",
             f"{c.get('resolve', 0):,} name-confirmation",  # canopy.aliases, one per unit at most
             f"{c.get('summarize', 0):,} summary", f"{c.get('report', 0):,} report"]
    eta = p.eta_s
    pace = (f"; at {p.rate:.1f} calls/s so far, extraction has about {duration(eta)} left "
            "(the later stages print their own time left)" if eta is not None
            else "; no request went out yet (answers from the cache), so no time left to say")
    rough = "" if p.fresh else (" (an update: summaries and reports also depend on the "
                                "committed graph, so this is rougher)")
    return (f"projection from the first {p.sample_units:,} of {p.units:,} units: about "
            + " + ".join(parts) + f" calls, about {p.total:,} in all{pace}{rough}")


def calls_line(usage: dict[str, dict[str, int]], plans: PlanLines | None = None) -> str:
    """The run summary's last line: the calls made, by task, beside what was planned and
    projected (so a user can compare)."""
    tasks = [t for t in _ORDER if t in usage] + sorted(t for t in usage if t not in _ORDER)
    made = sum(usage[t].get("calls", 0) for t in tasks)
    cached = sum(usage[t].get("cached", 0) for t in tasks)
    line = f"LLM calls {made:,}"
    if tasks:
        line += " by task: " + ", ".join(f"{t} {usage[t].get('calls', 0):,}" for t in tasks)
    if cached:
        line += f"; {cached:,} more answered from the cache"
    said = []
    if plans is not None and plans.plan is not None:
        p = plans.plan
        low, high = p.glean_calls
        glean = f"{low:,}" if low == high else f"{low:,}-{high:,}"
        said.append(f"planned: extract {p.extract_calls:,}, glean {glean}")
    if plans is not None and plans.projection is not None:
        said.append(f"projected: about {plans.projection.total:,} in all")
    return line + (f" ({'; '.join(said)})" if said else "")
