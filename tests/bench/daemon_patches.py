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
