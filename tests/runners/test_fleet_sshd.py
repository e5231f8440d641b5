"""The fleet fixture (tests/support/fleet_sshd.py) does what fleet tests and the benchmark rely on.

A fleet of 32 ordinary hosts plus one host of each misbehaviour, reached through
plain asyncssh (no sshadapter code), pinned by the one ``@cert-authority`` line.
Tests are plain functions that call ``asyncio.run``, as in test_ssh_runner.py.
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

import asyncssh
import pytest
from fleet_sshd import (
    INJECTED_TEXT,
    Fleet,
    expected_sshd_processes,
    fleet_address,
    injecting,
    running_fleet,
)

ORDINARY = 32  # the hosts that must all answer
CHANGED, SILENT, INJECTED = "h033", "h034", "h035"
HANDSHAKES_IN_FLIGHT = 16  # what a sane client opens at once on 2 cores
CONNECT_TIMEOUT_SECONDS = 20.0  # 32 handshakes on a loaded 2-core box
SILENT_WAIT_SECONDS = 1.0  # the silent host must still say nothing after this
LOADAVG = "cat /proc/loadavg"


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    with running_fleet(
        ORDINARY + 3,
        changed_key=[CHANGED],
        silent=[SILENT],
        forced={INJECTED: injecting()},
    ) as running:
        yield running


async def connect(fleet: Fleet, alias: str, known_hosts: Path) -> asyncssh.SSHClientConnection:
    host = fleet.host(alias)
    return await asyncssh.connect(
        host.address,
        host.port,
        config=None,
        username=fleet.user,
        client_keys=[str(fleet.client_key)],
        known_hosts=str(known_hosts),
        agent_path=None,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
    )


async def run_on(fleet: Fleet, alias: str, known_hosts: Path, command: str = LOADAVG) -> str:
    conn = await connect(fleet, alias, known_hosts)
    try:
        result = await conn.run(command, check=True, stdin=asyncssh.DEVNULL)
    finally:
        conn.close()
        await conn.wait_closed()
    return str(result.stdout)


def test_every_ordinary_host_answers_with_only_the_ca_line(fleet: Fleet) -> None:
    """All 32 ordinary hosts log in and run a command, pinned by one @cert-authority line."""
    assert fleet.known_hosts.read_text().count("\n") == 1
    assert fleet.known_hosts.read_text().startswith(f"@cert-authority [127.0.*]:{fleet.port} ")
    ordinary = [h.alias for h in fleet.hosts if h.kind == "sshd" and h.forced is None]
    assert len(ordinary) == ORDINARY
    gate = asyncio.Semaphore(HANDSHAKES_IN_FLIGHT)

    async def one(alias: str) -> str:
        async with gate:
            return await run_on(fleet, alias, fleet.known_hosts)

    async def all_hosts() -> list[str]:
        return await asyncio.gather(*(one(alias) for alias in ordinary))

    outputs = asyncio.run(all_hosts())
    assert all(len(out.split()) == 5 for out in outputs), outputs
    # 32 ordinary + 1 forced host on 16 addresses per sshd, and one impostor sshd
    assert len(fleet.sshd_pids) == expected_sshd_processes(ORDINARY + 1) + 1


def test_hosts_sit_on_distinct_loopback_addresses_and_one_port(fleet: Fleet) -> None:
    """Aliases h001.. map to 127.0.0.2.. in order, all on the fleet's one port."""
    assert fleet.aliases[:2] == ("h001", "h002")
    assert [h.address for h in fleet.hosts] == [fleet_address(i) for i in range(ORDINARY + 3)]
    assert fleet_address(0) == "127.0.0.2" and fleet_address(253) == "127.0.1.2"
    assert {h.port for h in fleet.hosts} == {fleet.port}


