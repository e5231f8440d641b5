"""Issue 19's speed table: one command on N loopback hosts, sshadapter beside its baselines.

Run: ``python tests/bench/bench_fleet.py`` (N = 32, 128, 512; about 5 min),
``--quick`` (N = 32 only, under a minute), ``--sizes 32,128``, ``--no-ansible``,
``--rtts 0,20,100`` (the default: round trips through latency_proxy.py, issue 28).
A benchmark, not a test: it always exits 0 and prints the figures and PASS/MISS.

For each N, a fleet of N real OpenSSH hosts (``tests/support/fleet_sshd.py``: ceil(N/16)
sshd processes on 127.0.0.2.., one ``@cert-authority`` line pins them all), and in
the same run, one after another on the same fleet:

  raw asyncssh cold   N connects (at most HANDSHAKES_IN_FLIGHT at once, as a sane
                      client) and one exec of ``cat /proc/loadavg`` on each
  raw asyncssh warm   N execs at once on those open connections (median of rounds)
  Ansible cold/warm   ``ansible fleet -i INI -m raw -a 'cat /proc/loadavg' -f 32``
                      from ansible-core in a cached venv (installed with pip on first
                      use), StrictHostKeyChecking=yes against the same CA line; cold
                      with a fresh ControlPath directory, warm reusing its masters
                      (Ansible's default ControlPersist=60s)
  sshadapter          one call, ``load_average_fleet`` with ``run_on = "all-hosts"``
                      (the shipped load_average with ``targets``), every host in the
                      answer: cold is the first call after start (the daemon connects
                      lazily), warm the median of the calls after it

The daemon is ``sshadapter serve`` with the fleet in an inventory file (one
``[host_defaults]``, a group ``all-hosts`` by label).

Also: daemon start-up to ready with 100 and 1,000 hosts configured and nothing to
connect to; the daemon's RSS and open files with N hosts connected (the 1,000-host
row is extrapolated until a run at 1,000 fits here); a single call's p50 while
fan-outs run back to back on the largest N, against its idle p50.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # fleet_sshd, sshd

import asyncssh
import orjson
from daemon_patches import SERVE
from fleet_sshd import Fleet, _fleet_port, running_fleet
from harness import ROOT, AgentConn, CpuCgroup, Daemon, loadavg, machine, proc_status
from latency_proxy import LatencyProxy

COMMAND: Final = "cat /proc/loadavg"
DEFAULT_SIZES: Final = (32, 128, 512)
WARM_ROUNDS: Final = 3  # warm fan-outs per method and N; the median is reported
COLD_ROUNDS: Final = 3  # cold fan-outs (a fresh daemon, fresh raw connections each); median
DEFAULT_RTTS: Final = (0.0, 20.0, 100.0)  # ms: loopback, a region, across the world
ANSIBLE_FORKS: Final = 32  # the setting; more forks only thrash 2 cores
ANSIBLE_BUDGET_SECONDS: Final = 180.0  # skip an N whose Ansible runs would take longer
ANSIBLE_TIMEOUT_SECONDS: Final = 600.0  # one ansible run that takes this long is cut
ANSIBLE_VENV: Final = Path.home() / ".cache" / "sshadapter-bench" / "ansible-venv"
CONNECT_TIMEOUT_SECONDS: Final = 60.0  # 512 handshakes queued on 2 cores
CALL_TIMEOUT_SECONDS: Final = 300.0  # one fan-out through the daemon
STARTUP_HOSTS: Final = (100, 1000)  # start-up to ready: flat in N is the target
STARTUP_RUNS: Final = 3
IDLE_CALLS: Final = 30  # single calls for the idle p50
LOADED_CALLS: Final = 30  # single calls while fan-outs run back to back
LOADED_MAX_SECONDS: Final = 30.0  # ... or fewer, when each waits behind a 512-host fan-out
LOADED_MIN_CALLS: Final = 5  # a p50 of fewer calls says nothing
FLEET_RSS_HOSTS: Final = 1000
AUDIT_FSYNC: Final = "always"  # the daemon's default

# The targets.
WARM_RATIO_TARGET: Final = 1.3  # warm, N = 128: sshadapter / raw asyncssh
ANSIBLE_RATIO_TARGET: Final = 15.0  # warm, N = 128: warm Ansible / sshadapter
COLD_RATIO_TARGET: Final = 1.5  # cold, N = 128: sshadapter / raw asyncssh cold
STARTUP_TARGET_SECONDS: Final = 1.0  # start-up to ready, 1,000 hosts
STARTUP_FLAT_TARGET: Final = 1.5  # 1,000 hosts / 100 hosts: "flat in N"
RSS_TARGET_MB: Final = 250.0  # 1,000 hosts connected
LOADED_P50_TARGET: Final = 3.0  # single call p50 during a 512-host fan-out / idle
THROUGHPUT_TARGET: Final = 800.0  # issue 22: warm fan-out hosts/s over 512 connected hosts
THROUGHPUT_N: Final = 512  # the throughput row's N
TARGET_N: Final = 128  # the ratio rows' N
LOADED_N: Final = 512  # the loaded-p50 row's N
# Issue 28's targets, at every RTT (the shipped defaults, one run).
RTT_WARM_TARGET: Final = 1.2  # warm fan-out: sshadapter / raw asyncssh
RTT_COLD_TARGET: Final = 1.3  # cold fan-out: sshadapter / raw asyncssh
FAIR_P50_TARGET: Final = 2.0  # a single call's p50 beside back-to-back fan-outs / idle
FAIR_RAW_TARGET: Final = 1.5  # that ratio / a raw exec's loaded / idle, same moment


@dataclass
class Timing:
    """One method's figures at one N: seconds, and how many hosts answered."""

    seconds: float = float("nan")
    ok: int = 0
    note: str = ""


