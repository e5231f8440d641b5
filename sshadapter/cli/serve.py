"""`sshadapter serve | call | list | mcp | demo`: the daemon, and what talks to it."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from sshadapter import client
from sshadapter.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_config,
    add_socket,
    config_path,
    socket_of,
    write_json,
)
from sshadapter.daemon import logs
from sshadapter.errors import ConfigError

MCP_HELP = "serve MCP on stdio (for an agent host), forwarding each call to the daemon"


def add(sub: Any) -> None:
    serve_ = sub.add_parser("serve", help="run the daemon")
    add_config(serve_)
    serve_.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default=None,
        help="log lines at this level and above (default: [logging] level, info)",
    )
    serve_.set_defaults(handler=serve)

    call_ = sub.add_parser("call", help="call a tool through the daemon, print the envelope")
    call_.add_argument("tool")
    call_.add_argument(
        "args",
        nargs="*",
        metavar="key=value",
        help="a string argument, or key:=json for a number or boolean",
    )
    add_socket(call_)
    call_.set_defaults(handler=call)

    list_ = sub.add_parser("list", help="list the tools this caller may call")
    add_socket(list_)
    list_.set_defaults(handler=list_tools)

    mcp_ = sub.add_parser("mcp", help=MCP_HELP)
    add_socket(mcp_)
    mcp_.set_defaults(handler=mcp)

    demo_ = sub.add_parser(
        "demo",
        help="run the daemon against an embedded SSH target, "
        "make example calls, clean up (no root, no sshd, no config)",
    )
    demo_.set_defaults(handler=demo)


def mcp_main(words: list[str]) -> int:
    """`sshadapter mcp`, parsed on its own: no pydantic, no schema library."""
    parser = argparse.ArgumentParser(prog="sshadapter mcp", description=MCP_HELP)
    add_socket(parser)
    try:
        return mcp(parser.parse_args(words))
    except ConfigError as exc:  # --config: its socket_path
        print(logs.early_line(f"sshadapter: {exc}"), file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130


def serve(args: argparse.Namespace) -> int:
    from sshadapter.config import load_config
    from sshadapter.daemon.assemble import run_daemon

    path = config_path(args)
    # [logging] first (environment overrides applied), so the daemon's first line is in it.
    settings = load_config(path)[0].logging
    logs.configure(args.log_level or settings.level, settings.format)
    return asyncio.run(run_daemon(path))


def demo(args: argparse.Namespace) -> int:
    from sshadapter.demo import DemoUnavailable, run_demo

    logs.configure_warnings()
    try:
        return asyncio.run(run_demo())
    except DemoUnavailable as exc:  # installed without the checkout's examples
        print(f"sshadapter demo: {exc}", file=sys.stderr)
        return EXIT_USAGE


def mcp(args: argparse.Namespace) -> int:
    from sshadapter.mcp.bridge import run_bridge

    # stderr only: stdout carries nothing but protocol lines (sshadapter.mcp.stdio).
    logs.configure_warnings("sshadapter mcp: %(levelname)s %(message)s")
    return asyncio.run(run_bridge(socket_of(args)))


def call(args: argparse.Namespace) -> int:
    try:
        call_args = client.parse_assignments(args.args)
    except ValueError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return _print_response(
        {"op": "call", "tool": args.tool, "args": call_args},
        socket_of(args),
        ok=lambda r: r.get("outcome") == "success",
    )


def list_tools(args: argparse.Namespace) -> int:
    return _print_response({"op": "list"}, socket_of(args), ok=lambda r: "tools" in r)


def _print_response(message: dict[str, object], socket_path: Path, ok: Any) -> int:
    try:
        response = client.request(socket_path, message)
    except client.ClientError as exc:
        print(f"sshadapter: {exc}", file=sys.stderr)
        return EXIT_USAGE
    write_json(response)
    return EXIT_OK if isinstance(response, dict) and ok(response) else EXIT_FAILED
