"""The audit trail: durable records, group commit, the hash chain and its verifier, quarantine."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pwd
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, Running, shipped_commands, with_daemon

from sshadapter.audit.quarantine import Quarantine
from sshadapter.audit.verify import verify
from sshadapter.audit.writer import GENESIS, AuditLog
from sshadapter.errors import AuditError, ConfigError
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner

CALL = {"op": "call", "tool": "job_run_status", "args": {"project_id": "bluebird"}}


def write_log(path: Path, records: list[dict[str, object]], fsync: str = "never") -> AuditLog:
    async def main() -> AuditLog:
        log = AuditLog(path, fsync=fsync)  # type: ignore[arg-type]
        log.open()
        for record in records:
            await log.append(record)
        log.close()
        return log

    return asyncio.run(main())


def intent(request_id: str) -> dict[str, object]:
    """The fields of an intent that `audit verify` reads."""
    return {"type": "intent", "request_id": request_id, "tool": "t", "time": "x"}


def sample(n: int) -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{"type": "start"}]
    for i in range(n):
        out += [
            intent(f"req.{i:08d}"),
            {"type": "result", "request_id": f"req.{i:08d}", "attempts": [{}]},
        ]
    return out


def test_group_commit_shares_fsyncs_between_concurrent_appends(tmp_path: Path) -> None:
    """200 concurrent durable appends all complete with far fewer fsyncs than records."""

    async def main() -> AuditLog:
        log = AuditLog(tmp_path / "a.jsonl", fsync="always")
        log.open()
        await asyncio.gather(*(log.append({"type": "x", "n": i}) for i in range(200)))
        log.close()
        return log

    log = asyncio.run(main())
    assert len((tmp_path / "a.jsonl").read_bytes().splitlines()) == 200
    assert 1 <= log.syncs < 100


def test_a_lone_append_is_synced_before_it_returns_without_a_loop_turn(tmp_path: Path) -> None:
    """alone=True on a fast disk: durable when append returns, and no other callback ran."""

    async def main() -> tuple[AuditLog, list[str]]:
        # Any fsync counts as fast here: a loaded machine's disk must not decide the test.
        log = AuditLog(tmp_path / "a.jsonl", fsync="always", inline_fsync_max_seconds=math.inf)
        log.open()
        turns: list[str] = []
        for i in range(3):
            asyncio.get_running_loop().call_soon(turns.append, f"turn {i}")
            await log.append({"type": "x", "n": i}, alone=True)
            assert turns == [f"turn {j}" for j in range(i)]  # the loop did not turn meanwhile
            await asyncio.sleep(0)
        log.close()
        return log, turns

    log, _ = asyncio.run(main())
    assert log.syncs == 3  # one fsync per record, each before its append returned


def test_an_append_alone_beside_a_waiting_one_shares_the_group_commit(tmp_path: Path) -> None:
    """alone=True while another append waits for its fsync: both durable, one group commit."""

    async def main() -> AuditLog:
        log = AuditLog(tmp_path / "a.jsonl", fsync="always")
        log.open()
        await asyncio.gather(log.append({"type": "x"}), log.append({"type": "y"}, alone=True))
        log.close()
        return log

    log = asyncio.run(main())
    assert len((tmp_path / "a.jsonl").read_bytes().splitlines()) == 2
    assert log.syncs == 1


def test_chain_of_an_untouched_log_is_intact(tmp_path: Path) -> None:
    """A log written by AuditLog verifies clean, first record chained to the genesis hash."""
    write_log(tmp_path / "a.jsonl", sample(5))
    report = verify([tmp_path / "a.jsonl"])
    assert report.ok and report.records == 11 and not report.open_intents
    assert orjson.loads((tmp_path / "a.jsonl").read_bytes().splitlines()[0])["prev"] == GENESIS


@pytest.mark.parametrize("tamper", ["edit", "delete", "reorder", "cut_middle", "insert"])
def test_tampering_breaks_the_chain(tmp_path: Path, tamper: str) -> None:
    """Editing, deleting, reordering, cutting or inserting records is reported as a break."""
    path = tmp_path / "a.jsonl"
    write_log(path, sample(5))
    lines = path.read_bytes().splitlines(keepends=True)
    if tamper == "edit":
        lines[4] = lines[4].replace(b'"attempts":[{}]', b'"attempts":[]')
    elif tamper == "delete":
        del lines[3]
    elif tamper == "reorder":
        lines[3], lines[4] = lines[4], lines[3]
    elif tamper == "cut_middle":
        del lines[2:7]
    else:
        forged = b'{"type":"result","request_id":"req.forged","prev":"' + b"0" * 64 + b'"}\n'
        lines.insert(5, forged)
    path.write_bytes(b"".join(lines))
    report = verify([path])
    assert not report.ok, report.summary()


def test_intents_without_result_are_listed(tmp_path: Path) -> None:
    """A call that died with the daemon shows as an intent with no result."""
    records: list[dict[str, object]] = [
        *sample(2),
        {
            "type": "intent",
            "request_id": "req.dead0000",
            "tool": "t",
            "time": "2026-11-30T04:00:00Z",
        },
        {"type": "start"},
    ]
    write_log(tmp_path / "a.jsonl", records)
    report = verify([tmp_path / "a.jsonl"])
    assert report.ok
    assert [r["request_id"] for r in report.open_intents] == ["req.dead0000"]


def test_torn_last_write_is_recovered_on_restart(tmp_path: Path) -> None:
    """A half-written line (power loss) is ended on reopen and the chain goes on past it."""
    path = tmp_path / "a.jsonl"
    write_log(path, sample(1))
    with path.open("ab") as f:
        f.write(b'{"type":"intent","request_id":"req.torn')
    write_log(path, [{"type": "start"}, intent("req.after")])
    report = verify([path])
    assert report.ok, report.summary()
    assert len(report.torn) == 1


def test_garbage_line_in_the_middle_is_a_break(tmp_path: Path) -> None:
    """A non-record line not followed by a daemon start is tampering, not a torn write."""
    path = tmp_path / "a.jsonl"
    write_log(path, sample(2))
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(2, b"garbage\n")
    path.write_bytes(b"".join(lines))
    assert not verify([path]).ok


def test_chain_continues_across_rotation(tmp_path: Path) -> None:
    """After logrotate renames the file and SIGHUP reopens it, old + new verify as one chain."""
    path = tmp_path / "a.jsonl"

    async def main() -> None:
        log = AuditLog(path, fsync="never")
        log.open()
        await log.append({"type": "start"})
        path.rename(tmp_path / "a.jsonl.1")
        log.reopen()
        await log.append(intent("req.00000001"))
        log.close()

    asyncio.run(main())
    assert verify([tmp_path / "a.jsonl.1", path]).ok
    assert verify([path]).notes  # alone, the new file says its chain started earlier


def test_chain_continues_across_restart(tmp_path: Path) -> None:
    """A restarted daemon chains its first record to the last one on disk."""
    path = tmp_path / "a.jsonl"
    write_log(path, sample(1))
    write_log(path, [{"type": "start"}])
    assert verify([path]).ok


def test_quarantine_files_are_private_from_creation_and_capped(tmp_path: Path) -> None:
    """Directory 0700, files 0600, and the oldest files go when the cap is reached."""
    q = Quarantine(tmp_path / "q", max_bytes=250)
    q.open()
    for i in range(5):
        assert q.keep(f"req.{i}.stdout", bytes([65 + i]) * 100) is not None
    assert stat.S_IMODE((tmp_path / "q").stat().st_mode) == 0o700
    kept = sorted(p.name for p in (tmp_path / "q").iterdir())
    assert kept == ["req.3.stdout", "req.4.stdout"]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (tmp_path / "q").iterdir())
    assert q.keep("req.big.stdout", b"x" * 251) is None  # larger than the whole cap


def test_rejected_output_is_quarantined_and_named_in_the_result(tmp_path: Path) -> None:
    """The raw bytes of a rejection are kept byte-exact and the result record names them."""
    raw = b'{"decision": "approved", "admin_override": true}'
    runner = ScriptedRunner({JOB_COMMAND: RunResult(raw, b"warning\n", 0)})

    async def body(d: Running) -> None:
        assert (await d.ask(CALL))["error"]["code"] == "INVALID_RESPONSE"
        result = [r for r in d.audit_records() if r["type"] == "result"][-1]
        names = result["attempts"][0]["quarantine"]
        directory = d.service.quarantine.directory  # type: ignore[union-attr]
        assert (directory / names["stdout"]).read_bytes() == raw
        assert (directory / names["stderr"]).read_bytes() == b"warning\n"

    with_daemon(tmp_path, body, runner=runner, quarantine=True)


def test_a_failure_declared_by_stderr_is_quarantined_like_a_rejection(tmp_path: Path) -> None:
    """findmnt's usage error (exit 1, a message) is INVALID_RESPONSE; its stderr is quarantined."""
    usage = b"findmnt: invalid option -- 'J'\n"
    command = "findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS /"
    runner = ScriptedRunner({command: RunResult(b"", usage, 1)})
    call = {"op": "call", "tool": "mount_info", "args": {"target": "/"}}

    async def body(d: Running) -> None:
        assert (await d.ask(call))["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
        result = [r for r in d.audit_records() if r["type"] == "result"][-1]
        assert (result["stage"], result["reason"]) == ("exit", "declared_exit_status")
        assert result["detail"] == "exit status 1, stderr not empty = INVALID_RESPONSE"
        names = result["attempts"][0]["quarantine"]
        directory = d.service.quarantine.directory  # type: ignore[union-attr]
        assert (directory / names["stderr"]).read_bytes() == usage

    with_daemon(tmp_path, body, runner=runner, quarantine=True)


def test_result_that_cannot_be_written_is_internal_not_retryable(tmp_path: Path) -> None:
    """The command ran but its result record failed: the caller gets INTERNAL, retryable false."""
    holder: dict[str, Running] = {}

    async def close_audit_then_answer() -> RunResult:
        holder["d"].service.audit.close()
        return RunResult(b"{}", b"", 0)

    async def body(d: Running) -> None:
        holder["d"] = d
        response = await d.ask(CALL)
        assert response["error"] == {"code": "INTERNAL", "retryable": False}
        assert d.service.metrics.audit_failures._value.get() == 1

    with_daemon(tmp_path, body, runner=ScriptedRunner({JOB_COMMAND: close_audit_then_answer}))


def test_no_key_path_in_audit_quarantine_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A private key path from the config appears in no record, quarantine file or log line."""
    from sshadapter.config import HostSection
    from sshadapter.runners.ssh.runner import SshRunner

    secret = tmp_path / "keys" / "SECRET-ci-key-do-not-leak"
    host = HostSection(
        address="127.0.0.1",
        port=1,
        user="nobody",
        client_keys=(secret,),
        known_hosts=tmp_path / "known_hosts",
    )
    runner = SshRunner({"ci": host, "local": host})

    async def body(d: Running) -> None:
        response = await d.ask(CALL)
        assert response["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
        await runner.close()

    with_daemon(tmp_path, body, runner=runner, hosts={"ci": host, "local": host}, quarantine=True)
    evidence = (tmp_path / "audit.jsonl").read_bytes() + caplog.text.encode()
    for path in (tmp_path / "quarantine").iterdir():
        evidence += path.read_bytes()
    assert b"SECRET-ci-key" not in evidence
    assert b"no_credentials" in evidence


# --- hostile files and a full disk (issue 9) -------------------------------------------------


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs (root only: it is mounted for the test, then unmounted)."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the full-disk tests need root to mount a tmpfs, and CI runs as root")
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)], check=True
    )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(directory: Path) -> Path:
    """Fill the filesystem of ``directory`` to the last byte; return the filler file."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (4096, 1):  # pages, then the last bytes one at a time
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
    return filler


def test_full_disk_leaves_the_log_at_a_record_boundary(tiny_disk: Path) -> None:
    """Writes fail while the disk is full; once space returns, every line is a whole record."""
    path = tiny_disk / "audit.jsonl"

    async def main() -> list[str]:
        log = AuditLog(path, fsync="always")
        log.open()
        await log.append({"type": "start"})
        filler = fill(tiny_disk)
        errors = []
        # What is left of the file's last page fills first; then writes are cut short
        # (a partial record) or refused whole.
        for i in range(12):
            try:
                await log.append({"type": "start", "n": i, "pad": "x" * 900})
            except AuditError as exc:
                errors.append(exc.reason)
        filler.unlink()
        await log.append(intent("req.after000"))
        await log.append({"type": "result", "request_id": "req.after000", "attempts": [{}]})
        log.close()
        return errors

    errors = asyncio.run(main())
    assert len(errors) >= 8 and set(errors) == {"result_not_written"}
    lines = path.read_bytes().splitlines()
    kinds = [orjson.loads(line)["type"] for line in lines]  # every line parses
    assert kinds == ["start", *["start"] * (12 - len(errors)), "intent", "result"]
    report = verify([path])
    assert report.ok and not report.torn and not report.open_intents, report.summary()


def test_full_audit_disk_fails_calls_closed_and_recovers(tiny_disk: Path, tmp_path: Path) -> None:
    """A full audit disk fails calls closed (INTERNAL, nothing runs) until space returns.

    Then a call succeeds and `audit verify` finds every call with its intent."""
    audit = tiny_disk / "audit.jsonl"
    runner = ScriptedRunner({JOB_COMMAND: RunResult(orjson.dumps(JOB_OUT), b"", 0)})

    succeeded = 0

    async def body(d: Running) -> None:
        nonlocal succeeded
        filler = fill(tiny_disk)
        answers = [await d.ask(CALL) for _ in range(12)]  # the file's last page fills, then none
        succeeded = sum(a["outcome"] == "success" for a in answers)
        assert succeeded <= 8
        for answer in answers[succeeded:]:
            assert answer["error"] == {"code": "INTERNAL", "retryable": False}
        assert len(runner.calls) <= succeeded + 1  # an unwritten intent runs no command
        filler.unlink()
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body, runner=runner, audit_path=audit)
    report = verify([audit])
    assert report.ok and not report.torn, report.summary()
    assert report.kinds["intent"] == len(runner.calls)  # every command ran after its intent
    # A call whose result record could not be written is an intent without a result.
    assert len(report.open_intents) == len(runner.calls) - succeeded - 1


