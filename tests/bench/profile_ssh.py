"""Profile one daemon under one load of the SSH benchmarks: where its CPU and memory go.

Run: ``python tests/bench/profile_ssh.py --load status1 --profile pyspy`` (needs py-spy:
``.venv/bin/pip install py-spy``, a tool of yours, not a project dependency), or
``--profile tracemalloc`` (the daemon starts tracemalloc and dumps the biggest live
allocation sites at the moment the traced memory peaked), or ``--profile none``
(latency, CPU and RSS only; with ``--env MALLOC_ARENA_MAX=2`` to try an allocator
setting). ``--patch NAME`` applies an experimental fix from daemon_patches.py in
the daemon; ``--with-raw`` interleaves raw asyncssh phases (the floor).

Loads (the operations, config and clients of harness.py):
  status1    bench_status, one caller, back to back
  status32   bench_status, 32 callers
  big1       bench_big (a 1 MiB result), one caller, back to back
  big64      bench_big, 64 callers
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h
from daemon_patches import PATCHES

LOADS: Final = {
    "status1": (1, "bench_status"),
    "status32": (32, "bench_status"),
    "big1": (1, "bench_big"),
    "big64": (64, "bench_big"),
}
TRACEMALLOC_DUMP_SIGNAL: Final = signal.SIGRTMIN + 5

# Run in the daemon with --profile tracemalloc: the snapshot taken at the traced peak is
# written to the daemon's directory on TRACEMALLOC_DUMP_SIGNAL.
TRACEMALLOC = f"""
import os, signal, threading, time, tracemalloc
tracemalloc.start(FRAMES)
_best = {{"peak": 0, "snap": None}}

def _watch():
    while True:
        time.sleep(0.02)
        current, _ = tracemalloc.get_traced_memory()
        if current > 32 * 2**20 and current > _best["peak"] * 1.10:
            _best["peak"] = current
            _best["snap"] = tracemalloc.take_snapshot()

def _dump(*_):
    snap = _best["snap"]
    with open("tracemalloc.txt.part", "w") as f:
        f.write(f"traced peak (sampled) {{_best['peak'] / 2**20:.1f}} MiB; "
                f"tracemalloc peak {{tracemalloc.get_traced_memory()[1] / 2**20:.1f}} MiB\\n")
        if snap is not None:
            f.write("\\n== by line ==\\n")
            for stat in snap.statistics("lineno")[:25]:
                where = stat.traceback[0]
                f.write(f"{{stat.size / 2**20:8.1f}} MiB {{stat.count:8d}}  {{where}}\\n")
            f.write("\\n== by traceback (top 8) ==\\n")
            for stat in snap.statistics("traceback")[:8]:
                f.write(f"\\n{{stat.size / 2**20:8.1f}} MiB {{stat.count:8d}}\\n")
                for line in stat.traceback.format()[-16:]:
                    f.write(f"    {{line}}\\n")
    os.replace("tracemalloc.txt.part", "tracemalloc.txt")

threading.Thread(target=_watch, daemon=True).start()
signal.signal({int(TRACEMALLOC_DUMP_SIGNAL)}, _dump)
"""


def summarize_collapsed(path: Path, top: int = 30) -> str:
    """Self and inclusive shares per function from py-spy's collapsed (raw) output."""
    self_counts: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        self_counts[frames[-1]] += count
        for frame in set(frames):
            incl[frame] += count
    out = [f"{total} samples (active threads only)", "\n== self =="]
    out += [f"{100 * c / total:6.1f} %  {f}" for f, c in self_counts.most_common(top)]
    out.append("\n== inclusive ==")
    out += [f"{100 * c / total:6.1f} %  {f}" for f, c in incl.most_common(top * 2)]
    return "\n".join(out)


async def phase(env: h.Env, method: str, level: int, tool: str, calls: int) -> list[int]:
    """``calls`` calls by ``level`` callers; latencies in ns (failures are reported)."""
    latencies: list[int] = []
    fails: Counter[str] = Counter()
    remaining = calls
    conns: list[h.AgentConn] = []
    if method != "raw":
        socket = next(iter(env.daemons.values())).socket
        conns = [await h.AgentConn.open(socket) for _ in range(level)]
    line = h.status_line(0) if tool == "bench_status" else h.call_line(tool)
    raw_command = env.commands.status(0) if tool == "bench_status" else env.commands.rows(tool)
    expect = h.STATUS_EXPECT if tool == "bench_status" else h.ROWS_EXPECT

    async def worker(conn: h.AgentConn | None) -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            call = conn.call(line) if conn is not None else env.raw.run(raw_command, expect)
            ns, failure = await h.timed(call)
            latencies.append(ns)
            if failure is not None:
                fails[failure] += 1

    callers: list[h.AgentConn | None] = [*conns] if conns else [None] * level
    await asyncio.gather(*(worker(c) for c in callers))
    for conn in conns:
        await conn.close()
    if fails:
        print(f"  {method}: failed calls {dict(fails)}")
    return latencies


