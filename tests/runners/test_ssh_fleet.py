"""The pool across hosts (``[pool]``): handshakes in flight, idle close, the total cap with
LRU close, known_hosts parsed once, lazy start-up, and the open-files limit.

Many host aliases point at one asyncssh fault server (tests/support/sshd.py), which counts the
handshakes it has in flight; the daemon tests go through the real daemon on a socket.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import pytest
from daemon_harness import ROOT, Running, with_daemon
from fleet_sshd import Fleet, running_fleet
from sshd import FaultServer, running_fault_server, write_known_hosts

from sshadapter.config import Config, GroupSection, HostSection, PoolSection
from sshadapter.daemon.assemble import warm_aliases
from sshadapter.errors import ConfigError, UpstreamError
from sshadapter.inventory.fleet import load_inventory
from sshadapter.runners.ssh.runner import SshRunner

T = TypeVar("T")

CAPS: dict[str, Any] = {"timeout": 10.0, "max_stdout": 4096, "max_stderr": 4096}


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FaultServer]:
    with running_fault_server(tmp_path_factory.mktemp("fleet")) as server:
        yield server


def fleet(faults: FaultServer, count: int, **overrides: Any) -> dict[str, HostSection]:
    """``count`` host aliases h0, h1, ... all reaching the fault server."""
    return {f"h{i}": faults.host_section(**overrides) for i in range(count)}


def with_runner(
    hosts: dict[str, HostSection], body: Callable[[SshRunner], Awaitable[T]], **kwargs: Any
) -> T:
    async def main() -> T:
        runner = SshRunner(hosts, **kwargs)
        try:
            return await body(runner)
        finally:
            await runner.close()

    return asyncio.run(main())


def test_handshakes_in_flight_stay_within_connect_concurrency(faults: FaultServer) -> None:
    """Twelve hosts warmed at once: the server never has more than 3 handshakes in flight."""
    faults.auth_delay, faults.handshakes_peak = 0.1, 0
    seen: list[int] = []

    async def body(runner: SshRunner) -> dict[str, int]:
        warming = asyncio.gather(*(runner.warm(alias) for alias in sorted(hosts)))
        while not warming.done():
            seen.append(runner.handshakes_in_flight)
            await asyncio.sleep(0.01)
        await warming
        return runner.connections()

    hosts = fleet(faults, 12)
    try:
        connected = with_runner(hosts, body, pool=PoolSection(connect_concurrency=3))
    finally:
        faults.auth_delay = 0.0
    assert connected == dict.fromkeys(hosts, 1)
    assert 1 < faults.handshakes_peak <= 3
    assert max(seen) == 3


def test_an_idle_connection_is_closed_and_reopened_on_demand(faults: FaultServer) -> None:
    """A connection with no call (its spare channel aside) for idle_close_seconds is closed."""
    closed: list[str] = []

    async def body(runner: SshRunner) -> tuple[dict[str, int], dict[str, int], bytes]:
        await runner.run("h0", "echo one", **CAPS)
        await asyncio.sleep(0.1)
        before = runner.connections()  # its spare channel is open, waiting
        await asyncio.sleep(0.8)
        after = runner.connections()
        return before, after, (await runner.run("h0", "echo two", **CAPS)).stdout

    before, after, again = with_runner(
        fleet(faults, 1), body, pool=PoolSection(idle_close_seconds=0.3), on_close=closed.append
    )
    assert (before, after, again) == ({"h0": 1}, {}, b"two\n")
    assert closed == ["idle"]


def test_a_busy_connection_is_not_closed_as_idle(faults: FaultServer) -> None:
    """A call running longer than idle_close_seconds keeps its connection."""

    async def body(runner: SshRunner) -> bytes:
        return (await runner.run("h0", "sleep 0.7 done", **CAPS)).stdout

    closed: list[str] = []
    assert with_runner(
        fleet(faults, 1), body, pool=PoolSection(idle_close_seconds=0.2), on_close=closed.append
    ) == (b"done\n")
    assert closed == []


def test_the_least_recently_used_idle_connection_closes_first_at_the_cap(
    faults: FaultServer,
) -> None:
    """At max_connections_total = 2, a third host closes the idle connection used longest ago."""
    closed: list[str] = []

    async def body(runner: SshRunner) -> dict[str, int]:
        for alias in ("h0", "h1", "h0", "h2"):  # h1 is now the least recently used
            await runner.run(alias, "echo x", **CAPS)
        return runner.connections()

    connected = with_runner(
        fleet(faults, 3),
        body,
        pool=PoolSection(max_connections_total=2),
        on_close=closed.append,
    )
    assert connected == {"h0": 1, "h2": 1}
    assert closed == ["lru"]


def test_a_call_waits_at_the_cap_while_every_connection_is_busy(faults: FaultServer) -> None:
    """At the cap with the only connection busy, a call to another host waits, then runs."""

    async def body(runner: SshRunner) -> tuple[bytes, bytes, float, float]:
        started = time.monotonic()
        busy = asyncio.create_task(runner.run("h0", "sleep 0.5 first", **CAPS))
        await asyncio.sleep(0.2)
        waiting = await runner.run("h1", "echo second", **CAPS)
        waited = time.monotonic() - started
        first = await busy
        return first.stdout, waiting.stdout, waited, runner.open_connections

    first, second, waited, open_now = with_runner(
        fleet(faults, 2), body, pool=PoolSection(max_connections_total=1)
    )
    assert (first, second, open_now) == (b"first\n", b"second\n", 1)
    assert waited >= 0.5  # it ran only once h0's call had ended


def test_a_call_waiting_at_the_cap_gives_up_at_its_own_timeout(faults: FaultServer) -> None:
    """Waiting for a slot is bounded by the call's timeout: it fails, retryable, nothing ran."""

    async def body(runner: SshRunner) -> UpstreamError:
        busy = asyncio.create_task(runner.run("h0", "sleep 1 first", **CAPS))
        await asyncio.sleep(0.2)
        with pytest.raises(UpstreamError) as caught:
            await runner.run("h1", "echo second", **{**CAPS, "timeout": 0.3})
        await busy
        return caught.value

    error = with_runner(fleet(faults, 2), body, pool=PoolSection(max_connections_total=1))
    assert (error.ran, error.retryable) == (False, True)


