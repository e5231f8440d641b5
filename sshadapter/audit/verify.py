"""`sshadapter audit verify`: is the trail whole, and which calls died with the daemon?

Each record's ``prev`` is the sha256 of the line before it (sshadapter/audit/writer.py),
so an edited record breaks the link to the next one, a deleted or reordered
record breaks the link across the gap, and text cut out of the middle breaks
it at the cut. A line that is not a record is a break too, unless it is the
torn last write of a daemon that died mid-write and the next record is the
``start`` record of the daemon that followed. Intents without a result are
calls that were running when the daemon stopped (or still are).

Every byte of the files is untrusted here: whoever tampered with the trail chose
it. A line is a record only if it is at most ``MAX_LINE_BYTES``, UTF-8 JSON, an
object, and every field this module reads has its type (``_record``); anything
else is reported as a line that is not an audit record, never a traceback. What
the report prints from a record or a file name is escaped and shortened
(``sshadapter.shown``).

Rotation: ``trail`` finds the rotated siblings of the current file (logrotate's
``audit.jsonl.1``, ``.2.gz``, ``-20261130``...) so a call whose intent was
written before a rotation and its result after is not a false alarm. When the
files read do not start at the genesis record, a result whose intent is not in
them is a note (its intent is in a file not read), not a break.

Known limit: the chain cannot show that records were cut off the END of the
newest file; keep the trail on append-only storage or ship it off the host.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

import orjson

from sshadapter.audit.tail import rotated
from sshadapter.audit.writer import GENESIS, MAX_RECORD_BYTES
from sshadapter.bounded_read import NotRegular, open_regular
from sshadapter.shown import shown

# The longest line read as a record: the longest the daemon writes. A longer line is
# skipped in pieces, so a tampered file cannot make verify hold gigabytes.
MAX_LINE_BYTES: Final = MAX_RECORD_BYTES
_READ_CHUNK_BYTES: Final = 1024 * 1024  # how an over-long line is skipped
# The most of one untrusted value the report prints: enough to recognise it, never
# a screenful of whatever a tamperer wrote.
SHOWN_CHARS: Final = 80
KINDS: Final = ("start", "intent", "result", "approval")
_HASH = re.compile(r"[0-9a-f]{64}")
# The fields a record must have, with their types, beyond `type` and `prev`: those
# the report reads. Everything else is covered by the hash chain only.
_FIELDS: Final[dict[str, tuple[tuple[str, type], ...]]] = {
    "start": (),
    "intent": (("request_id", str), ("tool", str), ("time", str)),
    "result": (("request_id", str), ("attempts", list)),
    "approval": (("request_id", str),),
}
_TYPE_NAMES: Final[dict[type, str]] = {str: "a string", list: "an array"}


class UnreadableTrail(Exception):
    """A file of the trail cannot be read: the operator gets its path and the reason."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{shown(path, None)}: {shown(reason)}")
        self.path = path
        self.reason = reason


@dataclass
class Report:
    files: list[str] = field(default_factory=list)
    """The files read, in order."""
    records: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    breaks: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    intents: dict[str, tuple[str, str]] = field(default_factory=dict)
    """Open intents: request id -> (tool, time), until their result comes."""
    results: set[str] = field(default_factory=set)
    from_genesis: bool = True
    """Whether the first record read is the first of the trail."""
    kept: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """With ``verify(..., request_id)``: that call's records with where each is."""

    @property
    def open_intents(self) -> list[dict[str, str]]:
        return [
            {"request_id": rid, "tool": tool, "time": time}
            for rid, (tool, time) in self.intents.items()
        ]

    @property
    def ok(self) -> bool:
        return not self.breaks

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        lines = [
            "files: " + (", ".join(shown(f, SHOWN_CHARS) for f in self.files) or "none"),
            f"{self.records} records ({kinds})",
            "chain: intact" if self.ok else f"chain: {len(self.breaks)} break(s)",
        ]
        lines += [f"  BREAK {b}" for b in self.breaks]
        lines += [f"  torn write (daemon died mid-write, then restarted): {t}" for t in self.torn]
        lines += [f"  note: {n}" for n in self.notes]
        open_ = self.open_intents
        lines.append(
            f"intents without a result: {len(open_)}"
            + (" (calls that died with the daemon, or still running)" if open_ else "")
        )
        lines += [
            f"  {shown(r['request_id'], SHOWN_CHARS)} {shown(r['tool'], SHOWN_CHARS)} "
            f"{shown(r['time'], SHOWN_CHARS)}"
            for r in open_
        ]
        return "\n".join(lines)


def trail(path: Path) -> list[Path]:
    """``path`` and its rotated siblings, oldest first: dated, then numbered, then ``path``.

    Raises UnreadableTrail when the directory cannot be listed.
    """
    try:
        return [*rotated(path), path]
    except OSError as exc:
        raise UnreadableTrail(path.parent, f"cannot list: {exc.strerror}") from exc


