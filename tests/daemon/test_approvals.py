"""Human approval, through the real socket: the approver is another uid (``nobody``,
connecting from its own process, so SO_PEERCRED names it), the caller is this test's."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Final

import jsonschema
import mcp_types as types
import orjson
import pytest
from daemon_harness import ROOT, Running, shipped_commands, with_daemon
from mcp import Client, StdioServerParameters
from mcp_harness import RawBridge, bridge_argv, raw_bridge

from sshadapter.audit.verify import verify
from sshadapter.client import MAX_APPROVAL_NOTE_CHARS
from sshadapter.config import ApprovalsSection, Config, GroupSection, HostSection, PathsSection
from sshadapter.contract.commandfile import MAX_APPROVAL_TIMEOUT_SECONDS
from sshadapter.daemon.server import load
from sshadapter.errors import ConfigError

# The approver's processes run a Python every uid may execute (this test's may live under
# /root), with this checkout and its libraries on the path.
SYSTEM_PYTHON: Final = shutil.which("python3", path="/usr/bin:/bin")
LIBRARIES: Final = [p for p in sys.path if p.endswith("site-packages")]
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEM_PYTHON is None, reason="a second uid needs root and /usr/bin"
)

APPROVER: Final = 65534  # nobody
ME: Final = os.getuid()
TOOL: Final = "job_rerun"
ARGS: Final = {"project_id": "bluebird"}
CALL: Final = {"op": "call", "tool": TOOL, "args": ARGS}
COMMAND: Final = "ci-cli run status --json --project bluebird"
DIGEST: Final = hashlib.sha256(COMMAND.encode()).hexdigest()
PROJECT_PATTERN: Final = "pattern = '^[a-z0-9][a-z0-9-]{2,62}$'"
# Runs the CLI in a process of its own (as another uid, for the approver).
CLI: Final = [
    SYSTEM_PYTHON or "",
    "-c",
    "import sys; from sshadapter.cli import main; sys.exit(main())",
]
CLI_ENV: Final = {"PYTHONPATH": os.pathsep.join([str(ROOT), *LIBRARIES]), "PATH": "/usr/bin:/bin"}
# Connects as the approver from its own process: what SO_PEERCRED sees is that uid.
_ASK: Final = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(sys.argv[2].encode() + b"\\n")
out = b""
while not out.endswith(b"\\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    out += chunk
sys.stdout.write(out.decode())
"""


def approval_commands(
    tmp_path: Path,
    timeout: float = 60.0,
    version: int = 1,
    *,
    fleet: bool = False,
    pattern: str | None = None,
) -> Path:
    """The shipped commands plus job_rerun: job_run_status's command, requiring approval
    (``fleet``: on the targets of group `both`, instead of host `ci`; ``pattern``: its
    `project_id`'s, instead of job_run_status's)."""
    commands = shipped_commands(tmp_path)
    text = (commands / "job_run_status.toml").read_text()
    if pattern is not None:
        text = text.replace(PROJECT_PATTERN, f"pattern = {orjson.dumps(pattern).decode()}")
    if fleet:
        text = text.replace('host = "ci"', 'targets = ["both"]\nfanout = { enabled = true }')
    text = text.replace("read_only = true", "read_only = false").replace(
        "version = 1", f"version = {version}"
    )
    text += f"\n[approval]\nrequired = true\ntimeout_seconds = {timeout}\n"
    (commands / f"{TOOL}.toml").write_text(text)
    return commands


def run(
    tmp_path: Path,
    socket_dir: Path,
    body: Any,
    *,
    timeout: float = 60.0,
    approvers: tuple[int, ...] = (APPROVER,),
    max_pending: int = 16,
    fleet: bool = False,
    pattern: str | None = None,
) -> None:
    with_daemon(
        tmp_path,
        body,
        commands=approval_commands(tmp_path, timeout, fleet=fleet, pattern=pattern),
        groups={"both": GroupSection(members=("ci", "local"))},
        socket_dir=socket_dir,
        socket_mode=0o666,
        approvals=ApprovalsSection(uids=approvers, max_pending=max_pending),
    )


async def ask_as(uid: int, running: Running, message: dict[str, Any]) -> Any:
    """One request from a process running as ``uid``."""
    assert SYSTEM_PYTHON is not None
    process = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON,
        "-I",
        "-c",
        _ASK,
        str(running.path),
        orjson.dumps(message).decode(),
        user=uid,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await process.communicate()
    return orjson.loads(out)


