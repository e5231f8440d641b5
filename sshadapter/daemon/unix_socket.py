"""The daemon's Unix socket: binding it safely, who is on the other end, and whether it left.

Reference: docs/protocol.md (the socket) and docs/operations.md (the socket file).
The caller's identity comes from SO_PEERCRED and SO_PEERGROUPS, as of connect time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import logging
import os
import select
import socket
import stat
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from sshadapter.audit.private_paths import make_private_dirs
from sshadapter.config import Config
from sshadapter.daemon import systemd
from sshadapter.daemon.access import Peer
from sshadapter.errors import ConfigError

log = logging.getLogger(__name__)

_UCRED: Final = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
SO_PEERGROUPS: Final = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h; no constant
_PEERGROUPS_START_BYTES: Final = 64 * 4  # most callers have few groups
_PEERGROUPS_MAX_BYTES: Final = 65536 * 4  # NGROUPS_MAX
# Pending connections the kernel queues while the loop is busy: the system's maximum
# (net.core.somaxconn caps it), not asyncio's default of 100, which refused a burst of
# 150 agents with EAGAIN.
SOCKET_BACKLOG: Final = socket.SOMAXCONN


class SocketInUse(ConfigError):
    """Another live daemon answers on the socket path."""


def bind_socket(path: Path, mode: int, group: str) -> socket.socket:
    """Bind the agent socket safely: replace only a stale socket, never follow a symlink."""
    key = "server.socket_path"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(str(path), key, f"cannot inspect: {exc.strerror}") from exc
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise ConfigError(str(path), key, "exists and is not a socket: refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()  # a socket nobody listens on: left by a daemon that died
        except OSError as exc:
            raise ConfigError(str(path), key, f"cannot probe: {exc.strerror or exc}") from exc
        else:
            raise SocketInUse(str(path), key, "another daemon is listening")
        finally:
            probe.close()
    make_private_dirs(path.parent, key=key)  # created 0700 if missing; never a symlink
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)  # created 0600: no window in which others can connect
    try:
        sock.bind(str(path))
    except OSError as exc:
        sock.close()
        raise ConfigError(str(path), key, f"cannot bind: {exc.strerror}") from exc
    finally:
        os.umask(old_umask)
    try:
        if group:
            try:
                gid = grp.getgrnam(group).gr_gid
            except KeyError as exc:
                raise ConfigError(
                    str(path), "server.socket_group", f"no group {group!r} to give the socket to"
                ) from exc
            try:
                os.chown(path, -1, gid)
            except OSError as exc:  # not a member of the group, or chown forbidden by a sandbox
                raise ConfigError(
                    str(path),
                    "server.socket_group",
                    f"cannot give the socket to group {group!r}: {exc.strerror}",
                ) from exc
        os.chmod(path, mode)
        sock.listen(SOCKET_BACKLOG)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_of(sock: socket.socket) -> Peer:
    """The connected process, as the kernel saw it at connect time."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return Peer(pid, uid, gid, _peer_groups(sock))


@contextlib.contextmanager
def hangup(sock: socket.socket) -> Iterator[asyncio.Future[None]]:
    """A future done once the peer has gone: it closed the connection, or it was reset.

    On a Unix stream socket the kernel reports EPOLLHUP once both directions are shut
    (the peer closed, or shut down both sides; a client that only shut its writing side
    waits for its answer and is still there) and EPOLLERR on a reset. An epoll set of its
    own holds the socket with no event asked (those two are reported to every mask), and
    the loop watches that set: no byte is read, so requests the client sent ahead stay for
    the conversation, and the fast path pays nothing (only a waiting call is watched).
    """
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()
    watch = select.epoll()  # close-on-exec

    def went() -> None:
        loop.remove_reader(watch.fileno())  # level-triggered: it would be reported forever
        if not gone.done():
            gone.set_result(None)

    try:
        fd = sock.fileno()
        if fd < 0:  # closed already (a failed write): nobody to answer
            gone.set_result(None)
        else:
            watch.register(fd, 0)
            loop.add_reader(watch.fileno(), went)
        yield gone
    finally:
        loop.remove_reader(watch.fileno())
        watch.close()
        gone.cancel()


def _peer_groups(sock: socket.socket) -> frozenset[int]:
    """Supplementary groups from the kernel (SO_PEERGROUPS, Linux 4.13), as of connect time.

    Not /proc/PID/status: that races with pid reuse, and systemd's
    ProtectProc=invisible hides other users' processes from the daemon.
    """
    size = _PEERGROUPS_START_BYTES
    while size <= _PEERGROUPS_MAX_BYTES:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:  # more groups than fit: ask with room for them
                size *= 4
                continue
            log.warning("SO_PEERGROUPS failed (%s): only the primary group counts", exc.strerror)
            return frozenset()
        return frozenset(struct.unpack(f"{len(raw) // 4}I", raw))
    return frozenset()


def open_listening_socket(config: Config) -> tuple[socket.socket, bool]:
    """The socket systemd passed (socket activation), else one bound here; True if bound here."""
    passed = systemd.listen_fds()
    if passed:
        return passed[0], False
    sock = bind_socket(
        config.server.socket_path, int(config.server.socket_mode, 8), config.server.socket_group
    )
    return sock, True


def unlink_if_ours(path: Path, inode: int | None) -> None:
    """Remove our socket file, but not one a newer daemon has bound since."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if stat.S_ISSOCK(info.st_mode) and info.st_ino == inode:
            path.unlink()
