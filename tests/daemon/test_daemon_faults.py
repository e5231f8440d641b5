"""Faults sshd cannot produce on demand, seen by the agent through the whole daemon.

socket -> Service -> SshRunner -> the asyncssh fault server of tests/support/sshd.py. Each
test checks the envelope the agent gets, the audit record the operator gets, and
that the same daemon answers a normal call right after the fault.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import asyncssh
import orjson
import pytest
from daemon_harness import Running, with_daemon
from sshd import FaultServer, running_fault_server, write_known_hosts
from test_crash import start_daemon

from sshadapter.audit.verify import verify
from sshadapter.config import DEFAULT_HOST_MAX_CONNECTIONS, HostSection, PoolSection
from sshadapter.daemon import offload, systemd
from sshadapter.daemon.offload import MAX_POOL_FAILURES, WORKER_EXIT_GRACE_SECONDS, Judge, Judged
from sshadapter.daemon.server import CUT_GRACE_SECONDS
from sshadapter.runners.ssh.runner import SshRunner

TOOL = "fault_probe"  # host alias `faults`: the host whose faults each test provokes
HEALTHY_TOOL = "healthy_probe"  # the same contract on alias `healthy`: always the good section
VERBS = [
    "hang",
    "drop",
    "flood-stdout",
    "flood-stderr",
    "echo",
    "exit",
    "never-close",
    "bogus",
]  # bogus: the fault server answers "unknown fault command" on stderr
TIMEOUT_SECONDS = 2
MAX_BYTES = 1024
MAX_STDERR_BYTES = 1024
FLOOD_BYTES = 100 * 1024 * 1024
HANG_BOUND_SECONDS = 10.0  # generous: the point is "answered, not hung", for a 2 s timeout
FLOOD_BOUND_SECONDS = 5.0  # a 100 MB flood must be cut at the 1 KiB cap, not read to the end
# Calls on a host that never closes a channel: well past the ~36 (6 connections x 6 channels)
# after which every call used to fail UPSTREAM_UNAVAILABLE.
UNCLOSED_CALLS = 100
UNCLOSED_AT_ONCE = 4  # calls in flight together, as an agent's parallel calls would be
UNCLOSED_IDLE_CLOSE_SECONDS = 2.0  # past session.UNCLOSED_AFTER_SECONDS: then slots are back
FAULT_TEXT = (b"yyyy", b"xxxx", b"unknown fault command")  # what the fault server writes

COMMAND_TOML = """\
description = "Fault probe: runs one scripted verb on the asyncssh fault server."
version = 1
host = "{host}"
argv = ["{{verb}}", "{{size}}"]
timeout_seconds = {timeout}

[params.verb]
type = "string"
enum = {verbs}

[params.size]
type = "integer"
minimum = 0
maximum = 200000000

[output]
format = "regex"
schema = "fault_probe.v1.json"
pattern = '^(?P<word>[a-z0-9]+)$'
max_bytes = {max_bytes}
max_stderr_bytes = {max_stderr_bytes}
exit_codes = {{ 0 = "success", 75 = "UPSTREAM_UNAVAILABLE" }}

