"""`sshadapter check`: lint everything, run every fixture, derive and run the near-misses.

Offline: fixtures go through the same ``evaluate.evaluate`` as live calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sshadapter.check.fixtures import Fixture, load_fixtures
from sshadapter.check.nearmiss import derive
from sshadapter.contract.evaluate import Verdict, evaluate, seal
from sshadapter.contract.registry import Operation, Registry
from sshadapter.runners.interface import RunResult

CHECK_REQUEST_ID = "req.check000000"  # envelopes are sealed with this, then it is dropped
MCP_SERVER_PREFIX = "mcp__sshadapter__"
"""Claude Code names a server's tool ``mcp__<server>__<tool>`` (the guide's server name)."""
MODEL_TOOL_NAME_MAX = 64  # the model APIs' cap on a tool name (Anthropic, OpenAI, Gemini)
MCP_TOOL_NAME_MAX = MODEL_TOOL_NAME_MAX - len(MCP_SERVER_PREFIX)  # 47


@dataclass(frozen=True)
class Row:
    """One line of the report."""

    tool: str
    case: str
    kind: str
    """`fixture`, or the near-miss's name."""
    expected: Mapping[str, Any]
    got: Mapping[str, Any]
    """The envelope produced, without `request_id`."""
    stage: str | None
    reason: str | None
    ok: bool
    detail: str = ""
    """The operator's explanation (validator message, line number), as the audit has it."""
    schema_path: str = ""
    instance_path: str = ""

    def as_json(self) -> dict[str, Any]:
        rejection = None
        if self.stage:
            rejection = {
                "stage": self.stage,
                "reason": self.reason,
                "detail": self.detail,
                "schema_path": self.schema_path,
                "instance_path": self.instance_path,
            }
        return {
            "tool": self.tool,
            "case": self.case,
            "kind": self.kind,
            "expected": self.expected,
            "got": self.got,
            "ok": self.ok,
            "rejection": rejection,
            "why": None if self.ok else self.why,
        }

    @property
    def why(self) -> str:
        """For a miss: what happened instead, in the operator's terms."""
        if "missing" in self.got:
            return "add a fixture whose output the operation accepts"
        if self.got.get("outcome") == "success":
            if self.expected.get("outcome") == "success":
                return _data_difference(self.expected.get("data", {}), self.got.get("data", {}))
            return "accepted: nothing in the contract refuses this output"
        where = ""
        if self.instance_path or self.schema_path:
            where = f" at {self.instance_path or '/'} (schema {self.schema_path or '/'})"
        text = f"{self.stage}/{self.reason}{where}"
        return f"{text}: {self.detail}" if self.detail else text


NEAR_MISS_EXPECT: Mapping[str, Any] = {"outcome": "failure", "code": "INVALID_RESPONSE"}


def check_registry(registry: Registry) -> list[Row]:
    rows: list[Row] = []
    for op in registry.operations.values():
        fixtures = load_fixtures(op)
        if not any(f.expect["outcome"] == "success" for f in fixtures):
            rows.append(
                Row(
                    op.name,
                    "-",
                    "fixture",
                    {"outcome": "success"},
                    {"missing": "no accepted fixture"},
                    None,
                    None,
                    False,
                )
            )
        for fixture in fixtures:
            row = _run(op, fixture, "fixture", fixture.stdout, fixture.expect)
            rows.append(row)
            # Near-misses only from outputs really accepted: a broken fixture is its own miss.
            if row.ok and fixture.expect["outcome"] == "success":
                for kind, stdout in derive(op, fixture.stdout):
                    rows.append(_run(op, fixture, kind, stdout, NEAR_MISS_EXPECT))
    return rows


def warnings(registry: Registry) -> list[str]:
    """What loads and works, but will not work everywhere: one line each, naming the file."""
    found = []
    for op in registry.operations.values():
        if len(op.name) > MCP_TOOL_NAME_MAX:
            found.append(
                f"{op.file}: tool name is {len(op.name)} characters: MCP hosts that prefix "
                f"{MCP_SERVER_PREFIX} (Claude Code) hit the {MODEL_TOOL_NAME_MAX}-character cap "
                f"of the model APIs above {MCP_TOOL_NAME_MAX}"
            )
        found += [f"{op.file}: {key}: {text}" for key, text in op.warnings]
    return found


def _run(
    op: Operation, fixture: Fixture, kind: str, stdout: bytes, expect: Mapping[str, Any]
) -> Row:
    run = RunResult(stdout, fixture.stderr, fixture.exit_status)
    verdict = evaluate(op, fixture.args, run, fixture.now)
    sealed = seal(op, CHECK_REQUEST_ID, verdict)
    published = op.host_validator.is_valid(sealed)  # the full schema, data values included
    got = {k: v for k, v in sealed.items() if k != "request_id"}
    return Row(
        op.name,
        fixture.case,
        kind,
        expect,
        got,
        verdict.stage,
        verdict.reason,
        published and _matches(expect, got, verdict),
        *(
            ("", "", "")
            if (f := verdict.failure) is None
            else (f.detail, f.schema_path, f.instance_path)
        ),
    )


def _data_difference(expected: Mapping[str, Any], got: Mapping[str, Any]) -> str:
    differ = sorted(k for k in {*expected, *got} if expected.get(k, ...) != got.get(k, ...))
    shown = ", ".join(
        f"{k}: expected {expected.get(k, '(absent)')!r}, got {got.get(k, '(absent)')!r}"
        for k in differ[:3]
    )
    return f"accepted with other data: {shown}" + (" ..." if len(differ) > 3 else "")


def _matches(expect: Mapping[str, Any], got: Mapping[str, Any], verdict: Verdict) -> bool:
    if expect["outcome"] == "success":
        return got.get("outcome") == "success" and got.get("data") == expect["data"]
    return (
        got.get("outcome") == "failure"
        and got["error"]["code"] == expect["code"]
        and expect.get("stage", verdict.stage) == verdict.stage
        and expect.get("reason", verdict.reason) == verdict.reason
    )


def describe(expect: Mapping[str, Any]) -> str:
    if expect.get("outcome") == "success":
        return "success"
    parts = [str(expect.get("code", "?"))]
    if "stage" in expect:
        parts.append(f" @{expect['stage']}")
    return "failure " + "".join(parts)


def describe_got(row: Row) -> str:
    if "missing" in row.got:
        return str(row.got["missing"])
    if row.got.get("outcome") == "success":
        return (
            "success"
            if row.ok or row.expected.get("outcome") != "success"
            else "success (other data)"
        )
    text = f"failure {row.got['error']['code']}"
    return f"{text} @{row.stage}/{row.reason}" if row.stage else text


def format_table(rows: list[Row]) -> str:
    headers = ("tool", "case", "kind", "expected", "got", "")
    table = [
        (r.tool, r.case, r.kind, describe(r.expected), describe_got(r), "ok" if r.ok else "MISS")
        for r in rows
    ]
    widths = [
        max(len(h), *(len(t[i]) for t in table)) if table else len(h) for i, h in enumerate(headers)
    ]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row, cells in zip(rows, table, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
        if not row.ok:
            lines.append(f"    why: {row.why}")
    misses = sum(not r.ok for r in rows)
    tools = len({r.tool for r in rows})
    lines.append(f"{len(rows)} checks over {tools} tools: {len(rows) - misses} ok, {misses} missed")
    return "\n".join(lines)
