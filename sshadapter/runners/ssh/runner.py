"""The production runner: operator-defined commands over pooled asyncssh connections.

Reference: docs/protocol.md "Stages" (5) and docs/operations.md "SSH". Each command runs on
its own session channel with no PTY, no environment, stdin closed at once, and
stdout/stderr capped as each packet arrives: past a cap the remote command is
killed, the channel closed, and the result carries ``cap + 1`` bytes (proof
that the cap was exceeded) and no exit status.

Security (docs/operations.md "Hosts"): host keys are checked strictly against
the host's ``known_hosts`` file and nothing else; there is no switch to turn
that off. Client keys come from ``client_keys`` files or a systemd credential;
no agent, no agent or X11 forwarding, no ``~/.ssh/config``, public key
authentication only. Key material never appears in logs, errors or reprs.

Pooling, per host alias: at most ``max_connections`` connections, each with at
most ``max_channels_per_connection`` channels (below sshd's ``MaxSessions 10``,
which frees sessions late). A connection is opened only when every open one is
full, and at most one connect is in flight per host (sshd's ``MaxStartups``
drops bursts of new connections). Callers beyond capacity wait.

Errors: every asyncssh and OS exception becomes an ``UpstreamError`` in
``_translate`` and nowhere else (CONTRIBUTING.md: errors by blame, mapped in one place).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import os
import select
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncssh
from asyncssh import packet as asyncssh_packet

from sshadapter.bounded_read import read_bounded
from sshadapter.config import HostSection
from sshadapter.errors import ConfigError, UpstreamError
from sshadapter.runners.interface import RunResult

log = logging.getLogger(__name__)

# Bounds, each with its reason.
MAX_PACKET_BYTES: Final = 32 * 1024  # one data packet: all we ever hold beyond a cap
CHANNEL_OPEN_ATTEMPTS: Final = 3  # sshd frees sessions late; more tries only delay the failure
CHANNEL_OPEN_BACKOFF_SECONDS: Final = 0.05  # doubled per try: 50 ms, 100 ms between tries
CONNECT_COOLDOWN_SECONDS: Final = 1.0  # after a failed connect, wait for open ones, not MaxStartups
KEEPALIVE_COUNT_MAX: Final = 3  # unanswered keepalives before a connection is declared dead
CLOSE_TIMEOUT_SECONDS: Final = 5.0  # close() waits this long for connections to shut down
DETAIL_MAX_CHARS: Final = 200  # an audit detail is a hint, not a transcript
ABORT_SIGNAL: Final = "KILL"  # sshd keeps a closed session (a MaxSessions slot) until it exits
# AES-GCM first (measured: ~0.55 ms less CPU per call than chacha20 with AES-NI); the
# OpenSSH-style "^" prefix keeps asyncssh's default list after them.
CIPHERS: Final = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
DEFAULT_SSH_PORT: Final = 22  # known_hosts entries for port 22 carry no "[host]:port"
# Read on the event loop at every connect (sshadapter/bounded_read.py): ~100 bytes a line,
# so tens of thousands of hosts; a larger file is not a known_hosts file.
MAX_KNOWN_HOSTS_BYTES: Final = 4 * 1024 * 1024
# An OpenSSH private key, even RSA 16384 with a certificate, is under 16 KiB.
MAX_PRIVATE_KEY_BYTES: Final = 64 * 1024


class _KeyLoadError(Exception):
    """A client key or credential cannot be read or parsed. Carries no key material."""


class _KnownHostsError(Exception):
    """The host's known_hosts file cannot be read or parsed."""