[agent]
fields = ["word"]
"""

SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://sshadapter.invalid/schemas/fault_probe.v1.json",
    "type": "object",
    "required": ["word"],
    "properties": {"word": {"type": "string", "pattern": "^[a-z0-9]+$", "maxLength": 64}},
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    with running_fault_server(tmp_path_factory.mktemp("faults")) as server:
        yield server


def contract(tmp_path: Path) -> tuple[Path, Path]:
    """commands/ and schemas/ holding fault_probe (alias faults) and healthy_probe (healthy)."""
    commands, schemas = tmp_path / "commands", tmp_path / "schemas"
    commands.mkdir(parents=True)
    schemas.mkdir()
    for tool, host in ((TOOL, "faults"), (HEALTHY_TOOL, "healthy")):
        (commands / f"{tool}.toml").write_text(
            COMMAND_TOML.format(
                host=host,
                timeout=TIMEOUT_SECONDS,
                verbs=json.dumps(VERBS),
                max_bytes=MAX_BYTES,
                max_stderr_bytes=MAX_STDERR_BYTES,
            )
        )
    (schemas / "fault_probe.v1.json").write_text(json.dumps(SCHEMA))
    return commands, schemas


def serve(
    tmp_path: Path,
    faults: FaultServer,
    body: Callable[[Running], Awaitable[None]],
    faulty: HostSection | None = None,
) -> None:
    """Run ``body`` against a daemon whose alias ``faults`` uses ``faulty`` (default: good)."""
    hosts = {"faults": faulty or faults.host_section(), "healthy": faults.host_section()}
    runner = SshRunner(hosts)
    commands, schemas = contract(tmp_path)

    async def wrapped(d: Running) -> None:
        try:
            await body(d)
        finally:
            await runner.close()

    with_daemon(tmp_path, wrapped, runner=runner, commands=commands, schemas=schemas, hosts=hosts)


def call(verb: str, size: int = 0, tool: str = TOOL) -> dict[str, Any]:
    return {"op": "call", "tool": tool, "args": {"verb": verb, "size": size}}


async def ask_raw(d: Running, message: Mapping[str, Any]) -> bytes:
    """One request; the response line exactly as the daemon wrote it."""
    reader, writer = await asyncio.open_unix_connection(str(d.path))
    try:
        writer.write(orjson.dumps(message) + b"\n")
        await writer.drain()
        return await reader.readline()
    finally:
        writer.close()


def failure(response: Mapping[str, Any]) -> tuple[str, bool]:
    """(code, retryable) of a failure envelope, after checking it is closed."""
    assert set(response) == {"tool", "request_id", "outcome", "error"}, response
    assert response["outcome"] == "failure"
    assert set(response["error"]) == {"code", "retryable"}
    return response["error"]["code"], response["error"]["retryable"]


def result_record(d: Running, response: Mapping[str, Any]) -> dict[str, Any]:
    """The audit result record of the call that gave ``response``."""
    (record,) = [
        r
        for r in d.audit_records()
        if r["type"] == "result" and r["request_id"] == response["request_id"]
    ]
    assert record["outcome"] == response["outcome"]
    return record


async def still_serves(d: Running, tool: str = TOOL) -> None:
    """A normal call right after the fault succeeds on the same daemon."""
    response = await d.ask(call("echo", 7, tool))
    assert response == {
        "tool": tool,
        "request_id": response["request_id"],
        "outcome": "success",
        "data": {"word": "7"},
    }


def test_hang_is_a_retryable_timeout(tmp_path: Path, faults: FaultServer) -> None:
    """A command that never answers: UPSTREAM_UNAVAILABLE, retryable, command_timeout."""

    async def body(d: Running) -> None:
        started = time.monotonic()
        response = await d.ask(call("hang"))
        assert time.monotonic() - started < HANG_BOUND_SECONDS
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", True)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("transport", "command_timeout")
        assert record["attempts"][-1]["transport_error"] == "command_timeout"
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_drop_mid_output_is_connection_lost(tmp_path: Path, faults: FaultServer) -> None:
    """The connection dropped after some stdout: UPSTREAM_UNAVAILABLE, connection_lost."""

    async def body(d: Running) -> None:
        response = await d.ask(call("drop", 500))
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", True)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("transport", "connection_lost")
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_stdout_flood_is_cut_and_rejected(tmp_path: Path, faults: FaultServer) -> None:
    """100 MB on stdout: INVALID_RESPONSE (parse, too_large), answered in a few seconds."""

    async def body(d: Running) -> None:
        started = time.monotonic()
        response = await d.ask(call("flood-stdout", FLOOD_BYTES))
        assert time.monotonic() - started < FLOOD_BOUND_SECONDS
        assert failure(response) == ("INVALID_RESPONSE", False)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("parse", "too_large")
        assert record["attempts"][-1]["stdout_bytes"] == MAX_BYTES + 1
        assert faults.flood_bytes_written < FLOOD_BYTES
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_stderr_flood_is_cut_and_rejected(tmp_path: Path, faults: FaultServer) -> None:
    """100 MB on stderr: cut at the cap, INVALID_RESPONSE, answered in a few seconds."""

    async def body(d: Running) -> None:
        started = time.monotonic()
        response = await d.ask(call("flood-stderr", FLOOD_BYTES))
        assert time.monotonic() - started < FLOOD_BOUND_SECONDS
        assert failure(response) == ("INVALID_RESPONSE", False)
        attempt = result_record(d, response)["attempts"][-1]
        assert (attempt["stderr_bytes"], attempt["exit_status"]) == (MAX_STDERR_BYTES + 1, None)
        assert faults.flood_bytes_written < FLOOD_BYTES
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_stderr_flood_is_audited_as_stderr_too_large(tmp_path: Path, faults: FaultServer) -> None:
    """A stderr flood is audited as stage parse, reason stderr_too_large."""

    async def body(d: Running) -> None:
        response = await d.ask(call("flood-stderr", FLOOD_BYTES))
        assert failure(response) == ("INVALID_RESPONSE", False)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("parse", "stderr_too_large")
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_changed_host_key_is_not_retryable(tmp_path: Path, faults: FaultServer) -> None:
    """Another key listed for [127.0.0.1]:PORT: UPSTREAM_UNAVAILABLE, not retryable."""
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    known = write_known_hosts(tmp_path / "changed_known_hosts", "127.0.0.1", faults.port, other)

    async def body(d: Running) -> None:
        response = await d.ask(call("echo", 1))
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", False)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("transport", "host_key_mismatch")
        await still_serves(d, HEALTHY_TOOL)
        # known_hosts is read at each connect: the operator's fix applies without a restart
        known.write_bytes(faults.known_hosts.read_bytes())
        await still_serves(d)

    serve(tmp_path, faults, body, faults.host_section(known_hosts=known))


def test_refused_client_key_is_not_retryable(tmp_path: Path, faults: FaultServer) -> None:
    """The server refuses our key: UPSTREAM_UNAVAILABLE, not retryable, auth_failed."""
    stranger = tmp_path / "stranger_key"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(stranger)
    stranger.chmod(0o600)

    async def body(d: Running) -> None:
        response = await d.ask(call("echo", 1))
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", False)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("transport", "auth_failed")
        await still_serves(d, HEALTHY_TOOL)

    serve(tmp_path, faults, body, faults.host_section(client_keys=(stranger,)))


def test_refused_connection_is_retryable(tmp_path: Path, faults: FaultServer) -> None:
    """Nothing listens on the port: UPSTREAM_UNAVAILABLE, retryable, connect_refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    async def body(d: Running) -> None:
        started = time.monotonic()
        response = await d.ask(call("echo", 1))
        assert time.monotonic() - started < HANG_BOUND_SECONDS
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", True)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("transport", "connect_refused")
        await still_serves(d, HEALTHY_TOOL)

    serve(tmp_path, faults, body, faults.host_section(port=port))


