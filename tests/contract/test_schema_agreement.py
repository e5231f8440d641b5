"""jsonschema-rs (hot path) and jsonschema (reference) agree on every fixture and near-miss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sshadapter.check.fixtures import load_fixtures
from sshadapter.check.nearmiss import derive
from sshadapter.contract.registry import Operation, Registry, load_registry
from sshadapter.contract.rfc3339 import is_date_time
from sshadapter.errors import EvidenceError

ROOT = Path(__file__).resolve().parents[2]
REGISTRY: Registry = load_registry(ROOT / "commands", ROOT / "schemas", hosts=None)


def parsed_values(registry: Registry = REGISTRY) -> list[Any]:
    """Every parsed output of every fixture and near-miss (those that get past stage 7)."""
    cases = []
    for op in registry.operations.values():
        for fixture in load_fixtures(op):
            outputs = [("fixture", fixture.stdout)]
            if fixture.expect["outcome"] == "success":
                outputs += derive(op, fixture.stdout)
            for kind, stdout in outputs:
                try:
                    value = op.parser.parse(stdout)
                except EvidenceError:
                    continue
                cases.append(pytest.param(op, value, id=f"{op.name}-{fixture.case}-{kind}"))
    return cases


@pytest.mark.parametrize(("op", "value"), parsed_values())
def test_validators_agree(op: Operation, value: Any) -> None:
    """Both libraries give the same verdict on this parsed output."""
    assert_validators_agree(REGISTRY, op, value)


def assert_validators_agree(registry: Registry, op: Operation, value: Any) -> None:
    """jsonschema-rs (the daemon's) and the reference validator agree on ``value``."""
    reference = registry.schemas.reference_validator(op.schema.contents)
    assert op.output_validator.is_valid(value) == reference.is_valid(value)


HOT_DATE_TIME = jsonschema_rs.Draft202012Validator(
    {"type": "string", "format": "date-time"}, validate_formats=True
)

date_time_like = st.builds(
    "{:04d}-{:02d}-{:02d}{}{:02d}:{:02d}:{:02d}{}{}".format,
    st.integers(0, 9999),
    st.integers(0, 13),
    st.integers(0, 32),
    st.sampled_from("Tt "),
    st.integers(0, 25),
    st.integers(0, 61),
    st.integers(0, 61),
    st.sampled_from(["", ".5", ".123456789012", "."]),
    st.sampled_from(["Z", "z", "", "+01:00", "-01:00", "+23:59", "+24:00", "-00:30", "+00:60"]),
)


@settings(max_examples=3000)
@given(date_time_like | st.text(max_size=40))
def test_date_time_definitions_agree(text: str) -> None:
    """The project's RFC 3339 check accepts exactly what jsonschema-rs's date-time accepts."""
    assert is_date_time(text) == HOT_DATE_TIME.is_valid(text)


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        ("2024-12-31T23:59:60Z", True),  # a leap second where one can be
        ("2024-05-02T00:59:60+01:00", True),  # the same instant with an offset
        ("2024-05-01T12:59:60Z", False),  # not at the end of a UTC day
        ("2026-13-45T99:99:99Z", False),
    ],
)
def test_known_edge_cases(text: str, valid: bool) -> None:
    """Leap seconds: the case where jsonschema's default checker and jsonschema-rs disagreed."""
    assert is_date_time(text) is valid
    assert HOT_DATE_TIME.is_valid(text) is valid
