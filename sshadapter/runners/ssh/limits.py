"""What every host's pool of one runner shares: the ``[pool]`` bounds (docs/operations.md "SSH").

- **Handshakes in flight**, all hosts together, at most ``connect_concurrency``: a start-up
  that warms 1,000 hosts, or a fan-out over them, connects through this semaphore.
- **Total connections**, at most ``max_connections_total`` (connects in flight count): a
  pool that needs one more at the cap closes the least recently used idle connection of
  any host first (``lru``); when none is idle its caller waits, within its own timeout.
- **Idle close**: a connection that carried no call for ``idle_close_seconds`` is closed
  (``idle``); a spare channel waiting on it is not a call.
- ``files``: known_hosts files and client keys, parsed once for all pools (``file_cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

from sshadapter.config import PoolSection
from sshadapter.pacing import HANDSHAKE_STARTS, Pacer

if TYPE_CHECKING:  # the cache loads asyncssh; the metrics read CLOSE_REASONS without it
    from sshadapter.runners.ssh.file_cache import FileCache

log = logging.getLogger(__name__)

# Why the pool closes a connection itself (sshadapter_ssh_connections_closed_total{reason}):
# unclosed is a connection retired for the channels its host left open (``pool``).
CLOSE_REASONS: Final = ("idle", "lru", "unclosed")
# The idle sweep runs every quarter of idle_close_seconds within these bounds: a connection
# is closed at most 10 s late, and a tiny idle_close_seconds does not spin the loop.
IDLE_SWEEP_MAX_SECONDS: Final = 10.0
IDLE_SWEEP_MIN_SECONDS: Final = 0.05


class Member(Protocol):
    """A host's pool as the fleet sees it."""

    def oldest_idle(self) -> float | None:
        """When its least recently used idle connection was last used; None: none idle."""

    def close_oldest_idle(self, reason: str) -> None: ...

    def close_idle(self, before: float) -> None:
        """Close every idle connection last used before ``before`` (monotonic seconds)."""


class Fleet:
    """The bounds and parsed files shared by every pool of one runner, and their callbacks."""

    def __init__(
        self,
        limits: PoolSection,
        files: FileCache,
        *,
        on_connect_failure: Callable[[str, str], None] | None = None,
        on_connect: Callable[[str], None] | None = None,
        on_close: Callable[[str], None] | None = None,
        on_jump_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits
        self.files = files
        self.members: Sequence[Member] = ()
        self.connections = 0
        """Open connections of all pools."""
        self.reserved = 0
        """Connects in flight, each holding a slot of max_connections_total."""
        self.handshakes_in_flight = 0
        self._handshakes = asyncio.Semaphore(limits.connect_concurrency)
        self._handshake_starts = Pacer(HANDSHAKE_STARTS)
        self._changed = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self._on_connect_failure = on_connect_failure
        self._on_connect = on_connect
        self._on_close = on_close
        self._on_jump_lost = on_jump_lost

    def reserve(self, *, evict: bool) -> bool:
        """A slot for one more connection; at the cap, ``evict`` closes the LRU idle one."""
        if self.connections + self.reserved >= self.limits.max_connections_total:
            victim = min(
                ((since, m) for m in self.members if (since := m.oldest_idle()) is not None),
                key=lambda pair: pair[0],
                default=None,
            )
            if not evict or victim is None:
                return False
            victim[1].close_oldest_idle("lru")
        self.reserved += 1
        return True

    def unreserve(self) -> None:
        """A connect that failed or was cancelled gives its slot back."""
        self.reserved -= 1
        self.notify()

    def established(self, alias: str) -> None:
        """A reserved connect succeeded: its slot is the connection's now."""
        self.reserved -= 1
        self.connections += 1
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.create_task(self._sweep())
        self._call(self._on_connect, alias)

    def gone(self) -> None:
        """A connection closed (by us, by the host, or lost)."""
        self.connections -= 1
        self.notify()

    def closed(self, reason: str) -> None:
        """The pool closed a connection itself, for ``reason`` (one of CLOSE_REASONS)."""
        self._call(self._on_close, reason)

    def connect_failed(self, alias: str, reason: str) -> None:
        self._call(self._on_connect_failure, alias, reason)

    def jump_lost(self, alias: str) -> None:
        """A connection of jump host ``alias`` closed without us closing it: the host
        connections it carried are gone with it."""
        log.warning("connection to jump host %s lost", alias)
        self._call(self._on_jump_lost, alias)

    def notify(self) -> None:
        """A slot freed or a connection went idle: waiters at the cap look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_room(self, also: asyncio.Event) -> None:
        """Until a slot may be free (or ``also`` is set: the waiter's own pool changed)."""
        waits = [asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(also.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    @contextlib.asynccontextmanager
    async def handshake(self) -> AsyncIterator[None]:
        """One of ``connect_concurrency`` handshakes in flight, begun at the rate the loop's
        lag allows (sshadapter/pacing.py): the count is a ceiling, the rate the bound."""
        async with self._handshakes:
            await self._handshake_starts.start()
            self.handshakes_in_flight += 1
            try:
                yield
            finally:
                self.handshakes_in_flight -= 1

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)

    async def _sweep(self) -> None:
        """Close idle connections, while there are connections at all."""
        idle = self.limits.idle_close_seconds
        interval = min(max(idle / 4, IDLE_SWEEP_MIN_SECONDS), IDLE_SWEEP_MAX_SECONDS)
        while self.connections:
            await asyncio.sleep(interval)
            before = time.monotonic() - idle
            for member in self.members:
                member.close_idle(before)

    def _call(self, callback: Callable[..., None] | None, *args: str) -> None:
        if callback is None:
            return
        try:
            callback(*args)
        except Exception:  # a metrics or monitor bug must not break the calls waiting here
            log.exception("ssh pool callback failed")