def test_declared_temporary_failure(tmp_path: Path, faults: FaultServer) -> None:
    """exit 75, declared UPSTREAM_UNAVAILABLE: retryable, stage exit."""

    async def body(d: Running) -> None:
        response = await d.ask(call("exit", 75))
        assert failure(response) == ("UPSTREAM_UNAVAILABLE", True)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("exit", "declared_exit_status")
        assert record["attempts"][-1]["exit_status"] == 75
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_undeclared_exit_status(tmp_path: Path, faults: FaultServer) -> None:
    """exit 3 is not in exit_codes: INVALID_RESPONSE, stage exit, undeclared_exit_status."""

    async def body(d: Running) -> None:
        response = await d.ask(call("exit", 3))
        assert failure(response) == ("INVALID_RESPONSE", False)
        record = result_record(d, response)
        assert (record["stage"], record["reason"]) == ("exit", "undeclared_exit_status")
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_stale_pooled_connection_is_replaced(tmp_path: Path, faults: FaultServer) -> None:
    """After the server drops the pooled connection, the next call still succeeds."""

    async def body(d: Running) -> None:
        await still_serves(d)
        faults.drop_connections()
        await asyncio.sleep(0.1)
        await still_serves(d)

    serve(tmp_path, faults, body)


def test_a_host_that_never_closes_its_channels_fails_alone(
    tmp_path: Path, faults: FaultServer
) -> None:
    """100 calls on a host that never sends CHANNEL_CLOSE: all answered, its pool bounded."""
    hosts = {"faults": faults.host_section(), "healthy": faults.host_section()}
    commands, schemas = contract(tmp_path)
    never_closed = faults.never_closed

    async def body(d: Running) -> None:
        runner = d.daemon.runner
        assert isinstance(runner, SshRunner)
        most: dict[str, int] = {}
        for first in range(0, UNCLOSED_CALLS, UNCLOSED_AT_ONCE):
            words = range(first, first + UNCLOSED_AT_ONCE)
            responses = await asyncio.gather(*(d.ask(call("never-close", i)) for i in words))
            for i, response in zip(words, responses, strict=True):
                assert response.get("data") == {"word": str(i)}, (i, response)
            await still_serves(d, HEALTHY_TOOL)
            for alias, open_now in runner.connections().items():
                most[alias] = max(most.get(alias, 0), open_now)
        assert faults.never_closed - never_closed == UNCLOSED_CALLS
        # A retired connection does not count against max_connections until it closes.
        assert most == {"faults": most["faults"], "healthy": 1}
        assert most["faults"] <= 2 * DEFAULT_HOST_MAX_CONNECTIONS
        registry = d.service.metrics.registry
        retired = registry.get_sample_value(
            "sshadapter_ssh_connections_closed_total", {"reason": "unclosed"}
        )
        assert retired is not None and retired >= 1

        # Every slot comes back: the host's connections go idle and close, on both ends.
        def all_closed() -> bool:
            open_now = runner.connections()
            return "faults" not in open_now and faults.open_connections == len(open_now)

        for _ in range(1000):
            if all_closed():
                break
            await asyncio.sleep(0.01)
        assert all_closed(), (runner.connections(), faults.open_connections)
        await still_serves(d)

    with_daemon(
        tmp_path,
        body,
        ssh=True,
        hosts=hosts,
        commands=commands,
        schemas=schemas,
        pool=PoolSection(idle_close_seconds=UNCLOSED_IDLE_CLOSE_SECONDS),
    )
    report = verify([tmp_path / "audit.jsonl"])
    assert report.ok and not report.open_intents


