"""Errors, split by who is at fault.

    SshadapterError
    ├── ConfigError      the operator: a config file, command file, schema or fixture is wrong
    ├── RequestError     the caller: an unparseable request, unknown tool, bad arguments
    ├── UpstreamError    the remote side: cannot connect, timeout, channel failure
    └── EvidenceError    the output: anything wrong with the bytes that came back

Dependencies' exceptions (orjson, jsonschema, asyncssh) are translated into
these in exactly one place each, ``raise ... from exc``. Every error that can
end a call carries a ``stage`` and a ``reason`` from a finite set, because both
become Prometheus label values and audit fields. Free text (``detail``) is for
the audit trail only and never reaches the agent.
"""

from __future__ import annotations

from typing import Final, Literal

Stage = Literal[
    "request", "authorize", "transport", "exit", "parse", "extract", "schema", "semantic"
]
STAGES: Final[tuple[Stage, ...]] = (
    "request",
    "authorize",
    "transport",
    "exit",
    "parse",
    "extract",
    "schema",
    "semantic",
)

# Reasons an output is rejected, by stage. Finite on purpose: they are metric labels.
EVIDENCE_REASONS: Final[dict[str, frozenset[str]]] = {
    "exit": frozenset({"undeclared_exit_status"}),
    "parse": frozenset(
        {
            "too_large",
            "bom",
            "not_utf8",
            "syntax",
            "trailing_data",
            "empty",
            "duplicate_name",
            "non_finite_number",
            "number_out_of_range",
            "lone_surrogate",
            "too_deep",
            "stderr_not_empty",
            "stderr_too_large",
        }
    ),
    "extract": frozenset(
        {
            "unmatched_line",
            "missing_header",
            "too_many_rows",
            "no_rows",
            "too_many_lines",
            "missing_key",
            "duplicate_key",
            "bad_type",
            "not_utf8",
            "control_character",
            "too_large",
            "empty",
        }
    ),
    "schema": frozenset({"schema_mismatch"}),
    "semantic": frozenset(
        {
            "not_equal",
            "timestamp_invalid",
            "timestamp_stale",
            "timestamp_future",
        }
    ),
}


# Why a call got no usable answer from the remote side (stage `transport`).
TRANSPORT_REASONS: Final = frozenset(
    {
        "connect_refused",  # nothing listens (retryable)
        "connect_timeout",  # TCP or SSH handshake took longer than connect_timeout_seconds
        "connect_failed",  # other network error before the session (DNS, unreachable)
        "host_key_mismatch",  # known_hosts says otherwise: never retried
        "host_key_unknown",  # the host is not in known_hosts: never retried
        "auth_failed",  # the server refused our key: never retried
        "channel_open_failed",  # the server refused a session channel (MaxSessions)
        "connection_lost",  # the connection dropped while the command ran
        "command_timeout",  # the command ran longer than timeout_seconds; channel closed
        "no_credentials",  # the configured key file or credential cannot be read
        "pool_closed",  # the daemon is shutting down
    }
)


# Why a call to a dispatch host (`dispatch = true`) was refused; docs/dispatcher.md. Both
# give UPSTREAM_UNAVAILABLE, never retryable: the same command stays refused until an
# operator changes a policy, exactly like a refused key (auth_failed).
DISPATCH_REASONS: Final[dict[str, frozenset[str]]] = {
    "transport": frozenset({"policy_drift"}),  # the host's policy for it differs: not sent
    "exit": frozenset({"remote_refused"}),  # the host's dispatcher refused it, ran nothing
}


class SshadapterError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SshadapterError):
    """An operator mistake: names the file, the key and the reason."""

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file = file
        self.key = key
        self.reason = reason
        super().__init__(f"{file}: {key}: {reason}" if key else f"{file}: {reason}")


class RequestError(SshadapterError):
    """A caller mistake. ``reason`` is for the audit trail; the caller only sees the code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class UpstreamError(SshadapterError):
    """The remote side gave no usable answer: always UPSTREAM_UNAVAILABLE for the agent.

    ``ran`` says whether the command may have started: a failure before the
    channel opened can be retried for any operation, one after it only for an
    idempotent one (DESIGN.md "Operator contract").
    """

    def __init__(self, reason: str, *, retryable: bool, ran: bool, detail: str = "") -> None:
        if reason not in TRANSPORT_REASONS:
            raise ValueError(f"unknown transport reason {reason}")  # a bug, not input
        self.code = "UPSTREAM_UNAVAILABLE"
        self.stage: Stage = "transport"
        self.reason = reason
        self.retryable = retryable
        self.ran = ran
        self.detail = detail
        super().__init__(f"transport/{reason}: {detail}" if detail else f"transport/{reason}")


class EvidenceError(SshadapterError):
    """The output cannot be trusted. Always INVALID_RESPONSE for the agent."""

    def __init__(
        self,
        stage: Stage,
        reason: str,
        detail: str = "",
        *,
        schema_path: str = "",
        instance_path: str = "",
    ) -> None:
        if reason not in EVIDENCE_REASONS.get(stage, ()):
            raise ValueError(f"unknown evidence reason {stage}/{reason}")  # a bug, not input
        self.stage = stage
        self.reason = reason
        self.detail = detail
        self.schema_path = schema_path
        self.instance_path = instance_path
        super().__init__(f"{stage}/{reason}: {detail}" if detail else f"{stage}/{reason}")
