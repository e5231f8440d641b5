"""`sshadapter audit verify | show`: the audit trail's hash chain, and one call's records."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from sshadapter.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_config, config_path


def add(sub: Any) -> None:
    audit = sub.add_parser("audit", help="work with the audit trail")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    verify_ = audit_sub.add_parser(
        "verify",
        help="check the hash chain and list open intents",
        description="Check the hash chain across the audit files and list the intents "
        "without a result. One file (by default the [audit] path of the config) is read "
        "with its rotated siblings (PATH.N and PATH-DATE, optionally .gz), oldest first; "
        "several files are read as given. Exit 0: intact, 1: a break, 2: a file that "
        "cannot be read.",
    )
    verify_.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="audit files, oldest first (default: [audit] path of the config and its "
        "rotated files)",
    )
    verify_.add_argument(
        "--only",
        action="store_true",
        help="read only the files given, not the rotated siblings of a single PATH",
    )
    add_config(verify_)
    verify_.set_defaults(handler=verify)
    show_ = audit_sub.add_parser(
        "show",
        help="print one call's records (approvals, intents, result), the chain verified",
        description="Find every record of REQUEST_ID in the audit file and its rotated "
        "siblings, check the hash chain over all the files read, and print the call: tool, "
        "caller, command, each attempt's verdict, each host's result for a fan-out. "
        "Exit 0: shown, 1: no such call or a break in the chain (one line), 2: a file that "
        "cannot be read.",
    )
    show_.add_argument("request_id", metavar="REQUEST_ID")
    show_.add_argument(
        "path",
        nargs="?",
        type=Path,
        metavar="PATH",
        help="the audit file (default: [audit] path of the config); its rotated files too",
    )
    add_config(show_)
    show_.set_defaults(handler=show)


def _configured_trail(args: argparse.Namespace) -> Path:
    """The configuration's ``[audit] path``."""
    from sshadapter.config import load_config

    return load_config(config_path(args))[0].audit.path


def verify(args: argparse.Namespace) -> int:
    from sshadapter.audit.verify import UnreadableTrail, trail
    from sshadapter.audit.verify import verify as verify_trail

    paths = args.paths or [_configured_trail(args)]
    try:
        if len(paths) == 1 and not args.only:
            paths = trail(paths[0])
        report = verify_trail(paths)
    except UnreadableTrail as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_FAILED


def show(args: argparse.Namespace) -> int:
    """One call's records across the rotated files, the chain verified (docs/audit.md)."""
    from sshadapter.audit.show import REQUEST_ID, format_call
    from sshadapter.audit.verify import UnreadableTrail, trail
    from sshadapter.audit.verify import verify as verify_trail
    from sshadapter.shown import shown

    if not REQUEST_ID.fullmatch(args.request_id):
        print(
            f"sshadapter: {shown(args.request_id, 40)} is no request id (req. and 20 hex digits)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        path = Path(args.path) if args.path is not None else _configured_trail(args)
        report = verify_trail(trail(path), args.request_id)
    except UnreadableTrail as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not report.ok:
        more = f" (and {len(report.breaks) - 1} more)" if len(report.breaks) > 1 else ""
        print(f"sshadapter: audit trail broken: {report.breaks[0]}{more}", file=sys.stderr)
        return EXIT_FAILED
    if not report.kept:
        print(
            f"sshadapter: no record of {args.request_id} in {len(report.files)} audit file(s)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    print(format_call(args.request_id, report.kept))
    return EXIT_OK
