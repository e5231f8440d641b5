"""What `sshadapter mcp` costs: per call against the daemon's socket directly, start-up, RSS.

Run: ``python tests/bench/bench_mcp.py`` (about 20 s; ``--quick`` about 5 s).
A benchmark, not a test: it always exits 0 and prints PASS/MISS per target.

The daemon runs as a subprocess with the shipped commands and a scripted runner
that answers ``load_average`` at once (no SSH: what is measured is the bridge,
not the network; the real path is in bench_ssh.py). Interleaved round by round,
in a shuffled order, one call at a time:

  socket, kept      one Unix-socket connection kept open, one `call` line per call
                    (an agent's own client: the floor)
  socket, per call  a new connection per call (what the bridge does)
  mcp               a JSON-RPC tools/call line to one long-lived `sshadapter mcp`
                    over its stdin, the result line read back from its stdout

Latency per call in this process (perf_counter_ns), from the write to the whole
answer. Start-up: spawn `sshadapter mcp`, write initialize, notifications/initialized
and tools/list at once, time the tools/list answer; repeated, the median shown
beside `python -c pass` for scale. RSS: the bridge's VmHWM after the call rounds.
Targets (issue #11): at most 0.3 ms added at p50, start-up under 300 ms, RSS under 40 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout

TARGET_ADDED_US = 300.0
TARGET_STARTUP_MS = 300.0
TARGET_RSS_MB = 40.0
LOADAVG = b"0.52 0.58 0.59 1/467 12345\n"
CALL = {"op": "call", "tool": "load_average", "args": {}}


def serve_scripted(workdir: Path) -> None:
    """The daemon, in this process: shipped commands, load_average answered by a script."""
    from sshadapter.audit.writer import AuditLog
    from sshadapter.config import AuditSection, Config, PathsSection, ServerSection
    from sshadapter.contract.registry import load_registry
    from sshadapter.daemon.server import Daemon
    from sshadapter.daemon.service import Service
    from sshadapter.daemon.unix_socket import bind_socket
    from sshadapter.runners.interface import RunResult
    from sshadapter.runners.scripted import ScriptedRunner
    from sshadapter.sections import Allow

    config = Config(
        server=ServerSection(
            socket_path=workdir / "sshadapter.sock", allow=Allow(uids=(os.getuid(),))
        ),
        paths=PathsSection(commands=ROOT / "commands", schemas=ROOT / "schemas"),
        audit=AuditSection(path=workdir / "audit.jsonl", fsync="never"),
    )
    registry = load_registry(config.paths.commands, config.paths.schemas, hosts=None)
    audit = AuditLog(config.audit.path, fsync="never")
    audit.open()
    runner = ScriptedRunner({"cat /proc/loadavg": RunResult(LOADAVG, b"", 0)})
    service = Service(registry, runner, audit, config.server)
    daemon = Daemon(config, service, runner, audit)
    asyncio.run(daemon.serve(bind_socket(config.server.socket_path, 0o600, "")))


def start_daemon(workdir: Path) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, __file__, "--serve-scripted", str(workdir)],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    path = workdir / "sshadapter.sock"
    deadline = time.monotonic() + 30
    while True:
        try:
            ask_new(path)
            return process
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read_line(sock: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def ask_new(path: Path) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(path))
        sock.sendall(json.dumps(CALL).encode() + b"\n")
        return read_line(sock)


class Bridge:
    """`sshadapter mcp` with raw pipes: one line out, one line back."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sshadapter.cli", "mcp", "--socket", str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
        )
        assert self.process.stdin is not None and self.process.stdout is not None
        self.stdin, self.stdout = self.process.stdin.fileno(), self.process.stdout.fileno()
        self.buffer = b""
        self.next_id = 0

    def send(self, method: str, params: dict[str, Any] | None = None, notify: bool = False) -> int:
        self.next_id += 1
        message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if not notify:
            message["id"] = self.next_id
        if params is not None:
            message["params"] = params
        os.write(self.stdin, json.dumps(message).encode() + b"\n")
        return self.next_id

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            select.select([self.stdout], [], [], 30)
            chunk = os.read(self.stdout, 1 << 20)
            if not chunk:
                raise ConnectionError("the bridge closed stdout")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def initialize(self) -> None:
        self.send("initialize", {"protocolVersion": "2025-11-25", "capabilities": {}})
        self.send("notifications/initialized", notify=True)

    def call(self) -> bytes:
        self.send("tools/call", {"name": "load_average", "arguments": {}})
        return self.line()

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM"))
        return kb / 1024

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()  # end of input: the bridge exits
        self.process.wait(30)
        assert self.process.stdout is not None
        self.process.stdout.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_startup(path: Path, runs: int) -> tuple[list[float], list[float]]:
    bridge_ms, python_ms = [], []
    for _ in range(runs):
        started = time.perf_counter_ns()
        bridge = Bridge(path)
        bridge.initialize()
        listed = bridge.send("tools/list")
        while json.loads(bridge.line()).get("id") != listed:
            pass
        bridge_ms.append((time.perf_counter_ns() - started) / 1e6)
        bridge.close()
        started = time.perf_counter_ns()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        python_ms.append((time.perf_counter_ns() - started) / 1e6)
    return bridge_ms, python_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve-scripted", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_scripted:
        serve_scripted(args.serve_scripted)
        return 0
    rounds, per_round, startups = (5, 200, 10) if args.quick else (30, 500, 30)
    with tempfile.TemporaryDirectory(prefix="sshadapter-bench-mcp-") as tmp:
        workdir = Path(tmp)
        daemon = start_daemon(workdir)
        path = workdir / "sshadapter.sock"
        try:
            kept = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            kept.connect(str(path))

            def via_kept() -> bytes:
                kept.sendall(json.dumps(CALL).encode() + b"\n")
                return read_line(kept)

            bridge = Bridge(path)
            bridge.initialize()
            methods: dict[str, Callable[[], bytes]] = {
                "socket, kept": via_kept,
                "socket, per call": lambda: ask_new(path),
                "mcp": bridge.call,
            }
            samples: dict[str, list[float]] = {name: [] for name in methods}
            for name, method in methods.items():  # warm up: imports, first connection
                for _ in range(50):
                    assert b"success" in method(), name
            for _ in range(rounds):
                order = list(methods)
                random.shuffle(order)
                for name in order:
                    method = methods[name]
                    for _ in range(per_round):
                        started = time.perf_counter_ns()
                        answer = method()
                        samples[name].append((time.perf_counter_ns() - started) / 1e3)
                        assert b"success" in answer, answer
            rss = bridge.peak_rss_mb()
            bridge.close()
            kept.close()
            bridge_ms, python_ms = measure_startup(path, startups)
        finally:
            daemon.terminate()
            daemon.wait(30)

    print(
        f"sshadapter mcp, {rounds} rounds x {per_round} calls per method, one at a time; "
        f"Python {platform.python_version()}, {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    print(f"  {'method':<18}{'p50 µs':>10}{'p90 µs':>10}{'p99 µs':>10}")
    for name, values in samples.items():
        print(
            f"  {name:<18}{percentile(values, 0.5):>10.0f}{percentile(values, 0.9):>10.0f}"
            f"{percentile(values, 0.99):>10.0f}"
        )
    floor = percentile(samples["socket, kept"], 0.5)
    per_call = percentile(samples["socket, per call"], 0.5)
    mcp = percentile(samples["mcp"], 0.5)
    added = mcp - floor
    startup, python = statistics.median(bridge_ms), statistics.median(python_ms)
    print(f"  mcp / socket kept at p50: {mcp / floor:.2f}x, {added:+.0f} µs")
    print(f"  mcp / socket per call at p50: {mcp / per_call:.2f}x, {mcp - per_call:+.0f} µs")
    print(
        f"  start-up to the first tools/list answer: median {startup:.0f} ms "
        f"(min {min(bridge_ms):.0f}, max {max(bridge_ms):.0f}; `python -c pass` {python:.0f} ms)"
    )
    print(f"  bridge peak RSS after {sum(len(v) for v in samples.values())} calls: {rss:.1f} MB")
    print()
    targets = [
        (added <= TARGET_ADDED_US, f"added at p50 <= {TARGET_ADDED_US:.0f} µs", f"{added:.0f} µs"),
        (
            startup < TARGET_STARTUP_MS,
            f"start-up < {TARGET_STARTUP_MS:.0f} ms",
            f"{startup:.0f} ms",
        ),
        (rss < TARGET_RSS_MB, f"peak RSS < {TARGET_RSS_MB:.0f} MB", f"{rss:.1f} MB"),
    ]
    for ok, what, measured in targets:
        print(f"  {'PASS' if ok else 'MISS'}  {what:<28} measured {measured}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
