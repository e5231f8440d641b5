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
from sshadapter.contract.evaluate import Sealed, Verdict, seal_line
from sshadapter.contract.registry import Operation, Registry
from sshadapter.daemon.audit import AuditLog
from sshadapter.daemon.authorize import Callers, Peer, resolve
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.quarantine import Quarantine
from sshadapter.daemon.records import CallRecord
from sshadapter.errors import (
    AuditError,
    DeniedError,
    DispatchRefusal,
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

    @property
    def tool_names(self) -> list[str]:
        """The tools served now, sorted."""
        return sorted(self.registry.operations)

    def cut(self) -> list[str]:
        """Past the drain deadline: from now on a cancelled call answers INTERNAL (the
        drain's cut, not a caller's). The calls running now, as ``<request id> (<tool>)``."""
        self.cut_on_cancel = True
        return [f"{rid} ({call.op.name})" for rid, call in sorted(self.calls.items())]

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
            answer = self._record_cut(call)
            task = asyncio.current_task()
            if not self.cut_on_cancel or task is None:
                raise
            task.uncancel()  # the drain's cut, not a caller's: answer it
            return answer
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
            await self.audit.append(call.intent())  # 4
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
                verdict = Verdict(failure=failure_of(exc))
                attempt.transport_error = exc.reason
                ran = exc.ran
            else:
                judged = await self.judge.judge(  # 6-10, off the loop for a large output
                    self.registry, op, args, run, self.clock(), call.request_id
                )
                attempt.evidence = judged.evidence
                verdict, ran = judged.verdict, True
                if verdict.rejected:
                    attempt.quarantine = await self._quarantine(
                        call.request_id, attempt.number, run
                    )
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
        verdict = Verdict(failure=failure)
        call.close_attempt(verdict)
        return verdict

    async def _quarantine(
        self, request_id: str, attempt: int, run: RunResult
    ) -> dict[str, str | None]:
        """Keep the raw bytes of a rejected output for the operator; name them in the record."""
        if self.quarantine is None:
            return {}
        stem = f"{request_id}.{attempt}"
        kept: dict[str, str | None] = {}
        for stream, data in (("stdout", run.stdout), ("stderr", run.stderr)):
            try:
                kept[stream] = await asyncio.to_thread(
                    self.quarantine.keep, f"{stem}.{stream}", data
                )
            except OSError as exc:
                log.error("%s not quarantined: %s", request_id, exc)
                kept[stream] = None
        return kept

    async def _commit(self, call: CallRecord, verdict: Verdict) -> bytes:
        """Stage 11: make the result record durable, count it, return the response line."""
        try:
            verdict, record = self._prepare(call, verdict)
        except Exception as exc:  # a bug in sealing or building the record
            verdict, record = self._prepare(call, self._failed(call, exc))
        call.result_written = True
        try:
            await self.audit.append(record)
        except AuditError as exc:
            log.error("%s result not written: %s", call.request_id, exc)
            self.metrics.audit_failures.inc()
            failure = failure_of(exc)
            verdict = Verdict(failure=failure, sealed=_answered(call, failure.code))
        self._count(call, verdict)
        assert verdict.sealed is not None  # by _prepare, or just above
        return verdict.sealed.line

    def _prepare(self, call: CallRecord, verdict: Verdict) -> tuple[Verdict, dict[str, Any]]:
        """The verdict sealed (only its response line kept, not the data), and its result
        record."""
        sealed = seal_line(call.op, call.request_id, verdict)
        if sealed.code is not None and verdict.failure is None:  # seal refused its own envelope
            verdict = self._failed(call, RuntimeError("envelope does not match its schema"))
        verdict = Verdict(failure=verdict.failure, sealed=sealed)
        return verdict, call.result(verdict)

    def _count(self, call: CallRecord, verdict: Verdict) -> None:
        m, tool, sealed, failure = self.metrics, call.op.name, verdict.sealed, verdict.failure
        assert sealed is not None  # counted once answered
        rejected = sealed.code == "INVALID_RESPONSE" and failure is not None
        m.observe_call(
            tool,
            sealed.outcome,
            sealed.code,
            time.monotonic() - call.started,
            (failure.stage, failure.reason) if rejected and failure else None,
        )
        for attempt in call.attempts:
            if attempt.evidence is not None:
                m.output_bytes.labels(tool).observe(attempt.evidence.stdout_bytes)

    def _record_cut(self, call: CallRecord) -> bytes:
        """A call cancelled by the shutdown deadline: its result record, written now, counted;
        its INTERNAL answer returned.

        One whose result record was already written (durable or not) keeps that record;
        either way its answer is INTERNAL: a result not yet durable is not sent.
        """
        failure = self._failed(call, asyncio.CancelledError()).failure
        cut = Verdict(failure=failure, sealed=_answered(call, "INTERNAL"))
        if not call.result_written:
            try:
                self.audit.write(call.result(cut))
            except AuditError as exc:
                log.error("%s result of a cut call not written: %s", call.request_id, exc)
                self.metrics.audit_failures.inc()
            call.result_written = True
        self.metrics.observe_call(
            call.op.name, "failure", "INTERNAL", time.monotonic() - call.started
        )
        assert cut.sealed is not None
        return cut.sealed.line


def _answered(call: CallRecord, code: str) -> Sealed:
    """A failure the daemon answers without a verdict to seal (the result record could not
    be made durable; the drain cut the call): not retryable."""
    line = _line(envelope.failure(call.op.name, call.request_id, code, False))
    return Sealed("failure", code, line)


def _should_retry(
    op: Operation, verdict: Verdict, ran: bool, attempts: int, deadline: float
) -> bool:
    retry, failure = op.spec.retry, verdict.failure
    backoff = RETRY_BACKOFF_SECONDS * 2 ** (attempts - 1)
    return (
        failure is not None
        and failure.code in retry.on
        and failure.retryable
        and attempts < retry.attempts
        and (op.spec.idempotent or not ran)  # after execution only for idempotent ones
        and time.monotonic() + backoff + op.spec.timeout_seconds <= deadline
    )


def _line(value: Mapping[str, Any]) -> bytes:
    """One response line, newline included (no second copy of a large response to add it)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
