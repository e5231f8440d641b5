"""The stdio side of ``sshadapter mcp``: protocol lines in from fd 0, out to a private fd.

MCP stdio (2025-11-25 basic/transports.mdx; 2026-07-28 basic/transports/stdio.mdx):
one JSON-RPC message per line, no embedded newline, and the server "MUST NOT
write anything to its stdout that is not a valid MCP message". ``claim_stdout``
makes that hold whatever else runs in the process: protocol lines go to a
private duplicate of fd 1, and fd 1 itself (with ``sys.stdout``) is pointed at
stderr, so a print, a warning or a C library writing to fd 1 lands in the log.
"""

from __future__ import annotations

import asyncio
import os
import select
import sys
import threading
from typing import Final

from sshadapter.mcp.protocol import MAX_LINE_BYTES

READ_CHUNK_BYTES: Final = 64 * 1024
MAX_QUEUED_LINES: Final = 16
"""Lines read ahead of the bridge: beyond them the reader waits, and the client's pipe fills."""


class TooLong:
    """A line over MAX_LINE_BYTES: what was read of it is dropped up to its newline."""


class EndOfInput:
    """Standard input is closed: the client is shutting the server down."""


TOO_LONG: Final = TooLong()
END: Final = EndOfInput()
Item = bytes | TooLong | EndOfInput


def claim_stdout() -> int:
    """A private fd for protocol lines; fd 1 and sys.stdout lead to stderr from now on."""
    sys.stdout.flush()
    protocol = os.dup(1)  # not inherited by children (PEP 446)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


def write_all(fd: int, data: bytes) -> None:
    """The whole of ``data`` or OSError (the client closed its end: EPIPE)."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # a client may hand over a non-blocking pipe
            select.select([], [fd], [])


class StdinLines:
    """Lines from a file descriptor, split and bounded in a thread.

    A thread, not ``loop.connect_read_pipe``: a blocking ``os.read`` works on
    every kind of standard input (pipe, socket, regular file, terminal), and a
    semaphore hands lines over with backpressure instead of an unbounded queue.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int = 0) -> None:
        self._loop = loop
        self._fd = fd
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._room = threading.Semaphore(MAX_QUEUED_LINES)
        self._thread = threading.Thread(target=self._read, name="mcp-stdin", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def get(self) -> Item:
        item = await self._queue.get()
        self._room.release()
        return item

    def stop(self) -> None:
        """Make ``get`` return END (the client stopped reading our output)."""
        self._loop.call_soon(self._queue.put_nowait, END)

    def _emit(self, item: Item) -> bool:
        self._room.acquire()
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the bridge has exited
            return False
        return True

    def _read(self) -> None:
        line = bytearray()
        dropping = False  # inside a line already reported TOO_LONG
        while True:
            try:
                chunk = os.read(self._fd, READ_CHUNK_BYTES)
            except OSError:
                chunk = b""
            if not chunk:
                if line and not dropping:  # a last line without its newline still counts
                    self._emit(bytes(line))
                self._emit(END)
                return
            start = 0
            while start < len(chunk):
                newline = chunk.find(b"\n", start)
                end = len(chunk) if newline < 0 else newline
                if not dropping:
                    line += chunk[start:end]
                    if len(line) > MAX_LINE_BYTES:
                        line.clear()
                        dropping = True
                        if not self._emit(TOO_LONG):
                            return
                if newline < 0:
                    break
                # Blank lines carry no message.
                if not dropping and line.strip() and not self._emit(bytes(line)):
                    return
                line.clear()
                dropping = False
                start = newline + 1