def test_concurrent_faults_keep_envelopes_closed(tmp_path: Path, faults: FaultServer) -> None:
    """20 concurrent hang/flood/echo calls: closed envelopes; the echo calls succeed."""
    plan = [
        ("hang", 0),
        ("flood-stdout", FLOOD_BYTES),
        ("flood-stderr", FLOOD_BYTES),
        ("echo", 0),
        ("echo", 1),
    ] * 4
    expected = {
        "hang": "UPSTREAM_UNAVAILABLE",
        "flood-stdout": "INVALID_RESPONSE",
        "flood-stderr": "INVALID_RESPONSE",
    }

    async def body(d: Running) -> None:
        started = time.monotonic()
        responses = await asyncio.gather(*(d.ask(call(verb, size)) for verb, size in plan))
        assert time.monotonic() - started < HANG_BOUND_SECONDS
        ids = {r["request_id"] for r in responses}
        assert len(ids) == len(plan)
        for (verb, size), response in zip(plan, responses, strict=True):
            if verb == "echo":
                assert response == {
                    "tool": TOOL,
                    "request_id": response["request_id"],
                    "outcome": "success",
                    "data": {"word": str(size)},
                }
            else:
                assert failure(response)[0] == expected[verb], (verb, response)
        await still_serves(d)

    serve(tmp_path, faults, body)


