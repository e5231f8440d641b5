"""What the audit trail says of one call: its attempts, and its intent and result records.

Reference: docs/audit.md ("intent", "result", "attempts"); the records are checked
against docs/audit-records.schema.json by the tests. Each record is built here and
nowhere else: an attempt from a typed ``Attempt``, a verdict's fields from
``Verdict.record``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from sshadapter.audit.writer import now_text
from sshadapter.contract.evaluate import Verdict
from sshadapter.contract.registry import Operation
from sshadapter.daemon.access import Peer
from sshadapter.daemon.progress import NO_PROGRESS, Progress
from sshadapter.errors import ApprovalError, UpstreamError, failure_of
from sshadapter.inventory.fleet import host_set_digest
from sshadapter.runners.interface import RunResult


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the audit says of the bytes that came back: sizes and digests, never the bytes."""

    exit_status: int | None
    """The remote exit status; None when there was none (a signal, a byte cap)."""
    stdout_bytes: int
    """Bytes received on stdout (at most the cap plus one)."""
    stdout_sha256: str
    """Their sha256, hex."""
    stderr_bytes: int
    """Bytes received on stderr (at most the cap plus one)."""
    stderr_sha256: str
    """Their sha256, hex."""

    @classmethod
    def of(cls, run: RunResult) -> Evidence:
        return cls(
            run.exit_status,
            len(run.stdout),
            hashlib.sha256(run.stdout).hexdigest(),
            len(run.stderr),
            hashlib.sha256(run.stderr).hexdigest(),
        )


