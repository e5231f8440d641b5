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
import bisect
import contextlib
import hashlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from sshadapter.client import MAX_APPROVAL_NOTE_CHARS, PROGRESS_VERSION
from sshadapter.config import DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT, Allow, ApprovalsSection, Grant
from sshadapter.contract import envelope
from sshadapter.contract.codes import SYSTEM_TOOL, TARGET_ARGUMENT
from sshadapter.contract.evaluate import Sealed, Verdict, seal_line
from sshadapter.contract.registry import Operation, Registry
from sshadapter.daemon.approvals import APPROVER_OPS, Approvals, Watch, unwatched
from sshadapter.daemon.audit import AuditLog
from sshadapter.daemon.authorize import Peer
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.fanout_answer import FanoutAnswer
from sshadapter.daemon.grants import Access
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.offload import Judge
from sshadapter.daemon.progress import NO_PROGRESS, Progress, Report
from sshadapter.daemon.quarantine import Quarantine
from sshadapter.daemon.records import CallRecord, HostRun
from sshadapter.errors import (
    AuditError,
    DeniedError,
    DispatchRefusal,
    OverloadedError,
    RequestError,
    UpstreamError,
    failure_of,
)
from sshadapter.inventory import Inventory, host_set_digest
from sshadapter.pacing import HOST_STARTS, Pacer
from sshadapter.runners.interface import FANOUT_HOST, Runner, RunResult
from sshadapter.shown import shown
from sshadapter.strict_json import StrictJSONError, strict_loads

log = logging.getLogger(__name__)

RETRY_BACKOFF_SECONDS: Final = 0.2  # before the 2nd attempt, doubling: a blip has time to pass
REQUEST_MAX_DEPTH: Final = 8  # {"op", "tool", "args": {name: scalar}} needs 2; a little room
_REQUEST_KEYS: Final = {
    "call": {"op", "tool", "args", "progress"},
    "list": {"op"},
    "targets": {"op", "tool", "after"},
    # approvers only (approvals.APPROVER_OPS); anyone else: `unknown_op`
    "approvals": {"op"},
    "approve": {"op", "request_id", "digest", "note"},
    "deny": {"op", "request_id", "note"},
}
_REQUEST_ID: Final = re.compile(r"req\.[0-9a-f]{20}")
_DIGEST: Final = re.compile(r"[0-9a-f]{64}")
# `run_on` is published as an enum up to this many choices (groups are few; ~16 bytes
# each): past it, a pattern and the paged `targets` listing, so that one tool's schema
# stays small for the agent host (an enum of 1,000 aliases is ~16 KB per tool).
MAX_TARGET_ENUM: Final = 64
TARGETS_PAGE: Final = 500  # names per `targets` answer: ~8 KB
# Fan-out hosts that may start while a single call runs (FanoutSlots): measured on two
# cores, a single call's p50 beside a 128-host fan-out was 43x its idle p50 with 64 hosts
# in flight, 6x with 8.
FANOUT_HOSTS_BESIDE_SINGLE: Final = 1
_NOT_A_CHOICE: Final = {"parameter": TARGET_ARGUMENT, "rule": "choice"}
"""The one hint for a `run_on` this caller may not use, whatever the reason (no oracle)."""

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Request:
    op: str
    tool: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)
    after: str = ""
    """`targets` only: the last name of the previous page."""
    request_id: str = ""
    """`approve` and `deny`: the pending call's request id."""
    digest: str = ""
    """`approve`: the sha256 of the command the approver was shown."""
    note: str = ""
    """`approve` and `deny`: the approver's reason, for the decision's audit record."""
    progress: bool = False
    """`call`: the caller asked for progress lines before the answer."""


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


