"""Dates of National Guideline Clearinghouse summaries: NGC's free-text ``date_released`` as ISO dated events.

NGC writes a guideline's whole history in one string ("2011 May (revised 2013 Aug)", "1998 (revised 2008;
reaffirmed 2013)"). :func:`parse_ngc_date` reads it strictly into :class:`DateEvent` items and
:func:`version_date` picks the date of the version a summary describes, which the guideline loader
(:func:`~omnimed.data.loaders.text_corpora.load_guideline`) uses as the passage date.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass

__all__ = ["DateEvent", "parse_ngc_date", "version_date"]

_MONTHS = {
    m: i
    for i, names in enumerate(
        (
            ("jan", "january"),
            ("feb", "february"),
            ("mar", "march"),
            ("apr", "april"),
            ("may",),
            ("jun", "june"),
            ("jul", "july"),
            ("aug", "august"),
            ("sep", "sept", "september"),
            ("oct", "october"),
            ("nov", "november"),
            ("dec", "december"),
        ),
        start=1,
    )
    for m in names
}
_MONTH = r"(?:" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
#: "2013", "2013 Nov", "2013 Nov 5", "2013 Oct-Dec" (a range keeps its first month), "Aug 2010"
_NGC_DATE = re.compile(
    rf"(?P<y>\d{{4}})(?:\s+(?P<m>{_MONTH})(?:\s*-\s*{_MONTH})?(?:\s+(?P<d>\d{{1,2}}))?)?"
    rf"|(?P<m2>{_MONTH})\s+(?P<y2>\d{{4}})",
    re.IGNORECASE,
)
#: events whose date is the date of the text's version (reaffirmed/addenda leave the summary as it was)
_VERSION_EVENTS = ("released", "revised", "updated")


@dataclass(frozen=True)
class DateEvent:
    """One dated event of a guideline's history, e.g. ``DateEvent("revised", "2013-08")``."""

    event: str
    date: str


def _iso_date(match: re.Match[str]) -> str | None:
    """ISO ``YYYY[-MM[-DD]]`` of one ``_NGC_DATE`` match; None for an impossible day such as Feb 30."""
    year = int(match["y"] or match["y2"])
    month_name = match["m"] or match["m2"]
    if month_name is None:
        return f"{year:04d}"
    month = _MONTHS[month_name.lower().rstrip(".")]
    if match["d"] is None:
        return f"{year:04d}-{month:02d}"
    try:
        return datetime.date(year, month, int(match["d"])).isoformat()
    except ValueError:
        return None


def _dates_in(clause: str) -> list[str]:
    """All dates in ``clause`` (``"2014 Jul 20 and 2016 May 10"``); empty if any part is not a date."""
    clause = clause.strip()
    pos, dates = 0, []
    for match in _NGC_DATE.finditer(clause):
        between = clause[pos : match.start()].strip(" ,")
        if between not in ("", "and"):
            return []
        iso = _iso_date(match)
        if iso is None:
            return []
        dates.append(iso)
        pos = match.end()
    return dates if clause[pos:].strip() == "" else []


def parse_ngc_date(raw: str) -> list[DateEvent] | None:
    """Parse an NGC ``date_released`` string into its dated events, strictly; None if the release date is unreadable.

    Handles "2013 Nov", "2013 Nov 5", "2014 Apr-Jun", "2011 May (revised 2013 Aug)",
    "1998 (revised 2008; reaffirmed 2013)", "2010 Aug 10; addenda released 2014 Jul 20 and 2016 May 10".
    Follow-up clauses that do not read as "<event words> <dates>" are left out (the raw string is kept by callers).
    """
    head, _, tail = raw.strip().partition("(")
    head, _, rest = head.partition(";")
    released = _dates_in(head)
    if len(released) != 1:
        return None
    events = [DateEvent("released", released[0])]
    clauses = re.split(r"[;()]", rest + ";" + tail)
    for clause in clauses:
        match = re.match(r"\s*([A-Za-z][A-Za-z ]*?)\s+(?=\d|" + _MONTH + r"\s+\d)", clause, re.IGNORECASE)
        if not match:
            continue
        event = match.group(1).lower()
        for iso in _dates_in(clause[match.end() :]):
            events.append(DateEvent(event, iso))
    return events


def version_date(events: list[DateEvent]) -> str:
    """The date of the version the summary describes: the latest release, revision or update."""
    return max((e.date for e in events if e.event in _VERSION_EVENTS), default=events[0].date)
