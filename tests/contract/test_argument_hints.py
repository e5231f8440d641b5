"""INVALID_REQUEST's `error.hint`: which parameter and which rule, from the operation's own
schema and the agent's own keys only (docs/protocol.md "Argument hints")."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from daemon_harness import ROOT, scripted_service

from sshadapter.contract import envelope
from sshadapter.contract.codes import HINT_RULES
from sshadapter.contract.params import argument_hint
from sshadapter.contract.schemas import SchemaSet
from sshadapter.daemon.access import Peer
from sshadapter.errors import EvidenceError

PEER = Peer(pid=1, uid=os.getuid(), gid=os.getgid())
SECRET: Final = "/etc/s3cr3t value"
"""A value the agent sent that must never come back."""
HOSTILE_KEY: Final = "x" * 300 + " ; $(reboot) ☃"
"""An extra key no hint may name: long, not an identifier."""

# Every rule a parameter keyword can break, each parameter using it alone.
PARAMS: Final = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 5},
        "colour": {"type": "string", "enum": ["red", "blue"]},
        "fixed": {"type": "string", "const": "on"},
        "count": {"type": "integer", "minimum": 1, "maximum": 9, "multipleOf": 1},
        "step": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 5},
        "even": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 2},
    },
    "required": ["colour", "count", "even", "fixed", "step", "word"],
    "additionalProperties": False,
}
GOOD: Final = {"word": "abc", "colour": "red", "fixed": "on", "count": 3, "step": 2, "even": 4}
CASES: Final = [
    ({"word": "ABC"}, "word", "pattern"),
    ({"word": "a"}, "word", "minLength"),
    ({"word": "abcdefgh"}, "word", "maxLength"),
    ({"word": 7}, "word", "type"),
    ({"colour": "green"}, "colour", "enum"),
    ({"fixed": "off"}, "fixed", "const"),
    ({"count": 0}, "count", "minimum"),
    ({"count": 10}, "count", "maximum"),
    ({"step": 0}, "step", "exclusiveMinimum"),
    ({"step": 5}, "step", "exclusiveMaximum"),
    ({"even": 3}, "even", "multipleOf"),
    ({"extra_key": 1}, "extra_key", "unknown"),
]


def hint_for(args: dict[str, Any]) -> dict[str, str] | None:
    """The hint for ``args`` from the real validator's first error."""
    validator = SchemaSet(ROOT / "schemas").compile(PARAMS, file="params")
    with pytest.raises(EvidenceError) as raised:
        validator.validate(args)
    return argument_hint(PARAMS, args, raised.value.schema_path)


@pytest.mark.parametrize(("change", "parameter", "rule"), CASES)
def test_each_rule_gives_its_hint(change: dict[str, Any], parameter: str, rule: str) -> None:
    """The first broken keyword of one parameter is its hint: that parameter, that rule."""
    assert rule in HINT_RULES
    assert hint_for({**GOOD, **change}) == {"parameter": parameter, "rule": rule}


def test_a_missing_argument_is_named() -> None:
    """A required parameter left out: its name, rule missing."""
    args = {k: v for k, v in GOOD.items() if k != "step"}
    assert hint_for(args) == {"parameter": "step", "rule": "missing"}


def test_a_hostile_extra_key_gives_no_parameter() -> None:
    """An extra key that is no parameter name is not echoed: the rule alone."""
    assert hint_for({**GOOD, HOSTILE_KEY: 1}) == {"rule": "unknown"}
    assert hint_for({**GOOD, "A" * 10: 1}) == {"rule": "unknown"}
    assert hint_for({**GOOD, "a" * 64: 1}) == {"rule": "unknown"}  # one past PARAM_NAME


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real Service (assembled as `serve` does) answering from a scripted runner."""
    return scripted_service(tmp_path_factory.mktemp("hints"))


def call(service: Any, args: dict[str, Any], tool: str = "disk_usage") -> tuple[bytes, Any]:
    """One call through Service.handle: the raw line and its envelope, checked in full."""
    request = {"op": "call", "tool": tool, "args": args}
    line: bytes = asyncio.run(service.handle(json.dumps(request).encode(), PEER))
    answer = orjson.loads(line)
    assert service.registry.get(tool).envelope_validator.is_valid(answer), answer
    return line, answer


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        ({"path": SECRET}, {"parameter": "path", "rule": "pattern"}),
        ({"path": "/" + "a" * 300}, {"parameter": "path", "rule": "maxLength"}),
        ({"path": 12345678}, {"parameter": "path", "rule": "type"}),
        ({}, {"parameter": "path", "rule": "missing"}),
        ({"path": "/var", "pathh": SECRET}, {"parameter": "pathh", "rule": "unknown"}),
        ({"path": "/var", HOSTILE_KEY: SECRET}, {"rule": "unknown"}),
    ],
)
def test_the_daemon_answers_the_hint_and_never_the_value(
    service: Any, args: dict[str, Any], hint: dict[str, str]
) -> None:
    """Through the daemon: the hint, a valid envelope, never the value or a hostile key."""
    line, answer = call(service, args)
    assert answer["error"] == {"code": "INVALID_REQUEST", "retryable": False, "hint": hint}
    assert SECRET.encode() not in line and b"xxxxxxxx" not in line and b"12345678" not in line


def test_other_failures_stay_as_closed_as_before(service: Any, tmp_path: Path) -> None:
    """An unknown tool and a malformed call carry no hint; a good call has no error at all."""
    for request in (
        {"op": "call", "tool": "no_such_tool", "args": {"path": "/"}},
        {"op": "call", "tool": "disk_usage", "args": []},
        {"op": "call", "tool": "disk_usage", "args": {}, "extra": 1},
    ):
        answer = orjson.loads(asyncio.run(service.handle(json.dumps(request).encode(), PEER)))
        assert answer["tool"] == "sshadapter"
        assert answer["error"] == {"code": "INVALID_REQUEST", "retryable": False}
    schema = envelope.SYSTEM_ENVELOPE_SCHEMA
    assert "hint" not in schema["oneOf"][1]["properties"]["error"]["properties"]
