"""The official Python SDK client (`mcp` 2.3) drives `sshadapter mcp`, in each of its modes.

legacy: the initialize handshake (2025-11-25); auto: the server/discover probe,
which finds the modern era; 2026-07-28: adopted without a probe. Behind the
bridge, the real daemon and the test sshd (one of each for the module).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.subscriptions import ToolsListChanged
from mcp.shared.exceptions import MCPError
from mcp_harness import (
    SHIPPED_TOOLS,
    TEST_TOOLS,
    Daemon,
    bridge_argv,
    edit_description,
    running_daemon,
)
from sshd import running_sshd

from sshadapter.mcp.bridge import LIST_CHECK_MIN_SECONDS

MODES = ["legacy", "auto", "2026-07-28"]
VERSION = {"legacy": "2025-11-25", "auto": "2026-07-28", "2026-07-28": "2026-07-28"}
CALL_TIMEOUT_SECONDS = 30.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    with running_sshd() as sshd, running_daemon(tmp_path_factory.mktemp("daemon"), sshd) as d:
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
            assert invalid["error"] == {"code": "INVALID_REQUEST", "retryable": False}
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
