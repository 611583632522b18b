"""Calendar dates a question names ("in June", "on 13 October 2023", "2023年5月", "2023-05-08"): a preference cue.

Unlike relative time words (cues.TimeRange), a named date is a preference, not a filter: the turn that answers
"What did Melanie paint in July 2023?" may have been said in the days after. English month names with a day or
year (or after in/on/..., as "may" alone is the verb), ISO and Chinese forms count; impossible dates do not. Pure
and linear: regexes over the normalized text, at most MAX_DATES cues.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from projections import shapes

__all__ = ["MAX_DATES", "TOLD_WITHIN_DAYS", "DateCue", "find_dates"]

MAX_DATES = 4
# A thing is told on the day it happened or in the days after ("last Saturday we ..."): an episode observed up to
# this many days after the named day (or month, or year) still matches it.
TOLD_WITHIN_DAYS = 7

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS |= {name.lower(): i for i, name in enumerate(calendar.month_abbr) if name}
_MONTHS["sept"] = 9
_MONTH = r"(?P<{g}>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_DAY = r"(?P<{g}>[12]\d|3[01]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"(?P<{g}>1[89]\d\d|2\d\d\d)"  # a year alone or with a month only: one of these, not a count ("march 5000")
# with a day and a month a year is unmistakable: any the calendar has (0001-9999)
_ANY_YEAR = r"(?P<{g}>000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d\d\d)"
_B, _E = r"(?<![\w])", r"(?![\w])"  # word edges (not inside "mayor", "2023rd", "12345")
_PREP = r"(?:in|on|during|since|until|till|before|after|of|from|by)\s+"


def _p(template: str) -> str:
    return (
        template.replace("{M}", _MONTH.format(g="m"))
        .replace("{D}", _DAY.format(g="d"))
        .replace("{Y}", _YEAR.format(g="y"))
        .replace("{AY}", _ANY_YEAR.format(g="y"))
    )


# most specific first; each pattern's match is removed from the text before the next looks (no double reading)
_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(_B + _p(t) + _E)
    for t in (
        r"{AY}-(?P<m>0[1-9]|1[0-2])-(?P<d>0[1-9]|[12]\d|3[01])",  # 2023-05-08
        r"{M}\s+{D},?\s+{AY}",  # October 13, 2023
        r"{D}\s+(?:of\s+)?{M},?\s+{AY}",  # 13 October 2023, 1 February, 2023
        r"{Y}-(?P<m>0[1-9]|1[0-2])",  # 2023-05
        r"{M},?\s+{Y}",  # July 2023
        r"{M}\s+{D}",  # May 23
        r"{D}\s+(?:of\s+)?{M}",  # 23 May, 23rd of May
        _PREP + r"(?:the\s+month\s+of\s+)?{M}",  # in June
        r"(?:in|during|of|since|until|before|after)\s+(?:the\s+year\s+)?{Y}",  # in 2023
    )
)
_ZH: tuple[re.Pattern[str], ...] = tuple(
    re.compile(_p(t))
    for t in (
        r"(?<!\d){AY}\s*年\s*(?P<m>1[0-2]|0?[1-9])\s*月\s*(?P<d>[12]\d|3[01]|0?[1-9])\s*[日号]",
        r"(?<!\d){Y}\s*年\s*(?P<m>1[0-2]|0?[1-9])\s*月",
        r"(?<![\d年])(?P<m>1[0-2]|0?[1-9])\s*月\s*(?P<d>[12]\d|3[01]|0?[1-9])\s*[日号]",
        r"(?<!\d){Y}\s*年",
        r"(?<![\d年个])(?P<m>1[0-2]|0?[1-9])\s*月份?",
    )
)


@dataclass(frozen=True)
class DateCue:
    """A named day, month or year: `year`, `month`, `day` (None: any), as written (`words`)."""

    words: str
    year: int | None = None
    month: int | None = None
    day: int | None = None

    def _on(self, d: date) -> bool:
        return (
            (self.year is None or d.year == self.year)
            and (self.month is None or d.month == self.month)
            and (self.day is None or d.day == self.day)
        )

    def matches(self, t: datetime, within_days: int = TOLD_WITHIN_DAYS) -> bool:
        """`t` falls on the named date, or at most `within_days` days after it (told after it happened)."""
        d = t.date()
        return any(self._on(d - timedelta(days=k)) for k in range(within_days + 1) if d.toordinal() > k)

    def as_dict(self) -> shapes.DateCueOut:
        return {"words": self.words, "year": self.year, "month": self.month, "day": self.day}


def _cue(m: re.Match[str]) -> DateCue | None:
    g = m.groupdict()
    month_raw = g.get("m")
    month = None if month_raw is None else (int(month_raw) if month_raw.isdigit() else _MONTHS[month_raw.lower()])
    year = int(g["y"]) if g.get("y") else None
    day = int(g["d"]) if g.get("d") else None
    if day is not None:  # a real day of that month (of any year when none is named: 29 February exists)
        last = calendar.monthrange(year or 2000, month or 1)[1]
        if day > last:
            return None
    return DateCue(re.sub(r"\s+", " ", m.group(0).strip()), year, month, day)


def find_dates(norm: str) -> tuple[DateCue, ...]:
    """The calendar dates `norm` (a lowercased, NFKC-normalized query) names, most specific first, deduplicated."""
    text = norm.lower()
    found: dict[tuple[int | None, int | None, int | None], DateCue] = {}
    for pattern in (*_PATTERNS, *_ZH):
        if not pattern.search(text):
            continue

        def take(m: re.Match[str]) -> str:
            cue = _cue(m)
            if cue is not None and len(found) < MAX_DATES:
                found.setdefault((cue.year, cue.month, cue.day), cue)
            return " " * len(m.group(0))  # read once: a shorter pattern cannot re-read part of it

        text = pattern.sub(take, text)
    return tuple(found.values())
