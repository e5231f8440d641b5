"""Profile the daemon under one load of bench_ssh.py: where its CPU and memory go.

Run: ``python tests/bench/profile_ssh.py --load big --profile pyspy`` (needs
``pip install py-spy``), or ``--profile tracemalloc`` (the daemon runs under a
wrapper that starts tracemalloc and dumps the biggest live allocation sites at
the moment the traced memory peaks), or ``--profile none`` (RSS and CPU only,
e.g. with ``--env MALLOC_ARENA_MAX=2`` to test an allocator setting).
``--patch NAME`` applies an experimental fix from daemon_patches.py in the daemon;
``--with-raw`` interleaves raw asyncssh phases (the floor) with the daemon's. It
also prints the runner's time (stage 5, from the audit trail) against the
end-to-end latency, and the daemon's log volume.

Loads (the same operations, config and clients as bench_ssh.py):
  big        bench_big (1 MiB output) at concurrency 64
  status1    bench_status at concurrency 1
  status32   bench_status at concurrency 32
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ssh as b
from daemon_patches import PATCHED_SERVE, PATCHES
from sshd import running_sshd

from sshadapter.registry import load_registry

LOADS = {"big": (64, True), "status1": (1, False), "status32": (32, False)}

# Runs the daemon with tracemalloc on; SIGUSR1 writes the snapshot taken at the traced peak.
TRACED_SERVE = r"""
import signal, sys, tracemalloc, threading, time
tracemalloc.start(int(sys.argv[1]))
out = sys.argv[2]
best = {"peak": 0, "snap": None}

def watch():
    while True:
        time.sleep(0.02)
        current, _ = tracemalloc.get_traced_memory()
        if current > 32 * 2**20 and current > best["peak"] * 1.10:
            best["peak"] = current
            best["snap"] = tracemalloc.take_snapshot()

def dump(*_):
    snap = best["snap"]
    with open(out, "w") as f:
        f.write(f"traced peak (sampled) {best['peak'] / 2**20:.1f} MiB; "
                f"tracemalloc peak {tracemalloc.get_traced_memory()[1] / 2**20:.1f} MiB\n")
        if snap is not None:
            f.write("\n== by line ==\n")
            for stat in snap.statistics("lineno")[:25]:
                f.write(f"{stat.size / 2**20:8.1f} MiB {stat.count:8d}  {stat.traceback[0]}\n")
            f.write("\n== by traceback (top 8) ==\n")
            for stat in snap.statistics("traceback")[:8]:
                f.write(f"\n{stat.size / 2**20:8.1f} MiB {stat.count:8d}\n")
                for line in stat.traceback.format()[-16:]:
                    f.write(f"    {line}\n")

threading.Thread(target=watch, daemon=True).start()
signal.signal(signal.SIGUSR1, dump)
from sshadapter.cli import main
sys.exit(main(["serve", "--config", sys.argv[3]]))
"""


def summarize_collapsed(path: Path, top: int = 30) -> str:
    """Self and inclusive sample counts per function from py-spy's collapsed output."""
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


