"""When a document is from: its time and where that time came from (issue 31, "Time").

A document's time is a calendar date (ISO `YYYY-MM-DD`), taken from the first of these that
gives one:
1. its front matter: the first date-valued field among `[time] front_matter_fields`
   (`date`, `published`, ... by default), in that order;
2. an explicit `[time]` rule of canopy.toml whose glob matches its path: a fixed date, or the
   date a pattern (named groups `year`, `month`, `day`) finds in the path;
3. a date its text states near its start (the first `[time] text_chars` characters), written
   as ISO (2023-10-06), month first ("October 6, 2023", "Oct. 6, 2023") or day first
   ("6 October 2023");
4. the file's modification time (UTC), the last resort.
The time of each text unit is its document's. Pure: plain values in, a `DocTime` out.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from dataclasses import dataclass

from wcmatch import glob as wcglob

from canopy.settings import TimeRule, TimeSettings

__all__ = ["SOURCES", "DocTime", "document_time", "parse_date", "stated_date"]

# Where a time came from: the values of DocTime.source before the colon.
SOURCES = ("front_matter", "rule", "text", "mtime")

# As the ACL rules' globs (canopy.acl.policy): `**` spans folders, dot files match.
_GLOB_FLAGS = wcglob.GLOBSTAR | wcglob.DOTGLOB | wcglob.FORCEUNIX

_MONTHS = {m.lower(): i for i, m in enumerate(
    ["January", "February", "March", "April", "May", "June", "July", "August", "September",
     "October", "November", "December"], 1)}
_MONTHS.update({name[:3]: i for name, i in list(_MONTHS.items())})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>[A-Za-z]{3,9})\.?"
_YEAR = r"(?P<year>(?:1[89]|2[01])\d\d)"  # 1800-2199: years documents are dated in
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_STATED = [
    re.compile(rf"\b{_YEAR}-(?P<mon>[01]\d)-(?P<day>[0-3]\d)\b"),
    re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b"),
    re.compile(rf"\b{_DAY}\s+{_MONTH},?\s+{_YEAR}\b"),
]


@dataclass(frozen=True)
class DocTime:
    """A document's date and its source: "front_matter:<field>", "rule:<glob>", "text" or
    "mtime" ("" and "" when not even a modification time is known)."""

    time: str
    source: str


def _date(year: int, month: int, day: int) -> dt.date | None:
    try:
        return dt.date(year, month, day)
    except ValueError:
        return None


def _month(word: str) -> int | None:
    return _MONTHS.get(word.lower().rstrip("."))


def _match_date(m: re.Match[str]) -> dt.date | None:
    groups = m.groupdict()
    month = int(groups["mon"]) if groups.get("mon") else _month(groups.get("month") or "")
    if month is None:
        return None
    return _date(int(groups["year"]), month, int(groups["day"]))


def stated_date(text: str) -> dt.date | None:
    """The first calendar date `text` states, in any of the written forms above."""
    found: list[tuple[int, dt.date]] = []
    for pattern in _STATED:
        for m in pattern.finditer(text):
            d = _match_date(m)
            if d is not None:
                found.append((m.start(), d))
                break
    return min(found)[1] if found else None


def parse_date(value: str) -> dt.date | None:
    """A date written as a whole value: ISO (a date, or a date-time whose day is kept), or one
    of the written forms of `stated_date` (front matter is rendered "October 6, 2023")."""
    value = value.strip()
    try:
        return dt.datetime.fromisoformat(value.replace("Z", "+00:00")).date()
    except ValueError:
        pass
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        pass
    return stated_date(value) if len(value) <= 40 else None


def _rule_date(rule: TimeRule, path: str) -> dt.date | None:
    if rule.date is not None:
        return rule.date
    if rule.pattern is None:
        return None
    m = re.search(rule.pattern, path)
    if m is None:
        return None
    groups = m.groupdict()
    try:
        year = int(groups["year"])
        month = int(groups.get("month") or 1)
        day = int(groups.get("day") or 1)
    except (KeyError, TypeError, ValueError):
        return None
    return _date(year, month, day)


def document_time(path: str, metadata: Iterable[tuple[str, str]], text: str,
                  mtime_ns: int, settings: TimeSettings) -> DocTime:
    """`path`'s time by the order in the module doc. `metadata` are the front-matter fields as
    the loader rendered them; `text` the document's text (after its front matter)."""
    fields = {k.lower(): v for k, v in metadata}
    for name in settings.front_matter_fields:
        value = fields.get(name.lower())
        d = parse_date(value) if value else None
        if d is not None:
            return DocTime(d.isoformat(), f"front_matter:{name}")
    for rule in settings.rules:
        if wcglob.globmatch(path, rule.glob, flags=_GLOB_FLAGS):
            d = _rule_date(rule, path)
            if d is not None:
                return DocTime(d.isoformat(), f"rule:{rule.glob}")
    if settings.text_chars:
        d = stated_date(text[:settings.text_chars])
        if d is not None:
            return DocTime(d.isoformat(), "text")
    if mtime_ns > 0:
        when = dt.datetime.fromtimestamp(mtime_ns / 1e9, tz=dt.UTC).date()
        return DocTime(when.isoformat(), "mtime")
    return DocTime("", "")
