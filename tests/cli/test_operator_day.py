"""The operator's day: `audit show` of one call, `record` of an output into a fixture case."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, ROOT, Running, with_daemon
from test_integration import cli

from sshadapter.audit.writer import GENESIS
from sshadapter.check.fixtures import load_fixtures
from sshadapter.check.report import check_registry
from sshadapter.config import load_config
from sshadapter.contract.registry import load_registry
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}
BAD_OUT = orjson.dumps({**JOB_OUT, "state": 7})  # `state` is a string in the schema


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    return done.stderr


@pytest.fixture
def day(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A daemon ran: an accepted call, a rejected one (quarantined), a refused one. Returns
    the config file (for the CLI) and the request ids by kind."""
    outputs = iter([orjson.dumps(JOB_OUT), BAD_OUT])
    ids: dict[str, str] = {}

    async def remote() -> RunResult:
        return RunResult(next(outputs), b"a warning\n", 0)

    async def body(d: Running) -> None:
        ids["ok"] = (await d.ask(CALL))["request_id"]
        ids["rejected"] = (await d.ask(CALL))["request_id"]
        ids["refused"] = (await d.ask({**CALL, "args": {"project_id": "../etc"}}))["request_id"]

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: remote}), quarantine=True)
    config = tmp_path / "config.toml"
    hosts = "".join(
        f'[hosts.{alias}]\naddress = "127.0.0.1"\nuser = "nobody"\n'
        f'known_hosts = "{tmp_path / "known_hosts"}"\n'
        for alias in ("ci", "local")
    )
    config.write_text(
        f'[paths]\ncommands = "{tmp_path / "commands"}"\nschemas = "{ROOT / "schemas"}"\n'
        f'[audit]\npath = "{tmp_path / "audit.jsonl"}"\n'
        f'quarantine_dir = "{tmp_path / "quarantine"}"\n{hosts}'
    )
    return config, ids


def case_rows(config: Path, case: str) -> list[bool]:
    """Whether `sshadapter check` passes each row of one recorded case (near-misses too)."""
    loaded, _ = load_config(config)
    registry = load_registry(loaded.paths.commands, loaded.paths.schemas, hosts=None)
    op = registry.operations["job_run_status"]
    assert [f.case for f in load_fixtures(op)] == [case]
    return [row.ok for row in check_registry(registry) if row.case == case]


