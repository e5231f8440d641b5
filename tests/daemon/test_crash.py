"""SIGKILL in the middle of a load: nothing answered is lost, and verify names what died."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sshd import Sshd, running_sshd
from test_integration import ROOT, notifications, write_config

CLIENTS = 8  # concurrent callers: at most this many calls can be in flight at the kill
LOAD_SECONDS = 1.5


@pytest.fixture(scope="module")
def sshd() -> Iterator[Sshd]:
    with running_sshd() as server:
        yield server


def start_daemon(config: Path, notify_path: Path) -> subprocess.Popen[bytes]:
    import socket

    notify_path.unlink(missing_ok=True)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(notify_path))
    daemon = subprocess.Popen(
        [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        env={**os.environ, "NOTIFY_SOCKET": str(notify_path)},
        stderr=subprocess.DEVNULL,
    )
    try:
        notifications(notify, "READY=1")
    finally:
        notify.close()
    return daemon


async def load(socket_path: Path, answered: list[str], stop: asyncio.Event) -> None:
    """One agent calling in a loop until the daemon dies under it."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
    except (ConnectionError, OSError):
        return
    try:
        while not stop.is_set():
            writer.write(b'{"op":"call","tool":"load_average","args":{}}\n')
            line = await reader.readline()
            if not line:
                return
            answered.append(orjson.loads(line)["request_id"])
    except (ConnectionError, OSError):
        return
    finally:
        writer.close()


def test_sigkill_loses_no_answered_call_and_verify_names_the_dead(
    sshd: Sshd, tmp_path: Path
) -> None:
    """Every answered call has intent and result; verify lists exactly the intents left open."""
    config = write_config(tmp_path, sshd)
    socket_path = tmp_path / "sshadapter.sock"
    daemon = start_daemon(config, tmp_path / "notify")
    answered: list[str] = []

    async def main() -> None:
        stop = asyncio.Event()
        workers = [asyncio.create_task(load(socket_path, answered, stop)) for _ in range(CLIENTS)]
        await asyncio.sleep(LOAD_SECONDS)
        daemon.send_signal(signal.SIGKILL)
        await asyncio.wait_for(asyncio.gather(*workers), 30)
        stop.set()

    try:
        asyncio.run(main())
        daemon.wait(10)
        assert len(answered) > 20, "the load did not get going"
        restarted = start_daemon(config, tmp_path / "notify")  # replaces the stale socket
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(30) == 0
    finally:
        for process in (daemon,):
            if process.poll() is None:
                process.kill()

    audit = tmp_path / "audit.jsonl"
    # SIGKILL can cut the write of a record short (the kernel stops copying at a fatal
    # signal): the restart ends that torn line, and verify reports it, not as a record.
    records, torn = [], []
    for line in audit.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            torn.append(line)
    assert len(torn) <= 1
    intents = {r["request_id"] for r in records if r["type"] == "intent"}
    results = {r["request_id"] for r in records if r["type"] == "result"}
    assert set(answered) <= intents & results  # nothing that reached an agent is unaudited
    died = intents - results
    assert len(died) <= CLIENTS and not died & set(answered)

    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "audit", "verify", str(audit)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "chain: intact" in done.stdout
    assert ("torn write" in done.stdout) == bool(torn)
    assert f"intents without a result: {len(died)}" in done.stdout
    reported = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("  req.")}
    assert reported == died
    assert [r["type"] for r in records].count("start") == 2
