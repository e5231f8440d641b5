"""The daemon: the Unix socket, connection limits, its lifecycle, SIGHUP reload, SIGTERM drain.

Reference: docs/protocol.md (the socket) and docs/operations.md (signals).
Newline-delimited JSON, one response line per request line, in order, several
requests per connection. The caller's identity comes from SO_PEERCRED and
SO_PEERGROUPS, as of connect time.

Lifecycle: STARTING -> SERVING -> DRAINING -> STOPPED. SIGTERM (or SIGINT)
stops accepting connections and new requests, then waits, within
``drain_timeout_seconds``, until every request already read has its answer
written (or its client has gone). Past the deadline the calls still running are
cancelled: each gets its result record (stage ``shutdown``), and the log names
them. Then the SSH pools and the audit file are closed.

``assemble.assemble`` builds a daemon from a configuration, the one wiring
production and tests share; ``unix_socket`` binds the socket and names the peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import os
import select
import signal
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sshadapter import __version__
from sshadapter.audit.writer import AuditLog, now_text
from sshadapter.catalog import read_catalog
from sshadapter.config import Config, Grant, load_config
from sshadapter.contract.registry import Registry, load_registry
from sshadapter.daemon import systemd
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.service import Service
from sshadapter.daemon.unix_socket import SOCKET_BACKLOG, hangup, peer_of
from sshadapter.dispatch import policy
from sshadapter.errors import ConfigError, UpstreamError
from sshadapter.inventory.fleet import Inventory, load_inventory
from sshadapter.runners.interface import FANOUT_HOST, Runner

log = logging.getLogger(__name__)

_SIGNALS: Final = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
# A large answer is written in slices of this size, each once the last has drained:
# asyncio (3.11) copies whatever the socket does not take at once into its buffer, which
# for a whole 8 MB answer is milliseconds in which the loop serves nobody else.
WRITE_SLICE_BYTES: Final = 256 * 1024
# After the drain deadline, how long a cut call has to deliver its INTERNAL answer.
CUT_GRACE_SECONDS: Final = 1.0
# A progress line is dropped while this much is still unread on its connection: a caller
# that asked for progress and does not read it holds at most this, not one line per host.
PROGRESS_BUFFER_BYTES: Final = 64 * 1024


class State(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    STOPPED = "stopped"


@dataclass(eq=False)
class _Connection:
    """One agent connection."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    gone: bool = False
    """Its client closed it (both directions): it holds no max_connections slot any more,
    though its handler may still be running a call the client asked for."""


def _peers_gone(conns: list[_Connection]) -> list[_Connection]:
    """The connections whose client has gone, as the kernel says now: one poll(2), no wait.

    On a Unix stream socket POLLHUP means both directions are shut: the client closed
    it (or shut down both sides) and can never read an answer. A client that only shut
    its writing side (half-close, waiting for its answer) is still there.
    """
    poller = select.poll()
    by_fd: dict[int, _Connection] = {}
    gone: list[_Connection] = []
    for conn in conns:
        if conn.writer.transport.is_closing():  # ending (a failed write): no fd to ask about
            gone.append(conn)
            continue
        fd = conn.writer.get_extra_info("socket").fileno()
        by_fd[fd] = conn
        poller.register(fd, 0)  # POLLHUP, POLLERR and POLLNVAL are reported to every mask
    for fd, events in poller.poll(0):
        if events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
            gone.append(by_fd[fd])
    return gone