async def pending(running: Running, count: int = 1) -> list[dict[str, Any]]:
    """The approver's listing, once exactly ``count`` calls wait."""
    for _ in range(200):
        listed = (await ask_as(APPROVER, running, {"op": "approvals"}))["approvals"]
        if len(listed) == count:
            return list(listed)
        await asyncio.sleep(0.02)
    raise AssertionError(f"not {count} calls pending")


async def cli_as(uid: int, *words: str) -> tuple[int, str, str]:
    """`sshadapter WORDS...` in a process running as ``uid``: its status, stdout, stderr."""
    process = await asyncio.create_subprocess_exec(
        *CLI,
        *words,
        user=uid,
        env=CLI_ENV,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def ended(running: Running, count: int = 1) -> list[dict[str, Any]]:
    """The result records, once ``count`` calls have one."""
    for _ in range(500):
        results = [r for r in running.audit_records() if r["type"] == "result"]
        if len(results) >= count:
            return results
        await asyncio.sleep(0.01)
    raise AssertionError(f"not {count} results written")


def decide(request_id: str, digest: str = DIGEST) -> dict[str, Any]:
    return {"op": "approve", "request_id": request_id, "digest": digest}


def deny(request_id: str) -> dict[str, Any]:
    return {"op": "deny", "request_id": request_id}


def approval_records(running: Running) -> list[dict[str, Any]]:
    return [r for r in running.audit_records() if r["type"] == "approval"]


def check_schema(records: list[dict[str, Any]]) -> None:
    """Every record validates against docs/audit-records.schema.json."""
    schema = orjson.loads((ROOT / "docs" / "audit-records.schema.json").read_bytes())
    validator = jsonschema.Draft202012Validator(schema)
    for record in records:
        errors = [e.message for e in validator.iter_errors(record)]
        assert not errors, (record, errors)


def test_an_approved_call_runs_and_its_approval_is_audited_before_the_intent(
    tmp_path: Path, socket_dir: Path
) -> None:
    """The approver sees tool, host, arguments and command; the decision precedes the intent."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        assert entry["tool"] == TOOL and entry["host"] == "ci"
        assert entry["arguments"] == {"project_id": "bluebird"}
        assert entry["command"] == COMMAND and entry["digest"] == DIGEST
        assert entry["caller"]["uid"] == ME
        metrics = running.daemon.metrics.exposition().decode()
        assert "sshadapter_approvals_pending 1.0" in metrics
        answer = await ask_as(APPROVER, running, decide(entry["request_id"]))
        assert answer == {"request_id": entry["request_id"], "decision": "approved"}
        result = await call
        assert result["outcome"] == "success" and result["request_id"] == entry["request_id"]
        mine = result["request_id"]
        records = [r for r in running.audit_records() if r.get("request_id") == mine]
        assert [(r["type"], r.get("event")) for r in records] == [
            ("approval", "requested"),
            ("approval", "approved"),
            ("intent", None),
            ("result", None),
        ]
        assert records[1]["approver"]["uid"] == APPROVER and records[1]["digest"] == DIGEST
        assert records[2]["approval"] == {"approver": records[1]["approver"], "digest": DIGEST}
        check_schema(running.audit_records())
        report = verify([running.audit_path])
        assert report.ok and report.kinds["approval"] == 2
        metrics = running.daemon.metrics.exposition().decode()
        assert "sshadapter_approvals_pending 0.0" in metrics
        assert 'sshadapter_approvals_total{outcome="approved",tool="job_rerun"} 1.0' in metrics

    run(tmp_path, socket_dir, body)


def test_a_fanout_is_approved_with_its_target_and_hosts(tmp_path: Path, socket_dir: Path) -> None:
    """A call on a group shows its target and every host; approved, it runs on all of them."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask({**CALL, "args": {**ARGS, "run_on": "both"}}))
        [entry] = await pending(running)
        assert (entry["target"], entry["hosts"]) == ("both", ["ci", "local"])
        assert "host" not in entry and entry["arguments"] == {"project_id": "bluebird"}
        await ask_as(APPROVER, running, decide(entry["request_id"]))
        result = await call
        assert result["outcome"] == "success" and result["data"]["succeeded"] == 2
        [intent] = [r for r in running.audit_records() if r["type"] == "intent"]
        assert intent["approval"]["approver"]["uid"] == APPROVER
        check_schema(running.audit_records())

    run(tmp_path, socket_dir, body, fleet=True)


def test_a_denied_call_is_denied_and_nothing_runs(tmp_path: Path, socket_dir: Path) -> None:
    """deny: DENIED, not retryable, reason approval_denied, no intent."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        answer = await ask_as(APPROVER, running, deny(entry["request_id"]))
        assert answer["decision"] == "denied"
        result = await call
        assert result["outcome"] == "failure"
        assert result["error"]["code"] == "DENIED" and result["error"]["retryable"] is False
        records = running.audit_records()
        assert not [r for r in records if r["type"] == "intent"]
        [end] = [r for r in records if r["type"] == "result"]
        assert (end["stage"], end["reason"]) == ("approval", "approval_denied")
        check_schema(records)

    run(tmp_path, socket_dir, body)


def test_an_unanswered_call_times_out_and_a_late_approval_is_refused(
    tmp_path: Path, socket_dir: Path
) -> None:
    """Past timeout_seconds: DENIED approval_timeout; approving it afterwards: not_pending."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        result = await call
        assert result["error"]["code"] == "DENIED" and result["error"]["retryable"] is False
        late = await ask_as(APPROVER, running, decide(entry["request_id"]))
        assert late == {"request_id": entry["request_id"], "refused": "not_pending"}
        events = [(r["event"], r.get("reason")) for r in approval_records(running)]
        assert events == [("requested", None), ("timeout", None), ("refused", "not_pending")]
        [end] = [r for r in running.audit_records() if r["type"] == "result"]
        assert end["reason"] == "approval_timeout"
        check_schema(running.audit_records())

    run(tmp_path, socket_dir, body, timeout=1.0)


def test_the_caller_cannot_approve_its_own_call(tmp_path: Path, socket_dir: Path) -> None:
    """An approver's approval of its own call is refused (own_call) and audited; another's runs."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        own = await running.ask(decide(entry["request_id"]))  # this test's uid: the caller
        assert own == {"request_id": entry["request_id"], "refused": "own_call"}
        assert not call.done()
        await ask_as(APPROVER, running, decide(entry["request_id"]))
        assert (await call)["outcome"] == "success"
        refused = [r for r in approval_records(running) if r["event"] == "refused"]
        assert refused[0]["reason"] == "own_call" and refused[0]["approver"]["uid"] == ME
        check_schema(running.audit_records())

    run(tmp_path, socket_dir, body, approvers=(ME, APPROVER))


def test_an_approval_must_name_the_digest_of_the_pending_command(
    tmp_path: Path, socket_dir: Path
) -> None:
    """An approval with another command's digest is refused and leaves the call pending."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        wrong = await ask_as(APPROVER, running, decide(entry["request_id"], "0" * 64))
        assert wrong["refused"] == "digest_mismatch"
        assert len(await pending(running)) == 1
        await ask_as(APPROVER, running, deny(entry["request_id"]))
        await call

    run(tmp_path, socket_dir, body)


def test_a_non_approver_gets_the_answer_of_an_unknown_op(tmp_path: Path, socket_dir: Path) -> None:
    """Neither the caller nor another uid outside [approvals] can list, approve or deny."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        while not running.service.approvals.pending:  # nobody here may list them
            await asyncio.sleep(0.01)
        [request_id] = running.service.approvals.pending
        entry = {"request_id": request_id}
        unknown = await running.ask({"op": "no_such_op"})
        del unknown["request_id"]
        asks = ({"op": "approvals"}, decide(entry["request_id"]), deny(entry["request_id"]))
        for message in asks:
            for answer in (await running.ask(message), await ask_as(APPROVER, running, message)):
                del answer["request_id"]
                assert answer == unknown
        assert not call.done()
        assert not [r for r in approval_records(running) if r["event"] != "requested"]
        running.daemon.stop()  # the drain denies it
        assert (await call)["error"]["code"] == "DENIED"

    run(tmp_path, socket_dir, body, approvers=(12345,))


def test_pending_approvals_are_bounded(tmp_path: Path, socket_dir: Path) -> None:
    """Past max_pending: OVERLOADED at once (approvals_full); a call without approval still runs."""

    async def body(running: Running) -> None:
        calls = [asyncio.create_task(running.ask(CALL)) for _ in range(2)]
        listed = await pending(running, 2)
        over = await running.ask(CALL)
        assert over["error"]["code"] == "OVERLOADED" and over["error"]["retryable"] is True
        [end] = [r for r in running.audit_records() if r["type"] == "result"]
        assert (end["stage"], end["reason"]) == ("admission", "approvals_full")
        # An operation without [approval] never reaches the full gate: it pays nothing.
        plain = await running.ask({**CALL, "tool": "job_run_status"})
        assert plain["outcome"] == "success"
        plain_id = plain["request_id"]
        assert not [r for r in approval_records(running) if r["request_id"] == plain_id]
        for entry in listed:
            await ask_as(APPROVER, running, deny(entry["request_id"]))
        await asyncio.gather(*calls)

    run(tmp_path, socket_dir, body, max_pending=2)


def test_a_reload_that_changes_the_operation_denies_pending_calls(
    tmp_path: Path, socket_dir: Path
) -> None:
    """A reload with the same files keeps the call pending; one that changes the file ends it."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        await pending(running)
        running.daemon.reload()  # nothing changed
        assert len(await pending(running)) == 1
        approval_commands(tmp_path, version=2)  # the operation changed
        running.daemon.reload()
        result = await call
        assert result["error"]["code"] == "DENIED"
        [end] = [r for r in running.audit_records() if r["type"] == "result"]
        assert end["reason"] == "approval_invalidated"
        assert [r["event"] for r in approval_records(running)] == ["requested", "invalidated"]

    run(tmp_path, socket_dir, body)


def test_shutdown_denies_pending_calls(tmp_path: Path, socket_dir: Path) -> None:
    """The drain answers a waiting call DENIED (approval_cancelled) at once, audited."""

    async def body(running: Running) -> None:
        call = asyncio.create_task(running.ask(CALL))
        await pending(running)
        running.daemon.stop()
        result = await asyncio.wait_for(call, 5)
        assert result["error"]["code"] == "DENIED"
        await asyncio.sleep(0.1)
        events = [(r["event"], r.get("reason")) for r in approval_records(running)]
        assert events == [("requested", None), ("cancelled", "shutdown")]
        check_schema(running.audit_records())

    run(tmp_path, socket_dir, body)


def test_the_cli_lists_and_approves_as_an_approver(tmp_path: Path, socket_dir: Path) -> None:
    """`sshadapter approvals list|approve` as the approver show the call in full, then run it."""

    async def body(running: Running) -> None:
        socket = ("--socket", str(running.path))
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        status, out, _ = await cli_as(APPROVER, "approvals", "list", *socket)
        assert status == 0
        for shown in (entry["request_id"], TOOL, "host ci", '{"project_id":"bluebird"}'):
            assert shown in out
        assert f"command    {COMMAND}" in out and DIGEST in out
        status, _, err = await cli_as(ME, "approvals", "list", *socket)
        assert status == 1 and "not an approver" in err
        status, out, _ = await cli_as(
            APPROVER, "approvals", "approve", entry["request_id"], *socket
        )
        assert status == 0 and out.endswith("approved\n") and COMMAND in out
        assert (await call)["outcome"] == "success"

    run(tmp_path, socket_dir, body)


def test_the_cli_lists_as_json_and_keeps_the_approvers_reason_in_the_audit(
    tmp_path: Path, socket_dir: Path
) -> None:
    """`approvals list --json` is the daemon's listing; `deny --reason` is kept, shown escaped."""
    reason = "freeze until Monday \x1b[2J\u202e"
    shown_as = "freeze until Monday \\x1b[2J\\u202e"

    async def body(running: Running) -> None:
        socket = ("--socket", str(running.path))
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        status, out, _ = await cli_as(APPROVER, "approvals", "list", "--json", *socket)
        assert status == 0
        assert [e["request_id"] for e in orjson.loads(out)["approvals"]] == [entry["request_id"]]
        too_long = ("--reason", "x" * (MAX_APPROVAL_NOTE_CHARS + 1))
        status, out, err = await cli_as(
            APPROVER, "approvals", "deny", entry["request_id"], *too_long, *socket
        )
        assert (status, out) == (2, "") and err.count("\n") == 1 and "--reason" in err
        assert await pending(running)  # nothing was sent: the call still waits
        for note in ("x" * (MAX_APPROVAL_NOTE_CHARS + 1), 7):  # the daemon bounds it too
            answer = await ask_as(APPROVER, running, {**deny(entry["request_id"]), "note": note})
            assert answer["error"]["code"] == "INVALID_REQUEST"
        status, out, _ = await cli_as(
            APPROVER, "approvals", "deny", entry["request_id"], "--reason", reason, *socket
        )
        assert status == 0 and out.endswith("denied\n")
        assert (await call)["error"]["code"] == "DENIED"
        [denied] = [r for r in approval_records(running) if r["event"] == "denied"]
        assert denied["note"] == reason
        schema = orjson.loads((ROOT / "docs" / "audit-records.schema.json").read_bytes())
        note_schema = schema["$defs"]["approval"]["properties"]["note"]
        assert note_schema["maxLength"] == MAX_APPROVAL_NOTE_CHARS
        check_schema(running.audit_records())
        status, out, _ = await cli_as(
            ME, "audit", "show", entry["request_id"], str(running.audit_path)
        )
        assert status == 0 and f"    note: {shown_as}" in out.splitlines()
        assert all(line.isprintable() for line in out.splitlines())

    run(tmp_path, socket_dir, body)


def test_a_call_whose_caller_is_killed_is_cancelled_at_once(
    tmp_path: Path, socket_dir: Path
) -> None:
    """A killed `sshadapter call` leaves the list at once, audited `cancelled` (caller_gone).

    It has one result record and no intent; approving it afterwards is one line, status 1.
    """

    async def body(running: Running) -> None:
        socket = ("--socket", str(running.path))
        caller = await asyncio.create_subprocess_exec(
            *CLI, "call", TOOL, "project_id=bluebird", *socket, env=CLI_ENV
        )
        [entry] = await pending(running)
        caller.kill()
        await caller.wait()
        assert await pending(running, 0) == []
        [end] = await ended(running)
        assert (end["request_id"], end["stage"]) == (entry["request_id"], "approval")
        assert (end["code"], end["reason"]) == ("DENIED", "approval_cancelled")
        events = [(r["event"], r.get("reason")) for r in approval_records(running)]
        assert events == [("requested", None), ("cancelled", "caller_gone")]
        status, out, err = await cli_as(
            APPROVER, "approvals", "approve", entry["request_id"], *socket
        )
        assert status == 1 and out == ""
        assert err == f"sshadapter: no call waits under {entry['request_id']}\n"
        late = await ask_as(APPROVER, running, decide(entry["request_id"]))
        assert late == {"request_id": entry["request_id"], "refused": "not_pending"}
        records = running.audit_records()
        assert not [r for r in records if r["type"] == "intent"]
        assert len([r for r in records if r["type"] == "result"]) == 1
        check_schema(records)
        assert verify([running.audit_path]).ok
        metrics = running.daemon.metrics.exposition().decode()
        assert 'sshadapter_approvals_total{outcome="cancelled",tool="job_rerun"} 1.0' in metrics
        assert "sshadapter_approvals_pending 0.0" in metrics

    run(tmp_path, socket_dir, body)


def test_a_call_its_mcp_host_gave_up_on_is_cancelled_at_once(
    tmp_path: Path, socket_dir: Path
) -> None:
    """An MCP host's notifications/cancelled ends the wait: the bridge lets go, nothing runs.

    The bridge closes that call's daemon connection; the daemon cancels the call
    (`caller_gone`), and the list is empty for the approver.
    """

    async def body(running: Running) -> None:
        with raw_bridge(running.path) as bridge:
            await asyncio.to_thread(bridge.initialize)
            asked = bridge.request("tools/call", {"name": TOOL, "arguments": ARGS})
            [entry] = await pending(running)
            cancel = {"requestId": asked, "reason": "the host's request timed out"}
            bridge.write({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": cancel})
            assert await pending(running, 0) == []
            [end] = await ended(running)
            assert (end["request_id"], end["reason"]) == (entry["request_id"], "approval_cancelled")
            assert approval_records(running)[-1]["reason"] == "caller_gone"
            assert not [r for r in running.audit_records() if r["type"] == "intent"]
            assert verify([running.audit_path]).ok

    run(tmp_path, socket_dir, body)


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_an_mcp_call_with_a_progress_token_is_told_it_waits_for_approval(
    tmp_path: Path, socket_dir: Path, decision: str
) -> None:
    """The official SDK hears "waiting for approval", then the hosts' count once approved.

    The approver decides with `sshadapter approvals approve` (or deny); the answer arrives.
    """
    seen: list[tuple[float, float | None, str | None]] = []

    async def progressed(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async def body(running: Running) -> None:
        argv = bridge_argv(running.path)
        async with Client(StdioServerParameters(command=argv[0], args=argv[1:])) as client:
            args = {**ARGS, "run_on": "both"}
            call = asyncio.create_task(client.call_tool(TOOL, args, progress_callback=progressed))
            [entry] = await pending(running)
            for _ in range(500):
                if seen:
                    break
                await asyncio.sleep(0.01)
            assert seen == [(0, None, "waiting for approval")]
            status, out, _ = await cli_as(
                APPROVER, "approvals", decision, entry["request_id"], "--socket", str(running.path)
            )
            assert status == 0, out
            result = await call
        answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
        if decision == "approve":
            assert answer["outcome"] == "success" and answer["data"]["succeeded"] == 2
            assert seen[-1] == (2, 2, None)
        else:
            assert answer["error"]["code"] == "DENIED"
            assert seen == [(0, None, "waiting for approval")]
        assert verify([running.audit_path]).ok

    run(tmp_path, socket_dir, body, fleet=True)


# The Python SDK (mcp 2.3) has the 2025-11-25 task types but no task client: its session
# checks a tools/call answer as a CallToolResult. So these lines go to the bridge as a
# host's transport writes them (RawBridge), and each answer is checked with the SDK's own
# types. The TypeScript SDK's task client drives the same calls in test_mcp_node.py.
TASK_CALL: Final = {"name": TOOL, "arguments": ARGS, "task": {"ttl": 60_000}}


async def task_ask(bridge: RawBridge, method: str, task_id: str) -> dict[str, Any]:
    """One tasks/* request about ``task_id``, and its JSON-RPC answer."""
    return await asyncio.to_thread(bridge.ask, method, {"taskId": task_id})


def test_a_fan_out_run_as_an_mcp_task_is_polled_and_its_result_kept_after_approval(
    tmp_path: Path, socket_dir: Path
) -> None:
    """tools/call with `task` answers at once; tasks/get says it waits; tasks/result, the call.

    The task's TTL is raised to the longest a call can take; its progressToken hears the
    wait and the hosts; tasks/list has it; the result is read twice.
    """

    async def body(running: Running) -> None:
        with raw_bridge(running.path) as bridge:
            init = await asyncio.to_thread(bridge.initialize)
            assert "call" in init["result"]["capabilities"]["tasks"]["requests"]["tools"]
            tools = (await asyncio.to_thread(bridge.ask, "tools/list"))["result"]["tools"]
            listed = types.Tool.model_validate(next(t for t in tools if t["name"] == TOOL))
            assert listed.execution is not None and listed.execution.task_support == "optional"
            fan_out = {
                **TASK_CALL,
                "arguments": {**ARGS, "run_on": "both"},
                "_meta": {"progressToken": "t1"},
            }
            created = await asyncio.to_thread(bridge.ask, "tools/call", fan_out)
            task = types.CreateTaskResult.model_validate(created["result"]).task
            assert (task.status, task.ttl, task.poll_interval) == ("working", 1_800_000, 1_000)
            [entry] = await pending(running)  # the call runs on after its answer
            for _ in range(500):
                got = await task_ask(bridge, "tasks/get", task.task_id)
                state = types.GetTaskResult.model_validate(got["result"])
                if state.status_message is not None:
                    break
                await asyncio.sleep(0.01)
            assert (state.status, state.status_message) == ("working", "waiting for approval")
            waiting = bridge.request("tasks/result", {"taskId": task.task_id})
            status, out, _ = await cli_as(
                APPROVER, "approvals", "approve", entry["request_id"], "--socket", str(running.path)
            )
            assert status == 0, out
            answered = await asyncio.to_thread(bridge.answer, waiting)  # blocked until the end
            result = types.CallToolResult.model_validate(answered["result"])
            assert result.meta == {"io.modelcontextprotocol/related-task": {"taskId": task.task_id}}
            answer = json.loads(result.content[0].text)  # type: ignore[union-attr]
            assert answer["outcome"] == "success" and answer["request_id"] == entry["request_id"]
            assert answer["data"]["succeeded"] == 2
            heard = [
                types.ProgressNotificationParams.model_validate(m["params"])
                for m in bridge.messages()
                if m.get("method") == "notifications/progress"
            ]
            assert {p.progress_token for p in heard} == {"t1"}
            assert (heard[0].progress, heard[0].message) == (0, "waiting for approval")
            assert (heard[-1].progress, heard[-1].total) == (2, 2)
            done = await task_ask(bridge, "tasks/get", task.task_id)
            assert types.GetTaskResult.model_validate(done["result"]).status == "completed"
            again = await task_ask(bridge, "tasks/result", task.task_id)
            assert again["result"] == answered["result"]  # kept for its TTL, read again
            listing = (await asyncio.to_thread(bridge.ask, "tasks/list"))["result"]
            tasks = types.ListTasksResult.model_validate(listing).tasks
            assert [t.task_id for t in tasks] == [task.task_id]
        assert verify([running.audit_path]).ok

    run(tmp_path, socket_dir, body, fleet=True)


def test_cancelling_an_mcp_task_cancels_its_pending_approval(
    tmp_path: Path, socket_dir: Path
) -> None:
    """tasks/cancel: the approval leaves the list, audited `cancelled`; unknown ids are -32602.

    A cancelled task cannot be cancelled again, and its result is an error; the audit
    trail verifies.
    """

    async def body(running: Running) -> None:
        with raw_bridge(running.path) as bridge:
            await asyncio.to_thread(bridge.initialize)
            created = await asyncio.to_thread(bridge.ask, "tools/call", TASK_CALL)
            task = types.CreateTaskResult.model_validate(created["result"]).task
            [entry] = await pending(running)
            cancelled = await task_ask(bridge, "tasks/cancel", task.task_id)
            assert types.CancelTaskResult.model_validate(cancelled["result"]).status == "cancelled"
            assert await pending(running, 0) == []
            [end] = await ended(running)
            assert (end["request_id"], end["reason"]) == (entry["request_id"], "approval_cancelled")
            assert approval_records(running)[-1]["event"] == "cancelled"
            assert approval_records(running)[-1]["reason"] == "caller_gone"
            got = await task_ask(bridge, "tasks/get", task.task_id)
            assert got["result"]["status"] == "cancelled"
            twice = await task_ask(bridge, "tasks/cancel", task.task_id)
            assert twice["error"]["code"] == -32602
            assert (await task_ask(bridge, "tasks/result", task.task_id))["error"]["code"] == -32602
            for foreign in ("no-such-task", task.task_id[:-1]):
                unknown = await task_ask(bridge, "tasks/get", foreign)
                assert unknown["error"]["code"] == -32602
                assert unknown["error"]["message"] == "Invalid params: unknown taskId"
        assert not [r for r in running.audit_records() if r["type"] == "intent"]
        check_schema(running.audit_records())
        assert verify([running.audit_path]).ok

    run(tmp_path, socket_dir, body)


def test_an_agent_that_asks_again_leaves_one_call_to_approve(
    tmp_path: Path, socket_dir: Path
) -> None:
    """A retry after the first connection closed: only the live call is listed, run once.

    The listing says how long its caller has been waiting.
    """

    async def body(running: Running) -> None:
        _, first = await asyncio.open_unix_connection(str(running.path))
        first.write(orjson.dumps(CALL) + b"\n")
        [gone] = await pending(running)
        first.close()  # the agent host gave up on it, and asks again
        await first.wait_closed()
        retry = asyncio.create_task(running.ask(CALL))
        for _ in range(200):
            listed = await pending(running)
            if listed[0]["request_id"] != gone["request_id"]:
                break
        [live] = listed
        assert live["request_id"] != gone["request_id"]
        assert isinstance(live["waiting_seconds"], int) and live["waiting_seconds"] >= 0
        status, out, _ = await cli_as(APPROVER, "approvals", "list", "--socket", str(running.path))
        assert status == 0 and gone["request_id"] not in out
        assert re.search(r"^  waiting    \d+s$", out, re.MULTILINE)
        await ask_as(APPROVER, running, decide(live["request_id"]))
        assert (await retry)["outcome"] == "success"
        records = running.audit_records()
        assert [r["request_id"] for r in records if r["type"] == "intent"] == [live["request_id"]]
        assert len([r for r in records if r["type"] == "result"]) == 2
        assert verify([running.audit_path]).ok

    run(tmp_path, socket_dir, body)


def test_a_caller_that_only_shuts_its_writing_side_is_still_waited_for(
    tmp_path: Path, socket_dir: Path
) -> None:
    """Half-closed (still reading) is not gone; requests sent ahead are answered in order."""

    async def body(running: Running) -> None:
        reader, writer = await asyncio.open_unix_connection(str(running.path))
        writer.write(orjson.dumps(CALL) + b"\n" + orjson.dumps({"op": "list"}) + b"\n")
        writer.write_eof()
        [entry] = await pending(running)
        await ask_as(APPROVER, running, decide(entry["request_id"]))
        assert orjson.loads(await reader.readline())["outcome"] == "success"
        assert "tools" in orjson.loads(await reader.readline())
        writer.close()

    run(tmp_path, socket_dir, body)


# What an approval operation's parameter may still admit (no control character, no bidi
# control, no line separator): an invisible zero-width space and a backslash.
LOOSE_PATTERN: Final = (
    "^[^\\x00-\\x1f\\x7f-\\x9f\\u061c\\u200e\\u200f\\u2028-\\u202e\\u2066-\\u2069 ]{1,64}$"
)


def test_the_approver_sees_every_field_escaped(tmp_path: Path, socket_dir: Path) -> None:
    """`approvals list` and `approve` show a zero-width space and a backslash escaped.

    The screen cannot pass the argument off as another one: what it prints is one
    printable ASCII line per field.
    """
    hostile = "blue\u200bbird\\x1b[2K"
    shown_as = "blue\\u200bbird\\\\x1b[2K"

    async def body(running: Running) -> None:
        socket = ("--socket", str(running.path))
        call = asyncio.create_task(running.ask({**CALL, "args": {"project_id": hostile}}))
        [entry] = await pending(running)
        assert entry["arguments"] == {"project_id": hostile}
        status, listed, _ = await cli_as(APPROVER, "approvals", "list", *socket)
        assert status == 0 and shown_as in listed
        status, out, _ = await cli_as(
            APPROVER, "approvals", "approve", entry["request_id"], *socket
        )
        assert status == 0 and shown_as in out
        for text in (listed, out):
            assert text.isascii() and all(line.isprintable() for line in text.splitlines())
            assert f"command    ci-cli run status --json --project '{shown_as}'" in text
        await call

    run(tmp_path, socket_dir, body, pattern=LOOSE_PATTERN)


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("^.{1,64}$", "admits control characters"),
        ("^\\S+$", "admits control characters"),
        ("^[^ ]+$", "admits control characters"),
        ("^[^\\x00-\\x1f\\x7f-\\x9f]+$", "admits control characters"),  # bidi overrides
        ("^[\\s\\w]+$", "admits control characters"),  # a tab, a newline
        ("[a-z]+", "admits control characters"),  # searched for: anything around it
        ("(?m)^[a-z]+$", "admits control characters"),  # one line of several
        ("^[a-z]+\\z", "cannot be read"),
    ],
)
def test_an_approval_parameter_that_admits_control_characters_is_refused(
    tmp_path: Path, pattern: str, why: str
) -> None:
    """An approval operation's parameter that admits ESC, CR or a bidi override is refused.

    One line naming the file, the key and the reason, at load.
    """
    approval_commands(tmp_path, pattern=pattern)
    with pytest.raises(ConfigError) as error:
        load(approval_config(tmp_path))
    text = str(error.value)
    assert text.startswith(
        f"{tmp_path / 'commands' / 'job_rerun.toml'}: params.project_id.pattern: "
    )
    assert why in text and "\n" not in text


def test_an_approval_parameter_without_control_characters_loads(tmp_path: Path) -> None:
    """Anchored classes that leave every control out load, the shipped patterns among them."""
    for pattern in (
        "^[a-z0-9][a-z0-9-]{2,62}$",
        "^(a|b)[\\w.-]{0,9}$",
        "^[^\\s\\W]+$",
        LOOSE_PATTERN,
    ):
        approval_commands(tmp_path, pattern=pattern)
        load(approval_config(tmp_path))


def approval_config(tmp_path: Path) -> Config:
    """A configuration with the commands in ``tmp_path``, hosts `ci` and `local`, an approver."""
    host = HostSection(address="127.0.0.1", user="nobody", known_hosts=tmp_path / "known_hosts")
    return Config(
        paths=PathsSection(commands=tmp_path / "commands", schemas=ROOT / "schemas"),
        hosts={"ci": host, "local": host},
        approvals=ApprovalsSection(uids=(APPROVER,)),
    )


def test_approval_needs_an_approver_and_a_bounded_timeout(tmp_path: Path) -> None:
    """No approver configured, or a timeout past its maximum: a load error naming the key."""
    commands = approval_commands(tmp_path)
    host = HostSection(address="127.0.0.1", user="nobody", known_hosts=tmp_path / "known_hosts")
    config = Config(
        paths=PathsSection(commands=commands, schemas=ROOT / "schemas"),
        hosts={"ci": host, "local": host},
    )
    with pytest.raises(ConfigError, match=r"approval\.required: no approver"):
        load(config)
    load(config.model_copy(update={"approvals": ApprovalsSection(groups=("wheel",))}))
    approval_commands(tmp_path, timeout=MAX_APPROVAL_TIMEOUT_SECONDS + 1)
    with pytest.raises(ConfigError, match=r"approval\.timeout_seconds"):
        load(config.model_copy(update={"approvals": ApprovalsSection(uids=(APPROVER,))}))


def test_the_mcp_bridge_sends_no_approver_request() -> None:
    """The bridge's sources name none of the approvers' ops: it cannot approve anything."""
    sources = " ".join(p.read_text() for p in (ROOT / "sshadapter" / "mcp").glob("*.py"))
    for op in ('"approve"', '"deny"', '"approvals"'):
        assert op not in sources