def test_a_host_whose_key_changed_is_refused(fleet: Fleet, tmp_path: Path) -> None:
    """The changed-key host is refused by the CA line and by the fleet's plain lines."""
    with pytest.raises(asyncssh.HostKeyNotVerifiable, match="CA key is not trusted"):
        asyncio.run(run_on(fleet, CHANGED, fleet.known_hosts))
    plain = fleet.write_known_hosts(tmp_path / "plain", ca=False, plain=True)
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(run_on(fleet, CHANGED, plain))


def test_a_wrong_plain_line_refuses_that_host_only(fleet: Fleet, tmp_path: Path) -> None:
    """Plain per-host lines pin each host; a host pinned to another key is refused."""
    plain = fleet.write_known_hosts(tmp_path / "plain", ca=False, plain=True, wrong=["h002"])
    assert "@cert-authority" not in plain.read_text()
    assert len(asyncio.run(run_on(fleet, "h001", plain)).split()) == 5
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(run_on(fleet, "h002", plain))
    mixed = fleet.write_known_hosts(tmp_path / "mixed", ca=True, wrong=["h003"])
    assert f"![{fleet.host('h003').address}]:{fleet.port}" in mixed.read_text()
    assert len(asyncio.run(run_on(fleet, "h004", mixed)).split()) == 5
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        asyncio.run(run_on(fleet, "h003", mixed))


def test_the_injected_host_prints_its_text_before_the_output(fleet: Fleet) -> None:
    """The forced command of one address prints the injected line, then runs the command."""
    lines = asyncio.run(run_on(fleet, INJECTED, fleet.known_hosts)).splitlines()
    assert lines[0] == INJECTED_TEXT
    assert len(lines) == 2 and len(lines[1].split()) == 5
    # the hosts beside it on the same sshd are untouched
    assert asyncio.run(run_on(fleet, "h032", fleet.known_hosts)).count("\n") == 1


def test_the_silent_host_accepts_and_never_speaks(fleet: Fleet) -> None:
    """The silent host's TCP connection opens, and no SSH banner ever comes."""

    async def probe() -> bytes:
        host = fleet.host(SILENT)
        reader, writer = await asyncio.open_connection(host.address, host.port)
        try:
            return await asyncio.wait_for(reader.read(4), SILENT_WAIT_SECONDS)
        finally:
            writer.close()

    with pytest.raises(TimeoutError):
        asyncio.run(probe())


def test_the_inventory_names_every_host_with_labels_and_a_group(fleet: Fleet) -> None:
    """The inventory file has shared defaults, one table per host, and the all-hosts group."""
    text = fleet.inventory_toml(groups={"even": {"match": {"shard": "s0"}, "exclude": ["h001"]}})
    inventory = tomllib.loads(text)
    assert inventory["host_defaults"] == {
        "user": fleet.user,
        "client_keys": [str(fleet.client_key)],
        "known_hosts": str(fleet.known_hosts),
    }
    assert len(inventory["hosts"]) == ORDINARY + 3
    assert inventory["hosts"]["h002"] == {
        "address": "127.0.0.3",
        "port": fleet.port,
        "labels": {"fleet": "test", "shard": "s1"},
    }
    assert inventory["groups"] == {"even": {"match": {"shard": "s0"}, "exclude": ["h001"]}}
    assert tomllib.loads(fleet.inventory_toml())["groups"] == {
        "all-hosts": {"match": {"fleet": "test"}}
    }
    subset = tomllib.loads(fleet.inventory_toml(hosts=["h001"], dispatch=True, user=None))
    assert list(subset["hosts"]) == ["h001"]
    assert subset["host_defaults"] == {
        "client_keys": [str(fleet.client_key)],
        "known_hosts": str(fleet.known_hosts),
        "dispatch": True,
    }


def test_the_fleet_stops_every_process_it_started() -> None:
    """On exit every sshd listener is gone and the fleet's directory removed."""
    with running_fleet(2) as small:
        pids, workdir = small.sshd_pids, small.workdir
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)
    assert not workdir.exists()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
