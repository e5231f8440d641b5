"""Issue 28 item 3: where the daemon's event loop time goes under a fleet fan-out.

Run: ``python tests/bench/profile_fleet.py`` (N = 512 at RTT 0; ``--n``, ``--rtt MS``
through latency_proxy.py; ``--keep DIR`` saves py-spy's stacks and cProfile's file).
Needs py-spy (``.venv/bin/pip install py-spy``: a tool of yours, not a project
dependency). A benchmark, not a test: it exits 0 and prints what it measured.

On one fleet (``tests/support/fleet_sshd.py``) and one daemon started as bench_fleet.py starts it
(the shipped defaults), four phases:

  cold       the first fan-out after start (every host connected), under py-spy
  warm       WARM_FANOUTS fan-outs over the connected fleet, under py-spy
  cProfile   WARM_FANOUTS more, under cProfile on the loop thread's CPU clock
  loaded     single calls on the first host while fan-outs run back to back, under the
             loop recorder (daemon_patches.LOOP_RECORDER): what a single call waits
             behind is the loop's callbacks inside its own window, wall and CPU

For cold and warm it prints the loop thread's CPU per host (``/proc/PID/task/PID/stat``
of the daemon's main thread, which runs the loop, user and kernel; the other threads,
e.g. the audit's fsync, apart) and py-spy's samples of that thread sorted into categories
(``CATEGORIES``: the innermost frame that matches decides, so orjson called by the audit
counts as json), each as a share and as ms per host. The two profilers err in opposite
ways, so both are printed: py-spy samples from outside (``--nonblocking``, the daemon at
full speed, no per-call cost) but counts a thread that is runnable and not running (another
process on its core) in the line it stopped at; cProfile on the thread's CPU clock counts
only CPU, but its own cost per call inflates the many small Python calls (the loop thread
costs ~4-5x its real CPU under it). The garbage collector's pauses (``GC_RECORDER``) are
printed per phase, and those inside the single calls' windows.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import pstats
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # fleet_sshd, sshd

import orjson
from bench_fleet import SshadapterSide, proxied, sshadapter_fanout, start_sshadapter
from fleet_sshd import running_fleet
from harness import AgentConn, loadavg, machine
from latency_proxy import LatencyProxy

WARM_FANOUTS: Final = 3
SAMPLE_RATE: Final = 1000  # py-spy samples per second: ~1 per ms of loop time
SPY_SETTLE_SECONDS: Final = 1.0  # py-spy attaches before the phase starts
LOADED_CALLS: Final = 30  # single calls beside the fan-outs
TICKS: Final = os.sysconf("SC_CLK_TCK")
TOP_LABELS: Final = 8
TOP_FUNCTIONS: Final = 25
GC_DUMP_SIGNAL: Final = signal.SIGRTMIN + 6  # daemon_patches uses +3 and +4
GC_MAX_RECORDS: Final = 100_000  # a bound on the recorder's own memory
GC_LOG: Final = "gc.json"  # in the daemon's working directory
CPROFILE_START_SIGNAL: Final = signal.SIGRTMIN + 7
CPROFILE_DUMP_SIGNAL: Final = signal.SIGRTMIN + 8
CPROFILE_LOG: Final = "cprofile.out"  # in the daemon's working directory

# Run in the daemon first (SERVE's patches): every collection of the cyclic garbage
# collector, (start ns CLOCK_MONOTONIC, wall ns, generation, the thread's CPU ns), written
# on GC_DUMP_SIGNAL.
# The clock is the system's, so the driver's phase and call windows slice it.
GC_RECORDER: Final = f"""
import gc, json, os, signal, time
_gc_started = [0, 0]
_gc_records = []

def _gc_timed(phase, info):
    if phase == "start":
        _gc_started[:] = time.monotonic_ns(), time.thread_time_ns()
    elif len(_gc_records) < {GC_MAX_RECORDS}:
        wall, cpu = time.monotonic_ns() - _gc_started[0], time.thread_time_ns() - _gc_started[1]
        _gc_records.append((_gc_started[0], wall, info["generation"], cpu))

