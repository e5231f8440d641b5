"""The daemon on a real Unix socket: protocol, authorization, limits, retries, reload, drain."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, ROOT, Running, shipped_commands, with_daemon

from sshadapter.daemon.unix_socket import bind_socket
from sshadapter.errors import ConfigError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner
from sshadapter.sections import Allow

CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
AGENT_DATA = {k: JOB_OUT[k] for k in ("project_id", "run_id", "state", "observed_at")}


def code(response: dict[str, object]) -> object:
    return response["error"]["code"]  # type: ignore[index]


def test_call_round_trip_returns_only_agent_fields(tmp_path: Path) -> None:
    """A call through the socket returns the projected data and a daemon-made request id."""

    async def body(d: Running) -> None:
        response = await d.ask(CALL)
        assert response["outcome"] == "success" and response["data"] == AGENT_DATA
        assert response["request_id"].startswith("req.")

    with_daemon(tmp_path, body)


def test_several_requests_on_one_connection_answer_in_order(tmp_path: Path) -> None:
    """Three lines in one write get three responses, in order."""

    async def body(d: Running) -> None:
        reader, writer = await asyncio.open_unix_connection(str(d.path))
        bad = {"op": "call", "tool": "job_run_status", "args": {"project_id": "NO!"}}
        writer.write(b"".join(orjson.dumps(m) + b"\n" for m in (CALL, {"op": "list"}, bad)))
        answers = [orjson.loads(await reader.readline()) for _ in range(3)]
        writer.close()
        assert answers[0]["outcome"] == "success"
        assert "tools" in answers[1]
        assert (answers[2]["tool"], code(answers[2])) == ("job_run_status", "INVALID_REQUEST")

    with_daemon(tmp_path, body)


@pytest.mark.parametrize(
    "line",
    [
        b"{not json}\n",
        b'{"op": "call", "op": "list"}\n',
        b'{"op": "shell", "cmd": "id"}\n',
        b'{"op": "call", "tool": "job_run_status", "args": {}, "sudo": true}\n',
        b"[]\n",
        b'{"op": "call", "tool": "no_such_tool", "args": {}}\n',
        b"\n",
        b"\xff\xfe{}\n",
    ],
)
def test_hostile_requests_get_a_closed_envelope(tmp_path: Path, line: bytes) -> None:
    """Malformed, duplicate-keyed, unknown-op and unknown-tool lines: INVALID_REQUEST."""

    async def body(d: Running) -> None:
        response = await d.ask(line)
        assert set(response) == {"tool", "request_id", "outcome", "error"}
        assert (response["tool"], code(response)) == ("sshadapter", "INVALID_REQUEST")
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body)


def test_bad_arguments_are_refused_before_anything_runs(tmp_path: Path) -> None:
    """Shell syntax in an argument fails the parameter pattern; nothing is run."""
    runner = ScriptedRunner({})

    async def body(d: Running) -> None:
        for args in (
            {"project_id": "x; rm -rf /"},
            {},
            {"project_id": 7},
            {"project_id": "bluebird", "extra": "1"},
        ):
            response = await d.ask({**CALL, "args": args})
            assert (response["tool"], code(response)) == ("job_run_status", "INVALID_REQUEST")
        assert runner.calls == []

    with_daemon(tmp_path, body, runner=runner)


def test_oversized_line_is_refused_and_the_connection_dropped(tmp_path: Path) -> None:
    """A line over max_request_bytes gets INVALID_REQUEST; the daemon keeps serving."""

    async def body(d: Running) -> None:
        reader, writer = await asyncio.open_unix_connection(str(d.path))
        writer.write(b'{"op": "list", "pad": "' + b"x" * 5000)
        response = orjson.loads(await reader.readline())
        assert code(response) == "INVALID_REQUEST"
        assert await reader.read() == b""  # closed
        writer.close()
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body, max_request_bytes=1024)


def test_client_stalling_mid_line_is_dropped(tmp_path: Path) -> None:
    """Half a line then silence: the connection is closed after read_timeout_seconds."""

    async def body(d: Running) -> None:
        reader, writer = await asyncio.open_unix_connection(str(d.path))
        writer.write(b'{"op": "li')
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body, read_timeout_seconds=0.3)


def test_denied_uid_gets_denied_and_list_hides_the_tools(tmp_path: Path) -> None:
    """With nobody allowed, a call is DENIED (the tool named) and list is empty."""

    async def body(d: Running) -> None:
        response = await d.ask(CALL)
        assert (response["tool"], code(response)) == ("job_run_status", "DENIED")
        listed = await d.ask({"op": "list"})
        assert listed == {"tools": [], "digest": d.service.list_digest}

    with_daemon(tmp_path, body, allow=Allow(uids=(os.getuid() + 4242,)), commands=ROOT / "commands")


def test_list_shows_schemas_of_allowed_tools(tmp_path: Path) -> None:
    """list gives name, description, version, input and output schema per allowed tool."""

    async def body(d: Running) -> None:
        tools = {t["name"]: t for t in (await d.ask({"op": "list"}))["tools"]}
        # the `ci` tools allow only the group "sshadapter-agents"; the local ones: the default
        assert "disk_usage" in tools and "job_run_status" not in tools
        tool = tools["disk_usage"]
        assert set(tool) == {
            "name",
            "description",
            "version",
            "read_only",
            "idempotent",
            "input_schema",
            "output_schema",
        }
        assert (tool["read_only"], tool["idempotent"]) == (True, True)
        assert tool["output_schema"]["type"] == "object" and "oneOf" in tool["output_schema"]

    with_daemon(tmp_path, body, allow=Allow(uids=(os.getuid(),)), commands=ROOT / "commands")


def test_many_connections_at_once_then_a_normal_call(tmp_path: Path) -> None:
    """300 simultaneous connections each get an answer or are dropped; then a call succeeds."""

    async def body(d: Running) -> None:
        async def one() -> str:
            try:
                return str((await d.ask({"op": "list"})).get("error", {}).get("code", "ok"))
            except (ConnectionError, OSError, ValueError):
                return "dropped"

        results = await asyncio.gather(*(one() for _ in range(300)))
        assert set(results) <= {"ok", "OVERLOADED", "dropped"} and "ok" in results
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body, max_connections=64)


def held_until(release: asyncio.Event) -> Callable[[], Awaitable[RunResult]]:
    """The job's scripted run: its output once ``release`` is set."""

    async def held() -> RunResult:
        await release.wait()
        return RunResult(orjson.dumps(JOB_OUT), b"", 0)

    return held


