"""Judging one attempt's evidence: stages 6-10 of docs/protocol.md "Stages".

``evaluate`` is everything between "bytes came back" and "the data the agent
may see". It is pure (no I/O, the clock is an argument), so fixtures run
offline exactly as calls run in production. The order is the contract:
nothing is projected before the schema and the semantic checks have passed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import orjson

from sshadapter.contract import envelope
from sshadapter.contract.codes import CODES
from sshadapter.contract.exitstatus import REFUSAL_PREFIX, REFUSED_STATUS
from sshadapter.contract.registry import Operation
from sshadapter.contract.semantic import run_checks
from sshadapter.errors import DispatchRefusal, EvidenceError, Failure, failure_of
from sshadapter.runners.interface import RunResult

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Sealed:
    """A verdict's envelope, as the response line the agent gets."""

    outcome: str
    code: str | None
    """The error code, on failure only."""
    line: bytes
    """The envelope's compact JSON and a newline."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt proved: agent data, or a failure code with the operator's reason."""

    data: Mapping[str, Any] | None = None
    """The projected fields, on success only."""
    code: str | None = None
    """Error code for the agent, on failure only."""
    retryable: bool = False
    stage: str | None = None
    """Where it failed (audit), e.g. `schema`."""
    reason: str | None = None
    """Why, from a finite list (audit, metric label)."""
    detail: str = ""
    """Free text for the operator: line numbers, validator message. Never for the agent."""
    schema_path: str = ""
    instance_path: str = ""
    sealed: Sealed | None = None
    """Its envelope, when already sealed where it was judged (a worker: see offload)."""

    @property
    def rejected(self) -> bool:
        """True when the output itself was refused (as opposed to a declared failure)."""
        return self.code == "INVALID_RESPONSE"

    @classmethod
    def failed(cls, failure: Failure) -> Verdict:
        return cls(
            code=failure.code,
            retryable=failure.retryable,
            stage=failure.stage,
            reason=failure.reason,
            detail=failure.detail,
            schema_path=failure.schema_path,
            instance_path=failure.instance_path,
        )


def evaluate(op: Operation, args: Mapping[str, Any], run: RunResult, now: datetime) -> Verdict:
    """Stages 6-10 for one attempt. Never raises: any input ends in a Verdict."""
    try:
        declared = check_exit_status(op, run)  # 6
        if declared is not None:
            return declared
        value = op.parser.parse(run.stdout)  # 7
        op.output_validator.validate(value)  # 8
        run_checks(op.spec.checks, value, args, now)  # 9
        return Verdict(data=project(op, value))  # 10
    except (EvidenceError, DispatchRefusal) as exc:
        return Verdict.failed(failure_of(exc))
    except Exception as exc:  # a bug in the daemon, not the remote side's fault
        log.exception("internal error evaluating %s", op.name)
        return Verdict.failed(failure_of(exc))


def check_exit_status(op: Operation, run: RunResult) -> Verdict | None:
    """Success is decided by exit status, never by whether stderr is empty.

    The byte caps come first: a runner that hit one closed the channel, so the
    exit status is missing and the size is the real reason.
    """
    if len(run.stdout) > op.spec.output.max_bytes:
        raise EvidenceError("parse", "too_large", f"stdout over {op.spec.output.max_bytes} bytes")
    if len(run.stderr) > op.spec.output.max_stderr_bytes:
        raise EvidenceError("parse", "stderr_too_large", f"over {op.spec.output.max_stderr_bytes}")
    if op.dispatched and dispatcher_refused(run):
        line = run.stderr.split(b"\n", 1)[0][:200].decode("utf-8", "replace")
        raise DispatchRefusal("remote_refused", line)
    found = op.exit_meaning(run.exit_status, run.stderr)
    if found is None:
        raise EvidenceError("exit", "undeclared_exit_status", f"exit status {run.exit_status}")
    meaning, because = found
    if meaning != "success":
        # A declared INVALID_RESPONSE (a stderr case's `otherwise`, typically) is a
        # rejection like any other: the service quarantines its bytes.
        return Verdict(
            code=meaning,
            retryable=CODES[meaning],
            stage="exit",
            reason="declared_exit_status",
            detail=f"exit status {run.exit_status}{f', {because}' if because else ''} = {meaning}",
        )
    if op.spec.output.stderr == "reject" and run.stderr:
        raise EvidenceError("parse", "stderr_not_empty", f"{len(run.stderr)} bytes on stderr")
    return None


def dispatcher_refused(run: RunResult) -> bool:
    """The host's dispatcher refused the command: its status and its stderr line.

    A dispatch host's operation cannot declare that status (policy.operation_policy);
    a program of its own exiting with it, without the line, stays undeclared.
    """
    return run.exit_status == REFUSED_STATUS and run.stderr.startswith(REFUSAL_PREFIX)


def project(op: Operation, value: Any) -> dict[str, Any]:
    """A new object with exactly the fields the contract exposes (docs/protocol.md "Stages", 10)."""
    return {name: value[name] for name in op.spec.agent.fields if name in value}


def seal(op: Operation, request_id: str, verdict: Verdict) -> dict[str, Any]:
    """The envelope for ``verdict``, checked against the tool's published envelope schema."""
    if verdict.data is not None:
        sealed = envelope.success(op.name, request_id, verdict.data)
    else:
        sealed = envelope.failure(
            op.name, request_id, verdict.code or "INTERNAL", verdict.retryable
        )
    if not op.envelope_guard.is_valid(sealed):  # the projection broke its own contract
        log.error("envelope for %s does not match its schema", op.name)
        return envelope.failure(op.name, request_id, "INTERNAL")
    return sealed


def seal_line(op: Operation, request_id: str, verdict: Verdict) -> Sealed:
    """``seal``, serialized: the response line (an exact-size copy when it is large)."""
    if verdict.sealed is not None:
        return verdict.sealed
    sealed = seal(op, request_id, verdict)
    line = orjson.dumps(sealed, option=orjson.OPT_APPEND_NEWLINE)
    if len(line) > COMPACT_ABOVE_BYTES:  # orjson's buffer is ~4x its output: keep a copy
        line = memoryview(line).tobytes()
    failed = sealed["outcome"] == "failure"
    return Sealed(sealed["outcome"], sealed["error"]["code"] if failed else None, line)


COMPACT_ABOVE_BYTES: Final = 64 * 1024  # a line this large may wait for an fsync before it goes