@dataclass
class SizeResult:
    n: int
    rtt_ms: float = 0.0  # the latency proxy's round trip (0: straight to the fleet)
    fidelity: str = ""  # the proxy's ping-pong line
    proxy_cpu: float = float("nan")  # the proxy process's CPU seconds over the RTT's runs
    sshd_processes: int = 0
    rows: dict[str, Timing] = field(default_factory=dict)
    daemon_rss_mb: float = float("nan")
    daemon_fds: int = 0
    answer_bytes: int = 0
    warm_cpu_per_host: float = float("nan")  # daemon CPU seconds per host over warm fan-outs
    warm_sshd_cpu_per_host: float = float("nan")  # the fleet's sshd trees' CPU, the same way


# Raw asyncssh --------------------------------------------------------------------------


async def raw_connect(fleet: Fleet, alias: str) -> asyncssh.SSHClientConnection:
    host = fleet.host(alias)
    return await asyncssh.connect(
        host.address,
        host.port,
        config=None,
        username=fleet.user,
        client_keys=[RAW_KEYS[fleet.client_key]],
        known_hosts=RAW_KNOWN[fleet.known_hosts],
        agent_path=None,
        connect_timeout=CONNECT_TIMEOUT_SECONDS,
    )


RAW_KEYS: dict[Path, asyncssh.SSHKey] = {}  # each loaded once, as a sane client does
RAW_KNOWN: dict[Path, asyncssh.SSHKnownHosts] = {}


async def raw_exec(conn: asyncssh.SSHClientConnection) -> bool:
    result = await conn.run(COMMAND, check=False, stdin=asyncssh.DEVNULL)
    return result.exit_status == 0 and len(str(result.stdout).split()) == 5


async def raw_cold(fleet: Fleet) -> tuple[Timing, list[asyncssh.SSHClientConnection]]:
    """Every host connected at once (the issue's raw: no bound of the client's own), and
    one exec on each."""
    RAW_KEYS[fleet.client_key] = asyncssh.read_private_key(fleet.client_key)
    RAW_KNOWN[fleet.known_hosts] = asyncssh.read_known_hosts(str(fleet.known_hosts))
    conns: list[asyncssh.SSHClientConnection] = []

    async def one(alias: str) -> bool:
        conn = await raw_connect(fleet, alias)
        conns.append(conn)
        return await raw_exec(conn)

    started = time.perf_counter()
    done = await asyncio.gather(*(one(a) for a in fleet.aliases), return_exceptions=True)
    return Timing(time.perf_counter() - started, sum(d is True for d in done)), conns


async def raw_warm(conns: list[asyncssh.SSHClientConnection]) -> Timing:
    started = time.perf_counter()
    done = await asyncio.gather(*(raw_exec(c) for c in conns), return_exceptions=True)
    return Timing(time.perf_counter() - started, sum(d is True for d in done))


# sshadapter: one fan-out call on the group all-hosts ----------------------------------
FANOUT_METHOD: Final = "one fan-out call on the group all-hosts (run_on), fan-out policy below"
FANOUT_MAX_RESULTS: Final = 1000
LOAD_AVERAGE: Final = ROOT / "commands" / "load_average.toml"
FANOUT_TOOL: Final = "load_average_fleet"
# The bench's fan-out policy: every host in the answer and in flight at once (the daemon's
# max_fanout_hosts_in_flight bounds it again), so the call measures the daemon, not a cap.
FANOUT_TABLE: Final = """
[fanout]
max_hosts = 1000
concurrency = 1024
deadline_seconds = 120
max_results = 1000
"""  # FANOUT_MAX_RESULTS


@dataclass
class SshadapterSide:
    """A daemon serving the fleet, and what the calls need to reach it."""

    fleet: Fleet
    daemon: Daemon
    launched: float  # time.perf_counter() at launch
    tools: tuple[str, ...]  # the fan-out tool, then the single-host tool of the first host


def fleet_operation(targets: str, extra: str = "") -> str:
    """load_average.toml on ``targets`` instead of host "local"."""
    return LOAD_AVERAGE.read_text().replace('host = "local"', f"targets = {targets}") + extra


def write_sshadapter_files(fleet: Fleet, work: Path) -> tuple[Path, tuple[str, ...]]:
    """The daemon's config, the fleet's inventory file and two command files: the fan-out
    over all-hosts and a single-host operation on the first host; (config path, tools)."""
    commands = work / "commands"
    commands.mkdir()
    (commands / f"{FANOUT_TOOL}.toml").write_text(fleet_operation('["all-hosts"]', FANOUT_TABLE))
    first = fleet.aliases[0]
    (commands / "load_average_one.toml").write_text(
        LOAD_AVERAGE.read_text().replace('host = "local"', f'host = "{first}"')
    )
    inventory = work / "inventory.d"
    inventory.mkdir()
    fleet.write_inventory(
        inventory / "fleet.toml",
        max_connections=1,
        connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS,
    )
    config = work / "config.toml"
    config.write_text(daemon_config(work, fleet.aliases))
    return config, (FANOUT_TOOL, "load_average_one")