def _gc_dump(*_):
    with open("{GC_LOG}.part", "w") as out:
        json.dump(_gc_records, out)
    os.replace("{GC_LOG}.part", "{GC_LOG}")

gc.callbacks.append(_gc_timed)
signal.signal({int(GC_DUMP_SIGNAL)}, _gc_dump)
"""

# Also run in the daemon first: cProfile of the loop thread, its clock the thread's CPU time,
# so a preemption (the thread runnable but another process on the core) counts nowhere,
# where py-spy's samples count it in the line the thread stopped at. cProfile's own cost per
# call inflates the many small Python calls: its shares are read beside py-spy's.
CPROFILER: Final = f"""
import cProfile, os, signal, time
_cprofile = cProfile.Profile(time.thread_time_ns, 1e-9)

def _cprofile_dump(*_):
    _cprofile.disable()
    _cprofile.dump_stats("{CPROFILE_LOG}.part")
    os.replace("{CPROFILE_LOG}.part", "{CPROFILE_LOG}")

signal.signal({int(CPROFILE_START_SIGNAL)}, lambda *_: _cprofile.enable())
signal.signal({int(CPROFILE_DUMP_SIGNAL)}, _cprofile_dump)
"""

# (category, a regular expression on a py-spy frame "function (file:line)"), tried from
# the innermost frame outwards; the first frame matching any category decides.
CATEGORIES: Final = (
    ("cipher (cryptography, AES-GCM, MAC)", r"cryptography|AESGCM|asyncssh/crypto/|asyncssh/mac"),
    ("json (orjson, strict_json, json)", r"orjson|strict_json|rfc8259|/json/"),
    ("logging", r"/logging/|sshadapter/daemon/logs\.py"),
    ("metrics (ours)", r"sshadapter/daemon/metrics\.py"),
    ("audit (ours)", r"sshadapter/daemon/(audit|records|offload)\.py"),
    ("judging (ours: contract, checks, projection)", r"sshadapter/contract/"),
    ("pacing (ours)", r"sshadapter/pacing\.py"),
    ("fan-out and service (ours)", r"sshadapter/daemon/"),
    ("SSH runner and pool (ours)", r"sshadapter/runners/"),
    ("sshadapter, other", r"sshadapter/"),
    ("asyncssh packets, channels, connection", r"asyncssh/"),
    ("socket send/recv, selector", r"selectors\.py|_SelectorSocketTransport|sock_|_socket|epoll"),
    ("asyncio loop and tasks", r"asyncio/"),
)
COMPILED: Final = tuple((name, re.compile(pattern)) for name, pattern in CATEGORIES)
OTHER: Final = "other (stdlib, interpreter)"


def thread_cpu(pid: int, tid: int) -> tuple[float, float]:
    """CPU seconds of one thread of a process: in user mode, in the kernel."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS  # fields 14 and 15 of stat(5)


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def categorize(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, pattern in COMPILED:
            if pattern.search(frame):
                return name
    return OTHER


def read_stacks(path: Path, loop_thread: str) -> list[tuple[list[str], int]]:
    """The loop thread's stacks from py-spy's raw output (``--threads``: each stack starts
    with its thread), each with its sample count."""
    stacks = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if frames and loop_thread in frames[0]:
            stacks.append((frames[1:], int(count)))
    return stacks


def report_profile(name: str, stacks: list[tuple[list[str], int]], hosts: int) -> None:
    """Shares by category and the top functions (self), as % and ms of loop time per host."""
    total = sum(count for _, count in stacks)
    if not total:
        print(f"  {name}: py-spy recorded no sample of the loop thread")
        return
    per_host = 1000 / SAMPLE_RATE / hosts  # ms per sample, per host
    by_category: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        by_category[categorize(frames)] += count
        by_function[frames[-1] if frames else "?"] += count
        for frame in set(frames):
            inclusive[re.sub(r":\d+\)$", ")", frame)] += count
    print(f"\n  {name}: {total} samples of the loop thread = {total * per_host:.3f} ms per host")
    print("  | category (innermost matching frame) | share | ms per host |")
    print("  |---|---|---|")
    for category, count in by_category.most_common():
        print(f"  | {category} | {100 * count / total:.1f} % | {count * per_host:.3f} |")
    print(f"\n  top {TOP_FUNCTIONS} functions by self samples (share, ms per host):")
    for function, count in by_function.most_common(TOP_FUNCTIONS):
        print(f"    {100 * count / total:5.1f} %  {count * per_host:.4f}  {function}")
    ours = [(f, c) for f, c in inclusive.items() if "sshadapter/" in f]
    print(f"\n  top {TOP_FUNCTIONS} of our functions, inclusive (share, ms per host):")
    for function, count in sorted(ours, key=lambda fc: -fc[1])[:TOP_FUNCTIONS]:
        print(f"    {100 * count / total:5.1f} %  {count * per_host:.4f}  {function}")


def report_cprofile(path: Path, hosts: int) -> None:
    """cProfile's own time per function (thread CPU) by category, and the top functions,
    with their calls per host."""
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    rows = [
        (f"{name} ({file}:{line})", calls, own)
        for (file, line, name), (_, calls, own, _, _) in stats.items()
    ]
    total = sum(own for _, _, own in rows) or 1.0
    by_category: collections.Counter[str] = collections.Counter()
    for where, _, own in rows:
        by_category[categorize([where])] += own
    print(f"\n  cProfile (thread CPU clock): {1000 * total / hosts:.3f} ms per host in all")
    print("  | category (the function itself) | share | ms per host |")
    print("  |---|---|---|")
    for category, own in by_category.most_common():
        print(f"  | {category} | {100 * own / total:.1f} % | {1000 * own / hosts:.3f} |")
    print(f"\n  top {TOP_FUNCTIONS} functions by own CPU (share, ms per host, calls per host):")
    ranked = sorted(rows, key=lambda r: -r[2])
    for where, calls, own in ranked[:TOP_FUNCTIONS]:
        share, per_host = 100 * own / total, 1000 * own / hosts
        print(f"    {share:5.1f} %  {per_host:.4f}  {calls / hosts:6.1f}  {where}")
    print(f"\n  top {TOP_FUNCTIONS} of our functions by own CPU:")
    for where, calls, own in [r for r in ranked if "sshadapter/" in r[0]][:TOP_FUNCTIONS]:
        share, per_host = 100 * own / total, 1000 * own / hosts
        print(f"    {share:5.1f} %  {per_host:.4f}  {calls / hosts:6.1f}  {where}")


async def cprofiled(side: SshadapterSide, n: int, keep: str) -> None:
    """WARM_FANOUTS warm fan-outs under CPROFILER; its report."""
    pid, log = side.daemon.pid, side.daemon.socket.parent / CPROFILE_LOG
    os.kill(pid, CPROFILE_START_SIGNAL)
    await asyncio.sleep(0.05)  # the handler runs at the daemon's next bytecode boundary
    hosts = 0
    for _ in range(WARM_FANOUTS):
        hosts += (await sshadapter_fanout(side, n, warm=True))[0].ok
    os.kill(pid, CPROFILE_DUMP_SIGNAL)
    for _ in range(500):
        if log.exists():
            break
        await asyncio.sleep(0.02)
    print(f"\nwarm under cProfile: {WARM_FANOUTS} fan-outs, {hosts} hosts answered")
    if log.exists():
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / CPROFILE_LOG).write_bytes(log.read_bytes())
        report_cprofile(log, max(hosts, 1))


