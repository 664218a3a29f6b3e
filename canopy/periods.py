"""Time windows and periods over document times (issue 31, "Time"): what `since` / `until`
mean, and how a span of dates is cut into periods for questions about change.

Document and unit times are ISO dates (canopy.indexer.doc_time), so comparing them is comparing
strings. Pure: no I/O.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass

from canopy.errors import InvalidArgument

__all__ = ["GRANULARITIES", "MAX_PERIODS", "TimeWindow", "period_granularity", "period_of",
           "time_window"]

_PARTIAL = re.compile(r"^(\d{4})(?:-(\d{2})(?:-(\d{2}))?)?$")


@dataclass(frozen=True)
class TimeWindow:
    """Dates from `since` to `until`, both included (ISO dates; None = open on that side)."""

    since: str | None = None
    until: str | None = None

    def holds(self, when: str) -> bool:
        """Whether a time falls in the window; an unknown time ("") falls in no window."""
        if not when:
            return False
        day = when[:10]
        return (self.since is None or day >= self.since) and (
            self.until is None or day <= self.until)

    def label(self) -> str:
        return f"{self.since or '…'} to {self.until or '…'}"


def _bound(name: str, value: str, *, end: bool) -> str:
    """An ISO date, year-month or year as the first (or, with `end`, the last) day it names."""
    text = value.strip()
    m = _PARTIAL.match(text[:10]) if len(text) >= 4 else None
    if m is None:
        try:  # a date-time: its day
            return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).date().isoformat()
        except ValueError:
            raise InvalidArgument(
                f"{name} must be an ISO date (2023-10-06), a month (2023-10) or a year (2023), "
                f"not {value[:40]!r}") from None
    year, month, day = int(m.group(1)), m.group(2), m.group(3)
    try:
        if day is not None:
            return dt.date(year, int(month or 1), int(day)).isoformat()
        if month is not None:
            last = calendar.monthrange(year, int(month))[1] if end else 1
            return dt.date(year, int(month), last).isoformat()
        return dt.date(year, 12, 31).isoformat() if end else dt.date(year, 1, 1).isoformat()
    except ValueError:
        raise InvalidArgument(f"{name} is not a calendar date: {value[:40]!r}") from None


def time_window(since: str | None, until: str | None) -> TimeWindow | None:
    """The window `since` / `until` name (a month or a year stands for all its days), None for
    no restriction; InvalidArgument for an unreadable bound or an empty window."""
    lo = _bound("since", since, end=False) if since else None
    hi = _bound("until", until, end=True) if until else None
    if lo is None and hi is None:
        return None
    if lo is not None and hi is not None and lo > hi:
        raise InvalidArgument(f"since ({since}) is after until ({until}): the window is empty")
    return TimeWindow(lo, hi)


GRANULARITIES = ("month", "quarter", "year", "decade")
MAX_PERIODS = 12  # periods a change question is answered in at most (one reduce each)


def period_of(when: str, granularity: str) -> str:
    """The period label of a time: "2023-10" (month), "2023-Q4", "2023" or "2020s"."""
    if granularity == "month":
        return when[:7]
    if granularity == "quarter":
        return f"{when[:4]}-Q{(int(when[5:7]) - 1) // 3 + 1}"
    if granularity == "year":
        return when[:4]
    return f"{when[:3]}0s"


def period_granularity(times: Iterable[str], max_periods: int = MAX_PERIODS) -> str:
    """The finest of GRANULARITIES that cuts `times` into at most `max_periods` periods
    (decades when none does)."""
    days = {t[:10] for t in times if t}
    for g in GRANULARITIES:
        if len({period_of(d, g) for d in days}) <= max_periods:
            return g
    return GRANULARITIES[-1]
