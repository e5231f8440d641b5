"""runners/ssh/ignore_packets.py: no empty SSH_MSG_IGNORE under AES-GCM, as before under CBC."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import asyncssh
import pytest

from sshadapter.config import HostSection
from sshadapter.runners.ssh.dial import dial
from sshadapter.runners.ssh.ignore_packets import UNCHAINED_CIPHERS, skip_ignore_packets

SERVER_CIPHERS = ["aes128-gcm@openssh.com", "aes128-cbc"]  # CBC: only for the second case


@pytest.fixture
def packet_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """asyncssh's packet log (debug level 3) captured, for client and server alike."""
    asyncssh.set_debug_level(3)
    try:
        with caplog.at_level("DEBUG", logger="asyncssh"):
            yield caplog
    finally:
        asyncssh.set_debug_level(1)


def ignores_sent_by_the_client(caplog: pytest.LogCaptureFixture) -> int:
    """MSG_IGNORE packets the connection that opened the session sent (the server's have
    another ``conn=`` context)."""
    lines = [r.getMessage() for r in caplog.records]
    opener = next(m for m in lines if "Sent MSG_CHANNEL_OPEN (90)" in m)
    context = opener[: opener.index(",")]  # "[conn=N"
    return sum(m.startswith(context + ",") and "Sent MSG_IGNORE" in m for m in lines)


async def echo(process: asyncssh.SSHServerProcess[str]) -> None:
    process.stdout.write("hi\n")
    process.exit(0)


def with_server(tmp_path: Path, body: Callable[[int, Path, Path], Awaitable[None]]) -> None:
    """An asyncssh server offering AES-GCM and AES-CBC; ``body(port, client key, known
    hosts)``."""

    async def main() -> None:
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        key_path, known = tmp_path / "client_key", tmp_path / "known_hosts"
        client_key.write_private_key(key_path)
        key_path.chmod(0o600)
        server = await asyncssh.create_server(
            asyncssh.SSHServer,
            "127.0.0.1",
            0,
            config=None,
            server_host_keys=[host_key],
            authorized_client_keys=asyncssh.import_authorized_keys(
                client_key.export_public_key().decode()
            ),
            encryption_algs=SERVER_CIPHERS,
            process_factory=echo,
        )
        port = server.sockets[0].getsockname()[1]
        known.write_text(f"[127.0.0.1]:{port} {host_key.export_public_key().decode()}")
        try:
            await body(port, key_path, known)
        finally:
            server.close()
            await server.wait_closed()

    asyncio.run(main())


def test_a_dialled_connection_under_aes_gcm_sends_no_ignore_packets(
    tmp_path: Path, packet_log: pytest.LogCaptureFixture
) -> None:
    """dial's connection negotiates AES-GCM and its exec, EOF and close go without MSG_IGNORE."""

    async def body(port: int, key: Path, known: Path) -> None:
        section = HostSection(
            address="127.0.0.1", port=port, user="u", client_keys=(key,), known_hosts=known
        )
        conn = await dial(
            section,
            [asyncssh.read_private_key(key)],
            asyncssh.read_known_hosts(str(known)),
            lambda c: None,
        )
        try:
            assert conn.get_extra_info("send_cipher") in UNCHAINED_CIPHERS
            packet_log.clear()
            result = await conn.run("anything", check=True)
            assert result.stdout == "hi\n"
            assert ignores_sent_by_the_client(packet_log) == 0
        finally:
            conn.close()
            await conn.wait_closed()

    with_server(tmp_path, body)


def test_under_a_chained_cipher_every_ignore_packet_is_still_sent(
    tmp_path: Path, packet_log: pytest.LogCaptureFixture
) -> None:
    """Under AES-CBC the wrapped connection sends asyncssh's MSG_IGNORE before each packet."""

    async def body(port: int, key: Path, known: Path) -> None:
        conn = await asyncssh.connect(
            "127.0.0.1",
            port,
            config=None,
            username="u",
            client_keys=[str(key)],
            known_hosts=str(known),
            agent_path=None,
            encryption_algs=["aes128-cbc"],
        )
        try:
            assert skip_ignore_packets(conn) is True
            assert skip_ignore_packets(conn) is False  # wrapped once only
            packet_log.clear()
            assert (await conn.run("anything", check=True)).stdout == "hi\n"
            assert (
                ignores_sent_by_the_client(packet_log) >= 3
            )  # before the open, the exec, the close
        finally:
            conn.close()
            await conn.wait_closed()

    with_server(tmp_path, body)


def test_an_asyncssh_without_send_packet_is_left_alone() -> None:
    """An object without asyncssh's packet writer is not wrapped: nothing changes."""

    class NoSendPacket:
        pass

    conn = NoSendPacket()
    assert skip_ignore_packets(conn) is False  # type: ignore[arg-type]
    assert "send_packet" not in vars(conn)
