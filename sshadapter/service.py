"""One call, stage by stage: DESIGN.md "One call, stage by stage", stages 1-11.

``Service.handle`` takes one request line and the caller's kernel identity and
returns one response line. Every path ends in a closed envelope; nothing the
remote side or the client wrote reaches the response unless the contract
names it. The stages read top to bottom in ``_call``.
"""

from __future__ import annotations

import asyncio
import grp
import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from sshadapter import __version__, envelope
from sshadapter.audit import AuditError, AuditLog, now_text
from sshadapter.config import Allow
from sshadapter.drift import PolicyMonitor
from sshadapter.errors import RequestError, UpstreamError
from sshadapter.evaluate import Verdict, evaluate, seal
from sshadapter.metrics import Metrics
from sshadapter.quarantine import Quarantine
from sshadapter.registry import Operation, Registry
from sshadapter.runners.interface import Runner, RunResult
from sshadapter.strict_json import StrictJSONError, strict_loads

log = logging.getLogger(__name__)

RETRY_BACKOFF_SECONDS: Final = 0.2  # before the 2nd attempt, doubling: a blip has time to pass
REQUEST_MAX_DEPTH: Final = 8  # {"op", "tool", "args": {name: scalar}} needs 2; a little room
_REQUEST_KEYS: Final = {"call": {"op", "tool", "args"}, "list": {"op"}}


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is calling, from the kernel (SO_PEERCRED), never from the request."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()
    """Supplementary groups of the calling process, when the kernel tells them."""


@dataclass(frozen=True, slots=True)
class Request:
    op: str
    tool: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)


class Overloaded(Exception):
    """Every call slot is busy and the queue is full."""


class Admission:
    """At most ``slots`` calls run; at most ``queue`` wait; the rest are OVERLOADED at once."""

    def __init__(self, slots: int, queue: int) -> None:
        self._slots = asyncio.Semaphore(slots)
        self._limit = slots + queue
        self.admitted = 0
        """Calls running or waiting: the drain on shutdown waits for this to reach 0."""
        self.idle = asyncio.Event()
        self.idle.set()

    @contextmanager
    def ticket(self) -> Iterator[asyncio.Semaphore]:
        if self.admitted >= self._limit:
            raise Overloaded
        self.admitted += 1
        self.idle.clear()
        try:
            yield self._slots
        finally:
            self.admitted -= 1
            if not self.admitted:
                self.idle.set()


def receive(line: bytes, max_bytes: int) -> Request:
    """Stage 1: one request line, parsed by the same strict parser as results."""
    try:
        value = strict_loads(line, max_bytes=max_bytes, max_depth=REQUEST_MAX_DEPTH)
    except StrictJSONError as exc:
        raise RequestError(f"json_{exc.reason}", exc.detail) from exc
    if not isinstance(value, dict) or value.get("op") not in _REQUEST_KEYS:
        raise RequestError("unknown_op")
    if value.keys() - _REQUEST_KEYS[value["op"]]:
        raise RequestError("unknown_request_key")
    if value["op"] == "list":
        return Request("list")
    tool, args = value.get("tool"), value.get("args", {})
    if not isinstance(tool, str) or not isinstance(args, dict):
        raise RequestError("malformed_call")
    return Request("call", tool, args)


def authorized(peer: Peer, allow: Allow) -> bool:
    """Stage 2: deny by default; the caller's uid, or one of its groups, must be listed."""
    if peer.uid in allow.uids:
        return True
    caller_groups = {peer.gid, *peer.groups}
    return any(_gid(name) in caller_groups for name in allow.groups)