class Spy:
    """py-spy recording the daemon (``--threads`` names the thread in each stack)."""

    def __init__(self, binary: str, pid: int, out: Path) -> None:
        self.out = out
        argv = [binary, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE)]
        argv += ["--format", "raw", "--output", str(out), "--nonblocking", "--threads"]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        _, err = self.process.communicate(timeout=120)
        if not self.out.exists():
            print(f"  py-spy wrote nothing: {err.decode(errors='replace')[-500:]}")


Window = tuple[int, int]  # CLOCK_MONOTONIC ns: start, end


async def profiled(
    name: str, args: argparse.Namespace, work: Path, fanouts: int, side: SshadapterSide
) -> tuple[Window, int]:
    """``fanouts`` fan-outs under py-spy: loop thread CPU per host, then the profile."""
    pid = side.daemon.pid
    spy = Spy(args.py_spy, pid, work / f"{name}.txt")
    await asyncio.sleep(SPY_SETTLE_SECONDS)
    (user0, system0), all0, hosts = thread_cpu(pid, pid), process_cpu(pid), 0
    started, begun = time.perf_counter(), time.monotonic_ns()
    try:
        for _ in range(fanouts):
            timing, _ = await sshadapter_fanout(side, args.n, warm=name != "cold")
            hosts += timing.ok
    finally:
        seconds, window = time.perf_counter() - started, (begun, time.monotonic_ns())
        spy.stop()
    user, system = thread_cpu(pid, pid)
    user, system = user - user0, system - system0
    loop_cpu, all_cpu, per = user + system, process_cpu(pid) - all0, 1000 / max(hosts, 1)
    print(
        f"\n{name}: {fanouts} fan-out(s), {hosts} hosts answered in {seconds:.2f} s; CPU per "
        f"host: loop thread {per * loop_cpu:.3f} ms ({per * user:.3f} user, {per * system:.3f} "
        f"kernel), other threads {per * (all_cpu - loop_cpu):.3f} ms (under py-spy)"
    )
    if spy.out.exists():
        if args.keep:
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            (Path(args.keep) / spy.out.name).write_text(spy.out.read_text())
        report_profile(name, read_stacks(spy.out, f"thread ({pid})"), max(hosts, 1))
    return window, hosts