class SshRunner:
    """Runs commands on configured hosts over pooled SSH connections (the Runner protocol).

    Client keys are read once, at the first connection to each host, without a
    passphrase: a passphrase-protected key is not supported (the daemon has no
    safe place to keep the passphrase; use a systemd credential instead).
    """

    def __init__(
        self,
        hosts: Mapping[str, HostSection],
        *,
        credentials_dir: Path | None = None,
        on_connect_failure: Callable[[str, str], None] | None = None,
    ) -> None:
        """``on_connect_failure(alias, reason)`` is called once per failed connect (a metric)."""
        if credentials_dir is None and os.environ.get("CREDENTIALS_DIRECTORY"):
            credentials_dir = Path(os.environ["CREDENTIALS_DIRECTORY"])
        self._pools = {
            alias: _Pool(alias, section, credentials_dir, on_connect_failure)
            for alias, section in hosts.items()
        }
        self._closed = False

    def __repr__(self) -> str:
        return f"SshRunner(hosts={sorted(self._pools)!r})"

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        """Run ``command`` on ``host``; the timeout covers waiting, connecting and running."""
        if not command:
            raise ValueError("an empty command would open a login shell")  # a bug, not input
        pool = self._pool(host)
        started = time.monotonic()
        attempts: list[_Session] = []  # one per channel open: did any get as far as running?
        session: _Session | None = None
        try:
            async with asyncio.timeout(timeout):
                session = await pool.open_session(command, max_stdout, max_stderr, attempts)
                await session.finished
            if self._closed and session.exit_status is None and not session.over_cap:
                raise UpstreamError("pool_closed", retryable=False, ran=True)
            if session.error is not None:
                raise _translate(session.error, ran=True) from session.error
            return RunResult(
                stdout=bytes(session.stdout),
                stderr=bytes(session.stderr),
                exit_status=session.result_status(),
                duration_seconds=time.monotonic() - started,
            )
        except TimeoutError as exc:
            raise _translate(exc, ran=any(s.channel_opened for s in attempts)) from exc
        finally:
            if session is not None:
                session.stop()  # a no-op once the channel has closed by itself

    async def warm(self, host: str) -> None:
        """Open one connection to ``host`` ahead of the first call; raises like run()."""
        pool = self._pool(host)
        if pool.open_connections:
            return
        conn, reserved = await pool.acquire(avoid=None)
        if reserved:
            pool.release(conn)

    async def close(self) -> None:
        """Close every connection; later calls raise UpstreamError("pool_closed")."""
        self._closed = True
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))

    def connections(self) -> dict[str, int]:
        """Open connections per host alias, for the ``sshadapter_ssh_connections`` gauge."""
        return {alias: pool.open_connections for alias, pool in self._pools.items()}

    def _pool(self, host: str) -> _Pool:
        if self._closed:
            raise UpstreamError("pool_closed", retryable=False, ran=False)
        try:
            return self._pools[host]
        except KeyError:
            # The command loader checks every alias against the config: this is a bug.
            raise ValueError(f"unknown host alias {host!r}") from None


@dataclass(eq=False)
class _Conn:
    """One pooled connection and the number of channels it carries now (its spare included)."""

    ssh: asyncssh.SSHClientConnection
    channels: int = 0
    spare: _Spare | None = None

    @property
    def spare_ready(self) -> bool:
        return self.spare is not None and self.spare.ready

    def take_spare(self) -> _Spare | None:
        """The ready spare, now the caller's (its slot with it); None if there is none."""
        spare = self.spare if self.spare_ready else None
        if spare is not None:
            self.spare = None
            spare.taken = True
        return spare


