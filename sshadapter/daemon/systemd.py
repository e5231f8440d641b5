"""The two things systemd asks of a service: readiness messages and passed sockets.

sd_notify(3): a datagram to ``$NOTIFY_SOCKET`` (``@`` means the abstract
namespace). sd_listen_fds(3): descriptors from 3 on, ``$LISTEN_FDS`` of them,
meant for us only if ``$LISTEN_PID`` is our pid.
"""

from __future__ import annotations

import os
import socket
from typing import Final

SD_LISTEN_FDS_START: Final = 3


def notify(message: str) -> bool:
    """Send ``READY=1``, ``RELOADING=1``, ``STOPPING=1``...; False when not under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
        try:
            sock.sendto(message.encode(), address)
        except OSError:
            return False
    return True


def listen_fds() -> list[socket.socket]:
    """Sockets systemd passed to this process (socket activation), then forget them."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    count = int(os.environ.get("LISTEN_FDS", "0") or 0)
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for our children
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        sockets.append(socket.socket(fileno=fd))
    return sockets
