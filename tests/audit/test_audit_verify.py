"""`sshadapter audit verify` on hostile trails and rotated files: a report, never a traceback."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, Running, with_daemon
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from sshadapter.audit.verify import MAX_LINE_BYTES, SHOWN_CHARS, trail, verify
from sshadapter.audit.writer import AuditLog
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

REPO = Path(__file__).resolve().parents[2]
CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
DEEP = 100_000  # nesting far past orjson's limit (1024) and Python's recursion limit
HUGE = 256 * 1024  # a value much larger than any field the daemon writes


def run_verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "audit", "verify", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def real_trail(tmp_path_factory: pytest.TempPathFactory) -> list[bytes]:
    """The lines a real daemon writes: start, success, a rejection, a refusal, a success."""
    tmp_path = tmp_path_factory.mktemp("trail")
    outputs = iter([orjson.dumps(JOB_OUT), b"not json", orjson.dumps(JOB_OUT)])

    async def remote() -> RunResult:
        return RunResult(next(outputs), b"", 0)

    async def body(d: Running) -> None:
        await d.ask(CALL)
        await d.ask(CALL)
        await d.ask({**CALL, "args": {"project_id": "../etc"}})  # refused: no intent
        await d.ask(CALL)

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: remote}), quarantine=True)
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines()
    assert verify([tmp_path / "audit.jsonl"]).ok
    return lines


def write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def assert_reported(path: Path, *, broken: bool) -> None:
    """verify returns (no exception) and prints one escaped line per finding."""
    report = verify([path])
    summary = report.summary()
    assert all(line.isprintable() for line in summary.splitlines()), summary[:2000]
    longest = max(len(line) for line in summary.splitlines())
    assert longest < len(str(path)) + 3 * SHOWN_CHARS + 120, summary[:2000]
    if broken:
        assert not report.ok and "  BREAK " in summary, summary


# Each: (name, how a field's JSON text is replaced); None deletes the key.
FIELD_MUTATIONS: dict[str, Any] = {
    "missing": None,
    "null": "null",
    "false": "false",
    "zero": "0",
    "negative": "-1",
    "float": "1e308",
    "big_int": str(2**70),
    "empty_string": '""',
    "string": '"x"',
    "terminal_escape": json.dumps("\x1b[2J\x1b]0;owned\x07\r"),
    "lone_surrogate": '"\\ud800"',
    "huge_string": json.dumps("A" * HUGE),
    "array": "[]",
    "array_of_strings": '["req.0", "t"]',
    "object": '{"a": 1}',
    "deep": "[" * DEEP + "]" * DEEP,
}


def mutate(line: bytes, key: str, text: str | None) -> bytes:
    """The record on ``line`` with ``key``'s value replaced by the JSON ``text`` (or removed)."""
    record = {k: json.dumps(v) for k, v in orjson.loads(line).items()}
    if text is None:
        del record[key]
    else:
        record[key] = text
    parts = [json.dumps(k) + ":" + v for k, v in record.items()]
    return ("{" + ",".join(parts) + "}").encode("utf-8", "surrogatepass")


def field_cases(lines: list[bytes]) -> Iterator[tuple[int, str, str]]:
    for index, line in enumerate(lines[:-1]):  # the last record has no successor to break
        for key in orjson.loads(line):
            for name in FIELD_MUTATIONS:
                yield index, key, name


def test_every_mutation_of_every_field_is_a_break_never_a_traceback(
    tmp_path: Path, real_trail: list[bytes]
) -> None:
    """Each field of each record removed or given a wrong type, huge or hostile value: BREAK."""
    path = tmp_path / "audit.jsonl"
    seen = 0
    for index, key, name in field_cases(real_trail):
        mutated = mutate(real_trail[index], key, FIELD_MUTATIONS[name])
        if mutated == real_trail[index]:
            continue  # the value was already this one
        lines = list(real_trail)
        lines[index] = mutated
        assert_reported(write(path, lines), broken=True)
        seen += 1
    assert seen > 500