FANOUT_HOSTS: int | None = None
"""`--fanout-hosts`: the daemon's `max_fanout_hosts_in_flight` (None: the shipped default)."""


def daemon_config(work: Path, aliases: tuple[str, ...], schemas: Path = ROOT / "schemas") -> str:
    """[server], [paths], [audit], [metrics] for a bench daemon in ``work``."""
    in_flight = "" if FANOUT_HOSTS is None else f"max_fanout_hosts_in_flight = {FANOUT_HOSTS}\n"
    return f"""\
[server]
socket_path = "{work / "d.sock"}"
socket_mode = "0600"
allow = {{ uids = [{os.getuid()}] }}
max_queue = {len(aliases) + 64}
max_connections = {len(aliases) + 64}
{in_flight}
[paths]
commands = "commands"
schemas = "{schemas}"
inventory = "inventory.d"

[audit]
path = "{work / "audit.jsonl"}"
fsync = "{AUDIT_FSYNC}"
quarantine_dir = "{work / "quarantine"}"

[metrics]
listen = ""

"""


def launch(
    config: Path, work: Path, name: str, package: Path = ROOT, patches: str = ""
) -> tuple[Daemon, float]:
    """``sshadapter serve --config`` through daemon_patches.SERVE (dies with this process),
    the package imported from the tree ``package`` (another checkout, to compare), after
    ``patches`` (code run in the daemon first: profile_fleet.py's recorder)."""
    setup = {
        "parent": os.getpid(),
        "loop_log": str(work / "loop.json"),
        "patches": patches,
        "config": str(config),
    }
    log = work / "daemon.log"
    started = time.perf_counter()
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", SERVE, json.dumps(setup)],
            cwd=work,
            env={**os.environ, "PYTHONPATH": str(package)},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Daemon(name, AUDIT_FSYNC, work / "d.sock", process, log, work / "loop.json"), started


async def sshadapter_fanout(side: SshadapterSide, n: int, warm: bool) -> tuple[Timing, int]:
    """One fan-out call over the fleet's ``n`` hosts (the group all-hosts holds them all);
    (timing, answer bytes). ``warm``: the pool holds a connection to every host already
    (the first call after start is the cold one: the daemon connects lazily)."""
    del warm, n  # the same call either way: the pool's state is what differs
    conn = await AgentConn.open(side.daemon.socket)
    try:
        line = orjson.dumps({"op": "call", "tool": FANOUT_TOOL, "args": {"run_on": "all-hosts"}})
        started = time.perf_counter()
        async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
            conn.writer.write(line + b"\n")
            await conn.writer.drain()
            answer = await conn.reader.readline()
        seconds = time.perf_counter() - started
    finally:
        await conn.close()
    envelope = orjson.loads(answer)
    data = envelope.get("data") or {}
    note = "" if envelope.get("outcome") == "success" else f"top-level {envelope.get('error')}"
    if data.get("failed"):
        note = f"failures by code: {data.get('failures_by_code')}"
    return Timing(seconds, int(data.get("succeeded", 0)), note), len(answer)


async def start_sshadapter(fleet: Fleet, work: Path, patches: str = "") -> SshadapterSide:
    """A daemon serving the fleet, ready (its socket answers ``list``)."""
    config, tools = write_sshadapter_files(fleet, work)
    daemon, launched = launch(config, work, "fleet", patches=patches)
    await daemon.wait_ready()
    conn = await AgentConn.open(daemon.socket)
    conn.writer.write(b'{"op":"list"}\n')
    await conn.writer.drain()
    await conn.reader.readline()
    await conn.close()
    return SshadapterSide(fleet, daemon, launched, tools)


async def measure_sshadapter(
    fleet: Fleet, work: Path, result: SizeResult, sshd: CpuCgroup
) -> SshadapterSide:
    """COLD_ROUNDS daemons, each one cold fan-out; the last one's warm fan-outs after it."""
    n = len(fleet.hosts)
    colds = []
    for round_ in range(COLD_ROUNDS):
        here = work / f"round{round_}"
        here.mkdir()
        side = await start_sshadapter(fleet, here)
        colds.append((await sshadapter_fanout(side, n, warm=False))[0])
        if round_ < COLD_ROUNDS - 1:
            for warning in side.daemon.stop():
                print(f"  warning: {warning}")
    result.rows["sshadapter cold"] = median_timing(colds)
    cpu_before, sshd_before = side.daemon.cpu(), sshd.cpu()
    warm = [await sshadapter_fanout(side, n, warm=True) for _ in range(WARM_ROUNDS)]
    cpu_after, sshd_after = side.daemon.cpu(), sshd.cpu()
    answered = sum(t.ok for t, _ in warm)
    if answered:  # utime + stime of the daemon's process tree, per host that answered
        result.warm_cpu_per_host = (cpu_after - cpu_before) / answered
        result.warm_sshd_cpu_per_host = (sshd_after - sshd_before) / answered
    result.rows["sshadapter warm"] = median_timing([t for t, _ in warm])
    result.answer_bytes = warm[-1][1]
    result.daemon_rss_mb = proc_status(side.daemon.pid, "VmRSS") / 1e6
    result.daemon_fds = len(os.listdir(f"/proc/{side.daemon.pid}/fd"))
    return side