def verify(paths: Iterable[Path], request_id: str = "") -> Report:
    """Check the chain across ``paths`` in order (oldest rotated file first); with a
    ``request_id``, also keep that call's records (``Report.kept``, in order).

    Raises UnreadableTrail when a file cannot be opened or read (not a regular file,
    a broken gzip stream); whatever its lines hold, they are reported, never raised.
    """
    report = Report()
    prev: str | None = None
    garbage: tuple[str, str] | None = None  # (where, why) of a line that is not a record
    for where, body in _lines(paths, report):
        record, fault = _record(body)
        if record is None:
            if garbage is not None:
                report.breaks.append(_not_a_record(*garbage))
            garbage = (where, fault)
            continue
        if garbage is not None:
            if record["type"] == "start":
                report.torn.append(garbage[0])
            else:
                report.breaks.append(_not_a_record(*garbage))
            garbage = None
        if prev is None:
            if record["prev"] != GENESIS:
                report.from_genesis = False
                report.notes.append(f"{where}: the chain starts after records not given here")
        elif record["prev"] != prev:
            report.breaks.append(
                f"{where}: does not follow the record before it "
                "(a record was edited, deleted or reordered)"
            )
        prev = hashlib.sha256(body).hexdigest()
        _count(report, record, where)
        if request_id and record.get("request_id") == request_id:
            report.kept.append((where, record))
    if garbage is not None:
        report.torn.append(f"{garbage[0]} (last line)")
    return report


def _not_a_record(where: str, why: str) -> str:
    return f"{where}: not an audit record ({why})"


def _count(report: Report, record: dict[str, Any], where: str) -> None:
    kind = record["type"]
    report.records += 1
    report.kinds[kind] = report.kinds.get(kind, 0) + 1
    if kind == "intent":
        if record["request_id"] not in report.results:
            report.intents.setdefault(record["request_id"], (record["tool"], record["time"]))
    elif kind == "result":
        request_id = record["request_id"]
        call = shown(request_id, SHOWN_CHARS)
        if record["attempts"] and request_id not in report.intents:
            if report.from_genesis:
                report.breaks.append(f"{where}: result of {call} ran without an intent record")
            else:  # after a rotation its intent is in an older file
                report.notes.append(
                    f"{where}: result of {call}: its intent is not in these "
                    "files (written before the first record read)"
                )
        report.intents.pop(request_id, None)
        report.results.add(request_id)


def _record(body: bytes) -> tuple[dict[str, Any], str] | tuple[None, str]:
    """The record on this line, or why the line is not one (a short reason, no content)."""
    if len(body) > MAX_LINE_BYTES:
        return None, f"longer than {MAX_LINE_BYTES} bytes"
    try:
        record = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None, "not UTF-8 JSON"
    if not isinstance(record, dict):
        return None, "not a JSON object"
    prev = record.get("prev")
    if not isinstance(prev, str) or not _HASH.fullmatch(prev):
        return None, "no `prev` of 64 hex digits"
    kind = record.get("type")
    if not isinstance(kind, str) or kind not in KINDS:
        return None, "`type` is not one of " + ", ".join(KINDS)
    for name, kind_of in _FIELDS[kind]:
        if not isinstance(record.get(name), kind_of):
            return None, f"{kind} without {_TYPE_NAMES[kind_of]} `{name}`"
    return record, ""


def _lines(paths: Iterable[Path], report: Report) -> Iterator[tuple[str, bytes]]:
    """Every line of every file without its newline, with where it is (``FILE:LINE``, the
    file name escaped: it is printed); an over-long one cut to its first bytes."""
    for path in paths:
        report.files.append(str(path))
        name = shown(path, None)
        with _open(path) as raw:
            f = gzip.GzipFile(fileobj=raw, mode="rb") if path.name.endswith(".gz") else raw
            number = 0
            while True:
                try:
                    line = f.readline(MAX_LINE_BYTES + 1)
                    if not line:
                        break
                    number += 1
                    if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                        while (rest := f.readline(_READ_CHUNK_BYTES)) and not rest.endswith(b"\n"):
                            pass  # skipped: the line is reported, its bytes are not kept
                except (OSError, EOFError, zlib.error) as exc:
                    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
                    raise UnreadableTrail(path, f"cannot read line {number + 1}: {reason}") from exc
                yield f"{name}:{number}", line.removesuffix(b"\n")


def _open(path: Path) -> IO[bytes]:
    """Open a regular file of the trail for reading (a FIFO put in its place must not hang).

    Never through a link: the daemon writes none (audit.path may not be one), and the
    directory is its account's, so a link there was planted and may name any file."""
    try:
        fd = open_regular(path, follow=False)
    except NotRegular as exc:
        raise UnreadableTrail(path, "not a regular file") from exc
    except OSError as exc:
        raise UnreadableTrail(path, f"cannot open: {exc.strerror}") from exc
    return os.fdopen(fd, "rb")
