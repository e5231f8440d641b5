"""SshRunner against a real OpenSSH sshd and an asyncssh fault server (tests/support/sshd.py).

Tests are plain functions that call ``asyncio.run``: every runner lives and
dies inside one event loop, and no pytest-asyncio is needed.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shlex
import socket
import subprocess
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sshd import (
    FaultServer,
    Sshd,
    generate_key,
    require_sshd,
    running_fault_server,
    running_sshd,
    write_known_hosts,
)

from sshadapter.config import HostSection
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.ssh import exec_gate
from sshadapter.runners.ssh.coalesce import CoalescingTransport
from sshadapter.runners.ssh.pool import MAX_UNCLOSED_CHANNELS
from sshadapter.runners.ssh.runner import SshRunner

T = TypeVar("T")

CAPS: dict[str, Any] = {"timeout": 10.0, "max_stdout": 65536, "max_stderr": 4096}
FLOOD_BYTES = 100 * 1024 * 1024  # what a runaway command might print
FLOOD_CUT_SECONDS = 2.0  # a flood must be cut this fast
FLOOD_PEAK_MEMORY_BYTES = 16 * 1024 * 1024  # Python allocations while a flood is cut


@pytest.fixture(scope="session")
def sshd() -> Iterator[Sshd]:
    require_sshd()
    with running_sshd() as server:
        yield server


@pytest.fixture(scope="session")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    with running_fault_server(tmp_path_factory.mktemp("faults")) as server:
        yield server


def with_runner(
    hosts: Mapping[str, HostSection],
    body: Callable[[SshRunner], Awaitable[T]],
    **kwargs: Any,
) -> T:
    """Run ``body(runner)`` in a fresh event loop and always close the runner."""

    async def main() -> T:
        runner = SshRunner(hosts, **kwargs)
        try:
            return await body(runner)
        finally:
            await runner.close()

    return asyncio.run(main())


def run_one(section: HostSection, command: str, **caps: Any) -> RunResult:
    """One command on a fresh runner."""
    return with_runner({"h": section}, lambda r: r.run("h", command, **{**CAPS, **caps}))


def upstream_error(section: HostSection, command: str = "true", **caps: Any) -> UpstreamError:
    """The UpstreamError a single call raises."""
    with pytest.raises(UpstreamError) as caught:
        run_one(section, command, **caps)
    return caught.value


# Against the real sshd -------------------------------------------------------


def test_output_and_exit_status_are_byte_exact(sshd: Sshd) -> None:
    """stdout, stderr and the exit status come back exactly as the command produced them."""
    result = run_one(sshd.host_section(), r"printf 'a\000b\n\377'; printf 'warn\n' >&2; exit 0")
    assert (result.stdout, result.stderr, result.exit_status) == (b"a\x00b\n\xff", b"warn\n", 0)
    assert result.duration_seconds > 0


def test_nonzero_exit_status(sshd: Sshd) -> None:
    """A non-zero exit status is a result, not an error."""
    assert run_one(sshd.host_section(), "exit 75").exit_status == 75


def test_killed_by_signal_has_no_exit_status(sshd: Sshd) -> None:
    """A command killed by a signal reports exit_status None."""
    assert run_one(sshd.host_section(), "kill -9 $$").exit_status is None


def test_stdin_is_closed(sshd: Sshd) -> None:
    """stdin is at EOF from the start: cat returns at once with nothing."""
    started = time.monotonic()
    result = run_one(sshd.host_section(), "cat", timeout=5.0)
    assert (result.stdout, result.exit_status) == (b"", 0)
    assert time.monotonic() - started < 2.0


def test_stdin_is_closed_on_spare_channels_too(sshd: Sshd) -> None:
    """On a warmed pool, calls run on spares whose EOF follows the exec: cat ends at once."""

    async def body(runner: SshRunner) -> tuple[list[RunResult], int, bool]:
        await runner.warm("h")
        results = []
        for _ in range(3):
            await asyncio.sleep(0.2)  # the next spare is open
            results.append(await runner.run("h", "cat", **{**CAPS, "timeout": 5.0}))
        pool = runner._pools["h"]
        coalesced = all(isinstance(c.ssh._transport, CoalescingTransport) for c in pool._conns)
        return results, pool.spares_used, coalesced

    results, used, coalesced = with_runner({"h": sshd.host_section()}, body)
    assert [(r.stdout, r.exit_status) for r in results] == [(b"", 0)] * 3
    assert all(r.duration_seconds < 2.0 for r in results)
    assert used == 3
    assert coalesced, f"asyncssh {asyncssh.__version__}: writes are no longer coalesced"


def test_no_pty(sshd: Sshd) -> None:
    """No pseudo-terminal is allocated."""
    assert run_one(sshd.host_section(), "test -t 0 || echo nopty").stdout == b"nopty\n"


def test_no_environment_forwarded(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    """Our environment is not sent, although the test sshd would accept LC_* variables."""
    monkeypatch.setenv("LC_SSHADAPTER_TEST", "leaked")
    monkeypatch.setenv("LANG", "C.UTF-8")
    stdout = run_one(sshd.host_section(), "env").stdout
    assert b"LC_SSHADAPTER_TEST" not in stdout and b"leaked" not in stdout


def test_sequential_calls_reuse_one_connection(sshd: Sshd) -> None:
    """Twenty calls in a row share one pooled connection."""

    async def body(runner: SshRunner) -> tuple[list[RunResult], dict[str, int]]:
        results = [await runner.run("h", f"echo {i}", **CAPS) for i in range(20)]
        return results, runner.connections()

    results, connections = with_runner({"h": sshd.host_section()}, body)
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(20)]
    assert connections == {"h": 1}


def test_concurrent_calls_stay_within_pool_bounds(sshd: Sshd) -> None:
    """Forty overlapping calls all succeed; connections never exceed max_connections."""
    section = sshd.host_section(max_connections=4, max_channels_per_connection=6)
    peak = 0

    async def body(runner: SshRunner) -> list[RunResult]:
        nonlocal peak
        calls = asyncio.gather(
            *(runner.run("h", f"sleep 0.2; echo {i}", **CAPS) for i in range(40))
        )
        while not calls.done():
            peak = max(peak, runner.connections().get("h", 0))
            await asyncio.sleep(0.002)
        return await calls

    results = with_runner({"h": section}, body)
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(40)]
    assert all(r.exit_status == 0 for r in results)
    assert 1 < peak <= 4


def test_stdout_cap_is_enforced_while_reading(sshd: Sshd) -> None:
    """10 MB of stdout with a 1000-byte cap: 1001 bytes back, quickly, no exit status."""
    started = time.monotonic()
    result = run_one(sshd.host_section(), "head -c 10000000 /dev/zero", max_stdout=1000)
    assert len(result.stdout) == 1001 and result.exit_status is None
    assert time.monotonic() - started < 2.0


def test_stderr_cap_is_enforced_while_reading(sshd: Sshd) -> None:
    """The stderr cap works the same way."""
    result = run_one(sshd.host_section(), "head -c 10000000 /dev/zero >&2", max_stderr=100)
    assert len(result.stderr) == 101 and result.exit_status is None


def test_command_timeout_kills_the_command(sshd: Sshd) -> None:
    """Past its timeout a command ends in command_timeout (ran, retryable) and is killed."""
    argv = ["sleep", f"30.{secrets.randbelow(10**6):06d}"]  # unique: other runs may sleep too

    async def body(runner: SshRunner) -> tuple[bool, UpstreamError, float]:
        started = time.monotonic()
        call = asyncio.create_task(runner.run("h", shlex.join(argv), **{**CAPS, "timeout": 0.5}))
        seen = False
        while not call.done():
            seen = seen or _running(argv)
            await asyncio.sleep(0.02)
        with pytest.raises(UpstreamError) as caught:
            await call
        return seen, caught.value, time.monotonic() - started

    seen, error, elapsed = with_runner({"h": sshd.host_section()}, body)
    assert (error.reason, error.retryable, error.ran) == ("command_timeout", True, True)
    assert seen and elapsed < 2.0
    deadline = time.monotonic() + 2.0
    while _running(argv) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _running(argv)


def _running(argv: list[str]) -> bool:
    """Whether a local process runs exactly ``argv`` (the test sshd is on this machine)."""
    wanted = "\0".join(argv).encode() + b"\0"
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if cmdline.read_bytes() == wanted:
                return True
    return False


def test_unknown_host_key(sshd: Sshd, tmp_path: Path) -> None:
    """An empty known_hosts refuses the server: never retryable."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    error = upstream_error(sshd.host_section(known_hosts=empty))
    assert (error.reason, error.retryable, error.ran) == ("host_key_unknown", False, False)


