"""runners/ssh/coalesce.py: one send per loop turn, on a real socket transport."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

import pytest

from sshadapter.runners.ssh.coalesce import (
    MAX_PENDING_BYTES,
    CoalescingTransport,
    coalesce_writes,
)


def on_socketpair(body: Callable[[CoalescingTransport, socket.socket], Awaitable[None]]) -> None:
    """Run ``body`` with a CoalescingTransport over one end of a socketpair and the other end."""

    async def main() -> None:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        transport, _ = await asyncio.get_running_loop().create_unix_connection(
            asyncio.Protocol, sock=ours
        )
        try:
            await body(CoalescingTransport(transport), peer)
        finally:
            transport.abort()
            peer.close()

    asyncio.run(main())


def received(peer: socket.socket) -> bytes:
    """What the peer can read now, without waiting."""
    try:
        return peer.recv(1 << 20)
    except BlockingIOError:
        return b""


def test_writes_of_one_turn_leave_together_at_the_next_turn_in_order() -> None:
    """Three writes are held until the next loop turn, then sent as one, in order."""

    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        for part in (b"exec ", b"eof ", b"open"):
            transport.write(part)
        assert received(peer) == b""
        assert transport.get_write_buffer_size() == 13
        await asyncio.sleep(0)
        assert received(peer) == b"exec eof open"
        assert transport.get_write_buffer_size() == 0

    on_socketpair(body)


@pytest.mark.parametrize("end", ["close", "abort"])
def test_close_and_abort_send_what_is_pending_first(end: str) -> None:
    """asyncssh writes its disconnect message, then aborts: the message still goes out."""

    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.writelines([b"disconnect", b"!"])
        getattr(transport, end)()
        await asyncio.sleep(0)
        peer.setblocking(True)
        assert peer.recv(100) == b"disconnect!"
        assert transport.is_closing()

    on_socketpair(body)


def test_a_burst_past_the_bound_is_sent_at_once() -> None:
    """MAX_PENDING_BYTES written in one turn go to the socket without waiting for the turn."""

    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.write(b"x" * MAX_PENDING_BYTES)
        got = b""
        while chunk := received(peer):
            got += chunk
        assert got  # sent before any loop turn
        assert transport.get_write_buffer_size() == MAX_PENDING_BYTES - len(got)

    on_socketpair(body)


def test_a_write_after_close_is_dropped_quietly() -> None:
    """Writes to a closing transport go nowhere and raise nothing, as asyncio's own."""

    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        transport.close()
        transport.write(b"late")
        transport.write(b"")
        await asyncio.sleep(0)
        assert received(peer) == b""
        assert transport.is_closing()

    on_socketpair(body)


def test_coalesce_writes_leaves_an_object_without_a_transport_alone() -> None:
    """An asyncssh that keeps its transport elsewhere is left as it is: nothing wrapped."""

    class NoTransport:
        pass

    conn = NoTransport()
    assert coalesce_writes(conn) is False  # type: ignore[arg-type]
    assert not hasattr(conn, "_transport")


def test_coalesce_writes_wraps_a_connection_transport_once() -> None:
    """The connection's transport is wrapped on the first call; a second call changes nothing."""

    async def body(transport: CoalescingTransport, peer: socket.socket) -> None:
        class Conn:
            _transport: asyncio.Transport

        conn = Conn()
        conn._transport = transport._transport  # the socket transport under the test's wrapper
        assert coalesce_writes(conn) is True  # type: ignore[arg-type]
        assert isinstance(conn._transport, CoalescingTransport)
        assert coalesce_writes(conn) is False  # type: ignore[arg-type]
        conn._transport.write(b"via the wrapper")
        await asyncio.sleep(0)
        assert received(peer) == b"via the wrapper"

    on_socketpair(body)
