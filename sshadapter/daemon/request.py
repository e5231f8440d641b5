"""Stage 1: what a request line may be (docs/protocol.md "Requests"), read strictly.

A request line is parsed by the same strict parser as results, within its own bounds;
each op has a closed set of keys and each key its type. Anything else is
INVALID_REQUEST (``RequestError``) before any tool is looked at: nothing could run,
so the service logs and counts it but writes no audit record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sshadapter.client import MAX_APPROVAL_NOTE_CHARS, PROGRESS_VERSION
from sshadapter.daemon.approvals import APPROVER_OPS
from sshadapter.errors import RequestError
from sshadapter.strict_json import StrictJSONError, strict_loads

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
        if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
            raise RequestError("malformed_call")
        if op == "approve" and not (isinstance(digest, str) and _DIGEST.fullmatch(digest)):
            raise RequestError("malformed_call")
        note = value.get("note", "")
        if not isinstance(note, str) or len(note) > MAX_APPROVAL_NOTE_CHARS:
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
