"""The bridge's side of the daemon socket: requests, their connections, and why one failed.

The daemon answers in order on a connection (`docs/protocol.md` "The socket"), so each
request in flight has a connection of its own; one that gave a whole answer may
serve the next request. Every way of getting no usable answer is one reason
from UNREACHABLE, with whether a retry is safe. A call may ask for the daemon's
progress lines before its answer (docs/protocol.md "Progress"): each is checked
whole (``progress_of``) and handed on as a ``DaemonProgress``.
"""

from __future__ import annotations

import asyncio
import errno
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter.client import CLIENT_TIMEOUT_SECONDS, MAX_RESPONSE_BYTES, PROGRESS_VERSION
from sshadapter.strict_json import MAX_DEPTH_LIMIT, StrictJSONError, strict_loads

DAEMON_TIMEOUT_SECONDS: Final = CLIENT_TIMEOUT_SECONDS
"""Longer than any operation's retry budget (600 s at most): the daemon answers first."""
POOL_IDLE_CONNECTIONS: Final = 2
"""Daemon connections a bridge keeps open between requests: enough for calls one after
another; each holds one of the daemon's max_connections (256) while idle."""
POOL_IDLE_SECONDS: Final = 10.0
"""An idle connection is reused only this soon: far below the daemon's idle timeout
(60 s by default), so the daemon does not close one just as the bridge writes to it."""

# Why the daemon did not answer, and whether trying again may help. Nothing ran when the
# connect failed; after the request was sent the call may have run, so never retryable.
UNREACHABLE: Final[Mapping[str, bool]] = {
    "socket_missing": True,  # no daemon (yet): it may be starting
    "connection_refused": True,  # a socket file nobody listens on: a restart in progress
    "permission_denied": False,  # the agent's user is not in the socket's group
    "connect_failed": True,
    "connection_dropped": False,  # the daemon closed the connection without an answer
    "timeout": False,
    "response_too_large": False,
    "response_invalid": False,
}
_CONNECT_ERRNO: Final = {
    errno.ENOENT: "socket_missing",
    errno.ECONNREFUSED: "connection_refused",
    errno.EACCES: "permission_denied",
    errno.EPERM: "permission_denied",
}


@dataclass(frozen=True, slots=True)
class DaemonProgress:
    """One progress line of the daemon's: hosts ``done`` of ``total``, or a wait."""

    done: int = 0
    total: int | None = None
    """Hosts of the fan-out; None for a wait."""
    waiting: str | None = None
    """What the call waits for: ``approval``."""


OnProgress = Callable[[DaemonProgress], None]
_WAITS: Final = frozenset({"approval"})
"""What a progress line may say a call waits for (docs/protocol.md "Progress")."""


def progress_of(value: Any) -> DaemonProgress | None:
    """The progress a parsed daemon line carries; None for any other line (the answer).

    A line whose only key is ``progress`` must be one of the two shapes exactly, or it is
    ``response_invalid``: nothing else of it is ever passed on.
    """
    if not (isinstance(value, dict) and value.keys() == {"progress"}):
        return None
    body = value["progress"]
    if isinstance(body, dict) and body.keys() == {"waiting"} and body["waiting"] in _WAITS:
        return DaemonProgress(waiting=body["waiting"])
    if isinstance(body, dict) and body.keys() == {"done", "total"}:
        done, total = body["done"], body["total"]
        if type(done) is int and type(total) is int and 0 < done <= total:
            return DaemonProgress(done, total)
    raise DaemonUnreachable("response_invalid")


class DaemonUnreachable(Exception):
    """No answer from the daemon; ``reason`` is a key of UNREACHABLE."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retryable = UNREACHABLE[reason]


class _NotSent(Exception):
    """The request could not be written: the daemon has not read a byte of it."""


class DaemonLink:
    """Requests to the daemon's socket: one connection per request in flight, a few kept idle.

    The daemon answers in order on a connection, so a request never shares one
    with another in flight. A connection that gave a whole answer may serve the
    next request (saving a connect and the daemon's accept, about a third of
    what the bridge adds to a call); anything else closes it, a cancelled call's
    included, which is how the daemon learns its caller is gone.
    """

    def __init__(self, socket_path: Path, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.socket_path = socket_path
        self._clock = clock
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []

    async def ask(self, request: Mapping[str, Any], progress: OnProgress | None = None) -> Any:
        """One request and its parsed answer, or DaemonUnreachable; cancel closes the connection.

        With ``progress``, the daemon's progress lines for the call go to it as they come.
        """
        if progress is not None:
            request = {**request, "progress": PROGRESS_VERSION}
        data = orjson.dumps(request) + b"\n"
        idle = self._take_idle()
        if idle is not None:
            try:
                return await self._exchange(*idle, data, progress)
            except _NotSent:
                pass  # the daemon closed it first (restart, idle timeout): a fresh one is safe
        try:
            reader, writer = await asyncio.open_unix_connection(
                str(self.socket_path), limit=MAX_RESPONSE_BYTES
            )
        except OSError as exc:
            raise DaemonUnreachable(_CONNECT_ERRNO.get(exc.errno or 0, "connect_failed")) from exc
        try:
            return await self._exchange(reader, writer, data, progress)
        except _NotSent as exc:
            raise DaemonUnreachable("connection_dropped") from exc

    async def _exchange(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        data: bytes,
        progress: OnProgress | None,
    ) -> Any:
        answered = False
        try:
            try:
                writer.write(data)
                await writer.drain()
            except OSError as exc:  # a Unix socket refuses the write of a closed peer at once
                raise _NotSent from exc
            async with asyncio.timeout(DAEMON_TIMEOUT_SECONDS):  # the whole call, its progress too
                while True:
                    answer = _parsed(await reader.readuntil(b"\n"))
                    said = progress_of(answer) if progress is not None else None
                    if said is None:
                        break
                    assert progress is not None  # by said
                    progress(said)
            answered = True
        except TimeoutError as exc:
            raise DaemonUnreachable("timeout") from exc
        except asyncio.LimitOverrunError as exc:
            raise DaemonUnreachable("response_too_large") from exc
        except (asyncio.IncompleteReadError, OSError) as exc:
            raise DaemonUnreachable("connection_dropped") from exc
        finally:
            if answered and len(self._idle) < POOL_IDLE_CONNECTIONS:
                self._idle.append((reader, writer, self._clock()))
            else:
                writer.close()
        return answer

    def _take_idle(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        now = self._clock()
        while self._idle:
            reader, writer, since = self._idle.pop()  # the most recent: least likely closed
            if now - since < POOL_IDLE_SECONDS and not reader.at_eof() and not writer.is_closing():
                return reader, writer
            writer.close()
        return None

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


def _parsed(line: bytes) -> Any:
    try:
        return strict_loads(line, max_bytes=MAX_RESPONSE_BYTES, max_depth=MAX_DEPTH_LIMIT)
    except StrictJSONError as exc:
        raise DaemonUnreachable("response_invalid") from exc
