"""End-to-end benchmark over a real OpenSSH sshd: sshadapter against raw SSH clients.

Run: ``python tests/bench/bench_ssh.py`` (about 4 min; ``--quick`` about 1 min).
A benchmark, not a test: it always exits 0 and prints PASS/MISS per target.

It starts a private sshd on 127.0.0.1 (``tests/sshd.py``), writes two operations
and a config in a temporary directory, and runs ``sshadapter serve`` as
subprocesses (so their CPU time and peak RSS can be read from /proc): one with
``audit.fsync = "never"`` (the targets) and one with ``fsync = "always"`` (the
production default, reported beside it). Then, interleaved round by round, each
concurrency level running every method for a fixed number of calls in a
shuffled order, so machine noise hits all of them alike:

  raw asyncssh   conn.run() on warm connections: the floor for one call over SSH.
                 As many connections as the daemon's pool (``[hosts.bench]
                 max_connections``), at most ``max_channels_per_connection``
                 channels on each, least loaded first, like the daemon's pool.
  sshadapter     asyncio Unix-socket clients, one persistent connection per
                 concurrent worker (as an agent's client), one JSON ``call`` line
                 per call, the envelope read back and checked for success.
  ssh new conn   the ssh command line, one new connection per call (c=1 only).
  ssh mux        the ssh command line through a ControlMaster started once (c=1).
  local sh -c    the same command run locally, for scale (c=1, information only).

Then 64 concurrent calls of an operation whose output is its maximum allowed
size (1 MiB), reporting the daemons' peak RSS. ``--variant PATCH[+PATCH]`` adds a
daemon running experimental fixes from daemon_patches.py to the same rounds.

Latency is measured per call (time.perf_counter_ns) in the driving process;
calls/s is calls over the phases' wall time. CPU per call: the daemon's
utime+stime (/proc/PID/stat) over its phases; "driver" is this process and its
children (the raw asyncssh client, the ssh processes, the socket clients); "sshd"
is the whole sshd process tree. Peak RSS: VmHWM, reset (clear_refs) before each
phase where the kernel allows it, the largest value seen per level.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import asyncssh  # noqa: E402
import orjson  # noqa: E402
from daemon_patches import PATCHED_SERVE, PATCHES  # noqa: E402
from sshd import Sshd, running_sshd  # noqa: E402

from sshadapter.registry import Operation, load_registry  # noqa: E402
from sshadapter.runners.ssh import CIPHERS  # noqa: E402

LEVELS = (1, 8, 32, 64)
# The daemon's limits, written into its config. Pool capacity 6 x 6 = 36 channels is
# above max_concurrent_calls, so the pool never holds calls the daemon admitted; the
# limits (32 running + 64 queued) are above every level: no OVERLOADED is expected.
POOL_CONNECTIONS = 6
CHANNELS_PER_CONNECTION = 6  # the config default, below sshd's MaxSessions 10
MAX_CONCURRENT_CALLS = 32  # the config default
MAX_QUEUE = 64  # the config default
BIG_BYTES = 1024 * 1024  # bench_big's max_bytes, and the exact size of its output
BIG_LEVEL = 64
CALL_TIMEOUT_S = 60.0  # per call in the driver: a hang is a failure, not a stuck run
IDS = [f"bench-{i:04d}" for i in range(1000)]  # project ids cycled through by every method

FULL = dict(
    rounds=16,
    calls={1: 40, 8: 160, 32: 384, 64: 640},
    ssh_new=2,
    ssh_mux=20,
    local=20,
    big_rounds=2,
    big_calls=128,
)
QUICK = dict(
    rounds=5,
    calls={1: 30, 8: 120, 32: 256, 64: 512},
    ssh_new=2,
    ssh_mux=15,
    local=15,
    big_rounds=1,
    big_calls=128,
)

STATUS_TOML = """\
description = "Benchmark: a small JSON status document for one project."
version = 1
host = "bench"
argv = ["printf", '{{"project_id":"%s","state":"ok","n":%s}}\\n', "{project_id}", "1"]
timeout_seconds = 30
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