def receive(line: bytes, max_bytes: int, approver: bool = False) -> Request:
    """Stage 1: one request line, parsed by the same strict parser as results. The
    approvers' ops exist only for an ``approver``."""
    try:
        value = strict_loads(line, max_bytes=max_bytes, max_depth=REQUEST_MAX_DEPTH)
    except StrictJSONError as exc:
        raise RequestError(f"json_{exc.reason}", exc.detail) from exc
    op = value.get("op") if isinstance(value, dict) else None
    if not isinstance(op, str) or op not in _REQUEST_KEYS or (op in APPROVER_OPS and not approver):
        raise RequestError("unknown_op")
    if value.keys() - _REQUEST_KEYS[op]:
        raise RequestError("unknown_request_key")
    if op in ("list", "approvals"):
        return Request(op)
    if op in ("approve", "deny"):
        request_id, digest = value.get("request_id"), value.get("digest", "")
        note = value.get("note", "")
        if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise RequestError("malformed_call")
        if not isinstance(note, str) or len(note) > MAX_APPROVAL_NOTE_CHARS:
            raise RequestError("malformed_call")
        if op == "approve" and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
            raise RequestError("malformed_call")
        return Request(op, request_id=request_id, digest=digest, note=note)
    if op == "targets":
        tool, after = value.get("tool"), value.get("after", "")
        if not isinstance(tool, str) or not isinstance(after, str) or len(after) > 63:
            raise RequestError("malformed_call")
        return Request("targets", tool, after=after)
    tool, args = value.get("tool"), value.get("args", {})
    if not isinstance(tool, str) or not isinstance(args, dict):
        raise RequestError("malformed_call")
    progress = value.get("progress", PROGRESS_VERSION)
    if type(progress) is not int or progress != PROGRESS_VERSION:  # not True, not 1.0
        raise RequestError("malformed_call")
    return Request("call", tool, args, progress="progress" in value)


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
        inventory: Inventory | None = None,
        grants: tuple[Grant, ...] = (),
        max_fanout_hosts_in_flight: int = DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT,
        approvals: ApprovalsSection | None = None,
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
        self.grants = grants
        self.max_fanout_hosts_in_flight = max_fanout_hosts_in_flight
        """The most workers one fan-out starts (each takes its hosts in turn)."""
        self.fanout_hosts = asyncio.Semaphore(max_fanout_hosts_in_flight)
        """Hosts in flight across every fan-out (DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT)."""
        self.fanout_starts = Pacer(HOST_STARTS)
        """How fast fan-out hosts start, all fan-outs together (sshadapter/pacing.py)."""
        self.inventory = inventory or Inventory.bare(
            op.spec.host for op in registry.operations.values() if op.spec.host
        )
        self.access = Access(registry, self.inventory, grants, default_allow)
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
        self.list_digest = _list_digest(registry, self.inventory, self.grants)
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
                return _line({"tools": self.tools_for(peer), "digest": self.list_digest})
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
                return _line(self.targets_page(op, peer, request.after))
        except RequestError as exc:
            # Logged, counted, not audited: nothing could run, and the line itself may be
            # hostile bulk that has no business in the audit trail.
            log.warning(
                "%s request from uid %d refused: INVALID_REQUEST request/%s",
                request_id,
                peer.uid,
                exc.reason,
                extra={"request_id": request_id},
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

    def tools_for(self, peer: Peer) -> list[Mapping[str, Any]]:
        """`list` for ``peer``: the tools it may call; `run_on` lists its own choices."""
        entries = []
        for op in self.registry.operations.values():
            choices = self.access.choices(op, peer)
            if not choices:
                continue
            if not op.multi:
                entries.append(op.list_entry)
                continue
            schema = dict(op.params_schema)
            entries.append(
                {
                    **op.list_entry,
                    "input_schema": {
                        **schema,
                        "properties": {TARGET_ARGUMENT: _run_on(choices), **schema["properties"]},
                        "required": [TARGET_ARGUMENT, *schema["required"]],
                    },
                }
            )
        return entries

    def targets_page(self, op: Operation, peer: Peer, after: str) -> dict[str, Any]:
        """The `targets` answer: ``peer``'s choices for ``op`` after ``after``, one page."""
        choices = self.access.choices(op, peer)
        if not choices:
            raise RequestError("unknown_tool")  # not listed for this caller: as if absent
        start = bisect.bisect_right(choices, after) if after else 0
        page = list(choices[start : start + TARGETS_PAGE])
        more = start + TARGETS_PAGE < len(choices)
        return {"tool": op.name, "targets": page, "next": page[-1] if more and page else None}

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
            args = self._target(call, args, choices)  # 3: which hosts
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

    def _target(
        self, call: CallRecord, args: Mapping[str, Any], choices: tuple[str, ...]
    ) -> Mapping[str, Any]:
        """Stage 3 for an operation with targets: `run_on` among the caller's choices, its
        hosts within the fan-out policy. Returns the other arguments."""
        op, inventory = call.op, self.inventory
        target = args.get(TARGET_ARGUMENT)
        if not isinstance(target, str):
            rule = "missing" if TARGET_ARGUMENT not in args else "type"
            raise RequestError(
                "bad_arguments",
                f"/{TARGET_ARGUMENT}: a target name is required",
                {"parameter": TARGET_ARGUMENT, "rule": rule},
            )
        call.target = target[:63]
        if target not in choices:  # one answer for all of them, hint too; the audit keeps which
            if target in self.access.candidates(op):
                raise RequestError("target_not_granted", target[:63], _NOT_A_CHOICE)
            if inventory.exists(target):
                reason = "fanout_disabled" if inventory.is_group(target) else "target_not_listed"
                raise RequestError(reason, target[:63], _NOT_A_CHOICE)
            raise RequestError("unknown_target", target[:63], _NOT_A_CHOICE)
        hosts = inventory.members(target)
        if len(hosts) > op.spec.fanout.max_hosts:  # a choice of this caller's: no oracle
            raise RequestError(
                "too_many_hosts",
                f"{target}: {len(hosts)} > {op.spec.fanout.max_hosts}",
                {"parameter": TARGET_ARGUMENT, "rule": "hosts"},
            )
        call.hosts = hosts
        return {k: v for k, v in args.items() if k != TARGET_ARGUMENT}

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
        (its own attempts, verdict and quarantine), within the call's deadline and its
        concurrency, and the daemon's hosts in flight. A host that fails, fails alone."""
        fanout = call.op.spec.fanout
        call.runs = {host: HostRun(host, call.host_rows) for host in call.hosts}
        if call.approval is not None:
            call.approval.check(call.command)  # what runs is what was approved
        await self.audit.append(call.intent())  # 4: durable before the first exec
        # One host is a single call, wherever it was named: it takes no fan-out slot and no
        # start's turn, so it never waits behind a fan-out (its call slot bounds it already).
        fanning = len(call.hosts) > 1
        slot = self.fanout_hosts if fanning else contextlib.nullcontext()
        answer = FanoutAnswer(fanout.max_results)
        # The call's concurrency and the daemon's hosts in flight bound the hosts running at
        # once: that many workers take the hosts in turn, so a waiting host is one HostRun,
        # not a task of its own (1,000 pending tasks were ~1 KB each).
        waiting = iter(call.runs.values())

        async def worker() -> None:
            # Set in this worker's own context: its hosts' connect failures are not logged
            # one by one; _fanout_verdict logs the fan-out's one line with the counts.
            FANOUT_HOST.set(len(call.hosts) > 1)
            for run in waiting:  # shared: each host is taken by one worker
                async with slot:
                    if fanning:
                        await self.fanout_starts.start()  # the rate the loop's lag allows
                    await self._host(call, args, run, answer)

        workers = min(len(call.runs), fanout.concurrency, self.max_fanout_hosts_in_flight)
        tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
        try:
            done, _ = await asyncio.wait(tasks, timeout=fanout.deadline_seconds)
        finally:
            for task in tasks:
                task.cancel()  # a no-op on those done; on cancellation, every host stops
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc  # a bug in one host's stages: the whole call is INTERNAL
        deadline = Verdict(
            failure=failure_of(UpstreamError("fanout_deadline", retryable=True, ran=True))
        )
        for run in call.runs.values():
            if run.span is None:  # running or waiting when the deadline passed
                run.close_attempt(deadline)
                self._answered(call, answer, run, deadline)
        return self._fanout_verdict(call, answer)

    async def _host(
        self, call: CallRecord, args: Mapping[str, Any], run: HostRun, answer: FanoutAnswer
    ) -> None:
        """One host of a fan-out, alone: its attempts, its verdict to the answer. Its
        envelope lives only here, not in the worker that goes on to the next host."""
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
        self._answered(call, answer, run, verdict)
        self._after_refusal(call.op, run.host, verdict)

    def _answered(
        self, call: CallRecord, answer: FanoutAnswer, run: HostRun, verdict: Verdict
    ) -> None:
        """One host is done: its own envelope (checked by the operation's host guard) goes
        to the answer, which keeps it only if it is shown; the host keeps its audit row,
        serialized. So no host's output outlives its judging."""
        answer.add(run.host, seal_line(call.op, call.request_id, verdict))
        run.answered(verdict)
        call.progress.host_done(len(call.hosts))

    def _fanout_verdict(self, call: CallRecord, hosts: FanoutAnswer) -> Verdict:
        """The fan-out answer from the hosts' counts and the entries shown, checked as a
        whole."""
        op = call.op
        for (outcome, code), n in hosts.kinds.items():  # one series update per kind of answer
            self.metrics.fanout_hosts.labels(op.name, outcome, code).inc(n)
        _log_fanout(call, hosts)
        answer = envelope.success(op.name, call.request_id, hosts.data(call.target))
        if not op.envelope_guard.is_valid(answer):
            raise RuntimeError("fan-out envelope does not match its schema")  # a bug
        line = orjson.dumps(answer, option=orjson.OPT_APPEND_NEWLINE)
        return Verdict(sealed=Sealed("success", None, line))

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
            if not _should_retry(op, verdict, ran, len(record.attempts), deadline):
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
            verdict = Verdict(failure=failure, sealed=_answered(call, failure.code))
        self._count(call, verdict)
        assert verdict.sealed is not None  # by _prepare, or just above
        if verdict.sealed.outcome == "failure":
            _log_failure(call, verdict)
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
        _log_failure(call, cut)
        assert cut.sealed is not None
        return cut.sealed.line


def _log_failure(call: CallRecord, verdict: Verdict) -> None:
    """The one warning line of a refused or failed call: its request id, tool, code, stage
    and reason (closed lists), never the detail (which may quote what a host returned)."""
    failure, sealed = verdict.failure, verdict.sealed
    code = sealed.code if sealed is not None else None
    stage = failure.stage if failure is not None else None
    reason = failure.reason if failure is not None else None
    log.warning(
        "%s %s %s: %s %s/%s",
        call.request_id,
        call.op.name,
        "failed" if call.attempts else "refused",
        code,
        stage,
        reason,
        extra={"request_id": call.request_id},
    )


def _log_fanout(call: CallRecord, hosts: FanoutAnswer) -> None:
    """The one warning line of a fan-out whose hosts failed, however many: its request id,
    tool, target and the hosts failed by code (closed lists); which host failed how is in
    the audit's host rows."""
    failed = hosts.failures_by_code()
    if not failed:
        return
    log.warning(
        "%s %s on %s: %d of %d hosts failed: %s",
        call.request_id,
        call.op.name,
        shown(call.target),
        sum(failed.values()),
        len(call.hosts),
        " ".join(f"{code}={n}" for code, n in failed.items()),
        extra={"request_id": call.request_id},
    )


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


def _list_digest(registry: Registry, inventory: Inventory, grants: tuple[Grant, ...]) -> str:
    """The registry's digest, or (with groups or grants) one over it and them."""
    if not inventory.groups and not grants:
        return registry.digest
    h = hashlib.sha256(registry.digest.encode())
    for name, members in sorted(inventory.groups.items()):
        h.update(f"\0group/{name}\0{host_set_digest(members)}".encode())
    for grant in grants:
        h.update(b"\0grant/" + orjson.dumps(grant.model_dump(mode="json")))
    return f"sha256:{h.hexdigest()}"


def _run_on(choices: tuple[str, ...]) -> dict[str, Any]:
    """The published schema of `run_on` for one caller's choices."""
    described = "Which host or group to run on"
    if len(choices) <= MAX_TARGET_ENUM:
        return {"type": "string", "enum": list(choices), "description": f"{described}."}
    return {
        "type": "string",
        "pattern": envelope.FANOUT_TARGET_PATTERN,
        "maxLength": 63,
        "description": f"{described}: {len(choices)} choices, listed by the `targets` request.",
    }


def _line(value: Mapping[str, Any]) -> bytes:
    """One response line, newline included (no second copy of a large response to add it)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
