"""The official Python SDK client (`mcp` 2.3) drives `sshadapter mcp`, in each of its modes.

legacy: the initialize handshake (2025-11-25); auto: the server/discover probe,
which finds the modern era; 2026-07-28: adopted without a probe. Behind the
bridge, the real daemon and the test sshd (one of each for the module).
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_fleet import (
    CANARY,
    CANARY_CHOICES,
    FLEET_TOOLS,
    LIAR,
    SLOW_HOST,
    WIDE_CHOICES,
    WIDE_HOSTS,
    ask,
    running_fleet,
)
from mcp_harness import (
    SHIPPED_TOOLS,
    TEST_TOOLS,
    Daemon,
    bridge_argv,
    edit_description,
    running_daemon,
)
from sshd import running_sshd

from sshadapter.mcp.tool_list import LIST_CHECK_MIN_SECONDS
from sshadapter.mcp.tools import TARGETS_TOOL

MODES = ["legacy", "auto", "2026-07-28"]
VERSION = {"legacy": "2025-11-25", "auto": "2026-07-28", "2026-07-28": "2026-07-28"}
CALL_TIMEOUT_SECONDS = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_sshd() as sshd, running_daemon(tmp_path_factory.mktemp("daemon"), sshd) as d:
        yield d


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as d:
        yield d


@asynccontextmanager
async def connected(
    daemon: Daemon, mode: str, notifications: list[Any] | None = None
) -> AsyncIterator[Client]:
    argv = bridge_argv(daemon.socket)

    async def handler(message: Any) -> None:
        if notifications is not None:
            notifications.append(message)

    async with Client(
        StdioServerParameters(command=argv[0], args=argv[1:]),
        mode=mode,
        message_handler=handler,
        read_timeout_seconds=CALL_TIMEOUT_SECONDS,
    ) as client:
        yield client


def sealed(result: types.CallToolResult) -> dict[str, Any]:
    """The envelope, checked to be the same in both fields and to agree with is_error."""
    assert len(result.content) == 1 and isinstance(result.content[0], types.TextContent)
    text = json.loads(result.content[0].text)
    assert result.structured_content == text
    assert result.is_error is (text["outcome"] == "failure")
    envelope: dict[str, Any] = text
    return envelope


@pytest.mark.parametrize("mode", MODES)
def test_list_shows_every_tool_with_its_schemas_and_hints(daemon: Daemon, mode: str) -> None:
    """Every tool the caller may call, sorted, with the daemon's schemas and the hints."""

    async def main() -> None:
        async with connected(daemon, mode) as client:
            assert client.protocol_version == VERSION[mode]
            tools = (await client.list_tools()).tools
            assert [t.name for t in tools] == sorted(SHIPPED_TOOLS + TEST_TOOLS)
            disk = next(t for t in tools if t.name == "disk_usage")
            assert disk.title == "Disk usage"
            assert disk.input_schema["additionalProperties"] is False
            assert "$schema" not in disk.input_schema
            assert disk.output_schema is not None and disk.output_schema["type"] == "object"
            assert len(disk.output_schema["oneOf"]) == 2
            assert disk.annotations is not None
            assert disk.annotations.read_only_hint is True
            assert disk.annotations.destructive_hint is False
            assert disk.annotations.idempotent_hint is True
            assert disk.annotations.open_world_hint is False

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_each_kind_of_answer_reaches_the_client_intact(daemon: Daemon, mode: str) -> None:
    """Success, declared failure, rejected output, invalid arguments: envelopes, not errors."""

    async def main() -> None:
        async with connected(daemon, mode) as client:
            await client.list_tools()  # the client validates against the outputSchema it read
            ok = sealed(await client.call_tool("load_average", {}))
            assert ok["outcome"] == "success"
            assert set(ok["data"]) == {"load1", "load5", "load15", "running", "total"}
            found = sealed(await client.call_tool("mount_info", {"target": "/"}))
            assert found["data"]["filesystems"][0]["target"] == "/"
            declared = sealed(await client.call_tool("mount_info", {"target": "/no/such"}))
            assert declared["error"] == {"code": "NOT_FOUND", "retryable": False}
            rejected = sealed(await client.call_tool("disk_usage", {"path": "/proc"}))
            assert rejected["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
            invalid = sealed(await client.call_tool("disk_usage", {"path": "/etc;id"}))
            assert invalid["error"] == {
                "code": "INVALID_REQUEST",
                "retryable": False,
                "hint": {"parameter": "path", "rule": "pattern"},
            }
            assert "/etc;id" not in json.dumps(invalid)
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("run_shell", {"command": "id"})
            assert unknown.value.error.code == -32602
            assert unknown.value.error.message == "Unknown tool: run_shell"
            for name in ("sshadapter", "Load_average", "load_averag\u0435", ""):  # never listed
                with pytest.raises(MCPError) as unlisted:
                    await client.call_tool(name, {})
                assert unlisted.value.error.code == -32602
                assert unlisted.value.error.message == f"Unknown tool: {name}"
        for envelope in (ok, declared, rejected, invalid):  # each one is the daemon's, audited
            assert daemon.wait_for_result(envelope["tool"], request_id=envelope["request_id"])

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_call_is_abandoned_and_the_daemon_still_records_it(
    daemon: Daemon, mode: str
) -> None:
    """The client gives up (it sends notifications/cancelled); the session goes on."""
    before = {r["request_id"] for r in daemon.audit_records() if r["type"] == "intent"}

    async def main() -> None:
        async with connected(daemon, mode) as client:
            with anyio.move_on_after(0.5) as scope:
                await client.call_tool("slow_read", {"seconds": 1})
            assert scope.cancelled_caught
            assert sealed(await client.call_tool("load_average", {}))["outcome"] == "success"

    anyio.run(main)
    intents = [
        r
        for r in daemon.audit_records()
        if r["type"] == "intent" and r["tool"] == "slow_read" and r["request_id"] not in before
    ]
    assert len(intents) == 1
    assert daemon.wait_for_result("slow_read", request_id=intents[0]["request_id"])


@pytest.mark.parametrize("mode", MODES)
def test_the_bridge_reconnects_after_a_daemon_restart(daemon: Daemon, mode: str) -> None:
    """Same session across a restart; while it is down, a closed retryable failure."""

    async def main() -> None:
        async with connected(daemon, mode) as client:
            assert sealed(await client.call_tool("load_average", {}))["outcome"] == "success"
            daemon.stop()
            try:
                down = sealed(await client.call_tool("load_average", {}))
                assert down["error"] == {"code": "INTERNAL", "retryable": True}
                assert down["request_id"].startswith("mcp.")
            finally:
                daemon.start()
            again = sealed(await client.call_tool("load_average", {}))
            assert again["outcome"] == "success" and again["request_id"].startswith("req.")

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_reload_that_changes_the_list_is_announced(daemon: Daemon, mode: str) -> None:
    """list_changed after SIGHUP: a legacy notification, or an event on a 2026 listen stream."""
    original = (daemon.commands / "load_average.toml").read_text()
    text = f"Load averages, as described after a reload in {mode} mode."
    notifications: list[Any] = []

    async def changed_and_listed(client: Client) -> None:
        edit_description(daemon, "load_average", text)
        await anyio.sleep(LIST_CHECK_MIN_SECONDS + 0.1)  # the bridge compares at most that often
        assert sealed(await client.call_tool("load_average", {}))["outcome"] == "success"

    async def main() -> None:
        async with connected(daemon, mode, notifications) as client:
            await client.list_tools()
            if client.protocol_version == "2025-11-25":
                await changed_and_listed(client)
                with anyio.fail_after(CALL_TIMEOUT_SECONDS):
                    while not any(
                        isinstance(n, types.ToolListChangedNotification) for n in notifications
                    ):
                        await anyio.sleep(0.05)
            else:
                async with client.listen(tools_list_changed=True) as subscription:
                    assert subscription.honored.tools_list_changed is True
                    await changed_and_listed(client)
                    with anyio.fail_after(CALL_TIMEOUT_SECONDS):
                        event = await subscription.__anext__()
                    assert isinstance(event, ToolsListChanged)
            tools = (await client.list_tools()).tools
            assert next(t for t in tools if t.name == "load_average").description == text

    try:
        anyio.run(main)
    finally:
        (daemon.commands / "load_average.toml").write_text(original)
        daemon.reload()


@pytest.mark.parametrize("mode", MODES)
def test_fleet_tools_list_the_callers_targets_and_page_the_rest(fleet: Daemon, mode: str) -> None:
    """run_on: an enum of this caller's choices, or a pattern and sshadapter_targets pages."""
    published = {t["name"]: t for t in ask(fleet.socket, {"op": "list"})["tools"]}

    async def main() -> None:
        async with connected(fleet, mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert sorted(tools) == sorted([*FLEET_TOOLS, TARGETS_TOOL])
            for name in FLEET_TOOLS:  # the daemon's schemas, unchanged but for $schema
                daemon_schema = published[name]["input_schema"]
                assert tools[name].input_schema == {
                    k: v for k, v in daemon_schema.items() if k != "$schema"
                }
                assert tools[name].output_schema == published[name]["output_schema"]
            canary = tools["canary_state"].input_schema
            assert canary["properties"]["run_on"]["enum"] == CANARY_CHOICES
            assert canary["required"][0] == "run_on"
            assert "enum" not in tools["fleet_state"].input_schema["properties"]["run_on"]
            lister = tools[TARGETS_TOOL]
            assert lister.input_schema["properties"]["tool"]["enum"] == ["fleet_state"]
            assert lister.annotations is not None and lister.annotations.read_only_hint is True
            pages, after = [], None
            while True:  # the client validates each page against the outputSchema it read
                arguments = {"tool": "fleet_state", **({"after": after} if after else {})}
                result = await client.call_tool(TARGETS_TOOL, arguments)
                assert result.is_error is False
                (text,) = result.content
                page = result.structured_content
                assert isinstance(text, types.TextContent) and json.loads(text.text) == page
                assert page is not None
                pages.append(page["targets"])
                after = page["next"]
                if after is None:
                    break
            assert len(pages) == 2  # more choices than one daemon page holds
            assert [t for p in pages for t in p] == WIDE_CHOICES
            refused = sealed(await client.call_tool(TARGETS_TOOL, {"tool": "canary_state"}))
            assert refused["error"] == {"code": "INVALID_REQUEST", "retryable": False}
            with pytest.raises(MCPError) as reserved:
                await client.call_tool("sshadapter_other", {})
            assert reserved.value.error.message == "Unknown tool: sshadapter_other"

    anyio.run(main)


@pytest.mark.parametrize("mode", MODES)
def test_a_fan_out_answer_is_a_success_holding_each_hosts_own_failure(
    fleet: Daemon, mode: str
) -> None:
    """isError false, every host's envelope inside; a target not granted is a tool error."""

    async def main() -> list[dict[str, Any]]:
        async with connected(fleet, mode) as client:
            await client.list_tools()  # the client validates against the outputSchema it read
            fanned = sealed(await client.call_tool("canary_state", {"run_on": "canary"}))
            denied = [
                sealed(await client.call_tool("canary_state", {"run_on": target}))
                for target in ("web", "web100", "nosuch")
            ]
            return [fanned, *denied]

    fanned, *denied = anyio.run(main)
    assert fanned["outcome"] == "success"
    data = fanned["data"]
    assert (data["hosts"], data["succeeded"], data["failed"]) == (3, 2, 1)
    assert data["results"][0] == {
        "host": LIAR,
        "outcome": "failure",
        "error": {"code": "INVALID_RESPONSE", "retryable": False},
    }
    assert sorted(r["host"] for r in data["results"]) == list(CANARY)
    record = fleet.wait_for_result("canary_state", request_id=fanned["request_id"])
    assert sorted(row["host"] for row in record["host_results"]) == list(CANARY)
    for envelope, reason in zip(
        denied, ["target_not_granted", "target_not_granted", "unknown_target"], strict=True
    ):
        assert envelope["error"] == {
            "code": "INVALID_REQUEST",
            "retryable": False,
            "hint": {"parameter": "run_on", "rule": "choice"},
        }  # alike
        record = fleet.wait_for_result("canary_state", request_id=envelope["request_id"])
        assert record["reason"] == reason


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_fan_out_is_recorded_with_every_host(fleet: Daemon, mode: str) -> None:
    """The client gives up mid fan-out; the daemon finishes every host and records each."""
    before = {r["request_id"] for r in fleet.audit_records() if r["type"] == "intent"}

    async def main() -> None:
        async with connected(fleet, mode) as client:
            with anyio.move_on_after(0.5) as scope:
                await client.call_tool("slow_state", {"run_on": "canary"})
            assert scope.cancelled_caught
            again = sealed(await client.call_tool("canary_state", {"run_on": "web002"}))
            assert again["outcome"] == "success"

    anyio.run(main)
    (intent,) = [
        r
        for r in fleet.audit_records()
        if r["type"] == "intent" and r["tool"] == "slow_state" and r["request_id"] not in before
    ]
    record = fleet.wait_for_result("slow_state", request_id=intent["request_id"])
    rows = {row["host"]: row["outcome"] for row in record["host_results"]}
    assert rows == {SLOW_HOST: "success", LIAR: "failure", "web002": "success"}


@pytest.mark.parametrize("mode", MODES)
def test_a_fan_out_with_a_progress_token_reports_hosts_done_of_total(
    fleet: Daemon, mode: str
) -> None:
    """Progress notifications count the hosts answered, rising to all of them, rate-limited."""
    seen: list[tuple[float, float | None, str | None]] = []

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def main() -> dict[str, Any]:
        async with connected(fleet, mode) as client:
            result = await client.call_tool(
                "fleet_state", {"run_on": "web"}, progress_callback=progressed
            )
            return sealed(result)

    answer = anyio.run(main)
    assert answer["outcome"] == "success" and answer["data"]["hosts"] == WIDE_HOSTS
    assert all(total == WIDE_HOSTS and message is None for _, total, message in seen)
    done = [progress for progress, _, _ in seen]
    assert done[-1] == WIDE_HOSTS  # the last one is always said
    assert done == sorted(set(done)) and done[0] >= 1
    assert len(seen) < WIDE_HOSTS  # at most one per PROGRESS_INTERVAL_SECONDS, not one a host


def test_the_daemon_sends_progress_lines_only_to_a_call_that_asks_for_them(
    fleet: Daemon,
) -> None:
    """`"progress": 1`: count lines, then the answer; absent: one line; any other value refused."""
    call = {"op": "call", "tool": "canary_state", "args": {"run_on": "canary"}}

    def lines(message: dict[str, Any]) -> list[Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(fleet.socket))
            sock.sendall(json.dumps(message).encode() + b"\n")
            sock.shutdown(socket.SHUT_WR)  # the daemon answers, then sees the end
            return [json.loads(line) for line in sock.makefile("rb")]

    *progress, answer = lines({**call, "progress": 1})
    assert answer["outcome"] == "success" and answer["data"]["hosts"] == len(CANARY)
    assert progress[-1] == {"progress": {"done": len(CANARY), "total": len(CANARY)}}
    assert all(line["progress"]["total"] == len(CANARY) for line in progress)
    [plain] = lines(call)
    assert plain["outcome"] == "success"
    for value in (True, 2, 1.0, "1", None):
        [refused] = lines({**call, "progress": value})
        assert refused["tool"] == "sshadapter"
        assert refused["error"] == {"code": "INVALID_REQUEST", "retryable": False}
