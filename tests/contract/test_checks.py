"""Semantic checks, tested apart from the schema: structurally valid results that are wrong."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sshadapter.contract.rfc3339 import format_rfc3339, parse_rfc3339
from sshadapter.contract.semantic import Checks, Fresh, run_checks
from sshadapter.errors import EvidenceError

NOW = datetime(2026, 11, 30, 4, 12, tzinfo=UTC)
CHECKS = Checks(
    equal={"project_id": "project_id"},
    fresh=Fresh(field="observed_at", max_age_seconds=300, max_skew_seconds=30),
)
GOOD = {
    "project_id": "bluebird",
    "run_id": "run_8fK2mQ9xLp3a",
    "state": "failed",
    "observed_at": "2026-11-30T04:10:00Z",
}
ARGS: dict[str, object] = {"project_id": "bluebird"}


def reason(value: dict[str, object], args: dict[str, object] = ARGS) -> str:
    with pytest.raises(EvidenceError) as info:
        run_checks(CHECKS, value, args, NOW)
    assert info.value.stage == "semantic"
    return info.value.reason


def test_matching_recent_result_passes() -> None:
    """The right project, observed two minutes ago: no complaint."""
    run_checks(CHECKS, GOOD, ARGS, NOW)


def test_wrong_project_fails_equal() -> None:
    """A valid result for copperhead does not answer a question about bluebird."""
    assert reason({**GOOD, "project_id": "copperhead"}) == "not_equal"


def test_equal_is_type_strict() -> None:
    """1 == True and 1 == 1.0 in Python, but an id of the wrong type is not the same id."""
    checks = Checks(equal={"n": "n"})
    for got, want in [(True, 1), (1.0, 1), ("1", 1)]:
        with pytest.raises(EvidenceError):
            run_checks(checks, {"n": got}, {"n": want}, NOW)


def test_old_timestamp_fails_freshness() -> None:
    """A well-formed timestamp an hour old is stale evidence."""
    assert reason({**GOOD, "observed_at": "2026-11-30T03:12:00Z"}) == "timestamp_stale"


def test_future_timestamp_beyond_skew_fails() -> None:
    """A timestamp 5 minutes ahead is not clock skew."""
    assert reason({**GOOD, "observed_at": "2026-11-30T04:17:00Z"}) == "timestamp_future"


def test_future_timestamp_within_skew_passes() -> None:
    """20 seconds ahead is within the 30 s skew allowance."""
    run_checks(CHECKS, {**GOOD, "observed_at": "2026-11-30T04:12:20Z"}, ARGS, NOW)


def test_offsets_are_compared_as_instants() -> None:
    """05:10+01:00 is 04:10Z: fresh, not an hour in the future."""
    run_checks(CHECKS, {**GOOD, "observed_at": "2026-11-30T05:10:00+01:00"}, ARGS, NOW)


def test_timestamp_without_timezone_is_invalid() -> None:
    """RFC 3339 requires an offset: a local time could be anything."""
    assert reason({**GOOD, "observed_at": "2026-11-30T04:10:00"}) == "timestamp_invalid"


@pytest.mark.parametrize(
    "text",
    [
        "2026-13-45T99:99:99Z",
        "2026-02-30T00:00:00Z",
        "2026-11-30 04:10:00Z",
        "2026-11-30T04:10:00+24:00",
        "\uff12\uff10\uff12\uff16-11-30T04:10:00Z",
        "2026-11-30T04:10:61Z",
        "2026-11-30T12:59:60Z",
        "0000-01-01T00:00:00Z",
        "",
    ],
)
def test_rfc3339_parser_rejects_impossible_or_sloppy_times(text: str) -> None:
    """Things that look like timestamps but are not RFC 3339 date-times are refused."""
    with pytest.raises(ValueError):
        parse_rfc3339(text)


def test_rfc3339_parser_accepts_rfc_forms() -> None:
    """Fractions, offsets, lower-case t/z and a leap second all parse to UTC instants."""
    assert parse_rfc3339("2026-11-30T04:10:00.5Z").microsecond == 500000
    assert parse_rfc3339("2026-11-30t05:10:00+01:00") == datetime(2026, 11, 30, 4, 10, tzinfo=UTC)
    assert parse_rfc3339("2016-12-31T23:59:60Z").second == 59


@given(
    st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
    )
)
def test_rfc3339_round_trips(moment: datetime) -> None:
    """Formatting then parsing gives the same instant."""
    assert parse_rfc3339(format_rfc3339(moment)) == moment


@given(
    st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
    st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59),
)
def test_rfc3339_offset_is_the_converted_instant(local: datetime, minutes: int) -> None:
    """Reading the local time as UTC less the offset is the instant its own timezone gives."""
    sign = "-" if minutes < 0 else "+"
    hours, mins = divmod(abs(minutes), 60)
    text = local.isoformat(timespec="microseconds") + f"{sign}{hours:02d}:{mins:02d}"
    expected = local.replace(tzinfo=timezone(timedelta(minutes=minutes))).astimezone(UTC)
    parsed = parse_rfc3339(text)
    assert parsed == expected
    assert parsed.tzinfo is UTC


@pytest.mark.parametrize("text", ["0001-01-01T00:30:00+01:00", "9999-12-31T23:59:00-01:00"])
def test_rfc3339_instant_outside_datetime_range_is_refused(text: str) -> None:
    """A valid timestamp whose UTC instant Python cannot hold is refused, never wrapped."""
    with pytest.raises(ValueError, match="outside the range of comparable times"):
        parse_rfc3339(text)