def test_overload_answers_at_once(tmp_path: Path) -> None:
    """One slot, no queue: a second concurrent call is OVERLOADED, retryable."""
    release = asyncio.Event()
    slow = held_until(release)

    async def body(d: Running) -> None:
        first = asyncio.create_task(d.ask(CALL))
        await asyncio.sleep(0.2)
        second = await d.ask(CALL)
        assert (code(second), second["error"]["retryable"]) == ("OVERLOADED", True)
        release.set()
        assert (await first)["outcome"] == "success"

    with_daemon(
        tmp_path,
        body,
        runner=ScriptedRunner({JOB_COMMAND: slow}),
        max_concurrent_calls=1,
        max_queue=0,
    )


def _connected(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(path))  # completes in the listen backlog, before any accept
    return client


def _answer_of(client: socket.socket) -> dict[str, object]:
    """The one answer line on ``client`` (blocking: run in a thread)."""
    client.settimeout(30)
    data = b""
    while not data.endswith(b"\n"):
        chunk = client.recv(65536)
        assert chunk, "closed without an answer"
        data += chunk
    client.close()
    answer: dict[str, object] = orjson.loads(data)
    return answer


def gated_runner(held: int, release: asyncio.Event, started: list[int]) -> ScriptedRunner:
    """job_run_status answers at once, but the first ``held`` calls wait for ``release``."""

    async def answer() -> RunResult:
        if len(started) < held:
            started.append(1)
            await release.wait()
        return RunResult(orjson.dumps(JOB_OUT), b"", 0)

    return ScriptedRunner({JOB_COMMAND: answer})


