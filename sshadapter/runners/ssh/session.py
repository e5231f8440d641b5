"""One command's session channel: no PTY, no environment, stdin closed at once, output capped.

stdout and stderr are capped as each packet arrives: past a cap the remote command is
killed, the channel closed, and the result carries ``cap + 1`` bytes (proof that the cap
was exceeded) and no exit status. Reference: docs/protocol.md "Stages" (5).

The result is complete once the channel's EOF and the command's exit status (or signal)
have both arrived: no data may follow an EOF. The call goes on from there, without
waiting for the channel's close, so the answer to the agent leaves before the close
handshake with sshd (measured: one send() less on the path of a c=1 call).

Its slot in the pool is held until the host's CHANNEL_CLOSE answers ours (sshd frees the
session only then). A host that never sends it would keep the slot for good: after
UNCLOSED_AFTER_SECONDS the slot is given back anyway and the pool told (``on_unclosed``),
which retires a connection that collects too many such channels (``pool``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any, Final

import asyncssh

MAX_PACKET_BYTES: Final = 32 * 1024  # one data packet: all we ever hold beyond a cap
ABORT_SIGNAL: Final = "KILL"  # sshd keeps a closed session (a MaxSessions slot) until it exits
# How long after our CHANNEL_CLOSE the host's may take before the channel counts as unclosed
# and its slot goes back. sshd answers a close at once for a command that has exited (EOF and
# exit status seen), and within milliseconds of the KILL for one that had not: a second is
# many round trips, and a tenth of the default timeout_seconds (10 s), so a call waiting for
# a slot of a host that never closes still gets one within its timeout.
UNCLOSED_AFTER_SECONDS: Final = 1.0


class Session(asyncssh.SSHClientSession[bytes]):
    """One command's channel: output capped as each packet arrives, never buffered beyond."""

    def __init__(self, max_stdout: int, max_stderr: int, on_closed: Callable[[], None]) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit_status: int | None = None
        self.signalled = False
        self.eof = False
        self.over_cap = False
        self.error: Exception | None = None
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._max_stdout = max_stdout
        self._max_stderr = max_stderr
        self._on_closed = on_closed
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None
        self._stopping = False
        self._closed = False
        self._released = False
        self._unclosed: asyncio.TimerHandle | None = None

    @property
    def channel_opened(self) -> bool:
        """The server accepted the channel: the exec request may have gone out."""
        return self._chan is not None

    def connection_made(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self._chan = chan
        if self.on_channel is not None:
            self.on_channel(chan)

    on_channel: Callable[[asyncssh.SSHClientChannel[bytes]], None] | None = None
    """A spare's hook: the channel is open, its exec request not yet sent."""

    on_unclosed: Callable[[], None] | None = None
    """The pool's hook: the host left the channel open UNCLOSED_AFTER_SECONDS after our
    close; the slot is released right after it."""

    def bind(self, max_stdout: int, max_stderr: int, on_closed: Callable[[], None]) -> None:
        """A spare's session becomes a call's: its caps, and who gets its slot back."""
        self._max_stdout = max_stdout
        self._max_stderr = max_stderr
        self._on_closed = on_closed

    def data_received(self, data: bytes, datatype: asyncssh.DataType) -> None:
        if self._stopping:
            return
        if datatype == asyncssh.EXTENDED_DATA_STDERR:
            buf, cap = self.stderr, self._max_stderr
        else:
            buf, cap = self.stdout, self._max_stdout
        buf += data[: cap + 1 - len(buf)]  # cap + 1 bytes prove the cap was exceeded
        if len(buf) > cap:
            self.over_cap = True
            self.stop()
            self._finish()

    def exit_status_received(self, status: int) -> None:
        self.exit_status = status
        self._finish_if_exited()

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.signalled = True
        self._finish_if_exited()

    def eof_received(self) -> bool:
        self.eof = True
        self._finish_if_exited()
        return False  # asyncssh then sends our EOF too, as it does by default

    def take_output(self) -> tuple[bytes, bytes]:
        """stdout and stderr as bytes; the session keeps none of them (its channel may stay
        open until the host closes it, long after the call has its result)."""
        output = bytes(self.stdout), bytes(self.stderr)
        self.stdout, self.stderr = bytearray(), bytearray()
        return output

    @property
    def exited(self) -> bool:
        """The command is over and all its output is here: EOF and an exit status or signal."""
        return self.eof and (self.exit_status is not None or self.signalled)

    def _finish_if_exited(self) -> None:
        if self.exited and not self._stopping:
            self._finish()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if self._unclosed is not None:
            self._unclosed.cancel()
        if exc is not None and not self.finished.done():
            self.error = exc
        self._finish()
        self.release()

    def result_status(self) -> int | None:
        """The exit status, or None when killed, cut at a cap, or closed without one."""
        return None if self.over_cap or self.signalled else self.exit_status

    def stop(self) -> None:
        """Kill the remote command and close the channel; a no-op once closed or stopping.

        A command that has exited is not signalled: its channel is closed, if sshd has not
        closed it already."""
        if self._chan is None or self._closed or self._stopping:
            return
        self._stopping = True
        self._unclosed = asyncio.get_running_loop().call_later(
            UNCLOSED_AFTER_SECONDS, self._check_closed
        )
        if self.exited:
            if not self._chan.is_closing():
                self._chan.close()
            return
        with contextlib.suppress(OSError):  # already closing: close() is all that is left
            self._chan.send_signal(ABORT_SIGNAL)
        self._chan.close()

    def _check_closed(self) -> None:
        # One loop turn later: a close read in the turn the timer fires (a busy loop) has
        # its connection_lost queued before this, and is not counted as unclosed.
        asyncio.get_running_loop().call_soon(self._give_up_close)

    def _give_up_close(self) -> None:
        """The host never answered our close: the slot goes back, the pool counts it."""
        if self._closed or self._released:
            return
        if self.on_unclosed is not None:
            self.on_unclosed()
        self.release()

    def release(self) -> None:
        """Give the channel slot back to the pool, exactly once."""
        if not self._released:
            self._released = True
            self._on_closed()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


async def create_session(
    ssh: asyncssh.SSHClientConnection, factory: Callable[[], Any], command: str
) -> tuple[Any, Any]:
    return await ssh.create_session(
        factory,
        command,
        term_type=None,
        request_pty=False,
        env=None,
        send_env=None,
        x11_forwarding=False,
        encoding=None,
        max_pktsize=MAX_PACKET_BYTES,
    )


async def finish_opening(opening: asyncio.Future[tuple[Any, Any]], session: Session) -> None:
    """Wait for the exec request's answer; if our caller is cancelled, clean up behind it."""
    try:
        await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(functools.partial(_abandon, session))
        raise
    chan, _ = opening.result()
    chan.write_eof()  # stdin is closed: a command that reads it sees EOF at once


async def open_channel(ssh: asyncssh.SSHClientConnection, session: Session, command: str) -> None:
    """Open a session channel for ``command`` and close its stdin.

    The open runs in its own task: if our caller is cancelled (its timeout)
    halfway, asyncssh would otherwise leave a channel open on the server with
    nobody reading it. The task finishes and then stops or releases the session.
    """
    opening = asyncio.ensure_future(create_session(ssh, lambda: session, command))
    await finish_opening(opening, session)


def _abandon(session: Session, opening: asyncio.Future[object]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        session.release()
    else:
        session.stop()  # its connection_lost releases the slot