def test_a_deleted_audit_file_is_replaced_before_the_next_record(tmp_path: Path) -> None:
    """Deleting the file (no SIGHUP): the next record goes to a new file, the chain goes on."""
    path = tmp_path / "audit.jsonl"

    async def main() -> None:
        log = AuditLog(path, fsync="always")
        log.open()
        await log.append({"type": "start"})
        path.unlink()
        await log.append({"type": "intent", "request_id": "req.00000001"})
        log.close()

    asyncio.run(main())
    (line,) = path.read_bytes().splitlines()
    assert orjson.loads(line)["request_id"] == "req.00000001"
    assert orjson.loads(line)["prev"] != GENESIS  # chained to the record in the deleted file


def test_audit_file_is_created_0600(tmp_path: Path) -> None:
    """The daemon's audit file is its own: created with no group or other access."""
    log = AuditLog(tmp_path / "audit.jsonl")
    log.open()
    log.close()
    assert stat.S_IMODE((tmp_path / "audit.jsonl").stat().st_mode) == 0o600


@pytest.mark.parametrize("mode", [0o640, 0o666])
def test_audit_file_open_to_others_is_refused(tmp_path: Path, mode: int) -> None:
    """An existing audit file with group or other access: ConfigError naming path and fix."""
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"")
    path.chmod(mode)
    with pytest.raises(ConfigError) as refused:
        AuditLog(path).open()
    assert refused.value.file == str(path) and refused.value.key == "audit.path"
    assert f"mode {mode:04o}" in refused.value.reason and "chmod 600" in refused.value.reason