def command_digest(command: str) -> str:
    """The digest an approver approves: sha256 of the exact remote command, hex."""
    return hashlib.sha256(command.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Approval:
    """Who approved a call's command (docs/protocol.md "Approval"), kept with the call
    until its intent records it."""

    approver: Peer
    """The approver, from the kernel (SO_PEERCRED)."""
    digest: str
    """``command_digest`` of the command approved: the command about to run must have it."""

    def check(self, command: str) -> None:
        """Refuse to run anything but the approved command (asked before each intent)."""
        if command_digest(command) != self.digest:
            raise ApprovalError("approval_mismatch", "the command is not the one approved")

    def record(self) -> dict[str, Any]:
        """The intent's ``approval`` field."""
        return {"approver": who(self.approver), "digest": self.digest}


def who(peer: Peer) -> dict[str, int]:
    """A process as records name it: ``uid``, ``gid`` (primary) and ``pid``."""
    return {"uid": peer.uid, "gid": peer.gid, "pid": peer.pid}


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of the command, as a result record lists it (docs/audit.md "attempts")."""

    duration_seconds: float
    """From the attempt's start to its verdict, rounded to the microsecond."""
    verdict: Verdict
    """What it proved, as far as the record says it (``Verdict.record``): its failure, never
    its envelope (a fan-out host's would hold its data until the whole call ends)."""
    evidence: Evidence | None = None
    """What came back, when output came back."""
    transport_error: str | None = None
    """The transport's reason when the run gave no result."""
    quarantine: Mapping[str, str | None] | None = None
    """The rejected output's files in the quarantine directory, by stream (None: not kept)."""
    interrupted: str | None = None
    """The reason of a daemon-side failure that cut the attempt short (``bug``,
    ``drain_deadline``)."""

    def record(self) -> dict[str, Any]:
        """Its element of the result's ``attempts`` (docs/audit-records.schema.json)."""
        record: dict[str, Any] = {"duration_seconds": self.duration_seconds}
        if (evidence := self.evidence) is None:
            record["exit_status"] = None
        else:
            record.update(
                exit_status=evidence.exit_status,
                stdout_bytes=evidence.stdout_bytes,
                stdout_sha256=evidence.stdout_sha256,
                stderr_bytes=evidence.stderr_bytes,
                stderr_sha256=evidence.stderr_sha256,
            )
        record["transport_error"] = self.transport_error
        if self.quarantine is not None:
            record["quarantine"] = dict(self.quarantine)
        if self.interrupted is not None:
            record["interrupted"] = self.interrupted
        record["verdict"] = self.verdict.record()
        return record


@dataclass(slots=True)
class Running:
    """The attempt under way: what the stages have learnt of it so far."""

    number: int
    """From 1."""
    started: float = field(default_factory=time.monotonic)
    evidence: Evidence | None = None
    transport_error: str | None = None
    quarantine: Mapping[str, str | None] | None = None

    def done(self, verdict: Verdict, interrupted: str | None = None) -> Attempt:
        return Attempt(
            round(time.monotonic() - self.started, 6),
            Verdict(failure=verdict.failure),
            self.evidence,
            self.transport_error,
            self.quarantine,
            interrupted,
        )


class _Attempts:
    """The attempts on one host, as the stages begin and end them."""

    attempts: list[Attempt]
    running: Running | None

    def begin_attempt(self) -> Running:
        """The next attempt, timed from now; the stages fill in what they learn."""
        self.running = Running(len(self.attempts) + 1)
        return self.running

    def end_attempt(self, verdict: Verdict, interrupted: str | None = None) -> None:
        if self.running is not None:
            self.attempts.append(self.running.done(verdict, interrupted))
        self.running = None

    def close_attempt(self, verdict: Verdict) -> None:
        """An attempt that a daemon-side failure (``verdict``) interrupted: what is known
        of it."""
        if self.running is not None and verdict.failure is not None:
            self.end_attempt(verdict, interrupted=verdict.failure.reason)


@dataclass(eq=False)
class HostRun(_Attempts):
    """One host of a fan-out: its attempts, until it has its answer; then its audit row."""

    host: str
    rows: bytearray
    """The fan-out's ``host_results`` rows, serialized, one buffer for all its hosts
    (``CallRecord.host_rows``)."""
    attempts: list[Attempt] = field(default_factory=list)
    running: Running | None = None
    span: tuple[int, int] | None = None
    """Where its row is in ``rows``, once the host has its answer (its attempts then
    dropped). One buffer, not a row object per host: a done host keeps two integers, and
    a thousand small blocks left among the large short-lived ones of the hosts still
    running would fragment the heap."""

    def answered(self, verdict: Verdict) -> None:
        """The host's verdict is in: its row, written now, replaces its attempts."""
        outcome = "success" if verdict.failure is None else "failure"
        row = {
            "host": self.host,
            "outcome": outcome,
            "code": verdict.code,
            **verdict.record(),
            "attempts": [attempt.record() for attempt in self.attempts],
        }
        start = len(self.rows)
        self.rows += orjson.dumps(row)
        self.span = (start, len(self.rows))
        self.attempts = []

    def record(self) -> tuple[int, int]:
        """Where its row of the result record's ``host_results`` is (docs/audit.md
        "result"); a host cut before it answered gets its row now."""
        if self.span is None:  # cut before it answered: the fan-out was cancelled
            verdict = Verdict(
                failure=failure_of(UpstreamError("fanout_cancelled", retryable=True, ran=True))
            )
            self.close_attempt(verdict)
            self.answered(verdict)
        assert self.span is not None  # by answered
        return self.span


@dataclass(eq=False)
class CallRecord(_Attempts):
    """What the audit trail says about one call, filled in as the stages run."""

    op: Operation
    peer: Peer
    request_id: str
    command: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    result_written: bool = False
    running: Running | None = None
    """The attempt under way, between ``begin_attempt`` and ``end_attempt``."""
    target: str = ""
    """The `run_on` the caller named (an operation with targets), as far as it was read."""
    hosts: tuple[str, ...] = ()
    """Its hosts, sorted, once stage 3 resolved them."""
    runs: dict[str, HostRun] = field(default_factory=dict)
    """A fan-out's hosts, each with its attempts, then the place of its row."""
    host_rows: bytearray = field(default_factory=bytearray)
    """A fan-out's ``host_results`` rows, serialized as its hosts answer."""
    approval: Approval | None = None
    """Who approved its command, for an operation that requires approval."""
    progress: Progress = NO_PROGRESS
    """Its progress lines, for a caller that asked for them (docs/protocol.md "Progress")."""

    def _common(self, kind: str) -> dict[str, Any]:
        common = {
            "type": kind,
            "time": now_text(),
            "request_id": self.request_id,
            **self.op.audit_fields,
            "caller": who(self.peer),
            "command": self.command,
        }
        if self.op.multi:
            common["target"] = self.target
            common["hosts"] = list(self.hosts)
            common["hosts_sha256"] = host_set_digest(self.hosts)
        return common

    def intent(self) -> dict[str, Any]:
        """The intent record of the next attempt (a fan-out's one intent: attempt 1), with
        who approved it when the operation requires approval."""
        record = {**self._common("intent"), "attempt": len(self.attempts) + 1}
        if self.approval is not None:
            record["approval"] = self.approval.record()
        return record

    def result(self, verdict: Verdict) -> dict[str, Any]:
        """The result record of a sealed verdict: what the caller was told, and why."""
        assert verdict.sealed is not None, "a result is recorded once its answer is sealed"
        record = {
            **self._common("result"),
            "attempts": [attempt.record() for attempt in self.attempts],
            "outcome": verdict.sealed.outcome,
            "code": verdict.sealed.code,
            **verdict.record(),
        }
        if self.op.multi:
            spans = [run.record() for run in self.runs.values()]  # in the order of hosts
            rows = b",".join(self.host_rows[start:end] for start, end in spans)
            record["host_results"] = orjson.Fragment(b"[" + rows + b"]")
        return record
