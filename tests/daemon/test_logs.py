"""Log lines journald understands: `<N>` priorities on the journal stream, a level, JSON."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson
import pytest
from sshd import Sshd, running_early_disconnect, running_fault_server, running_sshd
from test_integration import ROOT, cli, notifications, write_config

from sshadapter.config import load_config
from sshadapter.daemon import logs

STOP_TIMEOUT_SECONDS: Final = 30  # the drain's default deadline: the daemon ends within it
# What a host or anyone on its path may say: a newline, then another line's priority and
# head; a CR, an ESC sequence and a bidi override for a terminal.
FORGED: Final = (
    "bye\n<0>CRITICAL sshadapter.daemon.service: forged call approved\r<2>\x1b[2J\u202eok"
)
# A line the daemon writes on the journal: its priority, the level that priority stands for.
JOURNAL_LINE: Final = re.compile(r"<([0-7])>(DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: ")


@pytest.fixture(autouse=True)
def _restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def journal_of(path: Path) -> dict[str, str]:
    info = path.stat()
    return {"JOURNAL_STREAM": f"{info.st_dev}:{info.st_ino}"}


def test_journal_stream_lines_carry_their_priority(tmp_path: Path) -> None:
    """stderr that is the journal stream: each line starts with its sd-daemon priority."""
    path = tmp_path / "stderr"
    with path.open("w") as stream:
        logs.configure("debug", "text", stream, journal_of(path))
        log = logging.getLogger("sshadapter.test")
        log.debug("d")
        log.info("i")
        log.warning("w")
        log.error("e")
        log.critical("c")
    lines = path.read_text().splitlines()
    assert [line[:3] for line in lines] == ["<7>", "<6>", "<4>", "<3>", "<2>"]
    assert lines[2] == "<4>WARNING sshadapter.test: w"


def test_no_prefix_without_the_journal_or_for_another_stream(tmp_path: Path) -> None:
    """No JOURNAL_STREAM, a malformed one, or one naming another file: plain lines."""
    path, other = tmp_path / "stderr", tmp_path / "other"
    other.write_text("")
    for environ in ({}, {"JOURNAL_STREAM": "nonsense"}, journal_of(other)):
        path.unlink(missing_ok=True)
        with path.open("w") as stream:
            logs.configure("info", "text", stream, environ)
            logging.getLogger("sshadapter.test").warning("w")
        assert path.read_text() == "WARNING sshadapter.test: w\n", environ


def test_json_format_is_one_object_per_line_with_the_request_id() -> None:
    """format = "json": time, level, logger, message, and request_id when the line has one."""
    stream = io.StringIO()
    logs.configure("warning", "json", stream, {})
    log = logging.getLogger("sshadapter.test")
    log.info("below the level")
    log.warning(
        "req.0123456789abcdef0123 refused", extra={"request_id": "req.0123456789abcdef0123"}
    )
    log.error("no id")
    first, second = (orjson.loads(line) for line in stream.getvalue().splitlines())
    assert first.keys() == {"time", "level", "logger", "message", "request_id"}
    assert first["level"] == "warning" and first["logger"] == "sshadapter.test"
    assert first["request_id"] == "req.0123456789abcdef0123"
    assert first["time"].endswith("Z")
    assert second["level"] == "error" and "request_id" not in second


def test_logging_settings_come_from_the_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[logging] level and format load; SSHADAPTER_LOGGING__LEVEL overrides; bad values named."""
    config = tmp_path / "c.toml"
    config.write_text('[logging]\nlevel = "warning"\nformat = "json"\n')
    loaded, _ = load_config(config)
    assert (loaded.logging.level, loaded.logging.format) == ("warning", "json")
    monkeypatch.setenv("SSHADAPTER_LOGGING__LEVEL", "debug")
    assert load_config(config)[0].logging.level == "debug"
    config.write_text('[logging]\nformat = "xml"\n')
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "logging.format" in done.stderr


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        yield server


def call(socket_path: Path, request: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(socket_path))
        sock.sendall(orjson.dumps(request) + b"\n")
        answer = sock.makefile("rb").readline()
    value = orjson.loads(answer)
    assert isinstance(value, dict)
    return value


@dataclass(frozen=True)
class Serving:
    """`sshadapter serve` started by ``serving_on_the_journal``."""

    socket_path: Path
    process: subprocess.Popen[bytes]
    notify: socket.socket

    def reload(self) -> None:
        """SIGHUP, and wait until the reload is done (READY=1 again)."""
        self.process.send_signal(signal.SIGHUP)
        notifications(self.notify, "READY=1")


