"""The production runner: operator-defined commands over pooled asyncssh connections.

Reference: docs/protocol.md "Stages" (5) and docs/operations.md "SSH". Each command runs on
its own session channel with no PTY, no environment, stdin closed at once, and
stdout/stderr capped as each packet arrives: past a cap the remote command is
killed, the channel closed, and the result carries ``cap + 1`` bytes (proof
that the cap was exceeded) and no exit status.

Security (docs/operations.md "Hosts"): host keys are checked strictly against
the host's ``known_hosts`` file and nothing else; there is no switch to turn
that off. Client keys come from ``client_keys`` files or a systemd credential;
no agent, no agent or X11 forwarding, no ``~/.ssh/config``, public key
authentication only. Key material never appears in logs, errors or reprs.

Pooling, per host alias: at most ``max_connections`` connections, each with at
most ``max_channels_per_connection`` channels (below sshd's ``MaxSessions 10``,
which frees sessions late). A connection is opened only when every open one is
full, and at most one connect is in flight per host (sshd's ``MaxStartups``
drops bursts of new connections). Callers beyond capacity wait.

Across hosts (``[pool]``, ``fleet``): nothing connects until a call or ``warm`` needs
it; at most ``connect_concurrency`` handshakes are in flight and
``max_connections_total`` connections open, the least recently used idle one closing
first at the cap; a connection idle for ``idle_close_seconds`` is closed. Each
known_hosts file is parsed once per version, each key loaded once (``file_cache``).

Errors: every asyncssh and OS exception becomes an ``UpstreamError`` in
``translate.translate`` and nowhere else (CONTRIBUTING.md: errors by blame, mapped in one place).

The parts: ``pool`` (connections per host, channel slots, retries), ``fleet`` (the
bounds all hosts share), ``file_cache`` (parsed known_hosts and keys), ``dial``
(one pinned, authenticated connection: keys and known_hosts), ``session`` (one
command's capped channel), ``spare`` (channels opened ahead of need) and
``exec_gate``, alone because it patches asyncssh's one private method we rely on:
review it on every asyncssh upgrade.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from sshadapter.config import HostSection, PoolSection
from sshadapter.errors import UpstreamError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.ssh.file_cache import FileCache
from sshadapter.runners.ssh.limits import Fleet
from sshadapter.runners.ssh.pool import Pool
from sshadapter.runners.ssh.quiet_logging import skip_disabled_log_calls
from sshadapter.runners.ssh.session import Session
from sshadapter.runners.ssh.translate import translate


class SshRunner:
    """Runs commands on configured hosts over pooled SSH connections (the Runner protocol).

    Client keys are read once, at the first connection that needs them, without a
    passphrase: a passphrase-protected key is not supported (the daemon has no
    safe place to keep the passphrase; use a systemd credential instead).
    """

    def __init__(
        self,
        hosts: Mapping[str, HostSection],
        *,
        pool: PoolSection | None = None,
        credentials_dir: Path | None = None,
        on_connect_failure: Callable[[str, str], None] | None = None,
        on_connect: Callable[[str], None] | None = None,
        on_close: Callable[[str], None] | None = None,
        on_jump_lost: Callable[[str], None] | None = None,
    ) -> None:
        """``pool``: the bounds all hosts share (None: the defaults). Callbacks (an
        exception is logged, never raised): ``on_connect_failure(alias, reason)`` once
        per failed connect;
        ``on_connect(alias)`` each time a new connection to ``alias`` is established;
        ``on_close(reason)`` each time the pool closes an idle or retired connection itself
        (``limits.CLOSE_REASONS``); ``on_jump_lost(alias)`` each time a connection of a
        jump host (some host's ``via``) drops without the pool closing it.

        Every ``via`` must name a host of ``hosts`` (load_inventory checked the chains)."""
        skip_disabled_log_calls()  # once per process: asyncssh's disabled logs cost nothing
        if credentials_dir is None and os.environ.get("CREDENTIALS_DIRECTORY"):
            credentials_dir = Path(os.environ["CREDENTIALS_DIRECTORY"])
        self._fleet = Fleet(
            pool or PoolSection(),
            FileCache(credentials_dir),
            on_connect_failure=on_connect_failure,
            on_connect=on_connect,
            on_close=on_close,
            on_jump_lost=on_jump_lost,
        )
        self._pools = {alias: Pool(alias, section, self._fleet) for alias, section in hosts.items()}
        self._sections = tuple(hosts.values())
        for alias, host_pool in self._pools.items():
            if via := hosts[alias].via:
                if via not in self._pools:
                    raise ValueError(f"host {alias!r}: via {via!r} is not a host here")
                host_pool.via = self._pools[via]
                host_pool.via.carries = True
        self._fleet.members = tuple(self._pools.values())
        self._closed = False

    def __repr__(self) -> str:
        return f"SshRunner(hosts={sorted(self._pools)!r})"

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        """Run ``command`` on ``host``; the timeout covers waiting, connecting and running."""
        if not command:
            raise ValueError("an empty command would open a login shell")  # a bug, not input
        pool = self._pool(host)
        started = time.monotonic()
        attempts: list[Session] = []  # one per channel open: did any get as far as running?
        session: Session | None = None
        try:
            async with asyncio.timeout(timeout):
                session = await pool.open_session(command, max_stdout, max_stderr, attempts)
                await session.finished
            if self._closed and session.exit_status is None and not session.over_cap:
                raise UpstreamError("pool_closed", retryable=False, ran=True)
            if session.error is not None:
                raise translate(session.error, ran=True) from session.error
            stdout, stderr = session.take_output()
            return RunResult(
                stdout=stdout,
                stderr=stderr,
                exit_status=session.result_status(),
                duration_seconds=time.monotonic() - started,
            )
        except TimeoutError as exc:
            raise translate(exc, ran=any(s.channel_opened for s in attempts)) from exc
        finally:
            if session is not None:
                session.stop()  # a no-op once the channel has closed by itself

    async def warm(self, host: str, *, evict: bool = False) -> None:
        """Open one connection to ``host`` ahead of the first call, unless one is open or
        ``max_connections_total`` are (then nothing is closed for it, unless ``evict``: the
        least recently used idle one, as a call does); raises like run()."""
        await self._pool(host).warm(evict=evict)

    async def close(self) -> None:
        """Close every connection; later calls raise UpstreamError("pool_closed")."""
        self._closed = True
        await self._fleet.close()
        await asyncio.gather(*(pool.close() for pool in self._pools.values()))

    def credential_expiries(self) -> dict[str, float]:
        """Seconds to expiry per client certificate (``sshadapter_credential_expiry_seconds``)."""
        return self._fleet.files.certificate_expiries(self._sections)

    def tunnels(self) -> dict[str, int]:
        """Host connections carried per jump host alias, only jump hosts carrying one or more
        (the ``sshadapter_ssh_tunnels`` gauge)."""
        return {alias: n for alias, pool in self._pools.items() if (n := pool.tunnels)}

    def connections(self) -> dict[str, int]:
        """Open connections per host alias, only hosts with one or more (the
        ``sshadapter_ssh_connections`` gauge: no series for the hosts not connected)."""
        return {alias: n for alias, pool in self._pools.items() if (n := pool.open_connections)}

    @property
    def open_connections(self) -> int:
        """Open connections of all hosts (``sshadapter_ssh_connections_open``)."""
        return self._fleet.connections

    @property
    def handshakes_in_flight(self) -> int:
        """Connects past the ``connect_concurrency`` bound now (a gauge)."""
        return self._fleet.handshakes_in_flight

    @property
    def known_hosts_parses(self) -> int:
        """How many times a known_hosts file was parsed (once per file version)."""
        return self._fleet.files.known_hosts_parses

    def _pool(self, host: str) -> Pool:
        if self._closed:
            raise UpstreamError("pool_closed", retryable=False, ran=False)
        try:
            return self._pools[host]
        except KeyError:
            # The command loader checks every alias against the config: this is a bug.
            raise ValueError(f"unknown host alias {host!r}") from None