LINE_MUTATIONS: dict[str, Callable[[bytes], bytes]] = {
    "not_json": lambda line: b"garbage",
    "bad_utf8": lambda line: line.replace(b'"type"', b'"\xff\xfe"'),
    "latin1": lambda line: line.replace(b'"type"', b'"t\xe9pe"'),
    "array": lambda line: b"[" + line + b"]",
    "number": lambda line: b"42",
    "string": lambda line: b'"' + line.replace(b'"', b"'") + b'"',
    "null": lambda line: b"null",
    "empty": lambda line: b"",
    "nul_bytes": lambda line: line.replace(b",", b",\0", 1),
    "bom": lambda line: b"\xef\xbb\xbf" + line,
    "crlf": lambda line: line + b"\r",
    "truncated": lambda line: line[: len(line) // 2],
    "deep": lambda line: b"[" * DEEP + b"]" * DEEP,
    "duplicate_key": lambda line: line[:-1] + b',"type":"start"}',
    "nan": lambda line: line.replace(b'"prev":', b'"nan":NaN,"prev":'),
    "prev_not_hex": lambda line: line.replace(b'"prev":"', b'"prev":"z'),
}


@pytest.mark.parametrize("name", sorted(LINE_MUTATIONS))
def test_a_line_that_is_not_a_record_is_a_break(
    tmp_path: Path, real_trail: list[bytes], name: str
) -> None:
    """Any line replaced by something that is not a record, anywhere but last: BREAK."""
    for index in range(len(real_trail) - 1):
        lines = list(real_trail)
        lines[index] = LINE_MUTATIONS[name](lines[index])
        assert_reported(write(tmp_path / "audit.jsonl", lines), broken=True)


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
        max_leaves=12,
    )


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_tampering_is_a_break_never_a_traceback(
    tmp_path: Path, real_trail: list[bytes], data: st.DataObject
) -> None:
    """Hypothesis: any value at any key, or any bytes for a line, before the last: BREAK."""
    index = data.draw(st.integers(0, len(real_trail) - 2))
    if data.draw(st.booleans()):
        record = orjson.loads(real_trail[index])
        key = data.draw(st.sampled_from(sorted(record)) | st.text())
        record[key] = data.draw(json_values())
        mutated = json.dumps(record, separators=(",", ":")).encode("utf-8", "surrogatepass")
    else:
        mutated = data.draw(st.binary(max_size=200)).replace(b"\n", b"")
    assume(mutated != real_trail[index])
    lines = list(real_trail)
    lines[index] = mutated
    assert_reported(write(tmp_path / "audit.jsonl", lines), broken=True)


@pytest.mark.parametrize("name", sorted(FIELD_MUTATIONS))
def test_the_last_record_tampered_gives_a_report(
    tmp_path: Path, real_trail: list[bytes], name: str
) -> None:
    """The last record (nothing after it to break) with any field mutated: still a report."""
    for key in orjson.loads(real_trail[-1]):
        lines = [*real_trail[:-1], mutate(real_trail[-1], key, FIELD_MUTATIONS[name])]
        assert_reported(write(tmp_path / "audit.jsonl", lines), broken=False)


def test_an_intent_without_its_tool_and_result_is_the_break_report(
    tmp_path: Path, real_trail: list[bytes]
) -> None:
    """The issue's case through the CLI: exit 1, BREAK lines, nothing on stderr."""
    lines = list(real_trail)
    index = next(i for i, line in enumerate(lines) if b'"type":"intent"' in line)
    lines[index] = mutate(lines[index], "tool", None)
    del lines[index + 1]  # its result
    done = run_verify(str(write(tmp_path / "audit.jsonl", lines)))
    assert (done.returncode, done.stderr) == (1, ""), done.stdout + done.stderr
    assert f"audit.jsonl:{index + 1}: not an audit record (intent without a string `tool`)" in (
        done.stdout
    )
    assert "does not follow the record before it" in done.stdout