class Daemon:
    """One running daemon: a listening socket, a Service, and its lifecycle.

    It is given the parts it starts, reloads and closes (``assemble`` builds them once,
    and gives the Service those it uses): it never reaches through the Service for them.
    """

    def __init__(
        self,
        config: Config,
        service: Service,
        *,
        runner: Runner,
        audit: AuditLog,
        metrics: Metrics,
        judge: Judge,
        dispatch: PolicyMonitor | None = None,
        config_path: Path | None = None,
        warm: Sequence[str] = (),
    ) -> None:
        self.config = config
        self.config_path = config_path
        """Read again at SIGHUP for its groups and grants (None: the configuration stays)."""
        self.service = service
        """Answers each request line."""
        self.runner = runner
        """Its ``warm`` hosts connected at start, closed at the end of the drain."""
        self.warm = tuple(warm)
        """The host aliases connected at start (``[pool] warm``); the others on first use."""
        self.audit = audit
        """The start record; reopened at SIGHUP, closed last."""
        self.metrics = metrics
        """Reloads and dropped connections are counted here."""
        self.judge = judge
        """Its evaluation workers are stopped after the drain."""
        self.dispatch = dispatch
        """The policy state of dispatch hosts: checked when connected, and while connected."""
        self.state = State.STARTING
        self.ready = asyncio.Event()
        """Set once serving: the socket accepts and READY=1 has been sent."""
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self._stopping = asyncio.Event()
        self._server: asyncio.Server | None = None

    async def serve(self, sock: socket.socket) -> None:
        """Serve until SIGTERM/SIGINT, then drain in-flight calls and close."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop)
        try:
            await self.audit.append(
                {
                    "type": "start",
                    "time": now_text(),
                    "adapter_version": __version__,
                    "pid": os.getpid(),
                    "tools": self.service.tool_names,
                }
            )
            self._server = await asyncio.start_unix_server(
                self._accept,
                sock=sock,
                limit=self.config.server.max_request_bytes + 1,
                backlog=SOCKET_BACKLOG,
            )
            # Only what the operator asked for; the runner bounds the handshakes in flight.
            warming = [asyncio.create_task(self._warm())] if self.warm else []
            if self.dispatch is not None:
                warming.append(asyncio.create_task(self.dispatch.watch()))
            self.state = State.SERVING
            self.ready.set()
            systemd.notify("READY=1")
            log.info("serving %d tools on %s", len(self.service.tool_names), sock.getsockname())
            await self._stopping.wait()
            for task in warming:
                task.cancel()
            if self.dispatch is not None:
                await self.dispatch.close()
            await self.shutdown()
        finally:
            for sig in _SIGNALS:
                loop.remove_signal_handler(sig)
            self.state = State.STOPPED

    def stop(self) -> None:
        self._stopping.set()

    async def shutdown(self) -> None:
        """Drain: no new connections or requests; calls already read get their answers."""
        self.state = State.DRAINING
        systemd.notify("STOPPING=1")
        in_flight = len(self.service.calls)  # running, queued or waiting for approval
        log.info(
            "stopping: %d calls in flight on %d connections, drain deadline %gs",
            in_flight,
            len(self._connections),
            self.config.server.drain_timeout_seconds,
        )
        if self._server is not None:
            self._server.close()  # stop accepting; connections already open keep going
        self.service.end_approvals()  # pending approvals survive nothing: denied, audited
        for conn in self._connections.values():
            # No more bytes from any client; what is already buffered is still read (and
            # answered OVERLOADED), then each connection sees the end and closes.
            if isinstance(transport := conn.writer.transport, asyncio.ReadTransport):
                transport.pause_reading()
            conn.reader.feed_eof()
        deadline = self.config.server.drain_timeout_seconds
        tasks = list(self._connections)
        cut = 0
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=deadline)
            if late:
                cut = self._cut(late, deadline)
                _, late = await asyncio.wait(late, timeout=CUT_GRACE_SECONDS)
                for task in late:  # could not even deliver the INTERNAL answer in time
                    task.cancel()
                await asyncio.gather(*late, return_exceptions=True)
        log.info("drained: %d calls ended in the drain, %d cut", in_flight - cut, cut)
        await self.runner.close()
        await self.judge.close()
        self.audit.close()
        log.info("stopped")

    def _cut(self, late: set[asyncio.Task[None]], deadline: float) -> int:
        """Past the drain deadline: name the calls still running, then cancel them; how
        many were running.

        Each cancelled call writes its result record (stage `shutdown`) and answers
        INTERNAL (see Service.cut_on_cancel).
        """
        running = self.service.cut()
        log.warning(
            "drain deadline of %gs passed: cutting %d calls: %s",
            deadline,
            len(running),
            ", ".join(running) or "none running",
        )
        for task in late:
            task.cancel()
        return len(running)

    def reload(self) -> None:
        """SIGHUP: reload operations, groups and grants whole; a bad set keeps the old one.

        The configuration file is reread for them; its hosts apply at start only (a change
        refuses the reload), its limits, paths and pool at the next restart.
        """
        if self.state is not State.SERVING:
            return
        systemd.notify("RELOADING=1")
        try:
            self._reload()
        finally:  # systemctl reload waits for it: it must come, whatever happened
            systemd.notify("READY=1")

    def _reload(self) -> None:
        try:
            config = self.config
            if self.config_path is not None:  # groups and grants may have changed
                config, _ = load_config(self.config_path)
                _refuse_host_changes(self.config, config, self.config_path)
            loaded = load(config, str(self.config_path or "<config>"))
        except ConfigError as exc:
            log.error("reload refused, keeping %d tools: %s", len(self.service.tool_names), exc)
            self.metrics.reloads.labels("failure").inc()
        else:
            self.service.install(loaded.registry, loaded.inventory, loaded.grants)
            if self.dispatch is not None:  # hosts first, then the reload: check them
                self.dispatch.expect(loaded.policies)
                self.dispatch.check_soon()
            self.metrics.reloads.labels("success").inc()
            log.info(
                "reloaded %d tools, %d groups",
                len(loaded.registry.operations),
                len(loaded.inventory.groups),
            )
        try:
            self.audit.reopen()
        except (ConfigError, OSError) as exc:
            log.error("audit log not reopened, still writing the old file: %s", exc)

    async def _warm(self) -> None:
        """Open each ``[pool] warm`` host's first connection before the first call needs it.

        A failure is only logged, in one line with the count of hosts not reached by reason
        (each host's own line at debug: ``FANOUT_HOST``), so 1,000 unreachable warm hosts
        log one line, not 2,000; the first call tries again.
        """
        FANOUT_HOST.set(True)  # this task's context, copied into each host's task
        reasons = await asyncio.gather(*(self._warm_one(alias) for alias in self.warm))
        missed = Counter(reason for reason in reasons if reason is not None)
        if missed:
            counts = ", ".join(f"{reason}={n}" for reason, n in sorted(missed.items()))
            log.warning(
                "%d of %d warm hosts not reachable yet (the first call tries again): %s",
                sum(missed.values()),
                len(self.warm),
                counts,
            )

    async def _warm_one(self, alias: str) -> str | None:
        """One warm host: None once connected, else the transport reason.

        A dispatch host connected is then asked for its policy (sshadapter/daemon/drift.py
        ``connected``: once, also when the runner's own ``on_connect`` already asked); one
        not reached is not asked.
        """
        try:
            await self.runner.warm(alias)
        except UpstreamError as exc:
            log.debug("host %s not reachable yet: %s", alias, exc)
            return exc.reason
        if self.dispatch is not None:
            self.dispatch.connected(alias)
        return None

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        drops = self.metrics.client_drops
        if self._live_connections() >= self.config.server.max_connections:
            drops.labels("connection_limit").inc()
            writer.write(self.service.refuse("OVERLOADED"))
            await _close(writer)
            return
        conn = _Connection(reader, writer)
        self._connections[task] = conn
        try:
            await self._converse(conn, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except asyncio.CancelledError:
            # shutdown() cancels what is still running past the drain deadline. The task
            # ends normally: Python 3.11's start_unix_server calls exception() on a cancelled
            # handler task and logs a traceback (3.12 does not).
            pass
        except Exception:  # a bug: logged; the daemon keeps serving everyone else
            log.exception("agent connection failed")
        finally:
            self._connections.pop(task, None)
            await _close(writer)

    def _live_connections(self) -> int:
        """Connections counted against max_connections: those whose client is still there.

        A connection whose client has closed it holds no slot, though its handler has not
        noticed yet: one taken from the listen backlog after its client gave up (a loop
        busy with large answers accepts a burst late, and the closed ones queued before
        a live client would take the slots it needs), or one whose call is still running
        (the call runs to its end and is audited; its answer has nobody to go to).
        Asked of the kernel only at the limit.
        """
        counted = [conn for conn in self._connections.values() if not conn.gone]
        if len(counted) < self.config.server.max_connections:
            return len(counted)
        for conn in _peers_gone(counted):
            conn.gone = True
        return sum(not conn.gone for conn in counted)

    async def _converse(self, conn: _Connection, writer: asyncio.StreamWriter) -> None:
        """Requests in order, one at a time; idle, stalled and non-reading clients are dropped."""
        reader, server = conn.reader, self.config.server
        drops = self.metrics.client_drops
        sock = writer.get_extra_info("socket")
        peer = peer_of(sock)
        watch = functools.partial(hangup, sock)  # used only by a call waiting for approval

        def report(line: bytes) -> None:  # a call's progress line, before its answer
            transport = writer.transport
            if not transport.is_closing() and (
                transport.get_write_buffer_size() <= PROGRESS_BUFFER_BYTES
            ):
                writer.write(line)

        loop = asyncio.get_running_loop()
        while True:  # during the drain, until the bytes already read run out
            first = b""
            try:
                # One timeout per request (asyncio.timeout, not wait_for: no extra Task):
                # the idle timeout until its first byte, then the read timeout for the rest.
                async with asyncio.timeout(server.idle_timeout_seconds) as limit:
                    first = await reader.readexactly(1)
                    rest = b""
                    if first != b"\n":
                        limit.reschedule(loop.time() + server.read_timeout_seconds)
                        rest = await reader.readuntil(b"\n")
            except TimeoutError:
                drops.labels("read_timeout" if first else "idle_timeout").inc()
                return
            except asyncio.IncompleteReadError:
                return  # gone, or nothing left to read once the drain began
            except asyncio.LimitOverrunError:
                # Over max_request_bytes without a newline: answer, then drop the connection
                # since the rest of the line cannot be told apart from a next request.
                drops.labels("request_too_large").inc()
                writer.write(self.service.refuse("INVALID_REQUEST"))
                await self._deliver(writer)
                return
            if self.state is State.SERVING:
                response = await self.service.handle(
                    (first + rest).rstrip(b"\n"), peer, watch, report
                )
            else:  # read while the drain began: nothing ran; another daemon will answer it
                response = self.service.refuse("OVERLOADED")
            delivered = await self._answer(writer, response)
            del response  # orjson's buffer is ~4x the response: not kept while the next is read
            if not delivered:
                return

    async def _answer(self, writer: asyncio.StreamWriter, response: bytes) -> bool:
        """Write one answer; a large one in slices, so the loop never copies it whole."""
        if len(response) <= WRITE_SLICE_BYTES:
            writer.write(response)
            return await self._deliver(writer)
        view = memoryview(response)
        try:
            async with asyncio.timeout(self.config.server.write_timeout_seconds):
                for start in range(0, len(view), WRITE_SLICE_BYTES):
                    writer.write(view[start : start + WRITE_SLICE_BYTES])
                    await writer.drain()
        except TimeoutError:
            return self._dropped_slow_reader(writer)
        return True

    async def _deliver(self, writer: asyncio.StreamWriter) -> bool:
        """Wait until the client has taken the answer; drop a client that does not."""
        if not writer.transport.get_write_buffer_size():
            return True  # the kernel took all of it already: the usual case, nothing to wait for
        try:
            async with asyncio.timeout(self.config.server.write_timeout_seconds):
                await writer.drain()
        except TimeoutError:
            return self._dropped_slow_reader(writer)
        return True

    def _dropped_slow_reader(self, writer: asyncio.StreamWriter) -> bool:
        self.metrics.client_drops.labels("write_timeout").inc()
        log.info("agent connection dropped: its answer not read in time")
        writer.transport.abort()  # releases the buffered answer now
        return False


def _refuse_host_changes(running: Config, new: Config, path: Path) -> None:
    """Hosts' connection settings apply at start only: a reload that changes them is refused
    whole (the running pools, pins and credentials stay), saying what changed."""
    if new.hosts == running.hosts:
        return
    added = sorted(new.hosts.keys() - running.hosts.keys())
    removed = sorted(running.hosts.keys() - new.hosts.keys())
    changed = sorted(
        a for a in new.hosts.keys() & running.hosts.keys() if new.hosts[a] != running.hosts[a]
    )
    what = "; ".join(
        f"{label} {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        for label, names in (("added", added), ("removed", removed), ("changed", changed))
        if names
    )
    raise ConfigError(str(path), "hosts", f"host entries changed ({what}): restart to apply them")


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError, OSError):
        await writer.wait_closed()


@dataclass(frozen=True)
class Loaded:
    """What a configuration gives the daemon to serve: built whole, at start and reload."""

    registry: Registry
    policies: dict[str, dict[str, Any]]
    """Each dispatch host's policy."""
    inventory: Inventory
    grants: tuple[Grant, ...]


def load(
    config: Config,
    config_file: str = "<config>",
    *,
    aliases_known: bool = True,
    also_dispatch: str = "",
) -> Loaded:
    """The configuration's inventory, registry (its commands and the catalog families it
    enables), each dispatch host's policy and the grants, or ConfigError (``config_file``
    names the configuration): all or nothing, at start, at every reload and for every
    command of the command line, so each refuses what `serve` refuses.

    ``aliases_known`` false: the built-in defaults of a command run without a
    configuration file, which has no [hosts] to check the operations' host aliases against.
    ``also_dispatch``: a host alias whose policy is wanted before it is marked `dispatch`
    (a group's name adds nothing: its policy is built apart, ``policy.group_policy``).
    """
    inventory = load_inventory(config)
    if inventory.is_group(also_dispatch):
        also_dispatch = ""
    if also_dispatch and also_dispatch not in config.hosts:
        raise ConfigError(config_file, f"hosts.{also_dispatch}", "no such host alias or group")
    dispatch_hosts = policy.dispatch_hosts(config) | ({also_dispatch} if also_dispatch else set())
    registry = load_registry(
        config.paths.commands,
        config.paths.schemas,
        hosts=config.hosts.keys() if aliases_known else None,
        groups=inventory.groups.keys(),
        dispatch_hosts=dispatch_hosts,
        dispatch_groups=policy.dispatch_groups(config, inventory),
        catalog=read_catalog(config.catalog, config_file),
    )
    check_grants(config, inventory, registry)
    check_approvers(config, registry)
    return Loaded(registry, policy.host_policies(registry, inventory), inventory, config.grants)


def check_grants(config: Config, inventory: Inventory, registry: Registry) -> None:
    """Every grant names tools and targets that exist, or ConfigError naming it."""
    where = next(iter(config.origins.values()), "<config>")
    for i, grant in enumerate(config.grants):
        for tool in grant.tools:
            if tool != "*" and registry.get(tool) is None:
                raise ConfigError(where, f"grants[{i}].tools", f"no tool {tool!r}")
        for target in grant.targets:
            if not inventory.exists(target):
                raise ConfigError(
                    where, f"grants[{i}].targets", f"{target!r} is no host alias and no group"
                )


def check_approvers(config: Config, registry: Registry) -> None:
    """An operation that requires approval needs someone who may give it, or ConfigError:
    otherwise each of its calls would wait its whole timeout, then be denied."""
    if config.approvals.uids or config.approvals.groups:
        return
    for op in registry.operations.values():
        if op.spec.approval.required:
            raise ConfigError(
                str(op.file),
                "approval.required",
                "no approver: [approvals] names no uid and no group",
            )