async def loaded_p50(side: SshadapterSide) -> tuple[float, float, int, float, float]:
    """(idle p50 ms, p50 ms while fan-outs run back to back, fan-outs run) of a single call,
    then the idle and loaded p50 ms of a raw asyncssh exec on the same host, interleaved.

    The single call is load_average_one on the first host, while fan-outs over every host
    (that one included) run back to back. The raw exec, on a connection of its own, shows
    what the same host and the same two cores give without the daemon."""
    tool = side.tools[1]
    n = len(side.fleet.hosts)
    raw = await raw_connect(side.fleet, side.fleet.aliases[0])

    async def raw_single() -> float:
        started = time.perf_counter()
        await raw_exec(raw)
        return (time.perf_counter() - started) * 1000

    async def single() -> float:
        conn = await AgentConn.open(side.daemon.socket)
        try:
            started = time.perf_counter()
            await conn.call(orjson.dumps({"op": "call", "tool": tool, "args": {}}) + b"\n")
            return (time.perf_counter() - started) * 1000
        finally:
            await conn.close()

    idle = [await single() for _ in range(IDLE_CALLS)]
    raw_idle = [await raw_single() for _ in range(IDLE_CALLS)]
    stop = asyncio.Event()
    fanouts = 0

    async def background() -> None:
        nonlocal fanouts
        while not stop.is_set():
            await sshadapter_fanout(side, n, warm=True)
            fanouts += 1

    runner = asyncio.create_task(background())
    await asyncio.sleep(0.05)
    loaded: list[float] = []
    raw_loaded: list[float] = []
    deadline = time.monotonic() + LOADED_MAX_SECONDS
    while len(loaded) < LOADED_CALLS and (
        len(loaded) < LOADED_MIN_CALLS or time.monotonic() < deadline
    ):
        loaded.append(await single())
        raw_loaded.append(await raw_single())
    stop.set()
    await runner
    raw.close()
    return (
        statistics.median(idle),
        statistics.median(loaded),
        fanouts,
        statistics.median(raw_idle),
        statistics.median(raw_loaded),
    )


# Ansible -------------------------------------------------------------------------------


def ansible_binary(explicit: str | None) -> Path | None:
    """``ansible`` from --ansible, else from the cached venv, installed there on first use."""
    if explicit:
        return Path(explicit)
    binary = ANSIBLE_VENV / "bin" / "ansible"
    if binary.exists():
        return binary
    print(f"installing ansible-core into {ANSIBLE_VENV} (once)", flush=True)
    ANSIBLE_VENV.parent.mkdir(parents=True, exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(ANSIBLE_VENV)], capture_output=True)
    pip = ANSIBLE_VENV / "bin" / "pip"
    if made.returncode or subprocess.run([pip, "install", "-q", "ansible-core"]).returncode:
        return None
    return binary if binary.exists() else None


def ansible_version(binary: Path) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    found = re.search(r"core ([0-9.]+)", out)
    return found[1] if found else "?"


def ansible_run(binary: Path, fleet: Fleet, work: Path) -> Timing:
    """One ad-hoc run over the fleet; control sockets in ``work/cp`` (reused if present)."""
    inventory = work / "inventory.ini"
    inventory.write_text(fleet.ansible_inventory())
    (work / "cp").mkdir(exist_ok=True)
    config = work / "ansible.cfg"  # empty: no ansible.cfg of the machine or the cwd applies
    config.write_text("")
    env = {
        **os.environ,
        "ANSIBLE_HOME": str(work / "home"),
        "ANSIBLE_LOCAL_TEMP": str(work / "tmp"),
        "ANSIBLE_SSH_CONTROL_PATH_DIR": str(work / "cp"),
        "ANSIBLE_HOST_KEY_CHECKING": "True",
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_NOCOLOR": "1",
    }
    argv = [str(binary), "fleet", "-i", str(inventory), "-m", "raw", "-a", COMMAND]
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [*argv, "-f", str(ANSIBLE_FORKS)],
            env=env,
            capture_output=True,
            text=True,
            timeout=ANSIBLE_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired:
        return Timing(float("nan"), 0, f"cut after {ANSIBLE_TIMEOUT_SECONDS:.0f} s")
    seconds = time.perf_counter() - started
    ok = len(re.findall(r"^\S+ \| CHANGED \| rc=0 >>", done.stdout, re.MULTILINE))
    note = "" if ok == len(fleet.hosts) else done.stdout[-300:] + done.stderr[-300:]
    return Timing(seconds, ok, note)