class _Pool:
    """The connections to one host alias."""

    def __init__(
        self,
        alias: str,
        section: HostSection,
        credentials_dir: Path | None,
        on_connect_failure: Callable[[str, str], None] | None,
    ) -> None:
        self.alias = alias
        self._section = section
        self._credentials_dir = credentials_dir
        self._on_connect_failure = on_connect_failure
        self._keys: list[asyncssh.SSHKey] | None = None  # loaded at the first connect
        self._conns: list[_Conn] = []
        self._connecting: asyncio.Task[_Conn | UpstreamError] | None = None
        self._failed_at = float("-inf")
        self._changed = asyncio.Event()
        self._closed = False
        self.spares_used = 0
        """Calls that found a spare channel ready: only their exec request went out."""
        self.spares_off = False
        """Set once this host's sshd refused a spare (MaxSessions below our channel cap)."""

    def __repr__(self) -> str:
        return f"_Pool({self.alias!r}, connections={len(self._conns)})"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def open_session(
        self, command: str, max_stdout: int, max_stderr: int, attempts: list[_Session]
    ) -> _Session:
        """Open a channel running ``command``, retrying refused opens on another connection.

        Each attempt's session is appended to ``attempts`` so that a caller whose
        timeout fires halfway knows whether the exec request may have gone out.
        """
        avoid: _Conn | None = None
        attempt = 1
        while True:
            conn, reserved = await self.acquire(avoid)
            spare = conn.take_spare()
            # A connection the server dropped while idle may not be seen closed yet: then
            # the call opens its own channel, whose refusal is retried elsewhere.
            if spare is not None and (not spare.usable or _peer_hung_up(conn.ssh)):
                spare.abandon()
                self.release(conn)  # the dead spare's slot; ours, if reserved, stays
                spare = None
                if not reserved:
                    continue
            release = functools.partial(self.release, conn)
            if spare is not None:  # only the exec request is left to send
                session = spare.claim(command, max_stdout, max_stderr, release)
            else:
                session = _Session(max_stdout, max_stderr, release)
            attempts.append(session)
            try:
                if spare is not None:
                    self.spares_used += 1
                    self._refill(conn, reserved=reserved)  # the reserved slot is the next spare's
                    await _exec_on_spare(spare, session)
                else:
                    await _open_channel(conn.ssh, session, command)
                    self._refill(conn, reserved=False)
                return session
            except asyncssh.ChannelOpenError as exc:  # nothing ran: refused, or a stale connection
                session.release()
                if conn.spare is not None:  # its session may be the one sshd has no room for
                    self.spares_off = True
                    conn.spare.abandon()
                if conn.ssh.is_closed():
                    self._forget(conn.ssh)
                if attempt >= CHANNEL_OPEN_ATTEMPTS:
                    raise _translate(exc, ran=False) from exc
                await asyncio.sleep(CHANNEL_OPEN_BACKOFF_SECONDS * 2 ** (attempt - 1))
                avoid, attempt = conn, attempt + 1
            except (asyncssh.Error, OSError) as exc:  # lost while the exec request was pending
                session.release()
                raise _translate(exc, ran=True) from exc

    async def acquire(self, avoid: _Conn | None) -> tuple[_Conn, bool]:
        """A connection to run on, preferring one other than ``avoid``, and whether a channel
        slot was reserved on it (False: it has no room, but a ready spare to hand over)."""
        while True:
            if self._closed:
                raise UpstreamError("pool_closed", retryable=False, ran=False)
            conn = self._pick(exclude=avoid)
            if conn is None and self._connecting is None and self._may_connect():
                self._connecting = asyncio.create_task(self._connect())
            if conn is None and self._connecting is None:
                conn = self._pick(exclude=None)  # the avoided connection is all there is
            if conn is not None:
                if conn.channels < self._section.max_channels_per_connection:
                    conn.channels += 1
                    return conn, True
                return conn, False
            if self._connecting is not None:
                task = self._connecting
                # wait(), not the task itself: our timeout must not cancel a shared connect.
                await asyncio.wait([task])
                outcome = None if task.cancelled() else task.result()
                if isinstance(outcome, UpstreamError) and not self._conns:
                    raise _again(outcome) from outcome.__cause__
                continue
            changed = self._changed
            await changed.wait()

    def release(self, conn: _Conn) -> None:
        conn.channels -= 1
        self._notify()

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.wait([self._connecting])
        conns, self._conns = self._conns, []
        for conn in conns:
            if conn.spare is not None:
                conn.spare.abandon()
            conn.ssh.close()
        if conns:
            await asyncio.wait(
                [asyncio.ensure_future(conn.ssh.wait_closed()) for conn in conns],
                timeout=CLOSE_TIMEOUT_SECONDS,
            )
        self._notify()

    def _pick(self, exclude: _Conn | None) -> _Conn | None:
        """The least busy connection with room or a ready spare; a ready spare first."""
        cap = self._section.max_channels_per_connection
        room = [c for c in self._conns if c is not exclude and (c.channels < cap or c.spare_ready)]
        return min(room, key=lambda c: (not c.spare_ready, c.channels), default=None)

    def _refill(self, conn: _Conn, *, reserved: bool) -> None:
        """Open a spare channel on ``conn`` ahead of the next call, if there is room for one.

        ``reserved``: a slot is already counted for it. A spare holds a slot of the
        connection's channel cap, so it never takes sshd past MaxSessions.
        """
        room = reserved or conn.channels < self._section.max_channels_per_connection
        busy = conn.channels - reserved > SPARE_MAX_BUSY  # calls on it now, the spare's slot aside
        off = not SPARES or self.spares_off or self._closed
        if off or busy or conn.spare is not None or conn.ssh.is_closed() or not room:
            if reserved:
                self.release(conn)
            return
        if not reserved:
            conn.channels += 1
        conn.spare = _Spare(functools.partial(self._spare_gone, conn))
        conn.spare.open(conn.ssh)

    def _spare_gone(self, conn: _Conn, spare: _Spare, refused: bool) -> None:
        """A spare that closed or failed before a call took it: its slot is free again.

        ``refused``: sshd refused its channel, so it allows fewer sessions per connection
        than our cap: spares stop for this host, every call opens its own channel.
        """
        if conn.spare is spare:
            conn.spare = None
        if refused and not self.spares_off:
            self.spares_off = True
            log.warning(
                "host %s refused a spare session channel (sshd MaxSessions below "
                "max_channels_per_connection): calls open their own channels",
                self.alias,
            )
        self.release(conn)

    def _may_connect(self) -> bool:
        if len(self._conns) >= self._section.max_connections:
            return False
        cooling = time.monotonic() - self._failed_at < CONNECT_COOLDOWN_SECONDS
        return not (self._conns and cooling)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget(self, ssh: asyncssh.SSHClientConnection) -> None:
        """Drop a closed or lost connection; it is replaced on demand."""
        self._conns = [c for c in self._conns if c.ssh is not ssh]
        self._notify()

    async def _connect(self) -> _Conn | UpstreamError:
        """The single connect in flight: adds the connection or returns the translated error."""
        outcome: _Conn | UpstreamError
        host_listed = False
        try:
            if self._keys is None:
                self._keys = _load_keys(self._section, self._credentials_dir)
            known_hosts = _read_known_hosts(self._section.known_hosts)
            host_listed = _lists_host(known_hosts, self._section)
            ssh = await _dial(self._section, self._keys, known_hosts, self._forget)
        except Exception as exc:  # every failure is translated; nothing escapes the task
            self._failed_at = time.monotonic()
            outcome = _translate(exc, ran=False, connecting=True, host_listed=host_listed)
            outcome.__cause__ = exc
            log.warning(
                "ssh connect to host %s failed: %s (%s)", self.alias, outcome.reason, outcome.detail
            )
            if self._on_connect_failure is not None:
                try:
                    self._on_connect_failure(self.alias, outcome.reason)
                except Exception:  # a metrics bug must not break the calls waiting here
                    log.exception("on_connect_failure callback failed")
        else:
            outcome = _Conn(ssh)
            self._conns.append(outcome)
            self._refill(outcome, reserved=False)
        self._connecting = None
        self._notify()
        return outcome


