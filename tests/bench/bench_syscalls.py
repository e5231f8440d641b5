"""System calls and loop turns per call: the daemon now, and with issue 22's send path undone.

Run: ``python tests/bench/bench_syscalls.py`` (about 20 s; needs strace). Counts, not
times: on this shared machine a count is the same under any load, so it shows what a
change to the call path does where a timing could not. One sshd and two daemons
(fsync never): the package as it is, and the same with the ``no-coalesce``,
``late-eof`` and ``close-first`` patches (daemon_patches.py), which put back one
send() per SSH packet, the EOF after the exec's reply and the end of a call at the
channel's close. ``strace -c -f`` is attached to each daemon for N calls at c=1 and
at c=32, after 20 warm-up calls; it prints the sends (to sshd and to the agents),
the loop's epoll_wait calls (its turns) and every system call, per call.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_ssh as b
import harness as h

VARIANTS: Final = (
    ("now", ()),
    ("before", ("no-coalesce", "late-eof", "close-first")),
)
SHOWN: Final = ("sendto", "recvfrom", "epoll_wait", "write", "getrandom", "getpid")


def counts(path: Path) -> dict[str, int]:
    """strace -c's table: calls per system call."""
    table: dict[str, int] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1].isidentifier():
            table[parts[-1]] = int(parts[3])
    return table


async def measure(env: h.Env, name: str, concurrency: int, calls: int, out: Path) -> dict[str, int]:
    callers, conns = await b.open_callers(env, [name], concurrency)
    try:
        for i in range(20):
            await callers[name][0](i)
        tracer = subprocess.Popen(
            ["strace", "-c", "-f", "-o", str(out), "-p", str(env.daemons[name].pid)],
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.0)  # attached to every thread
        remaining = calls

        async def worker(call: b.Call) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await call(remaining)

        await asyncio.gather(*(worker(c) for c in callers[name]))
        tracer.send_signal(signal.SIGINT)
        tracer.wait()
    finally:
        await b.close_all(conns)
    return counts(out)


async def amain(args: argparse.Namespace) -> None:
    if shutil.which("strace") is None:
        print("strace is not installed: apt-get install strace")
        return
    print(h.machine())
    daemons = [(name, "never") for name, _ in VARIANTS]
    patches = {name: list(p) for name, p in VARIANTS}
    with tempfile.TemporaryDirectory() as t:
        async with h.bench_env(daemons, patches) as env:
            for concurrency in (1, b.C32):
                print(f"\nc={concurrency}, {args.calls} calls; system calls per call (strace -c)")
                print(f"  {'daemon':<8} " + " ".join(f"{k:>10}" for k in SHOWN) + f" {'all':>7}")
                for name, _ in VARIANTS:
                    table = await measure(
                        env, name, concurrency, args.calls, Path(t) / f"{name}.{concurrency}"
                    )
                    per = {k: v / args.calls for k, v in table.items()}
                    print(
                        f"  {name:<8} "
                        + " ".join(f"{per.get(k, 0.0):>10.2f}" for k in SHOWN)
                        + f" {sum(per.values()):>7.1f}"
                    )
    print("\nsendto: SSH packets to sshd and answers to agents; epoll_wait: event-loop turns")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per daemon and concurrency")
    h.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
    sys.exit(0)
