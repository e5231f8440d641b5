"""Stage 3, approval: a call that changes things waits for a person (docs/protocol.md "Approval").

An operation whose command file says ``[approval] required = true`` is held after
stage 3 (its arguments checked, its target resolved, its exact command built) and
before stage 4: it is registered as pending, an ``approval`` record (event
``requested``) is made durable, and the call waits, holding no call slot, until an
approver decides or its ``timeout_seconds`` pass. The decision is written to the audit
trail before the call goes on, and the command that then runs is compared with the
digest the approver approved.

An approval covers one call (its request id) and the exact command (its sha256); never
a pattern. Pending approvals survive nothing: a reload that changes the operation, its
target's hosts or its caller's right to it invalidates them, and the drain cancels
them. Nor do they outlive their caller: one whose connection is gone (a killed CLI, an
agent host that gave up) is cancelled at once, so an approver never runs a command for
nobody, nor twice for an agent that asked again. Approvers are the ``[approvals]`` uids
and groups, as the kernel names the peer (SO_PEERCRED); the call's own caller uid never
approves its own call.

Events of the ``approval`` record: ``requested``; ``approved`` and ``denied`` (by an
approver, written before the waiting call learns it); ``timeout``, ``invalidated`` and
``cancelled`` (written by the waiting call; a ``cancelled`` with its reason from
``errors.APPROVAL_CANCELLATIONS``); ``refused`` (an approver's request that decided
nothing, with its reason from ``errors.APPROVER_REFUSALS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from sshadapter.audit.writer import AuditLog, now_text
from sshadapter.config import ApprovalsSection
from sshadapter.contract.codes import SYSTEM_TOOL
from sshadapter.daemon.access import Peer, resolve
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.records import Approval, CallRecord, command_digest, who
from sshadapter.errors import ApprovalError, AuditError, OverloadedError
from sshadapter.sections import Allow

# The requests only approvers are answered; everyone else gets `unknown_op`, exactly as
# for an op that does not exist (no oracle for the channel).
APPROVER_OPS: Final = frozenset({"approvals", "approve", "deny"})
# How each ending that is not an approval answers the waiting call.
_REASON_OF: Final = {
    "denied": "approval_denied",
    "timeout": "approval_timeout",
    "invalidated": "approval_invalidated",
    "cancelled": "approval_cancelled",
}
# Every value of sshadapter_approvals_total{outcome} (docs/metrics.md).
OUTCOMES: Final = ("approved", *_REASON_OF, "refused")
Watch = Callable[[], AbstractContextManager[asyncio.Future[None]]]
"""Watches a call's caller while the call waits: the future is done once it has gone."""


@contextlib.contextmanager
def unwatched() -> Iterator[asyncio.Future[None]]:
    """A caller nobody can see leave (one in this process): its future is never done."""
    never = asyncio.get_running_loop().create_future()
    try:
        yield never
    finally:
        never.cancel()