class _Client(asyncssh.SSHClient):
    """Tells the pool when its connection closes; asyncssh's defaults refuse unknown host keys."""

    def __init__(self, on_lost: Callable[[asyncssh.SSHClientConnection], None]) -> None:
        self._on_lost = on_lost
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._on_lost(self._conn)


class _Session(asyncssh.SSHClientSession[bytes]):
    """One command's channel: output capped as each packet arrives, never buffered beyond."""

    def __init__(self, max_stdout: int, max_stderr: int, on_closed: Callable[[], None]) -> None:
        self.stdout = bytearray()
        self.stderr = bytearray()
        self.exit_status: int | None = None
        self.signalled = False
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

    def exit_signal_received(self, signal: str, core_dumped: bool, msg: str, lang: str) -> None:
        self.signalled = True

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        if exc is not None and not self.finished.done():
            self.error = exc
        self._finish()
        self.release()

    def result_status(self) -> int | None:
        """The exit status, or None when killed, cut at a cap, or closed without one."""
        return None if self.over_cap or self.signalled else self.exit_status

    def stop(self) -> None:
        """Kill the remote command and close the channel; a no-op once closed or stopping."""
        if self._chan is None or self._closed or self._stopping:
            return
        self._stopping = True
        with contextlib.suppress(OSError):  # already closing: close() is all that is left
            self._chan.send_signal(ABORT_SIGNAL)
        self._chan.close()

    def release(self) -> None:
        """Give the channel slot back to the pool, exactly once."""
        if not self._released:
            self._released = True
            self._on_closed()

    def _finish(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)


