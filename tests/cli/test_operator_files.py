"""Operator files and configuration: every mistake is one line naming the file and key.

Through the real CLI (`sshadapter check`, `sshadapter serve` processes): a FIFO,
a device or an oversize file where a file is read is refused at once (never a
hang, never a read until memory runs out); a configuration `check` accepts is
one `serve` starts with, and every mistake in it, in the file or in an
environment variable, is one line with the file (or variable), the key and the
reason, exit status 2, no traceback.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import serve_config

from sshadapter.config import MAX_CONFIG_BYTES
from sshadapter.contract.commandfile import MAX_COMMAND_FILE_BYTES
from sshadapter.contract.schemas import MAX_SCHEMA_BYTES

REPO = Path(__file__).resolve().parents[2]
# `check` of a directory with a FIFO answers in about a second; a blocked one never does.
PROMPT_SECONDS = 20.0
# Memory a CLI process may take: a read of /dev/zero without a bound dies on it (MemoryError)
# instead of taking the shared machine's memory.
CLI_MEMORY_BYTES = 2 * 1024 * 1024 * 1024
START_SECONDS = 20.0  # the daemon imports asyncssh and pydantic, then sends READY=1
RELOAD_SECONDS = 10.0  # a reload of the shipped commands takes well under a second


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CLI_MEMORY_BYTES, CLI_MEMORY_BYTES))


def run_cli(
    *args: str, cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SSHADAPTER_")}
    return subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", *args],
        cwd=cwd,
        env={**clean, "PYTHONPATH": str(REPO), **(env or {})},
        capture_output=True,
        text=True,
        timeout=PROMPT_SECONDS,
        check=False,
        preexec_fn=_limit_memory,
    )


def one_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a refused command (exit 2, no traceback; `serve` logs beside it)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("sshadapter: ")]
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.fixture
def examples(tmp_path: Path) -> Path:
    """A private copy of the shipped commands/ and schemas/."""
    for name in ("commands", "schemas"):
        shutil.copytree(REPO / name, tmp_path / name)
    return tmp_path


def _fixture_stdout(root: Path) -> Path:
    return root / "commands" / "disk_usage.fixtures" / "root.stdout"


SPECIAL_PLACES = {
    "command": lambda root: root / "commands" / "x_fifo.toml",
    "schema": lambda root: root / "schemas" / "x_fifo.json",
    "fixture": _fixture_stdout,
}


@pytest.mark.parametrize("place", sorted(SPECIAL_PLACES))
def test_check_refuses_a_fifo_at_once(examples: Path, place: str) -> None:
    """A FIFO as a command file, schema or fixture: `check` answers promptly, one line."""
    path = SPECIAL_PLACES[place](examples)
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    line = one_error(run_cli("check", cwd=examples))
    assert line == f"sshadapter: {path}: not a regular file (a FIFO)"


@pytest.mark.parametrize("place", sorted(SPECIAL_PLACES))
def test_check_refuses_a_symlink_to_dev_zero(examples: Path, place: str) -> None:
    """A symlink to /dev/zero is refused before a byte is read, not read until MemoryError."""
    path = SPECIAL_PLACES[place](examples)
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")
    line = one_error(run_cli("check", cwd=examples))
    assert line == f"sshadapter: {path}: not a regular file (a character device)"


@pytest.mark.parametrize(
    ("name", "bound"),
    [("commands/x_big.toml", MAX_COMMAND_FILE_BYTES), ("schemas/x_big.json", MAX_SCHEMA_BYTES)],
)
def test_check_refuses_an_oversize_file(examples: Path, name: str, bound: int) -> None:
    """A file one byte over its bound: refused by name, with the bound."""
    path = examples / name
    path.write_bytes(b" " * (bound + 1))
    line = one_error(run_cli("check", cwd=examples))
    assert line == f"sshadapter: {path}: larger than {bound} bytes"


@pytest.mark.parametrize("kind", ["fifo", "dev_zero", "oversize", "directory"])
def test_a_config_file_that_is_no_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    """--config naming a FIFO, /dev/zero, a huge file or a directory: one line, at once."""
    config = tmp_path / "config.toml"
    if kind == "fifo":
        os.mkfifo(config)
    elif kind == "dev_zero":
        config.symlink_to("/dev/zero")
    elif kind == "oversize":
        config.write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    else:
        config.mkdir()
    line = one_error(run_cli("check", "--config", str(config), cwd=tmp_path))
    assert line.startswith(f"sshadapter: {config}: ")
    assert ("not a regular file" in line) or ("larger than" in line)


# --- configuration mistakes: `check` and `serve` refuse the same ones, the same way ---

CONFIG_MISTAKES = {
    # name: (file text appended to a valid config, environment, "file" named, key)
    "not_utf8": (b'[metrics]\nlisten = "caf\xe9"\n', {}, "", ""),
    "listen_no_port": (b'[metrics]\nlisten = "127.0.0.1"\n', {}, "", "metrics.listen"),
    "listen_port_too_big": (b'[metrics]\nlisten = "[::1]:70000"\n', {}, "", "metrics.listen"),
    "listen_port_zero": (b'[metrics]\nlisten = "localhost:0"\n', {}, "", "metrics.listen"),
    "timeout_inf": (b"", {"SSHADAPTER_SERVER__DRAIN_TIMEOUT_SECONDS": "inf"}, "$", "server."),
    "env_table_not_json": (
        b"",
        {"SSHADAPTER_SERVER__ALLOW": "{uids:[0]}"},
        "$SSHADAPTER_SERVER__ALLOW",
        "server.allow",
    ),
    "env_list_not_json": (
        b"",
        {"SSHADAPTER_SERVER__ALLOW__GROUPS": "wheel"},
        "$SSHADAPTER_SERVER__ALLOW__GROUPS",
        "server.allow.groups",
    ),
    "env_bad_value": (
        b"",
        {"SSHADAPTER_SERVER__MAX_QUEUE": "-1"},
        "$SSHADAPTER_SERVER__MAX_QUEUE",
        "server.max_queue",
    ),
    "env_unknown_key": (
        b"",
        {"SSHADAPTER_HOSTS__LOCAL__PORTT": "22"},
        "$SSHADAPTER_HOSTS__LOCAL__PORTT",
        "hosts.local.portt",
    ),
}


@pytest.mark.parametrize("command", ["check", "serve"])
@pytest.mark.parametrize("mistake", sorted(CONFIG_MISTAKES))
def test_check_and_serve_refuse_the_same_config_mistake(
    tmp_path: Path, command: str, mistake: str
) -> None:
    """One line naming the file (or variable), the key and the reason; exit 2, no traceback."""
    extra, env, named, key = CONFIG_MISTAKES[mistake]
    config = serve_config(tmp_path)
    config.write_bytes(config.read_bytes().replace(b"[audit]", extra + b"[audit]", 1))
    line = one_error(run_cli(command, "--config", str(config), cwd=tmp_path, env=env))
    file = named or str(config)
    assert line.startswith(f"sshadapter: {file}"), line
    if key:
        assert f": {key}" in line, line
    assert not line.endswith(": "), line


def test_serve_names_the_config_file_when_the_metrics_port_is_taken(tmp_path: Path) -> None:
    """A port in use: the config file, metrics.listen and the address, in one line."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = serve_config(tmp_path)
        text = config.read_text().replace(
            "[audit]", f'[metrics]\nlisten = "127.0.0.1:{port}"\n[audit]'
        )
        config.write_text(text)
        line = one_error(run_cli("serve", "--config", str(config), cwd=tmp_path))
    assert line.startswith(
        f"sshadapter: {config}: metrics.listen: cannot listen on 127.0.0.1:{port}"
    )


