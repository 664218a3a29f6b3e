"""Global search for questions about change (issue 31, "Time"): the selected communities' evidence
cut into periods, one map per period, one reduce per period, the answer in time order.

A community's evidence in a period is the text units of its report that date from the period
(their documents' times, canopy.indexer.doc_time), most on the question first: each becomes a
finding of a period report (its document's title and date, an excerpt), so what the map reads
for a period comes from that period only, and every point cites units of one period. The
periods are the finest of months, quarters, years or decades that cuts the span into at most
`canopy.periods.MAX_PERIODS`. Everything here runs after the permission and window filters: a
unit the caller may not read, or outside the window, is never dated, counted or cited.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from canopy.model import Document, Finding, Report, TextUnit
from canopy.periods import period_granularity, period_of
from canopy.providers.base import MapPoint
from canopy.providers.builtin.text import terms
from canopy.server.results import Citation

__all__ = ["PERIOD_POINTS", "PERIOD_REPORTS_CITED", "PERIOD_UNITS",
           "PERIOD_UNITS_CITED", "UNIT_EXCERPT_TOKENS",
           "PeriodEvidence", "period_citations", "period_evidence"]

PERIOD_UNITS = 3  # a community's units read per period at most, most on the question first
PERIOD_POINTS = 5  # points a period's reduce reads at most (every period gets its share)
PERIOD_REPORTS_CITED = 3  # reports a period cites at most
PERIOD_UNITS_CITED = 4  # units a period cites at most, taken from its cited reports in turn
UNIT_EXCERPT_TOKENS = 100  # each unit's excerpt in a period report

Excerpt = Callable[[TextUnit, Document], str]


@dataclass
class PeriodEvidence:
    """The selected communities' evidence by period, earliest first."""

    granularity: str
    reports: dict[str, list[Report]]  # period -> its period reports (community ids kept)
    documents: dict[str, tuple[str, str]]  # unit id -> (document path, title)

    @property
    def periods(self) -> list[str]:
        return sorted(self.reports)


def period_evidence(query: str, reports: list[Report], units: dict[str, tuple[TextUnit, Document]],
                    excerpt: Excerpt) -> PeriodEvidence:
    """Period reports of `reports` over `units` (the servable, in-window units of those reports,
    with their documents): per period, each community's units of that period, at most
    PERIOD_UNITS, ranked by how many of the question's terms each states (ties: earliest,
    then id). A unit is read once per period: by the best-rated community holding it (the
    narrower one at equal ratings), so nested or overlapping communities do not repeat it."""
    wanted = set(terms(query))
    granularity = period_granularity(doc.time for _, doc in units.values())
    by_period: dict[str, list[Report]] = defaultdict(list)
    used: set[str] = set()
    for report in sorted(reports, key=lambda r: (-r.rating, -r.level, r.community_id)):
        own = {u for f in report.findings for u in f.text_unit_ids} | set(report.text_unit_ids)
        grouped: dict[str, list[str]] = defaultdict(list)
        for u in sorted(own - used):
            if u in units and units[u][1].time:
                grouped[period_of(units[u][1].time, granularity)].append(u)
        for period, ids in grouped.items():
            ranked = sorted(ids, key=lambda u: (
                -len(wanted & set(terms(f"{units[u][1].title}\n{units[u][0].text}"))),
                units[u][1].time, u))[:PERIOD_UNITS]
            used.update(ranked)
            findings = tuple(
                Finding(summary=f"{units[u][1].title} ({units[u][1].time})",
                        explanation=excerpt(*units[u]), text_unit_ids=(u,)) for u in ranked)
            by_period[period].append(Report(
                community_id=report.community_id, level=report.level,
                title=f"{report.title} ({period})", summary="", rating=report.rating,
                rating_explanation="", findings=findings, text_unit_ids=tuple(ranked),
                fingerprint=report.fingerprint))
    documents = {u: (doc.path, doc.title) for u, (_, doc) in units.items()}
    return PeriodEvidence(granularity, dict(by_period), documents)


def period_citations(period: str, points: list[MapPoint], evidence: PeriodEvidence
                     ) -> list[Citation]:
    """What the kept points of one period cite: their reports (PERIOD_REPORTS_CITED at most),
    then the period's units behind those reports, one report's at a time in turn
    (PERIOD_UNITS_CITED at most), all marked with the period."""
    reports = {r.community_id: r for r in evidence.reports.get(period, [])}
    cited = [rid for rid in dict.fromkeys(i for p in points for i in p.report_ids)
             if rid in reports][:PERIOD_REPORTS_CITED]
    out = [Citation(kind="report", id=rid, title=reports[rid].title, period=period)
           for rid in cited]
    turns = [reports[rid].text_unit_ids for rid in cited]
    units = list(dict.fromkeys(u for rank in range(PERIOD_UNITS) for ids in turns
                               for u in ids[rank:rank + 1]))[:PERIOD_UNITS_CITED]
    for u in units:
        path, title = evidence.documents[u]
        out.append(Citation(kind="text_unit", id=u, title=title, document=path, period=period))
    return out