def other_account() -> int:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("files of another account need root to make, and CI runs as root")
        pytest.skip("making a file owned by another account needs root")
    return pwd.getpwnam("nobody").pw_uid


def test_audit_file_of_another_account_is_refused(tmp_path: Path) -> None:
    """An audit file created beforehand (0600) by another uid: refused, the owner named."""
    nobody = other_account()
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"")
    path.chmod(0o600)
    os.chown(path, nobody, -1)
    with pytest.raises(ConfigError) as refused:
        AuditLog(path).open()
    assert f"owned by nobody (uid {nobody})" in refused.value.reason


def test_quarantine_directory_of_another_account_is_refused(tmp_path: Path) -> None:
    """A quarantine directory created 0700 by another uid: refused, though its mode looks right."""
    nobody = other_account()
    directory = tmp_path / "quarantine"
    directory.mkdir(mode=0o700)
    os.chown(directory, nobody, -1)
    with pytest.raises(ConfigError) as refused:
        Quarantine(directory, 1024).open()
    assert refused.value.key == "audit.quarantine_dir"
    assert f"owned by nobody (uid {nobody})" in refused.value.reason


def test_quarantine_directory_open_to_the_group_is_refused(tmp_path: Path) -> None:
    """A 0750 quarantine directory of our own: refused with the chmod that fixes it."""
    directory = tmp_path / "quarantine"
    directory.mkdir(mode=0o750)
    directory.chmod(0o750)
    with pytest.raises(ConfigError) as refused:
        Quarantine(directory, 1024).open()
    assert "chmod 700" in refused.value.reason