async def waits_behind(side: SshadapterSide, n: int) -> list[Window]:
    """Single calls beside back-to-back fan-outs; per call, the loop's recorded callbacks
    (over 0.1 ms each) inside the call's window: busy ms, and by label overall."""
    tool, daemon = side.tools[1], side.daemon
    stop = asyncio.Event()

    async def background() -> None:
        while not stop.is_set():
            await sshadapter_fanout(side, n, warm=True)

    await daemon.loop_start()
    runner = asyncio.create_task(background())
    await asyncio.sleep(0.2)
    windows = []
    for _ in range(LOADED_CALLS):
        conn = await AgentConn.open(daemon.socket)
        started = time.monotonic_ns()
        await conn.call(orjson.dumps({"op": "call", "tool": tool, "args": {}}) + b"\n")
        windows.append((started, time.monotonic_ns()))
        await conn.close()
    stop.set()
    await runner
    records = await daemon.loop_dump()
    busy, longest = [], []
    labels: collections.Counter[str] = collections.Counter()
    cpu: collections.Counter[str] = collections.Counter()
    counts: collections.Counter[str] = collections.Counter()
    for start, end in windows:
        inside = [r for r in records if r[0] < end and r[0] + r[1] > start]
        busy.append(sum(min(r[0] + r[1], end) - max(r[0], start) for r in inside) / 1e6)
        longest.append(max((r[1] for r in inside), default=0) / 1e6)
        for r in inside:
            labels[r[3]] += r[1]
            cpu[r[3]] += r[2]
            counts[r[3]] += 1
    spans = [(end - start) / 1e6 for start, end in windows]
    print(
        f"\nloaded: {len(windows)} single calls beside back-to-back fan-outs: p50 "
        f"{statistics.median(spans):.1f} ms; loop busy (callbacks >= 0.1 ms) inside a call's "
        f"window p50 {statistics.median(busy):.1f} ms, its longest callback p50 "
        f"{statistics.median(longest):.2f} ms, max {max(longest):.2f} ms"
    )
    total = sum(labels.values()) or 1
    print(
        "  what the calls waited behind (callbacks inside their windows, by label; wall, and "
        f"the loop thread's CPU in it: {100 * sum(cpu.values()) / total:.0f} % of the wall):"
    )
    for label, ns in labels.most_common(TOP_LABELS):
        print(
            f"    {100 * ns / total:5.1f} %  {counts[label]:6d} callbacks, mean "
            f"{ns / counts[label] / 1e6:.2f} ms wall, {cpu[label] / counts[label] / 1e6:.2f} ms "
            f"CPU  {label}"
        )
    return windows