@contextlib.contextmanager
def serving_on_the_journal(config: Path, stderr_path: Path) -> Iterator[Serving]:
    """`sshadapter serve --config CONFIG`, its stderr the file ``stderr_path`` that
    JOURNAL_STREAM names, until ready; stopped with SIGTERM at the end."""
    notify_path = stderr_path.with_name("notify")
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    with stderr_path.open("w") as stderr:
        daemon = subprocess.Popen(
            [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            env={**os.environ, "NOTIFY_SOCKET": str(notify_path), **journal_of(stderr_path)},
            stderr=stderr,
        )
    try:
        notifications(notify, "READY=1")
        yield Serving(config.with_name("sshadapter.sock"), daemon, notify)
    finally:
        notify.close()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(STOP_TIMEOUT_SECONDS)


def journal_lines(text: str, fmt: str = "text") -> list[tuple[int, str, str]]:
    """Each line of ``text`` as (priority, level, message), after checking that it starts
    with the priority of its level and that ``text`` holds no CR, ESC or bidi override."""
    assert not {"\r", "\x1b", "\u202e"} & set(text)
    found = []
    for line in text.splitlines():
        if fmt == "json":
            entry = orjson.loads(line[3:])
            head = (line[1], entry["level"].upper(), entry["message"])
        else:
            match = JOURNAL_LINE.match(line)
            assert match is not None, line
            head = (match[1], match[2], line[match.end() :])
        assert line[:1] + line[2:3] == "<>", line
        assert int(head[0]) == logs.PRIORITIES[logging.getLevelNamesMapping()[head[1]]], line
        found.append((int(head[0]), head[1], head[2]))
    return found


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_serve_under_the_journal_logs_each_refused_call_once_at_warning(
    sshd: Sshd, tmp_path: Path, fmt: str
) -> None:
    """`sshadapter serve` on the journal: each refused or failed call is one <4> line.

    Every line is prefixed; the refused call's and the failed call's lines carry their
    request id, tool and code; an accepted call writes none.
    """
    config = write_config(tmp_path, sshd)
    config.write_text(config.read_text() + f'\n[logging]\nformat = "{fmt}"\n')
    stderr_path = tmp_path / "stderr"
    with serving_on_the_journal(config, stderr_path) as serving:
        socket_path = serving.socket_path
        refused = call(socket_path, {"op": "call", "tool": "load_average", "args": {"x": 1}})
        failed = call(  # findmnt exits 1: declared NOT_FOUND
            socket_path, {"op": "call", "tool": "mount_info", "args": {"target": "/no/such/mount"}}
        )
        ok = call(socket_path, {"op": "call", "tool": "load_average", "args": {}})
    assert ok["outcome"] == "success", ok
    assert refused["outcome"] == failed["outcome"] == "failure", (refused, failed)
    lines = stderr_path.read_text().splitlines()
    assert lines and all(line[:1] == "<" and line[2:3] == ">" for line in lines), lines
    for answer, verb in ((refused, "refused"), (failed, "failed")):
        about = [line for line in lines if str(answer["request_id"]) in line]
        assert len(about) == 1, (answer, lines)
        assert about[0].startswith("<4>")
        body = about[0][3:]
        message = orjson.loads(body)["message"] if fmt == "json" else body
        assert f"{answer['tool']} {verb}: {answer['error']['code']}" in message  # type: ignore[index]
        if fmt == "json":
            assert orjson.loads(body)["request_id"] == answer["request_id"]
    assert not [line for line in lines if str(ok["request_id"]) in line]


def test_a_json_line_carries_the_tool_code_stage_and_reason_as_fields(
    sshd: Sshd, tmp_path: Path
) -> None:
    """format = "json": a failed call's line has tool, code, stage and reason as fields.

    So do a refused call's and a bad request's (no tool there), not only in the message.
    """
    config = write_config(tmp_path, sshd)
    config.write_text(config.read_text() + '\n[logging]\nformat = "json"\n')
    stderr_path = tmp_path / "stderr"
    with serving_on_the_journal(config, stderr_path) as serving:
        socket_path = serving.socket_path
        refused = call(socket_path, {"op": "call", "tool": "load_average", "args": {"x": 1}})
        failed = call(
            socket_path, {"op": "call", "tool": "mount_info", "args": {"target": "/no/such/mount"}}
        )
        unknown = call(socket_path, {"op": "call", "tool": "no_such_tool", "args": {}})
    entries = {}
    for line in stderr_path.read_text().splitlines():
        entry = orjson.loads(line[3:])
        entries[entry.get("request_id")] = entry
    fields = ("tool", "code", "stage", "reason")
    assert tuple(entries[refused["request_id"]].get(k) for k in fields) == (
        "load_average",
        "INVALID_REQUEST",
        "request",
        "bad_arguments",
    )
    assert tuple(entries[failed["request_id"]].get(k) for k in fields) == (
        "mount_info",
        "NOT_FOUND",
        "exit",
        "declared_exit_status",
    )
    assert tuple(entries[unknown["request_id"]].get(k) for k in fields) == (
        None,
        "INVALID_REQUEST",
        "request",
        "unknown_tool",
    )


def test_json_logs_name_the_drain_stopping_drained_and_stopped(sshd: Sshd, tmp_path: Path) -> None:
    """SIGTERM: the daemon's last lines say stopping, drained and stopped, with counts."""
    config = write_config(tmp_path, sshd)
    config.write_text(config.read_text() + '\n[logging]\nformat = "json"\n')
    stderr_path = tmp_path / "stderr"
    with serving_on_the_journal(config, stderr_path):
        pass
    messages = [orjson.loads(line[3:])["message"] for line in stderr_path.read_text().splitlines()]
    assert messages[-1] == "stopped"
    drain = [m for m in messages if m.startswith(("stopping:", "drained:", "stopped"))]
    assert drain == [
        "stopping: 0 calls in flight on 0 connections, drain deadline 30s",
        "drained: 0 calls ended in the drain, 0 cut",
        "stopped",
    ]


@pytest.mark.parametrize("sender", ["host", "path"])
def test_a_disconnect_reason_cannot_forge_a_journal_line(tmp_path: Path, sender: str) -> None:
    """A peer's disconnect reason is escaped in its warning: no line of another priority.

    The host sends it after key exchange, or anyone on the path before it (no host key).
    """
    with running_fault_server(tmp_path) as faults, running_early_disconnect(FORGED) as port:
        faults.disconnect_reason = FORGED
        config = write_config(tmp_path, faults)
        if sender == "path":  # local (load_average's host): the server without a host key
            text = config.read_text().replace(f"port = {faults.port}\n", f"port = {port}\n")
            config.write_text(text)
        stderr_path = tmp_path / "stderr"
        with serving_on_the_journal(config, stderr_path) as serving:
            load_average: dict[str, object] = {"op": "call", "tool": "load_average", "args": {}}
            answer = call(serving.socket_path, load_average)
    assert answer["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": True}, answer
    said = [line for line in journal_lines(stderr_path.read_text()) if "forged" in line[2]]
    assert said and all(line[:2] == (4, "WARNING") for line in said), said
    escaped = "bye\\n<0>CRITICAL sshadapter.daemon.service: forged call approved\\r<2>\\x1b[2J"
    assert escaped in said[0][2]
    assert cli("audit", "verify", str(tmp_path / "audit.jsonl")).returncode == 0


def test_serves_first_error_under_systemd_is_one_line_at_error_priority(tmp_path: Path) -> None:
    """A bad configuration under systemd: one `<3>` line, the key's newline and ESC escaped."""
    config, stderr_path = tmp_path / "c.toml", tmp_path / "stderr"
    config.write_text('[server]\n"max\\n<0>CRITICAL forged\\u001b[2J" = 1\n')
    with stderr_path.open("w") as stderr:
        done = subprocess.run(
            [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
            env={**os.environ, **journal_of(stderr_path)},
            stderr=stderr,
            timeout=60,
        )
    assert done.returncode == 2
    (line,) = stderr_path.read_text().splitlines()
    assert line.startswith(f"<3>sshadapter: {config}: ") and "unknown key" in line, line
    assert "max\\n<0>CRITICAL forged\\x1b[2J" in line, line


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_refused_reload_naming_a_hostile_key_is_one_escaped_error_line(
    tmp_path: Path, fmt: str
) -> None:
    """A reload refused for a key holding a newline, a priority and ESC: one escaped `<3>` line.

    The key is escaped by the formatter, which escapes every record of every logger.
    """
    with running_fault_server(tmp_path) as faults:
        config = write_config(tmp_path, faults)
        config.write_text(config.read_text() + f'\n[logging]\nformat = "{fmt}"\n')
        stderr_path = tmp_path / "stderr"
        with serving_on_the_journal(config, stderr_path) as serving:
            commands = tmp_path / "commands"
            key = orjson.dumps(FORGED).decode()  # a TOML string too: "\\n", "\\u001b"
            operation = (commands / "load_average.toml").read_text()
            (commands / "hostile.toml").write_text(f"{key} = 1\n{operation}")
            serving.reload()
    lines = journal_lines(stderr_path.read_text(), fmt)
    (refused,) = [line for line in lines if "reload refused" in line[2]]
    assert refused[:2] == (3, "ERROR") and refused[2].startswith("reload refused"), refused
    assert "forged call approved\\r<2>\\x1b[2J\\u202eok" in refused[2], refused
