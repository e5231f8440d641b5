"""Quarantine: the raw bytes of every rejected output, kept for the operator, never shown.

Reference: docs/audit.md "Quarantine". The directory is the daemon's own
(owned by its uid, 0700: one created beforehand by another account is
refused, see private_paths) and each file is 0600 from the moment it exists
(created with that mode, never chmod-ed afterwards), so there is no window in
which another account can read evidence that may hold secrets. Files are
created and removed relative to the directory's descriptor, so the directory
cannot be swapped under the daemon. The total size is capped: the oldest files
go first.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import threading
from pathlib import Path
from typing import Final

from sshadapter.audit.private_paths import check_private, make_private_dirs
from sshadapter.errors import ConfigError

FILE_MODE: Final = 0o600
_SAFE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class Quarantine:
    """A directory of rejected outputs with a total size cap, oldest removed first."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._lock = threading.Lock()  # writes run in worker threads
        self._sizes: dict[str, int] | None = None
        self._dir_fd: int | None = None

    def open(self) -> None:
        """Open (creating it 0700 if missing) or raise ConfigError naming the path and fix."""
        key = "audit.quarantine_dir"
        make_private_dirs(self.directory, key=key)
        try:
            flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.directory, flags)
        except OSError as exc:
            raise ConfigError(str(self.directory), key, f"cannot open: {exc.strerror}") from exc
        try:
            check_private(self.directory, os.fstat(fd), key=key, kind="directory")
            entries = []
            for name in os.listdir(fd):
                info = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(info.st_mode):
                    entries.append((info.st_mtime_ns, name, info.st_size))
        except BaseException:
            os.close(fd)
            raise
        self._dir_fd = fd
        self._sizes = {name: size for _, name, size in sorted(entries)}

    def close(self) -> None:
        if self._dir_fd is not None:
            os.close(self._dir_fd)
            self._dir_fd = None

    def keep(self, name: str, data: bytes) -> str | None:
        """Store ``data`` as ``name``; return the name, or None when the cap is 0."""
        if not _SAFE_NAME.fullmatch(name):
            raise ValueError(f"unsafe quarantine file name {name!r}")  # a bug, never input
        if self._sizes is None or self._dir_fd is None:
            raise RuntimeError("quarantine is not open")
        if self.max_bytes == 0 or len(data) > self.max_bytes:
            return None
        with self._lock:
            self._evict(room_for=len(data))
            fd = os.open(
                name,
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW,
                FILE_MODE,
                dir_fd=self._dir_fd,
            )
            try:
                view = memoryview(data)
                while view:  # a short write to a regular file: write the rest
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            self._sizes[name] = len(data)
        return name

    def _evict(self, room_for: int) -> None:
        assert self._sizes is not None
        total = sum(self._sizes.values())
        while self._sizes and total + room_for > self.max_bytes:
            oldest = next(iter(self._sizes))  # insertion order is age order
            with contextlib.suppress(FileNotFoundError):
                os.unlink(oldest, dir_fd=self._dir_fd)
            total -= self._sizes.pop(oldest)