# A spare channel: the exec request is held back by a gate until a call hands over its
# command. The gate replaces the channel instance's ``_make_request``, asyncssh's one
# private method this relies on (same signature since asyncssh 2.0; tests hold it). If
# it ever goes, SPARES is False and every call opens its own channel, as before.
SPARES: Final = hasattr(asyncssh.SSHClientChannel, "_make_request") and hasattr(
    asyncssh_packet, "String"
)
SPARE_PLACEHOLDER: Final = ":"  # never sent: the gate swaps in the call's command
# A spare is opened only on a connection running at most this many calls: there it takes
# the open's round trip off the next call's path; on a busy connection the open overlaps
# other calls anyway, and a spare is only more work (measured: -0.1 ms p50 at c=1, +0.03 ms
# of CPU per call at c=32 when every connection kept one).
SPARE_MAX_BUSY: Final = 1


class _Spare:
    """A session channel opened ahead of need: a call binds its session and sends the exec.

    asyncssh's ``create_session`` opens the channel, takes ``session`` as its session,
    then sends the exec request: the gate ``_hold`` installs on the channel holds that
    request until ``claim`` gives the real command. The session is the very object the
    call then reads from (``_Session.bind``), so no callback goes through a proxy.
    Nothing runs on the host before the claim.
    """

    def __init__(self, on_gone: Callable[[_Spare, bool], None]) -> None:
        self.ready = False
        self.taken = False
        """Handed to a call: its slot is the call's to release from now on."""
        self.claimed = False
        # Placeholder caps until a call binds its own; before that no data can arrive.
        self.session = _Session(0, 0, self._lost)
        self.session.on_channel = self._hold
        self.opening: asyncio.Future[tuple[Any, Any]] | None = None
        self._command: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None
        self._on_gone = on_gone
        self._gone = False

    def open(self, ssh: asyncssh.SSHClientConnection) -> None:
        session = self.session
        self.opening = asyncio.ensure_future(
            _create_session(ssh, lambda: session, SPARE_PLACEHOLDER)
        )
        self.opening.add_done_callback(self._opened_or_not)

    @property
    def usable(self) -> bool:
        """Still open and waiting for its command."""
        return self.ready and self._chan is not None and not self._gone

    def claim(
        self, command: str, max_stdout: int, max_stderr: int, on_closed: Callable[[], None]
    ) -> _Session:
        """From now on the channel is the call's, and its exec request goes out."""
        assert self.usable  # the caller checked, with no await since
        self.ready, self.claimed = False, True
        self.session.bind(max_stdout, max_stderr, on_closed)
        self._command.set_result(command)
        return self.session

    def abandon(self) -> None:
        """Give the spare up unused: its channel closes (sshd's session with it)."""
        if not self.claimed:
            if self._chan is not None:
                self._chan.close()
            if self.opening is not None:
                self.opening.cancel()

    def _hold(self, chan: asyncssh.SSHClientChannel[bytes]) -> None:
        self._chan = chan
        if not SPARES:  # pragma: no cover - an asyncssh without the gate's method
            chan.close()  # the exec request then fails: nothing is ever sent
            return
        original = chan._make_request
        command = self._command

        async def gated(request: bytes, *args: bytes) -> bool | None:
            if request == b"exec":
                args = (asyncssh_packet.String(await command),)
            return await original(request, *args)

        chan._make_request = gated  # type: ignore[method-assign]
        self.ready = True

    def _opened_or_not(self, opening: asyncio.Future[tuple[Any, Any]]) -> None:
        if not self.claimed and (opening.cancelled() or opening.exception() is not None):
            refused = not opening.cancelled() and isinstance(
                opening.exception(), asyncssh.ChannelOpenError
            )
            self._lost(refused)  # refused (MaxSessions), or gone before a claim

    def _lost(self, refused: bool = False) -> None:
        """Before a claim: the channel closed or never opened."""
        self.ready = False
        if not self._command.done():
            self._command.cancel()
        if not self._gone:
            self._gone = True
            if not self.taken:  # a taken spare's slot is its taker's to release
                self._on_gone(self, refused)


