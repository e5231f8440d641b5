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
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from sshadapter.audit.quarantine import Quarantine
from sshadapter.audit.writer import AuditLog
from sshadapter.config import ApprovalsSection, Grant, ServerSection
from sshadapter.contract import envelope
from sshadapter.contract.codes import SYSTEM_TOOL
from sshadapter.contract.evaluate import Verdict, seal_line
from sshadapter.contract.registry import Operation, Registry
from sshadapter.daemon.access import Access, Peer
from sshadapter.daemon.admission import Admission
from sshadapter.daemon.approvals import Approvals, Watch, unwatched
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.fanout import FanOut
from sshadapter.daemon.listing import list_digest, read_target, targets_page, tools_for
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.progress import NO_PROGRESS, Progress, Report
from sshadapter.daemon.records import CallRecord, HostRun
from sshadapter.daemon.request import receive
from sshadapter.daemon.verdicts import (
    RETRY_BACKOFF_SECONDS,
    answered,
    count,
    log_failure,
    should_retry,
)
from sshadapter.errors import (
    AuditError,
    DeniedError,
    DispatchRefusal,
    RequestError,
    UpstreamError,
    failure_of,
)
from sshadapter.inventory.fleet import Inventory
from sshadapter.runners.interface import Runner, RunResult

log = logging.getLogger(__name__)

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Timing:
    """The service's clock and its wait, together: a test gives both, production neither."""

    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    """The wall clock an output is judged at (its checks may compare its times to it)."""
    sleep: Sleep = asyncio.sleep
    """The wait between attempts (RETRY_BACKOFF_SECONDS, doubling)."""


