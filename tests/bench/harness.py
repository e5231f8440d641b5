"""What the SSH benchmarks share: the sshd, the operations, daemon processes, clients, meters.

The daemon is driven only through its public surfaces, so the benchmarks keep
working while its internals change: ``sshadapter serve --config`` in a
subprocess (started through ``daemon_patches.SERVE``, which adds opt-in
instrumentation of the *stdlib* event loop, never of the package), and the
agent socket protocol (one JSON line in, one JSON line out). The SSH server is
the real OpenSSH sshd of ``tests/support/sshd.py``.

``bench_env()`` sets all of it up and takes all of it down again: the daemons
get SIGTERM (and are reaped; so are any processes they left behind), the sshd
stops, the temporary directory is removed, whether the run ends normally, by
an exception, by Ctrl-C or by SIGTERM. A daemon also dies with this process
(PR_SET_PDEATHSIG), so even a SIGKILLed benchmark leaves no daemon behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import platform
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout
# The tests' helpers (tests/support/) and parts, whose test files some benchmarks reuse.
sys.path[:0] = sorted(str(p) for p in (ROOT / "tests").iterdir() if any(p.glob("*_*.py")))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import asyncssh  # noqa: E402
import orjson  # noqa: E402
from daemon_patches import LOOP_DUMP_SIGNAL, LOOP_START_SIGNAL, PATCHES, SERVE  # noqa: E402
from sshd import Sshd, running_sshd  # noqa: E402

from sshadapter.contract.registry import Registry, load_registry  # noqa: E402

# The daemon's limits, written into its config, mirrored by the raw asyncssh pool. Pool
# capacity 6 x 6 = 36 channels is above max_concurrent_calls, so the pool never holds calls
# the daemon admitted; 32 running + 64 queued is above every load here: no OVERLOADED.
POOL_CONNECTIONS: Final = 6  # the config default (hosts.*.max_connections)
CHANNELS_PER_CONNECTION: Final = 6  # the config default, below sshd's MaxSessions 10
MAX_CONCURRENT_CALLS: Final = 32  # the config default
MAX_QUEUE: Final = 64  # the config default
CIPHERS: Final = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"  # what the daemon negotiates
BIG_BYTES: Final = 1024 * 1024  # bench_big's output, exactly its max_bytes
HUGE_BYTES: Final = 8_400_000  # bench_huge's output: issue 9 defect 6's 8.4 MB pulls
HUGE_MAX_BYTES: Final = 9 * 1024 * 1024  # bench_huge's max_bytes: the output is within it
RESPONSE_LIMIT_BYTES: Final = 32 * 1024 * 1024  # agent-side line limit: above any response
OPEN_ATTEMPTS: Final = 3  # raw pool: sshd frees sessions late, retry a refused open (as the daemon)
OPEN_BACKOFF_SECONDS: Final = 0.05  # doubled per try, as the daemon's runner
CALL_TIMEOUT_SECONDS: Final = 120.0  # per call in the driver: a hang is a failure, not a stuck run
READY_TIMEOUT_SECONDS: Final = 120.0  # a daemon imports ~65 MB of modules; a loaded box is slow
STOP_TIMEOUT_SECONDS: Final = 30.0  # SIGTERM drains in-flight calls; then SIGKILL
LOOP_DUMP_TIMEOUT_SECONDS: Final = 30.0
LEFTOVER_GRACE_SECONDS: Final = 3.0  # a daemon's own children may exit just after it
IDS: Final = [f"bench-{i:04d}" for i in range(1000)]  # project ids cycled through by every caller
FSYNC_MODES: Final = ("never", "batch", "always")

STATUS_TOML: Final = """\
description = "Benchmark: a small JSON status document for one project."
version = 1
host = "bench"
argv = ["printf", '{{"project_id":"%s","state":"ok","n":%s}}\\n', "{project_id}", "1"]
timeout_seconds = 30.0
idempotent = true

[params.project_id]
type = "string"
pattern = '^[a-z0-9][a-z0-9-]{2,62}$'
maxLength = 63

