"""`sshadapter audit verify`: is the trail whole, and which calls died with the daemon?

Each record's ``prev`` is the sha256 of the line before it (sshadapter/audit.py),
so an edited record breaks the link to the next one, a deleted or reordered
record breaks the link across the gap, and text cut out of the middle breaks
it at the cut. A line that is not a record is a break too, unless it is the
torn last write of a daemon that died mid-write and the next record is the
``start`` record of the daemon that followed. Intents without a result are
calls that were running when the daemon stopped (or still are).

Known limit: the chain cannot show that records were cut off the END of the
newest file; keep the trail on append-only storage or ship it off the host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from sshadapter.audit import GENESIS


@dataclass
class Report:
    records: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    breaks: list[str] = field(default_factory=list)
    torn: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    intents: dict[str, dict[str, Any]] = field(default_factory=dict)
    results: set[str] = field(default_factory=set)

    @property
    def open_intents(self) -> list[dict[str, Any]]:
        return [r for rid, r in self.intents.items() if rid not in self.results]

    @property
    def ok(self) -> bool:
        return not self.breaks

    def summary(self) -> str:
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(self.kinds.items()))
        lines = [
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
        lines += [f"  {r['request_id']} {r['tool']} {r['time']}" for r in open_]
        return "\n".join(lines)


def verify(paths: Iterable[Path]) -> Report:
    """Check the chain across ``paths`` in order (oldest rotated file first)."""
    report = Report()
    prev: str | None = None
    pending_garbage: str | None = None
    for where, body in _lines(paths):
        record = _parse(body)
        if record is None:
            if pending_garbage is not None:
                report.breaks.append(f"{pending_garbage}: not an audit record")
            pending_garbage = where
            continue
        if pending_garbage is not None:
            if record.get("type") == "start":
                report.torn.append(pending_garbage)
            else:
                report.breaks.append(f"{pending_garbage}: not an audit record")
            pending_garbage = None
        if prev is None:
            if record["prev"] != GENESIS:
                report.notes.append(f"{where}: the chain starts after records not given here")
        elif record["prev"] != prev:
            report.breaks.append(
                f"{where}: does not follow the record before it "
                "(a record was edited, deleted or reordered)"
            )
        prev = hashlib.sha256(body).hexdigest()
        _count(report, record, where)
    if pending_garbage is not None:
        report.torn.append(f"{pending_garbage} (last line)")
    return report


def _count(report: Report, record: dict[str, Any], where: str) -> None:
    kind = str(record.get("type"))
    report.records += 1
    report.kinds[kind] = report.kinds.get(kind, 0) + 1
    request_id = record.get("request_id")
    if kind == "intent" and isinstance(request_id, str):
        report.intents.setdefault(request_id, record)
    elif kind == "result" and isinstance(request_id, str):
        if record.get("attempts") and request_id not in report.intents:
            report.breaks.append(f"{where}: result of {request_id} ran without an intent record")
        report.results.add(request_id)


def _lines(paths: Iterable[Path]) -> Iterator[tuple[str, bytes]]:
    for path in paths:
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                yield f"{path}:{number}", line.rstrip(b"\n")


def _parse(body: bytes) -> dict[str, Any] | None:
    try:
        record = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("prev"), str):
        return None
    return record
