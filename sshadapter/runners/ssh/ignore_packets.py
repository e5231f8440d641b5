"""No empty SSH_MSG_IGNORE before each packet when the cipher does not chain its IV.

asyncssh sends an empty ``SSH_MSG_IGNORE`` before every packet it encrypts after the
key exchange: the countermeasure RFC 4251 section 9.3.1 gives for CBC mode, where a
packet's IV is the last cipher block of the one before, known to an eavesdropper before
the next packet is encrypted. The ciphers in ``UNCHAINED_CIPHERS`` take no IV from the
previous packet (AES-GCM and chacha20-poly1305 use a per-packet nonce, CTR a counter),
so the packet protects nothing there, and OpenSSH does not send it. It doubled the
packets of a call: a fan-out host's exec, EOF, close and spare channel open each cost
one more encryption and ~10 µs of the daemon's CPU with AES-GCM (~38 µs per host,
~5% of a warm fan-out host), and sshd one more packet to decrypt.

``skip_ignore_packets`` drops that packet, and nothing else, on one connection whose
negotiated send cipher is in ``UNCHAINED_CIPHERS`` at the moment it would be sent; under
any other cipher (none is offered today: dial.CIPHERS, asyncssh's default list) asyncssh
sends it as before. What is sent otherwise is unchanged.
"""

from __future__ import annotations

from typing import Any, Final

import asyncssh

# Ciphers whose IV is not the previous packet's last cipher block (RFC 4344, RFC 5647,
# the OpenSSH PROTOCOL.chacha20poly1305 and PROTOCOL AES-GCM): the CBC countermeasure is moot.
UNCHAINED_CIPHERS: Final = frozenset(
    {
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        "chacha20-poly1305@openssh.com",
        "aes128-ctr",
        "aes192-ctr",
        "aes256-ctr",
    }
)
MSG_IGNORE: Final = 2  # RFC 4253 section 11.2
EMPTY_STRING: Final = b"\x00\x00\x00\x00"  # an SSH string of length 0: asyncssh's String(b"")
_SEND_PACKET: Final = "send_packet"  # asyncssh.SSHConnection's packet writer (review on upgrade)


def skip_ignore_packets(conn: asyncssh.SSHClientConnection) -> bool:
    """Drop the empty SSH_MSG_IGNORE asyncssh puts before each packet, on ``conn``, while
    its send cipher is in UNCHAINED_CIPHERS; False, and nothing changed, when this asyncssh
    has no such method or ``conn`` is wrapped already."""
    send_packet = getattr(type(conn), _SEND_PACKET, None)
    if not callable(send_packet) or _SEND_PACKET in vars(conn):
        return False

    def send_unless_moot(pkttype: int, *args: bytes, handler: Any = None) -> None:
        if (
            pkttype == MSG_IGNORE
            and args == (EMPTY_STRING,)
            and conn.get_extra_info("send_cipher") in UNCHAINED_CIPHERS
        ):
            return
        send_packet(conn, pkttype, *args, handler=handler)

    setattr(conn, _SEND_PACKET, send_unless_moot)
    return True