BIG_TOML = """\
description = "Benchmark: a JSON document of exactly max_bytes (1 MiB) of rows."
version = 1
host = "bench"
argv = ["cat", "{path}"]
timeout_seconds = 60
idempotent = true

[output]
format = "json"
schema = "bench_big.v1.json"
max_bytes = {max_bytes}
max_depth = 4

[agent]
fields = ["pad", "rows"]
"""

SCHEMA_ID = "https://sshadapter.invalid/schemas/"
STATUS_SCHEMA = {
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
BIG_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID + "bench_big.v1.json",
    "type": "object",
    "required": ["pad", "rows"],
    "properties": {
        "pad": {"type": "string", "pattern": "^x*$", "maxLength": 4096},
        "rows": {
            "type": "array",
            "maxItems": 100000,
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


def big_document(size: int) -> bytes:
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
                "load": (i % 400) / 4,
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


# Measurement helpers -------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int, children: bool = False) -> float:
    """utime + stime (and, if asked, cutime + cstime) of one process, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICK


def proc_status(pid: int, key: str) -> int:
    """A kB field of /proc/PID/status, in bytes."""
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


def tree_cpu(root: int) -> float:
    """CPU seconds of a process tree: every live member's own plus its reaped children's."""
    parent: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = Path(entry.path, "stat").read_text().rpartition(")")[2].split()
                parent[int(entry.name)] = int(fields[1])
    members, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in members]
        members.update(kids)
        frontier.extend(kids)
    total = 0.0
    for pid in members:
        with contextlib.suppress(OSError):
            total += proc_cpu(pid, children=True)
    return total


def driver_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def tcp_connections_to(pid: int, port: int) -> int:
    """Established TCP connections of ``pid`` to 127.0.0.1:``port``."""
    inodes = set()
    for fd in os.scandir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(fd.path)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if int(cols[2].split(":")[1], 16) == port and cols[3] == "01" and cols[9] in inodes:
            count += 1
    return count


def pct(values: list[int], q: float) -> float:
    """Nearest-rank percentile of nanosecond samples, in milliseconds."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1] / 1e6


@dataclass
class Acc:
    """Everything measured for one (method, level), summed over rounds."""

    lat: list[int] = field(default_factory=list)
    calls: int = 0
    fails: Counter[str] = field(default_factory=Counter)
    wall: float = 0.0
    daemon_cpu: float = 0.0
    driver_cpu: float = 0.0
    sshd_cpu: float = 0.0
    peak_rss: int = 0

    @property
    def rate(self) -> float:
        return self.calls / self.wall if self.wall else 0.0


# The callers -------------------------------------------------------------------

Call = Callable[[int], Awaitable[str | None]]  # call number -> None on success, else a label


class RawPool:
    """Warm asyncssh connections, channels spread least-loaded-first with a cap per connection.

    Callers beyond the total capacity wait in FIFO order (a semaphore), then take the
    least loaded connection, which then has room.
    """

    def __init__(self, conns: list[asyncssh.SSHClientConnection], cap: int) -> None:
        self.conns = conns
        self.load = [0] * len(conns)
        self.slots = asyncio.Semaphore(cap * len(conns))

    @classmethod
    async def open(cls, sshd: Sshd, count: int, cap: int) -> RawPool:
        known = asyncssh.read_known_hosts(str(sshd.known_hosts))
        key = asyncssh.read_private_key(sshd.client_key)
        conns = []
        for _ in range(count):  # one at a time, as the daemon's pool (sshd MaxStartups)
            conns.append(
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
        return cls(conns, cap)

    async def run(self, command: str) -> asyncssh.SSHCompletedProcess:
        async with self.slots:
            index = min(range(len(self.conns)), key=self.load.__getitem__)
            self.load[index] += 1
            try:
                return await self.conns[index].run(command, check=False, encoding=None)
            finally:
                self.load[index] -= 1

    async def close(self) -> None:
        for conn in self.conns:
            conn.close()
        for conn in self.conns:
            with contextlib.suppress(Exception):
                await conn.wait_closed()


class AdapterConn:
    """One agent connection to the daemon, reused for every call of one worker."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, path: Path) -> AdapterConn:
        reader, writer = await asyncio.open_unix_connection(str(path), limit=8 * BIG_BYTES)
        return cls(reader, writer)

    async def call(self, line: bytes) -> str | None:
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


async def run_process(argv: list[str]) -> str | None:
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, _ = await process.communicate()
    if process.returncode != 0:
        return f"exit {process.returncode}"
    return None if out.startswith(b"{") else "unexpected stdout"


@dataclass
class Daemon:
    name: str
    pid: int
    socket: Path
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class Bench:
    sshd: Sshd
    sshd_pid: int
    status: Operation
    big: Operation
    raw: RawPool
    daemons: dict[str, Daemon]
    ssh_base: list[str]
    mux_path: Path
    accs: dict[tuple[str, int], Acc] = field(default_factory=dict)
    rss_reset_works: bool = True

    def status_command(self, n: int) -> str:
        return self.status.command({"project_id": IDS[n % len(IDS)]})

    def status_line(self, n: int) -> bytes:
        return (
            orjson.dumps(
                {"op": "call", "tool": "bench_status", "args": {"project_id": IDS[n % len(IDS)]}}
            )
            + b"\n"
        )


def raw_call(bench: Bench, command: Callable[[int], str], expect: bytes) -> Call:
    async def call(n: int) -> str | None:
        done = await bench.raw.run(command(n))
        if done.exit_status != 0:
            return f"exit {done.exit_status}"
        return (
            None
            if isinstance(done.stdout, bytes) and done.stdout.startswith(expect)
            else "unexpected stdout"
        )

    return call


@contextlib.asynccontextmanager
async def workers_for(
    bench: Bench, method: str, level: int, big: bool
) -> AsyncIterator[list[Call]]:
    """One Call per concurrent worker; connections are opened here, outside the timing."""
    if method in bench.daemons:
        conns = [await AdapterConn.open(bench.daemons[method].socket) for _ in range(level)]
        big_line = b'{"op":"call","tool":"bench_big","args":{}}\n'

        def bind(conn: AdapterConn) -> Call:
            if big:
                return lambda n: conn.call(big_line)
            return lambda n: conn.call(bench.status_line(n))

        try:
            yield [bind(c) for c in conns]
        finally:
            for c in conns:
                await c.close()
        return
    if method == "raw asyncssh":
        if big:
            big_command = bench.big.command({})
            call = raw_call(bench, lambda n: big_command, b'{"pad"')
        else:
            call = raw_call(bench, bench.status_command, b'{"project_id"')
        yield [call] * level
        return
    if method == "ssh new conn":
        base = [*bench.ssh_base, "-o", "ControlMaster=no", "-o", "ControlPath=none"]
    elif method == "ssh mux":
        base = [*bench.ssh_base, "-o", "ControlMaster=no", "-o", f"ControlPath={bench.mux_path}"]
    elif method == "local sh -c":
        yield [lambda n: run_process(["sh", "-c", bench.status_command(n)])] * level
        return
    else:
        raise ValueError(method)
    dest = f"{bench.sshd.user}@{bench.sshd.address}"
    yield [lambda n: run_process([*base, dest, bench.status_command(n)])] * level


async def run_phase(
    bench: Bench, method: str, level: int, calls: int, *, big: bool = False, record: bool = True
) -> None:
    key = (method + (" 1MiB" if big else ""), level)
    acc = bench.accs.setdefault(key, Acc()) if record else Acc()
    daemon = bench.daemons.get(method)
    latencies: list[int] = []
    fails: Counter[str] = Counter()
    remaining = calls
    clock = time.perf_counter_ns

    async def worker(call: Call) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            n = remaining
            t0 = clock()
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    failure = await call(n)
            except Exception as exc:  # counted, and the run goes on
                failure = type(exc).__name__
            latencies.append(clock() - t0)
            if failure is not None:
                fails[failure] += 1

    async with workers_for(bench, method, level, big) as workers:
        if daemon is not None and reset_peak_rss(daemon.pid) is False:
            bench.rss_reset_works = False
        d0 = proc_cpu(daemon.pid) if daemon else 0.0
        c0, s0 = driver_cpu(), tree_cpu(bench.sshd_pid)
        w0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in workers))
        wall = time.perf_counter() - w0
        c1, s1 = driver_cpu(), tree_cpu(bench.sshd_pid)
        d1 = proc_cpu(daemon.pid) if daemon else 0.0
        rss = proc_status(daemon.pid, "VmHWM") if daemon else 0
    acc.lat += latencies
    acc.calls += calls
    acc.fails.update(fails)
    acc.wall += wall
    acc.daemon_cpu += d1 - d0
    acc.driver_cpu += c1 - c0
    acc.sshd_cpu += s1 - s0
    acc.peak_rss = max(acc.peak_rss, rss)


# Setup ---------------------------------------------------------------------------


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

[hosts.bench]
address = "{sshd.address}"
port = {sshd.port}
user = "{sshd.user}"
client_keys = ["{sshd.client_key}"]
known_hosts = "{sshd.known_hosts}"
connect_timeout_seconds = 10.0
max_connections = {POOL_CONNECTIONS}
max_channels_per_connection = {CHANNELS_PER_CONNECTION}
""")
    return config


def write_operations(tmp: Path) -> None:
    commands, schemas = tmp / "commands", tmp / "schemas"
    commands.mkdir()
    schemas.mkdir()
    big = tmp / "big.json"
    big.write_bytes(big_document(BIG_BYTES))
    big.chmod(0o644)  # read by the sshd login account
    (commands / "bench_status.toml").write_text(STATUS_TOML)
    (commands / "bench_big.toml").write_text(
        BIG_TOML.replace("{path}", str(big)).replace("{max_bytes}", str(BIG_BYTES))
    )
    (schemas / "bench_status.v1.json").write_bytes(orjson.dumps(STATUS_SCHEMA))
    (schemas / "bench_big.v1.json").write_bytes(orjson.dumps(BIG_SCHEMA))


def start_daemon(tmp: Path, name: str, config: Path, patches: list[str] | None = None) -> Daemon:
    """``sshadapter serve`` in a subprocess; with ``patches``, experimental fixes applied first."""
    log = tmp / f"daemon-{name}.log"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)]
    if patches:
        code = "\n".join(PATCHES[patch] for patch in patches)
        argv = [sys.executable, "-c", PATCHED_SERVE, code, str(config)]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            argv, cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
    return Daemon(name, process.pid, tmp / f"{name}.sock", process, log)


async def wait_ready(daemon: Daemon, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if daemon.process.poll() is not None:
            raise RuntimeError(f"daemon {daemon.name} exited: {daemon.log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            conn = await AdapterConn.open(daemon.socket)
            await conn.close()
            return
        await asyncio.sleep(0.05)
    raise RuntimeError(f"daemon {daemon.name} not ready: {daemon.log.read_text()[-2000:]}")


def stop_daemon(daemon: Daemon) -> None:
    if daemon.process.poll() is None:
        daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(30)
        except subprocess.TimeoutExpired:
            daemon.process.kill()
            daemon.process.wait()


@contextlib.contextmanager
def control_master(ssh_base: list[str], dest: str, path: Path) -> Iterator[None]:
    log = path.with_suffix(".log")
    with open(log, "wb") as out:
        master = subprocess.Popen(
            [
                *ssh_base,
                "-o",
                "ControlMaster=yes",
                "-o",
                f"ControlPath={path}",
                "-o",
                "ControlPersist=no",
                "-N",
                dest,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 15
        while not path.exists():
            if master.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ControlMaster did not start: {log.read_text()!r}")
            time.sleep(0.02)
        yield
    finally:
        master.terminate()
        try:
            master.wait(5)
        except subprocess.TimeoutExpired:
            master.kill()
            master.wait()


def machine() -> str:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    openssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    load = Path("/proc/loadavg").read_text().split()[:3]
    return (
        f"machine: nproc {os.cpu_count()}, {model}, {platform.system()} "
        f"{platform.release()}, load {' '.join(load)}\n"
        f"software: Python {platform.python_version()}, asyncssh {version('asyncssh')}, "
        f"cryptography {version('cryptography')}, {openssh}, "
        f"sshadapter {version('sshadapter') if _installed('sshadapter') else 'checkout'}"
    )


def _installed(name: str) -> bool:
    try:
        version(name)
    except Exception:
        return False
    return True


# The run -------------------------------------------------------------------------


def methods_at(bench: Bench, level: int) -> list[str]:
    methods = ["raw asyncssh", *bench.daemons]
    if level == 1:
        methods += ["ssh new conn", "ssh mux", "local sh -c"]
    return methods


def calls_for(plan: dict[str, Any], method: str, level: int) -> int:
    calls = {
        "ssh new conn": plan["ssh_new"],
        "ssh mux": plan["ssh_mux"],
        "local sh -c": plan["local"],
    }.get(method, plan["calls"][level])
    return int(calls)


async def measure(bench: Bench, plan: dict[str, Any], rng: random.Random) -> None:
    started = time.monotonic()
    print("warm-up round (not recorded) ...", flush=True)
    for name in bench.daemons:  # grow each daemon's pool to its size under load
        await run_phase(bench, name, 64, 640, record=False)
    for level in LEVELS:
        for method in methods_at(bench, level):
            await run_phase(
                bench, method, level, max(level, calls_for(plan, method, level) // 4), record=False
            )
    print_connections(bench)
    for r in range(plan["rounds"]):
        levels = list(LEVELS)
        rng.shuffle(levels)
        for level in levels:
            methods = methods_at(bench, level)
            rng.shuffle(methods)
            for method in methods:
                await run_phase(bench, method, level, calls_for(plan, method, level))
        print(
            f"  round {r + 1}/{plan['rounds']} done, {time.monotonic() - started:.0f} s", flush=True
        )
    print(f"1 MiB outputs at concurrency {BIG_LEVEL} ...", flush=True)
    big_methods = ["raw asyncssh", *bench.daemons]
    for method in big_methods:  # warm: first 1 MiB calls grow buffers and allocator arenas
        await run_phase(bench, method, BIG_LEVEL, BIG_LEVEL, big=True, record=False)
    for _ in range(plan["big_rounds"]):
        rng.shuffle(big_methods)
        for method in big_methods:
            await run_phase(bench, method, BIG_LEVEL, plan["big_calls"], big=True)
    print_connections(bench)
    print(f"measured in {time.monotonic() - started:.0f} s", flush=True)


def print_connections(bench: Bench) -> None:
    counts = ", ".join(
        f"{name} {tcp_connections_to(d.pid, bench.sshd.port)}" for name, d in bench.daemons.items()
    )
    print(
        f"  SSH connections open: raw asyncssh {tcp_connections_to(os.getpid(), bench.sshd.port)}"
        f", {counts}",
        flush=True,
    )


def report(bench: Bench) -> None:
    mb = 1024 * 1024
    print("\nresults (latency per call in ms; CPU in ms per call; RSS = daemon peak, MiB)")
    header = (
        f"{'c':>3} {'method':<30} {'calls':>6} {'fail':>5} {'p50':>8} {'p99':>8} "
        f"{'calls/s':>8} {'daemon':>7} {'driver':>7} {'sshd':>7} {'total':>7} {'RSS':>6}"
    )
    print(header)
    print("-" * len(header))
    for (method, level), acc in sorted(
        bench.accs.items(), key=lambda kv: (kv[0][1], "1MiB" in kv[0][0])
    ):
        per = 1000 / acc.calls
        total = acc.daemon_cpu + acc.driver_cpu + acc.sshd_cpu
        daemon = (
            f"{acc.daemon_cpu * per:7.2f}"
            if method.split(" 1MiB")[0] in bench.daemons
            else f"{'-':>7}"
        )
        rss = f"{acc.peak_rss / mb:6.1f}" if acc.peak_rss else f"{'-':>6}"
        print(
            f"{level:>3} {method:<30} {acc.calls:>6} {sum(acc.fails.values()):>5} "
            f"{pct(acc.lat, 50):8.2f} {pct(acc.lat, 99):8.2f} {acc.rate:8.1f} {daemon} "
            f"{acc.driver_cpu * per:7.2f} {acc.sshd_cpu * per:7.2f} {total * per:7.2f} {rss}"
        )
    failures = {k: dict(a.fails) for k, a in bench.accs.items() if a.fails}
    print(f"\nfailures: {failures or 'none'}")
    if not bench.rss_reset_works:
        print("note: VmHWM could not be reset per phase: RSS is the peak since the daemon started")

    print("\nratios sshadapter / raw asyncssh (same connections, same channels per connection)")
    print(f"{'c':>3} {'daemon':<34} {'p50':>6} {'p99':>6} {'calls/s':>8}")
    for level in LEVELS:
        raw = bench.accs[("raw asyncssh", level)]
        for name in bench.daemons:
            acc = bench.accs[(name, level)]
            print(
                f"{level:>3} {name:<34} {pct(acc.lat, 50) / pct(raw.lat, 50):6.2f} "
                f"{pct(acc.lat, 99) / pct(raw.lat, 99):6.2f} {acc.rate / raw.rate:8.2f}"
            )
    raw_big = bench.accs[("raw asyncssh 1MiB", BIG_LEVEL)]
    for name in bench.daemons:
        acc = bench.accs[(name + " 1MiB", BIG_LEVEL)]
        print(
            f"{BIG_LEVEL:>3} {name + ' 1MiB':<34} {pct(acc.lat, 50) / pct(raw_big.lat, 50):6.2f} "
            f"{pct(acc.lat, 99) / pct(raw_big.lat, 99):6.2f} {acc.rate / raw_big.rate:8.2f}"
        )

    ssh_new = pct(bench.accs[("ssh new conn", 1)].lat, 50)
    raw1 = pct(bench.accs[("raw asyncssh", 1)].lat, 50)
    raw32 = bench.accs[("raw asyncssh", 32)].rate
    for name in bench.daemons:
        print(f"\ntargets, {name}")
        a1 = pct(bench.accs[(name, 1)].lat, 50)
        r32 = bench.accs[(name, 32)].rate
        big = bench.accs[(name + " 1MiB", BIG_LEVEL)]
        peak = max(a.peak_rss for (m, _), a in bench.accs.items() if m.split(" 1MiB")[0] == name)
        failed = {lvl: sum(a.fails.values()) for (m, lvl), a in bench.accs.items() if m == name}
        failed_big = sum(big.fails.values())
        rows = [
            (
                "p50 at c=1 <= 1.25x raw asyncssh",
                a1 / raw1 <= 1.25,
                f"{a1:.2f} ms vs {raw1:.2f} ms = {a1 / raw1:.2f}x",
            ),
            (
                "calls/s at c=32 >= 0.8x raw asyncssh",
                r32 / raw32 >= 0.8,
                f"{r32:.0f} vs {raw32:.0f} calls/s = {r32 / raw32:.2f}x",
            ),
            (
                "p50 at c=1 >= 20x faster than ssh new conn",
                ssh_new / a1 >= 20,
                f"{ssh_new:.1f} ms / {a1:.2f} ms = {ssh_new / a1:.0f}x",
            ),
            (
                f"peak RSS, {BIG_LEVEL} x 1 MiB outputs <= 200 MB",
                big.peak_rss <= 200e6,
                f"{big.peak_rss / 1e6:.0f} MB (whole run {peak / 1e6:.0f} MB)",
            ),
            (
                "no failed calls at any level",
                not any(failed.values()) and not failed_big,
                f"{failed}, 1 MiB run {failed_big}",
            ),
        ]
        for label, ok, got in rows:
            print(f"  {'PASS' if ok else 'MISS'}  {label:<44} measured {got}")


async def amain(args: argparse.Namespace) -> None:
    plan = dict(QUICK if args.quick else FULL)
    if args.rounds:
        plan["rounds"] = args.rounds
    print(machine())
    print(
        f"plan: {plan['rounds']} rounds; calls per phase {plan['calls']}; ssh new conn "
        f"{plan['ssh_new']}, ssh mux {plan['ssh_mux']} per round at c=1; "
        f"pool {POOL_CONNECTIONS} connections x {CHANNELS_PER_CONNECTION} channels; "
        f"daemon max_concurrent_calls {MAX_CONCURRENT_CALLS}, max_queue {MAX_QUEUE}",
        flush=True,
    )
    with running_sshd() as sshd, tempfile.TemporaryDirectory(prefix="sshadapter-bench-") as t:
        tmp = Path(t)
        tmp.chmod(0o755)  # the sshd login account reads big.json here
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(tmp)], capture_output=True, text=True
        ).stdout.strip()
        print(f"sshd 127.0.0.1:{sshd.port} as {sshd.user}; audit logs in {tmp} ({fs})")
        write_operations(tmp)
        registry = load_registry(tmp / "commands", tmp / "schemas", hosts=["bench"])
        daemons = {}
        variants: dict[str, tuple[str, list[str]]] = {"sshadapter": ("never", [])}
        if not args.no_fsync_always:
            variants["sshadapter fsync"] = ("always", [])
        for spec in args.variant:
            variants[f"patched {spec}"] = ("never", spec.split("+"))
        try:
            for index, (name, (fsync, patches)) in enumerate(variants.items()):
                slug = f"d{index}"
                daemons[name] = start_daemon(
                    tmp, slug, write_config(tmp, sshd, slug, fsync), patches
                )
            for daemon in daemons.values():
                await wait_ready(daemon)
            ssh_base = [
                "ssh",
                "-F",
                "/dev/null",
                "-T",
                "-i",
                str(sshd.client_key),
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                f"UserKnownHostsFile={sshd.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                "-o",
                "BatchMode=yes",
                "-c",
                "aes128-gcm@openssh.com",
                "-p",
                str(sshd.port),
            ]
            mux = tmp / "mux.sock"
            sshd_pid = int((sshd.workdir / "sshd.pid").read_text())
            with control_master(ssh_base, f"{sshd.user}@{sshd.address}", mux):
                raw = await RawPool.open(sshd, POOL_CONNECTIONS, CHANNELS_PER_CONNECTION)
                bench = Bench(
                    sshd,
                    sshd_pid,
                    registry.operations["bench_status"],
                    registry.operations["bench_big"],
                    raw,
                    daemons,
                    ssh_base,
                    mux,
                )
                print(f"command: {bench.status_command(0)}")
                print(f"1 MiB command: {bench.big.command({})} ({BIG_BYTES} bytes)")
                try:
                    await measure(bench, plan, random.Random(args.seed))
                finally:
                    await raw.close()
            for name, daemon in daemons.items():
                print(
                    f"{name}: daemon RSS now {proc_status(daemon.pid, 'VmRSS') / 2**20:.1f}"
                    f" MiB; audit {(tmp / f'audit-{daemon.name}.jsonl').stat().st_size:,} B"
                )
        finally:
            for daemon in daemons.values():
                stop_daemon(daemon)
        report(bench)
        print(f"\nload at end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (about 1 min)")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument("--seed", type=int, default=7, help="shuffle seed")
    parser.add_argument(
        "--no-fsync-always",
        action="store_true",
        help="skip the second daemon (audit fsync = always)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="PATCH[+PATCH]",
        help="also run a daemon with experimental fixes from daemon_patches.py "
        f"({', '.join(sorted(PATCHES))}), interleaved like the others",
    )
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
    sys.exit(0)  # a benchmark: PASS/MISS is printed, never the exit status
