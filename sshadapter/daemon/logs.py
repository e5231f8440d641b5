"""The daemon's log lines: a level, text or JSON, and journald's priority when it is there.

Reference: docs/operations.md "Logs". Under systemd, stderr is a stream to the journal,
which stores every line at priority info unless the line starts with ``<N>`` (sd-daemon(3)),
so ``journalctl -p warning`` would show nothing. ``JOURNAL_STREAM`` holds the device and
inode of that stream (``DEV:INO``, systemd.exec(5)); the prefix is written only when stderr
is that very stream, as sd_journal_stream_fd's users check, so a terminal or a file that
inherited the variable gets plain lines.

A log line says what the daemon decided and why, in its own words: request ids, tool
names, codes and reasons from closed lists. Bytes a host returned never reach a log line
(they are in the quarantine, named by the audit trail).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import IO, Final

import orjson

# sd-daemon(3): the syslog priorities journald reads from a `<N>` line prefix.
PRIORITIES: Final = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}
LEVELS: Final = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
TEXT_FORMAT: Final = "%(levelname)s %(name)s: %(message)s"


def priority(levelno: int) -> int:
    """The syslog priority of a logging level (a custom level: the next more severe one)."""
    for level in sorted(PRIORITIES):
        if levelno <= level:
            return PRIORITIES[level]
    return PRIORITIES[logging.CRITICAL]


def is_journal(stream: IO[str], environ: Mapping[str, str]) -> bool:
    """Whether ``stream`` is the journal stream systemd connected (``JOURNAL_STREAM``)."""
    value = environ.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        info = os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError):  # no descriptor (a test's StringIO)
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and request_id when known."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if isinstance(request_id, str):
            entry["request_id"] = request_id
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class JournalPrefix(logging.Formatter):
    """Another formatter's line with journald's ``<N>`` priority before each of its lines."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{priority(record.levelno)}>"
        # A traceback spans lines: journald stores each as an entry, each needs the prefix.
        return "\n".join(prefix + line for line in self.inner.format(record).split("\n"))


def configure(
    level: str,
    fmt: str,
    stream: IO[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> logging.Handler:
    """Send the root logger's records at ``level`` and above to ``stream`` (stderr) as
    ``fmt`` (``text`` or ``json``), prefixed with the priority when it is the journal.

    Replaces any handler a previous call installed; returns the new one.
    """
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    formatter: logging.Formatter = (
        JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    )
    if is_journal(stream, environ):
        formatter = JournalPrefix(formatter)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LEVELS[level])
    # asyncssh logs five INFO lines per command (0.3 ms each call, and journald rate
    # limits): the audit trail is the record of calls; keep asyncssh to warnings.
    logging.getLogger("asyncssh").setLevel(max(LEVELS[level], logging.WARNING))
    return handler
