"""The audit trail: append-only JSON lines, durable before anything depends on them.

Contract: DESIGN.md "Audit". One ``intent`` record is durable before a command
runs (if it cannot be, the command does not run), and one ``result`` record
before the response is sent.

Durability without a per-call fsync bottleneck: with ``fsync = "always"`` an
append returns once an fsync that covers its bytes has completed, and every
append waiting at that moment shares the same fsync (group commit). ``batch``
fsyncs in the background at most ``BATCH_INTERVAL_SECONDS`` after a write;
``never`` leaves it to the kernel.

Tamper evidence: every record carries ``prev``, the sha256 of the previous
record's line, so an edited, deleted or reordered record breaks the chain
(``sshadapter audit verify``). The chain continues across log rotation (the
daemon remembers the last hash) and across restarts (it reads the last line).

Private keys and passphrases never reach a record: records are built from
explicit fields, never from config objects or exception reprs of the transport.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections import deque
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from sshadapter.rfc3339 import format_rfc3339

FsyncPolicy = Literal["always", "batch", "never"]
FILE_MODE: Final = 0o640  # the operator's group may read the trail; nobody else
GENESIS: Final = "0" * 64  # `prev` of the very first record
BATCH_INTERVAL_SECONDS: Final = 1.0  # with fsync = "batch", at most this much is at risk
TAIL_READ_BYTES: Final = 1024 * 1024  # enough to find the last record of an existing file


class AuditError(Exception):
    """The record could not be made durable. The caller decides what that costs."""


class AuditLog:
    """An append-only JSON-lines file shared by every call of one daemon."""

    def __init__(self, path: Path, *, fsync: FsyncPolicy = "always") -> None:
        self.path = path
        self.fsync = fsync
        self._fd: int | None = None
        self._prev = GENESIS
        self._written = 0  # records written since start
        self._synced = 0  # records known durable
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._flusher: asyncio.Task[None] | None = None
        self.syncs = 0
        """fsync calls made: with group commit, fewer than records under concurrency."""

    # lifecycle ---------------------------------------------------------------------

    def open(self) -> None:
        """Open for appending and pick the chain up where the file left it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.path, flags, FILE_MODE)
        last, torn = _last_line(self._fd)
        if torn:  # a crash mid-write (power loss): end the torn line so the next one is whole
            os.write(self._fd, b"\n")
        if last is not None:
            self._prev = hashlib.sha256(last).hexdigest()

    def reopen(self) -> None:
        """After logrotate moved the file away (SIGHUP): continue the chain in a new file."""
        old, prev = self._fd, self._prev
        self._fd = None
        self.open()
        if self.path.stat().st_size == 0:
            self._prev = prev  # a fresh file continues the chain of the rotated one
        if old is not None:
            os.close(old)

    def close(self) -> None:
        if self._fd is not None:
            if self.fsync != "never":
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    # writing -----------------------------------------------------------------------

    def write(self, record: Mapping[str, Any]) -> int:
        """Append one record now (no await: order and chain stay exact); return its number."""
        if self._fd is None:
            raise AuditError("audit log is not open")
        body = orjson.dumps({**record, "prev": self._prev})
        try:
            written = os.write(self._fd, body + b"\n")
        except OSError as exc:
            raise AuditError(f"{exc.strerror} writing {self.path}") from exc
        if written != len(body) + 1:
            raise AuditError(f"short write to {self.path}: {written} bytes")
        self._prev = hashlib.sha256(body).hexdigest()
        self._written += 1
        return self._written

    async def append(self, record: Mapping[str, Any]) -> None:
        """Write one record and return once it is as durable as the fsync policy says."""
        number = self.write(record)
        if self.fsync == "never":
            return
        if self.fsync == "batch":
            self._start_flusher(delay=BATCH_INTERVAL_SECONDS)
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((number, waiter))
        self._start_flusher(delay=0.0)
        await waiter

    def _start_flusher(self, *, delay: float) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(delay))

    async def _flush(self, delay: float) -> None:
        """Group commit: one fsync covers every record written before it started."""
        if delay:
            await asyncio.sleep(delay)
        while self._synced < self._written:
            target, fd = self._written, self._fd
            try:
                if fd is None:
                    raise AuditError("audit log closed before its records were synced")
                await asyncio.to_thread(os.fsync, fd)
                self.syncs += 1
            except (OSError, AuditError) as exc:
                error = (
                    exc
                    if isinstance(exc, AuditError)
                    else AuditError(f"{exc.strerror} syncing {self.path}")
                )
                while self._waiters:
                    _, waiter = self._waiters.popleft()
                    if not waiter.done():
                        waiter.set_exception(error)
                return
            self._synced = target
            while self._waiters and self._waiters[0][0] <= target:
                _, waiter = self._waiters.popleft()
                if not waiter.done():
                    waiter.set_result(None)


def _last_line(fd: int) -> tuple[bytes | None, bool]:
    """The last complete line of the file (without newline), and whether a torn line follows."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None, False
    start = max(0, size - TAIL_READ_BYTES)
    tail = os.pread(fd, size - start, start)
    torn = not tail.endswith(b"\n")
    lines = tail.split(b"\n")
    complete = lines[:-1]  # the part after the last newline is empty or torn
    if not complete or (start > 0 and len(complete) == 1):
        return None, torn
    return complete[-1], torn


def now_text(moment: datetime | None = None) -> str:
    return format_rfc3339(moment or datetime.now(UTC))
