"""Judging one attempt's evidence: stages 6-10 of docs/protocol.md "Stages".

``evaluate`` is everything between "bytes came back" and "the data the agent
may see". It is pure (no I/O, the clock is an argument), so fixtures run
offline exactly as calls run in production. The order is the contract:
nothing is projected before the schema and the semantic checks have passed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
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
    """What one attempt proved: agent data, or a failure; its envelope once sealed.

    In a worker and in the daemon alike it comes back from judging sealed
    (``sealed_verdict``): the response line made, the data it holds dropped.
    """

    data: Mapping[str, Any] | None = None
    """The projected fields, on success only, until sealed."""
    failure: Failure | None = None
    """Why it failed: the agent's code, the operator's stage, reason and detail."""
    sealed: Sealed | None = None
    """Its envelope, once sealed (``seal_line``)."""

    @property
    def code(self) -> str | None:
        """The agent's error code; None on success."""
        return None if self.failure is None else self.failure.code

    @property
    def stage(self) -> str | None:
        """Where it failed; None on success."""
        return None if self.failure is None else self.failure.stage

    @property
    def reason(self) -> str | None:
        """Why, from the stage's finite list; None on success."""
        return None if self.failure is None else self.failure.reason

    @property
    def rejected(self) -> bool:
        """True when the output itself was refused (as opposed to a declared failure)."""
        return self.code == "INVALID_RESPONSE"

    def record(self) -> dict[str, Any]:
        """Its fields in an audit record (docs/audit.md "result", each attempt's
        ``verdict``): the failure's, or all null and empty for a success."""
        f = self.failure
        if f is None:
            return {
                "stage": None,
                "reason": None,
                "detail": "",
                "schema_path": "",
                "instance_path": "",
            }
        return {
            "stage": f.stage,
            "reason": f.reason,
            "detail": f.detail,
            "schema_path": f.schema_path,
            "instance_path": f.instance_path,
        }


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
        return Verdict(failure=failure_of(exc))
    except Exception as exc:  # a bug in the daemon, not the remote side's fault
        log.exception("internal error evaluating %s", op.name)
        return Verdict(failure=failure_of(exc))


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
        detail = f"exit status {run.exit_status}{f', {because}' if because else ''} = {meaning}"
        return Verdict(
            failure=Failure(meaning, CODES[meaning], "exit", "declared_exit_status", detail)
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
    """A new object with exactly the fields the contract exposes (docs/protocol.md "Stages", 10);
    of ``rows``, with `[agent] rows`, the first N."""
    shown = {name: value[name] for name in op.spec.agent.fields if name in value}
    if (top := op.spec.agent.rows) is not None:
        shown["rows"] = shown["rows"][:top]
    return shown


def seal(op: Operation, request_id: str, verdict: Verdict) -> dict[str, Any]:
    """The envelope for ``verdict``, checked against the tool's published envelope schema."""
    if verdict.data is not None:
        sealed = envelope.success(op.name, request_id, verdict.data)
    elif (failure := verdict.failure) is not None:
        sealed = envelope.failure(
            op.name, request_id, failure.code, failure.retryable, failure.hint
        )
    else:  # neither data nor a failure: a bug
        sealed = envelope.failure(op.name, request_id, "INTERNAL")
    if not op.host_guard.is_valid(sealed):  # the projection broke its own contract
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


def seal_fanout(
    op: Operation, request_id: str, counts: Mapping[str, Any], entries: Sequence[bytes]
) -> Sealed:
    """A fan-out's answer sealed as one host's is (``seal_line``): checked against the
    tool's envelope guard, serialized once. ``counts`` is its `data` but `results`;
    ``entries`` are the hosts shown (``envelope.host_entry``), each checked by the host
    guard when its own envelope was sealed, so none is parsed or checked again here."""
    checked = envelope.success(op.name, request_id, {**counts, "results": []})
    if len(entries) > op.spec.fanout.max_results or not op.envelope_guard.is_valid(checked):
        raise RuntimeError("fan-out envelope does not match its schema")  # a bug
    return Sealed("success", None, envelope.fanout_line(op.name, request_id, counts, entries))


def sealed_verdict(op: Operation, request_id: str, verdict: Verdict) -> Verdict:
    """``verdict`` with its response line, without the data the line now holds: how a
    judged verdict comes back, from an evaluation worker or from the daemon's own loop."""
    return Verdict(failure=verdict.failure, sealed=seal_line(op, request_id, verdict))


COMPACT_ABOVE_BYTES: Final = 64 * 1024  # a line this large may wait for an fsync before it goes
