"""Claim fields checked against their source: ISO 8601 dates and verbatim quotes.

Edge et al. 2024 (§2.1.2) extract claims ("covariates") with a period and the quoted source text.
Models write dates in many shapes and sometimes paraphrase when asked to quote, so what they return
is normalised here before it is stored: a date that is not a real calendar date becomes "" (never
an error: one bad field must not cost the unit its extraction), and a quote is kept only when it
occurs in the unit's text after whitespace normalisation, so no tool ever shows a made-up quote.
Pure functions, no I/O.
"""

from __future__ import annotations

import datetime as dt
import re

from canopy.ids import normalize_name
from canopy.model import ClaimInstance

__all__ = ["STATUSES", "checked_claim", "claim_key", "claim_period", "dates_in", "iso_date",
           "period", "verified_quote"]

STATUSES = ("TRUE", "FALSE", "SUSPECTED")

_MONTHS = {m.lower(): i for i, m in enumerate(
    ["January", "February", "March", "April", "May", "June", "July", "August", "September",
     "October", "November", "December"], 1)}
_MONTHS.update({m[:3]: i for m, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"(?P<year>\d{4})"
_DAY = r"(?P<day>\d{1,2})(?:st|nd|rd|th)?"

# Whole-string forms a model returns for a date field. A time of day after the date (GraphRAG's
# own prompt asks for 2022-01-10T00:00:00) is dropped: a claim's period is a date range.
_NUMERIC = re.compile(r"(?P<year>\d{4})(?:[-/.](?P<month>\d{1,2})(?:[-/.](?P<day>\d{1,2}))?)?"
                      r"(?:[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?")
_WORDS = [re.compile(p, re.IGNORECASE) for p in (
    rf"{_MONTH}\s+{_DAY},?\s+{_YEAR}",  # January 10, 2022
    rf"{_DAY}\s+{_MONTH},?\s+{_YEAR}",  # 10 January 2022
    rf"{_MONTH},?\s+{_YEAR}",  # January 2022
)]
# Full dates inside running text (the builtin extractor): day precision only, so "in May" or a
# bare year are never read as a date.
_M = "(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_D = r"\d{1,2}(?:st|nd|rd|th)?"
_IN_TEXT = re.compile(
    rf"\b(?:\d{{4}}-\d{{2}}-\d{{2}}|{_M}\s+{_D},?\s+\d{{4}}|{_D}\s+{_M},?\s+\d{{4}})\b",
    re.IGNORECASE)
_RANGE = re.compile(r"\b(?:from|between)\s+(?P<a>.+?)\s+(?:to|until|till|through|and)\s+(?P<b>.+)",
                    re.IGNORECASE)


def _calendar(year: str, month: str | None, day: str | None) -> str:
    """"YYYY", "YYYY-MM" or "YYYY-MM-DD" (ISO 8601 at the precision given), "" if not a date."""
    y = int(year)
    if not 1 <= y <= 9999:
        return ""
    if month is None:
        return f"{y:04d}"
    m = int(month) if month.isdigit() else _MONTHS.get(month.lower().rstrip("."), 0)
    if not 1 <= m <= 12:
        return ""
    if day is None:
        return f"{y:04d}-{m:02d}"
    try:
        return dt.date(y, m, int(day)).isoformat()
    except ValueError:  # 2024-02-30
        return ""


def iso_date(raw: str) -> str:
    """A model's date field as an ISO 8601 date ("2022-01-10", or "2022-01" / "2022" when only
    that is given), or "" when it is empty, "NONE", "unknown" or not a real date."""
    text = " ".join(raw.split()).strip(" .")
    found = _NUMERIC.fullmatch(text)
    if found:
        return _calendar(found["year"], found["month"], found["day"])
    for pattern in _WORDS:
        found = pattern.fullmatch(text)
        if found:
            groups = found.groupdict()
            return _calendar(found["year"], found["month"], groups.get("day"))
    return ""


def period(start: str, end: str) -> tuple[str, str]:
    """Normalised (start, end); an end before its start is dropped (a range cannot run
    backwards, and which of the two is wrong is unknown, so the start is kept)."""
    a, b = iso_date(start), iso_date(end)
    if a and b and b < a[:len(b)]:
        b = ""
    return a, b


def dates_in(text: str) -> list[str]:
    """The full calendar dates (day precision) written in `text`, in order of appearance."""
    return [d for d in (iso_date(m.group()) for m in _IN_TEXT.finditer(text)) if d]


def claim_period(sentence: str) -> tuple[str, str]:
    """The period a sentence states, where it is unambiguous: one full date is a one-day period
    ("fined on 10 January 2022"); two are a range only when the sentence says so ("from ... to
    ...", "between ... and ..."). Anything else (several dates, or month or year precision only)
    gives ("", "") rather than a guess."""
    found = dates_in(sentence)
    if len(found) == 1:
        return found[0], found[0]
    span = _RANGE.search(sentence)
    if len(found) == 2 and span and dates_in(span["a"])[:1] == found[:1] \
            and dates_in(span["b"])[:1] == found[1:]:
        return period(found[0], found[1])
    return "", ""


_QUOTES = "\"'“”‘’«»„"


def _squash(text: str) -> str:
    return " ".join(text.split())


def verified_quote(quote: str, source: str) -> str:
    """`quote` with its whitespace collapsed when it occurs in `source` (whitespace collapsed
    too), else "". Quotation marks a model wraps around the quote are not part of it."""
    q = _squash(quote)
    if not q:
        return ""
    text = _squash(source)
    if q in text:
        return q
    inner = q.strip(_QUOTES).strip()
    return inner if inner and inner in text else ""


def checked_claim(subject: str, obj: str, type_: str, status: str, description: str,
                  start_date: str, end_date: str, quote: str, source: str) -> ClaimInstance:
    """A claim as a model wrote it, under these rules: type and status upper case (a status
    other than TRUE, FALSE or SUSPECTED is SUSPECTED), the period ISO 8601 or dropped
    (`period`), the quote kept only when `source`, the unit's text, states it."""
    status = status.strip().upper()
    start, end = period(start_date, end_date)
    return ClaimInstance(subject.strip(), obj.strip(), type_.strip().upper(),
                         status if status in STATUSES else "SUSPECTED", description.strip(),
                         start, end, verified_quote(quote, source))


def claim_key(claim: ClaimInstance) -> tuple[str, str, str, str]:
    """What makes two claims of one unit the same claim: subject, object, type, description."""
    return (normalize_name(claim.subject), normalize_name(claim.object), claim.type,
            normalize_name(claim.description))
