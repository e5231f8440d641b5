"""Spare channels: a session channel opened ahead of need, so a call sends only its exec.

Opened only on a connection with room and at most ``SPARE_MAX_BUSY`` calls; sshd's
MaxSessions below our channel cap turns spares off for the host (``pool``). The exec
request is held back by ``exec_gate``, the one patch of a private asyncssh method.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Final

import asyncssh

from sshadapter.runners.ssh import exec_gate
from sshadapter.runners.ssh.session import Session, create_session, finish_opening

SPARE_PLACEHOLDER: Final = ":"  # never sent: the gate swaps in the call's command
# A spare is opened only on a connection running at most this many calls: there it takes
# the open's round trip off the next call's path; on a busy connection the open overlaps
# other calls anyway, and a spare is only more work (measured: -0.1 ms p50 at c=1, +0.03 ms
# of CPU per call at c=32 when every connection kept one).
SPARE_MAX_BUSY: Final = 1


class Spare:
    """A session channel opened ahead of need: a call binds its session and sends the exec.

    asyncssh's ``create_session`` opens the channel, takes ``session`` as its session,
    then sends the exec request: the gate ``_hold`` installs on the channel
    (``exec_gate.hold_exec``) holds that request until ``claim`` gives the real
    command. The session is the very object the call then reads from
    (``Session.bind``), so no callback goes through a proxy. Nothing runs on the host
    before the claim.
    """

    def __init__(self, on_gone: Callable[[Spare, bool], None]) -> None:
        self.ready = False
        self.taken = False
        """Handed to a call: its slot is the call's to release from now on."""
        self.claimed = False
        # Placeholder caps until a call binds its own; before that no data can arrive.
        self.session = Session(0, 0, self._lost)
        self.session.on_channel = self._hold
        self.opening: asyncio.Future[tuple[Any, Any]] | None = None
        self._command: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._chan: asyncssh.SSHClientChannel[bytes] | None = None
        self._on_gone = on_gone
        self._gone = False

    def open(self, ssh: asyncssh.SSHClientConnection) -> None:
        session = self.session
        self.opening = asyncio.ensure_future(
            create_session(ssh, lambda: session, SPARE_PLACEHOLDER)
        )
        self.opening.add_done_callback(self._opened_or_not)

    @property
    def usable(self) -> bool:
        """Still open and waiting for its command."""
        return self.ready and self._chan is not None and not self._gone

    def claim(
        self, command: str, max_stdout: int, max_stderr: int, on_closed: Callable[[], None]
    ) -> Session:
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
        if not exec_gate.SPARES:  # pragma: no cover - an asyncssh without the gate's method
            chan.close()  # the exec request then fails: nothing is ever sent
            return
        exec_gate.hold_exec(chan, self._command)
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


async def exec_on_spare(spare: Spare, session: Session) -> None:
    """Wait for the claimed spare's exec request and close its stdin (as open_channel)."""
    assert spare.opening is not None
    await finish_opening(spare.opening, session)
