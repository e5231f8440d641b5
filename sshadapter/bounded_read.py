"""Reading an operator's file: opened once, a regular file, read with a bound.

Every file the daemon and the CLI read (the configuration, command files,
schemas, fixtures, known_hosts, client keys and credentials) comes through
``read_bounded``; ``audit verify`` opens the trail with ``open_regular``. A
FIFO, a device or a symlink to one is refused before a byte is read:
``mkfifo commands/x.toml`` would otherwise block the reload (which runs on
the event loop, so every caller waits), and a symlink to
``/dev/zero`` would read until the memory runs out. The file is opened once
and judged by ``fstat`` of that descriptor, so what is checked is what is read:

- ``stat`` first: a device is refused without being opened (opening some has
  effects: a tape rewinds, a watchdog starts);
- ``open`` with ``O_NONBLOCK`` (a FIFO swapped in between does not block the
  open) and ``O_NOCTTY`` (a terminal never becomes the daemon's);
- ``fstat`` of the descriptor: a regular file, no larger than its bound;
- at most ``max_bytes + 1`` bytes read, so a file that grows while read is
  refused too.

Each kind of file has its own bound, a named constant beside its reader.
Any failure is a ConfigError naming the file, the key and the reason.

An operator's own files may be symlinks (a configuration kept elsewhere). A file
read from a directory another account can write to (the daemon's quarantine,
read by ``record`` as root) is read with ``follow=False``: ``lstat`` and
``O_NOFOLLOW``, so a link planted there is refused, never read through.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from sshadapter.errors import ConfigError

OPEN_FLAGS: Final = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
READ_CHUNK_BYTES: Final = 1024 * 1024  # one read() call; the bound caps the total


class NotRegular(OSError):
    """The path names something other than a regular file; ``kind`` says what."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"not a regular file ({kind})")
        self.kind = kind


def open_regular(path: Path, *, follow: bool = True) -> int:
    """A descriptor of the regular file ``path``, opened without blocking, or OSError.

    ``stat`` first, so a device is never opened; then the opened descriptor is
    checked, so what was checked is what is read. NotRegular for anything else,
    a symlink too unless ``follow``.
    """
    if follow:
        _refuse_special(os.stat(path).st_mode)
        fd = os.open(path, OPEN_FLAGS)
    else:
        _refuse_special(os.lstat(path).st_mode)
        fd = os.open(path, OPEN_FLAGS | os.O_NOFOLLOW)  # a link swapped in since: ELOOP
    try:
        _refuse_special(os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: Path, max_bytes: int, *, key: str = "", follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``, or ConfigError."""
    return read_with_mode(path, max_bytes, key=key, follow=follow)[0]


def read_with_mode(
    path: Path, max_bytes: int, *, key: str = "", follow: bool = True
) -> tuple[bytes, int]:
    """``read_bounded``, and the permission bits of the file read (a copy gets no more)."""
    file = str(path)
    try:
        fd = open_regular(path, follow=follow)
    except NotRegular as exc:
        raise ConfigError(file, key, str(exc)) from exc
    except OSError as exc:
        raise ConfigError(file, key, f"cannot read: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if info.st_size > max_bytes:
            raise ConfigError(file, key, f"larger than {max_bytes} bytes")
        chunks: list[bytes] = []
        left = max_bytes + 1  # one byte more tells a file that grew past the bound
        while left > 0:
            chunk = os.read(fd, min(left, READ_CHUNK_BYTES))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise ConfigError(file, key, f"cannot read: {exc.strerror}") from exc
    finally:
        os.close(fd)
    if left <= 0:
        raise ConfigError(file, key, f"larger than {max_bytes} bytes")
    return b"".join(chunks), stat.S_IMODE(info.st_mode)


def _refuse_special(mode: int) -> None:
    if not stat.S_ISREG(mode):
        raise NotRegular(_kind(mode))


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symlink"),
    )
    return next((name for test, name in kinds if test(mode)), "not a file")