def test_closed_connections_queued_in_the_backlog_leave_the_slots_to_live_ones(
    tmp_path: Path,
) -> None:
    """A burst its clients closed before the busy loop accepted it takes no live agent's slot."""
    burst, agents = 150, 7

    async def body(d: Running) -> None:
        # Synchronous on purpose: the daemon runs on this loop, which accepts nothing until
        # the body awaits, like a loop busy with large answers. The burst queues in the
        # listen backlog and gives up; the agents queue behind it, each with its call.
        for client in [_connected(d.path) for _ in range(burst)]:
            client.close()
        waiting = [_connected(d.path) for _ in range(agents)]
        for client in waiting:
            client.sendall(orjson.dumps(CALL) + b"\n")
        answers = await asyncio.gather(*(asyncio.to_thread(_answer_of, c) for c in waiting))
        assert [a.get("outcome") for a in answers] == ["success"] * agents, answers

        async def agent(calls: int) -> list[object]:
            return [(await d.ask(CALL)).get("outcome") for _ in range(calls)]

        outcomes = await asyncio.gather(*(agent(6 if i < 5 else 5) for i in range(agents)))
        assert [o for each in outcomes for o in each] == ["success"] * 40

    with_daemon(tmp_path, body, max_connections=64)


def test_a_client_gone_during_its_call_leaves_its_slot_while_the_call_ends(
    tmp_path: Path,
) -> None:
    """Clients that closed while their calls run hold no slot; the calls still end, audited."""
    limit = 4
    release = asyncio.Event()
    started: list[int] = []

    async def body(d: Running) -> None:
        gone = [_connected(d.path) for _ in range(limit)]
        for client in gone:
            client.sendall(orjson.dumps(CALL) + b"\n")
        async with asyncio.timeout(10):
            while len(started) < limit:  # every call running: all the slots were taken
                await asyncio.sleep(0.01)
        for client in gone:
            client.close()
        try:
            assert (await d.ask(CALL))["outcome"] == "success"  # refused OVERLOADED before
        finally:
            release.set()
        async with asyncio.timeout(10):
            while sum(r["type"] == "result" for r in d.audit_records()) < limit + 1:
                await asyncio.sleep(0.01)
        assert all(r["outcome"] == "success" for r in d.audit_records() if r["type"] == "result")

    with_daemon(
        tmp_path,
        body,
        runner=gated_runner(limit, release, started),
        max_connections=limit,
    )


def test_a_half_closed_client_still_holds_its_slot_and_gets_its_answer(tmp_path: Path) -> None:
    """A client that shut only its writing side is still there: counted, and answered."""
    release = asyncio.Event()
    started: list[int] = []

    async def body(d: Running) -> None:
        waiting = _connected(d.path)
        waiting.sendall(orjson.dumps(CALL) + b"\n")
        waiting.shutdown(socket.SHUT_WR)
        async with asyncio.timeout(10):
            while not started:
                await asyncio.sleep(0.01)
        try:
            refused = await d.ask(CALL)
        finally:
            release.set()
        assert (refused["tool"], code(refused)) == ("sshadapter", "OVERLOADED")
        assert (await asyncio.to_thread(_answer_of, waiting))["outcome"] == "success"

    with_daemon(tmp_path, body, runner=gated_runner(1, release, started), max_connections=1)


def test_retry_after_declared_temporary_failure_gives_fresh_evidence(tmp_path: Path) -> None:
    """Exit 75 then success: job_run_status (idempotent, retries UPSTREAM_UNAVAILABLE) retries."""
    answers = [RunResult(b"", b"api down\n", 75), RunResult(orjson.dumps(JOB_OUT), b"", 0)]

    async def next_answer() -> RunResult:
        return answers.pop(0)

    runner = ScriptedRunner({JOB_COMMAND: next_answer})

    async def body(d: Running) -> None:
        assert (await d.ask(CALL))["outcome"] == "success"
        result = [r for r in d.audit_records() if r["type"] == "result"][-1]
        assert [a["exit_status"] for a in result["attempts"]] == [75, 0]
        intents = [r for r in d.audit_records() if r["type"] == "intent"]
        assert [i["attempt"] for i in intents] == [1, 2]

    with_daemon(tmp_path, body, runner=runner)


