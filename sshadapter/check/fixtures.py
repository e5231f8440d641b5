"""Contract fixtures: recorded outputs beside each operation, with the envelope they must give.

Layout (docs/fixtures.md): ``commands/<tool>.fixtures/<case>.stdout``
(raw bytes), optional ``<case>.stderr``, and ``<case>.case.json``::

    {"args": {...}, "exit_status": 0, "now": "2026-11-30T04:12:00Z",
     "expect": {"outcome": "success", "data": {...}}}
    {"args": {...}, "exit_status": 0, "now": "...",
     "expect": {"outcome": "failure", "code": "INVALID_RESPONSE", "stage": "schema"}}

``stage`` and ``reason`` are optional in a failure expectation. ``now`` fixes
the clock for freshness checks, so a fixture gives the same answer forever.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from sshadapter.bounded_read import read_bounded
from sshadapter.catalog import listed_parameters
from sshadapter.contract.codes import CODES
from sshadapter.contract.commandfile import MAX_OUTPUT_BYTES
from sshadapter.contract.registry import Operation
from sshadapter.contract.rfc3339 import parse_rfc3339
from sshadapter.errors import STAGES, ConfigError, EvidenceError
from sshadapter.strict_json import StrictJSONError, strict_loads

# A case file holds the expected data of one output: at most as large as the largest output.
MAX_FIXTURE_BYTES: Final = MAX_OUTPUT_BYTES
# A recorded stdout or stderr: room for an output over the largest `max_bytes`, which a
# `too_large` case records, and no more.
MAX_RECORDED_BYTES: Final = 2 * MAX_OUTPUT_BYTES
_CASE_KEYS: Final = {"args", "exit_status", "now", "expect"}
_EXPECT_KEYS: Final = {
    "success": {"outcome", "data"},
    "failure": {"outcome", "code", "stage", "reason"},
}


@dataclass(frozen=True)
class Fixture:
    """One recorded attempt and what the contract must make of it."""

    tool: str
    case: str
    stdout: bytes
    stderr: bytes
    exit_status: int
    args: Mapping[str, Any]
    now: datetime
    expect: Mapping[str, Any]


def fixture_dir(op: Operation) -> Path:
    return op.file.with_name(f"{op.name}.fixtures")


def load_fixtures(op: Operation) -> list[Fixture]:
    """Every case of one operation, in name order; a malformed case is a ConfigError."""
    directory = fixture_dir(op)
    if not directory.is_dir():
        return []
    return [_load_case(op, path) for path in sorted(directory.glob("*.case.json"))]


def _load_case(op: Operation, path: Path) -> Fixture:
    file = str(path)
    case = path.name.removesuffix(".case.json")
    try:
        spec = strict_loads(
            read_bounded(path, MAX_FIXTURE_BYTES), max_bytes=MAX_FIXTURE_BYTES, max_depth=64
        )
    except StrictJSONError as exc:
        raise ConfigError(file, "", f"not strict JSON ({exc.reason}): {exc.detail}") from exc
    if not isinstance(spec, dict):
        raise ConfigError(file, "", "must be a JSON object")
    for key in sorted(spec.keys() - _CASE_KEYS):
        raise ConfigError(file, key, "unknown key")
    args = spec.get("args", {})
    if not isinstance(args, dict):
        raise ConfigError(file, "args", "must be an object")
    args = _listed_values(op, args)
    _check_args(op, file, args)
    exit_status = spec.get("exit_status", 0)
    if type(exit_status) is not int or not 0 <= exit_status <= 255:
        raise ConfigError(file, "exit_status", "must be an integer 0-255")
    try:
        now = parse_rfc3339(spec["now"])
    except KeyError:
        raise ConfigError(file, "now", "required key is missing") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(file, "now", f"not an RFC 3339 time: {exc}") from exc
    expect = _check_expect(file, spec.get("expect"))
    stdout_path = path.with_name(f"{case}.stdout")
    if not os.path.lexists(stdout_path):
        raise ConfigError(file, "", f"missing {stdout_path.name}")
    stdout = read_bounded(stdout_path, MAX_RECORDED_BYTES)
    stderr_path = path.with_name(f"{case}.stderr")  # optional: absent is empty
    stderr = read_bounded(stderr_path, MAX_RECORDED_BYTES) if os.path.lexists(stderr_path) else b""
    return Fixture(op.name, case, stdout, stderr, exit_status, args, now, expect)


def _listed_values(op: Operation, args: dict[str, Any]) -> dict[str, Any]:
    """A catalog case's argument for a parameter whose values the config lists (a unit, a
    certificate path: docs/fixtures.md "Catalog cases") becomes the first listed value: the
    shipped case cannot know the operator's list, and its output does not depend on it."""
    listed = {
        name: op.params_schema["properties"][name]["enum"][0]
        for name in listed_parameters(op.file)
        if name in args and "enum" in op.params_schema["properties"].get(name, {})
    }
    return {**args, **listed}


def _check_args(op: Operation, file: str, args: Mapping[str, Any]) -> None:
    """A fixture's arguments are ones an agent could send: they pass the parameter schema.

    Otherwise the fixture proves something about a call that can never happen
    (stage 3 refuses it before the command runs).
    """
    try:
        op.params_validator.validate(args)
    except EvidenceError as exc:  # the validator speaks of evidence; here the fixture is wrong
        where = ".".join(("args", *exc.instance_path.split("/")[1:]))
        raise ConfigError(file, where, f"fails the parameter schema: {exc.detail}") from exc


def _check_expect(file: str, expect: Any) -> Mapping[str, Any]:
    if not isinstance(expect, dict) or expect.get("outcome") not in _EXPECT_KEYS:
        raise ConfigError(file, "expect.outcome", "must be 'success' or 'failure'")
    for key in sorted(expect.keys() - _EXPECT_KEYS[expect["outcome"]]):
        raise ConfigError(file, f"expect.{key}", "unknown key")
    if expect["outcome"] == "success" and not isinstance(expect.get("data"), dict):
        raise ConfigError(file, "expect.data", "a success expects a `data` object")
    if expect["outcome"] == "failure":
        if expect.get("code") not in CODES:
            raise ConfigError(file, "expect.code", f"must be one of {', '.join(CODES)}")
        if "stage" in expect and expect["stage"] not in STAGES:
            raise ConfigError(file, "expect.stage", f"must be one of {', '.join(STAGES)}")
    return expect
