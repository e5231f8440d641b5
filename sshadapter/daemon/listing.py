"""What a caller may see and name: the `list` and `targets` answers (docs/protocol.md
"list", "targets"), each for one caller's own choices, the digest `list` carries, and
stage 3's reading of `run_on` among those choices.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Mapping
from typing import Any, Final

import orjson

from sshadapter.config import Grant
from sshadapter.contract import envelope
from sshadapter.contract.codes import TARGET_ARGUMENT
from sshadapter.contract.registry import Operation, Registry
from sshadapter.daemon.access import Access, Peer
from sshadapter.daemon.records import CallRecord
from sshadapter.errors import RequestError
from sshadapter.inventory.fleet import Inventory, host_set_digest

_NOT_A_CHOICE: Final = {"parameter": TARGET_ARGUMENT, "rule": "choice"}
"""The one hint for a `run_on` this caller may not use, whatever the reason (no oracle)."""

# `run_on` is published as an enum up to this many choices (groups are few; ~16 bytes
# each): past it, a pattern and the paged `targets` listing, so that one tool's schema
# stays small for the agent host (an enum of 1,000 aliases is ~16 KB per tool).
MAX_TARGET_ENUM: Final = 64
TARGETS_PAGE: Final = 500  # names per `targets` answer: ~8 KB


def read_target(
    call: CallRecord,
    args: Mapping[str, Any],
    choices: tuple[str, ...],
    access: Access,
    inventory: Inventory,
) -> Mapping[str, Any]:
    """Stage 3 for an operation with targets: `run_on` among the caller's choices, its
    hosts within the fan-out policy. Returns the other arguments."""
    op = call.op
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
        if target in access.candidates(op):
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


def tools_for(registry: Registry, access: Access, peer: Peer) -> list[Mapping[str, Any]]:
    """`list` for ``peer``: the tools it may call; `run_on` lists its own choices."""
    entries = []
    for op in registry.operations.values():
        choices = access.choices(op, peer)
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


def targets_page(access: Access, op: Operation, peer: Peer, after: str) -> dict[str, Any]:
    """The `targets` answer: ``peer``'s choices for ``op`` after ``after``, one page."""
    choices = access.choices(op, peer)
    if not choices:
        raise RequestError("unknown_tool")  # not listed for this caller: as if absent
    start = bisect.bisect_right(choices, after) if after else 0
    page = list(choices[start : start + TARGETS_PAGE])
    more = start + TARGETS_PAGE < len(choices)
    return {"tool": op.name, "targets": page, "next": page[-1] if more and page else None}


def list_digest(registry: Registry, inventory: Inventory, grants: tuple[Grant, ...]) -> str:
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