[output]
format = "json"
schema = "bench_status.v1.json"
max_bytes = 4096
max_depth = 4

[checks]
equal = { project_id = "project_id" }

[agent]
fields = ["project_id", "state", "n"]
"""

# bench_big (1 MiB) and bench_huge (8.4 MB): the same rows document, cat'ed from a file.
ROWS_TOML: Final = """\
description = "Benchmark: a JSON document of rows, {size} bytes."
version = 1
host = "bench"
argv = ["cat", "{path}"]
timeout_seconds = 120.0
idempotent = true

[output]
format = "json"
schema = "bench_rows_doc.v1.json"
max_bytes = {max_bytes}
max_depth = 4

[agent]
fields = ["pad", "rows"]
"""

SCHEMA_ID: Final = "https://sshadapter.invalid/schemas/"
STATUS_SCHEMA: Final = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID + "bench_status.v1.json",
    "type": "object",
    "required": ["project_id", "state", "n"],
    "properties": {
        "project_id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{2,62}$", "maxLength": 63},
        "state": {"type": "string", "enum": ["ok", "degraded", "failed"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 1000000},
    },
    "additionalProperties": False,
}
ROWS_DOC_SCHEMA: Final = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID + "bench_rows_doc.v1.json",
    "type": "object",
    "required": ["pad", "rows"],
    "properties": {
        "pad": {"type": "string", "pattern": "^x*$", "maxLength": 4096},
        "rows": {
            "type": "array",
            "maxItems": 200000,
            "items": {
                "type": "object",
                "required": ["i", "host", "state", "load"],
                "properties": {
                    "i": {"type": "integer", "minimum": 0, "maximum": 10000000},
                    "host": {"type": "string", "pattern": "^node-[0-9]{1,6}$", "maxLength": 11},
                    "state": {"type": "string", "enum": ["ok", "degraded", "failed"]},
                    "load": {"type": "number", "minimum": 0, "maximum": 1000},
                },
                "additionalProperties": False,
            },
        },
    },
    "additionalProperties": False,
}
STATUS_EXPECT: Final = b'{"project_id"'  # what the raw command's stdout starts with
ROWS_EXPECT: Final = b'{"pad"'


def rows_document(size: int) -> bytes:
    """Rows of small objects, padded to exactly ``size`` bytes including the newline."""
    states = ("ok", "degraded", "failed")
    rows: list[bytes] = []
    total = len(b'{"pad":"","rows":[]}\n')
    i = 0
    while True:
        row = orjson.dumps(
            {
                "i": 100000 + i,
                "host": f"node-{i % 997}",
                "state": states[i % 3],
                "load": i % 400 / 4,
            }
        )
        if total + len(row) + 1 + 64 > size:
            break
        rows.append(row)
        total += len(row) + (1 if i else 0)
        i += 1
    doc = b'{"pad":"' + b"x" * (size - total) + b'","rows":[' + b",".join(rows) + b"]}\n"
    assert len(doc) == size, len(doc)
    return doc


def status_line(n: int) -> bytes:
    args = {"project_id": IDS[n % len(IDS)]}
    return orjson.dumps({"op": "call", "tool": "bench_status", "args": args}) + b"\n"


def call_line(tool: str) -> bytes:
    return orjson.dumps({"op": "call", "tool": tool, "args": {}}) + b"\n"


def write_operations(tmp: Path) -> None:
    """The bench's command files, schemas and data files under ``tmp``."""
    commands, schemas = tmp / "commands", tmp / "schemas"
    commands.mkdir()
    schemas.mkdir()
    (commands / "bench_status.toml").write_text(STATUS_TOML)
    (schemas / "bench_status.v1.json").write_bytes(orjson.dumps(STATUS_SCHEMA))
    (schemas / "bench_rows_doc.v1.json").write_bytes(orjson.dumps(ROWS_DOC_SCHEMA))
    for tool, size, max_bytes in (
        ("bench_big", BIG_BYTES, BIG_BYTES),
        ("bench_huge", HUGE_BYTES, HUGE_MAX_BYTES),
    ):
        data = tmp / f"{tool}.json"
        data.write_bytes(rows_document(size))
        data.chmod(0o644)  # read by the sshd login account
        (commands / f"{tool}.toml").write_text(
            ROWS_TOML.replace("{size}", str(size))
            .replace("{path}", str(data))
            .replace("{max_bytes}", str(max_bytes))
        )


