"""The daemon: the Unix socket, connection limits, SIGHUP reload and SIGTERM drain.

Contract: DESIGN.md "Agent contract: the socket" and "Command line".
Newline-delimited JSON, one response line per request line, in order, several
requests per connection. The caller's identity comes from SO_PEERCRED.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import grp
import logging
import os
import signal
import socket
import stat
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

import orjson
from prometheus_client import start_http_server

from sshadapter import __version__, envelope, policy, systemd
from sshadapter.audit import AuditLog, now_text
from sshadapter.config import Config, load_config
from sshadapter.drift import PolicyMonitor
from sshadapter.errors import ConfigError, UpstreamError
from sshadapter.metrics import Metrics
from sshadapter.quarantine import Quarantine
from sshadapter.registry import load_registry
from sshadapter.runners.interface import Runner
from sshadapter.runners.ssh import SshRunner
from sshadapter.service import Peer, Service

log = logging.getLogger(__name__)

_UCRED: Final = struct.Struct("3i")  # struct ucred {pid_t pid; uid_t uid; gid_t gid;}
SO_PEERGROUPS: Final = getattr(socket, "SO_PEERGROUPS", 59)  # asm-generic/socket.h; no constant
_PEERGROUPS_START_BYTES: Final = 64 * 4  # most callers have few groups
_PEERGROUPS_MAX_BYTES: Final = 65536 * 4  # NGROUPS_MAX


class SocketInUse(ConfigError):
    """Another live daemon answers on the socket path."""


def bind_socket(path: Path, mode: int, group: str) -> socket.socket:
    """Bind the agent socket safely: replace only a stale socket, never follow a symlink."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(info.st_mode):
            raise ConfigError(
                str(path),
                "server.socket_path",
                "exists and is not a socket: refusing to replace it",
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()  # a socket nobody listens on: left by a daemon that died
        except OSError as exc:
            raise ConfigError(str(path), "server.socket_path", f"cannot probe: {exc}") from exc
        else:
            raise SocketInUse(str(path), "server.socket_path", "another daemon is listening")
        finally:
            probe.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old_umask = os.umask(0o177)  # created 0600: no window in which others can connect
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    if group:
        try:
            os.chown(path, -1, grp.getgrnam(group).gr_gid)
        except KeyError as exc:
            sock.close()
            raise ConfigError("", "server.socket_group", f"no group {group!r}") from exc
        except OSError as exc:  # not a member of the group, or chown forbidden by a sandbox
            sock.close()
            raise ConfigError(
                str(path),
                "server.socket_group",
                f"cannot give the socket to group {group!r}: {exc.strerror}",
            ) from exc
    os.chmod(path, mode)
    sock.listen(socket.SOMAXCONN)
    return sock


def peer_of(sock: socket.socket) -> Peer:
    """The connected process, as the kernel saw it at connect time."""
    pid, uid, gid = _UCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    )
    return Peer(pid, uid, gid, _peer_groups(sock))


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


class Daemon:
    """One running daemon: a listening socket, a Service, and its lifecycle."""

    def __init__(self, config: Config, service: Service, runner: Runner, audit: AuditLog) -> None:
        self.config = config
        self.service = service
        self.runner = runner
        self.audit = audit
        self._connections: set[asyncio.Task[None]] = set()
        self._stopping = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def serve(self, sock: socket.socket) -> None:
        """Serve until SIGTERM/SIGINT, then drain in-flight calls and close."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stopping.set)
        await self.audit.append(
            {
                "type": "start",
                "time": now_text(),
                "adapter_version": __version__,
                "pid": os.getpid(),
                "tools": sorted(self.service.registry.operations),
            }
        )
        limit = self.config.server.max_request_bytes + 1
        self._server = await asyncio.start_unix_server(self._accept, sock=sock, limit=limit)
        warm = getattr(self.runner, "warm", None)
        monitor = self.service.dispatch
        dispatched = monitor.hosts if monitor is not None else []
        warming = [
            asyncio.create_task(_warm(warm, alias, monitor))
            for alias in self.config.hosts
            if warm is not None or alias in dispatched
        ]
        if monitor is not None:
            warming.append(asyncio.create_task(monitor.watch()))
        systemd.notify("READY=1")
        log.info(
            "serving %d tools on %s", len(self.service.registry.operations), sock.getsockname()
        )
        await self._stopping.wait()
        for task in warming:
            task.cancel()
        if monitor is not None:
            await monitor.close()
        await self.shutdown()

    def stop(self) -> None:
        self._stopping.set()

    async def shutdown(self) -> None:
        systemd.notify("STOPPING=1")
        if self._server is not None:
            self._server.close()  # stop accepting; connections already open keep going
        drain = self.config.server.drain_timeout_seconds
        try:
            await asyncio.wait_for(self.service.admission.idle.wait(), drain)
        except TimeoutError:
            log.warning(
                "drain deadline passed with %d calls in flight", self.service.admission.admitted
            )
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        close = getattr(self.runner, "close", None)
        if close is not None:
            await close()
        self.audit.close()

    def reload(self) -> None:
        """SIGHUP: reload commands and schemas whole; a bad set keeps the old one running.

        The configuration file itself (hosts, limits, paths) is read at start only.
        """
        systemd.notify("RELOADING=1")
        try:
            registry = load_registry(
                self.config.paths.commands,
                self.config.paths.schemas,
                hosts=self.config.hosts.keys(),
                dispatch_hosts=policy.dispatch_hosts(self.config),
            )
        except ConfigError as exc:
            log.error(
                "reload refused, keeping %d tools: %s", len(self.service.registry.operations), exc
            )
            self.service.metrics.reloads.labels("failure").inc()
        else:
            self.service.registry = registry
            if self.service.dispatch is not None:  # hosts first, then the reload: check them
                self.service.dispatch.expect(registry.policies)
                self.service.dispatch.check_soon()
            self.service.metrics.reloads.labels("success").inc()
            log.info("reloaded %d tools", len(registry.operations))
        try:
            self.audit.reopen()
        except OSError as exc:
            log.error("audit log not reopened: %s", exc)
        systemd.notify("READY=1")

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= self.config.server.max_connections:
            writer.write(_overloaded())
            await _close(writer)
            return
        self._connections.add(task)
        try:
            await self._converse(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._connections.discard(task)
            await _close(writer)

    async def _converse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Requests in order, one at a time; idle and stalled clients are dropped."""
        peer = peer_of(writer.get_extra_info("socket"))
        server = self.config.server
        while not self._stopping.is_set():
            try:
                # asyncio.timeout, not wait_for: no extra Task per read on the hot path.
                async with asyncio.timeout(server.idle_timeout_seconds):
                    first = await reader.readexactly(1)
                rest = b""
                if first != b"\n":
                    async with asyncio.timeout(server.read_timeout_seconds):
                        rest = await reader.readuntil(b"\n")
            except (TimeoutError, asyncio.IncompleteReadError):
                return  # idle, stalled mid-line, or gone
            except asyncio.LimitOverrunError:
                # Over max_request_bytes without a newline: answer, then drop the connection
                # since the rest of the line cannot be told apart from a next request.
                writer.write(_invalid_request())
                await writer.drain()
                return
            response = await self.service.handle((first + rest).rstrip(b"\n"), peer)
            writer.write(response)
            del response  # orjson's buffer is ~4x the response: not kept while the next is read
            await writer.drain()


