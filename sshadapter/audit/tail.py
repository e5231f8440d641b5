"""Where a restarted daemon's chain goes on: the digest of the trail's last record, read whole.

Reference: docs/audit.md "Hash chain". A record is as long as its call made it: a fan-out's
result lists every host with its attempts (1.3 MB for 512 hosts, up to
``writer.MAX_RECORD_BYTES``). So no buffer bounds the last record: its line is found by
reading back from the end of the file in chunks, then hashed while it is read forward again,
and memory stays at one chunk whatever its length.

A file with no complete record (new, or only a torn write) goes on from the last record of the
newest rotated file (logrotate's names, ``rotated``), gzipped or not: a trail rotated while
the daemon was stopped stays one chain.
"""

from __future__ import annotations

import errno
import gzip
import hashlib
import os
import re
from pathlib import Path
from typing import Final

from sshadapter.bounded_read import open_regular

# One read; memory per read, never a bound on a record.
CHUNK_BYTES: Final = 64 * 1024
# logrotate's names for rotated files: `audit.jsonl.1` (the default, newest first) and
# `audit.jsonl-20261130` (`dateext`, oldest first), either with `.gz` (`compress`).
_NUMBERED: Final = r"\.(?P<number>[0-9]{1,6})"
_DATED: Final = r"-(?P<date>[0-9]{8,14})"


def rotated(path: Path) -> list[Path]:
    """The rotated siblings of ``path``, oldest first: dated, then numbered (highest first).

    Raises OSError when the directory cannot be listed.
    """
    numbered = re.compile(re.escape(path.name) + _NUMBERED + r"(?:\.gz)?")
    dated = re.compile(re.escape(path.name) + _DATED + r"(?:\.gz)?")
    by_number: list[tuple[int, str]] = []
    by_date: list[tuple[str, str]] = []
    for name in os.listdir(path.parent):
        if match := numbered.fullmatch(name):
            by_number.append((int(match["number"]), name))
        elif match := dated.fullmatch(name):
            by_date.append((match["date"], name))
    older = [name for _, name in sorted(by_date)] + [name for _, name in sorted(by_number)[::-1]]
    return [path.parent / name for name in older]


def last_record(fd: int) -> tuple[str | None, bool]:
    """The sha256 (hex) of the last complete line of an open file, without its newline
    (None: no complete line), and whether a torn line (no newline) follows it."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None, False
    torn = os.pread(fd, 1, size - 1) != b"\n"
    end = _newline_before(fd, size)  # the newline that ends the last complete line
    if end < 0:
        return None, torn
    start = _newline_before(fd, end) + 1
    digest = hashlib.sha256()
    while start < end:
        chunk = os.pread(fd, min(CHUNK_BYTES, end - start), start)
        if not chunk:
            raise OSError(errno.EIO, "the file shrank while its last record was read")
        digest.update(chunk)
        start += len(chunk)
    return digest.hexdigest(), torn


def last_rotated_record(path: Path) -> str | None:
    """The digest of the last record in the newest rotated sibling of ``path`` that has one.

    Raises OSError (EOFError, zlib.error from a broken gzip stream) when one cannot be read.
    """
    for older in reversed(rotated(path)):
        digest = _last_of_gzip(older) if older.name.endswith(".gz") else _last_of_file(older)
        if digest is not None:
            return digest
    return None


def _newline_before(fd: int, end: int) -> int:
    """The offset of the last newline before ``end``, or -1."""
    while end > 0:
        start = max(0, end - CHUNK_BYTES)
        found = os.pread(fd, end - start, start).rfind(b"\n")
        if found >= 0:
            return start + found
        end = start
    return -1


def _last_of_file(path: Path) -> str | None:
    fd = open_regular(path)
    try:
        return last_record(fd)[0]
    finally:
        os.close(fd)


def _last_of_gzip(path: Path) -> str | None:
    """A gzip stream is read forward only: every line is hashed, the last complete one kept."""
    last: str | None = None
    line = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as raw, gzip.GzipFile(fileobj=raw) as stream:
        while chunk := stream.read(CHUNK_BYTES):
            *ended, rest = chunk.split(b"\n")
            for piece in ended:
                line.update(piece)
                last = line.hexdigest()
                line = hashlib.sha256()
            line.update(rest)
    return last
