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

What a line does quote (a host's disconnect reason, a dispatcher's refusal, a file name, an
agent's request id, asyncssh's own messages) is escaped here, for every record of every
logger, whoever wrote the call: the message, each field and each line of a traceback that
is not printable text already go through ``shown`` (SECURITY.md "Bytes on screens and in
logs"); printable text stays as it is, so a value escaped where it was quoted (a
disconnect reason in an audit detail) is not escaped twice. A newline, a CR, an ESC
sequence or a bidi control is written as a visible escape, so it can neither start a line
of its own nor forge a ``<N>`` priority or a ``LEVEL logger:`` head.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import IO, Final

import orjson

from sshadapter.shown import one_line

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
# A message is cut past this many characters (escaped): a log line names what happened, and
# journald cuts a line at LineMax (48 KiB) into entries of their own anyway.
MAX_MESSAGE_CHARS: Final = 16 * 1024
# The priority of a line written before logging is set up (``early_line``): an error.
EARLY_PRIORITY: Final = PRIORITIES[logging.ERROR]

# The fields a JSON line carries beside its message when the line has them (``extra=``):
# the call it is about and, for a refused or failed call, its failure, so that a log
# store filters on them without parsing messages. Closed lists all (docs/operations.md).
FIELDS: Final = ("request_id", "tool", "code", "stage", "reason")

# What traceback writes itself, before a frame or between chained exceptions.
_TRACEBACK_HEADS: Final = ("Traceback (most recent call last):", "\n")
_ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]


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


def escaped(text: str) -> str:
    """``text`` as one printable line: as it is when it is one already (a value escaped
    where it was quoted stays escaped once), else escaped whole (``shown``); cut past
    MAX_MESSAGE_CHARS either way."""
    return one_line(text, MAX_MESSAGE_CHARS)


def escaped_lines(text: str) -> str:
    """A traceback or a stack, each of its lines escaped; the lines stay lines."""
    return "\n".join(escaped(line) for line in text.split("\n"))


def escaped_traceback(ei: _ExcInfo) -> str:
    """``ei``'s traceback: the frames and traceback's own headers line by line, each
    exception's message (``Type: text``, text that may come from anyone) as one line."""
    lines = []
    for chunk in traceback.TracebackException(*ei).format():
        if chunk[:1].isspace() or chunk.startswith(_TRACEBACK_HEADS):
            lines.append(escaped_lines(chunk.removesuffix("\n")))  # frames, chain headers
        else:
            lines.append(escaped(chunk.removesuffix("\n")))
    return "\n".join(lines)


class TextFormatter(logging.Formatter):
    """``fmt`` (TEXT_FORMAT) with the message and every text field escaped to one line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        shown_record = logging.LogRecord.__new__(logging.LogRecord)  # a copy, fields escaped
        shown_record.__dict__.update(
            (key, escaped(value) if isinstance(value, str) else value)
            for key, value in record.__dict__.items()
        )
        return super().formatMessage(shown_record)

    def formatException(self, ei: _ExcInfo) -> str:
        return escaped_traceback(ei)

    def formatStack(self, stack_info: str) -> str:
        return escaped_lines(stack_info)


class JsonFormatter(TextFormatter):
    """One JSON object per line: time, level, logger, message, and each of FIELDS the
    line has (a call's request id; a failed call's tool, code, stage and reason).

    JSON writes the controls as escapes already; the text is escaped all the same, so
    the bidi controls and separators JSON leaves alone do not reach a terminal either.
    """

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": escaped(record.name),
            "message": escaped(record.getMessage()),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if isinstance(value, str):
                entry[name] = escaped(value)
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
    formatter: logging.Formatter = JsonFormatter() if fmt == "json" else TextFormatter(TEXT_FORMAT)
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


def escape_unconfigured() -> None:
    """Escape what a command that sets up no logging writes: Python sends such records
    (warning and above) to stderr through ``logging.lastResort``, the message alone
    (`check --hosts` logs each dispatch host's new state so)."""
    if logging.lastResort is not None:
        logging.lastResort.setFormatter(TextFormatter("%(message)s"))


def configure_warnings(fmt: str = TEXT_FORMAT) -> None:
    """Warnings and errors of every logger to stderr as ``fmt``, escaped as the daemon's
    are (``sshadapter demo`` and ``sshadapter mcp``, whose stderr an agent host keeps)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter(fmt))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def early_line(
    text: str, stream: IO[str] | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """``text``, escaped, as the line a command writes to ``stream`` (stderr) before
    ``configure``: starting with the error priority when that is the journal, so `serve`'s
    first error (a bad configuration) is found by ``journalctl -p err``."""
    stream = sys.stderr if stream is None else stream
    environ = os.environ if environ is None else environ
    prefix = f"<{EARLY_PRIORITY}>" if is_journal(stream, environ) else ""
    return prefix + escaped(text)
