"""The one patch of a private asyncssh method: ``SSHClientChannel._make_request``.

Review this file on every asyncssh upgrade (pyproject.toml pins the versions it is
tested on; tests/runners/test_ssh_runner.py fails when ``SPARES`` turns off).

A spare channel (``spare``) is opened with a placeholder command; asyncssh's
``create_session`` then sends the exec request at once. ``hold_exec`` replaces the
channel instance's ``_make_request`` (same signature since asyncssh 2.0) so that the
exec request waits until a call hands over its command, and carries that command
instead. If the method ever goes, ``SPARES`` is False and every call opens its own
channel, as before spares.

The channel's EOF (stdin closed) follows the exec request at once, without waiting for
its reply, as OpenSSH's ``ssh -n`` does: with ``coalesce`` both leave in one send().
"""

from __future__ import annotations

import asyncio
from typing import Final

import asyncssh
from asyncssh import packet as asyncssh_packet

SPARES: Final = hasattr(asyncssh.SSHClientChannel, "_make_request") and hasattr(
    asyncssh_packet, "String"
)
"""Whether this asyncssh has the method the gate replaces (read at every use: a
benchmark turns spares off by setting it)."""


def hold_exec(chan: asyncssh.SSHClientChannel[bytes], command: asyncio.Future[str]) -> None:
    """Make ``chan``'s exec request wait for ``command`` and send it in the placeholder's
    place. Every other request passes through unchanged."""
    original = chan._make_request

    async def gated(request: bytes, *args: bytes) -> bool | None:
        if request == b"exec":
            args = (asyncssh_packet.String(await command),)
            # Runs the next loop turn, after the request below is written (the same step):
            # stdin is closed right behind the command. A no-op on a channel not open.
            asyncio.get_running_loop().call_soon(chan.write_eof)
        return await original(request, *args)

    chan._make_request = gated  # type: ignore[method-assign]