def test_known_hosts_is_parsed_once_for_many_hosts_and_again_after_an_edit(
    faults: FaultServer, tmp_path: Path
) -> None:
    """Ten hosts sharing a file parse it once; after an edit the next connect sees the edit."""
    known = tmp_path / "known_hosts"
    known.write_bytes(faults.known_hosts.read_bytes())
    hosts = fleet(faults, 11, known_hosts=known)
    connected: list[str] = []

    async def body(runner: SshRunner) -> tuple[int, UpstreamError]:
        await asyncio.gather(*(runner.run(f"h{i}", "echo x", **CAPS) for i in range(10)))
        parses = runner.known_hosts_parses
        other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
        write_known_hosts(known, "127.0.0.1", faults.port, other)  # the host's key "changed"
        with pytest.raises(UpstreamError) as caught:
            await runner.run("h10", "echo x", **CAPS)
        return parses, caught.value

    parses, error = with_runner(hosts, body, on_connect=connected.append)
    assert parses == 1
    assert error.reason == "host_key_mismatch"
    assert sorted(connected) == sorted(f"h{i}" for i in range(10))


def test_a_failing_on_connect_callback_does_not_fail_the_call(faults: FaultServer) -> None:
    """on_connect raising is logged; the call that opened the connection still answers."""

    def broken(alias: str) -> None:
        raise RuntimeError("a monitor bug")

    async def body(runner: SshRunner) -> bytes:
        return (await runner.run("h0", "echo ok", **CAPS)).stdout

    assert with_runner(fleet(faults, 1), body, on_connect=broken) == b"ok\n"


def test_the_daemon_connects_only_the_warm_hosts_at_start(
    faults: FaultServer, tmp_path: Path
) -> None:
    """With `warm = ["h1"]` only h1 is connected after start, and reported."""
    hosts = {**fleet(faults, 3), "ci": faults.host_section(), "local": faults.host_section()}

    async def body(d: Running) -> None:
        runner = d.daemon.runner
        assert isinstance(runner, SshRunner)
        for _ in range(300):
            if runner.connections():
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # and nothing else follows
        assert runner.connections() == {"h1": 1}
        registry = d.service.metrics.registry
        assert registry.get_sample_value("sshadapter_ssh_connections_open") == 1
        assert registry.get_sample_value("sshadapter_ssh_connections", {"host": "h0"}) is None

    with_daemon(tmp_path, body, ssh=True, hosts=hosts, pool=PoolSection(warm=("h1",)))


def test_the_daemon_connects_nothing_at_start_by_default(
    faults: FaultServer, tmp_path: Path
) -> None:
    """Without `warm`, no host is connected at start, however many there are."""
    before = faults.accepted

    async def body(d: Running) -> None:
        await asyncio.sleep(0.3)
        assert isinstance(d.daemon.runner, SshRunner)
        assert d.daemon.runner.connections() == {}

    hosts = {**fleet(faults, 20), "ci": faults.host_section(), "local": faults.host_section()}
    with_daemon(tmp_path, body, ssh=True, hosts=hosts)
    assert faults.accepted == before


def test_a_warm_name_that_is_no_host_is_refused() -> None:
    """`[pool] warm` naming an unknown alias is a ConfigError on pool.warm, one line."""
    config = Config(pool=PoolSection(warm=("nope",)))
    with pytest.raises(ConfigError) as caught:
        warm_aliases(config, load_inventory(config), "/etc/sshadapter/config.toml")
    assert str(caught.value) == (
        "/etc/sshadapter/config.toml: pool.warm: 'nope' is no host alias and no group"
    )


