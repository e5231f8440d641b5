"""Jump hosts (``via``) against real sshds: a bastion locked down as docs/operations.md
"Bastions" says, a target behind it, and a thief holding the bastion's key."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import asyncssh
import pytest
from sshd import Sshd, generate_key, running_sshd, write_known_hosts
from test_inventory import load_error

from sshadapter.config import HostSection, PoolSection
from sshadapter.errors import UpstreamError
from sshadapter.runners.ssh.runner import SshRunner

T = TypeVar("T")

# The bastion's sshd settings for its jump account, as in docs/operations.md "Bastions".
BASTION_MATCH = """
Match User {user}
    AllowTcpForwarding local
    AllowStreamLocalForwarding no
    PermitListen none
    PermitTunnel no
    PermitTTY no
    X11Forwarding no
    AllowAgentForwarding no
    ForceCommand /bin/false
"""
CALL: dict[str, Any] = {"timeout": 20.0, "max_stdout": 4096, "max_stderr": 4096}


def key_line(*targets: Sshd | tuple[str, int]) -> str:
    """The bastion's authorized_keys options for its jump key, forwarding to ``targets``."""
    opens = ",".join(
        f'permitopen="{t.address}:{t.port}"'
        if isinstance(t, Sshd)
        else f'permitopen="{t[0]}:{t[1]}"'
        for t in targets
    )
    return f'restrict,port-forwarding,{opens},command="/bin/false"'


@pytest.fixture(scope="module")
def target() -> Iterator[Sshd]:
    with running_sshd() as sshd:
        yield sshd


@pytest.fixture(scope="module")
def bastion(target: Sshd) -> Iterator[Sshd]:
    with running_sshd(extra_config=BASTION_MATCH) as sshd:
        sshd.authorize(key_line(target))
        yield sshd


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def wrapped() -> T:
        return await main()

    return asyncio.run(wrapped())


def hosts(bastion: Sshd, target: Sshd, **overrides: Any) -> dict[str, HostSection]:
    return {"edge": bastion.host_section(), "ci": target.host_section(via="edge", **overrides)}


async def call(runner: SshRunner, host: str, command: str) -> bytes:
    result = await runner.run(host, command, **CALL)
    assert result.exit_status == 0, result
    return result.stdout


async def failure(runner: SshRunner, host: str = "ci") -> UpstreamError:
    with pytest.raises(UpstreamError) as caught:
        await runner.run(host, "echo nope", **CALL)
    return caught.value


def test_a_call_through_one_hop_runs_on_the_target(bastion: Sshd, target: Sshd) -> None:
    """The target connection is a tunnel on the bastion's own pooled connection."""

    async def main() -> None:
        runner = SshRunner(hosts(bastion, target))
        try:
            assert await call(runner, "ci", "echo hi; echo $SSH_CONNECTION") != b""
            assert runner.connections() == {"edge": 1, "ci": 1}
            assert runner.tunnels() == {"edge": 1}
        finally:
            await runner.close()

    run(main)


def test_many_target_connections_share_one_bastion_connection(bastion: Sshd, target: Sshd) -> None:
    """Tunnels are not session channels: six target connections ride one bastion connection."""

    async def main() -> None:
        runner = SshRunner(hosts(bastion, target, max_channels_per_connection=1))
        try:
            outs = await asyncio.gather(
                *(call(runner, "ci", "sleep 0.3; echo x") for _ in range(12))
            )
            assert outs == [b"x\n"] * 12
            assert runner.connections()["edge"] == 1
            assert (
                runner.tunnels() == {"edge": runner.connections()["ci"]}
                and runner.tunnels()["edge"] > 1
            )
        finally:
            await runner.close()

    run(main)


def test_one_handshake_at_a_time_and_two_connections_in_all_suffice(
    bastion: Sshd, target: Sshd
) -> None:
    """The jump host's connect comes before the target's handshake slot: no deadlock at 1."""

    async def main() -> None:
        limits = PoolSection(connect_concurrency=1, max_connections_total=2)
        runner = SshRunner(hosts(bastion, target), pool=limits)
        try:
            outs = await asyncio.gather(*(call(runner, "ci", "echo x") for _ in range(8)))
            assert outs == [b"x\n"] * 8
            assert runner.connections() == {"edge": 1, "ci": 1}
        finally:
            await runner.close()

    run(main)