def test_changed_host_key(sshd: Sshd, tmp_path: Path) -> None:
    """known_hosts with another key for [127.0.0.1]:PORT is a mismatch: never retryable."""
    other = generate_key(tmp_path / "other_host_key")
    known = write_known_hosts(tmp_path / "known_hosts", sshd.address, sshd.port, other)
    error = upstream_error(sshd.host_section(known_hosts=known))
    assert (error.reason, error.retryable, error.ran) == ("host_key_mismatch", False, False)


def test_refused_client_key(sshd: Sshd, tmp_path: Path) -> None:
    """A key the server does not know ends in auth_failed: never retryable."""
    generate_key(tmp_path / "stranger")
    error = upstream_error(sshd.host_section(client_keys=(tmp_path / "stranger",)))
    assert (error.reason, error.retryable, error.ran) == ("auth_failed", False, False)


def test_refused_connection(sshd: Sshd) -> None:
    """Nothing listening is connect_refused: retryable, nothing ran."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    error = upstream_error(sshd.host_section(port=closed_port))
    assert (error.reason, error.retryable, error.ran) == ("connect_refused", True, False)


def test_client_key_from_credentials_dir(sshd: Sshd, tmp_path: Path) -> None:
    """A systemd credential (a file in credentials_dir) can carry the client key."""
    (tmp_path / "ssh-key").write_bytes(sshd.client_key.read_bytes())
    section = sshd.host_section(client_keys=(), credential="ssh-key")

    async def body(runner: SshRunner) -> RunResult:
        return await runner.run("h", "echo ok", **CAPS)

    assert with_runner({"h": section}, body, credentials_dir=tmp_path).stdout == b"ok\n"


@pytest.mark.parametrize("problem", ["missing", "encrypted", "garbled", "no_keys", "no_dir"])
def test_unusable_client_key_is_no_credentials(
    sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, problem: str
) -> None:
    """A missing, passphrase-protected or garbled key, or none at all, is no_credentials."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    garbled = tmp_path / "garbled"
    garbled.write_text(f"{GARBLED_KEY}\n")
    section = {
        "missing": lambda: sshd.host_section(client_keys=(tmp_path / "absent",)),
        "encrypted": lambda: sshd.host_section(client_keys=(_encrypted_key(tmp_path),)),
        "garbled": lambda: sshd.host_section(client_keys=(), credential="garbled"),
        "no_keys": lambda: sshd.host_section(client_keys=()),
        "no_dir": lambda: sshd.host_section(client_keys=(), credential="ssh-key"),
    }[problem]()
    credentials_dir = None if problem == "no_dir" else tmp_path

    async def body(runner: SshRunner) -> UpstreamError:
        with pytest.raises(UpstreamError) as caught:
            await runner.run("h", "true", **CAPS)
        return caught.value

    error = with_runner({"h": section}, body, credentials_dir=credentials_dir)
    assert (error.reason, error.retryable, error.ran) == ("no_credentials", False, False)
    for text in (error.detail, str(error), repr(error), repr(error.__cause__)):
        assert "PRIVATE KEY" not in text and "c2VjcmV0" not in text
    assert error.__cause__ is None or error.__cause__.__cause__ is None


