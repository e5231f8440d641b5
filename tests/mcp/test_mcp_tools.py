"""The MCP translation, offline: daemon tools as MCP tools, envelopes as results, per era."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from sshadapter.contract import envelope, registry
from sshadapter.contract.envelope import FANOUT_TARGET_PATTERN, REQUEST_ID_PATTERN, _branches
from sshadapter.contract.registry import load_registry
from sshadapter.errors import ConfigError
from sshadapter.mcp import tools as mcp_tools
from sshadapter.mcp.protocol import Era
from sshadapter.mcp.tools import (
    BRIDGE_REQUEST_ID_PREFIX,
    TARGETS_CODES,
    TARGETS_TOOL,
    TOOL_NAME,
    DaemonAnswerError,
    bridge_envelope,
    call_result,
    can_name_tool,
    list_result,
    listing,
    mcp_tool,
    targets_failure,
    targets_output_schema,
    targets_page,
)

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = load_registry(ROOT / "commands", ROOT / "schemas", hosts=None)
LEGACY = Era("2025-11-25", modern=False)
OLDEST = Era("2025-03-26", modern=False)
MODERN = Era("2026-07-28", modern=True)


def entry(name: str, **changes: Any) -> dict[str, Any]:
    """The daemon's `list` entry for a shipped tool, with ``changes``."""
    return {**REGISTRY.operations[name].list_entry, **changes}


def test_bridge_envelope_is_the_daemons_failure_shape_with_its_own_id_prefix() -> None:
    """Written out to keep start-up light, it must equal envelope.failure but for request_id."""
    assert TOOL_NAME.pattern == registry.TOOL_NAME.pattern
    made = bridge_envelope("disk_usage", "INTERNAL", True)
    daemon = envelope.failure("disk_usage", made["request_id"], "INTERNAL", True)
    assert made == daemon
    assert made["request_id"].startswith(BRIDGE_REQUEST_ID_PREFIX)
    assert not envelope.new_request_id().startswith(BRIDGE_REQUEST_ID_PREFIX)
    assert re.fullmatch(envelope.REQUEST_ID_PATTERN, made["request_id"])


@pytest.mark.parametrize("name", sorted(REGISTRY.operations))
@pytest.mark.parametrize(("code", "retryable"), [("INTERNAL", True), ("OVERLOADED", True)])
def test_bridge_envelopes_pass_every_tools_published_schema(
    name: str, code: str, retryable: bool
) -> None:
    """A strict client validates even failures: the bridge's own must fit the outputSchema."""
    assert_bridge_envelopes_fit(REGISTRY.operations[name], code, retryable)


def assert_bridge_envelopes_fit(op: registry.Operation, code: str, retryable: bool) -> None:
    """The bridge's failure envelopes for ``op``, retryable or not, pass its envelope schema."""
    assert op.envelope_validator.is_valid(bridge_envelope(op.name, code, retryable))
    assert op.envelope_validator.is_valid(bridge_envelope(op.name, code, not retryable))


@pytest.mark.parametrize("read_only", [True, False])
@pytest.mark.parametrize("idempotent", [True, False])
def test_annotations_follow_the_operators_statements(read_only: bool, idempotent: bool) -> None:
    """readOnlyHint is read_only, destructiveHint its opposite, openWorldHint always false."""
    tool = mcp_tool(entry("disk_usage", read_only=read_only, idempotent=idempotent), LEGACY)
    assert tool["annotations"] == {
        "title": "Disk usage",
        "readOnlyHint": read_only,
        "destructiveHint": not read_only,
        "idempotentHint": idempotent,
        "openWorldHint": False,
    }


def test_a_daemon_without_the_hints_is_read_as_neither() -> None:
    """An entry lacking read_only and idempotent gets the cautious hints, not a crash."""
    bare = {k: v for k, v in entry("disk_usage").items() if k not in ("read_only", "idempotent")}
    hints = mcp_tool(bare, LEGACY)["annotations"]
    assert (hints["readOnlyHint"], hints["destructiveHint"], hints["idempotentHint"]) == (
        False,
        True,
        False,
    )


