"""The connections to one host alias: at most ``max_connections``, each carrying at most
``max_channels_per_connection`` channels, one connect in flight, callers beyond capacity wait.

A refused channel open is retried on another connection; a connection with room and
few calls keeps a spare channel ready (``spare``). Reference: docs/operations.md "SSH".
"""

from __future__ import annotations

import asyncio
import functools
import logging
import select
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncssh

from sshadapter.config import HostSection
from sshadapter.errors import UpstreamError
from sshadapter.runners.ssh import exec_gate
from sshadapter.runners.ssh.dial import dial, lists_host, load_keys, read_known_hosts
from sshadapter.runners.ssh.session import Session, open_channel
from sshadapter.runners.ssh.spare import SPARE_MAX_BUSY, Spare, exec_on_spare
from sshadapter.runners.ssh.translate import again, translate

log = logging.getLogger(__name__)

# Bounds, each with its reason.
CHANNEL_OPEN_ATTEMPTS: Final = 3  # sshd frees sessions late; more tries only delay the failure
CHANNEL_OPEN_BACKOFF_SECONDS: Final = 0.05  # doubled per try: 50 ms, 100 ms between tries
CONNECT_COOLDOWN_SECONDS: Final = 1.0  # after a failed connect, wait for open ones, not MaxStartups
CLOSE_TIMEOUT_SECONDS: Final = 5.0  # close() waits this long for connections to shut down


@dataclass(eq=False)
class Conn:
    """One pooled connection and the number of channels it carries now (its spare included)."""

    ssh: asyncssh.SSHClientConnection
    channels: int = 0
    spare: Spare | None = None

    @property
    def spare_ready(self) -> bool:
        return self.spare is not None and self.spare.ready

    def take_spare(self) -> Spare | None:
        """The ready spare, now the caller's (its slot with it); None if there is none."""
        spare = self.spare if self.spare_ready else None
        if spare is not None:
            self.spare = None
            spare.taken = True
        return spare


class Pool:
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
        self._conns: list[Conn] = []
        self._connecting: asyncio.Task[Conn | UpstreamError] | None = None
        self._failed_at = float("-inf")
        self._changed = asyncio.Event()
        self._closed = False
        self.spares_used = 0
        """Calls that found a spare channel ready: only their exec request went out."""
        self.spares_off = False
        """Set once this host's sshd refused a spare (MaxSessions below our channel cap)."""

    def __repr__(self) -> str:
        return f"Pool({self.alias!r}, connections={len(self._conns)})"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    async def open_session(
        self, command: str, max_stdout: int, max_stderr: int, attempts: list[Session]
    ) -> Session:
        """Open a channel running ``command``, retrying refused opens on another connection.

        Each attempt's session is appended to ``attempts`` so that a caller whose
        timeout fires halfway knows whether the exec request may have gone out.
        """
        avoid: Conn | None = None
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
                session = Session(max_stdout, max_stderr, release)
            attempts.append(session)
            try:
                if spare is not None:
                    self.spares_used += 1
                    self._refill(conn, reserved=reserved)  # the reserved slot is the next spare's
                    await exec_on_spare(spare, session)
                else:
                    await open_channel(conn.ssh, session, command)
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
                    raise translate(exc, ran=False) from exc
                await asyncio.sleep(CHANNEL_OPEN_BACKOFF_SECONDS * 2 ** (attempt - 1))
                avoid, attempt = conn, attempt + 1
            except (asyncssh.Error, OSError) as exc:  # lost while the exec request was pending
                session.release()
                raise translate(exc, ran=True) from exc

    async def acquire(self, avoid: Conn | None) -> tuple[Conn, bool]:
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
                    raise again(outcome) from outcome.__cause__
                continue
            changed = self._changed
            await changed.wait()

    def release(self, conn: Conn) -> None:
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

    def _pick(self, exclude: Conn | None) -> Conn | None:
        """The least busy connection with room or a ready spare; a ready spare first."""
        cap = self._section.max_channels_per_connection
        room = [c for c in self._conns if c is not exclude and (c.channels < cap or c.spare_ready)]
        return min(room, key=lambda c: (not c.spare_ready, c.channels), default=None)

    def _refill(self, conn: Conn, *, reserved: bool) -> None:
        """Open a spare channel on ``conn`` ahead of the next call, if there is room for one.

        ``reserved``: a slot is already counted for it. A spare holds a slot of the
        connection's channel cap, so it never takes sshd past MaxSessions.
        """
        room = reserved or conn.channels < self._section.max_channels_per_connection
        busy = conn.channels - reserved > SPARE_MAX_BUSY  # calls on it now, the spare's slot aside
        off = not exec_gate.SPARES or self.spares_off or self._closed
        if off or busy or conn.spare is not None or conn.ssh.is_closed() or not room:
            if reserved:
                self.release(conn)
            return
        if not reserved:
            conn.channels += 1
        conn.spare = Spare(functools.partial(self._spare_gone, conn))
        conn.spare.open(conn.ssh)

    def _spare_gone(self, conn: Conn, spare: Spare, refused: bool) -> None:
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

    async def _connect(self) -> Conn | UpstreamError:
        """The single connect in flight: adds the connection or returns the translated error."""
        outcome: Conn | UpstreamError
        host_listed = False
        try:
            if self._keys is None:
                self._keys = load_keys(self._section, self._credentials_dir)
            known_hosts = read_known_hosts(self._section.known_hosts)
            host_listed = lists_host(known_hosts, self._section)
            ssh = await dial(self._section, self._keys, known_hosts, self._forget)
        except Exception as exc:  # every failure is translated; nothing escapes the task
            self._failed_at = time.monotonic()
            outcome = translate(exc, ran=False, connecting=True, host_listed=host_listed)
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
            outcome = Conn(ssh)
            self._conns.append(outcome)
            self._refill(outcome, reserved=False)
        self._connecting = None
        self._notify()
        return outcome


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
