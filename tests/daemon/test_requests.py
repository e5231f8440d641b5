"""The request side: any bytes a caller sends get a closed envelope, never a traceback.

The invariant (docs/protocol.md "The envelope"): whatever line reaches ``Service.handle``,
the answer is one line holding either a `list` answer or an envelope valid
against its published schema, and nothing the caller sent is echoed back.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any

import orjson
import pytest
from daemon_harness import (
    JOB_COMMAND,
    ROOT,
    Running,
    scripted_service,
    with_daemon,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sshadapter.contract import envelope
from sshadapter.contract.registry import Registry
from sshadapter.contract.schemas import SchemaSet
from sshadapter.daemon.access import Peer
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

PEER = Peer(pid=1, uid=os.getuid(), gid=os.getgid())
OPS = ["call", "list", "shell", "", None]
TOOLS = ["job_run_status", "disk_usage", "sshadapter", "no_such_tool"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def request_shaped() -> st.SearchStrategy[dict[str, Any]]:
    """Requests near the real shape, with any JSON value in any position."""
    return st.fixed_dictionaries(
        {},
        optional={
            "op": st.sampled_from(OPS) | json_values,
            "tool": st.sampled_from(TOOLS) | json_values,
            "args": st.fixed_dictionaries({}, optional={"project_id": json_values}) | json_values,
            "extra": json_values,
        },
    )


class Checker:
    """Validates every answer against the schema it must follow."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        schemas = SchemaSet(ROOT / "schemas")
        self.system = schemas.compile(envelope.SYSTEM_ENVELOPE_SCHEMA, file="system")

    def check(self, line: bytes) -> None:
        assert line.endswith(b"\n") and line.count(b"\n") == 1
        answer = orjson.loads(line)
        if "tools" in answer:
            assert set(answer) >= {"tools"}
            return
        op = self.registry.get(answer["tool"])
        validator = op.envelope_validator if op is not None else self.system
        assert validator.is_valid(answer), answer


def test_an_op_that_is_not_a_string_gets_invalid_request(tmp_path: Path) -> None:
    """{"op": ["call"]} and {"op": {"a": 1}} were unhashable: now INVALID_REQUEST, no traceback."""

    async def body(d: Running) -> None:
        for op in (["call"], {"a": 1}, 1, None, True):
            answer = await d.ask({"op": op})
            assert answer["tool"] == "sshadapter"
            assert answer["error"] == {"code": "INVALID_REQUEST", "retryable": False}

    with_daemon(tmp_path, body)


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A real Service (assembled as `serve` does) answering from a scripted runner."""
    return scripted_service(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def checker(service: Any) -> Checker:
    return Checker(service.registry)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request_shaped())
def test_any_json_in_any_position_gets_a_closed_answer(
    service: Any, checker: Checker, request: dict[str, Any]
) -> None:
    """Arbitrary JSON values as op, tool, args and extra keys: always one closed answer line."""
    line = asyncio.run(service.handle(json.dumps(request).encode(), PEER))
    checker.check(line)


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.binary(max_size=300))
def test_any_bytes_get_a_closed_answer(service: Any, checker: Checker, data: bytes) -> None:
    """Arbitrary bytes as a request line: one closed answer, none of the bytes echoed."""
    line = asyncio.run(service.handle(data.replace(b"\n", b""), PEER))
    checker.check(line)


def test_fuzzed_lines_over_the_socket_keep_the_daemon_serving(tmp_path: Path) -> None:
    """A burst of garbage, half-lines and valid calls on one socket: every line answered."""
    lines = [b"\xff\x00garbage", b'{"op":{"call":1}}', b"[1,2", b'{"op":"list"}', b'"op"', b"{}"]

    async def body(d: Running) -> None:
        checker = Checker(d.service.registry)
        reader, writer = await asyncio.open_unix_connection(str(d.path))
        writer.write(b"".join(line + b"\n" for line in lines * 20))
        for _ in range(len(lines) * 20):
            checker.check(await reader.readline())
        writer.close()
        assert (await d.ask({"op": "list"}))["tools"]

    with_daemon(tmp_path, body)


class ExplodingRunner:
    """A runner (the Runner interface) whose run raises what nothing maps: a bug."""

    def __init__(self) -> None:
        self.calls = 0

    async def run(self, host: str, command: str, **_: Any) -> RunResult:
        self.calls += 1
        raise RuntimeError("a bug in a runner")

    async def warm(self, host: str, *, evict: bool = False) -> None:
        raise UpstreamError("connect_refused", retryable=True, ran=False)

    async def close(self) -> None:
        pass


def test_an_unexpected_runner_exception_is_internal_with_a_result_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A runner raising RuntimeError: the agent gets INTERNAL, the audit a result, the log why."""
    runner = ExplodingRunner()

    async def body(d: Running) -> None:
        call = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
        answer = await d.ask(call)
        assert answer["error"] == {"code": "INTERNAL", "retryable": False}
        (result,) = [
            r
            for r in d.audit_records()
            if r.get("request_id") == answer["request_id"] and r["type"] == "result"
        ]
        assert (result["stage"], result["reason"], result["code"]) == (
            "internal",
            "bug",
            "INTERNAL",
        )
        assert result["attempts"][0]["interrupted"] == "bug"
        assert (await d.ask({"op": "list"}))["tools"]  # still serving

    with_daemon(tmp_path, body, runner=runner)
    assert "RuntimeError: a bug in a runner" in caplog.text
    assert runner.calls == 1


def test_a_declared_not_found_is_no_rejection(tmp_path: Path) -> None:
    """NOT_FOUND is an answer: calls_total counts it, sshadapter_rejections_total does not."""
    runner = ScriptedRunner({JOB_COMMAND: RunResult(b"", b"no such project\n", 4)})

    async def body(d: Running) -> None:
        call = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
        assert (await d.ask(call))["error"]["code"] == "NOT_FOUND"
        text = d.service.metrics.exposition().decode()
        assert 'code="NOT_FOUND",outcome="failure",tool="job_run_status"} 1.0' in text
        assert "sshadapter_rejections_total{" not in text

    with_daemon(tmp_path, body, runner=runner)


def test_peer_identity_comes_from_the_kernel(tmp_path: Path) -> None:
    """The daemon reads uid and gid from SO_PEERCRED, whatever the request says."""
    from sshadapter.daemon.unix_socket import peer_of

    left, right = socket.socketpair(socket.AF_UNIX)
    with left, right:
        peer = peer_of(left)
    assert (peer.uid, peer.gid, peer.pid) == (os.getuid(), os.getgid(), os.getpid())
