"""asyncssh's log calls cost nothing when their level is off.

asyncssh formats every log call's arguments before asking whether the level is enabled
(``SSHLogger.log``), and names and sizes every packet it sends or receives before asking
whether packet logging (debug level 3) is on (``SSHPacketLogger._log_packet``). The
daemon keeps asyncssh at WARNING (daemon/logs.py), so a fan-out host paid ~5 INFO, ~6
DEBUG and ~11 packet log calls that wrote nothing: ~10 µs of CPU per host (1.3 µs an
INFO call, 0.5 µs a packet, timed), ~1% of a warm fan-out host.
``skip_disabled_log_calls`` puts the check first, in both; an enabled level or debug
level 3 logs exactly what asyncssh logged before.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from asyncssh import logging as ssh_logging
from asyncssh import packet as ssh_packet

PACKET_DEBUG_LEVEL: Final = 3  # asyncssh logs packets only at this debug level (SSHLogger.packet)
_MARK: Final = "__sshadapter_checked_first__"  # set on a method wrapped here


def skip_disabled_log_calls() -> bool:
    """Wrap asyncssh's ``SSHLogger.log`` and ``SSHPacketLogger._log_packet`` so a disabled
    call returns before formatting anything; False, and nothing changed, when this asyncssh
    has neither or they are wrapped already."""
    log = getattr(ssh_logging.SSHLogger, "log", None)
    log_packet = getattr(ssh_packet.SSHPacketLogger, "_log_packet", None)
    if not callable(log) or not callable(log_packet) or hasattr(log, _MARK):
        return False

    def checked_log(self: ssh_logging.SSHLogger, level: int, *args: Any, **kwargs: Any) -> None:
        if self.isEnabledFor(level):
            log(self, level, *args, **kwargs)

    def checked_log_packet(self: ssh_packet.SSHPacketLogger, *args: Any) -> None:
        logger = self.logger
        # An asyncssh without _debug_level: asyncssh's own method decides, as unwrapped.
        level = getattr(logger, "_debug_level", PACKET_DEBUG_LEVEL)
        if level >= PACKET_DEBUG_LEVEL and logger.isEnabledFor(logging.DEBUG):
            log_packet(self, *args)

    for wrapper in (checked_log, checked_log_packet):
        setattr(wrapper, _MARK, True)
    ssh_logging.SSHLogger.log = checked_log  # type: ignore[method-assign]
    ssh_packet.SSHPacketLogger._log_packet = checked_log_packet  # type: ignore[method-assign,assignment]
    return True