# --- load errors name the file they came from ---

REMOTE_REF = (
    '{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",'
    ' "properties": {"x": {"$ref": "https://example.com/x.json"}},'
    ' "additionalProperties": false}'
)
MISSING_REF = REMOTE_REF.replace("https://example.com/x.json", "absent.v1.json#/$defs/x")


@pytest.mark.parametrize(
    ("name", "text"), [("remote_ref.v1.json", REMOTE_REF), ("missing_ref.v1.json", MISSING_REF)]
)
def test_a_schema_ref_error_names_its_file_and_pointer(
    examples: Path, name: str, text: str
) -> None:
    """A `$ref` to a remote URL or a missing file names the schema file, not the directory."""
    path = examples / "schemas" / name
    path.write_text(text)
    line = one_error(run_cli("check", cwd=examples))
    assert line.startswith(f"sshadapter: {path}: /properties/x/$ref: "), line


def test_an_unknown_socket_group_names_the_socket_and_the_key(tmp_path: Path) -> None:
    """`serve` with a socket_group that does not exist: the socket file and the key, not ``: :``."""
    sock = tmp_path / "run" / "sshadapter.sock"
    config = serve_config(tmp_path, socket=sock)
    config.write_text(
        config.read_text().replace("[server]\n", '[server]\nsocket_group = "no-such-group-x"\n')
    )
    line = one_error(run_cli("serve", "--config", str(config), cwd=tmp_path))
    assert line.startswith(f"sshadapter: {sock}: server.socket_group: no group 'no-such-group-x'")