def test_audit_show_prints_a_rejected_call_readably(day: tuple[Path, dict[str, str]]) -> None:
    """Intent and result of one call: tool, caller, command, the attempt's verdict, quarantine."""
    config, ids = day
    done = cli("audit", "show", ids["rejected"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.startswith(f"{ids['rejected']}  job_run_status\n")
    assert "  intent attempt 1" in out and "  result failure INVALID_RESPONSE" in out
    assert f"caller: uid {os.getuid()} gid {os.getgid()} pid " in out
    assert f"command: {JOB_COMMAND}" in out
    assert "attempt 1: exit 0, stdout" in out and ": schema/" in out
    assert (
        f"quarantine: stdout {ids['rejected']}.1.stdout, stderr {ids['rejected']}.1.stderr" in out
    )
    refused = cli("audit", "show", ids["refused"], "--config", str(config))
    assert refused.returncode == 0 and "intent" not in refused.stdout
    assert "verdict: request/bad_arguments" in refused.stdout


def test_audit_show_reads_across_a_rotation(day: tuple[Path, dict[str, str]]) -> None:
    """The intent in audit.jsonl.1, the result in audit.jsonl: both shown, the chain checked."""
    config, ids = day
    path = config.parent / "audit.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if ids["rejected"].encode() in line) + 1
    (config.parent / "audit.jsonl.1").write_bytes(b"".join(lines[:cut]))
    path.write_bytes(b"".join(lines[cut:]))
    done = cli("audit", "show", ids["rejected"], str(path))
    assert done.returncode == 0, done.stderr
    assert f"audit.jsonl.1:{cut})" in done.stdout and "result failure" in done.stdout


def test_audit_show_of_an_unknown_id_or_a_tampered_trail_is_one_line(
    day: tuple[Path, dict[str, str]],
) -> None:
    """No such call: exit 1, one line; an edited record anywhere: exit 1, the break named."""
    config, ids = day
    unknown = cli("audit", "show", "req." + "0" * 20, "--config", str(config))
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert "no record of req.00000000000000000000" in one_line(unknown)
    assert cli("audit", "show", "nonsense", "--config", str(config)).returncode == 2
    path = config.parent / "audit.jsonl"
    path.write_bytes(path.read_bytes().replace(b'"uid":', b'"uid":1', 1))
    tampered = cli("audit", "show", ids["ok"], "--config", str(config))
    assert tampered.returncode == 1 and tampered.stdout == ""
    line = one_line(tampered)
    assert "audit trail broken: " in line and f"{path}:" in line and "edited" in line


def test_record_a_quarantined_rejection_into_a_case_check_runs(
    day: tuple[Path, dict[str, str]],
) -> None:
    """--request writes a case `check` passes; recording it again replaces nothing.

    The quarantined bytes, the arguments read back from the command, the daemon's verdict.
    """
    config, ids = day
    done = cli("record", "rejected_state", "--request", ids["rejected"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    fixtures = config.parent / "commands" / "job_run_status.fixtures"
    assert (fixtures / "rejected_state.stdout").read_bytes() == BAD_OUT
    assert (fixtures / "rejected_state.stderr").read_bytes() == b"a warning\n"
    case = orjson.loads((fixtures / "rejected_state.case.json").read_bytes())
    assert case["args"] == {"project_id": "bluebird"} and case["exit_status"] == 0
    assert case["expect"]["outcome"] == "failure" and case["expect"]["stage"] == "schema"
    assert case["expect"]["code"] == "INVALID_RESPONSE"
    assert case_rows(config, "rejected_state") == [True]
    before = (fixtures / "rejected_state.case.json").read_bytes()
    again = cli("record", "rejected_state", "--request", ids["rejected"], "--config", str(config))
    assert again.returncode == 1 and "exists" in one_line(again)
    assert (fixtures / "rejected_state.case.json").read_bytes() == before


def test_record_expect_success_of_a_rejection_notes_the_contract_must_change(
    day: tuple[Path, dict[str, str]],
) -> None:
    """--expect success: written, with a note that the contract rejects it now."""
    config, ids = day
    done = cli(
        "record", "state_7", "--request", ids["rejected"], "--expect", "success",
        "--config", str(config),
    )  # fmt: skip
    assert done.returncode == 0 and "the contract rejects this output now" in done.stderr
    assert case_rows(config, "state_7") == [False]


def test_record_of_a_quarantine_entry_gone_is_one_line(day: tuple[Path, dict[str, str]]) -> None:
    """The quarantined file removed (evicted): exit 1, one line; a call never quarantined too."""
    config, ids = day
    (config.parent / "quarantine" / f"{ids['rejected']}.1.stdout").unlink()
    done = cli("record", "gone", "--request", ids["rejected"], "--config", str(config))
    assert done.returncode == 1 and "no longer in the quarantine" in one_line(done)
    clean = cli("record", "clean", "--request", ids["ok"], "--config", str(config))
    assert clean.returncode == 1 and "no quarantined output" in one_line(clean)
    assert not (config.parent / "commands" / "job_run_status.fixtures").exists()


def test_record_refuses_a_link_planted_in_the_quarantine(
    day: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """A quarantined file swapped for a link to a 0600 file elsewhere: one line, nothing written.

    The link's target holds the very bytes the record names, so only the link gives it away."""
    config, ids = day
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_bytes(BAD_OUT)
    secret.chmod(0o600)
    planted = config.parent / "quarantine" / f"{ids['rejected']}.1.stdout"
    planted.unlink()
    planted.symlink_to(secret)
    done = cli("record", "stolen", "--request", ids["rejected"], "--config", str(config))
    assert done.returncode != 0 and done.stdout == ""
    assert one_line(done) == f"sshadapter: {planted}: not a regular file (a symlink)\n"
    assert not (config.parent / "commands" / "job_run_status.fixtures").exists()


def test_record_refuses_a_fixtures_directory_that_is_a_link(
    day: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """The case's directory a link to another directory: one line, nothing written there."""
    config, ids = day
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    fixtures = config.parent / "commands" / "job_run_status.fixtures"
    fixtures.symlink_to(elsewhere)
    done = cli("record", "sideways", "--request", ids["rejected"], "--config", str(config))
    assert done.returncode != 0 and done.stdout == ""
    assert one_line(done) == (
        f"sshadapter: {fixtures}: fixtures: is a symlink: give the real directory\n"
    )
    assert list(elsewhere.iterdir()) == []


def test_recorded_files_get_no_more_permission_than_their_source(
    day: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """From the quarantine (0600): 0600 files; from a captured 0640 file: 0640, never 0644."""
    config, ids = day
    done = cli("record", "private", "--request", ids["rejected"], "--config", str(config))
    assert done.returncode == 0, done.stderr
    fixtures = config.parent / "commands" / "job_run_status.fixtures"
    written = sorted(fixtures.glob("private.*"))
    assert len(written) == 3 and {p.stat().st_mode & 0o777 for p in written} == {0o600}
    captured = tmp_path / "out.json"
    captured.write_bytes(orjson.dumps(JOB_OUT))
    captured.chmod(0o640)
    done = cli(
        "record", "captured", "--tool", "job_run_status", "--stdout", str(captured),
        "--args", "project_id=bluebird", "--config", str(config),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = sorted(fixtures.glob("captured.*"))
    assert len(written) == 2 and {p.stat().st_mode & 0o777 for p in written} == {0o640}


def test_record_a_captured_output_with_its_arguments(
    day: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    """--tool --stdout --args --now: the contract's answer now becomes the expectation."""
    config, _ = day
    captured = tmp_path / "out.json"
    captured.write_bytes(orjson.dumps(JOB_OUT))
    done = cli(
        "record", "captured", "--tool", "job_run_status", "--stdout", str(captured),
        "--args", "project_id=bluebird", "--now", "2026-11-30T04:12:00Z", "--config", str(config),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    case = orjson.loads(
        (config.parent / "commands/job_run_status.fixtures/captured.case.json").read_bytes()
    )
    assert case["expect"] == {
        "outcome": "success",
        "data": {k: JOB_OUT[k] for k in ("project_id", "run_id", "state", "observed_at")},
    }
    assert all(case_rows(config, "captured"))
    wrong = cli(
        "record", "wrong", "--tool", "job_run_status", "--stdout", str(captured),
        "--args", "project_id=../etc", "--config", str(config),
    )  # fmt: skip
    assert wrong.returncode == 1 and "parameter schema" in one_line(wrong)


def test_audit_show_and_record_of_a_fan_out(tmp_path: Path) -> None:
    """A fan-out's hosts each get a line; the one quarantined host's output is recorded."""
    from test_fanout import on_fleet, operator_files, run_on, scripted_fleet

    commands, schemas = operator_files(tmp_path)
    hosts, _ = scripted_fleet(2)
    outputs = iter([b"state up\n", b"state \x1b[31msideways\n"])

    async def remote() -> RunResult:
        return RunResult(next(outputs), b"", 0)

    ids: list[str] = []

    async def body(d: Running) -> None:
        ids.append((await d.ask(run_on("fleet")))["request_id"])

    runner = ScriptedRunner({"echo state up": remote})
    on_fleet(tmp_path, body, runner, hosts, commands, schemas, quarantine=True)
    config = tmp_path / "config.toml"
    host_tables = "".join(
        f'[hosts.{alias}]\naddress = "127.0.0.1"\nuser = "nobody"\nknown_hosts = "/x"\n'
        for alias in hosts
    )
    config.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{schemas}"\n'
        f'[audit]\npath = "{tmp_path / "audit.jsonl"}"\n'
        f'quarantine_dir = "{tmp_path / "quarantine"}"\n'
        f'{host_tables}[groups.fleet]\nmembers = ["web000", "web001"]\n'
    )
    shown = cli("audit", "show", ids[0], "--config", str(config))
    assert shown.returncode == 0, shown.stderr
    assert "target fleet (2 host(s))" in shown.stdout
    host_lines = [line.strip() for line in shown.stdout.splitlines() if "  host web" in line]
    assert len(host_lines) == 2 and sum("failure INVALID_RESPONSE" in h for h in host_lines) == 1
    assert "\x1b" not in shown.stdout  # what a host printed reaches no terminal raw
    done = cli("record", "sideways", "--request", ids[0], "--config", str(config))
    assert done.returncode == 0, done.stderr
    stdout = (commands / "fleet_state.fixtures" / "sideways.stdout").read_bytes()
    assert stdout == b"state \x1b[31msideways\n"  # the rejected host's bytes, whichever it was


# What a terminal acts on: CSI, OSC with BEL, CR, a line that poses as a log record, the bidi
# override and isolate (Trojan Source), a C1 CSI.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\r\nCRITICAL sshadapter: approved\u202etxt.exe\u2066\x9b"


def rechained(lines: list[bytes], edit: Callable[[dict[str, Any]], None]) -> bytes:
    """The records on ``lines`` each edited, then chained again: a trail verify passes."""
    prev, out = GENESIS, []
    for line in lines:
        record = orjson.loads(line)
        edit(record)
        body = orjson.dumps({**record, "prev": prev})
        prev = hashlib.sha256(body).hexdigest()
        out.append(body + b"\n")
    return b"".join(out)


def with_hostile_fields(record: dict[str, Any]) -> None:
    """Every field `audit show` prints, down to nested keys, holds ``HOSTILE``."""
    for key in ("time", "tool", "code", "detail", "stage", "reason", "host"):
        if key in record:
            record[key] = HOSTILE
    record["command"] = "/usr/bin/true" + HOSTILE
    record["caller"] = {"uid": HOSTILE, "gid": 0, "pid": 1}
    for attempt in record.get("attempts", []):
        attempt.update(transport_error=HOSTILE, interrupted=HOSTILE)
        attempt["quarantine"] = {HOSTILE: HOSTILE}
        attempt["verdict"].update(stage=HOSTILE, detail=HOSTILE)


def assert_plain(out: str, lines: int) -> None:
    """``lines`` lines, each printable, none starting as a forged log line; ESC shown escaped."""
    assert len(out.splitlines()) == lines, out
    assert all(line.isprintable() for line in out.splitlines()), out
    assert "\nCRITICAL" not in out and "\\x1b" in out, out


def test_audit_show_and_verify_print_no_raw_byte_of_a_record_or_a_file_name(
    tmp_path: Path,
) -> None:
    """ESC, CR/LF, BEL, C1 and bidi bytes in every field and in the trail's name: escaped.

    By `audit show`, by its refusal of a broken trail and by `audit verify`.
    """
    outputs = iter([orjson.dumps(JOB_OUT), BAD_OUT])
    ids: list[str] = []

    async def remote() -> RunResult:
        return RunResult(next(outputs), b"a warning\n", 0)

    async def body(d: Running) -> None:
        ids.extend([(await d.ask(CALL))["request_id"] for _ in range(2)])

    path = tmp_path / f"trail{HOSTILE}" / "audit.jsonl"
    runner = ScriptedRunner({JOB_COMMAND: remote})
    with_daemon(tmp_path, body, runner=runner, quarantine=True, audit_path=path)
    plain = cli("audit", "show", ids[1], str(path))
    assert plain.returncode == 0, plain.stderr
    path.write_bytes(rechained(path.read_bytes().splitlines(), with_hostile_fields))

    shown = cli("audit", "show", ids[1], str(path))
    assert shown.returncode == 0, shown.stderr
    assert_plain(shown.stdout, len(plain.stdout.splitlines()) + 1)  # + `interrupted:`
    assert "command: /usr/bin/true\\x1b[2J\\x1b]0;owned\\x07\\r\\nCRITICAL" in shown.stdout
    assert "\\u202etxt.exe\\u2066\\x9b" in shown.stdout
    verified = cli("audit", "verify", str(path))
    assert verified.returncode == 0, verified.stdout

    lines = path.read_bytes().splitlines(keepends=True)
    lines[2] = lines[2].replace(b'"gid":0', b'"gid":1')  # an edit: the chain breaks after it
    path.write_bytes(b"".join(lines))
    refused = cli("audit", "show", ids[1], str(path))
    assert refused.returncode == 1 and refused.stdout == ""
    assert_plain(one_line(refused), 1)
    assert "trail\\x1b[2J" in refused.stderr and ":4: does not follow" in refused.stderr
    broken = cli("audit", "verify", str(path))
    assert broken.returncode == 1 and "  BREAK " in broken.stdout
    assert_plain(broken.stdout, 5)