async def gc_report(
    side: SshadapterSide, phases: dict[str, tuple[Window, int]], calls: list[Window]
) -> None:
    """The collector's pauses (GC_RECORDER) in each phase: per generation, count, total and
    longest ms, and ms per host; for the loaded phase, inside the single calls' windows."""
    log = side.daemon.socket.parent / GC_LOG
    os.kill(side.daemon.pid, GC_DUMP_SIGNAL)
    for _ in range(500):
        if log.exists():
            break
        await asyncio.sleep(0.02)
    records = orjson.loads(log.read_bytes()) if log.exists() else []
    print("\ngarbage collector pauses (gc.callbacks), per phase and generation:")
    for name, ((start, end), hosts) in phases.items():
        for generation in (0, 1, 2):
            ran = [r for r in records if r[2] == generation and start <= r[0] < end]
            if ran:
                wall, cpu = sum(r[1] for r in ran) / 1e6, sum(r[3] for r in ran) / 1e6
                print(
                    f"  {name:<7} gen {generation}: {len(ran):5d} collections, {wall:8.1f} ms "
                    f"wall ({cpu:.1f} ms CPU), longest {max(r[1] for r in ran) / 1e6:6.1f} ms"
                    + (f", {cpu / hosts:.4f} ms CPU per host" if hosts else "")
                )
    inside = [r for r in records if any(s <= r[0] < e for s, e in calls)]
    spent = sum(e - s for s, e in calls)
    print(
        f"  inside the {len(calls)} single calls' windows: {len(inside)} collections "
        f"(gen 2: {sum(r[2] == 2 for r in inside)}), {sum(r[1] for r in inside) / 1e6:.1f} ms "
        f"of their {spent / 1e6:.0f} ms"
    )


async def main(args: argparse.Namespace) -> None:
    print(machine())
    print(f"load average at start: {loadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="sshadapter-profile-fleet-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        with running_fleet(args.n) as real:
            fleet, proxy = real, None
            if args.rtt:
                fleet, pairs = proxied(real, work)
                proxy = LatencyProxy(args.rtt, pairs, work)
                print(proxy.fidelity(), flush=True)
            try:
                (work / "d").mkdir()
                side = await start_sshadapter(fleet, work / "d", GC_RECORDER + CPROFILER)
                daemon = side.daemon
                try:
                    phases = {
                        "cold": await profiled("cold", args, work, 1, side),
                        "warm": await profiled("warm", args, work, WARM_FANOUTS, side),
                    }
                    await cprofiled(side, args.n, args.keep)
                    windows = await waits_behind(side, args.n)
                    phases["loaded"] = ((windows[0][0], windows[-1][1]), 0)
                    await gc_report(side, phases, windows)
                finally:
                    for warning in daemon.stop():
                        print(f"  warning: {warning}")
            finally:
                if proxy is not None:
                    proxy.stop()
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=512, help="fleet hosts")
    parser.add_argument("--rtt", type=float, default=0.0, help="ms through the latency proxy")
    parser.add_argument("--keep", default="", help="also save py-spy's and cProfile's data here")
    parser.add_argument(
        "--py-spy", default=str(Path(sys.executable).with_name("py-spy")), help="py-spy binary"
    )
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