class Service:
    """Turns request lines into response lines; owns the registry, runner and audit log."""

    def __init__(
        self,
        registry: Registry,
        runner: Runner,
        audit: AuditLog,
        server: ServerSection,
        *,
        metrics: Metrics | None = None,
        quarantine: Quarantine | None = None,
        judge: Judge | None = None,
        dispatch: PolicyMonitor | None = None,
        inventory: Inventory | None = None,
        grants: tuple[Grant, ...] = (),
        approvals: ApprovalsSection | None = None,
        timing: Timing = Timing(),
    ) -> None:
        self.runner = runner
        self.judge = judge or Judge(workers=0)
        self.audit = audit
        self.default_allow = server.allow
        self.max_request_bytes = server.max_request_bytes
        self.admission = Admission(server.max_concurrent_calls, server.max_queue)
        self.metrics = metrics or Metrics()
        self.quarantine = quarantine
        self.metrics.inflight.set_function(lambda: self.admission.admitted)
        self.clock = timing.clock
        self.sleep = timing.sleep
        self.dispatch = dispatch
        """The policy state of dispatch hosts (docs/dispatcher.md), when there are any."""
        self.calls: dict[str, CallRecord] = {}
        """Calls between request and answer, by request id (the drain names those it cuts)."""
        self.cut_on_cancel = False
        """Set by the drain past its deadline: a cancelled call then answers INTERNAL."""
        self.registry = registry
        self.grants = grants
        self.fanout = FanOut(server.max_fanout_hosts_in_flight, self.metrics)
        """Every fan-out's hosts, run in turn within the daemon's bounds."""
        self.inventory = inventory or Inventory.bare(
            op.spec.host for op in registry.operations.values() if op.spec.host
        )
        self.access = Access(registry, self.inventory, grants, server.allow)
        self.approvals = Approvals(approvals or ApprovalsSection(), audit, self.metrics)
        """Calls waiting for a person, and who may decide them (docs/protocol.md "Approval")."""
        self.install(registry)

    def install(
        self,
        registry: Registry,
        inventory: Inventory | None = None,
        grants: tuple[Grant, ...] | None = None,
    ) -> None:
        """Serve ``registry`` (and ``inventory``, ``grants`` when given) from now on (start
        and SIGHUP): allow lists, grants and targets are resolved here, once."""
        if inventory is not None:
            self.inventory = inventory
        if grants is not None:
            self.grants = grants
        self.access = Access(registry, self.inventory, self.grants, self.default_allow)
        self.list_digest = list_digest(registry, self.inventory, self.grants)
        """Sent with `list`: changes when a tool, a group or a grant does (a caller's
        `run_on` choices follow all three), so a client caching the list notices."""
        for op in registry.operations.values():
            for key, text in op.warnings:
                log.warning("%s: %s: %s", op.file, key, text)
        self.registry = registry
        self.metrics.know_tools(registry.operations)
        self.judge.start(registry)
        self.approvals.end("invalidated", self._unchanged)

    def _unchanged(self, call: CallRecord) -> bool:
        """Whether a call waiting for approval would still run the same way after a reload:
        the same operation file and schema, the same hosts, the same caller's right."""
        op = self.registry.get(call.op.name)
        if op is None or op.audit_fields != call.op.audit_fields:
            return False
        choices = self.access.choices(op, call.peer)
        if not op.multi:
            return bool(choices)
        return call.target in choices and self.inventory.members(call.target) == call.hosts

    def end_approvals(self) -> None:
        """The drain: every call waiting for approval is denied (`approval_cancelled`)."""
        self.approvals.end("cancelled")

    async def handle(
        self, line: bytes, peer: Peer, watch: Watch = unwatched, report: Report | None = None
    ) -> bytes:
        """One request line in, one response line out (newline included); never raises.
        ``watch`` sees the caller leave while its call waits for approval; ``report``
        writes the progress lines of a call that asks for them."""
        request_id = envelope.new_request_id()
        started = time.monotonic()
        try:
            request = receive(line, self.max_request_bytes, self.approvals.admits(peer))  # 1
            if request.op == "list":
                return _line(
                    {
                        "tools": tools_for(self.registry, self.access, peer),
                        "digest": self.list_digest,
                    }
                )
            if request.op == "approvals":
                return _line(self.approvals.listing())
            if request.op in ("approve", "deny"):
                digest = request.digest if request.op == "approve" else None
                decided = self.approvals.decide(peer, request.request_id, digest, request.note)
                return _line(await decided)
            op = self.registry.get(request.tool)
            if op is None:
                raise RequestError("unknown_tool")
            if request.op == "targets":
                return _line(targets_page(self.access, op, peer, request.after))
        except RequestError as exc:
            # Logged, counted, not audited: nothing could run, and the line itself may be
            # hostile bulk that has no business in the audit trail.
            log.warning(
                "%s request from uid %d refused: INVALID_REQUEST request/%s",
                request_id,
                peer.uid,
                exc.reason,
                extra={
                    "request_id": request_id,
                    "code": "INVALID_REQUEST",
                    "stage": "request",
                    "reason": exc.reason,
                },
            )
            return self._system_answer(request_id, "INVALID_REQUEST", started)
        except Exception:
            log.exception(
                "%s request from uid %d: internal error",
                request_id,
                peer.uid,
                extra={"request_id": request_id},
            )
            return self._system_answer(request_id, "INTERNAL", started)
        progress = Progress(report) if request.progress and report else NO_PROGRESS
        return await self._call(op, request.args, peer, request_id, watch, progress)

    @property
    def tool_names(self) -> list[str]:
        """The tools served now, sorted."""
        return sorted(self.registry.operations)

    def cut(self) -> list[str]:
        """Past the drain deadline: from now on a cancelled call answers INTERNAL (the
        drain's cut, not a caller's). The calls running now, as ``<request id> (<tool>)``."""
        self.cut_on_cancel = True
        return [f"{rid} ({call.op.name})" for rid, call in sorted(self.calls.items())]

    def _system_answer(self, request_id: str, code: str, started: float) -> bytes:
        self.metrics.observe_call(SYSTEM_TOOL, "failure", code, time.monotonic() - started)
        return _line(envelope.failure(SYSTEM_TOOL, request_id, code))

    def refuse(self, code: str) -> bytes:
        """An answer the daemon gives without reading a request (a connection over the limit,
        a line over max_request_bytes, a request read during the drain), counted."""
        request_id = envelope.new_request_id()
        log.warning(
            "%s refused before reading a request: %s",
            request_id,
            code,
            extra={"request_id": request_id},
        )
        return self._system_answer(request_id, code, time.monotonic())

    async def _call(
        self,
        op: Operation,
        args: Mapping[str, Any],
        peer: Peer,
        request_id: str,
        watch: Watch,
        progress: Progress,
    ) -> bytes:
        """Stages 2-11 for a known tool: always a response line and a result record."""
        call = CallRecord(op, peer, request_id, progress=progress)
        self.calls[request_id] = call
        try:
            try:
                verdict = await self._decide(call, args, watch)
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

    async def _decide(self, call: CallRecord, args: Mapping[str, Any], watch: Watch) -> Verdict:
        """Stages 2-10, each a step; any of them may raise, _call maps what it raises."""
        choices = self.access.choices(call.op, call.peer)
        if not choices:  # 2
            raise DeniedError
        if call.op.multi:
            args = read_target(call, args, choices, self.access, self.inventory)  # 3: which hosts
        call.op.check_args(args)  # 3
        call.command = call.op.command(args)  # 3: refuses what no remote command can receive
        if call.op.spec.approval.required:
            call.approval = await self.approvals.wait(call, args, watch)  # 3: a person approves
        if call.op.multi:
            with self.admission.ticket() as slots:
                async with slots:
                    return await self._fan_out(call, args)  # 4-10 on each host
        host = call.op.spec.host
        assert host is not None  # an operation without targets names its host
        self._refuse_drifted(call.op, host)
        with self.admission.ticket() as slots:
            async with slots:
                verdict = await self._attempts(call, args, host, call)  # 4-10
        self._after_refusal(call.op, host, verdict)
        return verdict

    def _refuse_drifted(self, op: Operation, host: str) -> None:
        if self.dispatch is not None and (drift := self.dispatch.refusal(op, host)) is not None:
            self.metrics.dispatch_refusals.labels(op.name, "policy_drift").inc()
            raise DispatchRefusal("policy_drift", drift)  # the host's policy differs: not sent

    def _after_refusal(self, op: Operation, host: str, verdict: Verdict) -> None:
        if verdict.reason == "remote_refused" and self.dispatch is not None:
            self.metrics.dispatch_refusals.labels(op.name, "remote_refused").inc()
            self.dispatch.suspect(host)  # a policy out of step is found soon

    async def _fan_out(self, call: CallRecord, args: Mapping[str, Any]) -> Verdict:
        """Stages 4-10 on every host of the target: one intent first, then each host alone
        (its own attempts, verdict and quarantine), run and answered by daemon/fanout.py.
        A host that fails, fails alone."""
        call.runs = {host: HostRun(host, call.host_rows) for host in call.hosts}
        if call.approval is not None:
            call.approval.check(call.command)  # what runs is what was approved
        await self.audit.append(call.intent())  # 4: durable before the first exec
        return await self.fanout.run(call, functools.partial(self._host, call, args))

    async def _host(self, call: CallRecord, args: Mapping[str, Any], run: HostRun) -> Verdict:
        """Stages 4-10 on one host of a fan-out, alone: its attempts and its verdict."""
        try:
            self._refuse_drifted(call.op, run.host)
            if len(call.hosts) > 1:
                # Connected first, at the rate handshakes start (the pool's pacer): a host
                # waiting its handshake's turn is not yet running, so its operation's
                # timeout starts after it; a connect that fails is the host's answer.
                await self.runner.warm(run.host, evict=True)
            verdict = await self._attempts(call, args, run.host, run)
        except (DispatchRefusal, UpstreamError) as exc:
            verdict = Verdict(failure=failure_of(exc))
            run.close_attempt(verdict)
        self._after_refusal(call.op, run.host, verdict)
        return verdict

    async def _attempts(
        self, call: CallRecord, args: Mapping[str, Any], host: str, record: HostRun | CallRecord
    ) -> Verdict:
        """Stages 4-10 on ``host``, repeated in full for each retry the operation allows.

        ``record`` keeps the attempts: the call's own, or (fan-out) the host's; a fan-out
        wrote its one intent before any host began.
        """
        op, retry = call.op, call.op.spec.retry
        deadline = time.monotonic() + retry.budget_seconds
        while True:
            if record is call:
                if call.approval is not None:
                    call.approval.check(call.command)  # what runs is what was approved
                await self.audit.append(call.intent(), alone=len(self.calls) == 1)  # 4
            verdict, ran = await self._attempt(call, args, host, record)
            if not should_retry(op, verdict, ran, len(record.attempts), deadline):
                return verdict
            await self.sleep(RETRY_BACKOFF_SECONDS * 2 ** (len(record.attempts) - 1))

    async def _attempt(
        self, call: CallRecord, args: Mapping[str, Any], host: str, record: HostRun | CallRecord
    ) -> tuple[Verdict, bool]:
        """Stages 5-10 once: the verdict, and whether the command ran. The output lives only
        here: judged, digested, quarantined if rejected, and dropped on return, so a retry's
        backoff and its next run never hold the last one's bytes."""
        op = call.op
        attempt = record.begin_attempt()
        try:
            run = await self.runner.run(  # 5
                host,
                call.command,
                timeout=op.spec.timeout_seconds,
                max_stdout=op.spec.output.max_bytes,
                max_stderr=op.spec.output.max_stderr_bytes,
            )
        except UpstreamError as exc:
            verdict = Verdict(failure=failure_of(exc))
            attempt.transport_error = exc.reason
            record.end_attempt(verdict)
            return verdict, exc.ran
        judged = await self.judge.judge(  # 6-10, off the loop for a large output
            self.registry, op, args, run, self.clock(), call.request_id
        )
        attempt.evidence = judged.evidence
        if judged.verdict.rejected:
            stem = call.request_id if record is call else f"{call.request_id}.{host}"
            attempt.quarantine = await self._quarantine(stem, attempt.number, run)
        record.end_attempt(judged.verdict)
        return judged.verdict, True

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

    async def _quarantine(self, stem: str, attempt: int, run: RunResult) -> dict[str, str | None]:
        """Keep the raw bytes of a rejected output for the operator; name them in the record."""
        if self.quarantine is None:
            return {}
        request_id = stem
        stem = f"{stem}.{attempt}"
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
            await self.audit.append(record, alone=len(self.calls) == 1)
        except AuditError as exc:
            log.error("%s result not written: %s", call.request_id, exc)
            self.metrics.audit_failures.inc()
            failure = failure_of(exc)
            verdict = Verdict(failure=failure, sealed=answered(call, failure.code))
        count(self.metrics, call, verdict)
        assert verdict.sealed is not None  # by _prepare, or just above
        if verdict.sealed.outcome == "failure":
            log_failure(call, verdict)
        return verdict.sealed.line

    def _prepare(self, call: CallRecord, verdict: Verdict) -> tuple[Verdict, dict[str, Any]]:
        """The verdict sealed (only its response line kept, not the data), and its result
        record."""
        sealed = seal_line(call.op, call.request_id, verdict)
        if sealed.code is not None and verdict.failure is None:  # seal refused its own envelope
            verdict = self._failed(call, RuntimeError("envelope does not match its schema"))
        verdict = Verdict(failure=verdict.failure, sealed=sealed)
        return verdict, call.result(verdict)

    def _record_cut(self, call: CallRecord) -> bytes:
        """A call cancelled by the shutdown deadline: its result record, written now, counted;
        its INTERNAL answer returned.

        One whose result record was already written (durable or not) keeps that record;
        either way its answer is INTERNAL: a result not yet durable is not sent.
        """
        failure = self._failed(call, asyncio.CancelledError()).failure
        cut = Verdict(failure=failure, sealed=answered(call, "INTERNAL"))
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
        log_failure(call, cut)
        assert cut.sealed is not None
        return cut.sealed.line


def _line(value: Mapping[str, Any]) -> bytes:
    """One response line, newline included (no second copy of a large response to add it)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