def _peer_hung_up(ssh: asyncssh.SSHClientConnection) -> bool:
    """Whether the connection's socket already holds a reset or an end of stream (no read)."""
    sock = ssh.get_extra_info("socket")
    fd = sock.fileno() if sock is not None else -1
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN | _POLLRDHUP)
    return any(events & _HUNG_UP for _, events in poller.poll(0))


_POLLRDHUP: Final = getattr(select, "POLLRDHUP", 0x2000)  # Linux
_HUNG_UP: Final = select.POLLERR | select.POLLHUP | _POLLRDHUP


async def _exec_on_spare(spare: _Spare, session: _Session) -> None:
    """Wait for the claimed spare's exec request and close its stdin (as _open_channel)."""
    assert spare.opening is not None
    await _finish_opening(spare.opening, session)


async def _create_session(
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


async def _finish_opening(opening: asyncio.Future[tuple[Any, Any]], session: _Session) -> None:
    """Wait for the exec request's answer; if our caller is cancelled, clean up behind it."""
    try:
        await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(functools.partial(_abandon, session))
        raise
    chan, _ = opening.result()
    chan.write_eof()  # stdin is closed: a command that reads it sees EOF at once


async def _open_channel(ssh: asyncssh.SSHClientConnection, session: _Session, command: str) -> None:
    """Open a session channel for ``command`` and close its stdin.

    The open runs in its own task: if our caller is cancelled (its timeout)
    halfway, asyncssh would otherwise leave a channel open on the server with
    nobody reading it. The task finishes and then stops or releases the session.
    """
    opening = asyncio.ensure_future(_create_session(ssh, lambda: session, command))
    await _finish_opening(opening, session)


def _abandon(session: _Session, opening: asyncio.Future[object]) -> None:
    if opening.cancelled() or opening.exception() is not None:
        session.release()
    else:
        session.stop()  # its connection_lost releases the slot


async def _dial(
    section: HostSection,
    keys: list[asyncssh.SSHKey],
    known_hosts: asyncssh.SSHKnownHosts,
    on_lost: Callable[[asyncssh.SSHClientConnection], None],
) -> asyncssh.SSHClientConnection:
    """One authenticated connection, with every client-side default that matters pinned."""
    return await asyncssh.connect(
        section.address,
        section.port,
        config=None,  # never read ~/.ssh/config
        client_factory=functools.partial(_Client, on_lost),
        username=section.user,
        known_hosts=known_hosts,  # strict: the file's keys only, never None
        x509_trusted_certs=None,  # no ~/.ssh/ca-bundle.crt
        client_keys=keys,
        agent_path=None,
        agent_forwarding=False,
        x11_forwarding=False,
        pkcs11_provider=None,
        preferred_auth="publickey",
        password_auth=False,
        kbdint_auth=False,
        host_based_auth=False,
        gss_auth=False,
        gss_kex=False,
        proxy_command=None,
        request_pty=False,
        env=None,
        send_env=None,
        encryption_algs=CIPHERS,
        connect_timeout=section.connect_timeout_seconds,
        login_timeout=section.connect_timeout_seconds,
        keepalive_interval=section.keepalive_seconds,
        keepalive_count_max=KEEPALIVE_COUNT_MAX,
    )


def _load_keys(section: HostSection, credentials_dir: Path | None) -> list[asyncssh.SSHKey]:
    """Client keys from files, then the systemd credential. No passphrase: see SshRunner."""
    keys: list[asyncssh.SSHKey] = []
    try:
        for path in section.client_keys:
            keys.append(asyncssh.import_private_key(read_bounded(path, MAX_PRIVATE_KEY_BYTES)))
        if section.credential:
            keys.append(
                asyncssh.import_private_key(_read_credential(section.credential, credentials_dir))
            )
    except ConfigError as exc:  # not a regular file, too large, unreadable
        raise _KeyLoadError(exc.reason) from None  # the reason alone: no path (see below)
    except (OSError, ValueError) as exc:  # asyncssh.KeyImportError is a ValueError
        # from None: a parser's context could quote the bytes it choked on.
        # No file name either: where the keys live is nobody's business but the operator's.
        raise _KeyLoadError(_describe(exc, with_path=False)) from None
    if not keys:
        raise _KeyLoadError("no client_keys and no credential configured")
    return keys


def _read_credential(name: str, credentials_dir: Path | None) -> bytes:
    if credentials_dir is None:
        raise ValueError("credential configured but $CREDENTIALS_DIRECTORY is not set")
    if "/" in name or name in {".", ".."}:
        raise ValueError("credential name must be a plain file name")
    return read_bounded(credentials_dir / name, MAX_PRIVATE_KEY_BYTES)


def _read_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    """Read on every connect, so an operator's edit applies to the next connection."""
    try:
        return asyncssh.import_known_hosts(read_bounded(path, MAX_KNOWN_HOSTS_BYTES).decode())
    except ConfigError as exc:  # not a regular file, too large, unreadable
        raise _KnownHostsError(str(exc)) from exc
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise _KnownHostsError(_describe(exc)) from exc


def _lists_host(known_hosts: asyncssh.SSHKnownHosts, section: HostSection) -> bool:
    """Whether known_hosts names this host at all: tells a changed key from an unknown host.

    Matched by name (and by address when ``address`` is one), like asyncssh;
    an entry only for the resolved IP of a host name is not seen here.
    """
    port = None if section.port == DEFAULT_SSH_PORT else section.port
    host_keys, ca_keys, *_ = known_hosts.match(section.address, "", port)
    return bool(host_keys or ca_keys)


def _translate(
    exc: BaseException, *, ran: bool, connecting: bool = False, host_listed: bool = False
) -> UpstreamError:
    """The one place asyncssh and OS exceptions become UpstreamError (errors.TRANSPORT_REASONS).

    ``ran``: the command may have started. ``connecting``: raised while opening
    a connection. ``host_listed``: known_hosts names the host, so a key it
    rejects has changed rather than being unknown.
    """
    detail = _describe(exc)

    def error(reason: str, *, retryable: bool, ran: bool = ran) -> UpstreamError:
        return UpstreamError(reason, retryable=retryable, ran=ran, detail=detail)

    if isinstance(exc, _KeyLoadError):
        return error("no_credentials", retryable=False, ran=False)
    if isinstance(exc, _KnownHostsError):
        return error("host_key_unknown", retryable=False, ran=False)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        reason = "host_key_mismatch" if host_listed else "host_key_unknown"
        return error(reason, retryable=False, ran=False)
    if isinstance(exc, asyncssh.KeyExchangeFailed) and host_listed and "host key" in str(exc):
        # known_hosts lists only key types the server no longer offers: a changed key too.
        return error("host_key_mismatch", retryable=False, ran=False)
    if isinstance(exc, asyncssh.PermissionDenied):
        return error("auth_failed", retryable=False, ran=False)
    if isinstance(exc, asyncssh.ChannelOpenError):
        return error("channel_open_failed", retryable=True, ran=False)
    if isinstance(exc, TimeoutError):
        return error("connect_timeout" if connecting else "command_timeout", retryable=True)
    # A name with several addresses all refusing raises a plain OSError("Multiple
    # exceptions: ...") without errno: that one ends up as connect_failed.
    if isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    ):
        return error("connect_refused", retryable=True, ran=False)
    if connecting:  # DNS, unreachable, a drop during the handshake, any other surprise
        return error("connect_failed", retryable=True, ran=False)
    return error("connection_lost", retryable=True)


def _again(error: UpstreamError) -> UpstreamError:
    """A fresh copy of a shared connect failure, so each waiter raises its own exception."""
    return UpstreamError(
        error.reason, retryable=error.retryable, ran=error.ran, detail=error.detail
    )


def _describe(exc: BaseException, *, with_path: bool = True) -> str:
    """Exception class and message for the audit trail; never key material (see _load_keys)."""
    if isinstance(exc, (_KeyLoadError, _KnownHostsError)):
        text = str(exc)  # already described where it was raised
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{type(exc).__name__}: {exc.strerror}"
        if exc.filename and with_path:
            text += f": {exc.filename}"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:DETAIL_MAX_CHARS]