def test_schemas_pass_through_without_the_dialect_line_on_input() -> None:
    """inputSchema is the closed parameter schema minus $schema; outputSchema is unchanged."""
    tool = mcp_tool(entry("disk_usage"), LEGACY)
    op = REGISTRY.operations["disk_usage"]
    assert tool["inputSchema"] == {k: v for k, v in op.params_schema.items() if k != "$schema"}
    assert tool["inputSchema"]["additionalProperties"] is False
    assert tool["outputSchema"] == op.envelope_schema
    assert tool["outputSchema"]["type"] == "object"  # TS SDK v1 refuses any other root


def test_2025_03_26_gets_no_field_it_does_not_know() -> None:
    """Before 2025-06-18 there is no title, outputSchema or structuredContent."""
    tool = mcp_tool(entry("disk_usage"), OLDEST)
    assert set(tool) == {"name", "description", "inputSchema", "annotations"}
    sealed = envelope.success("disk_usage", "req.0123456789", {"mounted_on": "/"})
    assert set(call_result(sealed, OLDEST)) == {"content", "isError"}


def test_modern_results_carry_result_type_cache_hints_and_server_info() -> None:
    """2026-07-28: resultType on every result; ttlMs and cacheScope private on the list."""
    tools = listing({"tools": [entry("disk_usage")], "digest": "sha256:x"})
    listed = list_result(tools, MODERN)
    assert (listed["resultType"], listed["ttlMs"], listed["cacheScope"]) == (
        "complete",
        0,
        "private",
    )
    assert listed["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "sshadapter"
    assert "resultType" not in list_result(tools, LEGACY) and "ttlMs" not in list_result(
        tools, LEGACY
    )
    sealed = envelope.failure("disk_usage", "req.0123456789", "NOT_FOUND")
    assert call_result(sealed, MODERN)["resultType"] == "complete"


@pytest.mark.parametrize(
    "sealed",
    [
        envelope.success("mount_info", "req.0123456789", {"filesystems": [{"target": "/é"}]}),
        envelope.failure("mount_info", "req.0123456789", "NOT_FOUND"),
    ],
)
def test_text_mirror_is_the_same_compact_json_and_is_error_follows_outcome(
    sealed: dict[str, Any],
) -> None:
    """Whichever field a host shows the model, it is the envelope, byte for byte."""
    result = call_result(sealed, LEGACY)
    assert result["structuredContent"] == sealed
    assert result["content"] == [{"type": "text", "text": orjson.dumps(sealed).decode()}]
    assert json.loads(result["content"][0]["text"]) == sealed
    assert result["isError"] is (sealed["outcome"] == "failure")


def test_listing_is_sorted_by_name_and_refuses_what_is_not_a_list() -> None:
    """Deterministic order (2026-07-28 SHOULD); a malformed daemon answer is an error."""
    tools = listing({"tools": [entry("mount_info"), entry("disk_usage")], "digest": "sha256:a"})
    assert [t["name"] for t in tools.tools] == ["disk_usage", "mount_info"]
    assert tools.names == {"disk_usage", "mount_info"} and tools.digest == "sha256:a"
    bad_answers: list[Any] = [None, {}, {"tools": {}}, {"tools": [{"name": 1}]}]
    for bad in [*bad_answers, {"tools": [{"name": "x"}]}]:
        with pytest.raises(DaemonAnswerError):
            listing(bad)


def test_the_bridge_loads_neither_pydantic_nor_the_schema_libraries() -> None:
    """What keeps `sshadapter mcp` starting in tens of milliseconds (tests/bench/bench_mcp.py)."""
    code = (
        "import sys; from sshadapter import cli; from sshadapter.mcp import bridge; "
        "heavy = {'pydantic', 'pydantic_settings', 'jsonschema', 'jsonschema_rs', "
        "'referencing', 'asyncssh', 'prometheus_client'}; "
        "print(sorted(heavy & {m.split('.')[0] for m in sys.modules}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def _multi_entry(name: str, run_on: dict[str, Any]) -> dict[str, Any]:
    """A daemon `list` entry of a tool with targets (run_on as the daemon publishes it)."""
    base = {**entry("disk_usage"), "name": name}
    schema = base["input_schema"]
    return {
        **base,
        "input_schema": {
            **schema,
            "properties": {"run_on": run_on, **schema["properties"]},
            "required": ["run_on", *schema["required"]],
        },
    }


def test_sshadapter_targets_is_listed_only_while_some_tool_has_no_run_on_enum() -> None:
    """An enum everywhere: not listed; a pattern somewhere: listed, for exactly those tools."""
    few = _multi_entry("few_hosts", {"type": "string", "enum": ["a", "b"]})
    many = _multi_entry("many_hosts", {"type": "string", "pattern": FANOUT_TARGET_PATTERN})
    small = listing({"tools": [few, entry("disk_usage")]})
    assert small.paged == () and [t["name"] for t in list_result(small, LEGACY)["tools"]] == [
        "disk_usage",
        "few_hosts",
    ]
    large = listing({"tools": [many, few, entry("disk_usage")]})
    listed = list_result(large, LEGACY)["tools"]
    assert [t["name"] for t in listed] == ["disk_usage", "few_hosts", "many_hosts", TARGETS_TOOL]
    lister = listed[-1]
    assert lister["inputSchema"]["properties"]["tool"]["enum"] == ["many_hosts"]
    assert lister["outputSchema"] == targets_output_schema(("many_hosts",))
    assert set(mcp_tool(few, OLDEST)) == set(list_result(large, OLDEST)["tools"][-1])


def test_sshadapter_targets_failure_branch_is_the_envelopes_and_no_operation_takes_its_name(
    tmp_path: Path,
) -> None:
    """Written out like bridge_envelope; the registry refuses `sshadapter_` names to files."""
    assert mcp_tools.REQUEST_ID_PATTERN == REQUEST_ID_PATTERN
    assert mcp_tools.TARGET_NAME_PATTERN == FANOUT_TARGET_PATTERN
    failure = _branches(TARGETS_TOOL, {}, list(TARGETS_CODES), hinted=False)[1]  # no hint
    assert targets_output_schema(("x_y",))["oneOf"][1] == failure
    assert TOOL_NAME.fullmatch(TARGETS_TOOL) and not can_name_tool(TARGETS_TOOL)
    text = (ROOT / "commands" / "disk_usage.toml").read_bytes()
    (tmp_path / "commands").mkdir()
    (tmp_path / "commands" / f"{TARGETS_TOOL}.toml").write_bytes(text)
    with pytest.raises(ConfigError) as refused:
        load_registry(tmp_path / "commands", ROOT / "schemas", hosts=None)
    assert "reserved for the MCP bridge" in refused.value.reason


def test_a_targets_answer_is_a_page_or_a_refusal_and_nothing_else() -> None:
    """The daemon's page passes as it is; its system refusal gets this tool's name."""
    page = {"tool": "many_hosts", "targets": ["a", "b"], "next": "b"}
    assert targets_page(page, "many_hosts") == page
    for bad in [{**page, "tool": "other"}, {**page, "extra": 1}, {**page, "targets": [1]}, []]:
        assert targets_page(bad, "many_hosts") is None
    refusal = envelope.failure("sshadapter", "req.0123456789abcdef", "INVALID_REQUEST")
    assert targets_failure(refusal) == {**refusal, "tool": TARGETS_TOOL}
    validator = jsonschema.Draft202012Validator(targets_output_schema(("many_hosts",)))
    assert validator.is_valid(page) and validator.is_valid(targets_failure(refusal))
    assert targets_failure({**refusal, "error": {"code": "DENIED", "retryable": False}}) is None
