"""`sshadapter approvals list | approve | deny`: the calls that wait for a person."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from sshadapter import client
from sshadapter.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_socket,
    socket_of,
    write_json,
)
from sshadapter.client import MAX_APPROVAL_NOTE_CHARS
from sshadapter.shown import shown


def add(sub: Any) -> None:
    """`sshadapter approvals list | approve REQUEST_ID | deny REQUEST_ID` (approvers only)."""
    approvals = sub.add_parser(
        "approvals",
        help="list, approve or deny calls waiting for a person (configured approvers only)",
        description="Calls of operations with `[approval] required = true` wait here. Only "
        "the [approvals] uids and groups are answered, never for their own calls; anyone "
        "else is told the request is unknown. Exit 0: done, 1: refused or not an approver.",
    )
    approvals_sub = approvals.add_subparsers(
        dest="approvals_command", metavar="COMMAND", required=True
    )
    list_ = approvals_sub.add_parser("list", help="every pending call, in full")
    list_.add_argument(
        "--json", action="store_true", help='print the daemon\'s answer, {"approvals": [...]}'
    )
    add_socket(list_)
    list_.set_defaults(handler=list_pending)
    for verb, text in (("approve", "run"), ("deny", "refuse")):
        decide_ = approvals_sub.add_parser(
            verb, help=f"show one pending call in full, then {text} it (this call only)"
        )
        decide_.add_argument("request_id", metavar="REQUEST_ID")
        decide_.add_argument(
            "--reason",
            default="",
            metavar="TEXT",
            help=f"why (at most {MAX_APPROVAL_NOTE_CHARS} characters): kept in the audit "
            "record of the decision",
        )
        if verb == "approve":
            decide_.add_argument(
                "--digest",
                metavar="HEX",
                help="approve only if the pending command's sha256 is this one (as listed)",
            )
        add_socket(decide_)
        decide_.set_defaults(handler=decide, verb=verb)


def _pending(socket_path: Path) -> list[dict[str, Any]] | None:
    """The pending calls, or None (after saying so) when the daemon does not answer us as an
    approver."""
    try:
        answer = client.request(socket_path, {"op": "approvals"})
    except client.ClientError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("approvals"), list):
        print("sshadapter: refused: not an approver ([approvals] uids, groups)", file=sys.stderr)
        return None
    return list(answer["approvals"])


def _show_pending(entry: dict[str, Any]) -> None:
    """One pending call as the approver reads it. Every field is escaped (an agent chose
    the arguments, and so part of the command: an ESC sequence, a CR or a bidi override
    must not make the screen show another command than the one approved), and nothing
    the approver decides on is cut."""
    where = (
        f"target {entry['target']} ({', '.join(entry['hosts'])})"
        if "target" in entry
        else f"host {entry['host']}"
    )
    caller = entry["caller"]
    print(shown(f"{entry['request_id']}  {entry['tool']}  {where}", None))
    print(shown(f"  caller     uid {caller['uid']} gid {caller['gid']} pid {caller['pid']}"))
    print(f"  waiting    {shown(entry['waiting_seconds'])}s")
    print(f"  arguments  {shown(orjson.dumps(entry['arguments']).decode(), None)}")
    print(f"  command    {shown(entry['command'], None)}")
    print(f"  sha256     {shown(entry['digest'])}")
    print(f"  expires    {shown(entry['expires'])}")


def list_pending(args: argparse.Namespace) -> int:
    pending = _pending(socket_of(args))
    if pending is None:
        return EXIT_FAILED
    if args.json:
        write_json({"approvals": pending})
        return EXIT_OK
    for entry in pending:
        _show_pending(entry)
    if not pending:
        print("no call waits for approval")
    return EXIT_OK


def decide(args: argparse.Namespace) -> int:
    if len(args.reason) > MAX_APPROVAL_NOTE_CHARS:
        print(
            f"sshadapter: --reason: {len(args.reason)} characters, at most "
            f"{MAX_APPROVAL_NOTE_CHARS}: nothing was sent",
            file=sys.stderr,
        )
        return EXIT_USAGE
    socket = socket_of(args)
    pending = _pending(socket)
    if pending is None:
        return EXIT_FAILED
    entry = next((e for e in pending if e.get("request_id") == args.request_id), None)
    if entry is None:
        print(f"sshadapter: no call waits under {shown(args.request_id)}", file=sys.stderr)
        return EXIT_FAILED
    _show_pending(entry)  # exactly what is approved or denied
    message: dict[str, Any] = {"op": args.verb, "request_id": args.request_id}
    if args.verb == "approve":
        message["digest"] = args.digest or entry["digest"]
    if args.reason:
        message["note"] = args.reason
    try:
        answer = client.request(socket, message)
    except client.ClientError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(answer, dict) or "decision" not in answer:
        refused = answer.get("refused") if isinstance(answer, dict) else None
        print(f"sshadapter: refused: {shown(refused or 'not an approver')}", file=sys.stderr)
        return EXIT_FAILED
    print(shown(answer["decision"]))
    return EXIT_OK
