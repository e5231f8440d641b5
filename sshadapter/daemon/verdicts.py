"""What the service does with a verdict besides answering it: retry it, count it, log it.

Each is a rule of docs/protocol.md "Stages" kept out of the stages themselves
(service.py), so that those read top to bottom: when a failed attempt is tried again,
what a refused or failed call's one log line says, and the answer the daemon gives
without a verdict to seal.
"""

from __future__ import annotations

import logging
import time
from typing import Final

import orjson

from sshadapter.contract import envelope
from sshadapter.contract.evaluate import Sealed, Verdict
from sshadapter.contract.registry import Operation
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.records import CallRecord

log = logging.getLogger("sshadapter.daemon.service")  # the call's lines: one logger, as documented

RETRY_BACKOFF_SECONDS: Final = 0.2  # before the 2nd attempt, doubling: a blip has time to pass


def should_retry(
    op: Operation, verdict: Verdict, ran: bool, attempts: int, deadline: float
) -> bool:
    """Whether a failed attempt is tried again: a code the operation retries, retryable,
    attempts and the retry budget left, and (once the command ran) an idempotent one."""
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


def count(m: Metrics, call: CallRecord, verdict: Verdict) -> None:
    """A call answered, in the metrics: its outcome and time, its outputs' sizes."""
    tool, sealed, failure = call.op.name, verdict.sealed, verdict.failure
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


def log_failure(call: CallRecord, verdict: Verdict) -> None:
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
        extra={
            "request_id": call.request_id,
            "tool": call.op.name,
            "code": code,
            "stage": stage,
            "reason": reason,
        },
    )


def answered(call: CallRecord, code: str) -> Sealed:
    """A failure the daemon answers without a verdict to seal (the result record could not
    be made durable; the drain cut the call): not retryable."""
    line = orjson.dumps(
        envelope.failure(call.op.name, call.request_id, code, False),
        option=orjson.OPT_APPEND_NEWLINE,
    )
    return Sealed("failure", code, line)
