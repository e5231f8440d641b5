"""Human approval, through the real socket: the approver is another uid (``nobody``,
connecting from its own process, so SO_PEERCRED names it), the caller is this test's."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import jsonschema
import orjson
import pytest
from daemon_harness import ROOT, Running, shipped_commands, with_daemon

from sshadapter.config import ApprovalsSection, Config, GroupSection, HostSection, PathsSection
from sshadapter.contract.commandfile import MAX_APPROVAL_TIMEOUT_SECONDS
from sshadapter.daemon.audit_verify import verify
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


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A directory the approver's uid can reach (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="sshadapter-approve-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def approval_commands(
    tmp_path: Path, timeout: float = 60.0, version: int = 1, *, fleet: bool = False
) -> Path:
    """The shipped commands plus job_rerun: job_run_status's command, requiring approval
    (``fleet``: on the targets of group `both`, instead of host `ci`)."""
    commands = shipped_commands(tmp_path)
    text = (commands / "job_run_status.toml").read_text()
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
) -> None:
    with_daemon(
        tmp_path,
        body,
        commands=approval_commands(tmp_path, timeout, fleet=fleet),
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
    """The approver's listing, once ``count`` calls wait."""
    for _ in range(200):
        listed = (await ask_as(APPROVER, running, {"op": "approvals"}))["approvals"]
        if len(listed) >= count:
            return list(listed)
        await asyncio.sleep(0.02)
    raise AssertionError("no call became pending")


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
        assert [r["event"] for r in approval_records(running)] == ["requested", "cancelled"]

    run(tmp_path, socket_dir, body)


def test_the_cli_lists_and_approves_as_an_approver(tmp_path: Path, socket_dir: Path) -> None:
    """`sshadapter approvals list|approve` as the approver show the call in full, then run it."""
    assert SYSTEM_PYTHON is not None
    cli = [SYSTEM_PYTHON, "-c", "import sys; from sshadapter.cli import main; sys.exit(main())"]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), *LIBRARIES]), "PATH": "/usr/bin:/bin"}

    async def sshadapter(*words: str, uid: int = APPROVER) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            *cli,
            *words,
            user=uid,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate()
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    async def body(running: Running) -> None:
        socket = ("--socket", str(running.path))
        call = asyncio.create_task(running.ask(CALL))
        [entry] = await pending(running)
        status, out, _ = await sshadapter("approvals", "list", *socket)
        assert status == 0
        for shown in (entry["request_id"], TOOL, "host ci", '{"project_id":"bluebird"}'):
            assert shown in out
        assert f"command    {COMMAND}" in out and DIGEST in out
        status, _, err = await sshadapter("approvals", "list", *socket, uid=ME)
        assert status == 1 and "not an approver" in err
        status, out, _ = await sshadapter("approvals", "approve", entry["request_id"], *socket)
        assert status == 0 and out.endswith("approved\n") and COMMAND in out
        assert (await call)["outcome"] == "success"

    run(tmp_path, socket_dir, body)


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
