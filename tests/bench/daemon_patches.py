"""Experimental fixes for the daemon, applied in its process only, to measure a suggestion.

The package is not edited: ``PATCHED_SERVE`` runs ``exec(code)`` and then
``sshadapter serve``; ``bench_ssh.py --variant`` and ``profile_ssh.py --patch``
use it to run a patched daemon beside (or instead of) the real one. Each entry is
one suggested fix from a benchmark report; when the package adopts it, the entry
can go. A later patch of the same function replaces an earlier one.
"""

from __future__ import annotations

# Each entry: a suggested fix, executed in the daemon process before serve.
PATCHES = {
    # daemon.Daemon._converse keeps `response` (orjson's buffer: ~4x the output's size
    # allocated) bound while the next request is read and served: drop it before drain.
    "drop-response": r"""
import asyncio
from sshadapter import daemon as _d

async def _converse(self, reader, writer):
    peer = _d.peer_of(writer.get_extra_info("socket"))
    server = self.config.server
    while not self._stopping.is_set():
        try:
            first = await asyncio.wait_for(reader.readexactly(1), server.idle_timeout_seconds)
            rest = b"" if first == b"\n" else await asyncio.wait_for(
                reader.readuntil(b"\n"), server.read_timeout_seconds)
        except (TimeoutError, asyncio.IncompleteReadError):
            return
        except asyncio.LimitOverrunError:
            writer.write(_d._invalid_request())
            await writer.drain()
            return
        response = await self.service.handle((first + rest).rstrip(b"\n"), peer)
        writer.write(response + b"\n")
        del response
        await writer.drain()

_d.Daemon._converse = _converse
""",
    # The same, and asyncio.timeout() instead of two asyncio.wait_for() per request
    # (each wait_for wraps the read in a new Task in Python 3.11).
    "converse-timeout": r"""
import asyncio
from sshadapter import daemon as _d

async def _converse(self, reader, writer):
    peer = _d.peer_of(writer.get_extra_info("socket"))
    server = self.config.server
    while not self._stopping.is_set():
        try:
            async with asyncio.timeout(server.idle_timeout_seconds):
                first = await reader.readexactly(1)
            if first == b"\n":
                rest = b""
            else:
                async with asyncio.timeout(server.read_timeout_seconds):
                    rest = await reader.readuntil(b"\n")
        except (TimeoutError, asyncio.IncompleteReadError):
            return
        except asyncio.LimitOverrunError:
            writer.write(_d._invalid_request())
            await writer.drain()
            return
        response = await self.service.handle((first + rest).rstrip(b"\n"), peer)
        writer.write(response + b"\n")
        del response
        await writer.drain()

_d.Daemon._converse = _converse
""",
    # asyncssh logs five INFO lines per call (session requested, command, exit status,
    # close received, closed) because `serve` configures logging at INFO: keep them out.
    "quiet-asyncssh": r"""
import logging
logging.getLogger("asyncssh").setLevel(logging.WARNING)
""",
    # runners.ssh._open_channel opens each channel in its own task behind asyncio.shield
    # (so a caller's timeout cannot leave a half-open channel): two more event-loop turns
    # per call. Measurement only: this version drops that cancellation guarantee.
    "direct-open": r"""
from sshadapter.runners import ssh as _s

async def _open_channel(ssh, session, command):
    chan, _ = await ssh.create_session(
        lambda: session, command, term_type=None, request_pty=False, env=None,
        send_env=None, x11_forwarding=False, encoding=None, max_pktsize=_s.MAX_PACKET_BYTES)
    chan.write_eof()

_s._open_channel = _open_channel
""",
}

PATCHED_SERVE = r"""
import sys
exec(sys.argv[1])
from sshadapter.cli import main
sys.exit(main(["serve", "--config", sys.argv[2]]))
"""


