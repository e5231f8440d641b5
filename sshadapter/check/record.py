"""`sshadapter record`: an output a host really printed becomes a fixture case.

Reference: docs/fixtures.md "Recording a case". The bytes come from the quarantine (a
rejected output, found through its result record) or from a file the operator captured;
the call's arguments are the ones that rebuild the recorded command exactly; the
expectation is the one the operator confirms (by default what the daemon decided). A
case is written once: an existing case of that name is never replaced, and never through a
link (sshadapter/safe_write.py). Its files get no more permission than the bytes they copy:
a quarantined output (0600, it may hold secrets) gives 0600 files, for the operator to
review before widening.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter.bounded_read import read_with_mode
from sshadapter.check.fixtures import MAX_RECORDED_BYTES, fixture_dir
from sshadapter.contract.codes import CODES
from sshadapter.contract.evaluate import evaluate
from sshadapter.contract.registry import Operation
from sshadapter.errors import EvidenceError, RequestError
from sshadapter.runners.interface import RunResult
from sshadapter.safe_write import TargetDirectory

CASE_NAME: Final = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # a file stem anyone can type
# Fixtures are reviewed and committed beside the command file: readable by all at most,
# and no more than the file they were copied from.
FILE_MODE: Final = 0o644
# A quarantined file's name as the daemon writes it: nothing else is opened there.
QUARANTINE_NAME: Final = re.compile(r"[A-Za-z0-9_.-]{1,200}")


class RecordError(Exception):
    """Why nothing was written: one line for the operator."""


def recover_args(op: Operation, command: str) -> dict[str, Any] | None:
    """The arguments that made ``command`` from ``op``'s argv, or None when they cannot be
    read back from it (give them with ``--args``; they are checked the same way)."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if len(words) != len(op.argv.elements):
        return None
    found: dict[str, str] = {}
    for element, word in zip(op.argv.elements, words, strict=True):
        pattern = "".join(
            f"(?P<{text}>.*)" if is_param and text not in found else re.escape(text)
            for is_param, text in element.parts
        )
        try:
            match = re.fullmatch(pattern, word, re.DOTALL)
        except re.error:  # a parameter twice in one element
            return None
        if match is None:
            return None
        found.update(match.groupdict())
    properties = op.params_schema.get("properties", {})
    args = {name: _typed(properties.get(name, {}), value) for name, value in found.items()}
    return args if all(v is not None for v in args.values()) else None


def _typed(schema: Mapping[str, Any], value: str) -> Any:
    kind = schema.get("type")
    try:
        if kind == "integer":
            return int(value)
        if kind == "number":
            return float(value)
    except ValueError:
        return None
    if kind == "boolean":
        return {"true": True, "false": False}.get(value)
    return value


def check_args(op: Operation, args: Mapping[str, Any], command: str | None) -> None:
    """The arguments pass the parameter schema and (with a recorded ``command``) rebuild it."""
    try:
        op.params_validator.validate(args)
        built = op.command(args)
    except EvidenceError as exc:
        raise RecordError(f"args fail the parameter schema: {exc.detail[:200]}") from exc
    except (RequestError, KeyError) as exc:
        raise RecordError(f"args make no command: {exc}") from exc
    if command is not None and built != command:
        raise RecordError("args do not rebuild the recorded command: give them with --args")


def expectation(
    op: Operation,
    args: Mapping[str, Any],
    run: RunResult,
    now: datetime,
    expect: str,
    decided: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], str]:
    """The case's ``expect`` and a note for the operator ("" when none).

    ``expect``: ``success``, a code, or "" for ``decided`` (the daemon's verdict), else what
    the contract gives now (a captured output).
    """
    verdict = evaluate(op, args, run, now)
    if expect == "":
        if decided is None:
            expect = "success" if verdict.failure is None else str(verdict.code)
        else:
            return dict(decided), ""
    if expect == "success":
        if verdict.failure is None:
            return {"outcome": "success", "data": dict(verdict.data or {})}, ""
        note = (
            f"the contract rejects this output now ({verdict.stage}/{verdict.reason}): "
            "`sshadapter check` misses this case until the command file accepts it; then "
            "write the data it gives into expect.data"
        )
        return {"outcome": "success", "data": {}}, note
    if expect not in CODES:
        raise RecordError(f"--expect {expect[:40]!r}: give success or one of {', '.join(CODES)}")
    found: dict[str, Any] = {"outcome": "failure", "code": expect}
    if verdict.code == expect:  # pin the layer that catches it, as docs/fixtures.md asks
        found.update(stage=verdict.stage, reason=verdict.reason)
        return found, ""
    got = "success" if verdict.failure is None else f"{verdict.code} ({verdict.stage})"
    return found, f"the contract gives {got} now: `sshadapter check` misses this case"