GARBLED_KEY = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0c2VjcmV0\n-----END OPENSSH PRIVATE KEY-----"
)


def _encrypted_key(tmp_path: Path) -> Path:
    path = tmp_path / "encrypted"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret", "-f", str(path)],
        check=True,
        capture_output=True,
    )
    return path


@pytest.mark.parametrize("max_connections", [1, 2])
def test_refused_channel_is_retried_elsewhere(max_connections: int) -> None:
    """A channel refused (MaxSessions 1) is retried on a new connection, else fails unrun."""
    require_sshd()
    with running_sshd(max_sessions=1) as narrow:
        section = narrow.host_section(
            max_connections=max_connections, max_channels_per_connection=2
        )

        async def body(runner: SshRunner) -> tuple[RunResult, RunResult | BaseException, int]:
            slow = asyncio.create_task(runner.run("h", "sleep 1.5; echo slow", **CAPS))
            await asyncio.sleep(0.3)  # the slow call holds the connection's only session
            quick = await asyncio.gather(
                runner.run("h", "echo quick", **CAPS), return_exceptions=True
            )
            return await slow, quick[0], runner.connections().get("h", 0)

        slow, quick, connections = with_runner({"h": section}, body)
    assert slow.stdout == b"slow\n"
    if max_connections == 1:
        assert isinstance(quick, UpstreamError)
        assert (quick.reason, quick.retryable, quick.ran) == ("channel_open_failed", True, False)
    else:
        assert isinstance(quick, RunResult) and quick.stdout == b"quick\n"
        assert connections == 2


