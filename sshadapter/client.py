"""A small client for the agent socket: what `sshadapter call` and `list` use.

An agent's own client does the same: write one JSON line, read one JSON line.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter.strict_json import strict_loads

DEFAULT_SOCKET: Final = Path("/run/sshadapter/sshadapter.sock")
MAX_RESPONSE_BYTES: Final = 32 * 1024 * 1024  # above any tool's max_bytes plus the envelope
# Longer than the longest approval wait (600 s) plus the longest retry budget (600 s).
CLIENT_TIMEOUT_SECONDS: Final = 1800.0
PROGRESS_VERSION: Final = 1
"""The value of a `call` request's ``progress`` key (docs/protocol.md "Progress"): the
only shape of progress lines there is. Another value is a malformed call, so that a
later shape is never mistaken for this one."""
MAX_APPROVAL_NOTE_CHARS: Final = 200
"""An `approve` or `deny` request's ``note`` (`approvals ... --reason`), kept in the
decision's audit record: a sentence saying why, not a document; longer is a malformed
request."""


class ClientError(Exception):
    """The daemon could not be reached or answered with something that is not an envelope."""


def request(
    path: Path, message: Mapping[str, Any], *, timeout: float = CLIENT_TIMEOUT_SECONDS
) -> Any:
    """Send one request, return the parsed response."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall(orjson.dumps(message) + b"\n")
            buffer = bytearray()
            while not buffer.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    raise ClientError("the daemon closed the connection without an answer")
                buffer += chunk
                if len(buffer) > MAX_RESPONSE_BYTES:
                    raise ClientError("response too large")
        except OSError as exc:
            raise ClientError(f"cannot talk to {path}: {exc.strerror or exc}") from exc
    try:
        return strict_loads(bytes(buffer), max_bytes=MAX_RESPONSE_BYTES, max_depth=128)
    except ValueError as exc:
        raise ClientError(f"not a JSON response: {exc}") from exc


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``key=text`` gives a string; ``key:=json`` gives a JSON value (``count:=3``)."""
    args: dict[str, Any] = {}
    for item in items:
        if ":=" in item and ("=" not in item or item.index(":=") < item.index("=")):
            key, _, raw = item.partition(":=")
            try:
                args[key] = strict_loads(raw.encode(), max_bytes=65536, max_depth=8)
            except ValueError as exc:
                raise ValueError(f"{key}: not a JSON value") from exc
        elif "=" in item:
            key, _, text = item.partition("=")
            args[key] = text
        else:
            raise ValueError(f"{item!r}: expected key=value or key:=json")
        if not key:
            raise ValueError(f"{item!r}: empty key")
    return args
