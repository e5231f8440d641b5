"""Quarantine: the raw bytes of every rejected output, kept for the operator, never shown.

Contract: DESIGN.md "Audit". The directory is 0700 and each file 0600 from
the moment it exists (created with those modes, never chmod-ed afterwards),
so there is no window in which another account can read evidence that may
hold secrets. The total size is capped: the oldest files go first.
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path
from typing import Final

DIR_MODE: Final = 0o700
FILE_MODE: Final = 0o600
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class Quarantine:
    """A directory of rejected outputs with a total size cap, oldest removed first."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # writes run in worker threads
        self._sizes: dict[str, int] | None = None

    def open(self) -> None:
        old_umask = os.umask(0o077)
        try:
            self.directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        finally:
            os.umask(old_umask)
        if self.directory.is_symlink() or (self.directory.stat().st_mode & 0o077):
            raise PermissionError(f"{self.directory} must be a 0700 directory, not a symlink")
        entries = sorted(self.directory.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        self._sizes = {p.name: p.stat().st_size for p in entries if p.is_file()}

    def keep(self, name: str, data: bytes) -> str | None:
        """Store ``data`` as ``name``; return the name, or None when the cap is 0."""
        if not _SAFE_NAME.fullmatch(name):
            raise ValueError(f"unsafe quarantine file name {name!r}")  # a bug, never input
        if self._sizes is None:
            raise RuntimeError("quarantine is not open")
        if self.max_bytes == 0 or len(data) > self.max_bytes:
            return None
        with self._lock:
            self._evict(room_for=len(data))
            fd = os.open(
                self.directory / name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                FILE_MODE,
            )
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
            self._sizes[name] = len(data)
        return name

    def _evict(self, room_for: int) -> None:
        assert self._sizes is not None
        total = sum(self._sizes.values())
        while self._sizes and total + room_for > self.max_bytes:
            oldest = next(iter(self._sizes))  # insertion order is age order
            (self.directory / oldest).unlink(missing_ok=True)
            total -= self._sizes.pop(oldest)
