"""Building a daemon from one configuration, and running it (``sshadapter serve``).

``assemble`` is the one wiring production, the demo and the tests share; tests inject
a runner, a clock, a sleep and a judge. ``server.load`` reads the command files and
builds each dispatch host's policy, all or nothing, here and at every reload.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from prometheus_client import start_http_server

from sshadapter.audit.quarantine import Quarantine
from sshadapter.audit.writer import AuditLog
from sshadapter.config import Config, load_config
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.server import Daemon, load
from sshadapter.daemon.service import Service, Sleep, Timing
from sshadapter.daemon.unix_socket import open_listening_socket, unlink_if_ours
from sshadapter.errors import ConfigError
from sshadapter.inventory.fleet import Inventory
from sshadapter.runners.interface import Runner
from sshadapter.runners.ssh.runner import SshRunner

log = logging.getLogger(__name__)

# The cyclic garbage collector's youngest generation is collected after this many more
# container objects were made than freed (CPython's default: 700). A warm fan-out holds
# every host's tasks, channels and records alive until its answer, so at 700 the
# collector ran ~130 times per 5,000 hosts, and each of its older collections walks every
# connection's objects: 0.13-0.16 of the daemon's ~1 ms of CPU per warm fan-out host
# (bench_fleet's loopback fleet, N=128, gc.callbacks timing), 0.03 ms at this threshold.
# The garbage it lets wait is at most this many objects (a few MB): nearly all of the
# daemon's objects are freed by their reference count, not by this collector.
GC_YOUNG_THRESHOLD: Final = 10_000


def warm_aliases(config: Config, inventory: Inventory, file: str = "<config>") -> list[str]:
    """The hosts ``[pool] warm`` names (host aliases, or groups for all their members), or
    ConfigError for a name that is neither."""
    for name in config.pool.warm:
        if not inventory.exists(name):
            raise ConfigError(file, "pool.warm", f"{name!r} is no host alias and no group")
    return list(dict.fromkeys(a for name in config.pool.warm for a in inventory.members(name)))


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the (soft, hard) limits then.

    systemd starts services with a soft limit of 1024 and asks programs that use no
    select() to raise it themselves: asyncio uses epoll, the pool poll(). The unit's
    LimitNOFILE= usually has done it already. A refusal is logged, not fatal.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:
            log.warning("open files limit stays %d (hard %d): %s", soft, hard, exc)
            return soft, hard
        log.info("open files limit raised from %d to %d", soft, hard)
        soft = hard
    return soft, hard


def tune_garbage_collector() -> tuple[int, int, int]:
    """Collect the youngest generation after GC_YOUNG_THRESHOLD allocations, the older
    two as CPython does; the thresholds then."""
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    return gc.get_threshold()


def assemble(
    config: Config,
    *,
    runner: Runner | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    sleep: Sleep = asyncio.sleep,
    judge: Judge | None = None,
    dispatch_clock: Callable[[], float] | None = None,
    config_path: Path | None = None,
) -> Daemon:
    """Everything a daemon is made of, from one configuration: serve, demo and tests use it.

    ``runner`` replaces the SSH runner (tests); ``clock`` and ``sleep`` are the time the
    freshness checks and the retry backoff see; ``judge`` replaces the one the
    configuration's ``evaluation_workers`` gives (tests watch it); ``dispatch_clock`` is
    the policy monitor's (when its hosts were last checked); ``config_path`` is the file
    SIGHUP reads again and errors name. Each part is given to the pieces that use it: the Service
    and the Daemon share them. Raises ConfigError naming the path and the reason when a
    file or directory cannot be used.
    """
    loaded = load(config, str(config_path or "<config>"))
    registry, policies = loaded.registry, loaded.policies
    warm = warm_aliases(config, loaded.inventory, str(config_path or "<config>"))
    metrics = Metrics()
    audit = AuditLog(config.audit.path, fsync=config.audit.fsync)
    audit.open()
    try:
        quarantine = Quarantine(config.audit.quarantine_dir, config.audit.quarantine_max_bytes)
        quarantine.open()
    except BaseException:
        audit.close()
        raise
    monitor: PolicyMonitor | None = None

    def connected(alias: str) -> None:
        """A new connection: a dispatch host's policy is checked (unless one is under way)."""
        if monitor is not None:
            monitor.connected(alias)

    if runner is None:
        ssh = SshRunner(
            config.hosts,
            pool=config.pool,
            on_connect_failure=lambda _host, reason: metrics.connect_failures.labels(reason).inc(),
            on_connect=connected,
            on_close=lambda reason: metrics.connections_closed.labels(reason).inc(),
            on_jump_lost=lambda host: metrics.jump_lost.labels(host).inc(),
        )
        metrics.watch_connections(ssh.connections)
        metrics.watch_credentials(ssh.credential_expiries)
        metrics.watch_tunnels(ssh.tunnels)
        metrics.connections_open.set_function(lambda: ssh.open_connections)
        metrics.handshakes_in_flight.set_function(lambda: ssh.handshakes_in_flight)
        runner = ssh
    if policies:  # docs/dispatcher.md "Drift"
        monitor = PolicyMonitor(
            runner,
            metrics,
            clock=dispatch_clock or time.monotonic,
            open_hosts=connected_hosts(runner),
        )
        monitor.expect(policies)
    judge = judge or Judge(config.server.evaluation_workers)
    service = Service(
        registry,
        runner,
        audit,
        config.server,
        metrics=metrics,
        quarantine=quarantine,
        judge=judge,
        dispatch=monitor,
        inventory=loaded.inventory,
        grants=loaded.grants,
        approvals=config.approvals,
        timing=Timing(clock, sleep),
    )
    return Daemon(
        config,
        service,
        runner=runner,
        audit=audit,
        metrics=metrics,
        judge=judge,
        dispatch=monitor,
        config_path=config_path,
        warm=warm,
    )


def connected_hosts(runner: Runner) -> Callable[[], Iterable[str]] | None:
    """The aliases with an open connection, from a runner that keeps connections
    (``connections()``: SshRunner, or a test's runner), for the policy monitor; None for
    one that keeps none (a ScriptedRunner: no host counts as connected)."""
    connections = getattr(runner, "connections", None)
    if connections is None:
        return None
    return lambda: [alias for alias, count in connections().items() if count]


async def run_daemon(config_path: Path | None) -> int:
    """`sshadapter serve`: load everything, bind, serve until told to stop."""
    config, _ = load_config(config_path)
    daemon = assemble(config, config_path=config_path)
    raise_open_files_limit()  # 512 SSH connections and 256 agents pass systemd's 1024
    tune_garbage_collector()  # a fan-out's objects live until its answer
    if (metrics := config.metrics.address) is not None:  # its form checked by load_config
        host, port = metrics
        try:
            start_http_server(port, addr=host, registry=daemon.metrics.registry)
        except OSError as exc:
            daemon.audit.close()
            reason = f"cannot listen on {config.metrics.listen}: {exc.strerror or exc}"
            file = str(config_path or "<defaults>")
            raise ConfigError(file, "metrics.listen", reason) from exc
    sock, bound_here = open_listening_socket(config)
    inode = os.lstat(config.server.socket_path).st_ino if bound_here else None
    try:
        await daemon.serve(sock)
    finally:
        sock.close()
        if bound_here:
            unlink_if_ours(config.server.socket_path, inode)
    return 0