@pytest.mark.parametrize(
    ("verb", "size"),
    [
        ("drop", 5000),
        ("flood-stdout", FLOOD_BYTES),
        ("flood-stdout", 1000),
        ("flood-stderr", FLOOD_BYTES),
        ("flood-stderr", 500),
        ("bogus", 0),
    ],
)
def test_agent_never_sees_fault_text(
    tmp_path: Path, faults: FaultServer, verb: str, size: int
) -> None:
    """Whatever the fault server wrote ("yyyy", "xxxx", its error text) stays out of the reply."""

    async def body(d: Running) -> None:
        line = await ask_raw(d, call(verb, size))
        assert line.endswith(b"\n")
        for text in FAULT_TEXT:
            assert text not in line
        response = orjson.loads(line)
        assert failure(response)[0] in {"UPSTREAM_UNAVAILABLE", "INVALID_RESPONSE"}
        await still_serves(d)

    serve(tmp_path, faults, body)


# --- callers and hosts that could stall the others (issue 9) -------------------------------

BLOB_TOML = """\
description = "A large JSON document from the fault server's blob verb."
version = 1
host = "{host}"
argv = ["blob", "{{size}}"]
timeout_seconds = 30

[params.size]
type = "integer"
minimum = 12
maximum = 9000000

[output]
format = "json"
schema = "blob.v1.json"
max_bytes = 9000000

[agent]
fields = ["blob"]
"""

BLOB_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["blob"],
    "properties": {"blob": {"type": "string", "pattern": "^y*$", "maxLength": 9000000}},
    "additionalProperties": False,
}


def serve_with_blob(
    tmp_path: Path,
    faults: FaultServer,
    body: Callable[[Running], Awaitable[None]],
    judge: Judge | None = None,
    **server: Any,
) -> None:
    """``serve``, plus the `blob` tool on the healthy host."""
    hosts = {"faults": faults.host_section(), "healthy": faults.host_section()}
    runner = SshRunner(hosts)
    commands, schemas = contract(tmp_path)
    (commands / "blob.toml").write_text(BLOB_TOML.format(host="healthy"))
    (schemas / "blob.v1.json").write_text(json.dumps(BLOB_SCHEMA))

    async def wrapped(d: Running) -> None:
        try:
            await body(d)
        finally:
            await runner.close()

    with_daemon(
        tmp_path,
        wrapped,
        runner=runner,
        commands=commands,
        schemas=schemas,
        hosts=hosts,
        judge=judge,
        **server,
    )


def blob(size: int) -> dict[str, Any]:
    return {"op": "call", "tool": "blob", "args": {"size": size}}


def test_clients_that_never_read_their_answers_are_dropped(
    tmp_path: Path, faults: FaultServer
) -> None:
    """Clients that never read their 4 MB answers are dropped at the write timeout and counted.

    Ten of them: each buffered answer is released, and the daemon keeps serving."""

    async def body(d: Running) -> None:
        writers = []
        for _ in range(10):
            _, writer = await asyncio.open_unix_connection(str(d.path))
            writer.write(orjson.dumps(blob(4_000_000)) + b"\n")
            writers.append(writer)
        drops = d.service.metrics.client_drops.labels("write_timeout")
        deadline = time.monotonic() + 60
        while drops._value.get() < 10 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert drops._value.get() == 10
        assert d.daemon._connections == {}  # every slow reader is gone, with its buffer
        await still_serves(d, HEALTHY_TOOL)
        for writer in writers:
            writer.close()

    serve_with_blob(tmp_path, faults, body, write_timeout_seconds=1.0)