@dataclass(frozen=True)
class RawCommands:
    """The exact remote commands the daemon runs, from the package's own loader."""

    registry: Registry

    def status(self, n: int) -> str:
        return self.registry.operations["bench_status"].command({"project_id": IDS[n % len(IDS)]})

    def rows(self, tool: str) -> str:
        return self.registry.operations[tool].command({})


def raw_commands(tmp: Path) -> RawCommands:
    return RawCommands(load_registry(tmp / "commands", tmp / "schemas", hosts=None))


def write_config(tmp: Path, sshd: Sshd, name: str, fsync: str) -> Path:
    config = tmp / f"config-{name}.toml"
    config.write_text(f"""\
[server]
socket_path = "{tmp / f"{name}.sock"}"
socket_mode = "0600"
allow = {{ uids = [{os.getuid()}] }}
max_concurrent_calls = {MAX_CONCURRENT_CALLS}
max_queue = {MAX_QUEUE}

[paths]
commands = "commands"
schemas = "schemas"

[audit]
path = "{tmp / f"audit-{name}.jsonl"}"
fsync = "{fsync}"
quarantine_dir = "{tmp / f"quarantine-{name}"}"

[metrics]
listen = ""

{
        sshd.host_toml(
            "bench",
            connect_timeout_seconds=10.0,
            max_connections=POOL_CONNECTIONS,
            max_channels_per_connection=CHANNELS_PER_CONNECTION,
        )
    }""")
    return config


# Meters ----------------------------------------------------------------------------