def test_warm_opens_a_connection(sshd: Sshd) -> None:
    """warm() opens one connection before the first call."""

    async def body(runner: SshRunner) -> dict[str, int]:
        await runner.warm("h")
        return runner.connections()

    assert with_runner({"h": sshd.host_section()}, body) == {"h": 1}


def test_closed_runner_refuses_calls(sshd: Sshd) -> None:
    """After close() every call raises pool_closed and no connection stays open."""

    async def body(runner: SshRunner) -> tuple[UpstreamError, dict[str, int]]:
        await runner.run("h", "true", **CAPS)
        await runner.close()
        with pytest.raises(UpstreamError) as caught:
            await runner.run("h", "true", **CAPS)
        return caught.value, runner.connections()

    error, connections = with_runner({"h": sshd.host_section()}, body)
    assert (error.reason, error.ran) == ("pool_closed", False)
    assert connections == {}  # only hosts with a connection are listed


def test_repr_shows_only_host_aliases(sshd: Sshd) -> None:
    """The runner's repr names host aliases, never keys, users or addresses."""
    runner = SshRunner({"ci": sshd.host_section()})
    assert repr(runner) == "SshRunner(hosts=['ci'])"


def test_quoted_text_round_trips(sshd: Sshd) -> None:
    """Any text passed through shlex.quote and printf comes back byte-identical."""
    with asyncio.Runner() as loop:
        runner = SshRunner({"h": sshd.host_section()})

        @settings(max_examples=100, deadline=None)
        @given(
            st.text(
                st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=200
            )
        )
        def round_trip(text: str) -> None:
            result = loop.run(runner.run("h", "printf '%s' " + shlex.quote(text), **CAPS))
            assert (result.stdout, result.exit_status) == (text.encode(), 0)

        try:
            round_trip()
        finally:
            loop.run(runner.close())


# Against the asyncssh fault server -------------------------------------------


def test_hang_hits_the_timeout_then_runner_recovers(faults: FaultServer) -> None:
    """A command that never answers times out; the same runner then serves a normal call."""

    async def body(runner: SshRunner) -> tuple[UpstreamError, RunResult]:
        with pytest.raises(UpstreamError) as caught:
            await runner.run("f", "hang", **{**CAPS, "timeout": 0.3})
        return caught.value, await runner.run("f", "echo ok", **CAPS)

    error, after = with_runner({"f": faults.host_section()}, body)
    assert (error.reason, error.ran, error.retryable) == ("command_timeout", True, True)
    assert after.stdout == b"ok\n"


def test_drop_mid_output_is_connection_lost(faults: FaultServer) -> None:
    """A connection dropped mid-output is connection_lost with ran=True; a new one follows."""

    async def body(runner: SshRunner) -> tuple[UpstreamError, RunResult]:
        with pytest.raises(UpstreamError) as caught:
            await runner.run("f", "drop 5000", **CAPS)
        return caught.value, await runner.run("f", "echo ok", **CAPS)

    error, after = with_runner({"f": faults.host_section()}, body)
    assert (error.reason, error.ran, error.retryable) == ("connection_lost", True, True)
    assert after.stdout == b"ok\n"


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_flood_is_cut_at_the_cap(faults: FaultServer, stream: str) -> None:
    """100 MB on one stream is cut at cap + 1 bytes, fast, in little memory; then a normal call."""

    async def body(runner: SshRunner) -> tuple[RunResult, float, int, RunResult]:
        await runner.warm("f")
        tracemalloc.start()
        try:
            started = time.monotonic()
            flooded = await runner.run("f", f"flood-{stream} {FLOOD_BYTES}", **CAPS)
            elapsed = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return flooded, elapsed, peak, await runner.run("f", "echo ok", **CAPS)

    flooded, elapsed, peak, after = with_runner({"f": faults.host_section()}, body)
    kept = flooded.stdout if stream == "stdout" else flooded.stderr
    cap = CAPS["max_stdout"] if stream == "stdout" else CAPS["max_stderr"]
    assert len(kept) == cap + 1 and flooded.exit_status is None
    assert elapsed < FLOOD_CUT_SECONDS
    assert peak < FLOOD_PEAK_MEMORY_BYTES
    assert faults.flood_bytes_written < FLOOD_BYTES
    assert after.stdout == b"ok\n"


