"""RFC 3339 timestamps, parsed for real: the `fresh` check must not trust a string that looks right.

RFC 3339 section 5.6:

    date-time = full-date "T" full-time
    full-time = partial-time time-offset
    time-offset = "Z" / time-numoffset            ; a timezone is required

"T" and "Z" may be lower case (section 5.6, NOTE). Leap seconds (second 60,
section 5.7) are accepted, as jsonschema-rs accepts them for `format:
date-time`, and read as the last microsecond of second 59 so that both layers
agree on what a valid timestamp is.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from typing import Final

# ASCII digits only: Python's \d also matches other scripts' digits.
_DATE_TIME: Final = re.compile(
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})[Tt]"
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})(?:\.(?P<fraction>[0-9]{1,9}))?"
    r"(?:(?P<utc>[Zz])|(?P<sign>[+-])(?P<off_hour>[0-9]{2}):(?P<off_minute>[0-9]{2}))"
)


def parse_rfc3339(text: str) -> datetime:
    """Return an aware UTC datetime, or raise ValueError saying why ``text`` is not one."""
    match = _DATE_TIME.fullmatch(text)
    if match is None:
        raise ValueError("not an RFC 3339 date-time with a timezone")
    g = match.groupdict()
    second = int(g["second"])
    if second > 60:
        raise ValueError("second out of range")
    fraction = (g["fraction"] or "").ljust(6, "0")[:6]
    microsecond = 999_999 if second == 60 else int(fraction)
    offset = timedelta(0)
    if not g["utc"]:
        off_hour, off_minute = int(g["off_hour"]), int(g["off_minute"])
        if off_hour > 23 or off_minute > 59:
            raise ValueError("timezone offset out of range")
        offset = timedelta(hours=off_hour, minutes=off_minute)
        if g["sign"] == "-":
            offset = -offset
    try:
        moment = datetime(
            int(g["year"]), int(g["month"]), int(g["day"]),
            int(g["hour"]), int(g["minute"]), min(second, 59), microsecond,
            tzinfo=timezone(offset),
        )
    except ValueError as exc:  # month 13, day 45, hour 99...
        raise ValueError(f"not a real date or time: {exc}") from exc
    return moment.astimezone(timezone.utc)


def format_rfc3339(moment: datetime) -> str:
    """The canonical form used in audit records: UTC, 'Z', microseconds only when present."""
    text = moment.astimezone(timezone.utc).isoformat()
    return text.replace("+00:00", "Z")