TICK: Final = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def proc_cpu(pid: int, children: bool = False) -> float:
    """utime + stime (and, if asked, cutime + cstime) of one process, in seconds."""
    fields = _stat_fields(pid)
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def descendants(*roots: int) -> set[int]:
    """Every live process below ``roots`` (not the roots themselves), from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parent = int(_stat_fields(int(entry.name))[1])
                children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    frontier = list(roots)
    while frontier:
        kids = [p for p in children.get(frontier.pop(), []) if p not in found]
        found.update(kids)
        frontier.extend(kids)
    return found


def tree_cpu(*roots: int) -> float:
    """CPU seconds of process trees: every live member's own plus its reaped children's.

    For the daemon too, not only sshd: work moved to worker processes is still its work.
    """
    total = 0.0
    for pid in set(roots) | descendants(*roots):
        with contextlib.suppress(OSError, IndexError):
            total += proc_cpu(pid, children=True)
    return total


# Where the bench makes a cgroup of its own (cgroup v2: the unified hierarchy, mounted alone
# or beside v1). Its cpu.stat usage_usec is the kernel's CPU time of every task that ever
# ran in it, exited ones included, in microseconds: a 3 ms sshd session counts as 3 ms.
CGROUP_ROOTS: Final = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


class CpuCgroup:
    """The CPU seconds of some processes and all their future children, from a cgroup v2 the
    bench makes and moves them into. Per-process clock ticks (``tree_cpu``) round each short
    sshd session (~3 ms) down to 0 ticks, so 512 of them read as ~0 ms per host; the cgroup
    counts in microseconds and keeps the exited. Without a writable cgroup v2 (not root, a
    read-only /sys/fs/cgroup) ``cpu()`` falls back to ``tree_cpu`` and ``how`` says so."""

    def __init__(self, name: str, pids: Sequence[int]) -> None:
        self.pids = tuple(pids)
        self.path: Path | None = None
        for root in CGROUP_ROOTS:
            if not (root / "cgroup.procs").exists() or not (root / "cpu.stat").exists():
                continue
            path = root / f"{name}-{os.getpid()}"
            try:
                path.mkdir()
                for pid in self.pids:
                    (path / "cgroup.procs").write_text(str(pid))
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            self.path = path
            break
        self.how = (
            f"cgroup v2 cpu.stat usage_usec ({self.path})"
            if self.path
            else "tree_cpu clock ticks (no writable cgroup v2: short sessions count as 0)"
        )

    def cpu(self) -> float:
        if self.path is None:
            return tree_cpu(*self.pids)
        for line in (self.path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise RuntimeError(f"no usage_usec in {self.path / 'cpu.stat'}")

    def remove(self) -> None:
        """Move what is left back to the root and remove the cgroup."""
        if self.path is None:
            return
        root = self.path.parent
        with contextlib.suppress(OSError):
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (root / "cgroup.procs").write_text(pid)
            self.path.rmdir()


def driver_cpu() -> float:
    """This process's CPU seconds (the raw asyncssh client, the agent-side socket clients)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def proc_status(pid: int, key: str) -> int:
    """A kB field of /proc/PID/status (VmRSS, VmHWM), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0, needs ptrace rights on pid)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0-100); nan for no samples."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return float(ordered[rank - 1])


def median(values: Iterable[float]) -> float:
    return pct(list(values), 50)


def iqr(values: Sequence[float]) -> tuple[float, float]:
    return pct(values, 25), pct(values, 75)


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    openssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "log", "-1", "--format=%h %cd", "--date=short"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return (
        f"machine: nproc {os.cpu_count()}, {model}, {platform.system()} {platform.release()}\n"
        f"software: Python {platform.python_version()}, asyncssh {version('asyncssh')}, "
        f"cryptography {version('cryptography')}, orjson {version('orjson')}, "
        f"jsonschema-rs {version('jsonschema-rs')}, {openssh}; sshadapter at {commit or '?'}"
    )


# Clients ---------------------------------------------------------------------------


class AgentConn:
    """One agent connection to the daemon's socket, reused for every call of one caller."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, path: Path) -> AgentConn:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=RESPONSE_LIMIT_BYTES)
        return cls(reader, writer)

    async def call(self, line: bytes) -> str | None:
        """One request; None on outcome success, else a short label of what went wrong."""
        self.writer.write(line)
        await self.writer.drain()
        response = await self.reader.readline()
        if not response.endswith(b"\n"):
            return "connection closed"
        answer = orjson.loads(response)
        if answer.get("outcome") == "success":
            return None
        return str(answer.get("error", {}).get("code", "no outcome"))

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


class RawPool:
    """Warm asyncssh connections, shaped like the daemon's pool: the floor for one call.

    Channels go to the least loaded connection, at most ``cap`` each; callers beyond
    the total capacity wait in FIFO order. A refused channel open (sshd frees sessions
    late) is retried on another connection, as the daemon's runner does, and counted.
    """

    def __init__(self, conns: list[asyncssh.SSHClientConnection], cap: int) -> None:
        self.conns = conns
        self.load = [0] * len(conns)
        self.slots = asyncio.Semaphore(cap * len(conns))
        self.open_retries = 0

    @classmethod
    async def open(cls, sshd: Sshd, count: int, cap: int) -> RawPool:
        known = asyncssh.read_known_hosts(str(sshd.known_hosts))
        key = asyncssh.read_private_key(sshd.client_key)
        pool = cls([], cap)
        try:
            for _ in range(count):  # one at a time, as the daemon's pool (sshd MaxStartups)
                pool.conns.append(
                    await asyncssh.connect(
                        sshd.address,
                        sshd.port,
                        config=None,
                        username=sshd.user,
                        known_hosts=known,
                        x509_trusted_certs=None,
                        client_keys=[key],
                        agent_path=None,
                        preferred_auth="publickey",
                        password_auth=False,
                        kbdint_auth=False,
                        gss_auth=False,
                        gss_kex=False,
                        request_pty=False,
                        env=None,
                        send_env=None,
                        encryption_algs=CIPHERS,
                    )
                )
        except BaseException:
            await pool.close()
            raise
        pool.load = [0] * count
        pool.slots = asyncio.Semaphore(cap * count)
        return pool

    async def run(self, command: str, expect: bytes) -> str | None:
        """Run ``command``; None if it exited 0 with stdout starting ``expect``, else a label."""
        avoid = -1
        for attempt in range(1, OPEN_ATTEMPTS + 1):
            async with self.slots:
                candidates = [i for i in range(len(self.conns)) if i != avoid] or [avoid]
                index = min(candidates, key=self.load.__getitem__)
                self.load[index] += 1
                try:
                    done = await self.conns[index].run(command, check=False, encoding=None)
                except asyncssh.ChannelOpenError:
                    if attempt == OPEN_ATTEMPTS:
                        raise
                    self.open_retries += 1
                    avoid = index
                    continue
                finally:
                    self.load[index] -= 1
            if done.exit_status != 0:
                return f"exit {done.exit_status}"
            stdout = done.stdout
            return None if isinstance(stdout, bytes) and stdout.startswith(expect) else "stdout"
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await conn.wait_closed()


