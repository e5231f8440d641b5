"""Fixture files: every mistake in a case file is a ConfigError naming the file, the key, why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from sshadapter.check.fixtures import load_fixtures
from sshadapter.contract.registry import load_registry
from sshadapter.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
TOOL = "load_average"
EXPECT: dict[str, Any] = {"outcome": "failure", "code": "INVALID_RESPONSE"}
GOOD: dict[str, Any] = {
    "args": {},
    "exit_status": 0,
    "now": "2026-11-30T04:12:00Z",
    "expect": EXPECT,
}


def case_error(tmp_path: Path, case: Any, *, stdout: bool = True) -> ConfigError:
    """Load the shipped load_average with one extra case; the error it raises."""
    for name in ("commands", "schemas"):
        shutil.copytree(REPO / name, tmp_path / name)
    fixtures = tmp_path / "commands" / f"{TOOL}.fixtures"
    path = fixtures / "bad.case.json"
    path.write_text(case if isinstance(case, str) else json.dumps(case))
    if stdout:
        (fixtures / "bad.stdout").write_text("x\n")
    registry = load_registry(tmp_path / "commands", tmp_path / "schemas", hosts=None)
    with pytest.raises(ConfigError) as refused:
        load_fixtures(registry.operations[TOOL])
    assert refused.value.file == str(path)
    return refused.value


@pytest.mark.parametrize(
    ("case", "key", "phrase"),
    [
        ('{"now": "2026-11-30T04:12:00Z", "now": 1}', "", "not strict JSON (duplicate_name)"),
        ("[]", "", "must be a JSON object"),
        ({**GOOD, "stdin": "x"}, "stdin", "unknown key"),
        ({**GOOD, "args": []}, "args", "must be an object"),
        ({**GOOD, "exit_status": 256}, "exit_status", "must be an integer 0-255"),
        ({**GOOD, "exit_status": True}, "exit_status", "must be an integer 0-255"),
        ({k: v for k, v in GOOD.items() if k != "now"}, "now", "required key is missing"),
        ({**GOOD, "now": "yesterday"}, "now", "not an RFC 3339 time"),
        ({**GOOD, "expect": {"outcome": "maybe"}}, "expect.outcome", "must be 'success' or"),
        ({**GOOD, "expect": {"outcome": "success"}}, "expect.data", "expects a `data` object"),
        ({**GOOD, "expect": {"outcome": "failure", "code": "OOPS"}}, "expect.code", "one of"),
        ({**GOOD, "expect": {**EXPECT, "stage": "x"}}, "expect.stage", "one of"),
        ({**GOOD, "expect": {**EXPECT, "why": "x"}}, "expect.why", "unknown key"),
    ],
)
def test_a_malformed_case_file_is_named_with_its_key(
    tmp_path: Path, case: Any, key: str, phrase: str
) -> None:
    """Each rule of docs/fixtures.md "The case file" is one error naming the file and the key."""
    error = case_error(tmp_path, case)
    assert error.key == key and phrase in error.reason, error


def test_a_case_without_its_stdout_file_is_named(tmp_path: Path) -> None:
    """A case.json whose .stdout is missing: an error naming the file it expected."""
    error = case_error(tmp_path, GOOD, stdout=False)
    assert error.reason == "missing bad.stdout"
