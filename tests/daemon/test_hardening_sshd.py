"""Hostile cases against a real sshd: every call answered, nothing lost, no caller stalls others.

Each test is one defect class found by hostile testing (issue 9): the drain on
SIGTERM, an argument no remote command can receive, a burst of connections
while the daemon is busy. The daemon runs as `sshadapter serve` where signals
matter, in-process otherwise; the host is the real OpenSSH sshd of tests/support/sshd.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from daemon_harness import ROOT, Running, with_daemon
from sshd import Sshd, running_sshd

from sshadapter.audit.verify import verify
from sshadapter.runners.ssh.runner import SshRunner

START_TIMEOUT_SECONDS = 20.0

# `sleep S; echo WORD` on the host: a call that is still running when something happens.
SLOW_TOML = """\
description = "Waits, then prints one word: a call that is in flight when the test acts."
version = 1
host = "ci"
argv = ["sh", "-c", 'sleep "$1"; echo "$2"', "sh", "{seconds}", "{word}"]
timeout_seconds = 30

[params.seconds]
type = "integer"
minimum = 0
maximum = 20

[params.word]
type = "string"
pattern = '^[a-z]{1,16}$'

[output]
format = "regex"
pattern = '^(?P<word>[a-z]{1,16})$'
schema = "word.v1.json"

[agent]
fields = ["word"]
"""

# A parameter whose pattern admits free text, NUL included: the kind operators write.
ECHO_TOML = """\
description = "Prints its argument back."
version = 1
host = "ci"
argv = ["printf", "%s\\\\n", "{text}"]

[params.text]
type = "string"
pattern = '^.{0,64}$'

[output]
format = "regex"
pattern = '^(?P<word>[a-z]{1,16})$'
schema = "word.v1.json"

[agent]
fields = ["word"]
"""

WORD_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["word"],
    "properties": {"word": {"type": "string", "pattern": "^[a-z]{1,16}$"}},
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        yield server


def contract(directory: Path) -> tuple[Path, Path]:
    commands, schemas = directory / "commands", directory / "schemas"
    commands.mkdir()
    schemas.mkdir()
    (commands / "slow_word.toml").write_text(SLOW_TOML)
    (commands / "echo_text.toml").write_text(ECHO_TOML)
    (schemas / "word.v1.json").write_text(json.dumps(WORD_SCHEMA))
    return commands, schemas


def write_config(directory: Path, sshd: Sshd, *, drain_timeout: float = 30.0) -> Path:
    contract(directory)
    config = directory / "config.toml"
    config.write_text(f"""\
[server]
socket_path = "{directory / "sshadapter.sock"}"
allow = {{ uids = [{os.getuid()}] }}
drain_timeout_seconds = {drain_timeout}

[paths]
commands = "commands"
schemas = "schemas"

[audit]
path = "{directory / "audit.jsonl"}"
quarantine_dir = "{directory / "quarantine"}"

