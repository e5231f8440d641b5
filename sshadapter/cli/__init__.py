"""The command line: ``sshadapter serve | call | list | mcp | check | schema | policy |
sudoers | dispatcher | demo | audit | record | inventory | grants | approvals``.

Exit status: 0 success, 1 a check missed or a call failed, 2 a usage or
configuration error. An operator's mistake is one line naming the file, the
key and the reason, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from sshadapter import __version__, client
from sshadapter.daemon import logs
from sshadapter.errors import ConfigError
from sshadapter.shipped import docs_location
from sshadapter.shown import json_shown, shown

if TYPE_CHECKING:
    from sshadapter.config import Config
    from sshadapter.contract.registry import Registry

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# `grants explain` of a uid without a passwd entry: its primary group is unknown, and no
# gid a group name resolves to is negative, so this one matches no `groups` of a grant.
NO_GID: Final = -1


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["mcp"]:
        # An agent host starts `sshadapter mcp` for every session: it parses its own options
        # and loads neither pydantic nor the schema libraries (half its start-up time and
        # RSS; tests/bench/bench_mcp.py). The other commands import them where they are used.
        return _mcp_main(words[1:])
    logs.escape_unconfigured()
    parser = _parser()
    args = parser.parse_args(words)
    if not getattr(args, "command", None):
        parser.print_usage(sys.stderr)
        return EXIT_USAGE
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(logs.early_line(f"sshadapter: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def _mcp_main(words: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="sshadapter mcp", description=MCP_HELP)
    _add_socket(parser)
    try:
        return _cmd_mcp(parser.parse_args(words))
    except KeyboardInterrupt:
        return 130


MCP_HELP = "serve MCP on stdio (for an agent host), forwarding each call to the daemon"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sshadapter",
        description="Named SSH operations for AI agents: the daemon runs only the commands an "
        "operator defined and answers with validated facts or a failure code.",
        epilog="Exit status: 0 success, 1 a failed call or a missed check, 2 a usage or "
        "configuration error (one line naming the file, the key and the reason). "
        f"Reference: {docs_location()}; the example operations, units and rules: "
        "sshadapter examples --write DIR.",
    )
    parser.add_argument("--version", action="version", version=f"sshadapter {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    check = sub.add_parser("check", help="lint commands and schemas, run fixtures and near-misses")
    _add_config(check)
    check.add_argument("--json", action="store_true", help="print the report as a JSON list")
    check.add_argument(
        "--hosts",
        action="store_true",
        help="also connect to every dispatch host (32 at a time) and compare its policy with ours",
    )
    check.add_argument(
        "--target",
        metavar="TARGET",
        help="with --hosts: only the dispatch hosts of this group (or this host alias)",
    )
    check.set_defaults(handler=_cmd_check)

    catalog = sub.add_parser(
        "catalog",
        help="print docs/catalog.md: the shipped catalog's operations, fields and proofs",
    )
    catalog.set_defaults(handler=_cmd_catalog)

    serve = sub.add_parser("serve", help="run the daemon")
    _add_config(serve)
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="log lines at this level and above (default: [logging] level, info)",
    )
    serve.set_defaults(handler=_cmd_serve)

    call = sub.add_parser("call", help="call a tool through the daemon, print the envelope")
    call.add_argument("tool")
    call.add_argument(
        "args",
        nargs="*",
        metavar="key=value",
        help="a string argument, or key:=json for a number or boolean",
    )
    _add_socket(call)
    call.set_defaults(handler=_cmd_call)

    list_ = sub.add_parser("list", help="list the tools this caller may call")
    _add_socket(list_)
    list_.set_defaults(handler=_cmd_list)

    mcp = sub.add_parser("mcp", help=MCP_HELP)
    _add_socket(mcp)
    mcp.set_defaults(handler=_cmd_mcp)

    demo = sub.add_parser(
        "demo",
        help="run the daemon against an embedded SSH target, "
        "make example calls, clean up (no root, no sshd, no config)",
    )
    demo.set_defaults(handler=_cmd_demo)

    examples = sub.add_parser(
        "examples",
        help="write out the shipped examples: commands/, schemas/, systemd/, prometheus/, "
        "docs/, config.example.toml",
        description="Copy the files shipped with this install into DIR (new or empty; never "
        "overwrites), to edit and install as the README's operator guide says.",
    )
    examples.add_argument(
        "--write", type=Path, required=True, metavar="DIR", help="a new or empty directory"
    )
    examples.set_defaults(handler=_cmd_examples)

    audit = sub.add_parser("audit", help="work with the audit trail")
    audit_sub = audit.add_subparsers(dest="audit_command", metavar="COMMAND", required=True)
    verify = audit_sub.add_parser(
        "verify",
        help="check the hash chain and list open intents",
        description="Check the hash chain across the audit files and list the intents "
        "without a result. One file (by default the [audit] path of the config) is read "
        "with its rotated siblings (PATH.N and PATH-DATE, optionally .gz), oldest first; "
        "several files are read as given. Exit 0: intact, 1: a break, 2: a file that "
        "cannot be read.",
    )
    verify.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="audit files, oldest first (default: [audit] path of the config and its "
        "rotated files)",
    )
    verify.add_argument(
        "--only",
        action="store_true",
        help="read only the files given, not the rotated siblings of a single PATH",
    )
    _add_config(verify)
    verify.set_defaults(handler=_cmd_audit_verify)
    show = audit_sub.add_parser(
        "show",
        help="print one call's records (approvals, intents, result), the chain verified",
        description="Find every record of REQUEST_ID in the audit file and its rotated "
        "siblings, check the hash chain over all the files read, and print the call: tool, "
        "caller, command, each attempt's verdict, each host's result for a fan-out. "
        "Exit 0: shown, 1: no such call or a break in the chain (one line), 2: a file that "
        "cannot be read.",
    )
    show.add_argument("request_id", metavar="REQUEST_ID")
    show.add_argument(
        "path",
        nargs="?",
        type=Path,
        metavar="PATH",
        help="the audit file (default: [audit] path of the config); its rotated files too",
    )
    _add_config(show)
    show.set_defaults(handler=_cmd_audit_show)

    _add_record(sub)

    policy_ = sub.add_parser(
        "policy",
        help="print the dispatch policy of a host alias, or the one of a group's members (JSON)",
        description="Print the policy a dispatch host installs. For a group, one document "
        '(its "host" the group) every member installs, refused unless all members run '
        "the same operations.",
    )
    _add_config(policy_)
    policy_.add_argument("target", metavar="TARGET", help="a host alias or a group")
    policy_.set_defaults(handler=_cmd_policy)

    sudoers = sub.add_parser(
        "sudoers",
        help="print the sudoers drop-in of a dispatch host's or group's run_as operations",
        description="Print the sudoers drop-in for the dispatch account: one rule per "
        "operation with run_as, the exact command and its arguments (see the dispatcher "
        "reference, Root operations). --check proves it with this machine's visudo and "
        "sudo (as root, where the account exists): examples allowed, mutations refused.",
    )
    _add_config(sudoers)
    sudoers.add_argument("target", metavar="TARGET", help="a host alias or a group")
    sudoers.add_argument(
        "--check",
        action="store_true",
        help="also prove it (visudo -c, then sudo -l -U on allowed and mutated arguments and "
        "visudo -c on the whole installed sudoers, any warning a failure; installs it in "
        "/etc/sudoers.d under a temporary name meanwhile)",
    )
    sudoers.set_defaults(handler=_cmd_sudoers)

    dispatcher = sub.add_parser(
        "dispatcher",
        help="write out the host's sshadapter-dispatch",
        description="Write the host's sshadapter-dispatch. Install it as root, then run "
        "PATH --compile on the host, so calls skip compiling it (docs/dispatcher.md).",
    )
    dispatcher.add_argument(
        "--write", type=Path, required=True, metavar="PATH", help="the file to write (mode 0755)"
    )
    dispatcher.set_defaults(handler=_cmd_dispatcher)

    inventory = sub.add_parser("inventory", help="show the fleet: hosts, groups, their members")
    inventory_sub = inventory.add_subparsers(dest="inventory_command", metavar="COMMAND")
    show = inventory_sub.add_parser(
        "show",
        help="list the groups (or one target's resolved hosts) with their digests",
        description="Without TARGET: every group with its size and digest, and the number "
        "of hosts. With TARGET (a group or a host alias): its hosts, sorted, one per line, "
        "then its digest (the audit's hosts_sha256).",
    )
    _add_config(show)
    show.add_argument("target", nargs="?", metavar="TARGET", default="")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=_cmd_inventory_show)
    _add_import(inventory_sub)
    _add_config(inventory)  # `sshadapter inventory` alone: `show` of every group
    inventory.set_defaults(handler=_cmd_inventory_show, target="", json=False)

    grants = sub.add_parser("grants", help="explain who may run what where")
    grants_sub = grants.add_subparsers(dest="grants_command", metavar="COMMAND", required=True)
    explain = grants_sub.add_parser(
        "explain",
        help="say whether a uid may run TOOL on TARGET, and why",
        description="The decision the daemon would take for a caller with this uid (and the "
        "groups the system gives its user) calling TOOL with run_on TARGET (for an operation "
        "on one host, its host alias). Exit 0: allowed, 1: denied.",
    )
    _add_config(explain)
    explain.add_argument("uid", metavar="UID_OR_USER")
    explain.add_argument("tool")
    explain.add_argument("target", metavar="TARGET")
    explain.set_defaults(handler=_cmd_grants_explain)

    _add_approvals(sub)

    schema = sub.add_parser("schema", help="print a tool's published envelope schema")
    _add_config(schema)
    schema.add_argument("tool")
    schema.set_defaults(handler=_cmd_schema)
    return parser


def _add_import(inventory_sub: Any) -> None:
    """`sshadapter inventory import ansible|ssh-config`: inventory files for review."""
    import_ = inventory_sub.add_parser(
        "import",
        help="write an inventory file from Ansible or ssh -G, for review (never fetches keys)",
        description="Read Ansible's inventory or OpenSSH's resolution and write one inventory "
        "file. Only hosts with a key pinned in --known-hosts (a key line or an "
        "@cert-authority line) are written; every host, group or label left out is reported "
        "on stderr. Exit 0: all imported, 1: something left out, 2: a usage or input error.",
    )
    sources = import_.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    ansible = sources.add_parser(
        "ansible",
        help="the JSON of `ansible-inventory --list [--export]`",
        description="Hosts from _meta.hostvars and the groups (ansible_host, ansible_port, "
        "ansible_user; group vars applied as Ansible applies them); groups with their hosts "
        "and children as [groups.*] members; all and ungrouped become no group.",
    )
    ansible.add_argument("file", type=Path, metavar="FILE.json")
    ansible.add_argument(
        "--labels",
        default="",
        metavar="VAR,...",
        help="host variables to write as labels (values must be label words)",
    )
    ssh_config = sources.add_parser(
        "ssh-config",
        help="hosts as `ssh -G ALIAS` resolves them (hostname, port, user)",
        description="Runs `ssh -G` for each alias (never connects). A ProxyJump to another "
        "alias given here becomes `via`; any other ProxyJump or a ProxyCommand leaves the "
        "host out.",
    )
    ssh_config.add_argument("aliases", nargs="+", metavar="ALIAS")
    ssh_config.add_argument(
        "--ssh-config", type=Path, default=None, metavar="FILE", help="ssh -F FILE"
    )
    for source in (ansible, ssh_config):
        source.add_argument(
            "--known-hosts",
            type=Path,
            required=True,
            metavar="FILE",
            help="the known_hosts file that must pin each host; written as the hosts' known_hosts",
        )
        source.add_argument(
            "--user",
            default="",
            help="every host's user, over ansible_user and User lines ([host_defaults] user)",
        )
        source.add_argument(
            "--write",
            type=Path,
            required=True,
            metavar="DIR/NAME.toml",
            help="the inventory file to write (atomically)",
        )
        source.add_argument("--force", action="store_true", help="replace an existing file")
        source.set_defaults(handler=_cmd_inventory_import)


def _add_record(sub: Any) -> None:
    """`sshadapter record CASE --request REQUEST_ID | --tool TOOL --stdout FILE ...`."""
    record = sub.add_parser(
        "record",
        help="turn a quarantined rejection or a captured output into a fixture case",
        description="Write CASE.stdout (.stderr) and CASE.case.json into the operation's "
        "fixtures directory (docs/fixtures.md), never replacing a case. --request: the bytes "
        "from the quarantine, the tool, exit status and time from the call's result record "
        "(the chain verified), the arguments read back from its command. --tool with "
        "--stdout: an output you captured. Exit 0: written, 1: nothing written (one line).",
    )
    record.add_argument("case", metavar="CASE", help="the case name (a file stem)")
    source = record.add_mutually_exclusive_group(required=True)
    source.add_argument("--request", metavar="REQUEST_ID", help="a call with a rejected output")
    source.add_argument("--tool", metavar="TOOL", help="the tool whose output --stdout holds")
    record.add_argument("--host", metavar="HOST", help="--request of a fan-out: which host")
    record.add_argument("--stdout", type=Path, metavar="FILE", help="--tool: the stdout bytes")
    record.add_argument("--stderr", type=Path, metavar="FILE", help="--tool: the stderr bytes")
    record.add_argument("--exit-status", type=int, default=0, metavar="N", help="--tool: (0)")
    record.add_argument(
        "--now",
        metavar="TIME",
        help="the clock of the case, RFC 3339 (default: the call's time; --tool: now)",
    )
    record.add_argument(
        "--args",
        nargs="*",
        default=None,
        metavar="key=value",
        help="the call's arguments (key:=json for a number or boolean); --request: default "
        "read back from the recorded command, and checked to rebuild it either way",
    )
    record.add_argument(
        "--expect",
        default="",
        metavar="success|CODE",
        help="the expectation you confirm (default: what the daemon decided; --tool: what "
        "the contract gives now)",
    )
    _add_config(record)
    record.set_defaults(handler=_cmd_record)


def _add_approvals(sub: Any) -> None:
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
    _add_socket(list_)
    list_.set_defaults(handler=_cmd_approvals_list)
    for verb, text in (("approve", "run"), ("deny", "refuse")):
        decide = approvals_sub.add_parser(
            verb, help=f"show one pending call in full, then {text} it (this call only)"
        )
        decide.add_argument("request_id", metavar="REQUEST_ID")
        if verb == "approve":
            decide.add_argument(
                "--digest",
                metavar="HEX",
                help="approve only if the pending command's sha256 is this one (as listed)",
            )
        _add_socket(decide)
        decide.set_defaults(handler=_cmd_approvals_decide, verb=verb)


def _add_config(parser: argparse.ArgumentParser) -> None:
    from sshadapter.config import DEFAULT_CONFIG_PATH

    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config file (default {DEFAULT_CONFIG_PATH} if it exists, else built-in "
        "defaults with ./commands and ./schemas)",
    )


def _add_socket(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--socket",
        type=Path,
        default=client.DEFAULT_SOCKET,
        help=f"the daemon's socket (default {client.DEFAULT_SOCKET})",
    )


def _cmd_catalog(args: argparse.Namespace) -> int:
    from sshadapter.check.catalog_doc import markdown

    sys.stdout.write(markdown())
    return EXIT_OK


def _cmd_serve(args: argparse.Namespace) -> int:
    from sshadapter.config import DEFAULT_CONFIG_PATH, load_config
    from sshadapter.daemon.assemble import run_daemon

    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    # [logging] first (environment overrides applied), so the daemon's first line is in it.
    settings = load_config(path)[0].logging
    logs.configure(args.log_level or settings.level, settings.format)
    return asyncio.run(run_daemon(path))


def _cmd_demo(args: argparse.Namespace) -> int:
    from sshadapter.demo import DemoUnavailable, run_demo

    logs.configure_warnings()
    try:
        return asyncio.run(run_demo())
    except DemoUnavailable as exc:  # installed without the checkout's examples
        print(f"sshadapter demo: {exc}", file=sys.stderr)
        return 2


def _cmd_examples(args: argparse.Namespace) -> int:
    from sshadapter.shipped import ExamplesMissing, write_examples

    try:
        written = write_examples(args.write)
    except (ExamplesMissing, OSError, ConfigError) as exc:
        print(f"sshadapter examples: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {' '.join(written)} to {args.write}")
    return 0


def _cmd_mcp(args: argparse.Namespace) -> int:
    from sshadapter.mcp.bridge import run_bridge

    # stderr only: stdout carries nothing but protocol lines (sshadapter.mcp.stdio).
    logs.configure_warnings("sshadapter mcp: %(levelname)s %(message)s")
    return asyncio.run(run_bridge(args.socket))


def _cmd_audit_verify(args: argparse.Namespace) -> int:
    from sshadapter.config import DEFAULT_CONFIG_PATH, load_config
    from sshadapter.daemon.audit_verify import UnreadableTrail, trail, verify

    paths = args.paths
    if not paths:
        path = args.config or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None)
        paths = [load_config(path)[0].audit.path]
    try:
        if len(paths) == 1 and not args.only:
            paths = trail(paths[0])
        report = verify(paths)
    except UnreadableTrail as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(report.summary())
    return EXIT_OK if report.ok else EXIT_FAILED


def _audit_path(args: argparse.Namespace) -> Path:
    """The audit file given, else the config's ``[audit] path``."""
    from sshadapter.config import DEFAULT_CONFIG_PATH, load_config

    if args.path is not None:
        return Path(args.path)
    path = args.config or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.is_file() else None)
    return load_config(path)[0].audit.path