async def timed(call: Any) -> tuple[int, str | None]:
    """(elapsed ns, failure label or None) of one awaited call; exceptions are labels."""
    t0 = time.perf_counter_ns()
    try:
        async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
            failure = await call
    except Exception as exc:  # counted, and the run goes on
        failure = type(exc).__name__
    return time.perf_counter_ns() - t0, failure


# Daemon processes ------------------------------------------------------------------


@dataclass
class Daemon:
    """One ``sshadapter serve`` subprocess."""

    name: str
    fsync: str
    socket: Path
    process: subprocess.Popen[bytes]
    log: Path
    loop_log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def cpu(self) -> float:
        return tree_cpu(self.pid)

    async def wait_ready(self, timeout: float = READY_TIMEOUT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"daemon {self.name} exited: {self.tail()}")
            with contextlib.suppress(OSError):
                conn = await AgentConn.open(self.socket)
                await conn.close()
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"daemon {self.name} not ready after {timeout:.0f} s: {self.tail()}")

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-2000:]
        return ""

    async def loop_start(self) -> None:
        """Start recording the daemon's event-loop callbacks (daemon_patches.LOOP_RECORDER)."""
        self.loop_log.unlink(missing_ok=True)
        os.kill(self.pid, LOOP_START_SIGNAL)
        await asyncio.sleep(0.05)  # the handler runs at the daemon's next bytecode boundary

    async def loop_dump(self) -> list[tuple[int, int, int, str]]:
        """Stop recording; (start ns CLOCK_MONOTONIC, wall ns, thread CPU ns, label) each."""
        os.kill(self.pid, LOOP_DUMP_SIGNAL)
        deadline = time.monotonic() + LOOP_DUMP_TIMEOUT_SECONDS
        while not self.loop_log.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"daemon {self.name} wrote no loop record: {self.tail()}")
            await asyncio.sleep(0.02)
        return [tuple(r) for r in json.loads(self.loop_log.read_text())]

    def stop(self) -> list[str]:
        """SIGTERM, wait, reap; returns warnings (a kill was needed, processes left behind)."""
        warnings = []
        below = descendants(self.pid) if self.process.poll() is None else set()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                warnings.append(f"daemon {self.name} ignored SIGTERM for {STOP_TIMEOUT_SECONDS} s")
                self.process.kill()
                self.process.wait()
        if self.process.returncode not in (0, -signal.SIGTERM):
            warnings.append(f"daemon {self.name} exited {self.process.returncode}: {self.tail()}")
        deadline = time.monotonic() + LEFTOVER_GRACE_SECONDS
        while any(_alive(pid) for pid in below) and time.monotonic() < deadline:
            time.sleep(0.05)  # e.g. a resource tracker exits once its users have gone
        left = [pid for pid in below if _alive(pid)]
        if left:
            warnings.append(f"daemon {self.name} left processes {left}: killed")
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        return warnings


