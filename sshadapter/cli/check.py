"""`sshadapter check | catalog | schema | record`: the command files, proved offline (and
each dispatch host's policy and certificate with ``check --hosts``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sshadapter import client
from sshadapter.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_config,
    load,
    registry_dir,
    write_json,
)

if TYPE_CHECKING:
    from sshadapter.check.record import Found
    from sshadapter.config import Config


def add(sub: Any) -> None:
    check_ = sub.add_parser("check", help="lint commands and schemas, run fixtures and near-misses")
    add_config(check_)
    check_.add_argument("--json", action="store_true", help="print the report as a JSON list")
    check_.add_argument(
        "--hosts",
        action="store_true",
        help="also connect to every dispatch host (32 at a time) and compare its policy with ours",
    )
    check_.add_argument(
        "--target",
        metavar="TARGET",
        help="with --hosts: only the dispatch hosts of this group (or this host alias)",
    )
    check_.set_defaults(handler=check)

    catalog_ = sub.add_parser(
        "catalog",
        help="print docs/catalog.md: the shipped catalog's operations, fields and proofs",
    )
    catalog_.set_defaults(handler=catalog)

    _add_record(sub)

    schema_ = sub.add_parser("schema", help="print a tool's published envelope schema")
    add_config(schema_)
    schema_.add_argument("tool")
    schema_.set_defaults(handler=schema)


def _add_record(sub: Any) -> None:
    """`sshadapter record CASE --request REQUEST_ID | --tool TOOL --stdout FILE ...`."""
    record_ = sub.add_parser(
        "record",
        help="turn a quarantined rejection or a captured output into a fixture case",
        description="Write CASE.stdout (.stderr) and CASE.case.json into the operation's "
        "fixtures directory (docs/fixtures.md), never replacing a case. --request: the bytes "
        "from the quarantine, the tool, exit status and time from the call's result record "
        "(the chain verified), the arguments read back from its command. --tool with "
        "--stdout: an output you captured. Exit 0: written, 1: nothing written (one line).",
    )
    record_.add_argument("case", metavar="CASE", help="the case name (a file stem)")
    source = record_.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", metavar="REQUEST_ID", help="a call with a rejected output")
    source.add_argument("--tool", metavar="TOOL", help="the tool whose output --stdout holds")
    record_.add_argument("--host", metavar="HOST", help="--request of a fan-out: which host")
    record_.add_argument("--stdout", type=Path, metavar="FILE", help="--tool: the stdout bytes")
    record_.add_argument("--stderr", type=Path, metavar="FILE", help="--tool: the stderr bytes")
    record_.add_argument("--exit-status", type=int, default=0, metavar="N", help="--tool: (0)")
    record_.add_argument(
        "--now",
        metavar="TIME",
        help="the clock of the case, RFC 3339 (default: the call's time; --tool: now)",
    )
    record_.add_argument(
        "--args",
        nargs="*",
        default=None,
        metavar="key=value",
        help="the call's arguments (key:=json for a number or boolean); --request: default "
        "read back from the recorded command, and checked to rebuild it either way",
    )
    record_.add_argument(
        "--expect",
        default="",
        metavar="success|CODE",
        help="the expectation you confirm (default: what the daemon decided; --tool: what "
        "the contract gives now)",
    )
    add_config(record_)
    record_.set_defaults(handler=record)


def catalog(args: argparse.Namespace) -> int:
    from sshadapter.check.catalog_doc import markdown

    sys.stdout.write(markdown())
    return EXIT_OK


def schema(args: argparse.Namespace) -> int:
    registry = load(args)[2].registry
    op = registry.get(args.tool)
    if op is None:
        print(f"sshadapter: no tool {args.tool!r} in {registry_dir(registry)}", file=sys.stderr)
        return EXIT_USAGE
    write_json(op.envelope_schema)
    return EXIT_OK


def record(args: argparse.Namespace) -> int:
    """A fixture case from a quarantined rejection or a captured output (docs/fixtures.md)."""
    from datetime import UTC, datetime

    from sshadapter.bounded_read import read_with_mode
    from sshadapter.check import record
    from sshadapter.check.fixtures import MAX_RECORDED_BYTES
    from sshadapter.contract.rfc3339 import format_rfc3339, parse_rfc3339
    from sshadapter.runners.interface import RunResult

    _, config, loaded = load(args)
    registry = loaded.registry
    try:
        given = None if args.args is None else client.parse_assignments(args.args)
        if args.request is not None:
            found = _quarantined(config, args.request, args.host)
        else:
            if args.stdout is None:
                raise record.RecordError("--tool needs --stdout FILE (and --args, --exit-status)")
            stdout, mode = read_with_mode(args.stdout, MAX_RECORDED_BYTES)
            stderr = b""
            if args.stderr:
                stderr, stderr_mode = read_with_mode(args.stderr, MAX_RECORDED_BYTES)
                mode &= stderr_mode
            found = record.Found(
                args.tool, None, stdout, stderr, args.exit_status, None, None, mode
            )
        op = registry.get(found.tool)
        if op is None:
            raise record.RecordError(f"no tool {found.tool[:64]!r} in {registry_dir(registry)}")
        call_args = given
        if call_args is None:
            recovered = record.recover_args(op, found.command) if found.command else None
            if recovered is None and found.command is not None:
                raise record.RecordError("cannot read the arguments back: give them with --args")
            call_args = recovered or {}
        record.check_args(op, call_args, found.command)
        if not 0 <= found.exit_status <= 255:
            raise record.RecordError(f"exit status {found.exit_status}: 0-255")
        now_text = args.now or found.time or format_rfc3339(datetime.now(UTC))
        try:
            now = parse_rfc3339(now_text)
        except (TypeError, ValueError) as exc:
            raise record.RecordError(f"--now {now_text[:40]!r}: not an RFC 3339 time") from exc
        run = RunResult(found.stdout, found.stderr, found.exit_status)
        expect, note = record.expectation(op, call_args, run, now, args.expect, found.decided)
        document = {
            "args": call_args,
            "exit_status": found.exit_status,
            "now": now_text,
            "expect": expect,
        }
        written = record.write_case(op, args.case, document, found.stdout, found.stderr, found.mode)
    except (record.RecordError, ValueError) as exc:
        print(f"sshadapter: record: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for path in written:
        print(f"wrote {path}")
    if note:
        print(f"sshadapter: note: {note}", file=sys.stderr)
    return EXIT_OK


def _quarantined(config: Config, request_id: str, host: str | None) -> Found:
    """The call's result records from the audit trail, the chain verified, then its
    quarantined output (``check.record.quarantined``)."""
    from sshadapter.audit.show import REQUEST_ID
    from sshadapter.audit.verify import UnreadableTrail, trail, verify
    from sshadapter.check.record import RecordError, quarantined

    if not REQUEST_ID.fullmatch(request_id):
        raise RecordError(f"{request_id[:40]!r} is no request id (req. and 20 hex digits)")
    try:
        report = verify(trail(config.audit.path), request_id)
    except UnreadableTrail as exc:
        raise RecordError(str(exc)) from exc
    if not report.ok:
        raise RecordError(f"audit trail broken: {report.breaks[0]}")
    results = [r for _, r in report.kept if r.get("type") == "result"]
    if not results:
        raise RecordError(f"no result record of {request_id} in {config.audit.path}")
    return quarantined(request_id, results, config.audit.quarantine_dir, host)


def check(args: argparse.Namespace) -> int:
    from sshadapter.check.report import check_registry, format_table, warnings
    from sshadapter.daemon.assemble import warm_aliases

    config_path, config, loaded = load(args)
    registry, inventory, policies = loaded.registry, loaded.inventory, loaded.policies
    warm_aliases(config, inventory, str(config_path or "<defaults>"))  # as serve
    rows = check_registry(registry)
    # not a miss: the exit status stays the table's
    for warning in [*warnings(registry), *inventory.warnings()]:
        print(f"sshadapter: warning: {warning}", file=sys.stderr)
    if config_path is None:
        print(
            "sshadapter: note: no configuration file, so host aliases were not checked "
            "(give --config to check them)",
            file=sys.stderr,
        )
    if args.target is not None and not args.hosts:
        print("sshadapter: --target chooses the hosts of --hosts: give both", file=sys.stderr)
        return EXIT_USAGE
    hosts = []
    certificates: list[dict[str, Any]] = []
    if args.hosts:  # the one part of `check` that talks to hosts (docs/dispatcher.md)
        from sshadapter.daemon.drift import check_hosts, format_hosts

        members = None
        if args.target is not None:
            members = inventory.members(args.target)
            if not set(members) & set(policies):
                what = "is no host alias and no group" if not members else "has no dispatch host"
                print(f"sshadapter: --target {args.target!r} {what}", file=sys.stderr)
                return EXIT_USAGE
        hosts = asyncio.run(check_hosts(config, policies, hosts=members))
        certificates = _certificate_problems(config, members)
    if args.json:
        report = [r.as_json() for r in rows] + [h.as_json() for h in hosts] + certificates
        write_json(report)
    else:
        print(format_table(rows))
        if args.hosts:
            print(format_hosts(hosts))
            for problem in certificates:
                got = problem["got"]
                line = f"{problem['case']:<12}  certificate {got['certificate']}: {got['detail']}"
                print(f"{line}  MISS")
    ok = all(r.ok for r in rows) and all(h.ok for h in hosts) and not certificates
    return EXIT_OK if ok else EXIT_FAILED


def _certificate_problems(config: Config, members: Sequence[str] | None) -> list[dict[str, Any]]:
    """Each host's client certificate that is unreadable, expired or not yet valid: read
    here, nothing is sent (docs/operations.md "User certificates")."""
    from sshadapter.runners.ssh.file_cache import certificate_problems

    hosts = {a: s for a, s in config.hosts.items() if members is None or a in members}
    directory = os.environ.get("CREDENTIALS_DIRECTORY")
    return [
        {
            "tool": "-",
            "case": alias,
            "kind": "client_certificate",
            "expected": {"certificate": "valid now"},
            "got": {"certificate": label, "detail": why},
            "ok": False,
            "rejection": None,
        }
        for alias, label, why in certificate_problems(hosts, Path(directory) if directory else None)
    ]