def _cmd_audit_show(args: argparse.Namespace) -> int:
    """One call's records across the rotated files, the chain verified (docs/audit.md)."""
    from sshadapter.daemon.audit_show import REQUEST_ID, format_call
    from sshadapter.daemon.audit_verify import UnreadableTrail, trail, verify
    from sshadapter.shown import shown

    if not REQUEST_ID.fullmatch(args.request_id):
        print(
            f"sshadapter: {shown(args.request_id, 40)} is no request id (req. and 20 hex digits)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        report = verify(trail(_audit_path(args)), args.request_id)
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


def _cmd_record(args: argparse.Namespace) -> int:
    """A fixture case from a quarantined rejection or a captured output (docs/fixtures.md)."""
    from datetime import UTC, datetime

    from sshadapter.bounded_read import read_with_mode
    from sshadapter.check import record
    from sshadapter.check.fixtures import MAX_RECORDED_BYTES
    from sshadapter.contract.rfc3339 import format_rfc3339, parse_rfc3339
    from sshadapter.runners.interface import RunResult

    config, registry = _load(args)
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
            found = _Found(args.tool, None, stdout, stderr, args.exit_status, None, None, mode)
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


class _Found:
    """What `record` learnt of one output: its tool, bytes, and the call around it."""

    def __init__(
        self,
        tool: str,
        command: str | None,
        stdout: bytes,
        stderr: bytes,
        exit_status: int,
        time: str | None,
        decided: dict[str, Any] | None,
        mode: int,
    ) -> None:
        self.tool, self.command, self.time, self.decided = tool, command, time, decided
        self.stdout, self.stderr, self.exit_status = stdout, stderr, exit_status
        self.mode = mode  # the permission bits of the files read: the case gets no more


def _quarantined(config: Config, request_id: str, host: str | None) -> _Found:
    """The last quarantined attempt of a call (of ``host``, for a fan-out), its bytes read
    back from the quarantine and checked against the sha256 its result record holds.

    The quarantine is the daemon account's directory: a file there is read only if it is
    a regular file itself, never through a link that account could have planted."""
    import hashlib
    import re

    from sshadapter.bounded_read import read_with_mode
    from sshadapter.check.fixtures import MAX_RECORDED_BYTES
    from sshadapter.check.record import RecordError
    from sshadapter.daemon.audit_show import REQUEST_ID
    from sshadapter.daemon.audit_verify import UnreadableTrail, trail, verify

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
    result = results[-1]
    rows: list[tuple[str | None, dict[str, Any]]] = []
    if isinstance(result.get("host_results"), list):
        for row in result["host_results"]:
            if isinstance(row, dict) and (host is None or row.get("host") == host):
                rows.append((str(row.get("host")), row))
    else:
        rows.append((None, result))
    kept = [
        (where, row, attempt)
        for where, row in rows
        for attempt in _list(row.get("attempts"))
        if isinstance(attempt, dict) and isinstance(attempt.get("quarantine"), dict)
    ]
    if not kept:
        raise RecordError(
            f"{request_id} has no quarantined output" + (f" on {host}" if host else "")
        )
    if len({where for where, _, _ in kept}) > 1:
        raise RecordError("outputs of several hosts were quarantined: choose one with --host")
    _, row, attempt = kept[-1]
    streams: dict[str, bytes] = {}
    mode = 0o777
    for stream in ("stdout", "stderr"):
        name = attempt["quarantine"].get(stream)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", name):
            raise RecordError(f"{request_id}: its {stream} was not kept in the quarantine")
        path = config.audit.quarantine_dir / name
        if not os.path.lexists(path):
            raise RecordError(
                f"{path} is no longer in the quarantine (removed past quarantine_max_bytes, "
                "or by hand): record it with --tool and --stdout from a new capture"
            )
        data, file_mode = read_with_mode(path, MAX_RECORDED_BYTES, follow=False)
        mode &= file_mode
        if hashlib.sha256(data).hexdigest() != attempt.get(f"{stream}_sha256"):
            raise RecordError(f"{path}: not the bytes its result record names (sha256 differs)")
        streams[stream] = data
    found = attempt.get("verdict")
    verdict: dict[str, Any] = found if isinstance(found, dict) else {}
    decided = {"outcome": "failure", "code": "INVALID_RESPONSE"}  # what quarantine keeps
    decided.update({k: verdict[k] for k in ("stage", "reason") if isinstance(verdict.get(k), str)})
    status = attempt.get("exit_status")
    command = result.get("command")
    return _Found(
        str(result.get("tool")),
        command if isinstance(command, str) else "",
        streams["stdout"],
        streams["stderr"],
        status if isinstance(status, int) else 0,
        result.get("time") if isinstance(result.get("time"), str) else None,
        decided,
        mode,
    )


def _list(value: Any) -> list[Any]:
    """An untrusted record's array, or none."""
    return value if isinstance(value, list) else []


def _cmd_call(args: argparse.Namespace) -> int:
    try:
        call_args = client.parse_assignments(args.args)
    except ValueError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _print_response(
        {"op": "call", "tool": args.tool, "args": call_args},
        args.socket,
        ok=lambda r: r.get("outcome") == "success",
    )


def _cmd_list(args: argparse.Namespace) -> int:
    return _print_response({"op": "list"}, args.socket, ok=lambda r: "tools" in r)


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


def _cmd_approvals_list(args: argparse.Namespace) -> int:
    pending = _pending(args.socket)
    if pending is None:
        return EXIT_FAILED
    for entry in pending:
        _show_pending(entry)
    if not pending:
        print("no call waits for approval")
    return EXIT_OK


def _cmd_approvals_decide(args: argparse.Namespace) -> int:
    pending = _pending(args.socket)
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
    try:
        answer = client.request(args.socket, message)
    except client.ClientError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(answer, dict) or "decision" not in answer:
        refused = answer.get("refused") if isinstance(answer, dict) else None
        print(f"sshadapter: refused: {shown(refused or 'not an approver')}", file=sys.stderr)
        return EXIT_FAILED
    print(shown(answer["decision"]))
    return EXIT_OK


def _print_response(message: dict[str, object], socket_path: Path, ok: Any) -> int:
    try:
        response = client.request(socket_path, message)
    except client.ClientError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    write_json(response)
    return EXIT_OK if isinstance(response, dict) and ok(response) else EXIT_FAILED


def _load(args: argparse.Namespace) -> tuple[Config, Registry]:
    _, config, registry, _ = _load_with_path(args)
    return config, registry


def _load_with_path(
    args: argparse.Namespace, *, also_dispatch: str = ""
) -> tuple[Path | None, Config, Registry, dict[str, dict[str, Any]]]:
    """The configuration file used (None: built-in defaults), it, its registry, and the
    policy of each dispatch host: what `serve` would load, and refuse, from the same files
    (``sshadapter.daemon.server.load``, the one loader)."""
    from sshadapter.config import DEFAULT_CONFIG_PATH, load_config
    from sshadapter.daemon.server import load

    path = args.config
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    config, _ = load_config(path)
    where = str(path or "<defaults>")
    loaded = load(config, where, aliases_known=path is not None, also_dispatch=also_dispatch)
    return path, config, loaded.registry, loaded.policies


def _cmd_check(args: argparse.Namespace) -> int:
    from sshadapter.check.report import check_registry, format_table, warnings
    from sshadapter.daemon.assemble import warm_aliases
    from sshadapter.inventory import load_inventory

    config_path, config, registry, policies = _load_with_path(args)
    inventory = load_inventory(config)
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
        from sshadapter.inventory import load_inventory

        members = None
        if args.target is not None:
            members = load_inventory(config).members(args.target)
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


def _cmd_policy(args: argparse.Namespace) -> int:
    """Every operation of a host alias, or of each member of a group, as its dispatcher
    enforces it (docs/dispatcher.md)."""
    from sshadapter.dispatch import policy
    from sshadapter.inventory import load_inventory

    _, config, registry, policies = _load_with_path(args, also_dispatch=args.target)
    inventory = load_inventory(config)
    if inventory.is_group(args.target):
        document = policy.group_policy(args.target, registry, inventory)
    else:
        document = policies[args.target]
    write_json(document)
    return EXIT_OK


def _cmd_sudoers(args: argparse.Namespace) -> int:
    """The sudoers drop-in of a dispatch host alias or group; with --check, proved."""
    from sshadapter.dispatch import policy, sudoers
    from sshadapter.inventory import load_inventory
    from sshadapter.shown import shown

    path, config, registry, policies = _load_with_path(args)
    inventory = load_inventory(config)
    where = str(path or "<defaults>")
    if inventory.is_group(args.target):
        document = policy.group_policy(args.target, registry, inventory)
        members = [m for m in inventory.members(args.target) if m in policies]
    else:
        document = policies.get(args.target, {})
        members = [args.target] if args.target in policies else []
    if not members:
        raise ConfigError(where, f"hosts.{args.target}", "no dispatch host of that name or group")
    accounts = sorted({config.hosts[m].user for m in members})
    if len(accounts) > 1:
        raise ConfigError(
            where,
            f"groups.{args.target}",
            f"members log in as {', '.join(accounts)}: one drop-in serves one account",
        )
    account = accounts[0]
    placed = policy.operations_by_host(registry.operations.values(), members[:1], inventory)
    found = sudoers.rules(placed[members[0]], account, args.target)
    if not found:
        print(f"sshadapter: no operation on {args.target} has run_as", file=sys.stderr)
        return EXIT_USAGE
    text = sudoers.drop_in(args.target, account, found, document["digest"])
    sys.stdout.write(text)
    if not args.check:
        return EXIT_OK
    missing = sudoers.missing_programs(found)
    if missing:
        print(
            f"sshadapter: sudoers --check: {', '.join(missing)} not on this machine: sudo "
            "refuses a command it cannot find, so run --check on the host (or one like it)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    install = sudoers.install_path(account, args.target)
    try:
        if sudoers.stale(text, install):
            print(
                f"sshadapter: sudoers --check: {install} holds other rules under this drop-in's "
                "names: sudo would read both, so check before installing (or on a machine "
                "like the host)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        passed, said = sudoers.visudo_check(text)
        proved = sudoers.prove(text, account, found, install) if passed else None
    except (OSError, subprocess.SubprocessError) as exc:
        print(
            f"sshadapter: sudoers --check: {exc} (it needs sudo, visudo and root)", file=sys.stderr
        )
        return EXIT_FAILED
    print(f"visudo -c: {'ok' if passed else 'FAILED'}: {shown(said)}", file=sys.stderr)
    if proved is None:
        return EXIT_FAILED
    for line in proved.diagnostics:  # another file's text, a terminal's to show
        print(f"installed sudoers: {shown(line)}", file=sys.stderr)
    for proof in proved.proofs:
        if not proof.ok:
            want = "allowed" if proof.expected else "refused"
            print(
                f"sudo -l: {proof.operation}: {' '.join(proof.argv)!r} must be {want}",
                file=sys.stderr,
            )
    bad = sum(not proof.ok for proof in proved.proofs)
    print(
        f"sudo -l: {len(proved.proofs) - bad} of {len(proved.proofs)} answers as required, "
        f"{len(proved.diagnostics)} diagnostic(s) of the installed sudoers",
        file=sys.stderr,
    )
    return EXIT_OK if proved.ok else EXIT_FAILED


def _cmd_dispatcher(args: argparse.Namespace) -> int:
    """Write the host's dispatcher (one stdlib-only file) to PATH, mode 0755, whole: an old
    one (or a link) there is replaced, never written through (sshadapter/safe_write.py)."""
    from sshadapter.dispatch import policy
    from sshadapter.safe_write import TargetDirectory

    path: Path = args.write
    with TargetDirectory.open(path.parent, key="--write") as out:
        out.publish(path.name, policy.dispatcher_source(), 0o755, overwrite=True)
    return EXIT_OK


def _cmd_schema(args: argparse.Namespace) -> int:
    _, registry = _load(args)
    op = registry.get(args.tool)
    if op is None:
        print(f"sshadapter: no tool {args.tool!r} in {registry_dir(registry)}", file=sys.stderr)
        return EXIT_USAGE
    write_json(op.envelope_schema)
    return EXIT_OK


def _cmd_inventory_show(args: argparse.Namespace) -> int:
    """The resolved inventory: what each target name stands for (docs/operations.md)."""
    from sshadapter.inventory import host_set_digest, load_inventory

    _, config, _, _ = _load_with_path(args)
    inventory = load_inventory(config)
    if args.target:
        if not inventory.exists(args.target):
            print(f"sshadapter: {args.target!r} is no host alias and no group", file=sys.stderr)
            return EXIT_USAGE
        members = inventory.members(args.target)
        if args.json:
            answer = {"target": args.target, "hosts": list(members)}
            answer["hosts_sha256"] = host_set_digest(members)
            write_json(answer)
        else:
            print("\n".join(members))
            print(f"# {len(members)} host(s), {host_set_digest(members)}")
        return EXIT_OK
    groups = {
        name: {"hosts": len(members), "hosts_sha256": host_set_digest(members)}
        for name, members in sorted(inventory.groups.items())
    }
    if args.json:
        answer = {"hosts": len(inventory.hosts), "groups": groups}
        write_json(answer)
        return EXIT_OK
    width = max((len(name) for name in groups), default=5)
    print(f"{'group':<{width}}  {'hosts':>5}  digest")
    for name, row in groups.items():
        print(f"{name:<{width}}  {row['hosts']:>5}  {row['hosts_sha256']}")
    print(f"{len(inventory.hosts)} host(s), {len(groups)} group(s)")
    return EXIT_OK


def _cmd_inventory_import(args: argparse.Namespace) -> int:
    """Hosts pinned in known_hosts, from Ansible or ssh -G, into one file (docs/operations.md)."""
    import json

    from sshadapter.check import import_sources, importer
    from sshadapter.inventory import MAX_GROUP_NESTING

    importer.check_target(args.write, force=args.force)
    if args.user:
        importer.check_user(args.user)
    known_hosts_path = args.known_hosts.resolve()
    known_hosts = importer.read_known_hosts(known_hosts_path)
    if args.import_source == "ansible":
        labels = import_sources.label_names(args.labels)
        source = import_sources.from_ansible(args.file, labels)
        origin = f"sshadapter inventory import ansible {json.dumps(args.file.name)}"
    else:
        source = import_sources.from_ssh_config(args.aliases, args.ssh_config, args.user)
        origin = "sshadapter inventory import ssh-config"  # the aliases are in the file
    plan = importer.plan(source, known_hosts, known_hosts_path, args.user)
    for line in plan.left_out:
        print(f"sshadapter: left out: {line}", file=sys.stderr)
    if plan.flattened:
        print(
            f"sshadapter: note: {len(plan.flattened)} group(s) with more than "
            f"{MAX_GROUP_NESTING} levels of groups below them written with their hosts as "
            f"members (flattened: same hosts): {shown(', '.join(plan.flattened))}",
            file=sys.stderr,
        )
    if not plan.hosts:
        print(f"sshadapter: no host imported: {args.write} not written", file=sys.stderr)
        return EXIT_FAILED
    text = importer.render(plan, known_hosts_path, args.user, origin)
    importer.write_new(args.write, text, force=args.force)
    without_user = sum(1 for entry in plan.hosts.values() if "user" not in entry)
    if without_user and not args.user:
        print(
            f"sshadapter: note: {without_user} host(s) without a user take the configuration's "
            "[host_defaults] user",
            file=sys.stderr,
        )
    print(
        f"wrote {args.write}: {len(plan.hosts)} host(s), {len(plan.groups)} group(s), "
        f"{len(plan.left_out)} left out"
    )
    return EXIT_FAILED if plan.left_out else EXIT_OK


def _cmd_grants_explain(args: argparse.Namespace) -> int:
    """Whether a uid may call a tool on a target, the way the daemon decides it."""
    import grp
    import pwd

    from sshadapter.daemon.authorize import Peer
    from sshadapter.daemon.grants import Access
    from sshadapter.inventory import load_inventory

    _, config, registry, _ = _load_with_path(args)
    op = registry.get(args.tool)
    if op is None:
        print(f"sshadapter: no tool {args.tool!r} in {registry_dir(registry)}", file=sys.stderr)
        return EXIT_USAGE
    numeric = args.uid.isascii() and args.uid.isdigit()
    try:
        user = pwd.getpwuid(int(args.uid)) if numeric else pwd.getpwnam(args.uid)
    except KeyError:
        user = None
    except OverflowError:
        print(f"sshadapter: uid {args.uid} is out of range", file=sys.stderr)
        return EXIT_USAGE
    if user is not None:
        groups = frozenset(os.getgrouplist(user.pw_name, user.pw_gid))
        peer = Peer(pid=0, uid=user.pw_uid, gid=user.pw_gid, groups=groups)
        names = ", ".join(sorted(grp.getgrgid(g).gr_name for g in groups if _group_exists(g)))
        who = f"{user.pw_name}; groups: {names or '-'}"
    elif numeric:
        # The daemon honours a uid without a passwd entry ([[grants]] uids, SO_PEERCRED): its
        # groups are the calling process's, unknown here, so only what names the uid counts.
        peer = Peer(pid=0, uid=int(args.uid), gid=NO_GID)
        who = "no passwd entry; groups: none known, only grants and allow naming the uid count"
    else:
        print(f"sshadapter: no user '{shown(args.uid)}' on this system", file=sys.stderr)
        return EXIT_USAGE
    access = Access(registry, load_inventory(config), config.grants, config.server.allow)
    print(f"uid {peer.uid} ({who}), {op.name}, {shown(args.target)}")
    for line in access.explain(op, peer, args.target):
        print(f"  {line}")
    return EXIT_OK if args.target in access.choices(op, peer) else EXIT_FAILED


def _group_exists(gid: int) -> bool:
    import grp

    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True


def write_json(document: Any) -> None:
    """``document`` on stdout as indented JSON a terminal shows as it is: a string's DEL, C1
    and bidi controls (from a host or an agent) as ``\\u`` escapes, the same JSON value."""
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2).decode()
    sys.stdout.buffer.write(json_shown(text).encode() + b"\n")


def registry_dir(registry: Registry) -> str:
    first = next(iter(registry.operations.values()), None)
    return str(first.file.parent) if first else "the commands directory"