def test_a_warm_group_connects_its_members() -> None:
    """`[pool] warm` may name a group: every member host is warmed, each once."""
    hosts = {
        name: HostSection(address="127.0.0.1", user="nobody", known_hosts=Path("/x"))
        for name in ("a", "b", "c")
    }
    config = Config(
        hosts=hosts,
        groups={"ab": GroupSection(members=("a", "b"))},
        pool=PoolSection(warm=("ab", "a", "c")),
    )
    assert warm_aliases(config, load_inventory(config)) == ["a", "b", "c"]


def assert_prints_true(script: str) -> None:
    """Run ``script`` in a fresh interpreter (process-wide settings stay out of this one)."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=os.environ, check=True
    )
    assert done.stdout == "True\n", done.stderr


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    """Started with a soft RLIMIT_NOFILE of 256, the daemon's helper raises it to the hard."""
    script = (
        "import resource\n"
        "from sshadapter.daemon.assemble import raise_open_files_limit\n"
        "hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))\n"
        "print(raise_open_files_limit() == (hard, hard) == resource.getrlimit(7))\n"
    )
    assert_prints_true(script)


def test_the_young_generation_waits_for_gc_young_threshold_allocations() -> None:
    """The daemon's helper sets the collector's first threshold and keeps the other two."""
    script = (
        "import gc\n"
        "from sshadapter.daemon.assemble import GC_YOUNG_THRESHOLD, tune_garbage_collector\n"
        "gc.set_threshold(700, 11, 12)\n"
        "print(tune_garbage_collector() == (GC_YOUNG_THRESHOLD, 11, 12) == gc.get_threshold())\n"
    )
    assert_prints_true(script)


FLEET_HOSTS = 40  # three of the fleet's sshd processes, past any one ceiling below


def fleet_fanout(
    tmp_path: Path, fleet: Fleet, calls: int, **server: Any
) -> tuple[list[Any], list[int]]:
    """``calls`` fan-outs of the shipped load_average over every fleet host, one after the
    other, through the daemon with the SSH runner; the answers, and the handshakes in
    flight sampled while they ran."""
    commands = tmp_path / "commands"
    commands.mkdir()
    fanout = f"\n[fanout]\nmax_hosts = {FLEET_HOSTS}\nmax_results = {FLEET_HOSTS}\n"
    (commands / "load_average.toml").write_text(
        (ROOT / "commands" / "load_average.toml")
        .read_text()
        .replace('host = "local"', 'targets = ["fleet"]')
        + fanout
    )
    hosts = {
        h.alias: HostSection(
            address=h.address,
            port=h.port,
            user=fleet.user,
            client_keys=(fleet.client_key,),
            known_hosts=fleet.known_hosts,
        )
        for h in fleet.hosts
    }
    answers: list[Any] = []
    seen: list[int] = []

    async def body(d: Running) -> None:
        for _ in range(calls):
            call = asyncio.ensure_future(
                d.ask({"op": "call", "tool": "load_average", "args": {"run_on": "fleet"}})
            )
            while not call.done():
                seen.append(d.service.runner.handshakes_in_flight)  # type: ignore[attr-defined]
                await asyncio.sleep(0.005)
            answers.append(await call)

    with_daemon(
        tmp_path,
        body,
        ssh=True,
        commands=commands,
        hosts=hosts,
        groups={"fleet": GroupSection(members=tuple(hosts))},
        **server,
    )
    return answers, seen


def test_a_fan_out_with_the_shipped_defaults_answers_every_fleet_host(tmp_path: Path) -> None:
    """Real sshd hosts, cold then warm, with the shipped paced bounds: every host answers."""
    with running_fleet(FLEET_HOSTS) as fleet:
        answers, _ = fleet_fanout(tmp_path, fleet, calls=2)
    for answer in answers:
        assert answer["outcome"] == "success", answer
        assert (answer["data"]["succeeded"], answer["data"]["failed"]) == (FLEET_HOSTS, 0)


def test_the_ceilings_still_bound_a_paced_fan_out(tmp_path: Path) -> None:
    """A paced cold fan-out keeps connect_concurrency = 2 as its ceiling; every host answers."""
    with running_fleet(FLEET_HOSTS) as fleet:
        answers, seen = fleet_fanout(
            tmp_path,
            fleet,
            calls=1,
            pool=PoolSection(connect_concurrency=2),
            max_fanout_hosts_in_flight=3,
        )
    (answer,) = answers
    assert (answer["data"]["succeeded"], answer["data"]["failed"]) == (FLEET_HOSTS, 0)
    assert max(seen) <= 2


def test_a_fan_out_past_the_connection_cap_answers_every_host_and_warns_of_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """40 hosts through 8 connections: each host waits for room before its timeout starts."""
    with running_fleet(FLEET_HOSTS) as fleet:
        answers, _ = fleet_fanout(
            tmp_path, fleet, calls=2, pool=PoolSection(max_connections_total=8)
        )
    for answer in answers:
        assert (answer["data"]["succeeded"], answer["data"]["failed"]) == (FLEET_HOSTS, 0)
    assert "not warmed" not in caplog.text