def test_two_hops_each_pinned(bastion: Sshd, target: Sshd) -> None:
    """A chain: ci via inner via edge, every hop dialled with its own known_hosts and key."""

    async def main() -> None:
        chain = {
            "edge": bastion.host_section(),
            "inner": bastion.host_section(via="edge"),
            "ci": target.host_section(via="inner"),
        }
        runner = SshRunner(chain)
        try:
            assert await call(runner, "ci", "echo deep") == b"deep\n"
            assert runner.tunnels() == {"edge": 1, "inner": 1}
        finally:
            await runner.close()

    bastion.authorize(key_line(target, bastion))
    try:
        run(main)
    finally:
        bastion.authorize(key_line(target))


def test_a_target_that_changed_its_key_is_refused(
    bastion: Sshd, target: Sshd, tmp_path: Path
) -> None:
    """Behind the bastion, the target's own pin holds: host_key_mismatch, not retried."""
    other = generate_key(tmp_path / "other_host_key")
    wrong = write_known_hosts(tmp_path / "known_hosts", target.address, target.port, other)

    async def main() -> UpstreamError:
        runner = SshRunner(hosts(bastion, target, known_hosts=wrong))
        try:
            return await failure(runner)
        finally:
            await runner.close()

    error = run(main)
    assert (error.reason, error.retryable, error.ran) == ("host_key_mismatch", False, False)


def test_a_bastion_that_changed_its_key_is_refused(
    bastion: Sshd, target: Sshd, tmp_path: Path
) -> None:
    """The bastion is pinned too: the target's call names the jump host that failed."""
    other = generate_key(tmp_path / "other_host_key")
    wrong = write_known_hosts(tmp_path / "known_hosts", bastion.address, bastion.port, other)

    async def main() -> UpstreamError:
        runner = SshRunner(
            {"edge": bastion.host_section(known_hosts=wrong), "ci": target.host_section(via="edge")}
        )
        try:
            return await failure(runner)
        finally:
            await runner.close()

    error = run(main)
    assert (error.reason, error.retryable) == ("host_key_mismatch", False)
    assert error.detail.startswith("jump host edge: "), error.detail


def test_a_bastion_refusing_the_forward_is_a_closed_failure(bastion: Sshd, target: Sshd) -> None:
    """A target the bastion's permitopen does not list: tunnel_refused, not retryable."""

    async def main() -> UpstreamError:
        runner = SshRunner(hosts(bastion, target, address="localhost"))  # permitopen is literal
        try:
            return await failure(runner)
        finally:
            await runner.close()

    error = run(main)
    assert (error.reason, error.retryable, error.ran) == ("tunnel_refused", False, False)


def test_losing_the_bastion_fails_its_targets_retryably(target: Sshd) -> None:
    """Its connection killed mid-call: connection_lost (retryable), counted, then reconnected."""
    lost: list[str] = []
    with running_sshd(extra_config=BASTION_MATCH) as bastion:
        bastion.authorize(key_line(target))

        async def main() -> UpstreamError:
            runner = SshRunner(hosts(bastion, target), on_jump_lost=lost.append)
            try:
                slow = asyncio.ensure_future(runner.run("ci", "sleep 10; echo late", **CALL))
                while not runner.tunnels():
                    await asyncio.sleep(0.02)
                await asyncio.sleep(0.3)  # the exec request is out
                kill_connections(bastion)
                with pytest.raises(UpstreamError) as caught:
                    await slow
                assert await call(runner, "ci", "echo back") == b"back\n"
                return caught.value
            finally:
                await runner.close()

        error = run(main)
    assert (error.reason, error.retryable) == ("connection_lost", True)
    assert lost == ["edge"]


def kill_connections(sshd: Sshd) -> None:
    """SIGKILL the per-connection processes of this test's own sshd, the privilege-separated
    child holding the socket included (its listener stays)."""

    def descendants(pid: int) -> list[int]:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        return children + [d for c in children for d in descendants(c)]

    doomed = descendants(int((sshd.workdir / "sshd.pid").read_text()))
    assert doomed, "no connection to the bastion"
    for pid in doomed:
        os.kill(pid, signal.SIGKILL)