def test_an_overlong_line_is_a_break_read_in_bounded_pieces(
    tmp_path: Path, real_trail: list[bytes]
) -> None:
    """A line over MAX_LINE_BYTES: a BREAK naming the bound; the lines after it are read."""
    path = write(tmp_path / "audit.jsonl", real_trail[:2])
    with path.open("ab") as f:  # written in pieces: the test holds no line of that size
        f.write(b'{"prev":"')
        for _ in range(MAX_LINE_BYTES // HUGE + 1):
            f.write(b"a" * HUGE)
        f.write(b'"}\n' + b"".join(line + b"\n" for line in real_trail[2:]))
    report = verify([path])
    assert f"audit.jsonl:3: not an audit record (longer than {MAX_LINE_BYTES} bytes)" in (
        report.summary()
    )
    assert report.records == len(real_trail)


def test_a_fifo_in_the_trail_is_refused_not_waited_on(tmp_path: Path) -> None:
    """A FIFO named as the audit file: exit 2, one line naming it, at once."""
    fifo = tmp_path / "audit.jsonl"
    os.mkfifo(fifo)
    done = run_verify(str(fifo))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"sshadapter: {fifo}: not a regular file\n"


def test_a_link_in_the_trail_is_refused_not_read_through(
    tmp_path: Path, real_trail: list[bytes]
) -> None:
    """A rotated sibling that is a link to a file elsewhere (a valid trail, even): one line."""
    write(tmp_path / "audit.jsonl", real_trail[2:])
    elsewhere = tmp_path / "outside" / "older.jsonl"
    elsewhere.parent.mkdir()
    write(elsewhere, real_trail[:2])
    (tmp_path / "audit.jsonl.1").symlink_to(elsewhere)
    done = run_verify(str(tmp_path / "audit.jsonl"))
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"sshadapter: {tmp_path / 'audit.jsonl.1'}: not a regular file\n"


def test_a_corrupt_gzip_sibling_is_one_line(tmp_path: Path, real_trail: list[bytes]) -> None:
    """A rotated .gz that is not gzip: exit 2, one line naming it and the reason."""
    write(tmp_path / "audit.jsonl", real_trail)
    (tmp_path / "audit.jsonl.1.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    done = run_verify(str(tmp_path / "audit.jsonl"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        f"sshadapter: {tmp_path / 'audit.jsonl.1.gz'}: cannot read line 1"
    )
    assert len(done.stderr.splitlines()) == 1


# --- rotation ------------------------------------------------------------------------------


def rotated_mid_call(path: Path, *, names: list[str]) -> None:
    """A call's intent, then a rotation per name (the file renamed to it), then its result."""
    import asyncio

    async def main() -> None:
        log = AuditLog(path, fsync="never")
        log.open()
        await log.append({"type": "start"})
        for n, name in enumerate(names):
            rid = f"req.{n:020x}"
            await log.append({"type": "intent", "request_id": rid, "tool": "t", "time": "x"})
            path.rename(path.with_name(name))
            log.reopen()
            await log.append({"type": "result", "request_id": rid, "attempts": [{}]})
        log.close()

    asyncio.run(main())


def test_a_call_across_a_rotation_is_no_alarm(tmp_path: Path) -> None:
    """Intent before logrotate, result after: `verify audit.jsonl` reads .1 too, intact."""
    path = tmp_path / "audit.jsonl"
    rotated_mid_call(path, names=["audit.jsonl.1"])
    done = run_verify(str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"files: {path}.1, {path}\n" in done.stdout
    assert "chain: intact" in done.stdout and "intents without a result: 0" in done.stdout


def test_the_current_file_alone_notes_an_intent_in_an_older_file(tmp_path: Path) -> None:
    """`--only` the current file: the result's intent is before it, a note and not a BREAK."""
    path = tmp_path / "audit.jsonl"
    rotated_mid_call(path, names=["audit.jsonl.1"])
    done = run_verify("--only", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"files: {path}\n" in done.stdout
    assert "its intent is not in these files" in done.stdout


def test_a_result_without_intent_from_genesis_is_still_a_break(tmp_path: Path) -> None:
    """A trail read from its first record with a result whose intent never was: BREAK."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path, fsync="never")
    log.open()
    log.write({"type": "start"})
    log.write({"type": "result", "request_id": "req.f", "attempts": [{}]})
    log.close()
    done = run_verify(str(path))
    assert done.returncode == 1 and "result of req.f ran without an intent record" in done.stdout


def test_rotated_siblings_in_logrotate_names_are_read_oldest_first(tmp_path: Path) -> None:
    """.N (newest first), .N.gz (compress) and -DATE (dateext): one intact chain, in order."""
    path = tmp_path / "audit.jsonl"
    expected = [
        "audit.jsonl-20261128",
        "audit.jsonl-20261129.gz",
        "audit.jsonl.4",
        "audit.jsonl.3.gz",
        "audit.jsonl.2",
        "audit.jsonl.1",
    ]
    rotated_mid_call(path, names=[name.removesuffix(".gz") for name in expected])
    for name in expected:
        if name.endswith(".gz"):
            plain = tmp_path / name.removesuffix(".gz")
            (tmp_path / name).write_bytes(gzip.compress(plain.read_bytes()))
            plain.unlink()
    (tmp_path / "audit.jsonl.x").write_bytes(b"not part of the trail\n")
    (tmp_path / "audit.jsonl.1.bak").write_bytes(b"nor this\n")
    assert [p.name for p in trail(path)] == [*expected, "audit.jsonl"]
    report = verify(trail(path))
    assert report.ok and not report.notes and not report.open_intents, report.summary()
