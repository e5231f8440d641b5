"""Prometheus metrics of calls and rejections, on a loopback listener.

Reference: docs/metrics.md. Every label value comes from a finite set:
tool names from the loaded registry (``sshadapter`` for requests that name no
known tool), outcomes and codes from the envelope contract, stages and
reasons from the finite lists in ``errors``, host aliases and certificate sources from the config.
A series per host exists only for a host connected now, a jump host or a dispatch host:
what a fan-out to many unreachable hosts leaves behind is counts by reason.
Nothing a client or a remote side sends becomes a label.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from sshadapter import __version__
from sshadapter.contract.codes import CODES, SYSTEM_TOOL
from sshadapter.errors import CONNECT_REASONS
from sshadapter.runners.ssh.limits import CLOSE_REASONS

# Seconds: a warm SSH call takes ~4 ms; timeouts go up to minutes.
DURATION_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Why the daemon closes an agent connection (sshadapter_client_drops_total{reason}).
CLIENT_DROP_REASONS: Final = (
    "idle_timeout",  # no request for idle_timeout_seconds
    "read_timeout",  # a request line not finished within read_timeout_seconds
    "request_too_large",  # a line over max_request_bytes: answered, then dropped
    "write_timeout",  # the answer not taken within write_timeout_seconds
    "connection_limit",  # over max_connections: answered OVERLOADED, then dropped
)
# Every (outcome, code) of sshadapter_calls_total: a success, or a failure with one of the
# codes. know_tools starts these at 0 for each loaded tool: 8 series a tool, so an alert's
# increase() sees a tool's first failure (docs/metrics.md "Series that start at 0").
CALL_OUTCOMES: Final = (("success", "none"), *(("failure", code) for code in CODES))
RELOAD_RESULTS: Final = ("success", "failure")
# Bytes of stdout: from a one-line fact to the 16 MiB ceiling.
OUTPUT_BUCKETS: Final = (64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)


class _ConnectionsCollector(Collector):
    """A count per host alias (open SSH connections, tunnels), read from the runner at
    scrape time."""

    def __init__(
        self,
        source: Callable[[], Mapping[str, int]],
        name: str = "sshadapter_ssh_connections",
        text: str = "Open SSH connections per host.",
    ) -> None:
        self._source = source
        self._name = name
        self._text = text

    def collect(self):  # type: ignore[no-untyped-def]
        family = GaugeMetricFamily(self._name, self._text, labels=["host"])
        for host, count in sorted(self._source().items()):
            family.add_metric([host], count)
        yield family


class _CredentialExpiryCollector(Collector):
    """Seconds to expiry per client certificate, read from the runner at scrape time."""

    def __init__(self, source: Callable[[], Mapping[str, float]]) -> None:
        self._source = source

    def collect(self):  # type: ignore[no-untyped-def]
        family = GaugeMetricFamily(
            "sshadapter_credential_expiry_seconds",
            "Seconds until each client certificate expires (negative: expired; +Inf: forever).",
            labels=["credential"],
        )
        for credential, seconds in sorted(self._source().items()):
            family.add_metric([credential], seconds)
        yield family


class Metrics:
    """The daemon's metrics, in a registry of their own (tests make one each)."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # *_created: noise
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.calls = Counter(
            "sshadapter_calls",
            "Calls answered, by outcome and error code.",
            ["tool", "outcome", "code"],
            registry=r,
        )
        self.rejections = Counter(
            "sshadapter_rejections",
            "Outputs rejected as bad evidence (INVALID_RESPONSE), by stage and reason.",
            ["tool", "stage", "reason"],
            registry=r,
        )
        self.duration = Histogram(
            "sshadapter_call_duration_seconds",
            "Time from request to response.",
            ["tool"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.output_bytes = Histogram(
            "sshadapter_output_bytes",
            "Bytes of stdout per attempt.",
            ["tool"],
            buckets=OUTPUT_BUCKETS,
            registry=r,
        )
        self.inflight = Gauge("sshadapter_inflight_calls", "Calls running or waiting.", registry=r)
        # No host label: 1,000 unreachable hosts would leave 1,000 series behind for good.
        # The hosts are in the audit and, for a call of one host, in its log line.
        self.connect_failures = Counter(
            "sshadapter_ssh_connect_failures",
            "Failed SSH connection attempts, by reason (which hosts: the audit).",
            ["reason"],
            registry=r,
        )
        self.audit_failures = Counter(
            "sshadapter_audit_write_failures",
            "Audit records that could not be written.",
            registry=r,
        )
        self.dispatch_checks = Counter(
            "sshadapter_dispatch_policy_checks",
            "Policy checks of dispatch hosts, by result (sshadapter/daemon/drift.py RESULTS).",
            ["host", "result"],
            registry=r,
        )
        self.fanout_hosts = Counter(
            "sshadapter_fanout_hosts",
            "Hosts answered inside fan-out calls, by outcome and error code (empty on success).",
            ["tool", "outcome", "code"],
            registry=r,
        )
        self.dispatch_refusals = Counter(
            "sshadapter_dispatch_refusals",
            "Calls to dispatch hosts refused: remote_refused by the host, policy_drift unsent.",
            ["tool", "reason"],
            registry=r,
        )
        self.dispatch_drifted = Gauge(
            "sshadapter_dispatch_drifted_operations",
            "Operations refused as policy_drift because the host's policy differs.",
            ["host"],
            registry=r,
        )
        self.client_drops = Counter(
            "sshadapter_client_drops",
            "Agent connections the daemon closed, by reason.",
            ["reason"],
            registry=r,
        )
        self.connections_open = Gauge(
            "sshadapter_ssh_connections_open",
            "Open SSH connections, all hosts together (max_connections_total bounds them).",
            registry=r,
        )
        self.handshakes_in_flight = Gauge(
            "sshadapter_ssh_handshakes_in_flight",
            "SSH connects in flight (connect_concurrency bounds them).",
            registry=r,
        )
        self.connections_closed = Counter(
            "sshadapter_ssh_connections_closed",
            "SSH connections the pool closed itself: idle too long, LRU at the total cap, "
            "or retired for channels its host left open.",
            ["reason"],
            registry=r,
        )
        self.approvals_pending = Gauge(
            "sshadapter_approvals_pending",
            "Calls waiting for a person's approval ([approvals] max_pending bounds them).",
            registry=r,
        )
        self.approvals = Counter(
            "sshadapter_approvals",
            "Approvals ended, by outcome (approvals.OUTCOMES); refused: an approver's request "
            "that decided nothing, or a call over max_pending.",
            ["tool", "outcome"],
            registry=r,
        )
        self.jump_lost = Counter(
            "sshadapter_ssh_jump_connections_lost",
            "Connections of a jump host (via) that dropped, taking the tunnelled ones along.",
            ["host"],
            registry=r,
        )
        self.reloads = Counter(
            "sshadapter_reloads", "Reloads of commands and schemas.", ["result"], registry=r
        )
        self._children: dict[tuple[str, str, str | None], tuple[Any, Any]] = {}
        for reason in CLIENT_DROP_REASONS:  # every series exists from the start, at 0
            self.client_drops.labels(reason)
        for reason in CLOSE_REASONS:
            self.connections_closed.labels(reason)
        for reason in CONNECT_REASONS:
            self.connect_failures.labels(reason)
        for result in RELOAD_RESULTS:
            self.reloads.labels(result)
        self.know_tools(())
        # process_* (CPU, memory, file descriptors, start time): the SshadapterDown runbook
        # and the dashboard read them; on a system without /proc it exports nothing.
        ProcessCollector(registry=r)
        build = Gauge(
            "sshadapter_build_info", "Version of the running daemon.", ["version"], registry=r
        )
        build.labels(__version__).set(1)

    def know_tools(self, names: Iterable[str]) -> None:
        """Start every calls_total series of these tools (and of ``sshadapter``) at 0: at
        start and at each reload, so a tool's first failure is an increase, not a new series
        that increase() reads as 0. A tool a reload removes keeps its series, at its count."""
        for tool in (SYSTEM_TOOL, *names):
            for outcome, code in CALL_OUTCOMES:
                self.calls.labels(tool, outcome, code)

    def watch_connections(self, source: Callable[[], Mapping[str, int]]) -> None:
        self.registry.register(_ConnectionsCollector(source))

    def watch_credentials(self, source: Callable[[], Mapping[str, float]]) -> None:
        self.registry.register(_CredentialExpiryCollector(source))

    def watch_tunnels(self, source: Callable[[], Mapping[str, int]]) -> None:
        self.registry.register(
            _ConnectionsCollector(
                source,
                "sshadapter_ssh_tunnels",
                "Host connections carried per jump host (via).",
            )
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def observe_call(
        self,
        tool: str,
        outcome: str,
        code: str | None,
        seconds: float,
        rejection: tuple[str, str] | None = None,
    ) -> None:
        """One answered call; ``rejection`` (stage, reason) only when the evidence was refused.

        A declared failure (NOT_FOUND, a refused request, DENIED) is an answer, not bad
        evidence: it is counted in calls_total only, so the rejections alert means what
        it says (docs/metrics.md).
        """
        key = (tool, outcome, code)
        children = self._children.get(key)
        if children is None:  # labels() takes a lock and builds a tuple: once per label set
            children = (
                self.calls.labels(tool, outcome, code or "none"),
                self.duration.labels(tool),
            )
            self._children[key] = children
        children[0].inc()
        children[1].observe(seconds)
        if rejection is not None:
            self.rejections.labels(tool, *rejection).inc()
