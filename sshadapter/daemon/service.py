"""One call, stage by stage: docs/protocol.md "Stages", 1 to 11, top to bottom.

``Service.handle`` takes one request line and the caller's kernel identity and
returns one response line, always: every path ends in a closed envelope, and
nothing the remote side or the client wrote reaches the response unless the
contract names it. ``_decide`` reads as the stages; every error any stage
raises is mapped to its failure in one place (``errors.failure_of``), and
anything unexpected becomes INTERNAL with a result record and a log line.

Every call that names a known tool leaves a result record, even one cut short
by the shutdown deadline (written synchronously while it is cancelled).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from sshadapter.config import Allow
from sshadapter.contract import envelope
from sshadapter.contract.codes import SYSTEM_TOOL
from sshadapter.contract.evaluate import Verdict, seal_line
from sshadapter.contract.registry import Operation, Registry
from sshadapter.daemon.audit import AuditLog, now_text
from sshadapter.daemon.authorize import Callers, Peer, resolve
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.quarantine import Quarantine
from sshadapter.errors import (
    AuditError,
    DeniedError,
    DispatchRefusal,
    Failure,
    OverloadedError,
    RequestError,
    UpstreamError,
    failure_of,
)
from sshadapter.runners.interface import Runner, RunResult
from sshadapter.strict_json import StrictJSONError, strict_loads

log = logging.getLogger(__name__)

RETRY_BACKOFF_SECONDS: Final = 0.2  # before the 2nd attempt, doubling: a blip has time to pass
REQUEST_MAX_DEPTH: Final = 8  # {"op", "tool", "args": {name: scalar}} needs 2; a little room
_REQUEST_KEYS: Final = {"call": {"op", "tool", "args"}, "list": {"op"}}

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Request:
    op: str
    tool: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)


class Admission:
    """At most ``slots`` calls run; at most ``queue`` wait; the rest are OVERLOADED at once."""

    def __init__(self, slots: int, queue: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self._limit = slots + queue
        self.admitted = 0
        """Calls running or waiting for a slot."""

    @contextmanager
    def ticket(self) -> Iterator[asyncio.Semaphore]:
        if self.admitted >= self._limit:
            raise OverloadedError
        self.admitted += 1
        try:
            yield self._slots
        finally:
            self.admitted -= 1


def receive(line: bytes, max_bytes: int) -> Request:
    """Stage 1: one request line, parsed by the same strict parser as results."""
    try:
        value = strict_loads(line, max_bytes=max_bytes, max_depth=REQUEST_MAX_DEPTH)
    except StrictJSONError as exc:
        raise RequestError(f"json_{exc.reason}", exc.detail) from exc
    op = value.get("op") if isinstance(value, dict) else None
    if not isinstance(op, str) or op not in _REQUEST_KEYS:
        raise RequestError("unknown_op")
    if value.keys() - _REQUEST_KEYS[op]:
        raise RequestError("unknown_request_key")
    if op == "list":
        return Request("list")
    tool, args = value.get("tool"), value.get("args", {})
    if not isinstance(tool, str) or not isinstance(args, dict):
        raise RequestError("malformed_call")
    return Request("call", tool, args)


class Service:
    """Turns request lines into response lines; owns the registry, runner and audit log."""

    def __init__(
        self,
        registry: Registry,
        runner: Runner,
        audit: AuditLog,
        *,
        default_allow: Allow,
        max_request_bytes: int,
        max_concurrent_calls: int,
        max_queue: int,
        metrics: Metrics | None = None,
        quarantine: Quarantine | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Sleep = asyncio.sleep,
        judge: Judge | None = None,
        dispatch: PolicyMonitor | None = None,
    ) -> None:
        self.runner = runner
        self.judge = judge or Judge(workers=0)
        self.audit = audit
        self.default_allow = default_allow
        self.max_request_bytes = max_request_bytes
        self.admission = Admission(max_concurrent_calls, max_queue)
        self.metrics = metrics or Metrics()
        self.quarantine = quarantine
        self.metrics.inflight.set_function(lambda: self.admission.admitted)
        self.clock = clock
        self.sleep = sleep
        self.dispatch = dispatch
        """The policy state of dispatch hosts (docs/dispatcher.md), when there are any."""
        self.calls: dict[str, CallRecord] = {}
        """Calls between request and answer, by request id (the drain names those it cuts)."""
        self.cut_on_cancel = False
        """Set by the drain past its deadline: a cancelled call then answers INTERNAL."""
        self.registry = registry
        self._callers: dict[str, Callers] = {}
        self.install(registry)

    def install(self, registry: Registry) -> None:
        """Serve ``registry`` from now on (start and SIGHUP); resolve its allow lists once."""
        default = resolve(self.default_allow, where="[server] allow")
        self._callers = {
            name: resolve(op.spec.allow, where=f"{op.file}: allow") if op.spec.allow else default
            for name, op in registry.operations.items()
        }
        for op in registry.operations.values():
            for key, text in op.warnings:
                log.warning("%s: %s: %s", op.file, key, text)
        self.registry = registry
        self.judge.start(registry)

    async def handle(self, line: bytes, peer: Peer) -> bytes:
        """One request line in, one response line out (newline included); never raises."""
        request_id = envelope.new_request_id()
        started = time.monotonic()
        try:
            request = receive(line, self.max_request_bytes)  # 1
            if request.op == "list":
                return _line({"tools": self.tools_for(peer), "digest": self.registry.digest})
            op = self.registry.get(request.tool)
            if op is None:
                raise RequestError("unknown_tool")
        except RequestError as exc:
            # Logged, counted, not audited: nothing could run, and the line itself may be
            # hostile bulk that has no business in the audit trail.
            log.info("%s request from uid %d refused: %s", request_id, peer.uid, exc.reason)
            return self._system_answer(request_id, "INVALID_REQUEST", started)
        except Exception:
            log.exception("%s request from uid %d: internal error", request_id, peer.uid)
            return self._system_answer(request_id, "INTERNAL", started)
        return await self._call(op, request.args, peer, request_id)

    def tools_for(self, peer: Peer) -> list[Mapping[str, Any]]:
        return [
            op.list_entry
            for op in self.registry.operations.values()
            if self._callers[op.name].admit(peer)
        ]

    def _system_answer(self, request_id: str, code: str, started: float) -> bytes:
        self.metrics.observe_call(SYSTEM_TOOL, "failure", code, time.monotonic() - started)
        return _line(envelope.failure(SYSTEM_TOOL, request_id, code))

    def refuse(self, code: str) -> bytes:
        """An answer the daemon gives without reading a request (a connection over the limit,
        a line over max_request_bytes, a request read during the drain), counted."""
        return self._system_answer(envelope.new_request_id(), code, time.monotonic())

    async def _call(
        self, op: Operation, args: Mapping[str, Any], peer: Peer, request_id: str
    ) -> bytes:
        """Stages 2-11 for a known tool: always a response line and a result record."""
        call = CallRecord(op, peer, request_id, self._callers[op.name])
        self.calls[request_id] = call
        try:
            try:
                verdict = await self._decide(call, args)
            except Exception as exc:  # the failure boundary: errors.failure_of maps them all
                verdict = self._failed(call, exc)
            return await self._commit(call, verdict)
        except asyncio.CancelledError:
            self._record_cut(call)
            task = asyncio.current_task()
            if not self.cut_on_cancel or task is None:
                raise
            task.uncancel()  # the drain's cut, not a caller's: answer it
            return _line(_cut_envelope(call))
        finally:
            del self.calls[request_id]

    async def _decide(self, call: CallRecord, args: Mapping[str, Any]) -> Verdict:
        """Stages 2-10, each a step; any of them may raise, _call maps what it raises."""
        if not call.callers.admit(call.peer):  # 2
            raise DeniedError
        call.op.check_args(args)  # 3
        call.command = call.op.command(args)  # 3: refuses what no remote command can receive
        if self.dispatch is not None and (drift := self.dispatch.refusal(call.op)) is not None:
            self.metrics.dispatch_refusals.labels(call.op.name, "policy_drift").inc()
            raise DispatchRefusal("policy_drift", drift)  # the host's policy differs: not sent
        with self.admission.ticket() as slots:
            async with slots:
                verdict = await self._attempts(call, args)  # 4-10
        if verdict.reason == "remote_refused" and self.dispatch is not None:
            self.metrics.dispatch_refusals.labels(call.op.name, "remote_refused").inc()
            self.dispatch.suspect(call.op.spec.host)  # a policy out of step is found soon
        return verdict

    async def _attempts(self, call: CallRecord, args: Mapping[str, Any]) -> Verdict:
        """Stages 4-10, repeated in full for each retry the operation allows."""
        op, retry = call.op, call.op.spec.retry
        deadline = time.monotonic() + retry.budget_seconds
        while True:
            await self.audit.append(call.intent(len(call.attempts) + 1))  # 4
            attempt = call.begin_attempt()
            try:
                run = await self.runner.run(  # 5
                    op.spec.host,
                    call.command,
                    timeout=op.spec.timeout_seconds,
                    max_stdout=op.spec.output.max_bytes,
                    max_stderr=op.spec.output.max_stderr_bytes,
                )
            except UpstreamError as exc:
                verdict = Verdict.failed(failure_of(exc))
                attempt.update(exit_status=None, transport_error=exc.reason)
                ran = exc.ran
            else:
                judged = await self.judge.judge(  # 6-10, off the loop for a large output
                    self.registry, op, args, run, self.clock(), call.request_id
                )
                attempt.update(judged.evidence)
                verdict, ran = judged.verdict, True
                if verdict.rejected:
                    attempt["quarantine"] = await self._quarantine(call, run)
            call.end_attempt(verdict)
            if not _should_retry(op, verdict, ran, len(call.attempts), deadline):
                return verdict
            await self.sleep(RETRY_BACKOFF_SECONDS * 2 ** (len(call.attempts) - 1))

    def _failed(self, call: CallRecord, exc: BaseException) -> Verdict:
        failure = failure_of(exc)
        if failure.stage == "internal":
            log.error("%s %s: internal error", call.request_id, call.op.name, exc_info=exc)
        elif isinstance(exc, AuditError):
            log.error("%s %s not run: %s", call.request_id, call.op.name, exc)
            self.metrics.audit_failures.inc()
        call.close_attempt(failure)
        return Verdict.failed(failure)

    async def _quarantine(self, call: CallRecord, run: RunResult) -> dict[str, str | None]:
        """Keep the raw bytes of a rejected output for the operator; name them in the record."""
        if self.quarantine is None:
            return {}
        stem = f"{call.request_id}.{len(call.attempts)}"
        kept: dict[str, str | None] = {}
        for stream, data in (("stdout", run.stdout), ("stderr", run.stderr)):
            try:
                kept[stream] = await asyncio.to_thread(
                    self.quarantine.keep, f"{stem}.{stream}", data
                )
            except OSError as exc:
                log.error("%s not quarantined: %s", call.request_id, exc)
                kept[stream] = None
        return kept

    async def _commit(self, call: CallRecord, verdict: Verdict) -> bytes:
        """Stage 11: make the result record durable, count it, return the response line."""
        try:
            line, record = self._prepare(call, verdict)
        except Exception as exc:  # a bug in sealing or building the record
            verdict = self._failed(call, exc)
            line, record = self._prepare(call, verdict)
        del verdict  # the parsed output is not kept while the result record is made durable
        call.result_written = True
        try:
            await self.audit.append(record)
        except AuditError as exc:
            log.error("%s result not written: %s", call.request_id, exc)
            self.metrics.audit_failures.inc()
            failure = failure_of(exc)
            line = _line(envelope.failure(call.op.name, call.request_id, failure.code, False))
            record = {**record, "outcome": "failure", "code": failure.code}
            record.update(stage=failure.stage, reason=failure.reason, detail=failure.detail)
        self._count(call, record)
        return line

    def _prepare(self, call: CallRecord, verdict: Verdict) -> tuple[bytes, dict[str, Any]]:
        """The response line and the result record of a verdict."""
        sealed = seal_line(call.op, call.request_id, verdict)
        if sealed.code is not None and verdict.code is None:  # seal refused its own envelope
            verdict = self._failed(call, RuntimeError("envelope does not match its schema"))
        return sealed.line, call.result(verdict, sealed.outcome, sealed.code)

    def _count(self, call: CallRecord, record: Mapping[str, Any]) -> None:
        m, tool = self.metrics, call.op.name
        rejected = record["code"] == "INVALID_RESPONSE"
        m.observe_call(
            tool,
            record["outcome"],
            record["code"],
            time.monotonic() - call.started,
            (record["stage"], record["reason"]) if rejected else None,
        )
        for attempt in call.attempts:
            if "stdout_bytes" in attempt:
                m.output_bytes.labels(tool).observe(attempt["stdout_bytes"])

    def _record_cut(self, call: CallRecord) -> None:
        """A call cancelled by the shutdown deadline: its result record, written now, counted.

        One whose result record was already written (durable or not) keeps that record;
        either way its answer is INTERNAL: a result not yet durable is not sent.
        """
        verdict = self._failed(call, asyncio.CancelledError())
        if not call.result_written:
            try:
                self.audit.write(call.result(verdict, "failure", "INTERNAL"))
            except AuditError as exc:
                log.error("%s result of a cut call not written: %s", call.request_id, exc)
                self.metrics.audit_failures.inc()
            call.result_written = True
        self.metrics.observe_call(
            call.op.name, "failure", "INTERNAL", time.monotonic() - call.started
        )


def _cut_envelope(call: CallRecord) -> dict[str, Any]:
    return envelope.failure(call.op.name, call.request_id, "INTERNAL", False)


def _should_retry(
    op: Operation, verdict: Verdict, ran: bool, attempts: int, deadline: float
) -> bool:
    retry = op.spec.retry
    backoff = RETRY_BACKOFF_SECONDS * 2 ** (attempts - 1)
    return (
        verdict.code in retry.on
        and verdict.retryable
        and attempts < retry.attempts
        and (op.spec.idempotent or not ran)  # after execution only for idempotent ones
        and time.monotonic() + backoff + op.spec.timeout_seconds <= deadline
    )


@dataclass
class CallRecord:
    """What the audit trail says about one call, filled in as the stages run."""

    op: Operation
    peer: Peer
    request_id: str
    callers: Callers
    command: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    result_written: bool = False
    _attempt_started: float | None = None

    def _common(self, kind: str) -> dict[str, Any]:
        return {
            "type": kind,
            "time": now_text(),
            "request_id": self.request_id,
            **self.op.audit_fields,
            "caller": {"uid": self.peer.uid, "gid": self.peer.gid, "pid": self.peer.pid},
            "command": self.command,
        }

    def intent(self, attempt: int) -> dict[str, Any]:
        return {**self._common("intent"), "attempt": attempt}

    def begin_attempt(self) -> dict[str, Any]:
        """A new attempt's record, timed from now; filled in by the stages."""
        self._attempt_started = time.monotonic()
        attempt: dict[str, Any] = {"duration_seconds": 0.0}
        self.attempts.append(attempt)
        return attempt

    def end_attempt(self, verdict: Verdict) -> None:
        if self._attempt_started is not None:
            self.attempts[-1]["duration_seconds"] = round(
                time.monotonic() - self._attempt_started, 6
            )
            self.attempts[-1]["verdict"] = _verdict_fields(verdict)
        self._attempt_started = None

    def close_attempt(self, failure: Failure) -> None:
        """An attempt that a daemon-side failure interrupted: what is known of it."""
        if self._attempt_started is not None:
            self.attempts[-1].setdefault("exit_status", None)
            self.attempts[-1].setdefault("transport_error", None)
            self.attempts[-1]["interrupted"] = failure.reason
            self.end_attempt(Verdict.failed(failure))

    def result(self, verdict: Verdict, outcome: str, code: str | None) -> dict[str, Any]:
        return {
            **self._common("result"),
            "attempts": self.attempts,
            "outcome": outcome,
            "code": code,
            **_verdict_fields(verdict),
        }


def _verdict_fields(verdict: Verdict) -> dict[str, Any]:
    return {
        "stage": verdict.stage,
        "reason": verdict.reason,
        "detail": verdict.detail,
        "schema_path": verdict.schema_path,
        "instance_path": verdict.instance_path,
    }


def _line(value: Mapping[str, Any]) -> bytes:
    """One response line, newline included (no second copy of a large response to add it)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
