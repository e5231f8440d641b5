"""The audit trail: append-only JSON lines, flushed before anything depends on them.

Contract: DESIGN.md "Audit". One ``intent`` record is written and made durable
before a command runs (if it cannot be, the command does not run), and one
``result`` record before the response is sent. Private keys and passphrases
never reach a record: records are built from explicit fields, never from
config objects or exception reprs of the transport.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from sshadapter.rfc3339 import format_rfc3339

FsyncPolicy = Literal["always", "batch", "never"]
FILE_MODE: Final = 0o640  # the operator's group may read the trail; nobody else


class AuditError(Exception):
    """The record could not be made durable. The caller decides what that costs."""


class AuditLog:
    """An append-only JSON-lines file shared by every call of one daemon."""

    def __init__(self, path: Path, *, fsync: FsyncPolicy = "always") -> None:
        self.path = path
        self.fsync = fsync
        self._lock = asyncio.Lock()
        self._fd: int | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
        self._fd = os.open(self.path, flags, FILE_MODE)

    def reopen(self) -> None:
        """After logrotate moved the file away (SIGHUP): continue in a new one."""
        old, self._fd = self._fd, None
        self.open()
        if old is not None:
            os.close(old)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    async def append(self, record: Mapping[str, Any]) -> None:
        """Write one record and make it durable per the fsync policy, or raise AuditError."""
        line = orjson.dumps(record) + b"\n"
        async with self._lock:  # one writer at a time keeps lines whole and in order
            if self._fd is None:
                raise AuditError("audit log is not open")
            try:
                written = os.write(self._fd, line)
                if written != len(line):
                    raise AuditError(f"short write: {written} of {len(line)} bytes")
                if self.fsync != "never":
                    await asyncio.to_thread(os.fsync, self._fd)
            except OSError as exc:
                raise AuditError(f"{exc.strerror} writing {self.path}") from exc


def now_text(moment: datetime | None = None) -> str:
    return format_rfc3339(moment or datetime.now(UTC))
