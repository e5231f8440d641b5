"""Semantic checks: tie a schema-valid result to the request and to the clock.

A schema cannot know which project the agent asked about or what time it is
(docs/protocol.md "Stages", 9). These checks run after the schema, on the
parsed value, and fail with stage ``semantic``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field

from sshadapter.contract.rfc3339 import parse_rfc3339
from sshadapter.errors import EvidenceError

DEFAULT_MAX_SKEW_SECONDS: Final = 30  # clocks of two NTP-synced hosts agree far better than this


class Fresh(BaseModel):
    """The result carries an observation time that must be recent and not in the future."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    field: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    """Top-level result field holding an RFC 3339 timestamp."""
    max_age_seconds: int = Field(gt=0, le=366 * 24 * 3600)
    """Older than this and the fact is stale."""
    max_skew_seconds: int = Field(default=DEFAULT_MAX_SKEW_SECONDS, ge=0, le=3600)
    """How far in the future a timestamp may be before it is a lie rather than clock skew."""


class Checks(BaseModel):
    """The `[checks]` table of a command file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    equal: dict[str, str] = {}
    """Result field -> argument name: the value must equal the argument, type included."""
    fresh: Fresh | None = None


def run_checks(checks: Checks, value: Any, args: Mapping[str, Any], now: datetime) -> None:
    """Raise EvidenceError(stage="semantic") on the first failed check."""
    if not checks.equal and checks.fresh is None:
        return
    if not isinstance(value, dict):  # the schema makes this impossible for declared checks
        raise EvidenceError("semantic", "not_equal", "result is not an object")
    for field, param in checks.equal.items():
        got = value.get(field)
        want = args.get(param)
        # type() too: 1 == True and 1 == 1.0 in Python, but not for this contract.
        if got != want or type(got) is not type(want):
            raise EvidenceError(
                "semantic",
                "not_equal",
                f"result field {field!r} does not equal argument {param!r}",
                instance_path=f"/{field}",
            )
    if checks.fresh is not None:
        _check_fresh(checks.fresh, value.get(checks.fresh.field), now)


def _check_fresh(fresh: Fresh, raw: Any, now: datetime) -> None:
    path = f"/{fresh.field}"
    if not isinstance(raw, str):
        raise EvidenceError("semantic", "timestamp_invalid", "not a string", instance_path=path)
    try:
        observed = parse_rfc3339(raw)
    except ValueError as exc:
        raise EvidenceError("semantic", "timestamp_invalid", str(exc), instance_path=path) from exc
    if observed > now + timedelta(seconds=fresh.max_skew_seconds):
        raise EvidenceError(
            "semantic",
            "timestamp_future",
            f"{fresh.field} is {(observed - now).total_seconds():.0f}s in the future "
            f"(skew allowed {fresh.max_skew_seconds}s)",
            instance_path=path,
        )
    age = (now - observed).total_seconds()
    if age > fresh.max_age_seconds:
        raise EvidenceError(
            "semantic",
            "timestamp_stale",
            f"{fresh.field} is {age:.0f}s old (max {fresh.max_age_seconds}s)",
            instance_path=path,
        )
