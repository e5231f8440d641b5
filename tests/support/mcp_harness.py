"""A real daemon (`sshadapter serve`) on the test sshd, and `sshadapter mcp` in front of it.

The daemon runs as a subprocess, as an operator runs it, with the shipped
commands plus two test-only operations (below); the bridge is started the way
an agent host starts it: `sshadapter mcp --socket PATH`, talking JSON-RPC on
its standard streams.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sshd import Sshd

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 20.0  # the daemon imports asyncssh and warms its hosts
STOP_TIMEOUT_SECONDS = 30.0  # drain_timeout_seconds
AUDIT_WAIT_SECONDS = 15.0

SHIPPED_TOOLS = sorted(p.stem for p in (ROOT / "commands").glob("*.toml"))

# Test-only reads, real commands on the test sshd: one that takes a while (cancellation,
# concurrency), one with a date-time field (the clients assert formats).
SLOW_READ = """\
description = "Waits SECONDS seconds on the host, then reports that it is done."
version = 1
host = "local"
argv = ["sh", "-c", "sleep \\"$0\\" && echo done", "{seconds}"]
timeout_seconds = 20
idempotent = true
read_only = true

[params.seconds]
type = "integer"
minimum = 0
maximum = 10

[output]
format = "regex"
schema = "slow_read.v1.json"
max_bytes = 64
pattern = '^(?P<word>done)$'

[agent]
fields = ["word"]
"""
SLOW_READ_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["word"],
    "properties": {"word": {"type": "string", "enum": ["done"]}},
    "additionalProperties": False,
}
CLOCK_READ = """\
description = "The host's clock, in UTC."
version = 1
host = "local"
argv = ["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"]
timeout_seconds = 5
idempotent = true
read_only = true

[output]
format = "regex"
schema = "clock_read.v1.json"
max_bytes = 64
pattern = '^(?P<now>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z)$'

[agent]
fields = ["now"]
"""
CLOCK_READ_SCHEMA = {  # format: date-time, which the TypeScript clients assert
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["now"],
    "properties": {"now": {"type": "string", "format": "date-time", "maxLength": 20}},
    "additionalProperties": False,
}
TEST_TOOLS = ["clock_read", "slow_read"]


@dataclass
class Daemon:
    """`sshadapter serve` in its own directory; stop, restart and reload it at will."""

    workdir: Path
    config: Path
    argv: list[str] | None = None
    """How to start it: `sshadapter serve --config CONFIG` unless given."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.workdir / "sshadapter.sock"

    @property
    def commands(self) -> Path:
        return self.workdir / "commands"

    @property
    def log(self) -> Path:
        return self.workdir / "daemon.log"

    def start(self) -> None:
        notify_path = self.workdir / "notify"
        notify_path.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(notify_path))
            with self.log.open("ab") as log:
                serve = [sys.executable, "-m", "sshadapter.cli", "serve", "--config"]
                self.process = subprocess.Popen(
                    self.argv or [*serve, str(self.config)],
                    cwd=ROOT,
                    env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                )
            _wait_for(notify, "READY=1", self.log)

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def reload(self) -> None:
        """SIGHUP, returning once the daemon says READY=1 again."""
        assert self.process is not None
        notify_path = self.workdir / "notify"
        notify_path.unlink(missing_ok=True)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
            notify.bind(str(notify_path))
            self.process.send_signal(signal.SIGHUP)
            _wait_for(notify, "READY=1", self.log)

    def audit_records(self) -> list[dict[str, Any]]:
        path = self.workdir / "audit.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def wait_for_result(self, tool: str, **fields: Any) -> dict[str, Any]:
        """The first result record for ``tool`` matching ``fields``, once it is written."""
        deadline = time.monotonic() + AUDIT_WAIT_SECONDS
        while time.monotonic() < deadline:
            for record in self.audit_records():
                if (record["type"], record.get("tool")) == ("result", tool) and all(
                    record.get(k) == v for k, v in fields.items()
                ):
                    return record
            time.sleep(0.05)
        raise AssertionError(f"no result record for {tool} {fields} in the audit trail")