def write_case(
    op: Operation,
    case: str,
    document: Mapping[str, Any],
    stdout: bytes,
    stderr: bytes,
    source_mode: int,
) -> list[Path]:
    """Write ``<case>.stdout``, ``.stderr`` (when not empty) and ``.case.json`` beside the
    command file, with ``FILE_MODE`` cut to ``source_mode`` (the permission bits of the
    bytes copied); refuse when any of them exists. Returns the files written."""
    if not CASE_NAME.fullmatch(case):
        raise RecordError(f"case {case[:40]!r}: lower-case letters, digits, - and _ (63 at most)")
    directory = fixture_dir(op)
    files = {f"{case}.stdout": stdout}
    if stderr:
        files[f"{case}.stderr"] = stderr
    files[f"{case}.case.json"] = orjson.dumps(
        document, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE
    )
    for name in (*files, f"{case}.stderr"):
        if os.path.lexists(directory / name):
            raise RecordError(
                f"{directory / name} exists: choose another case name (nothing was written)"
            )
    mode = FILE_MODE & source_mode
    with TargetDirectory.open(directory, key="fixtures", create=True) as target:
        return [target.create(name, data, mode) for name, data in files.items()]


@dataclass(frozen=True)
class Found:
    """What `record` learnt of one output: its tool, bytes, and the call around it."""

    tool: str
    command: str | None
    stdout: bytes
    stderr: bytes
    exit_status: int
    time: str | None
    decided: dict[str, Any] | None
    mode: int
    """The permission bits of the files read: the case gets no more."""


def quarantined(
    request_id: str, results: Sequence[Mapping[str, Any]], quarantine_dir: Path, host: str | None
) -> Found:
    """The last quarantined attempt of a call (of ``host``, for a fan-out), its bytes read
    back from ``quarantine_dir`` and checked against the sha256 its result record holds.

    ``results``: the call's result records, the audit chain verified (last one counts).
    The quarantine is the daemon account's directory: a file there is read only if it is
    a regular file itself, never through a link that account could have planted."""
    result = results[-1]
    rows: list[tuple[str | None, Mapping[str, Any]]] = []
    if isinstance(result.get("host_results"), list):
        for row in result["host_results"]:
            if isinstance(row, dict) and (host is None or row.get("host") == host):
                rows.append((str(row.get("host")), row))
    else:
        rows.append((None, result))
    kept = [
        (where, row, attempt)
        for where, row in rows
        for attempt in _list(row.get("attempts"))
        if isinstance(attempt, dict) and isinstance(attempt.get("quarantine"), dict)
    ]
    if not kept:
        raise RecordError(
            f"{request_id} has no quarantined output" + (f" on {host}" if host else "")
        )
    if len({where for where, _, _ in kept}) > 1:
        raise RecordError("outputs of several hosts were quarantined: choose one with --host")
    _, row, attempt = kept[-1]
    streams: dict[str, bytes] = {}
    mode = 0o777
    for stream in ("stdout", "stderr"):
        name = attempt["quarantine"].get(stream)
        if not isinstance(name, str) or not QUARANTINE_NAME.fullmatch(name):
            raise RecordError(f"{request_id}: its {stream} was not kept in the quarantine")
        path = quarantine_dir / name
        if not os.path.lexists(path):
            raise RecordError(
                f"{path} is no longer in the quarantine (removed past quarantine_max_bytes, "
                "or by hand): record it with --tool and --stdout from a new capture"
            )
        data, file_mode = read_with_mode(path, MAX_RECORDED_BYTES, follow=False)
        mode &= file_mode
        if hashlib.sha256(data).hexdigest() != attempt.get(f"{stream}_sha256"):
            raise RecordError(f"{path}: not the bytes its result record names (sha256 differs)")
        streams[stream] = data
    found = attempt.get("verdict")
    verdict: dict[str, Any] = found if isinstance(found, dict) else {}
    decided = {"outcome": "failure", "code": "INVALID_RESPONSE"}  # what quarantine keeps
    decided.update({k: verdict[k] for k in ("stage", "reason") if isinstance(verdict.get(k), str)})
    status = attempt.get("exit_status")
    command = result.get("command")
    time = result.get("time")
    return Found(
        str(result.get("tool")),
        command if isinstance(command, str) else "",
        streams["stdout"],
        streams["stderr"],
        status if isinstance(status, int) else 0,
        time if isinstance(time, str) else None,
        decided,
        mode,
    )


def _list(value: Any) -> list[Any]:
    """An untrusted record's array, or none."""
    return value if isinstance(value, list) else []
