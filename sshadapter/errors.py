"""Errors, split by who is at fault, and the one place each becomes a failure code.

    SshadapterError
    ├── ConfigError       the operator: a config file, command file, schema or fixture is wrong
    ├── RequestError      the caller: an unparseable request, unknown tool, bad arguments
    │   └── DeniedError   the caller may not call this tool
    ├── ApprovalError     no person approved this call (denied, timed out, invalidated)
    ├── UpstreamError     the remote side: cannot connect, timeout, channel failure
    ├── DispatchRefusal   the remote side's policy: the host's dispatcher will not run it
    ├── EvidenceError     the output: anything wrong with the bytes that came back
    └── DaemonError       the daemon itself
        ├── OverloadedError   every call slot is busy and the queue is full
        └── AuditError        a record could not be made durable

Dependencies' exceptions (orjson, jsonschema-rs, asyncssh, OS errors) are
translated into these in exactly one place each, ``raise ... from exc``.

``failure_of`` is the failure boundary (docs/protocol.md "Error codes"): every
error maps to the agent's code and ``retryable``, and to the operator's stage
and reason, there and nowhere else. Anything else that escapes is a bug: it
maps to INTERNAL with stage ``internal``. Stages and reasons are finite sets,
because they become Prometheus label values and audit fields. Free text
(``detail``) is for the audit trail only and never reaches the agent.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

from sshadapter.shown import one_line
from sshadapter.strict_json import REASONS as JSON_REASONS

Stage = Literal[
    "request",
    "authorize",
    "approval",
    "transport",
    "exit",
    "parse",
    "extract",
    "schema",
    "semantic",
    "admission",
    "audit",
    "internal",
    "shutdown",
]
# Stages of the evidence: where an output can be rejected (docs/protocol.md "Stages").
EVIDENCE_STAGES: Final[tuple[Stage, ...]] = ("exit", "parse", "extract", "schema", "semantic")
STAGES: Final[tuple[Stage, ...]] = (
    "request",
    "authorize",
    "approval",
    "transport",
    *EVIDENCE_STAGES,
    "admission",
    "audit",
    "internal",
    "shutdown",
)

# Reasons an output is rejected, by stage. Finite on purpose: they are metric labels.
EVIDENCE_REASONS: Final[dict[str, frozenset[str]]] = {
    "exit": frozenset({"undeclared_exit_status"}),
    # the strict JSON parser's own reasons, and the two of stderr judged at this stage
    "parse": frozenset({*JSON_REASONS, "stderr_not_empty", "stderr_too_large"}),
    "extract": frozenset(
        {
            "unmatched_line",
            "missing_header",
            "too_many_rows",
            "no_rows",
            "too_many_count_keys",
            "missing_key",
            "duplicate_key",
            "ambiguous_value",
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

# Why a request was refused before anything ran: stage `request`, except `not_allowed`
# (stage `authorize`). For a known tool they are audited; the others only logged.
REQUEST_REASONS: Final = frozenset(
    {
        # the strict JSON parser's reasons, prefixed: the line itself is not strict JSON
        *(f"json_{reason}" for reason in JSON_REASONS),
        "unknown_op",  # `op` is missing, not a string, or not call/list
        "unknown_request_key",  # a key the op does not take
        "malformed_call",  # `tool` not a string or `args` not an object
        "unknown_tool",
        "bad_arguments",  # the arguments fail the operation's parameter schema
        "unsendable_argument",  # a NUL byte: no remote command could ever receive it
        "command_too_long",  # the filled command is over argv.MAX_COMMAND_BYTES
        "not_allowed",  # DENIED: the caller's uid and groups are not in `allow`
        # `run_on` names no target the caller may use: it does not exist, or the operation
        # does not list it, or no grant gives it. One answer for all three (no existence
        # oracle); the audit keeps which one it was.
        "unknown_target",
        "target_not_granted",
        "target_not_listed",
        "too_many_hosts",  # the target has more hosts than the operation's [fanout] max_hosts
        "fanout_disabled",  # a group named for an operation that runs on one host per call
    }
)


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
        "tunnel_refused",  # a jump host (via) refused to forward to the target: never retried
        "connection_lost",  # the connection dropped while the command ran
        "command_timeout",  # the command ran longer than timeout_seconds; channel closed
        "no_credentials",  # the configured key file or credential cannot be read
        "host_certificate_refused",  # host certificate: no principals, not this host, expired
        "client_certificate_invalid",  # our certificate is expired or not yet valid: unsent
        "client_certificate_refused",  # the server refused our certificate: never retried
        "pool_closed",  # the daemon is shutting down
        "fanout_deadline",  # a fan-out's deadline_seconds passed before this host answered
        "fanout_cancelled",  # the fan-out was cancelled (client gone, drain) before it answered
    }
)

# The transport reasons a failed connect can end with (translate(connecting=True), or a
# jump host's own): sshadapter_ssh_connect_failures_total starts each at 0, so an alert's
# increase() sees the first one (docs/metrics.md "Series that start at 0").
CONNECT_REASONS: Final = (
    "no_credentials",
    "host_key_unknown",
    "host_key_mismatch",
    "host_certificate_refused",
    "auth_failed",
    "client_certificate_invalid",
    "client_certificate_refused",
    "tunnel_refused",
    "connect_timeout",
    "connect_refused",
    "connect_failed",
)

# Why a call to a dispatch host (`dispatch = true`) was refused; docs/dispatcher.md. Both
# give UPSTREAM_UNAVAILABLE, never retryable: the same command stays refused until an
# operator changes a policy, exactly like a refused key (auth_failed).
DISPATCH_REASONS: Final[dict[str, frozenset[str]]] = {
    "transport": frozenset({"policy_drift"}),  # the host's policy for it differs: not sent
    "exit": frozenset({"remote_refused"}),  # the host's dispatcher refused it, ran nothing
}

# Why a call that needs a person's approval did not run (stage `approval`): all DENIED,
# never retryable (docs/protocol.md "Approval").
APPROVAL_REASONS: Final = frozenset(
    {
        "approval_denied",  # an approver denied it
        "approval_timeout",  # nobody decided within its [approval] timeout_seconds
        "approval_invalidated",  # a reload changed the operation, its target or its caller
        "approval_cancelled",  # its caller went away, or the daemon shut down, while it waited
        "approval_mismatch",  # the command about to run is not the one approved (a bug)
    }
)

# Why an approver's `approve` or `deny` was refused: its answer's `refused`, and the
# `reason` of an `approval` record of event `refused` (docs/audit.md "approval").
APPROVER_REFUSALS: Final = frozenset(
    {
        "not_pending",  # no call waits under this request id: never was, decided, or timed out
        "own_call",  # the approver is the call's own caller (same uid)
        "digest_mismatch",  # the digest sent is not the pending command's
        "not_recorded",  # the decision could not be made durable: the call does not run
    }
)

# Why a wait for approval was cancelled: the `reason` of an `approval` record of event
# `cancelled` (docs/audit.md "approval"); the call answers `approval_cancelled` either way.
APPROVAL_CANCELLATIONS: Final = frozenset(
    {
        "caller_gone",  # its caller closed its connection: nobody would get the answer
        "shutdown",  # the daemon began its drain
    }
)

# Why the daemon itself could not answer (stages admission, audit, internal, shutdown).
DAEMON_REASONS: Final = frozenset(
    {
        "overloaded",  # admission: every slot busy and the queue full
        "approvals_full",  # admission: [approvals] max_pending calls already wait
        "intent_not_written",  # audit: the command was not run
        "result_not_written",  # audit: the command ran; its answer is withheld
        "bug",  # internal: an exception nothing maps; logged with its traceback
        "evaluation_timeout",  # internal: no evaluation worker judged the output in time
        "drain_deadline",  # shutdown: still running when drain_timeout_seconds passed
    }
)


class SshadapterError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(SshadapterError):
    """An operator mistake: names the file, the key and the reason.

    Its text is one line whatever the parts hold: a key is often a name from the file
    itself (a host, a group), a reason may quote a value or another program's message, and
    a file name is whatever the directory holds. A part with a character that is not
    printable is ``shown``; a printable one stays as it is, so a reason's advice about a
    pattern keeps its single backslashes. The attributes stay as given.
    """

    def __init__(self, file: str, key: str, reason: str) -> None:
        self.file = file
        self.key = key
        self.reason = reason
        parts = (file, key, reason) if key else (file, reason)
        super().__init__(": ".join(one_line(part) for part in parts))


class RequestError(SshadapterError):
    """A caller mistake. ``reason`` is for the audit trail; the caller only sees the code."""

    def __init__(
        self, reason: str, detail: str = "", hint: Mapping[str, str] | None = None
    ) -> None:
        if reason not in REQUEST_REASONS:
            raise ValueError(f"unknown request reason {reason}")  # a bug, not input
        self.reason = reason
        self.detail = detail
        self.hint = hint
        """What the agent may be told to correct (``error.hint``): built only from the
        operation's schema and the agent's own keys (params.argument_hint), or None."""
        super().__init__(f"{reason}: {detail}" if detail else reason)


class DeniedError(RequestError):
    """The caller's uid and groups are not allowed to call this tool."""

    def __init__(self) -> None:
        super().__init__("not_allowed")