def _wait_for(notify: socket.socket, message: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while True:
        notify.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            if notify.recv(4096).decode() == message:
                return
        except TimeoutError:
            raise AssertionError(f"no {message} from the daemon: {log.read_text()}") from None


def write_daemon_files(workdir: Path, sshd: Sshd) -> Path:
    """Shipped commands and schemas plus the test tools, all open to this uid; both host
    aliases on the test sshd (the `ci` tools then fail: there is no ci-cli there)."""
    shutil.copytree(ROOT / "commands", workdir / "commands")
    shutil.copytree(ROOT / "schemas", workdir / "schemas")
    for path in (workdir / "commands").glob("*.toml"):  # the `ci` examples: this uid too
        path.write_text(
            path.read_text().replace(
                'allow = { groups = ["sshadapter-agents"] }',
                f'allow = {{ groups = ["sshadapter-agents"], uids = [{os.getuid()}] }}',
            )
        )
    (workdir / "commands" / "slow_read.toml").write_text(SLOW_READ)
    (workdir / "schemas" / "slow_read.v1.json").write_text(json.dumps(SLOW_READ_SCHEMA))
    (workdir / "commands" / "clock_read.toml").write_text(CLOCK_READ)
    (workdir / "schemas" / "clock_read.v1.json").write_text(json.dumps(CLOCK_READ_SCHEMA))
    hosts = sshd.host_toml("ci", "local")
    config = workdir / "config.toml"
    config.write_text(f"""\
[server]
socket_path = "{workdir / "sshadapter.sock"}"
allow = {{ uids = [{os.getuid()}] }}

[paths]
commands = "commands"
schemas = "schemas"

[audit]
path = "{workdir / "audit.jsonl"}"
fsync = "never"
quarantine_dir = "{workdir / "quarantine"}"

[metrics]
listen = ""

{hosts}""")
    return config


@contextlib.contextmanager
def running_daemon(workdir: Path, sshd: Sshd) -> Iterator[Daemon]:
    workdir.mkdir(parents=True, exist_ok=True)
    daemon = Daemon(workdir, write_daemon_files(workdir, sshd))
    daemon.start()
    try:
        yield daemon
    finally:
        daemon.stop()
        assert "Traceback" not in daemon.log.read_text(), daemon.log.read_text()


def bridge_argv(socket_path: Path) -> list[str]:
    """How an agent host starts the bridge (the guide's configuration, this interpreter)."""
    return [sys.executable, "-m", "sshadapter.cli", "mcp", "--socket", str(socket_path)]


def edit_description(daemon: Daemon, tool: str, text: str) -> None:
    """Change one published field of ``tool`` (its description), then reload the daemon."""
    path = daemon.commands / f"{tool}.toml"
    lines = path.read_text().splitlines(keepends=True)
    lines = [
        f"description = {json.dumps(text)}\n" if ln.startswith("description") else ln
        for ln in lines
    ]
    path.write_text("".join(lines))
    daemon.reload()


ANSWER_TIMEOUT_SECONDS = 30.0  # one answer from the bridge; a call over SSH takes milliseconds
EXIT_TIMEOUT_SECONDS = 15.0  # after end of input: EOF_DRAIN_SECONDS plus start-up slack


class RawBridge:
    """`sshadapter mcp` driven line by line, as a host's transport does, with nothing in between.

    Every line it writes to stdout is kept in ``lines`` and must be JSON-RPC.
    """

    def __init__(self, socket_path: Path) -> None:
        self.process = subprocess.Popen(
            bridge_argv(socket_path),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self.lines: list[bytes] = []
        self._buffer = b""
        self._stderr = b""
        self._next_id = 1000

    def write(self, message: Mapping[str, Any] | bytes) -> None:
        assert self.process.stdin is not None
        line = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        self.process.stdin.write(line)
        self.process.stdin.flush()

    def request(self, method: str, params: Mapping[str, Any] | None = None, **extra: Any) -> Any:
        """Send a request with a fresh id; return that id."""
        self._next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        self.write({**message, **extra})
        return self._next_id

    def ask(self, method: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """A request and its answer (anything else that arrives first is kept, not lost)."""
        return self.answer(self.request(method, params))

    def initialize(self, version: str = "2025-11-25") -> dict[str, Any]:
        params = {"protocolVersion": version, "capabilities": {}, "clientInfo": CLIENT_INFO}
        answer = self.ask("initialize", params)
        self.write({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return answer

    def answer(self, request_id: Any, timeout: float = ANSWER_TIMEOUT_SECONDS) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            for message in self.messages()[seen:]:
                if message.get("id") == request_id and "method" not in message:
                    return message
            seen = len(self.lines)
            self._read(deadline)

    def messages(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]

    def _read(self, deadline: float) -> None:
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no answer in time; stdout so far: {self.lines}")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise AssertionError("the bridge closed stdout")
        self._buffer += chunk
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines.extend(complete)

    def close(self) -> int:
        """Close stdin as a host does at shutdown; the exit status, all output read."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.stdin = None  # communicate() would flush it
        out, err = self.process.communicate(timeout=EXIT_TIMEOUT_SECONDS)
        self._stderr = err
        self._buffer += out
        *complete, self._buffer = self._buffer.split(b"\n")
        self.lines.extend(complete)
        assert self._buffer == b"", "a last line without its newline"
        return self.process.returncode

    def stderr(self) -> str:
        """Everything the bridge logged; only once it has exited (close() or kill())."""
        return self._stderr.decode(errors="replace")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        if self.process.stdin is not None:
            self.process.stdin.close()
            self.process.stdin = None
        self.process.communicate()


CLIENT_INFO = {"name": "sshadapter-tests", "version": "1.0.0"}
MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
}


def is_jsonrpc(line: bytes) -> bool:
    """One complete JSON-RPC 2.0 response or notification, and nothing else."""
    try:
        message = json.loads(line)
    except ValueError:
        return False
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return False
    if "method" in message:
        return "id" not in message and isinstance(message["method"], str)
    error = message.get("error")
    return "id" in message and (
        ("result" in message and error is None and isinstance(message["result"], dict))
        or (
            "result" not in message
            and isinstance(error, dict)
            and isinstance(error.get("code"), int)
            and isinstance(error.get("message"), str)
        )
    )


@contextlib.contextmanager
def raw_bridge(socket_path: Path) -> Iterator[RawBridge]:
    bridge = RawBridge(socket_path)
    try:
        yield bridge
    finally:
        bridge.kill()
        assert all(is_jsonrpc(line) for line in bridge.lines), bridge.lines