def test_no_retry_for_codes_not_listed(tmp_path: Path) -> None:
    """INVALID_RESPONSE is not in job_run_status's retry.on: one attempt only."""
    runner = ScriptedRunner({JOB_COMMAND: RunResult(b"<html>maintenance</html>", b"", 0)})

    async def body(d: Running) -> None:
        assert code(await d.ask(CALL)) == "INVALID_RESPONSE"
        assert len(runner.calls) == 1

    with_daemon(tmp_path, body, runner=runner)


def test_audit_has_intent_before_result_with_the_exact_command(tmp_path: Path) -> None:
    """Each call leaves an intent and a result naming tool, caller, host and command."""

    async def body(d: Running) -> None:
        response = await d.ask(CALL)
        start, intent, result = d.audit_records()
        assert start["type"] == "start" and start["prev"] == "0" * 64
        assert (intent["type"], result["type"]) == ("intent", "result")
        assert intent["request_id"] == result["request_id"] == response["request_id"]
        assert result["command"] == JOB_COMMAND and result["caller"]["uid"] == os.getuid()
        assert result["host"] == "ci" and len(result["command_sha256"]) == 64

    with_daemon(tmp_path, body)


def test_unwritable_audit_means_the_command_does_not_run(tmp_path: Path) -> None:
    """If the intent record cannot be written, the caller gets INTERNAL and nothing runs."""
    runner = ScriptedRunner({})

    async def body(d: Running) -> None:
        d.service.audit.close()  # every append now fails
        response = await d.ask(CALL)
        assert (code(response), response["error"]["retryable"]) == ("INTERNAL", False)
        assert runner.calls == []

    with_daemon(tmp_path, body, runner=runner)


def test_reload_keeps_the_old_set_when_a_file_is_bad(tmp_path: Path) -> None:
    """SIGHUP with a broken command file keeps serving the previous tools."""
    commands = tmp_path / "commands"
    commands.mkdir()
    source = shipped_commands(tmp_path / "all") / "job_run_status.toml"
    (commands / source.name).write_bytes(source.read_bytes())

    async def body(d: Running) -> None:
        (commands / "broken.toml").write_text("nonsense = true\n")
        d.daemon.reload()
        assert (await d.ask(CALL))["outcome"] == "success"
        (commands / "broken.toml").unlink()
        d.daemon.reload()
        assert set(d.service.registry.operations) == {"job_run_status"}

    with_daemon(tmp_path, body, commands=commands)


def test_list_digest_changes_with_a_reload_that_changes_something(tmp_path: Path) -> None:
    """The digest in `list` stays over an idempotent reload and moves when a file changes."""
    commands = shipped_commands(tmp_path)

    async def body(d: Running) -> None:
        first = (await d.ask({"op": "list"}))["digest"]
        assert first.startswith("sha256:") and len(first) == 71
        d.daemon.reload()
        assert (await d.ask({"op": "list"}))["digest"] == first
        edited = commands / "load_average.toml"
        edited.write_text(edited.read_text().replace("version = 1", "version = 2"))
        d.daemon.reload()
        assert (await d.ask({"op": "list"}))["digest"] != first

    with_daemon(tmp_path, body, commands=commands)


