"""`sshadapter audit show REQUEST_ID`: one call's records, verified, as a person reads them.

Reference: docs/audit.md "Hash chain", `sshadapter audit show`. The records are found across the
rotated files (``verify.trail``) while the chain over every file read is checked
(``verify.verify``): a call is shown only from a trail that is whole. Every value
printed comes from a file someone may have edited, so each (keys and nested values too) is
one line through ``sshadapter.shown`` (control characters, line breaks and bidi controls
written as ``\\n``, ``\\x1b``, ``\\u202e``...) and shortened; a field of the wrong type is
shown as ``?``, never a traceback. The ``FILE:LINE`` of a record comes escaped from
``audit_verify``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from sshadapter.shown import shown

REQUEST_ID: Final = re.compile(r"req\.[0-9a-f]{20}")
# A value printed whole: a command is at most 64 KiB (argv.MAX_COMMAND_BYTES), and a
# detail is shorter; a longer one in the file was not written by the daemon.
LONG_SHOWN_CHARS: Final = 64 * 1024
SHORT_SHOWN_CHARS: Final = 200  # a name, a time, a code: longer is not the daemon's
INDENT: Final = "    "


def text(value: Any, limit: int = SHORT_SHOWN_CHARS) -> str:
    """An untrusted value as printed: a string or number escaped and shortened, else ``?``."""
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        return "?"
    return shown(value, limit)


def _who(value: Any) -> str:
    if not isinstance(value, Mapping):
        return "?"
    return " ".join(f"{key} {text(value.get(key))}" for key in ("uid", "gid", "pid"))


def _verdict(record: Mapping[str, Any]) -> str:
    stage, reason = record.get("stage"), record.get("reason")
    if stage is None and reason is None:
        return "ok"
    line = f"{text(stage)}/{text(reason)}"
    if detail := record.get("detail"):
        line += f": {text(detail, LONG_SHOWN_CHARS)}"
    return line


def _attempts(attempts: Any, indent: str) -> list[str]:
    lines: list[str] = []
    if not isinstance(attempts, list):
        return [f"{indent}attempts: ?"]
    for number, attempt in enumerate(attempts, 1):
        if not isinstance(attempt, Mapping):
            lines.append(f"{indent}attempt {number}: ?")
            continue
        parts = [f"exit {text(attempt.get('exit_status'))}"]
        if attempt.get("transport_error") is not None:
            parts.append(f"transport {text(attempt.get('transport_error'))}")
        if "stdout_bytes" in attempt:
            parts.append(f"stdout {text(attempt.get('stdout_bytes'))} bytes")
            parts.append(f"stderr {text(attempt.get('stderr_bytes'))} bytes")
        parts.append(f"{text(attempt.get('duration_seconds'))} s")
        verdict = attempt.get("verdict")
        judged = _verdict(verdict) if isinstance(verdict, Mapping) else "?"
        lines.append(f"{indent}attempt {number}: {', '.join(parts)}: {judged}")
        if isinstance(kept := attempt.get("quarantine"), Mapping):
            files = ", ".join(f"{text(k)} {text(v)}" for k, v in kept.items())
            lines.append(f"{indent}{INDENT}quarantine: {files}")
        if attempt.get("interrupted") is not None:
            lines.append(f"{indent}{INDENT}interrupted: {text(attempt.get('interrupted'))}")
    return lines


def _where(record: Mapping[str, Any]) -> str:
    if "target" in record:
        hosts = record.get("hosts")
        count = len(hosts) if isinstance(hosts, list) else "?"
        return f"target {text(record.get('target'))} ({count} host(s))"
    return f"host {text(record.get('host'))}"


def format_call(request_id: str, found: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """The records of one call (``verify.Report.kept``), in the order written."""
    tool = next((r.get("tool") for _, r in found if r.get("tool")), None)
    lines = [f"{text(request_id)}  {text(tool)}"]
    for where, record in found:
        kind = record.get("type")
        head = f"{text(record.get('time'))}  {text(kind)}"
        if kind == "approval":
            event = record.get("event")
            lines.append(f"{head} {text(event)}  ({where})")
            if "caller" in record:
                lines.append(f"{INDENT}caller: {_who(record.get('caller'))}")
            if "approver" in record:
                lines.append(f"{INDENT}approver: {_who(record.get('approver'))}")
            if "command" in record:
                lines.append(f"{INDENT}command: {text(record.get('command'), LONG_SHOWN_CHARS)}")
            for key in ("digest", "expires", "reason"):
                if key in record:
                    lines.append(f"{INDENT}{key}: {text(record.get(key))}")
            if "note" in record:  # the approver's own words: never cut
                lines.append(f"{INDENT}note: {text(record.get('note'), LONG_SHOWN_CHARS)}")
        elif kind == "intent":
            lines.append(f"{head} attempt {text(record.get('attempt'))}  ({where})")
            lines.append(f"{INDENT}caller: {_who(record.get('caller'))}, {_where(record)}")
            lines.append(f"{INDENT}command: {text(record.get('command'), LONG_SHOWN_CHARS)}")
            if isinstance(approval := record.get("approval"), Mapping):
                lines.append(f"{INDENT}approved by: {_who(approval.get('approver'))}")
        elif kind == "result":
            outcome, code = record.get("outcome"), record.get("code")
            answer = text(outcome) + (f" {text(code)}" if code is not None else "")
            lines.append(f"{head} {answer}  ({where})")
            lines.append(f"{INDENT}caller: {_who(record.get('caller'))}, {_where(record)}")
            lines.append(f"{INDENT}command: {text(record.get('command'), LONG_SHOWN_CHARS)}")
            lines.append(f"{INDENT}verdict: {_verdict(record)}")
            lines += _attempts(record.get("attempts"), INDENT)
            lines += _hosts(record.get("host_results"))
    return "\n".join(lines)


def _hosts(rows: Any) -> Iterable[str]:
    if rows is None:
        return []
    if not isinstance(rows, list):
        return [f"{INDENT}host_results: ?"]
    lines = []
    for row in rows:
        if not isinstance(row, Mapping):
            lines.append(f"{INDENT}host ?")
            continue
        code = row.get("code")
        answer = text(row.get("outcome")) + (f" {text(code)}" if code is not None else "")
        lines.append(f"{INDENT}host {text(row.get('host'))}: {answer}: {_verdict(row)}")
        lines += _attempts(row.get("attempts"), INDENT * 2)
    return lines