@dataclass(eq=False)
class _Pending:
    call: CallRecord
    args: Mapping[str, Any]
    digest: str
    expires: str
    since: float = field(default_factory=time.monotonic)
    """When it began to wait (monotonic): the listing says for how long."""
    decided: asyncio.Future[tuple[str, Approval | None]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def entry(self) -> dict[str, Any]:
        """Its row of the `approvals` answer: exactly what would run, and where."""
        call = self.call
        where = (
            {"target": call.target, "hosts": list(call.hosts)}
            if call.op.multi
            else {"host": call.op.spec.host}
        )
        return {
            "request_id": call.request_id,
            "tool": call.op.name,
            **where,
            "arguments": dict(self.args),
            "command": call.command,
            "digest": self.digest,
            "caller": who(call.peer),
            "waiting_seconds": int(time.monotonic() - self.since),
            "expires": self.expires,
        }


def _never(call: CallRecord) -> bool:
    return False


class Approvals:
    """The calls waiting for a person, and the approvers' requests about them."""

    def __init__(self, section: ApprovalsSection, audit: AuditLog, metrics: Metrics) -> None:
        self.approvers = resolve(Allow(uids=section.uids, groups=section.groups), where="approvals")
        self.max_pending = section.max_pending
        self.audit = audit
        self.metrics = metrics
        self.pending: dict[str, _Pending] = {}
        """By request id, in the order they came."""
        metrics.approvals_pending.set_function(lambda: len(self.pending))

    def admits(self, peer: Peer) -> bool:
        """Whether ``peer`` is an approver (its uid, primary or supplementary group)."""
        return self.approvers.admit(peer)

    async def wait(
        self, call: CallRecord, args: Mapping[str, Any], watch: Watch = unwatched
    ) -> Approval:
        """Hold ``call`` until an approver approves it; ApprovalError for any other ending,
        OverloadedError when ``max_pending`` calls wait already. ``watch`` sees its caller
        leave: the call is then cancelled at once."""
        if len(self.pending) >= self.max_pending:
            self.metrics.approvals.labels(call.op.name, "refused").inc()
            raise OverloadedError("approvals_full")
        timeout = call.op.spec.approval.timeout_seconds
        expires = now_text(datetime.now(UTC) + timedelta(seconds=timeout))
        pending = _Pending(call, args, command_digest(call.command), expires)
        self.pending[call.request_id] = pending
        cancelled_by = "shutdown"  # the drain's ending, unless the caller went first
        try:
            with watch() as gone:
                # Written at once (no await before it): it precedes any decision's record.
                await self.audit.append(self._record(pending, "requested"))
                call.progress.waiting_for_approval()
                done, _ = await asyncio.wait(
                    (pending.decided, gone), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
            still = pending.decided not in done
            if still and self.pending.pop(call.request_id, None) is not None:
                outcome, approval = ("cancelled" if gone in done else "timeout"), None
                cancelled_by = "caller_gone"
            else:  # decided, or an approver's decision is being made durable right now
                outcome, approval = await pending.decided
        finally:
            self.pending.pop(call.request_id, None)  # a failed write, a cancelled call
        if outcome in ("timeout", "invalidated", "cancelled"):  # the approvers' are written
            reason = cancelled_by if outcome == "cancelled" else None
            await self.audit.append(self._record(pending, outcome, reason=reason))
        self.metrics.approvals.labels(call.op.name, outcome).inc()
        if approval is None:
            raise ApprovalError(_REASON_OF[outcome])
        return approval

    def listing(self) -> dict[str, Any]:
        """The `approvals` answer: every pending call, oldest first."""
        return {"approvals": [pending.entry() for pending in self.pending.values()]}

    async def decide(
        self, peer: Peer, request_id: str, digest: str | None, note: str = ""
    ) -> dict[str, Any]:
        """`approve` (``digest`` given: it must be the pending command's) or `deny` (None),
        by the approver ``peer``, ``note`` its reason (none if empty); the decision is
        durable before the call learns it."""
        pending = self.pending.get(request_id)
        refusal = None
        if pending is None:
            refusal = "not_pending"
        elif peer.uid == pending.call.peer.uid:
            refusal = "own_call"
        elif digest is not None and digest != pending.digest:
            refusal = "digest_mismatch"
        if refusal is not None:
            return await self._refuse(peer, request_id, pending, refusal)
        assert pending is not None
        del self.pending[request_id]  # single use: no second decision, no timeout now
        outcome = "denied" if digest is None else "approved"
        approval = Approval(peer, pending.digest) if digest is not None else None
        try:
            record = self._record(pending, outcome, approver=peer)
            await self.audit.append({**record, "note": note} if note else record)
        except AuditError as exc:
            pending.decided.set_exception(exc)  # the call does not run: INTERNAL
            self.metrics.audit_failures.inc()
            return {"request_id": request_id, "refused": "not_recorded"}
        pending.decided.set_result((outcome, approval))
        return {"request_id": request_id, "decision": outcome}

    def end(self, outcome: str, still_valid: Callable[[CallRecord], bool] = _never) -> None:
        """End every pending call ``still_valid`` rejects with ``outcome`` (``invalidated``
        at a reload, ``cancelled`` at the drain)."""
        for request_id, pending in list(self.pending.items()):
            if not still_valid(pending.call):
                del self.pending[request_id]
                pending.decided.set_result((outcome, None))

    async def _refuse(
        self, peer: Peer, request_id: str, pending: _Pending | None, reason: str
    ) -> dict[str, Any]:
        self.metrics.approvals.labels(
            pending.call.op.name if pending else SYSTEM_TOOL, "refused"
        ).inc()
        record = (
            self._record(pending, "refused", approver=peer)
            if pending is not None
            else {"type": "approval", "time": now_text(), "request_id": request_id}
            | {"event": "refused", "approver": who(peer)}
        )
        try:
            await self.audit.append({**record, "reason": reason})
        except AuditError:
            self.metrics.audit_failures.inc()
        return {"request_id": request_id, "refused": reason}

    def _record(
        self,
        pending: _Pending,
        event: str,
        *,
        approver: Peer | None = None,
        reason: str | None = None,
    ) -> dict[str, Any]:
        call = pending.call
        record: dict[str, Any] = {
            "type": "approval",
            "time": now_text(),
            "request_id": call.request_id,
            "event": event,
            "tool": call.op.name,
            "caller": who(call.peer),
            "digest": pending.digest,
        }
        if event == "requested":
            record["command"] = call.command
            record["expires"] = pending.expires
        if approver is not None:
            record["approver"] = who(approver)
        if reason is not None:
            record["reason"] = reason
        return record