# --- a FIFO dropped into commands/ or schemas/ while the daemon runs ---


@pytest.fixture
def daemon(examples: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, socket.socket]]:
    """`sshadapter serve` on a copy of the shipped commands, with its notify socket."""
    config = serve_config(
        examples, socket=examples / "d.sock", audit=examples / "log" / "audit.jsonl"
    )
    config.write_text(
        config.read_text()
        .replace("[server]\n", f"[server]\nallow = {{ uids = [{os.getuid()}] }}\n")
        .replace(str(REPO / "commands"), str(examples / "commands"))
        .replace(str(REPO / "schemas"), str(examples / "schemas"))
    )
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(examples / "notify"))
    notify.settimeout(START_SECONDS)
    log = (examples / "daemon.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
        cwd=examples,
        env={**os.environ, "PYTHONPATH": str(REPO), "NOTIFY_SOCKET": str(examples / "notify")},
        stdout=log,
        stderr=log,
    )
    try:
        _wait_for(notify, b"READY=1", START_SECONDS)
        yield process, examples, notify
    finally:
        process.kill()
        process.wait()
        log.close()
        notify.close()


def _wait_for(notify: socket.socket, message: bytes, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        notify.settimeout(max(0.01, deadline - time.monotonic()))
        if message in notify.recv(4096):  # socket.timeout (TimeoutError) past the deadline
            return


def _list_tools(sock: Path) -> list[str]:
    done = run_cli("list", "--socket", str(sock))
    assert done.returncode == 0, done.stderr
    import json

    return sorted(tool["name"] for tool in json.loads(done.stdout)["tools"])


@pytest.mark.parametrize("place", ["command", "schema"])
def test_a_fifo_and_sighup_leave_the_daemon_answering(
    daemon: tuple[subprocess.Popen[bytes], Path, socket.socket], place: str
) -> None:
    """mkfifo in commands/ or schemas/ and SIGHUP: the reload is refused (logged), calls go on."""
    process, root, notify = daemon
    sock = root / "d.sock"
    before = _list_tools(sock)
    fifo = SPECIAL_PLACES[place](root)
    os.mkfifo(fifo)
    process.send_signal(signal.SIGHUP)
    _wait_for(notify, b"READY=1", RELOAD_SECONDS)  # the reload ended: it did not block
    assert before and _list_tools(sock) == before
    log = (root / "daemon.log").read_text()
    refused = [line for line in log.splitlines() if "reload refused, keeping" in line]
    assert len(refused) == 1 and refused[0].endswith(f" tools: {fifo}: not a regular file (a FIFO)")