def test_stale_pooled_connection_is_replaced(faults: FaultServer) -> None:
    """After the server drops an idle pooled connection, the next call opens a new one."""

    async def body(runner: SshRunner) -> RunResult:
        await runner.run("f", "echo one", **CAPS)
        faults.drop_connections()
        # Idle: the reset reaches the client before the next call (one racing the reset
        # is lost with its exec request in flight: connection_lost, as for any call).
        await asyncio.sleep(0.2)
        return await runner.run("f", "echo two", **CAPS)

    assert with_runner({"f": faults.host_section()}, body).stdout == b"two\n"


def test_exit_status_from_fault_server(faults: FaultServer) -> None:
    """The fault server's scripted exit status comes back."""
    assert run_one(faults.host_section(), "exit 4").exit_status == 4


def test_host_key_of_another_type_is_a_mismatch(faults: FaultServer, tmp_path: Path) -> None:
    """known_hosts listing only an RSA key for an ed25519 server is a changed key too."""
    rsa = asyncssh.generate_private_key("ssh-rsa").export_public_key().decode()
    known = write_known_hosts(tmp_path / "known_hosts", "127.0.0.1", faults.port, rsa)
    # asyncssh's server aborts the connection (a reset) when the key exchange fails, and a
    # reset can overtake its disconnect message: then the client sees only a lost
    # connection. A real sshd closes cleanly; against this server, look again.
    for _ in range(5):
        error = upstream_error(faults.host_section(known_hosts=known))
        if error.reason != "connect_failed":
            break
    assert (error.reason, error.retryable) == ("host_key_mismatch", False)


def test_close_during_a_call_is_pool_closed(faults: FaultServer) -> None:
    """close() while a command runs ends that call with pool_closed."""

    async def body(runner: SshRunner) -> UpstreamError:
        call = asyncio.create_task(runner.run("f", "hang", **CAPS))
        await asyncio.sleep(0.3)
        await runner.close()
        with pytest.raises(UpstreamError) as caught:
            await call
        return caught.value

    error = with_runner({"f": faults.host_section()}, body)
    assert (error.reason, error.retryable) == ("pool_closed", False)


# --- spare channels (issue 13) -----------------------------------------------------------


def test_the_spare_channel_gate_fits_this_asyncssh() -> None:
    """The one private asyncssh method spares rely on is there: else they are off, loudly."""
    assert exec_gate.SPARES, f"asyncssh {asyncssh.__version__}: spare channels are off"


def test_calls_go_out_on_spare_channels_and_nothing_runs_before(faults: FaultServer) -> None:
    """A warmed pool holds a spare channel that runs nothing, and each call takes one.

    A call sends only its exec request on it, and the pool opens the next."""

    async def body(runner: SshRunner) -> tuple[list[str], list[bytes], int]:
        faults.commands_seen.clear()
        await runner.warm("f")
        await asyncio.sleep(0.3)  # a spare is open, and waits
        idle = list(faults.commands_seen)
        outs = []
        for i in range(5):  # a moment apart, as an agent's calls are: the next spare is open
            outs.append((await runner.run("f", f"echo {i}", **CAPS)).stdout)
            await asyncio.sleep(0.1)
        return idle, outs, runner._pools["f"].spares_used

    idle, outs, used = with_runner({"f": faults.host_section()}, body)
    assert idle == []
    assert outs == [f"{i}\n".encode() for i in range(5)]
    assert used == 5
    assert faults.commands_seen == [f"echo {i}" for i in range(5)]


def test_output_after_the_exit_status_is_kept_until_eof(faults: FaultServer) -> None:
    """An exit status that arrives before the last output: the call waits for EOF, loses nothing."""
    result = run_one(faults.host_section(), "status-before-output", timeout=5.0)
    assert (result.stdout, result.exit_status) == (b"late\n", 3)