async def amain(args: argparse.Namespace) -> None:
    level, big = LOADS[args.load]
    with running_sshd() as sshd, tempfile.TemporaryDirectory(prefix="sshadapter-prof-") as t:
        tmp = Path(t)
        tmp.chmod(0o755)
        b.write_operations(tmp)
        registry = load_registry(tmp / "commands", tmp / "schemas", hosts=["bench"])
        config = b.write_config(tmp, sshd, "prof", args.fsync)
        env = {**os.environ, "PYTHONPATH": str(b.ROOT)}
        for item in args.env:
            key, _, value = item.partition("=")
            env[key] = value
        log = tmp / "daemon.log"
        dump = tmp / "tracemalloc.txt"
        if args.profile == "tracemalloc":
            argv = [sys.executable, "-c", TRACED_SERVE, str(args.frames), str(dump), str(config)]
        elif args.patch:
            code = "\n".join(PATCHES[name] for name in args.patch)
            argv = [sys.executable, "-c", PATCHED_SERVE, code, str(config)]
        else:
            argv = [sys.executable, "-m", "sshadapter.cli", "serve", "--config", str(config)]
        with open(log, "wb") as out:
            process = subprocess.Popen(
                argv,
                cwd=tmp,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        daemon = b.Daemon("sshadapter", process.pid, tmp / "prof.sock", process, log)
        spy = None
        try:
            await b.wait_ready(daemon, timeout=180)
            raw = await b.RawPool.open(sshd, b.POOL_CONNECTIONS, b.CHANNELS_PER_CONNECTION)
            bench = b.Bench(
                sshd,
                int((sshd.workdir / "sshd.pid").read_text()),
                registry.operations["bench_status"],
                registry.operations["bench_big"],
                raw,
                {"sshadapter": daemon},
                [],
                tmp / "unused",
            )
            for _ in range(2):  # warm: pool at full size, buffers grown
                await b.run_phase(bench, "sshadapter", max(level, 32), 128, big=big, record=False)
            rss0 = b.proc_status(daemon.pid, "VmRSS")
            b.reset_peak_rss(daemon.pid)
            if args.profile == "pyspy":
                collapsed = tmp / "pyspy.txt"
                spy = subprocess.Popen(
                    [
                        "py-spy",
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
                time.sleep(1.0)
            wall = 0.0
            for _ in range(args.phases):
                if args.with_raw:  # the floor, interleaved phase by phase
                    await b.run_phase(bench, "raw asyncssh", level, args.calls, big=big)
                w0 = time.perf_counter()
                await b.run_phase(bench, "sshadapter", level, args.calls, big=big)
                wall += time.perf_counter() - w0
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            acc = bench.accs[("sshadapter" + (" 1MiB" if big else ""), level)]
            print(
                f"load {args.load}: c={level}, {acc.calls} calls, {sum(acc.fails.values())} "
                f"failed, p50 {b.pct(acc.lat, 50):.2f} ms, p99 {b.pct(acc.lat, 99):.2f} ms, "
                f"{acc.calls / wall:.1f} calls/s, daemon CPU "
                f"{1000 * acc.daemon_cpu / acc.calls:.2f} ms/call, RSS before "
                f"{rss0 / 2**20:.1f} MiB, peak {acc.peak_rss / 2**20:.1f} MiB, env {args.env}, "
                f"patches {args.patch}"
            )
            if args.with_raw:
                raw_acc = bench.accs[("raw asyncssh" + (" 1MiB" if big else ""), level)]
                print(
                    f"raw asyncssh interleaved: p50 {b.pct(raw_acc.lat, 50):.2f} ms, "
                    f"p99 {b.pct(raw_acc.lat, 99):.2f} ms, {raw_acc.rate:.1f} calls/s"
                )
            results = [
                r
                for r in map(orjson.loads, (tmp / "audit-prof.jsonl").read_bytes().splitlines())
                if r.get("type") == "result"
            ][-acc.calls :]
            runner = sorted(r["attempts"][0]["duration_seconds"] * 1000 for r in results)
            if runner:
                median = runner[len(runner) // 2]
                print(
                    f"stage 5 (runner) duration from the audit: p50 {median:.2f} ms; "
                    f"end-to-end p50 minus it: {b.pct(acc.lat, 50) - median:.2f} ms"
                )
            lines = log.read_text(errors="replace").splitlines()
            print(f"daemon log: {log.stat().st_size:,} B, {len(lines):,} lines in all; last 6:")
            print("\n".join("  " + line[:150] for line in lines[-6:]))
            if args.profile == "tracemalloc":
                process.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and "== by traceback" not in (
                    dump.read_text() if dump.exists() else ""
                ):
                    time.sleep(0.5)
                time.sleep(2.0)
                print(dump.read_text() if dump.exists() else "no tracemalloc dump")
            if args.profile == "pyspy":
                print(summarize_collapsed(collapsed))
                if args.keep:
                    Path(args.keep).write_text(collapsed.read_text())
            await raw.close()
        finally:
            if spy is not None and spy.poll() is None:
                spy.kill()
            b.stop_daemon(daemon)
            with contextlib.suppress(OSError):
                tail = log.read_text().splitlines()[-5:]
                if any("Traceback" in line or "ERROR" in line for line in tail):
                    print("\n".join(tail))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", choices=sorted(LOADS), default="big")
    parser.add_argument("--profile", choices=["pyspy", "tracemalloc", "none"], default="none")
    parser.add_argument("--fsync", choices=["never", "always"], default="never")
    parser.add_argument("--calls", type=int, default=256, help="calls per phase")
    parser.add_argument("--phases", type=int, default=2)
    parser.add_argument(
        "--patch",
        action="append",
        default=[],
        choices=sorted(PATCHES),
        help="apply an experimental fix in the daemon process",
    )
    parser.add_argument(
        "--with-raw",
        action="store_true",
        help="interleave raw asyncssh phases (the floor) with the daemon's",
    )
    parser.add_argument("--frames", type=int, default=1, help="tracemalloc frames")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the daemon")
    parser.add_argument("--keep", default="", help="also save py-spy's collapsed stacks here")
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
    sys.exit(0)