{sshd.host_toml("ci")}""")
    return config


class Served:
    """`sshadapter serve` in a subprocess, ready once its socket answers `list`."""

    def __init__(self, directory: Path, config: Path) -> None:
        self.socket = directory / "sshadapter.sock"
        self.log_path = directory / "daemon.log"
        self._log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stderr=self._log,
        )
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            try:
                if "tools" in self.ask({"op": "list"}):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise AssertionError(f"daemon did not start: {self.log_path.read_text()}")
            time.sleep(0.05)

    def connect(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(60)
        try:
            sock.connect(str(self.socket))
        except OSError:
            sock.close()
            raise
        return sock

    def ask(self, message: dict[str, Any]) -> Any:
        with self.connect() as sock:
            sock.sendall(orjson.dumps(message) + b"\n")
            return orjson.loads(read_line(sock))

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._log.close()


def read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data


def slow(seconds: int, word: str = "done") -> dict[str, Any]:
    return {"op": "call", "tool": "slow_word", "args": {"seconds": seconds, "word": word}}


def records(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (directory / "audit.jsonl").read_text().splitlines()]


def test_sigterm_waits_for_the_answer_of_a_call_in_flight(sshd: Sshd, tmp_path: Path) -> None:
    """SIGTERM 0.8 s into a 3 s call: the agent still gets its success, then the daemon exits 0."""
    served = Served(tmp_path, write_config(tmp_path, sshd))
    try:
        with served.connect() as sock:
            sock.sendall(orjson.dumps(slow(3)) + b"\n")
            time.sleep(0.8)
            served.process.send_signal(signal.SIGTERM)
            answer = orjson.loads(read_line(sock))
        assert answer["outcome"] == "success" and answer["data"] == {"word": "done"}
        assert served.process.wait(30) == 0
    finally:
        served.close()
    result = [r for r in records(tmp_path) if r["type"] == "result"]
    assert [(r["request_id"], r["outcome"]) for r in result] == [(answer["request_id"], "success")]


def test_a_request_read_during_the_drain_is_answered_overloaded(sshd: Sshd, tmp_path: Path) -> None:
    """A request sent during the drain never runs: OVERLOADED, or the connection closes."""
    served = Served(tmp_path, write_config(tmp_path, sshd))
    try:
        with served.connect() as sock:
            sock.sendall(orjson.dumps(slow(2)) + b"\n")
            time.sleep(0.5)
            served.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            sock.sendall(orjson.dumps(slow(0, "late")) + b"\n")
            first = orjson.loads(read_line(sock))
            try:
                second = read_line(sock)
            except ConnectionResetError:  # the daemon closed with the late line unread
                second = b""
        assert first["outcome"] == "success"
        # The drain stopped reading at SIGTERM: a line already buffered is answered
        # OVERLOADED (nothing ran), one sent later finds the connection closed.
        if second:
            assert orjson.loads(second)["error"] == {"code": "OVERLOADED", "retryable": True}
        assert served.process.wait(30) == 0
    finally:
        served.close()
    assert len([r for r in records(tmp_path) if r["type"] == "intent"]) == 1  # the late one: none


def test_past_the_drain_deadline_a_call_is_cut_answered_and_audited(
    sshd: Sshd, tmp_path: Path
) -> None:
    """A 10 s call, a 1 s drain: INTERNAL to the agent, a result record, the log names it."""
    served = Served(tmp_path, write_config(tmp_path, sshd, drain_timeout=1.0))
    try:
        with served.connect() as sock:
            sock.sendall(orjson.dumps(slow(10)) + b"\n")
            time.sleep(0.8)
            served.process.send_signal(signal.SIGTERM)
            answer = orjson.loads(read_line(sock))
        assert answer["error"] == {"code": "INTERNAL", "retryable": False}
        assert served.process.wait(30) == 0
    finally:
        served.close()
    rid = answer["request_id"]
    result = [r for r in records(tmp_path) if r["type"] == "result"]
    assert [(r["request_id"], r["stage"], r["reason"]) for r in result] == [
        (rid, "shutdown", "drain_deadline")
    ]
    assert f"cutting 1 calls: {rid} (slow_word)" in served.log_path.read_text()
    report = verify([tmp_path / "audit.jsonl"])
    assert report.ok and not report.open_intents


def test_a_nul_argument_is_refused_and_the_shared_connection_survives(
    sshd: Sshd, tmp_path: Path
) -> None:
    """A NUL argument passes a free-text pattern but never reaches sshd.

    4 calls sharing its connection succeed, and the NUL call itself is INVALID_REQUEST, not
    retryable."""
    commands, schemas = contract(tmp_path)
    hosts = {"ci": sshd.host_section()}
    runner = SshRunner(hosts)

    async def body(d: Running) -> None:
        try:
            running = [asyncio.create_task(d.ask(slow(1, f"w{'abcd'[i]}"))) for i in range(4)]
            await asyncio.sleep(0.3)  # the four are running on the pooled connection
            nul = await d.ask({"op": "call", "tool": "echo_text", "args": {"text": "ab\x00cd"}})
            answers = await asyncio.gather(*running)
            assert nul["error"] == {"code": "INVALID_REQUEST", "retryable": False}
            assert [a["outcome"] for a in answers] == ["success"] * 4
            assert runner.connections() == {"ci": 1}
            rid = nul["request_id"]
            result = [r for r in d.audit_records() if r.get("request_id") == rid]
            assert [(r["type"], r["reason"]) for r in result] == [("result", "unsendable_argument")]
        finally:
            await runner.close()

    with_daemon(tmp_path, body, runner=runner, commands=commands, schemas=schemas, hosts=hosts)


def test_a_burst_of_connections_while_the_daemon_is_busy_is_queued_not_refused(
    sshd: Sshd, tmp_path: Path
) -> None:
    """150 connects while the daemon cannot accept (stopped): none gets EAGAIN, all are answered."""
    served = Served(tmp_path, write_config(tmp_path, sshd))
    sockets: list[socket.socket] = []
    try:
        served.process.send_signal(signal.SIGSTOP)  # the loop cannot accept: the backlog fills
        refused = 0
        for _ in range(150):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(str(served.socket))
            except BlockingIOError:
                refused += 1
                sock.close()
                continue
            sockets.append(sock)
        served.process.send_signal(signal.SIGCONT)
        assert refused == 0
        for sock in sockets:
            sock.setblocking(True)
            sock.settimeout(60)
            sock.sendall(b'{"op": "list"}\n')
        assert all("tools" in orjson.loads(read_line(sock)) for sock in sockets)
    finally:
        for sock in sockets:
            sock.close()
        served.process.send_signal(signal.SIGCONT)
        served.close()


def children_of(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_evaluation_workers_die_with_the_daemon(sshd: Sshd, tmp_path: Path) -> None:
    """SIGKILL the daemon: its evaluation worker does not live on as an orphan."""
    served = Served(tmp_path, write_config(tmp_path, sshd))
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not (workers := children_of(served.process.pid)):
            assert time.monotonic() < deadline, "no evaluation worker started"
            time.sleep(0.05)
        served.process.kill()
        served.process.wait()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in workers):
            assert time.monotonic() < deadline, f"worker outlived the daemon: {workers}"
            time.sleep(0.05)
    finally:
        served.close()