def _alive(pid: int) -> bool:
    try:
        state = _stat_fields(pid)[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def start_daemon(
    tmp: Path, sshd: Sshd, name: str, fsync: str, patches: Sequence[str] = ()
) -> Daemon:
    """``sshadapter serve --config`` in a subprocess, via daemon_patches.SERVE."""
    config = write_config(tmp, sshd, name, fsync)
    log, loop_log = tmp / f"daemon-{name}.log", tmp / f"loop-{name}.json"
    setup = {
        "parent": os.getpid(),
        "loop_log": str(loop_log),
        "patches": "\n".join(PATCHES[p] for p in patches),
        "config": str(config),
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(setup)],
            cwd=tmp,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Daemon(name, fsync, tmp / f"{name}.sock", process, log, loop_log)


# The whole environment --------------------------------------------------------------


@dataclass
class Env:
    sshd: Sshd
    sshd_pid: int
    tmp: Path
    commands: RawCommands
    daemons: dict[str, Daemon]
    raw: RawPool

    def sshd_cpu(self) -> float:
        return tree_cpu(self.sshd_pid)


# Cleans up after a benchmark that died without its finally blocks (SIGKILL): the daemons
# die with it by themselves (PR_SET_PDEATHSIG in daemon_patches.SERVE); the sshd, started
# by tests/support/sshd.py, does not, so this process, which does die with it, stops the sshd and
# removes the directories. On a normal exit the benchmark has done that and kills it.
REAPER: Final = r"""
import ctypes, os, shutil, signal, sys, time
parent, pids, paths = int(sys.argv[1]), sys.argv[2].split(), sys.argv[3:]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() == parent:
    signal.sigwait({signal.SIGTERM})
for pid in pids:
    try:
        os.kill(int(pid), signal.SIGTERM)
    except OSError:
        pass
time.sleep(1.0)
for path in paths:
    shutil.rmtree(path, ignore_errors=True)
"""


@contextlib.contextmanager
def reaper(pids: Sequence[int], paths: Sequence[Path]) -> Iterator[None]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            REAPER,
            str(os.getpid()),
            " ".join(map(str, pids)),
            *map(str, paths),
        ],
        stdin=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        process.kill()
        process.wait()


@contextlib.asynccontextmanager
async def bench_env(
    daemons: Sequence[tuple[str, str]], patches: dict[str, Sequence[str]] | None = None
) -> AsyncIterator[Env]:
    """An sshd, the operations, one daemon per (name, fsync) and a raw pool; all torn down."""
    patches = patches or {}
    loop = asyncio.get_running_loop()
    main_task = asyncio.current_task()
    assert main_task is not None
    loop.add_signal_handler(signal.SIGTERM, main_task.cancel)
    started: dict[str, Daemon] = {}
    warnings: list[str] = []
    try:
        with (
            contextlib.ExitStack() as stack,
            running_sshd() as sshd,
            tempfile.TemporaryDirectory(prefix="sshadapter-bench-") as t,
        ):
            tmp = Path(t)
            tmp.chmod(0o755)  # the sshd login account reads the data files here
            sshd_pid = int((sshd.workdir / "sshd.pid").read_text())
            stack.enter_context(reaper([sshd_pid], [tmp, sshd.workdir]))
            write_operations(tmp)
            commands = raw_commands(tmp)
            try:
                for name, fsync in daemons:
                    started[name] = start_daemon(tmp, sshd, name, fsync, patches.get(name, ()))
                for daemon in started.values():
                    await daemon.wait_ready()
                raw = await RawPool.open(sshd, POOL_CONNECTIONS, CHANNELS_PER_CONNECTION)
                try:
                    yield Env(sshd, sshd_pid, tmp, commands, started, raw)
                finally:
                    await raw.close()
            finally:
                for daemon in started.values():
                    warnings += daemon.stop()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        for warning in warnings:
            print(f"warning: {warning}", flush=True)


def run(main: Coroutine[Any, Any, None]) -> None:
    """asyncio.run(main); an interrupted run says so (bench_env has cleaned up by then)."""
    try:
        asyncio.run(main)
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted: everything started was stopped", file=sys.stderr)


def filesystem_of(path: Path) -> str:
    return subprocess.run(
        ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True
    ).stdout.strip()


def shuffled(items: Sequence[str], rng: random.Random) -> list[str]:
    out = list(items)
    rng.shuffle(out)
    return out