@pytest.mark.parametrize("what", ["audit", "quarantine"])
def test_symlinked_paths_are_refused(tmp_path: Path, what: str) -> None:
    """An audit file or quarantine directory that is a symlink: refused, naming the path."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    link = tmp_path / "link"
    if what == "audit":
        (target / "audit.jsonl").write_bytes(b"")
        (target / "audit.jsonl").chmod(0o600)
        link.symlink_to(target / "audit.jsonl")
        with pytest.raises(ConfigError) as refused:
            AuditLog(link).open()
    else:
        link.symlink_to(target)
        with pytest.raises(ConfigError) as refused:
            Quarantine(link, 1024).open()
    assert refused.value.file == str(link) and "symlink" in refused.value.reason


# --- rotation under load (issue 17) ----------------------------------------------------------

ROTATIONS = 25  # the renames of the report, each while calls are in flight
REMOTE_SECONDS = 0.004  # the longest a scripted remote command takes, spreading the writes
AGENTS = 8  # concurrent callers, so group commit hands fsyncs to threads


def rotate(path: Path) -> None:
    """What logrotate does without `copytruncate`: .N -> .N+1, ..., the file itself -> .1."""
    if not path.exists():  # `missingok`: nothing written since the last rotation
        return
    rotated = sorted(
        (p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()),
        key=lambda p: int(p.suffix[1:]),
        reverse=True,
    )
    for old in rotated:
        old.rename(path.with_name(f"{path.name}.{int(old.suffix[1:]) + 1}"))
    path.rename(path.with_name(path.name + ".1"))


def trail(path: Path) -> list[Path]:
    """The current file and its rotated siblings, oldest first."""
    rotated = [p for p in path.parent.glob(path.name + ".*") if p.suffix[1:].isdigit()]
    return [*sorted(rotated, key=lambda p: -int(p.suffix[1:])), path]


@pytest.mark.parametrize("sighup", [True, False], ids=["sighup", "no_sighup"])
def test_rotation_under_concurrent_calls_fails_no_call(tmp_path: Path, sighup: bool) -> None:
    """25 renames of the audit file under 8 agents: no call fails, each answer is in the trail."""
    path = tmp_path / "audit.jsonl"
    answers: list[dict[str, object]] = []
    pace = random.Random(17)

    async def remote() -> RunResult:  # a remote command takes a moment, as over SSH
        await asyncio.sleep(pace.uniform(0, REMOTE_SECONDS))
        return RunResult(orjson.dumps(JOB_OUT), b"", 0)

    async def body(d: Running) -> None:
        done = asyncio.Event()

        async def agent() -> None:
            while not done.is_set():
                answers.append(await d.ask(CALL))

        async def rotations() -> None:
            for _ in range(ROTATIONS):
                await asyncio.sleep(0.02)
                rotate(path)
                if sighup:
                    os.kill(os.getpid(), signal.SIGHUP)
            await asyncio.sleep(0.02)
            done.set()

        await asyncio.gather(rotations(), *(agent() for _ in range(AGENTS)))

    commands = tmp_path / "commands"  # the one tool called: a reload is quick, as in production
    commands.mkdir()
    source = shipped_commands(tmp_path / "all") / "job_run_status.toml"
    (commands / source.name).write_bytes(source.read_bytes())
    runner = ScriptedRunner({JOB_COMMAND: remote})
    with_daemon(
        tmp_path, body, runner=runner, commands=commands, audit_path=path, audit_fsync="always"
    )
    failed = [a for a in answers if a["outcome"] != "success"]
    assert not failed and len(answers) >= ROTATIONS, (len(failed), len(answers))
    files = trail(path)
    records = [orjson.loads(line) for f in files for line in f.read_bytes().splitlines()]
    written = {(r["type"], r.get("request_id")) for r in records}
    for answer in answers:
        assert {("intent", answer["request_id"]), ("result", answer["request_id"])} <= written
    report = verify(files)
    assert report.ok and not report.open_intents, report.summary()


# Appends in flight while the file is rotated, each round rotating at another moment:
# before the flusher ran, while its thread syncs, after. Prints the acknowledged ids.
ROTATING_WRITER = r"""
import asyncio, sys
from pathlib import Path
from sshadapter.audit.writer import AuditLog