def test_a_thief_with_the_bastion_key_gets_only_the_listed_forward(
    bastion: Sshd, target: Sshd
) -> None:
    """No command, no shell, no sftp, no other target, no Unix socket, no remote listener."""

    async def main() -> None:
        async with asyncssh.connect(
            bastion.address,
            bastion.port,
            config=None,
            username=bastion.user,
            client_keys=[asyncssh.read_private_key(bastion.client_key)],
            known_hosts=str(bastion.known_hosts),
            agent_path=None,
        ) as conn:
            ran = await conn.run("id", check=False)
            assert (ran.exit_status, ran.stdout) == (1, "")
            with pytest.raises(asyncssh.ChannelOpenError, match="PTY request failed"):
                await conn.run(term_type="xterm", input="id\n", check=False)
            shell = await conn.run(input="id\n", check=False)  # a shell without a PTY
            assert (shell.exit_status, shell.stdout, shell.stderr) == (1, "", "")
            with pytest.raises((asyncssh.SFTPError, asyncssh.ChannelOpenError, asyncssh.Error)):
                await conn.start_sftp_client()
            for host, port in [(bastion.address, bastion.port), ("localhost", target.port)]:
                with pytest.raises(asyncssh.ChannelOpenError) as refused:
                    await conn.open_connection(host, port)
                assert refused.value.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED
            # A Unix socket anyone may connect to (say, a container engine's): sshd refuses
            # the forward before connecting (its reason code is the generic "open failed").
            reached: list[bool] = []
            socket_path = bastion.workdir / "engine.sock"
            server = await asyncio.start_unix_server(
                lambda r, w: reached.append(True), path=str(socket_path)
            )
            socket_path.chmod(0o777)
            try:
                with pytest.raises(asyncssh.ChannelOpenError):
                    await conn.open_unix_connection(str(socket_path))
            finally:
                server.close()
            assert reached == []
            with pytest.raises(asyncssh.ChannelListenError):
                await conn.forward_remote_port("127.0.0.1", 0, target.address, target.port)
            # The one thing the key does: a TCP stream to the listed target's sshd,
            # which still wants the target's own key.
            reader, writer = await conn.open_connection(target.address, target.port)
            assert (await reader.readline()).startswith(b"SSH-2.0-")
            writer.close()

    run(main)


@pytest.mark.parametrize(
    ("more", "key", "reason"),
    [
        ('[hosts.db1]\naddress = "x"\nvia = "nosuch"\n', "hosts.db1.via", "no host alias"),
        ('[hosts.db1]\naddress = "x"\nvia = "db1"\n', "hosts.db1.via", "cycle: db1 -> db1"),
        (
            '[hosts.a]\naddress = "x"\nvia = "b"\n[hosts.b]\naddress = "y"\nvia = "a"\n',
            "hosts.b.via",
            "cycle: a -> b -> a",
        ),
        (
            "".join(f'[hosts.h{i}]\naddress = "10.0.0.{i}"\nvia = "h{i + 1}"\n' for i in range(4))
            + '[hosts.h4]\naddress = "10.0.0.4"\n',
            "hosts.h3.via",
            "more than 3 jump hosts: h0 -> h1 -> h2 -> h3 -> h4",
        ),
        ('[hosts.db1]\naddress = "x"\nvia = "Bad Name"\n', "hosts.db1.via", ""),
    ],
)
def test_via_load_errors(tmp_path: Path, more: str, key: str, reason: str) -> None:
    """An unknown jump alias, a cycle, a chain too deep: one error naming file, key, reason."""
    error = load_error(tmp_path, more=more)
    assert error.file.endswith("more.toml"), error
    assert error.key == key, error
    assert reason in error.reason, error
    assert "\n" not in str(error)


def test_via_in_host_defaults_and_a_direct_bastion(tmp_path: Path) -> None:
    """[host_defaults] via applies to every host; the bastion itself sets via = "" (direct)."""
    more = (
        '[host_defaults]\nvia = "edge"\n[hosts.edge]\naddress = "198.51.100.7"\nvia = ""\n'
        '[hosts.db1]\naddress = "10.0.0.9"\n'
    )
    from test_inventory import write

    from sshadapter.config import load_config
    from sshadapter.inventory.fleet import load_inventory, via_chain

    config, _ = load_config(write(tmp_path, more=more))
    inventory = load_inventory(config)
    assert via_chain("db1", inventory.hosts) == ("edge",)
    assert via_chain("edge", inventory.hosts) == ()
