"""`sshadapter serve` and `sshadapter call` as an operator runs them, against a real sshd."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sshd import FaultServer, Sshd, running_sshd

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_SECONDS = 20.0


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        yield server


def write_config(directory: Path, sshd: Sshd | FaultServer, *, metrics_port: int = 0) -> Path:
    """A config.example.toml-style file: both example host aliases point at the test sshd
    (or at an asyncssh fault server)."""
    shutil.copytree(ROOT / "commands", directory / "commands")
    shutil.copytree(ROOT / "schemas", directory / "schemas")
    hosts = sshd.host_toml("ci", "local")
    metrics = f'listen = "127.0.0.1:{metrics_port}"' if metrics_port else 'listen = ""'
    config = directory / "config.toml"
    config.write_text(f"""\
[server]
socket_path = "{directory / "sshadapter.sock"}"
socket_mode = "0660"
allow = {{ uids = [{os.getuid()}] }}

[paths]
commands = "commands"
schemas = "schemas"

[audit]
path = "{directory / "audit.jsonl"}"
fsync = "always"
quarantine_dir = "{directory / "quarantine"}"

[metrics]
{metrics}

{hosts}""")
    return config


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def notifications(sock: socket.socket, until: str) -> list[str]:
    """sd_notify messages received up to and including ``until``."""
    seen: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while until not in seen:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            seen.append(sock.recv(4096).decode())
        except TimeoutError:
            raise AssertionError(f"no {until} from the daemon; got {seen}") from None
    return seen


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_serve_and_call_round_trip_through_sshd(sshd: Sshd, tmp_path: Path) -> None:
    """serve with a file config, call real commands over sshd, reload, stop: the operator's path."""
    metrics_port = free_port()
    config = write_config(tmp_path, sshd, metrics_port=metrics_port)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    env = {**os.environ, "NOTIFY_SOCKET": str(tmp_path / "notify")}
    log = (tmp_path / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        env=env,
        stderr=log,
    )
    sock = str(tmp_path / "sshadapter.sock")
    try:
        assert "READY=1" in notifications(notify, "READY=1")
        assert oct(os.stat(sock).st_mode & 0o777) == "0o660"

        done = cli("call", "load_average", "--socket", sock)
        assert done.returncode == 0, done.stdout + done.stderr
        envelope = json.loads(done.stdout)
        assert envelope["outcome"] == "success"
        assert set(envelope["data"]) == {"load1", "load5", "load15", "running", "total"}

        done = cli("call", "disk_usage", "path=/", "--socket", sock)
        assert done.returncode == 0 and json.loads(done.stdout)["data"]["mounted_on"] == "/"

        done = cli("call", "disk_usage", "path=../etc", "--socket", sock)
        assert done.returncode == 1
        assert json.loads(done.stdout)["error"] == {
            "code": "INVALID_REQUEST",
            "retryable": False,
            "hint": {"parameter": "path", "rule": "pattern"},
        }

        # job_run_status allows the group "sshadapter-agents" only, which this caller is not in.
        done = cli("call", "job_run_status", "project_id=bluebird", "--socket", sock)
        assert done.returncode == 1
        assert json.loads(done.stdout)["error"]["code"] == "DENIED"

        done = cli("call", "mount_info", "target=/no/such/mount", "--socket", sock)
        assert done.returncode == 1  # findmnt exits 1: declared NOT_FOUND
        assert json.loads(done.stdout)["error"] == {"code": "NOT_FOUND", "retryable": False}

        done = cli("list", "--socket", sock)
        assert done.returncode == 0
        names = {tool["name"] for tool in json.loads(done.stdout)["tools"]}
        assert {"load_average", "disk_usage", "mount_info"} <= names
        assert "job_run_status" not in names  # allowed for group "sshadapter-agents" only

        scrape = subprocess.run(
            [
                "python3",
                "-c",
                "import urllib.request,sys;sys.stdout.write("
                f"urllib.request.urlopen('http://127.0.0.1:{metrics_port}/metrics')"
                ".read().decode())",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert (
            'sshadapter_calls_total{code="none",outcome="success",tool="load_average"} 1.0'
            in scrape.stdout
        )
        assert 'sshadapter_ssh_connections{host="local"}' in scrape.stdout

        daemon.send_signal(signal.SIGHUP)
        assert notifications(notify, "READY=1")[0] == "RELOADING=1"

        daemon.send_signal(signal.SIGTERM)
        assert "STOPPING=1" in notifications(notify, "STOPPING=1")
        assert daemon.wait(30) == 0
        assert not os.path.exists(sock)
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()
        notify.close()
        log.close()
    records = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    results = [r for r in records if r["type"] == "result"]
    assert [r["tool"] for r in results] == [
        "load_average",
        "disk_usage",
        "disk_usage",
        "job_run_status",
        "mount_info",
    ]
    assert results[0]["command"] == "cat /proc/loadavg"
    assert (results[3]["stage"], results[3]["attempts"]) == ("authorize", [])
    assert results[4]["stage"] == "exit" and results[4]["attempts"][0]["exit_status"] == 1


def test_serve_uses_a_socket_passed_by_systemd(sshd: Sshd, tmp_path: Path) -> None:
    """Socket activation: a listening socket on fd 3 with LISTEN_FDS=1 is served, not re-bound."""
    config = write_config(tmp_path, sshd)
    path = tmp_path / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen()
    fd = listener.fileno()
    # What systemd does: the socket as fd 3, LISTEN_FDS=1, LISTEN_PID=the service's own pid.
    daemon = subprocess.Popen(
        [
            "bash",
            "-c",
            f'export LISTEN_FDS=1 LISTEN_PID=$$; exec "$@" 3<&{fd} {fd}<&-',
            "sh",
            sys.executable,
            "-m",
            "sshadapter.cli",
            "serve",
            "--config",
            str(config),
        ],
        cwd=ROOT,
        pass_fds=(fd,),
        stderr=subprocess.DEVNULL,
    )
    listener.close()
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while True:
            done = cli("call", "load_average", "--socket", str(path))
            if done.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert done.returncode == 0, done.stdout + done.stderr
        assert not (tmp_path / "sshadapter.sock").exists()  # the configured path was not bound
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
        assert path.exists()  # the socket belongs to systemd: the daemon leaves it
    finally:
        if daemon.poll() is None:
            daemon.kill()
        daemon.wait()


def test_serve_refuses_a_bad_config_in_one_line(tmp_path: Path) -> None:
    """A config error is one line naming file and key, exit status 2, no traceback."""
    config = tmp_path / "config.toml"
    config.write_text("[server]\nmax_requests = 1\n")
    done = cli("serve", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.strip() == f"sshadapter: {config}: server.max_requests: unknown key"
