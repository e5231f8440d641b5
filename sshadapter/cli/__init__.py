"""The command line: ``sshadapter serve | call | list | mcp | demo | check | catalog | schema |
record | inventory | grants | audit | approvals | examples | dispatcher | policy | sudoers``.

Exit status: 0 success, 1 a check missed or a call failed, 2 a usage or
configuration error. An operator's mistake is one line naming the file, the
key and the reason, never a traceback.

Each family of commands is a module that adds its own subcommands (``add``) and holds
their handlers: ``serve`` (serve, call, list, mcp, demo), ``check`` (check, catalog,
schema, record), ``fleet`` (inventory, grants), ``audit``, ``approvals`` and
``install`` (examples, dispatcher, policy, sudoers); ``common`` holds what they share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sshadapter import __version__
from sshadapter.cli import approvals, audit, check, fleet, install, serve
from sshadapter.cli.common import EXIT_USAGE
from sshadapter.daemon import logs
from sshadapter.errors import ConfigError
from sshadapter.shipped import docs_location


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["mcp"]:
        # An agent host starts `sshadapter mcp` for every session: it parses its own options
        # and loads neither pydantic nor the schema libraries (half its start-up time and
        # RSS; tests/bench/bench_mcp.py). The other commands import them where they are used.
        return serve.mcp_main(words[1:])
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
    for family in (serve, check, fleet, audit, approvals, install):
        family.add(sub)
    return parser
