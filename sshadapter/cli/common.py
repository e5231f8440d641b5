"""What every command family shares: exit statuses, the --config and --socket options, the
one loader's answer for a command, and JSON on a terminal."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from sshadapter import client
from sshadapter.shown import json_shown

if TYPE_CHECKING:
    from sshadapter.config import Config
    from sshadapter.contract.registry import Registry
    from sshadapter.daemon.server import Loaded

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# The variable that sets the daemon's [server] socket_path (config.py's environment
# overrides) is the clients' default too: one export points `serve` and its callers at the
# same socket, and no second name for one path can disagree with the first.
SOCKET_VARIABLE: Final = "SSHADAPTER_SERVER__SOCKET_PATH"


def add_config(parser: argparse.ArgumentParser) -> None:
    from sshadapter.config import DEFAULT_CONFIG_PATH

    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        help=f"config file (default {DEFAULT_CONFIG_PATH} if it exists, else built-in "
        "defaults with ./commands and ./schemas)",
    )


def add_socket(parser: argparse.ArgumentParser) -> None:
    """--socket PATH, or --config FILE to take its [server] socket_path (``socket_of``)."""
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--socket",
        type=Path,
        default=None,
        help=f"the daemon's socket (default ${SOCKET_VARIABLE}, else {client.DEFAULT_SOCKET})",
    )
    where.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the daemon's config file: its [server] socket_path is the socket",
    )


def socket_of(args: argparse.Namespace) -> Path:
    """The socket of --socket, else of --config's [server] socket_path, else of
    $SSHADAPTER_SERVER__SOCKET_PATH, else the default one."""
    if args.socket is not None:
        return Path(args.socket)
    if args.config is not None:
        from sshadapter.config import load_config

        return load_config(args.config)[0].server.socket_path
    return Path(os.environ.get(SOCKET_VARIABLE) or client.DEFAULT_SOCKET)


def config_path(args: argparse.Namespace) -> Path | None:
    """The configuration file given, else the default one if it exists (None: built-in
    defaults)."""
    from sshadapter.config import DEFAULT_CONFIG_PATH

    path: Path | None = args.config
    if path is None and DEFAULT_CONFIG_PATH.is_file():
        path = DEFAULT_CONFIG_PATH
    return path


def load(
    args: argparse.Namespace, *, also_dispatch: str = ""
) -> tuple[Path | None, Config, Loaded]:
    """The configuration file used (None: built-in defaults), it, and its registry,
    inventory and dispatch policies: what `serve` would load, and refuse, from the same
    files (``sshadapter.daemon.server.load``, the one loader)."""
    from sshadapter.config import load_config
    from sshadapter.daemon.server import load as load_daemon

    path = config_path(args)
    config, _ = load_config(path)
    where = str(path or "<defaults>")
    loaded = load_daemon(config, where, aliases_known=path is not None, also_dispatch=also_dispatch)
    return path, config, loaded


def write_json(document: Any) -> None:
    """``document`` on stdout as indented JSON a terminal shows as it is: a string's DEL, C1
    and bidi controls (from a host or an agent) as ``\\u`` escapes, the same JSON value."""
    text = orjson.dumps(document, option=orjson.OPT_INDENT_2).decode()
    sys.stdout.buffer.write(json_shown(text).encode() + b"\n")


def registry_dir(registry: Registry) -> str:
    first = next(iter(registry.operations.values()), None)
    return str(first.file.parent) if first else "the commands directory"