async def main(path):
    log = AuditLog(path, fsync="always")
    log.open()
    for round_ in range(12):
        ids = [f"req.r{round_:02d}n{n}" for n in range(4)]
        records = [{"type": "intent", "request_id": i, "tool": "t", "time": "x"} for i in ids]
        tasks = [asyncio.create_task(log.append(r)) for r in records[:3]]
        for _ in range(round_ % 4):
            await asyncio.sleep(0)
        path.rename(path.with_name(f"{path.name}.{round_ + 1}"))
        log.reopen()
        tasks.append(asyncio.create_task(log.append(records[3])))
        for i, outcome in zip(ids, await asyncio.gather(*tasks, return_exceptions=True)):
            if outcome is None:
                print(i, flush=True)
    log.close()

asyncio.run(main(Path(sys.argv[1])))
"""


def syscalls(trace: str) -> list[tuple[str, str, str, int, int]]:
    """strace -f output as (name, arguments, result, start line, end line), threads joined."""
    calls = []
    unfinished: dict[str, tuple[str, str, int]] = {}
    for number, line in enumerate(trace.splitlines()):
        pid, _, rest = line.partition(" ")
        rest = rest.strip()
        if started := re.fullmatch(r"(\w+)\((.*) <unfinished \.\.\.>", rest):
            unfinished[pid] = (started[1], started[2], number)
        elif resumed := re.fullmatch(r"<\.\.\. (\w+) resumed>(.*)\) += (.*)", rest):
            name, arguments, start = unfinished.pop(pid)
            calls.append((name, arguments + resumed[2], resumed[3], start, number))
        elif whole := re.fullmatch(r"(\w+)\((.*)\) += (.*)", rest):
            calls.append((whole[1], whole[2], whole[3], number, number))
    return calls


def test_each_acknowledged_record_was_synced_in_its_own_file(tmp_path: Path) -> None:
    """strace: every acknowledged record's fd was fsynced after its write, before its close."""
    if not shutil.which("strace"):
        if os.environ.get("CI"):
            pytest.fail("strace is missing: ./scripts/install-test-deps installs it")
        pytest.skip("strace not installed")
    path, out = tmp_path / "audit.jsonl", tmp_path / "trace"
    strace = ["strace", "-f", "-qq", "-s", "64", "-e", "trace=write,fsync,close", "-o", str(out)]
    run = subprocess.run(
        [*strace, sys.executable, "-c", ROTATING_WRITER, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    acknowledged = run.stdout.split()
    assert len(acknowledged) == 48, run.stdout  # no append failed
    calls = syscalls(out.read_text())
    assert not [c for c in calls if "EBADF" in c[2]]
    for request_id in acknowledged:
        (write,) = [c for c in calls if c[0] == "write" and f"{request_id}\\" in c[1]]
        fd = write[1].split(",")[0]
        closed = min(c[3] for c in calls if c[0] == "close" and c[1] == fd and c[3] > write[4])
        synced = [
            c
            for c in calls
            if c[0] == "fsync" and c[1] == fd and write[4] < c[3] and c[4] < closed and c[2] == "0"
        ]
        assert synced, f"{request_id} acknowledged, but fd {fd} closed without an fsync after it"


# --- records larger than any buffer (issue 27) -----------------------------------------------

# A fan-out's result of ~2 MB (about 500 bytes a host): twice the 1 MiB a start once read
# of the file's end, thirty times the chunk it reads now.
BIG_FAN_OUT_HOSTS = 4000


def rotate_gzipped(path: Path) -> None:
    """logrotate with `compress`: the file becomes audit.jsonl.1.gz."""
    import gzip

    with gzip.open(path.with_name(path.name + ".1.gz"), "wb") as rotated:
        rotated.write(path.read_bytes())
    path.unlink()


@pytest.mark.parametrize(
    "between",
    [lambda path: None, rotate, rotate_gzipped],
    ids=["restart", "rotated_then_restart", "rotated_gzipped_then_restart"],
)
def test_a_record_larger_than_any_buffer_is_followed_after_a_restart(
    tmp_path: Path, between: Callable[[Path], None]
) -> None:
    """A 2 MB fan-out result, (a rotation,) a restart, a call: verify intact, both calls shown."""
    from test_fanout import command_file, on_fleet, operator_files, run_on, scripted_fleet
    from test_integration import cli

    fanout = f"[fanout]\nmax_hosts = {BIG_FAN_OUT_HOSTS}\nconcurrency = 64"
    commands, schemas = operator_files(
        tmp_path, ("fleet_state", command_file(**{"[fanout]": fanout}))
    )
    hosts, runner = scripted_fleet(BIG_FAN_OUT_HOSTS)
    path = tmp_path / "audit.jsonl"
    ids: list[str] = []

    async def body(d: Running) -> None:
        ids.append((await d.ask(run_on("fleet")))["request_id"])

    on_fleet(tmp_path, body, runner, hosts, commands, schemas)
    assert len(path.read_bytes().splitlines()[-1]) > 1_900_000
    between(path)
    on_fleet(tmp_path, body, runner, hosts, commands, schemas)  # the daemon restarted
    verified = cli("audit", "verify", str(path))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert "chain: intact" in verified.stdout and "note" not in verified.stdout
    for request_id in ids:
        shown = cli("audit", "show", request_id, str(path))
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.count("\n    host web") == BIG_FAN_OUT_HOSTS


def test_a_broken_rotated_file_at_start_is_one_log_line_and_the_daemon_serves(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest rotated file is no gzip: one escaped error line, the chain starts again."""
    trail_dir = tmp_path / "trail\x1b[2J"
    trail_dir.mkdir(mode=0o700)
    (trail_dir / "audit.jsonl.1.gz").write_bytes(b"\x1f\x8bnot gzip at all")
    path = trail_dir / "audit.jsonl"

    async def body(d: Running) -> None:
        assert (await d.ask(CALL))["outcome"] == "success"

    with_daemon(tmp_path, body, audit_path=path)
    said = [r.getMessage() for r in caplog.records if "rotated files cannot be read" in r.message]
    assert len(said) == 1 and said[0].isprintable() and "trail\\x1b[2J" in said[0], said
    assert verify([path]).ok and path.read_bytes().startswith(b'{"type":"start"')