async def amain(args: argparse.Namespace) -> None:
    level, tool = LOADS[args.load]
    for item in args.env:
        key, _, value = item.partition("=")
        os.environ[key] = value  # inherited by the daemon
    patches = list(args.patch)
    if args.profile == "tracemalloc":
        PATCHES["tracemalloc"] = TRACEMALLOC.replace("FRAMES", str(args.frames))
        patches.append("tracemalloc")
    print(f"load at start: {h.loadavg()}")
    async with h.bench_env([("prof", args.fsync)], {"prof": patches}) as env:
        daemon = env.daemons["prof"]
        for _ in range(2):  # warm: pool at full size, buffers grown
            await phase(env, "daemon", max(level, 32), tool, 128)
        rss0 = h.proc_status(daemon.pid, "VmRSS")
        h.reset_peak_rss(daemon.pid)
        spy = None
        collapsed = env.tmp / "pyspy.txt"
        if args.profile == "pyspy":
            spy = subprocess.Popen(
                [
                    args.py_spy,
                    "record",
                    "--pid",
                    str(daemon.pid),
                    "--rate",
                    str(args.rate),
                    "--format",
                    "raw",
                    "--output",
                    str(collapsed),
                    "--nonblocking",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)
        lat: list[int] = []
        raw_lat: list[int] = []
        wall = cpu = 0.0
        try:
            for _ in range(args.phases):
                if args.with_raw:
                    raw_lat += await phase(env, "raw", level, tool, args.calls)
                c0, w0 = daemon.cpu(), time.perf_counter()
                lat += await phase(env, "daemon", level, tool, args.calls)
                wall += time.perf_counter() - w0
                cpu += daemon.cpu() - c0
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
        peak = h.proc_status(daemon.pid, "VmHWM")
        print(
            f"load {args.load} (c={level}, {tool}), fsync {args.fsync}: {len(lat)} calls, "
            f"p50 {h.pct(lat, 50) / 1e6:.2f} ms, p99 {h.pct(lat, 99) / 1e6:.2f} ms, "
            f"{len(lat) / wall:.1f} calls/s, daemon CPU {1000 * cpu / len(lat):.2f} ms/call, "
            f"RSS before {rss0 / 2**20:.1f} MiB, peak {peak / 2**20:.1f} MiB, patches {patches}"
        )
        if raw_lat:
            print(
                f"raw asyncssh interleaved: p50 {h.pct(raw_lat, 50) / 1e6:.2f} ms, "
                f"p99 {h.pct(raw_lat, 99) / 1e6:.2f} ms"
            )
        if args.profile == "tracemalloc":
            os.kill(daemon.pid, TRACEMALLOC_DUMP_SIGNAL)
            dump = env.tmp / "tracemalloc.txt"
            deadline = time.monotonic() + 120
            while not dump.exists() and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
            print(dump.read_text() if dump.exists() else "no tracemalloc dump")
        if args.profile == "pyspy":
            if collapsed.exists():
                print(summarize_collapsed(collapsed))
                if args.keep:
                    Path(args.keep).write_text(collapsed.read_text())
            else:
                print("py-spy wrote nothing (is it installed? --py-spy PATH)")
    print(f"load at end: {h.loadavg()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=sorted(LOADS), default="status1")
    parser.add_argument("--profile", choices=["pyspy", "tracemalloc", "none"], default="none")
    parser.add_argument("--fsync", choices=h.FSYNC_MODES, default="never")
    parser.add_argument("--calls", type=int, default=500, help="calls per phase")
    parser.add_argument("--phases", type=int, default=2)
    parser.add_argument(
        "--patch",
        action="append",
        default=[],
        choices=sorted(PATCHES),
        help="apply an experimental fix in the daemon process",
    )
    parser.add_argument("--with-raw", action="store_true", help="interleave raw asyncssh phases")
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc frames")
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument(
        "--py-spy", default=str(Path(sys.executable).with_name("py-spy")), help="py-spy binary"
    )
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemon")
    parser.add_argument("--keep", default="", help="also save py-spy's collapsed stacks here")
    h.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
    sys.exit(0)