class WatchedJudge(Judge):
    """The daemon's judge, counting the event loop's turns while each output is judged, and
    the calls waiting for a verdict."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.ticks = 0
        self.ticks_while_judging: list[int] = []
        self.waiting = 0

    async def judge(self, *args: Any) -> Judged:
        before = self.ticks
        self.waiting += 1
        try:
            judged = await super().judge(*args)
        finally:
            self.waiting -= 1
        self.ticks_while_judging.append(self.ticks - before)
        return judged

    async def tick(self) -> None:
        """Count the loop's turns until cancelled."""
        while True:
            self.ticks += 1
            await asyncio.sleep(0.001)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_loop_keeps_serving_while_a_large_output_is_judged(
    tmp_path: Path, faults: FaultServer, workers: int
) -> None:
    """An 8 MB output is judged off the event loop; a small one stays in the loop.

    The loop turns (other calls are served) for the whole time its parse, schema and envelope
    take."""
    judge = WatchedJudge(workers)

    async def body(d: Running) -> None:
        ticker = asyncio.create_task(judge.tick())
        try:
            big = asyncio.create_task(d.ask(blob(8_400_000)))
            await still_serves(d, HEALTHY_TOOL)
            assert (await big)["outcome"] == "success"
        finally:
            ticker.cancel()
        small, large = sorted(judge.ticks_while_judging)
        assert small == 0  # judged in the loop: no turn in between
        assert large > 0  # judged in a worker: the loop kept turning

    serve_with_blob(tmp_path, faults, body, judge=judge)


def test_a_large_output_judged_in_a_worker_is_judged_as_in_the_daemon(
    tmp_path: Path, faults: FaultServer
) -> None:
    """The same 1 MB output through a worker and in the loop: the same envelope and record."""
    results: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}

    for workers in (0, 1):

        async def body(d: Running, workers: int = workers) -> None:
            response = await d.ask(blob(1_000_000))
            record = result_record(d, response)
            results[workers] = (
                {k: v for k, v in response.items() if k != "request_id"},
                {k: record[k] for k in ("outcome", "code", "stage", "reason")}
                | {"sha": record["attempts"][0]["stdout_sha256"]},
            )

        serve_with_blob(tmp_path / str(workers), faults, body, evaluation_workers=workers)
    assert results[0] == results[1]
    assert results[1][0]["outcome"] == "success"