class UpstreamError(SshadapterError):
    """The remote side gave no usable answer: always UPSTREAM_UNAVAILABLE for the agent.

    ``ran`` says whether the command may have started: a failure before the
    channel opened can be retried for any operation, one after it only for an
    idempotent one (docs/command-files.md "retry").
    """

    def __init__(self, reason: str, *, retryable: bool, ran: bool, detail: str = "") -> None:
        if reason not in TRANSPORT_REASONS:
            raise ValueError(f"unknown transport reason {reason}")  # a bug, not input
        self.reason = reason
        self.retryable = retryable
        self.ran = ran
        self.detail = detail
        super().__init__(f"transport/{reason}: {detail}" if detail else f"transport/{reason}")


class DispatchRefusal(SshadapterError):
    """A dispatch host will not run this command: its dispatcher refused it
    (``remote_refused``, stage ``exit``), or its policy for the operation differs from
    the daemon's (``policy_drift``, stage ``transport``: nothing was sent)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        stage = next((s for s, reasons in DISPATCH_REASONS.items() if reason in reasons), None)
        if stage is None:
            raise ValueError(f"unknown dispatch reason {reason}")  # a bug, not input
        self.stage: Stage = "exit" if stage == "exit" else "transport"
        self.reason = reason
        self.detail = detail
        super().__init__(f"{self.stage}/{reason}: {detail}" if detail else f"{stage}/{reason}")


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


class DaemonError(SshadapterError):
    """The daemon could not do its part; the caller is not at fault."""


class OverloadedError(DaemonError):
    """Every call slot is busy and the queue is full (``overloaded``), or too many calls
    already wait for a person's approval (``approvals_full``)."""

    def __init__(self, reason: str = "overloaded") -> None:
        if reason not in DAEMON_REASONS:
            raise ValueError(f"unknown admission reason {reason}")  # a bug, not input
        self.reason = reason
        super().__init__(f"admission/{reason}")