def _gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None  # an unknown group admits nobody


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
        dispatch: PolicyMonitor | None = None,
    ) -> None:
        self.registry = registry
        self.runner = runner
        self.audit = audit
        self.default_allow = default_allow
        self.max_request_bytes = max_request_bytes
        self.admission = Admission(max_concurrent_calls, max_queue)
        self.metrics = metrics or Metrics()
        self.quarantine = quarantine
        self.metrics.inflight.set_function(lambda: self.admission.admitted)
        self.clock = clock
        self.dispatch = dispatch
        """The policy state of dispatch hosts (docs/dispatcher.md), when there are any."""

    async def handle(self, line: bytes, peer: Peer) -> bytes:
        """One request line in, one response line out (newline included)."""
        request_id = envelope.new_request_id()
        started = time.monotonic()
        try:
            request = receive(line, self.max_request_bytes)  # 1
            if request.op == "list":
                return _line({"tools": self.tools_for(peer)})
            op = self.registry.get(request.tool)
            if op is None:
                raise RequestError("unknown_tool")
        except RequestError as exc:
            # Logged, counted, not audited: nothing could run, and the line itself may be
            # hostile bulk that has no business in the audit trail.
            log.info("%s request from uid %d refused: %s", request_id, peer.uid, exc.reason)
            self.metrics.observe_call(
                envelope.SYSTEM_TOOL,
                "failure",
                "INVALID_REQUEST",
                "request",
                exc.reason,
                time.monotonic() - started,
            )
            return _line(envelope.failure(envelope.SYSTEM_TOOL, request_id, "INVALID_REQUEST"))
        return await self._call(op, request.args, peer, request_id)

    def tools_for(self, peer: Peer) -> list[dict[str, Any]]:
        return [
            {
                "name": op.name,
                "description": op.spec.description,
                "version": op.spec.version,
                "input_schema": op.params_schema,
                "output_schema": op.envelope_schema,
            }
            for op in self.registry.operations.values()
            if authorized(peer, op.spec.allow or self.default_allow)
        ]

    async def _call(
        self, op: Operation, args: Mapping[str, Any], peer: Peer, request_id: str
    ) -> bytes:
        call = CallRecord(op, peer, request_id)
        if not authorized(peer, op.spec.allow or self.default_allow):  # 2
            return await self._finish(
                call, Verdict(code="DENIED", stage="authorize", reason="not_allowed")
            )
        try:
            op.check_args(args)  # 3
        except RequestError as exc:
            return await self._finish(
                call,
                Verdict(
                    code="INVALID_REQUEST", stage="request", reason=exc.reason, detail=exc.detail
                ),
            )
        call.command = op.command(args)
        if self.dispatch is not None and (drift := self.dispatch.refusal(op)) is not None:
            return await self._finish(  # the host's policy for it differs: nothing is sent
                call,
                Verdict(
                    code="UPSTREAM_UNAVAILABLE",
                    stage="transport",
                    reason="policy_drift",
                    detail=drift,
                ),
            )
        try:
            with self.admission.ticket() as slots:
                async with slots:
                    verdict = await self._attempts(call, args)  # 4-10
        except Overloaded:
            verdict = Verdict(
                code="OVERLOADED", retryable=True, stage="request", reason="overloaded"
            )
        except AuditError as exc:
            log.error("%s intent not written, command not run: %s", request_id, exc)
            self.metrics.audit_failures.inc()
            verdict = Verdict(code="INTERNAL", stage="audit", reason="intent_not_written")
        if verdict.reason == "remote_refused" and self.dispatch is not None:
            self.dispatch.suspect(op.spec.host)  # a policy out of step is found soon
        prepared = self._prepare(call, verdict)  # 10
        del verdict  # the parsed output is not kept while the result record is made durable
        return await self._commit(call, *prepared)  # 11

    async def _attempts(self, call: CallRecord, args: Mapping[str, Any]) -> Verdict:
        """Stages 4-10, repeated in full for each retry the operation allows."""
        op, retry = call.op, call.op.spec.retry
        deadline = time.monotonic() + retry.budget_seconds
        while True:
            await self.audit.append(call.intent(len(call.attempts) + 1))  # 4
            started = time.monotonic()
            try:
                run = await self.runner.run(  # 5
                    op.spec.host,
                    call.command,
                    timeout=op.spec.timeout_seconds,
                    max_stdout=op.spec.output.max_bytes,
                    max_stderr=op.spec.output.max_stderr_bytes,
                )
            except UpstreamError as exc:
                verdict = Verdict(
                    code="UPSTREAM_UNAVAILABLE",
                    retryable=exc.retryable,
                    stage="transport",
                    reason=exc.reason,
                    detail=exc.detail,
                )
                call.attempts.append(_attempt(started, None, exc))
                ran = exc.ran
            else:
                verdict = evaluate(op, args, run, self.clock())  # 6-10
                call.attempts.append(_attempt(started, run, None))
                ran = True
                if verdict.rejected:
                    call.attempts[-1]["quarantine"] = await self._quarantine(call, run)
            call.attempts[-1]["verdict"] = _verdict_fields(verdict)
            if not _should_retry(op, verdict, ran, len(call.attempts), deadline):
                return verdict
            await asyncio.sleep(RETRY_BACKOFF_SECONDS * 2 ** (len(call.attempts) - 1))

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

    async def _finish(self, call: CallRecord, verdict: Verdict) -> bytes:
        return await self._commit(call, *self._prepare(call, verdict))

    def _prepare(
        self, call: CallRecord, verdict: Verdict
    ) -> tuple[bytes, dict[str, Any], tuple[str, str | None, str | None, str | None]]:
        """The response line, the result record and what the metrics count, from a verdict."""
        sealed = seal(call.op, call.request_id, verdict)
        code = sealed["error"]["code"] if sealed["outcome"] == "failure" else None
        return (
            _compact(_line(sealed)),
            call.result(verdict, sealed),
            (sealed["outcome"], code, verdict.stage, verdict.reason),
        )

    async def _commit(
        self,
        call: CallRecord,
        line: bytes,
        record: dict[str, Any],
        counted: tuple[str, str | None, str | None, str | None],
    ) -> bytes:
        """Make the result record durable, then hand back the response line to send."""
        try:
            await self.audit.append(record)
        except AuditError as exc:
            log.error("%s result not written: %s", call.request_id, exc)
            self.metrics.audit_failures.inc()
            line = _line(envelope.failure(call.op.name, call.request_id, "INTERNAL", False))
            counted = ("failure", "INTERNAL", "audit", "result_not_written")
        m, tool = self.metrics, call.op.name
        m.observe_call(tool, *counted, time.monotonic() - call.started)
        for attempt in call.attempts:
            if "stdout_bytes" in attempt:
                m.output_bytes.labels(tool).observe(attempt["stdout_bytes"])
        return line


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
    command: str = ""
    attempts: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def _common(self, kind: str) -> dict[str, Any]:
        return {
            "type": kind,
            "time": now_text(),
            "request_id": self.request_id,
            "tool": self.op.name,
            "tool_version": self.op.spec.version,
            "command_sha256": self.op.sha256,
            "schema_sha256": self.op.schema.sha256,
            "adapter_version": __version__,
            "caller": {"uid": self.peer.uid, "gid": self.peer.gid, "pid": self.peer.pid},
            "host": self.op.spec.host,
            "command": self.command,
        }

    def intent(self, attempt: int) -> dict[str, Any]:
        return {**self._common("intent"), "attempt": attempt}

    def result(self, verdict: Verdict, sealed: Mapping[str, Any]) -> dict[str, Any]:
        return {
            **self._common("result"),
            "attempts": self.attempts,
            "outcome": sealed["outcome"],
            "code": sealed["error"]["code"] if sealed["outcome"] == "failure" else None,
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


def _attempt(started: float, run: RunResult | None, error: UpstreamError | None) -> dict[str, Any]:
    record: dict[str, Any] = {"duration_seconds": round(time.monotonic() - started, 6)}
    if run is not None:
        record.update(
            exit_status=run.exit_status,
            stdout_bytes=len(run.stdout),
            stdout_sha256=hashlib.sha256(run.stdout).hexdigest(),
            stderr_bytes=len(run.stderr),
            stderr_sha256=hashlib.sha256(run.stderr).hexdigest(),
            transport_error=None,
        )
    if error is not None:
        record.update(exit_status=None, transport_error=error.reason)
    return record


def _line(value: Mapping[str, Any]) -> bytes:
    """One response line, newline included (no second copy of a large response to add it)."""
    return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)


COMPACT_ABOVE_BYTES: Final = 64 * 1024  # orjson's buffer is ~4x its output; worth a copy above


def _compact(line: bytes) -> bytes:
    """An exact-size copy of a large response, which may wait for an fsync before it is sent."""
    return memoryview(line).tobytes() if len(line) > COMPACT_ABOVE_BYTES else line