def test_stop_with_an_idle_connection_open_logs_no_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that keeps its connection between calls is let go quietly at shutdown."""
    closed: list[asyncio.Task[None]] = []

    async def body(d: Running) -> None:
        reader, writer = await asyncio.open_unix_connection(str(d.path))
        writer.write(orjson.dumps(CALL) + b"\n")
        await writer.drain()
        assert orjson.loads(await reader.readline())["outcome"] == "success"

        async def close_when_the_daemon_does() -> None:
            assert await reader.read() == b""  # still open, idle, while the daemon stops
            writer.close()

        closed.append(asyncio.create_task(close_when_the_daemon_does()))

    with caplog.at_level(logging.ERROR):
        with_daemon(tmp_path, body)
    assert closed[0].done() and closed[0].exception() is None
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_stop_drains_in_flight_calls(tmp_path: Path) -> None:
    """A call in flight when the daemon is told to stop still gets its answer."""

    async def slow() -> RunResult:
        await asyncio.sleep(0.5)
        return RunResult(orjson.dumps(JOB_OUT), b"", 0)

    async def body(d: Running) -> None:
        pending = asyncio.create_task(d.ask(CALL))
        await asyncio.sleep(0.1)
        d.daemon.stop()
        assert (await pending)["outcome"] == "success"

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: slow}))


def test_stop_logs_stopping_drained_and_stopped_with_the_calls_in_flight(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Stopping with one call in flight logs three lines: stopping (1 call), drained, stopped."""
    release = asyncio.Event()
    held = held_until(release)

    async def body(d: Running) -> None:
        pending = asyncio.create_task(d.ask(CALL))
        while not d.daemon.service.calls:  # the call is in flight
            await asyncio.sleep(0.01)
        d.daemon.stop()
        while d.daemon.state.value != "draining":
            await asyncio.sleep(0.01)
        release.set()
        assert (await pending)["outcome"] == "success"

    with caplog.at_level(logging.INFO, logger="sshadapter.daemon.server"):
        with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: held}))
    lines = [r.getMessage() for r in caplog.records if r.name == "sshadapter.daemon.server"]
    assert lines[-3:] == [
        "stopping: 1 calls in flight on 1 connections, drain deadline 30s",
        "drained: 1 calls ended in the drain, 0 cut",
        "stopped",
    ]


def test_stale_socket_is_replaced_but_a_live_one_is_not(tmp_path: Path) -> None:
    """A socket file nobody listens on is replaced; a listening one is refused."""
    path = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()
    live = bind_socket(path, 0o660, "")
    assert oct(path.stat().st_mode & 0o777) == "0o660"
    with pytest.raises(ConfigError, match="another daemon"):
        bind_socket(path, 0o660, "")
    live.close()


def test_socket_path_that_is_a_file_or_symlink_is_never_replaced(tmp_path: Path) -> None:
    """A regular file or a symlink at the socket path is refused, not deleted or followed."""
    target = tmp_path / "precious"
    target.write_text("data")
    link = tmp_path / "link.sock"
    link.symlink_to(target)
    for path in (target, link):
        with pytest.raises(ConfigError, match="not a socket"):
            bind_socket(path, 0o660, "")
    assert target.read_text() == "data" and link.is_symlink()


SYSTEM_PYTHON = "/usr/bin/python3"  # readable by nobody, unlike a python under /root


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(SYSTEM_PYTHON),
    reason="needs root and /usr/bin/python3 to run a client as another user",
)
def test_supplementary_group_of_the_caller_admits_it(tmp_path: Path) -> None:
    """A caller allowed only through a supplementary group (SO_PEERGROUPS) gets in; others not."""
    import grp
    import shutil
    import subprocess
    import tempfile

    users = grp.getgrnam("users").gr_gid
    socket_dir = Path(tempfile.mkdtemp(prefix="sshadapter-groups-"))  # pytest's tmp is 0700
    socket_dir.chmod(0o755)
    loadavg = RunResult(b"0.07 0.11 0.05 1/80 2344\n", b"", 0)
    client = (
        "import socket,sys; s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]);"
        's.sendall(b\'{"op":"call","tool":"load_average","args":{}}\\n\');'
        "print(s.makefile().readline())"
    )

    def call_as(path: Path, extra_groups: list[int]) -> dict[str, object]:
        done = subprocess.run(
            [SYSTEM_PYTHON, "-c", client, str(path)],
            user=65534,
            group=65534,
            extra_groups=extra_groups,
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
        return orjson.loads(done.stdout)  # type: ignore[no-any-return]

    async def body(d: Running) -> None:
        loop = asyncio.get_running_loop()
        member = await loop.run_in_executor(None, call_as, d.path, [users])
        assert member["outcome"] == "success", member
        stranger = await loop.run_in_executor(None, call_as, d.path, [])
        assert code(stranger) == "DENIED"

    with_daemon(
        tmp_path,
        body,
        runner=ScriptedRunner({"cat /proc/loadavg": loadavg}),
        allow=Allow(groups=("users",)),
        commands=ROOT / "commands",
        socket_mode=0o666,
        socket_dir=socket_dir,
    )
    shutil.rmtree(socket_dir)