def test_a_channel_the_host_never_closes_ends_at_eof_and_exit_status(
    faults: FaultServer,
) -> None:
    """EOF and the exit status, then no close: the call ends at once and closes the channel."""
    faults.closed_by_client.clear()
    started = time.monotonic()
    result = run_one(faults.host_section(), "no-close", timeout=5.0)
    assert (result.stdout, result.exit_status) == (b"done\n", 0)
    assert time.monotonic() - started < 2.0  # not the 5 s timeout
    deadline = time.monotonic() + 2.0
    while not faults.closed_by_client and time.monotonic() < deadline:
        time.sleep(0.01)
    assert faults.closed_by_client == ["no-close"]


def test_a_connection_its_host_leaves_channels_open_on_is_retired_after_its_calls(
    faults: FaultServer,
) -> None:
    """Unclosed channels retire a connection; it closes only once its last call is answered."""
    cap = 4
    section = faults.host_section(max_connections=1, max_channels_per_connection=cap)
    closed: list[str] = []
    accepted, held_before = faults.accepted, faults.held

    async def body(runner: SshRunner) -> None:
        held = asyncio.ensure_future(runner.run("f", "never-close-held kept", **CAPS))
        for _ in range(500):
            if faults.held > held_before:
                break
            await asyncio.sleep(0.01)
        # Beside the held call, the slots of the first connection; the calls past them wait
        # for slots given up on, until MAX_UNCLOSED_CHANNELS are: then a fresh connection.
        for i in range(cap - 1 + MAX_UNCLOSED_CHANNELS):
            result = await runner.run("f", f"never-close {i}", **CAPS)
            assert (result.stdout, result.exit_status) == (f"{i}\n".encode(), 0)
        assert faults.accepted - accepted == 2
        assert not held.done() and closed == []  # retired, not closed under its call
        faults.release_held()
        assert (await held).stdout == b"kept\n"
        for _ in range(500):  # its channel given up on too, the retired one closes
            if closed:
                break
            await asyncio.sleep(0.01)
        assert set(closed) == {"unclosed"}
        assert runner.connections().get("f", 0) <= 1

    with_runner({"f": section}, body, on_close=closed.append)


def test_concurrent_calls_share_spares_within_the_channel_cap(faults: FaultServer) -> None:
    """Twelve calls at once on one connection capped at 6 channels: all answered, none refused."""

    async def body(runner: SshRunner) -> list[bytes]:
        await runner.warm("f")
        results = await asyncio.gather(
            *(runner.run("f", f"sleep 0.2 w{i}", **CAPS) for i in range(12))
        )
        return [r.stdout for r in results]

    section = faults.host_section(max_connections=1, max_channels_per_connection=6)
    assert with_runner({"f": section}, body) == [f"w{i}\n".encode() for i in range(12)]


FIFO_RELEASE_SECONDS = 10.0  # a blocked open of the FIFO is released after this
FIFO_ANSWER_SECONDS = 5.0  # a refused FIFO answers well before its release


@pytest.mark.parametrize("which", ["known_hosts", "client_key", "credential"])
def test_a_fifo_for_an_ssh_file_is_refused_without_blocking_the_loop(
    sshd: Sshd, tmp_path: Path, which: str
) -> None:
    """known_hosts, a client key or a credential that is a FIFO: a closed failure at once."""
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    section = {
        "known_hosts": lambda: sshd.host_section(known_hosts=fifo),
        "client_key": lambda: sshd.host_section(client_keys=(fifo,)),
        "credential": lambda: sshd.host_section(client_keys=(), credential="fifo"),
    }[which]()

    def release() -> None:  # unblocks a reader stuck in open(), so a failing test ends
        with contextlib.suppress(OSError):
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)

    timer = threading.Timer(FIFO_RELEASE_SECONDS, release)
    timer.start()

    async def body(runner: SshRunner) -> UpstreamError:
        with pytest.raises(UpstreamError) as caught:
            await runner.run("h", "true", **CAPS)
        return caught.value

    started = time.monotonic()
    try:
        error = with_runner({"h": section}, body, credentials_dir=tmp_path)
    finally:
        timer.cancel()
        release()
    assert time.monotonic() - started < FIFO_ANSWER_SECONDS
    expected = "host_key_unknown" if which == "known_hosts" else "no_credentials"
    assert (error.reason, error.ran) == (expected, False)
    assert "not a regular file (a FIFO)" in error.detail