def ansible_masters_exit(work: Path) -> None:
    """Stop the ControlPersist masters this run started (``ssh -O exit`` on each socket)."""
    sockets = list((work / "cp").glob("*")) if (work / "cp").exists() else []
    stoppers = [
        subprocess.Popen(
            ["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "fleet-host"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for sock in sockets
    ]
    for stopper in stoppers:
        stopper.wait()


def measure_ansible(binary: Path, fleet: Fleet, work: Path, result: SizeResult) -> None:
    shutil.rmtree(work / "cp", ignore_errors=True)
    try:
        result.rows["Ansible cold"] = ansible_run(binary, fleet, work)
        result.rows["Ansible warm"] = ansible_run(binary, fleet, work)
    finally:
        ansible_masters_exit(work)


# Start-up with many hosts configured --------------------------------------------------


async def startup_seconds(hosts: int, work: Path) -> tuple[float, float]:
    """(median seconds from launch to a ``list`` answer, RSS MB) with ``hosts`` configured.

    The hosts are one inventory file sharing [host_defaults] (the daemon connects
    lazily, so nobody need listen); one command file runs on their group."""
    times, rss = [], 0.0
    for run in range(STARTUP_RUNS):
        here = work / f"startup-{hosts}-{run}"
        (here / "commands").mkdir(parents=True)
        (here / "inventory.d").mkdir()
        aliases = tuple(f"h{i + 1:04d}" for i in range(hosts))
        (here / "commands" / "load_average.toml").write_text(fleet_operation('["everyone"]'))
        tables = "".join(
            f'[hosts.{alias}]\naddress = "127.0.{i // 253}.{2 + i % 253}"\nport = 9\n\n'
            for i, alias in enumerate(aliases)
        )
        defaults = f'[host_defaults]\nuser = "nobody"\nknown_hosts = "{here / "known_hosts"}"\n'
        labels = 'labels = { fleet = "bench" }\n\n'
        group = '[groups.everyone]\nmatch = { fleet = "bench" }\n'
        (here / "inventory.d" / "fleet.toml").write_text(defaults + labels + tables + group)
        (here / "known_hosts").write_text("")
        config = here / "config.toml"
        config.write_text(daemon_config(here, aliases))
        daemon, launched = launch(config, here, f"startup-{hosts}")
        try:
            await daemon.wait_ready()
            conn = await AgentConn.open(daemon.socket)
            conn.writer.write(b'{"op":"list"}\n')
            await conn.writer.drain()
            await conn.reader.readline()
            times.append(time.perf_counter() - launched)
            await conn.close()
            rss = proc_status(daemon.pid, "VmRSS") / 1e6
        finally:
            daemon.stop()
    return statistics.median(times), rss


# The run --------------------------------------------------------------------------------


def median_timing(timings: list[Timing]) -> Timing:
    ordered = sorted(timings, key=lambda t: t.seconds)
    return ordered[len(ordered) // 2]


def proxied(fleet: Fleet, work: Path) -> tuple[Fleet, list[tuple[str, int, str, int]]]:
    """The fleet as seen through the latency proxy: every host on the same address (its
    certificate names it) and another port, pinned by a CA line for that port; and the
    proxy's (listen address, port, target address, port) pairs."""
    port = _fleet_port(len(fleet.hosts))
    hosts = tuple(dataclasses.replace(h, port=port) for h in fleet.hosts)
    seen = dataclasses.replace(fleet, hosts=hosts, port=port, known_hosts=work / "known_hosts")
    seen.write_known_hosts(seen.known_hosts)
    return seen, [(h.address, port, h.address, fleet.port) for h in fleet.hosts]


async def close_all(conns: list[asyncssh.SSHClientConnection]) -> None:
    for conn in conns:
        conn.close()
    for conn in conns:
        with contextlib.suppress(Exception):
            await conn.wait_closed()


async def measure_size(
    n: int, ansible: Path | None, work: Path, largest: int, rtts: tuple[float, ...]
) -> list[SizeResult]:
    """Every RTT on one fleet of ``n`` hosts: raw and sshadapter, cold and warm, each in
    the same run; the loaded p50 rows at the largest N."""
    results = []
    print(f"\nN = {n}: starting the fleet", flush=True)
    with running_fleet(n) as real:
        sshd = CpuCgroup("sshadapter-bench-fleet", real.sshd_pids)
        print(f"  the fleet's sshd CPU: {sshd.how}", flush=True)
        try:
            for rtt in rtts:
                here = work / f"rtt{rtt:g}"
                here.mkdir()
                result = SizeResult(n, rtt)
                proxy = None
                fleet = real
                if rtt:
                    fleet, pairs = proxied(real, here)
                    proxy = LatencyProxy(rtt, pairs, here)
                    result.fidelity = proxy.fidelity()
                    print(f"  {result.fidelity}", flush=True)
                try:
                    chosen = ansible if not rtt else None  # Ansible: loopback only
                    await measure_rtt(fleet, real, chosen, here, result, sshd, n == largest)
                finally:
                    if proxy is not None:
                        result.proxy_cpu = proxy.stop()
                results.append(result)
        finally:
            sshd.remove()
    return results


async def measure_rtt(
    fleet: Fleet,
    real: Fleet,
    ansible: Path | None,
    work: Path,
    result: SizeResult,
    sshd: CpuCgroup,
    loaded_row: bool,
) -> None:
    """One N at one RTT: raw cold (median of COLD_ROUNDS) and warm, sshadapter the same."""
    n = result.n
    result.sshd_processes = len(real.sshd_pids)
    colds = []
    for round_ in range(COLD_ROUNDS):
        cold, conns = await raw_cold(fleet)
        colds.append(cold)
        if round_ < COLD_ROUNDS - 1:
            await close_all(conns)
    result.rows["raw asyncssh cold"] = cold = median_timing(colds)
    result.rows["raw asyncssh warm"] = median_timing(
        [await raw_warm(conns) for _ in range(WARM_ROUNDS)]
    )
    await close_all(conns)
    print(f"  RTT {result.rtt_ms:g} ms: raw done ({cold.seconds:.2f} s cold)", flush=True)
    (work / "sshadapter").mkdir()
    side = await measure_sshadapter(fleet, work / "sshadapter", result, sshd)
    try:
        print("  sshadapter done", flush=True)
        if loaded_row:
            idle, loaded, fanouts, raw_idle, raw_loaded = await loaded_p50(side)
            result.rows["single call idle p50"] = Timing(idle / 1000, 1)
            result.rows["single call loaded p50"] = Timing(loaded / 1000, fanouts)
            result.rows["raw exec idle p50"] = Timing(raw_idle / 1000, 1)
            result.rows["raw exec loaded p50"] = Timing(raw_loaded / 1000, 1)
            print(f"  single calls: idle p50 {idle:.1f} ms, loaded p50 {loaded:.1f} ms")
            print(f"  raw exec, same host: idle {raw_idle:.1f} ms, loaded {raw_loaded:.1f} ms")
    finally:
        for warning in side.daemon.stop():
            print(f"  warning: {warning}")
    if ansible is not None:
        if skip := ansible_skip(n):
            result.rows["Ansible cold"] = Timing(note=skip)
        else:
            (work / "ansible").mkdir()
            measure_ansible(ansible, fleet, work / "ansible", result)
            print("  Ansible done", flush=True)


ANSIBLE_SECONDS_PER_HOST: list[float] = []  # cold + warm, from the sizes run so far


def ansible_skip(n: int) -> str:
    """Why Ansible is left out at ``n`` (its estimate exceeds the budget), or ""."""
    if not ANSIBLE_SECONDS_PER_HOST:
        return ""
    estimate = max(ANSIBLE_SECONDS_PER_HOST) * n
    if estimate <= ANSIBLE_BUDGET_SECONDS:
        return ""
    return f"skipped: cold + warm estimated {estimate:.0f} s > {ANSIBLE_BUDGET_SECONDS:.0f} s"


def fmt(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds:.3f}"


def report(results: list[SizeResult], startup: dict[int, tuple[float, float]]) -> None:
    print(f"\nsshadapter method: {FANOUT_METHOD}")
    methods = [
        "raw asyncssh cold",
        "raw asyncssh warm",
        "sshadapter cold",
        "sshadapter warm",
        "Ansible cold",
        "Ansible warm",
    ]
    print(f"\n  {'N':>5} {'sshd':>5}  " + "".join(f"{m:>19}" for m in methods))
    for r in results:
        cells = []
        for m in methods:
            t = r.rows.get(m, Timing())
            cells.append(f"{fmt(t.seconds):>12} ({t.ok:>4})" if t.ok else f"{fmt(t.seconds):>19}")
        print(f"  {r.n:>5} {r.sshd_processes:>5}  " + "".join(cells))
    print("  seconds (hosts that answered); warm = median of", WARM_ROUNDS, "rounds")
    for r in results:
        notes = [f"{m}: {t.note}" for m, t in r.rows.items() if t.note]
        extra = f"; {'; '.join(notes)}" if notes else ""
        print(
            f"  N = {r.n}: daemon RSS {r.daemon_rss_mb:.1f} MB, {r.daemon_fds} fds, "
            f"answers {r.answer_bytes} bytes, sshd CPU {r.warm_sshd_cpu_per_host * 1000:.3f} and "
            f"daemon CPU {r.warm_cpu_per_host * 1000:.3f} "
            f"ms per warm fan-out host{extra}"
        )
    print("\n  ratios in this run (N: sshadapter warm / raw warm, Ansible warm / sshadapter warm,")
    print("  sshadapter cold / raw cold)")
    for r in results:
        ratios = [
            ratio(r, "sshadapter warm", "raw asyncssh warm"),
            ratio(r, "Ansible warm", "sshadapter warm"),
            ratio(r, "sshadapter cold", "raw asyncssh cold"),
        ]
        print(f"  {r.n:>5}: " + "   ".join(f"{x:.2f}" for x in ratios))

    at = next((r for r in results if r.n == TARGET_N), None)
    loaded = next((r for r in results if "single call loaded p50" in r.rows), None)
    largest = max(results, key=lambda r: r.n) if results else None
    print("\nIssue 19 and 22 targets (one fan-out call)")
    rows: list[tuple[str, float, str, float, str]] = []
    if at is not None:
        rows += [
            (
                f"warm, N={TARGET_N}: sshadapter / raw",
                ratio(at, "sshadapter warm", "raw asyncssh warm"),
                "<=",
                WARM_RATIO_TARGET,
                "",
            ),
            (
                f"warm, N={TARGET_N}: Ansible / sshadapter",
                ratio(at, "Ansible warm", "sshadapter warm"),
                ">=",
                ANSIBLE_RATIO_TARGET,
                "",
            ),
            (
                f"cold, N={TARGET_N}: sshadapter / raw cold",
                ratio(at, "sshadapter cold", "raw asyncssh cold"),
                "<=",
                COLD_RATIO_TARGET,
                "first call after start: connects every host",
            ),
        ]
    else:
        print(f"  (no run at N = {TARGET_N}: the ratio rows need it)")
    if startup:
        big, small = startup[max(startup)], startup[min(startup)]
        rows += [
            (
                f"start-up to ready, {max(startup)} hosts (s)",
                big[0],
                "<=",
                STARTUP_TARGET_SECONDS,
                f"RSS {big[1]:.0f} MB; one inventory file, nothing connected",
            ),
            (
                f"start-up {max(startup)} / {min(startup)} hosts (flat)",
                big[0] / small[0],
                "<=",
                STARTUP_FLAT_TARGET,
                f"{small[0]:.3f} s at {min(startup)}",
            ),
        ]
    with_rss = [r for r in results if r.daemon_rss_mb == r.daemon_rss_mb]
    if len(with_rss) >= 2:  # RSS = base + slope x hosts, from the two largest N
        a, b = sorted(with_rss, key=lambda r: r.n)[-2:]
        slope = (b.daemon_rss_mb - a.daemon_rss_mb) / (b.n - a.n)
        estimate = b.daemon_rss_mb + slope * (FLEET_RSS_HOSTS - b.n)
        rows.append(
            (
                f"RSS, {FLEET_RSS_HOSTS} hosts connected (MB)",
                estimate,
                "<=",
                RSS_TARGET_MB,
                f"extrapolated, {slope * 1000:.0f} kB per host from N={a.n}, {b.n}",
            )
        )
    else:
        print(f"  (RSS at {FLEET_RSS_HOSTS} hosts: extrapolated from two sizes; one ran)")
    if loaded is not None:
        idle, busy = loaded.rows["single call idle p50"], loaded.rows["single call loaded p50"]
        rows.append(
            (
                f"single p50 during N={loaded.n} fan-outs / idle",
                busy.seconds / idle.seconds,
                "<=",
                LOADED_P50_TARGET,
                f"{busy.seconds * 1000:.1f} / {idle.seconds * 1000:.1f} ms, {busy.ok} fan-outs"
                + ("" if loaded.n == LOADED_N else f"; the target is at N={LOADED_N}"),
            )
        )
    throughput = throughput_row(largest)
    if throughput is not None:
        rows.append(throughput)
    if loaded is not None and "raw exec loaded p50" in loaded.rows:
        raw_idle, raw_busy = loaded.rows["raw exec idle p50"], loaded.rows["raw exec loaded p50"]
        print(
            f"  info  raw asyncssh exec on the same host beside the fan-outs: "
            f"{raw_busy.seconds * 1000:.1f} / {raw_idle.seconds * 1000:.1f} ms idle "
            f"= {raw_busy.seconds / raw_idle.seconds:.1f}x (the machine's share of the delay)"
        )
    width = max((len(r[0]) for r in rows), default=10)
    for label, measured, sense, target, detail in rows:
        met = measured <= target if sense == "<=" else measured >= target
        verdict = "PASS" if met and measured == measured else "MISS"
        shown = f"{measured:.3f}" if measured < 1e5 else f"{measured:.0f}"
        print(f"  {verdict}  {label:<{width}} {shown:>10} {sense} {target:g}  {detail}".rstrip())
    if largest is not None:
        print(
            f"  info  answer bytes, N={largest.n}: {largest.answer_bytes} "
            f"(bounded by [fanout] max_results: here every host, at most {FANOUT_MAX_RESULTS}; "
            "the default of 100 entries is about 16 KB)"
        )


def latency_report(results: list[SizeResult]) -> None:
    """Issue 28's table: each N and RTT, warm and cold, sshadapter beside raw; the single
    call beside fan-outs at each RTT; the proxy's fidelity and CPU."""
    print("\nIssue 28: fan-outs at each RTT (latency proxy), medians, same run")
    print("  | N | RTT | fan-out | sshadapter | raw | ratio | target |")
    print("  |---|---|---|---|---|---|---|")
    for r in results:
        for kind, target in (("warm", RTT_WARM_TARGET), ("cold", RTT_COLD_TARGET)):
            mine, base = (
                r.rows.get(f"sshadapter {kind}", Timing()),
                r.rows.get(f"raw asyncssh {kind}", Timing()),
            )
            x = ratio(r, f"sshadapter {kind}", f"raw asyncssh {kind}")
            verdict = "PASS" if x <= target else "MISS"
            print(
                f"  | {r.n} | {r.rtt_ms:g} ms | {kind} | {fmt(mine.seconds)} s ({mine.ok}) | "
                f"{fmt(base.seconds)} s ({base.ok}) | {x:.2f}x | {verdict} <= {target:g} |"
            )
    print("\n  | N | RTT | single call p50 idle / loaded | ratio | raw exec ratio | ours / raw |")
    print("  |---|---|---|---|---|---|")
    for r in results:
        if "single call loaded p50" not in r.rows:
            continue
        idle, busy = r.rows["single call idle p50"], r.rows["single call loaded p50"]
        raw_idle, raw_busy = r.rows["raw exec idle p50"], r.rows["raw exec loaded p50"]
        ours, raw = busy.seconds / idle.seconds, raw_busy.seconds / raw_idle.seconds
        verdicts = [
            "PASS" if ours <= FAIR_P50_TARGET else "MISS",
            "PASS" if ours / raw <= FAIR_RAW_TARGET else "MISS",
        ]
        print(
            f"  | {r.n} | {r.rtt_ms:g} ms | {idle.seconds * 1000:.1f} / "
            f"{busy.seconds * 1000:.1f} ms ({busy.ok} fan-outs) | {ours:.2f}x "
            f"{verdicts[0]} <= {FAIR_P50_TARGET:g} | {raw_idle.seconds * 1000:.1f} / "
            f"{raw_busy.seconds * 1000:.1f} ms = {raw:.2f}x | {ours / raw:.2f} "
            f"{verdicts[1]} <= {FAIR_RAW_TARGET:g} |"
        )
    for r in results:
        if r.fidelity:
            print(f"  N = {r.n}, {r.fidelity}; its CPU over the runs {r.proxy_cpu:.1f} s")
        print(
            f"  N = {r.n}, RTT {r.rtt_ms:g} ms: per warm host, daemon CPU "
            f"{r.warm_cpu_per_host * 1000:.2f} ms, the fleet's sshd "
            f"{r.warm_sshd_cpu_per_host * 1000:.2f} ms"
        )


def throughput_row(largest: SizeResult | None) -> tuple[str, float, str, float, str] | None:
    """Issue 22's row: warm hosts/s at the largest N, beside the daemon's CPU per host and the
    hosts/s that CPU allows the daemon alone on one core (is the daemon or the machine the
    limit?). None, said so, when N = THROUGHPUT_N was not run."""
    if largest is None:
        return None
    warm = largest.rows.get("sshadapter warm", Timing())
    hosts_per_second = warm.ok / warm.seconds if warm.ok else float("nan")
    cpu, sshd = largest.warm_cpu_per_host, largest.warm_sshd_cpu_per_host
    machine_bound = os.cpu_count() or 1
    detail = (
        f"N={largest.n}: {warm.ok} hosts in {fmt(warm.seconds)} s; daemon CPU "
        f"{cpu * 1000:.3f} ms/host (utime+stime over the warm fan-outs) = at most "
        f"{1 / cpu if cpu > 0 else float('nan'):.0f} hosts/s for the daemon alone on one core; "
        f"the fleet's sshd {sshd * 1000:.3f} ms/host: {machine_bound} cores allow at most "
        f"{machine_bound / (cpu + sshd) if cpu + sshd > 0 else float('nan'):.0f} hosts/s"
    )
    if largest.n != THROUGHPUT_N:
        print(f"  (no run at N = {THROUGHPUT_N}: the throughput row needs it)")
        print(f"  info  warm fan-out throughput {hosts_per_second:.0f} hosts/s, {detail}")
        return None
    return (
        f"warm fan-out throughput, {THROUGHPUT_N} connected hosts, hosts/s",
        hosts_per_second,
        ">=",
        THROUGHPUT_TARGET,
        detail,
    )


def ratio(r: SizeResult, top: str, bottom: str) -> float:
    a, b = r.rows.get(top, Timing()), r.rows.get(bottom, Timing())
    if not (a.ok and b.ok):
        return float("nan")
    return a.seconds / b.seconds


async def main(args: argparse.Namespace) -> None:
    global FANOUT_HOSTS
    FANOUT_HOSTS = args.fanout_hosts
    rtts = tuple(float(r) for r in args.rtts.split(","))
    sizes = (32,) if args.quick else tuple(int(s) for s in args.sizes.split(","))
    print(machine())
    if FANOUT_HOSTS is not None:
        print(f"daemon: max_fanout_hosts_in_flight = {FANOUT_HOSTS}")
    ansible = None if args.no_ansible else ansible_binary(args.ansible)
    if ansible is not None:
        print(
            f"Ansible: ansible-core {ansible_version(ansible)} ({ansible}), forks {ANSIBLE_FORKS}"
        )
    elif not args.no_ansible:
        print("Ansible: not available (pip install failed): its rows are left out")
    print(f"load average at start: {loadavg()}", flush=True)
    results: list[SizeResult] = []
    startup: dict[int, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sshadapter-bench-fleet-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        for n in sorted(sizes):
            here = work / f"n{n}"
            here.mkdir()
            try:
                by_rtt = await measure_size(n, ansible, here, max(sizes), rtts)
            except Exception as exc:  # a benchmark reports and goes on; it never fails
                print(f"  N = {n} did not finish: {type(exc).__name__}: {exc}", flush=True)
                continue
            results += by_rtt
            cold, warm = by_rtt[0].rows.get("Ansible cold"), by_rtt[0].rows.get("Ansible warm")
            if cold and warm and cold.ok and warm.ok:
                ANSIBLE_SECONDS_PER_HOST.append((cold.seconds + warm.seconds) / n)
        if not args.quick:
            for hosts in STARTUP_HOSTS:
                try:
                    startup[hosts] = await startup_seconds(hosts, work)
                except Exception as exc:
                    print(f"  start-up with {hosts} hosts failed: {exc}", flush=True)
    report([r for r in results if not r.rtt_ms], startup)
    latency_report(results)
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="N values")
    parser.add_argument("--quick", action="store_true", help="N = 32 only, no start-up rows")
    parser.add_argument(
        "--rtts",
        default=",".join(f"{r:g}" for r in DEFAULT_RTTS),
        help="round trips in ms through the latency proxy (0: straight to the fleet)",
    )
    parser.add_argument("--no-ansible", action="store_true", help="leave Ansible out")
    parser.add_argument("--ansible", help="an ansible binary to use instead of the cached venv")
    parser.add_argument(
        "--fanout-hosts",
        type=int,
        help="the daemon's max_fanout_hosts_in_flight (default: the shipped default)",
    )
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
