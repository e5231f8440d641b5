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

import os
import re
import shlex
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter.check.fixtures import fixture_dir
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
