"""The connections to one host alias: at most ``max_connections``, each carrying at most
``max_channels_per_connection`` channels, one connect in flight, callers beyond capacity wait.

A refused channel open is retried on another connection; a connection with room and
few calls keeps a spare channel ready (``spare``). Every connect takes a slot of the
fleet's total and one of its handshakes in flight, and an idle connection may be closed
by the fleet (``fleet``). Reference: docs/operations.md "SSH".

Jump hosts (``via``, docs/operations.md "Bastions"): a host's pool opens each connection
as a ``direct-tcpip`` channel on a connection of its jump host's own pool (``tunnel``),
dialled with that host's pins and keys; never asyncssh's string form of ``tunnel=``,
which would fall back to ~/.ssh and the agent. A tunnel is not a session channel: it is
counted apart (``Conn.tunnels``, at most MAX_TUNNELS_PER_CONNECTION), and keeps the jump
host's connection from being closed as idle.

Unclosed channels: a call ends at its EOF and exit status and closes its channel; its
slot waits for the host's close (``session``). A host that leaves MAX_UNCLOSED_CHANNELS
of them open on one connection has that connection retired: no call is put on it any
more, a fresh one takes its place, and it is closed (``unclosed``) once the calls on it
have their answers. The host fails alone: its pool never runs out of slots.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import select
import time
from dataclasses import dataclass, field
from typing import Final

import asyncssh

from sshadapter.config import HostSection
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import FANOUT_HOST
from sshadapter.runners.ssh import exec_gate
from sshadapter.runners.ssh.dial import certificate_label, dial, lists_host
from sshadapter.runners.ssh.limits import Fleet
from sshadapter.runners.ssh.session import Session, open_channel
from sshadapter.runners.ssh.spare import SPARE_MAX_BUSY, Spare, exec_on_spare
from sshadapter.runners.ssh.translate import DETAIL_MAX_CHARS, again, translate

log = logging.getLogger(__name__)

# Bounds, each with its reason.
CHANNEL_OPEN_ATTEMPTS: Final = 3  # sshd frees sessions late; more tries only delay the failure
CHANNEL_OPEN_BACKOFF_SECONDS: Final = 0.05  # doubled per try: 50 ms, 100 ms between tries
CONNECT_COOLDOWN_SECONDS: Final = 1.0  # after a failed connect, wait for open ones, not MaxStartups
CLOSE_TIMEOUT_SECONDS: Final = 5.0  # close() waits this long for connections to shut down
# Target connections carried by one jump host connection. sshd's MaxSessions does not count
# direct-tcpip channels (its channel table allows 16k); this bound keeps one lost jump
# connection from taking more than this many target connections with it, and spreads
# the traffic over up to max_connections of the jump host's connections.
MAX_TUNNELS_PER_CONNECTION: Final = 64
# Channels a host may leave open (no CHANNEL_CLOSE within session.UNCLOSED_AFTER_SECONDS of
# ours) on one connection before it is retired. Each may still hold one of sshd's
# MaxSessions (10) sessions, and our cap takes up to 9 of them: past a few, opens on it
# would be refused. A host that closes late once in a while keeps its connection.
MAX_UNCLOSED_CHANNELS: Final = 3


@dataclass(eq=False)
class Conn:
    """One pooled connection and the number of channels it carries now (its spare included)."""

    ssh: asyncssh.SSHClientConnection
    channels: int = 0
    spare: Spare | None = None
    last_used: float = field(default_factory=time.monotonic)
    """When a call last took or gave back a channel (monotonic): for idle and LRU close."""
    tunnels: int = 0
    """Connections of other hosts carried on this one (it is their jump host)."""
    via: tuple[Pool, Conn] | None = None
    """The jump host's pool and connection this one is tunnelled through."""
    unclosed: int = 0
    """Channels the host left open after our close (session.UNCLOSED_AFTER_SECONDS)."""
    retired: bool = False
    """Past MAX_UNCLOSED_CHANNELS: takes no call or tunnel; closed once ``busy`` is 0."""

    @property
    def busy(self) -> int:
        """Channels of calls (its spare's slot aside) and tunnels it carries: 0 is idle."""
        return self.channels - (self.spare is not None) + self.tunnels

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

    def __init__(self, alias: str, section: HostSection, fleet: Fleet) -> None:
        self.alias = alias
        self._section = section
        self._fleet = fleet
        self._conns: list[Conn] = []
        self._connecting: asyncio.Task[Conn | UpstreamError] | None = None
        self._awaiting_room = False  # one caller waits for a slot of the fleet's total
        self._failed_at = float("-inf")
        self._changed = asyncio.Event()
        self._closed = False
        self.spares_used = 0
        """Calls that found a spare channel ready: only their exec request went out."""
        self.spares_off = False
        """Set once this host's sshd refused a spare (MaxSessions below our channel cap)."""
        self.via: Pool | None = None
        """The jump host's pool when the host is reached through one (``via``)."""
        self.carries = False
        """Whether some host is reached through this one (it is a jump host)."""

    def __repr__(self) -> str:
        return f"Pool({self.alias!r}, connections={len(self._conns)})"

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    @property
    def tunnels(self) -> int:
        """Host connections carried on this pool's connections now (it is a jump host)."""
        return sum(c.tunnels for c in self._conns)

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
            session.on_unclosed = functools.partial(self._unclosed, conn)
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
                if self._fleet.reserve(evict=True):
                    self._connecting = asyncio.create_task(self._connect())
                elif not self._awaiting_room:  # at the total cap, nothing idle: wait
                    await self._await_room()
                    continue
            if conn is None and self._connecting is None:
                conn = self._pick(exclude=None)  # the avoided connection is all there is
            if conn is not None:
                conn.last_used = time.monotonic()
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

    async def tunnel(self) -> Conn:
        """A connection of this (jump) host to carry one more target connection, opened if
        none has room; give it back with ``untunnel``. Raises like acquire()."""
        while True:
            if self._closed:
                raise UpstreamError("pool_closed", retryable=False, ran=False)
            room = [
                c
                for c in self._conns
                if c.tunnels < MAX_TUNNELS_PER_CONNECTION
                and not c.ssh.is_closed()
                and not c.retired
            ]
            if room:
                conn = min(room, key=lambda c: c.tunnels)
                conn.tunnels += 1
                conn.last_used = time.monotonic()
                return conn
            if self._connecting is None and self._may_connect():
                if self._fleet.reserve(evict=True):
                    self._connecting = asyncio.create_task(self._connect())
                elif not self._awaiting_room:
                    await self._await_room()
                    continue
            if self._connecting is not None:
                task = self._connecting
                await asyncio.wait([task])  # as in acquire: a shared connect is not ours
                outcome = None if task.cancelled() else task.result()
                if isinstance(outcome, UpstreamError):
                    raise again(outcome) from outcome.__cause__
                continue
            changed = self._changed
            await changed.wait()

    def untunnel(self, conn: Conn) -> None:
        """A target connection carried on ``conn`` closed (or never opened)."""
        conn.tunnels -= 1
        conn.last_used = time.monotonic()
        self._settle(conn)

    async def warm(self, *, evict: bool = False) -> None:
        """Open one connection ahead of the first call, unless one is open. At the fleet's
        cap, ``evict`` closes the least recently used idle connection, or waits for room
        (a fan-out's host: waiting here is not inside its operation's timeout); a start-up
        warm closes no other host's connection and gives up. Raises like acquire()."""
        while True:
            if self._closed:
                raise UpstreamError("pool_closed", retryable=False, ran=False)
            if self._conns:
                return
            if self._connecting is None:
                if self._fleet.reserve(evict=evict):
                    self._connecting = asyncio.create_task(self._connect())
                elif not evict:
                    log.warning("host %s not warmed: max_connections_total are open", self.alias)
                    return
                elif not self._awaiting_room:
                    await self._await_room()
                    continue
                else:
                    changed = self._changed
                    await changed.wait()
                    continue
            task = self._connecting
            await asyncio.wait([task])  # as in acquire: a shared connect is not ours to cancel
            outcome = None if task.cancelled() else task.result()
            if isinstance(outcome, UpstreamError) and not self._conns:
                raise again(outcome) from outcome.__cause__
            return

    def release(self, conn: Conn) -> None:
        conn.channels -= 1
        conn.last_used = time.monotonic()
        self._settle(conn)

    def _settle(self, conn: Conn) -> None:
        """A channel or tunnel of ``conn`` gone: an idle connection is offered to the
        fleet, a retired one closed."""
        if conn.busy == 0:
            if conn.retired and conn in self._conns:
                self._drop(conn, "unclosed")
            else:
                self._fleet.notify()  # idle now: a pool waiting at the total cap may close it
        self._notify()

    def _unclosed(self, conn: Conn) -> None:
        """The host left one of ``conn``'s channels open after our close (its slot is
        released next); at MAX_UNCLOSED_CHANNELS the connection is retired."""
        conn.unclosed += 1
        if conn.unclosed == MAX_UNCLOSED_CHANNELS:
            conn.retired = True
            log.warning(
                "host %s left %d channels open after their commands ended: connection "
                "retired, calls go to a fresh one",
                self.alias,
                conn.unclosed,
            )

    def oldest_idle(self) -> float | None:
        """When this pool's least recently used idle connection was last used (fleet LRU)."""
        return min((c.last_used for c in self._conns if c.busy == 0), default=None)

    def close_oldest_idle(self, reason: str) -> None:
        idle = [c for c in self._conns if c.busy == 0]
        if idle:
            self._drop(min(idle, key=lambda c: c.last_used), reason)

    def close_idle(self, before: float) -> None:
        for conn in [c for c in self._conns if c.busy == 0 and c.last_used < before]:
            self._drop(conn, "idle")

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None:
            self._connecting.cancel()
            await asyncio.wait([self._connecting])
        conns, self._conns = self._conns, []
        for conn in conns:
            self._fleet.gone()
            self._unlink(conn)
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
        room = [
            c
            for c in self._conns
            if c is not exclude and not c.retired and (c.channels < cap or c.spare_ready)
        ]
        return min(room, key=lambda c: (not c.spare_ready, c.channels), default=None)

    def _refill(self, conn: Conn, *, reserved: bool) -> None:
        """Open a spare channel on ``conn`` ahead of the next call, if there is room for one.

        ``reserved``: a slot is already counted for it. A spare holds a slot of the
        connection's channel cap, so it never takes sshd past MaxSessions.
        """
        room = reserved or conn.channels < self._section.max_channels_per_connection
        busy = conn.channels - reserved > SPARE_MAX_BUSY  # calls on it now, the spare's slot aside
        off = not exec_gate.SPARES or self.spares_off or self._closed or conn.retired
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
        """Below max_connections, a retired connection still closing aside (it takes no
        call), and not cooling down after a failed connect."""
        if sum(not c.retired for c in self._conns) >= self._section.max_connections:
            return False
        cooling = time.monotonic() - self._failed_at < CONNECT_COOLDOWN_SECONDS
        return not (self._conns and cooling)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget(self, ssh: asyncssh.SSHClientConnection) -> None:
        """Drop a closed or lost connection; it is replaced on demand."""
        gone = [c for c in self._conns if c.ssh is ssh]
        if gone:
            self._conns = [c for c in self._conns if c.ssh is not ssh]
            self._fleet.gone()
            for conn in gone:
                self._unlink(conn)
        self._notify()

    def _lost(self, ssh: asyncssh.SSHClientConnection) -> None:
        """A connection closed by the host, the network or us (asyncssh's connection_lost);
        one of a jump host that we had not closed ourselves is counted."""
        if self.carries and any(c.ssh is ssh for c in self._conns):
            self._fleet.jump_lost(self.alias)
        self._forget(ssh)

    @staticmethod
    def _unlink(conn: Conn) -> None:
        """A tunnelled connection gone: its jump host's connection carries one fewer."""
        if conn.via is not None:
            pool, carrier = conn.via
            conn.via = None
            pool.untunnel(carrier)

    def _drop(self, conn: Conn, reason: str) -> None:
        """Close an idle connection (idle for too long, the LRU one at the total cap, or
        retired for its unclosed channels)."""
        log.info("ssh connection to host %s closed: %s", self.alias, reason)
        if conn.spare is not None:
            conn.spare.abandon()
        self._forget(conn.ssh)
        conn.ssh.close()
        self._fleet.closed(reason)

    async def _await_room(self) -> None:
        """Wait for a slot of the fleet's total, within the caller's own timeout; one caller
        per pool waits there, the others wait for this pool to change."""
        self._awaiting_room = True
        try:
            await self._fleet.wait_for_room(self._changed)
        finally:
            self._awaiting_room = False
            self._notify()  # if this caller gave up, another takes its place

    async def _connect(self) -> Conn | UpstreamError:
        """The single connect in flight, holding a reserved slot of the fleet's total:
        adds the connection or returns the translated error."""
        outcome: Conn | UpstreamError
        host_listed = False
        reserved = True
        carrier: Conn | None = None
        try:
            keys = self._fleet.files.keys(self._section)
            known_hosts = self._fleet.files.known_hosts(self._section.known_hosts)
            host_listed = lists_host(known_hosts, self._section)
            if self.via is not None:  # before our handshake slot: the jump host needs one
                async with asyncio.timeout(self._section.connect_timeout_seconds):
                    carrier = await self.via.tunnel()
            async with self._fleet.handshake():
                ssh = await dial(
                    self._section,
                    keys,
                    known_hosts,
                    self._lost,
                    tunnel=None if carrier is None else carrier.ssh,
                )
        except Exception as exc:  # every failure is translated; nothing escapes the task
            self._failed_at = time.monotonic()
            if carrier is not None and self.via is not None:
                self.via.untunnel(carrier)
            if isinstance(exc, UpstreamError):  # the jump host's own failure, as it was
                outcome = UpstreamError(
                    exc.reason,
                    retryable=exc.retryable,
                    ran=False,
                    detail=f"jump host {self.via.alias if self.via else '?'}: {exc.detail}"[
                        :DETAIL_MAX_CHARS
                    ],
                )
            else:
                outcome = translate(
                    exc,
                    ran=False,
                    connecting=True,
                    host_listed=host_listed,
                    certificate=certificate_label(self._section) is not None,
                )
            outcome.__cause__ = exc
            log.log(
                logging.DEBUG if FANOUT_HOST.get() else logging.WARNING,
                "ssh connect to host %s failed: %s (%s)",
                self.alias,
                outcome.reason,
                outcome.detail,
            )
            self._fleet.connect_failed(self.alias, outcome.reason)
        else:
            outcome = Conn(ssh)
            if carrier is not None and self.via is not None:
                outcome.via = (self.via, carrier)
            self._conns.append(outcome)
            reserved = False
            self._fleet.established(self.alias)
            self._refill(outcome, reserved=False)
        finally:
            if reserved:  # failed or cancelled: the slot goes back
                self._fleet.unreserve()
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