class ApprovalError(SshadapterError):
    """The call needs a person's approval and did not get it: DENIED, never retryable."""

    def __init__(self, reason: str, detail: str = "") -> None:
        if reason not in APPROVAL_REASONS:
            raise ValueError(f"unknown approval reason {reason}")  # a bug, not input
        self.reason = reason
        self.detail = detail
        super().__init__(f"approval/{reason}: {detail}" if detail else f"approval/{reason}")


class AuditError(DaemonError):
    """A record could not be made durable. ``reason`` says which record it was."""

    def __init__(self, reason: str, detail: str) -> None:
        if reason not in DAEMON_REASONS:
            raise ValueError(f"unknown audit reason {reason}")  # a bug, not input
        self.reason = reason
        self.detail = detail
        super().__init__(f"audit/{reason}: {detail}")


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a call ended without data: the agent's half (code, retryable), the operator's rest."""

    code: str
    """From the closed list of docs/protocol.md "Error codes"."""
    retryable: bool
    """Whether the agent may try again (the envelope's ``retryable``)."""
    stage: Stage
    """Where it failed (docs/protocol.md "Stages"): audit field and metric label."""
    reason: str
    """From the finite list of its stage: audit field and metric label."""
    detail: str = ""
    """Free text for the audit trail: never for the agent."""
    schema_path: str = ""
    """For a schema failure, the JSON pointer into the schema; else empty."""
    instance_path: str = ""
    """The JSON pointer into the value that failed (schema, semantic); else empty."""
    hint: Mapping[str, str] | None = None
    """INVALID_REQUEST at stage 3 only: the envelope's ``error.hint`` (RequestError.hint)."""


def failure_of(exc: BaseException) -> Failure:
    """The failure boundary: the one mapping from an error to what the call answers."""
    if isinstance(exc, DeniedError):
        return Failure("DENIED", False, "authorize", exc.reason, exc.detail)
    if isinstance(exc, RequestError):
        return Failure("INVALID_REQUEST", False, "request", exc.reason, exc.detail, hint=exc.hint)
    if isinstance(exc, UpstreamError):
        return Failure("UPSTREAM_UNAVAILABLE", exc.retryable, "transport", exc.reason, exc.detail)
    if isinstance(exc, DispatchRefusal):
        return Failure("UPSTREAM_UNAVAILABLE", False, exc.stage, exc.reason, exc.detail)
    if isinstance(exc, EvidenceError):
        return Failure(
            "INVALID_RESPONSE",
            False,
            exc.stage,
            exc.reason,
            exc.detail,
            exc.schema_path,
            exc.instance_path,
        )
    if isinstance(exc, ApprovalError):
        return Failure("DENIED", False, "approval", exc.reason, exc.detail)
    if isinstance(exc, OverloadedError):
        return Failure("OVERLOADED", True, "admission", exc.reason)
    if isinstance(exc, AuditError):
        return Failure("INTERNAL", False, "audit", exc.reason, exc.detail)
    if _cancelled(exc):  # cut by the drain deadline on shutdown
        return Failure("INTERNAL", False, "shutdown", "drain_deadline")
    return Failure("INTERNAL", False, "internal", "bug", f"{type(exc).__name__}")


def _cancelled(exc: BaseException) -> bool:
    """A task cancelled by asyncio. Only a process that loaded asyncio has one, so the pure
    engine (evaluation workers, ``sshadapter check``) asks without loading the event loop."""
    asyncio = sys.modules.get("asyncio")
    return asyncio is not None and isinstance(exc, asyncio.CancelledError)
