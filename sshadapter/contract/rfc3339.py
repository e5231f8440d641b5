"""RFC 3339 timestamps, parsed for real: the `fresh` check must not trust a string that looks right.

RFC 3339 section 5.6:

    date-time   = full-date "T" full-time
    full-time   = partial-time time-offset
    time-offset = "Z" / time-numoffset            ; a timezone is required
    time-secfrac = "." 1*DIGIT

"T" and "Z" may be lower case (section 5.6, NOTE). A leap second (second 60,
section 5.7) is valid only where it can occur: at 23:59:60 UTC.

``is_date_time`` is exactly what ``format: date-time`` accepts on the hot path
(jsonschema-rs); tests/contract/test_schema_agreement.py holds the two together, and
the pure-Python reference validator uses it too, so the schema layer has one
definition of a timestamp. ``parse_rfc3339`` additionally turns the value into
an instant for the freshness check; a leap second reads as the last
microsecond of second 59, and a valid timestamp outside Python's datetime
range (year 0000) is refused there as not comparable.
"""

from __future__ import annotations

import re
from calendar import isleap
from datetime import UTC, datetime, timedelta
from typing import Final

# ASCII digits only: Python's \d also matches other scripts' digits.
_DATE_TIME: Final = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]+))?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))"
)
_DAYS: Final = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
_LAST_MINUTE_OF_DAY: Final = 23 * 60 + 59


_FIELDS: Final = ("year", "month", "day", "hour", "minute", "second")


def _fields(text: str) -> tuple[tuple[int, ...], str | None, int]:
    """(year, month, day, hour, minute, second), the fraction's digits and the offset in
    minutes, or ValueError naming the broken part."""
    match = _DATE_TIME.fullmatch(text)
    if match is None:
        raise ValueError("not an RFC 3339 date-time with a timezone")
    numbers = tuple(map(int, match.group(*_FIELDS)))
    year, month, day, hour, minute, second = numbers
    if not 1 <= month <= 12:
        raise ValueError("month out of range")
    if not 1 <= day <= _DAYS[month - 1] + (month == 2 and isleap(year)):
        raise ValueError("day out of range for its month")
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError("time out of range")
    offset = 0
    if not match["utc"]:
        off_hour, off_minute = int(match["off_hour"]), int(match["off_minute"])
        if off_hour > 23 or off_minute > 59:
            raise ValueError("timezone offset out of range")
        offset = (off_hour * 60 + off_minute) * (-1 if match["sign"] == "-" else 1)
    if second == 60 and (hour * 60 + minute - offset) % 1440 != _LAST_MINUTE_OF_DAY:
        raise ValueError("a leap second is only 23:59:60 UTC")
    return numbers, match["fraction"], offset


def is_date_time(text: str) -> bool:
    """True when ``text`` is an RFC 3339 date-time (the schema's `format: date-time`)."""
    try:
        _fields(text)
    except ValueError:
        return False
    return True


def parse_rfc3339(text: str) -> datetime:
    """Return an aware UTC datetime, or raise ValueError saying why ``text`` is not one.

    The local time is read as UTC and the offset subtracted: the same instant as
    converting from its own timezone, without building one per call.
    """
    (year, month, day, hour, minute, second), fraction, offset = _fields(text)
    digits = (fraction or "")[:6].ljust(6, "0")
    micro = 999_999 if second == 60 else int(digits)
    try:
        moment = datetime(year, month, day, hour, minute, min(second, 59), micro, tzinfo=UTC)
        return moment - timedelta(minutes=offset) if offset else moment
    except (ValueError, OverflowError) as exc:  # year 0000, or 9999-12-31T23:59-01:00
        raise ValueError(f"outside the range of comparable times: {exc}") from exc


def format_rfc3339(moment: datetime) -> str:
    """The canonical form used in audit records: UTC, 'Z', microseconds only when present."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
