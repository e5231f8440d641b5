"""Building a daemon from one configuration, and running it (``sshadapter serve``).

``assemble`` is the one wiring production, the demo and the tests share; tests inject
a runner, a clock, a sleep and a judge. ``server.load`` reads the command files and
builds each dispatch host's policy, all or nothing, here and at every reload.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import start_http_server

from sshadapter.config import Config, load_config
from sshadapter.daemon.audit import AuditLog
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.quarantine import Quarantine
from sshadapter.daemon.server import Daemon, load
from sshadapter.daemon.service import Service, Sleep
from sshadapter.daemon.unix_socket import open_listening_socket, unlink_if_ours
from sshadapter.errors import ConfigError
from sshadapter.runners.interface import Runner
from sshadapter.runners.ssh.runner import SshRunner


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
    the policy monitor's (when its hosts were last checked). Each part is given to the
    pieces that use it: the Service and the Daemon share them. Raises ConfigError
    naming the path and the reason when a file or directory cannot be used.
    """
    loaded = load(config)
    registry, policies = loaded.registry, loaded.policies
    metrics = Metrics()
    audit = AuditLog(config.audit.path, fsync=config.audit.fsync)
    audit.open()
    try:
        quarantine = Quarantine(config.audit.quarantine_dir, config.audit.quarantine_max_bytes)
        quarantine.open()
    except BaseException:
        audit.close()
        raise
    if runner is None:
        ssh = SshRunner(
            config.hosts,
            on_connect_failure=lambda host, reason: metrics.connect_failures.labels(
                host, reason
            ).inc(),
        )
        metrics.watch_connections(ssh.connections)
        runner = ssh
    monitor = None
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
        default_allow=config.server.allow,
        max_request_bytes=config.server.max_request_bytes,
        max_concurrent_calls=config.server.max_concurrent_calls,
        max_queue=config.server.max_queue,
        metrics=metrics,
        quarantine=quarantine,
        clock=clock,
        sleep=sleep,
        judge=judge,
        dispatch=monitor,
        inventory=loaded.inventory,
        grants=loaded.grants,
        max_fanout_hosts_in_flight=config.server.max_fanout_hosts_in_flight,
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