def test_a_killed_evaluation_worker_costs_no_answer(
    tmp_path: Path, faults: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A killed worker costs no answer: the daemon judges its output itself and answers.

    It starts a new worker for the next large output."""

    async def body(d: Running) -> None:
        await d.ask(blob(100_000))  # the worker is up
        (worker,) = multiprocessing.active_children()
        big = asyncio.create_task(d.ask(blob(8_400_000)))
        while faults.flood_bytes_written < 8_400_000 - 12:
            await asyncio.sleep(0.001)
        os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]
        assert (await big)["outcome"] == "success"
        assert (await d.ask(blob(200_000)))["outcome"] == "success"
        assert [p.pid for p in multiprocessing.active_children()] != [worker.pid]

    serve_with_blob(tmp_path, faults, body, evaluation_workers=1)
    assert "evaluation worker died under it: judging it again in new workers" in caplog.text


async def until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    """Wait (polling) until ``condition()`` holds; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def exited(pid_process: multiprocessing.process.BaseProcess, seconds: float) -> bool:
    """Whether the process ended within ``seconds`` (its sentinel: no reaping here)."""
    return bool(multiprocessing.connection.wait([pid_process.sentinel], seconds))


def test_a_worker_killed_under_three_waiting_calls_leaves_offloading_on(
    tmp_path: Path, faults: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 of the worker under three waiting large calls counts one pool failure, not three.

    All three are judged again in the new worker, and later large outputs still go to a
    worker."""
    judge = WatchedJudge(1)

    async def body(d: Running) -> None:
        ticker = asyncio.create_task(judge.tick())
        try:
            assert (await d.ask(blob(100_000)))["outcome"] == "success"  # the worker is up
            (worker,) = multiprocessing.active_children()
            os.kill(worker.pid, signal.SIGSTOP)  # type: ignore[arg-type]  # hold all three
            calls = [asyncio.create_task(d.ask(blob(1_000_000))) for _ in range(3)]
            await until(lambda: judge.waiting == 3)
            os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]  # as the OOM killer
            answers = await asyncio.gather(*calls)
            assert [answer["outcome"] for answer in answers] == ["success"] * 3
            for _ in range(MAX_POOL_FAILURES):
                assert (await d.ask(blob(1_000_000)))["outcome"] == "success"
                assert judge.ticks_while_judging[-1] > 0  # in a worker: the loop kept turning
            assert (judge.workers, judge.failures) == (1, 0)
            assert [p.pid for p in multiprocessing.active_children()] != [worker.pid]
        finally:
            ticker.cancel()

    serve_with_blob(tmp_path, faults, body, judge=judge)
    assert caplog.text.count("evaluation workers broke") == 1
    assert caplog.text.count("evaluation worker died under it: judging it again") == 3
    assert "judged in the daemon until it restarts" not in caplog.text


STUCK_TIMEOUT_SECONDS = 2.0  # the judge's bound in these tests (default 20 s)


def test_a_stopped_worker_gives_a_bounded_closed_failure_and_is_replaced(
    tmp_path: Path, faults: FaultServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGSTOPped worker's large call is answered INTERNAL (evaluation_timeout) and audited.

    The answer comes after the judge's bound; the stopped worker is killed and the next output
    is judged in a new one."""
    judge = Judge(1, timeout_seconds=STUCK_TIMEOUT_SECONDS)

    async def body(d: Running) -> None:
        assert (await d.ask(blob(100_000)))["outcome"] == "success"  # the worker is up
        (worker,) = multiprocessing.active_children()
        os.kill(worker.pid, signal.SIGSTOP)  # type: ignore[arg-type]
        try:
            started = time.monotonic()
            response = await asyncio.wait_for(
                d.ask(blob(1_000_000)), STUCK_TIMEOUT_SECONDS + HANG_BOUND_SECONDS
            )
            waited = time.monotonic() - started
            assert exited(worker, 5.0)  # the daemon killed it
        finally:  # before the fix nothing would: the drain would then wait for it forever
            with contextlib.suppress(ProcessLookupError):
                os.kill(worker.pid, signal.SIGKILL)  # type: ignore[arg-type]
        assert STUCK_TIMEOUT_SECONDS <= waited < STUCK_TIMEOUT_SECONDS + 3
        assert failure(response) == ("INTERNAL", False)
        record = result_record(d, response)
        assert (record["outcome"], record["code"]) == ("failure", "INTERNAL")
        assert (record["stage"], record["reason"]) == ("internal", "evaluation_timeout")
        assert record["attempts"][0]["stdout_bytes"] == 1_000_000  # what came back, digested
        assert (await d.ask(blob(1_000_000)))["outcome"] == "success"
        assert (judge.workers, judge.failures) == (1, 0)  # reset: a worker judged it

    serve_with_blob(tmp_path, faults, body, judge=judge)
    assert "no evaluation worker judged its output within 2s" in caplog.text
    assert "evaluation workers finished nothing in 2s (stopped or stuck)" in caplog.text
    assert "Traceback" not in caplog.text


SHUTDOWN_GRACE_SECONDS = CUT_GRACE_SECONDS + WORKER_EXIT_GRACE_SECONDS + 3.0  # + exit, close


def _workers_of(pid: int) -> list[int]:
    """The evaluation workers among a process's children (from /proc)."""
    children = [
        int(child)
        for task in Path(f"/proc/{pid}/task").iterdir()
        for child in (task / "children").read_text().split()
    ]
    return [c for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def test_sigterm_ends_a_daemon_whose_worker_is_stopped(tmp_path: Path, faults: FaultServer) -> None:
    """SIGTERM ends a daemon whose worker is stopped, the large call answered closed.

    A `sshadapter serve` whose worker is SIGSTOPped under a large call ends within
    drain_timeout_seconds plus a small grace."""
    commands, schemas = contract(tmp_path)
    (commands / "blob.toml").write_text(BLOB_TOML.format(host="healthy"))
    (schemas / "blob.v1.json").write_text(json.dumps(BLOB_SCHEMA))
    socket_path, audit_path, drain = tmp_path / "s.sock", tmp_path / "audit.jsonl", 2.0
    host = faults.host_section()
    config = tmp_path / "config.toml"
    config.write_text(f"""\
[server]
socket_path = "{socket_path}"
allow = {{ uids = [{os.getuid()}] }}
drain_timeout_seconds = {drain}
evaluation_workers = 1

[paths]
commands = "{commands}"
schemas = "{schemas}"

[audit]
path = "{audit_path}"
fsync = "never"
quarantine_dir = "{tmp_path / "quarantine"}"

""")
    for alias in ("faults", "healthy"):
        with config.open("a") as file:
            file.write(f"""
[hosts.{alias}]
address = "{host.address}"
port = {host.port}
user = "{host.user}"
client_keys = ["{faults.client_key}"]
known_hosts = "{faults.known_hosts}"
""")
    daemon = start_daemon(config, tmp_path / "notify")
    try:
        (worker,) = _workers_of(daemon.pid)
        os.kill(worker, signal.SIGSTOP)
        client = socket.socket(socket.AF_UNIX)
        client.connect(str(socket_path))
        client.sendall(orjson.dumps(blob(1_000_000)) + b"\n")
        deadline = time.monotonic() + 30
        while b'"type":"intent"' not in audit_path.read_bytes():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(1.0)  # the output is back and waiting for the stopped worker
        started = time.monotonic()
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=drain + SHUTDOWN_GRACE_SECONDS + 30) == 0
        assert time.monotonic() - started < drain + SHUTDOWN_GRACE_SECONDS
        client.settimeout(5)
        assert failure(orjson.loads(client.makefile("rb").readline())) == ("INTERNAL", False)
        client.close()
        assert not Path(f"/proc/{worker}").exists() or b"State:\tZ" in (
            Path(f"/proc/{worker}/status").read_bytes()
        )
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


def _pool_of_workers_that_exit(workers: int) -> concurrent.futures.ProcessPoolExecutor:
    """Workers that die as they start, as under a wrapper script without a main guard."""
    return concurrent.futures.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=signal.raise_signal,  # not os._exit: coverage replaces that one
        initargs=(signal.SIGKILL,),
    )


def test_workers_that_cannot_start_cost_no_answer_and_no_reload(
    tmp_path: Path,
    faults: FaultServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Workers that cannot start cost no answer and no reload: the daemon judges large outputs.

    Every pool breaks; offloading is given up after MAX_POOL_FAILURES with one error, and
    SIGHUP still ends in READY=1 for systemctl."""
    monkeypatch.setattr(offload, "_new_pool", _pool_of_workers_that_exit)
    notified: list[str] = []

    def notify(message: str) -> bool:
        notified.append(message)
        return False

    monkeypatch.setattr(systemd, "notify", notify)

    async def body(d: Running) -> None:
        for _ in range(MAX_POOL_FAILURES + 2):
            await asyncio.sleep(0.5)  # the new pool's workers have died by now
            d.daemon.reload()
            assert (await d.ask(blob(200_000)))["outcome"] == "success"
        assert d.service.judge.workers == 0
        assert multiprocessing.active_children() == []

    serve_with_blob(tmp_path, faults, body, evaluation_workers=1)
    assert caplog.text.count("every output is judged in the daemon until it restarts") == 1
    reloads = ["RELOADING=1", "READY=1"] * (MAX_POOL_FAILURES + 2)
    assert notified == ["READY=1", *reloads, "STOPPING=1"]
    assert "Traceback" not in caplog.text