def _invalid_request() -> bytes:
    return (
        orjson.dumps(
            envelope.failure(envelope.SYSTEM_TOOL, envelope.new_request_id(), "INVALID_REQUEST")
        )
        + b"\n"
    )


def _overloaded() -> bytes:
    return (
        orjson.dumps(
            envelope.failure(envelope.SYSTEM_TOOL, envelope.new_request_id(), "OVERLOADED")
        )
        + b"\n"
    )


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


def open_listening_socket(config: Config) -> tuple[socket.socket, bool]:
    """The socket systemd passed (socket activation), else one bound here; True if bound here."""
    passed = systemd.listen_fds()
    if passed:
        return passed[0], False
    sock = bind_socket(
        config.server.socket_path, int(config.server.socket_mode, 8), config.server.socket_group
    )
    return sock, True


def assemble(config: Config) -> Daemon:
    """Everything a daemon is made of, from one configuration (serve and demo use it)."""
    dispatch_hosts = policy.dispatch_hosts(config)
    registry = load_registry(
        config.paths.commands,
        config.paths.schemas,
        hosts=config.hosts.keys(),
        dispatch_hosts=dispatch_hosts,
    )
    audit = AuditLog(config.audit.path, fsync=config.audit.fsync)
    audit.open()
    quarantine = Quarantine(config.audit.quarantine_dir, config.audit.quarantine_max_bytes)
    quarantine.open()
    metrics = Metrics()
    ssh = SshRunner(
        config.hosts,
        on_connect_failure=lambda host, reason: metrics.connect_failures.labels(host, reason).inc(),
    )
    metrics.watch_connections(ssh.connections)
    monitor = None
    if dispatch_hosts:
        monitor = PolicyMonitor(ssh, metrics)
        monitor.expect(registry.policies)
    service = Service(
        registry,
        ssh,
        audit,
        default_allow=config.server.allow,
        max_request_bytes=config.server.max_request_bytes,
        max_concurrent_calls=config.server.max_concurrent_calls,
        max_queue=config.server.max_queue,
        metrics=metrics,
        quarantine=quarantine,
        dispatch=monitor,
    )
    return Daemon(config, service, ssh, audit)


async def run_daemon(config_path: Path | None) -> int:
    """`sshadapter serve`: load everything, bind, serve until told to stop."""
    config, _ = load_config(config_path)
    daemon = assemble(config)
    if config.metrics.listen:
        host, _, port = config.metrics.listen.rpartition(":")
        start_http_server(
            int(port), addr=host.strip("[]"), registry=daemon.service.metrics.registry
        )
    sock, bound_here = open_listening_socket(config)
    inode = os.lstat(config.server.socket_path).st_ino if bound_here else None
    try:
        await daemon.serve(sock)
    finally:
        sock.close()
        if bound_here:
            _unlink_if_ours(config.server.socket_path, inode)
    return 0


async def _warm(
    warm: Callable[[str], Awaitable[None]] | None, alias: str, monitor: PolicyMonitor | None
) -> None:
    """Open the first connection before the first call needs it; a failure is only logged.

    A dispatch host is then asked for its policy (sshadapter/drift.py).
    """
    if warm is not None:
        try:
            await warm(alias)
        except UpstreamError as exc:
            log.warning("host %s not reachable yet: %s", alias, exc)
    if monitor is not None and alias in monitor.hosts:
        await monitor.check(alias)


def _unlink_if_ours(path: Path, inode: int | None) -> None:
    """Remove our socket file, but not one a newer daemon has bound since."""
    with contextlib.suppress(OSError):
        info = os.lstat(path)
        if stat.S_ISSOCK(info.st_mode) and info.st_ino == inode:
            path.unlink()
