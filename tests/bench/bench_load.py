"""Issue 9 defect 6: do agents pulling big outputs slow everyone's small calls?

Run: ``python tests/bench/bench_load.py`` (about 2.2 min; ``--quick`` about 45 s).
A benchmark, not a test: it always exits 0 and prints PASS/FAIL per target.

One daemon (``--fsync``, default ``always`` as shipped) and raw asyncssh in this
process, both with 6 connections x 6 channels to the same real sshd. The small
call is ``bench_status`` (a 48-byte JSON document); the big one is ``bench_huge``,
an 8,400,000-byte JSON document of rows within its max_bytes (9 MiB), ``cat``
from a file. Each round runs four phases in a shuffled order:

  idle daemon   small calls through the daemon, nothing else running
  idle raw      small calls over raw asyncssh, nothing else running
  load daemon   4 agents pull bench_huge through the daemon back to back (threads
                in a helper process, big_pullers.py, so that reading 8.4 MB lines
                never delays this process's loop); small calls through the daemon
  load raw      4 raw asyncssh pulls of the same command back to back, in this
                process on the same pool; small calls over raw asyncssh. The raw
                client receives and decrypts the big outputs in the same event loop
                as its small calls, as the daemon does: what is left between the
                two is what the daemon adds (validation, the agent socket).

Small calls arrive as a Poisson process (mean interval 50 ms; each on an agent
connection of its own, at most 32 in flight), so they sample the load at random
moments instead of locking step with it, and the sample count does not shrink
when calls get slow. A load phase starts measuring once every puller has had
one answer.

Per round: (load daemon p90) / (idle daemon p90), target <= 3; and
(load daemon p90) / (load raw p90), target <= 10. The verdict is the median
over rounds (at least three).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness as h
from table import Row, print_rows

PULLERS: Final = 4  # issue 9 defect 6: "4 agents pull 8.4 MB outputs back to back"
PROBE_INTERVAL_S: Final = 0.05  # mean gap between small calls (Poisson arrivals)
PROBE_MAX_INFLIGHT: Final = 32  # = max_concurrent_calls: small calls never queue in the probe
PULLERS_START_TIMEOUT_S: Final = 120.0
TARGET_VS_IDLE: Final = 3.0
TARGET_VS_RAW: Final = 10.0
PHASES: Final = ("idle daemon", "idle raw", "load daemon", "load raw")


@dataclass(frozen=True)
class Plan:
    rounds: int
    probe_seconds: float


FULL: Final = Plan(rounds=5, probe_seconds=6.0)
QUICK: Final = Plan(rounds=3, probe_seconds=2.5)


@dataclass
class Sample:
    """One phase of one round."""

    small_ms: list[float] = field(default_factory=list)
    small_fails: Counter[str] = field(default_factory=Counter)
    big_ms: list[float] = field(default_factory=list)
    big_fails: int = 0
    big_wall: float = 0.0


async def probe(
    call: Callable[[int], Awaitable[str | None]], seconds: float, sample: Sample
) -> None:
    """Small calls at Poisson arrivals for ``seconds``; latencies into ``sample``."""
    rng = random.Random(11)
    slots = asyncio.Semaphore(PROBE_MAX_INFLIGHT)
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int) -> None:
        async with slots:
            ns, failure = await h.timed(call(n))
        if failure is None:
            sample.small_ms.append(ns / 1e6)
        else:
            sample.small_fails[failure] += 1

    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        task = asyncio.create_task(one(n))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        await asyncio.sleep(rng.expovariate(1 / PROBE_INTERVAL_S))
    await asyncio.gather(*tasks)


class AgentPool:
    """Idle agent connections to one daemon, one per small call in flight.

    A connection idle for REUSE_SECONDS is replaced rather than reused: the daemon
    closes idle ones (server.idle_timeout_seconds, 60 s by default).
    """

    REUSE_SECONDS: Final = 20.0

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self.idle: list[tuple[h.AgentConn, float]] = []

    async def fill(self, count: int) -> None:
        while len(self.idle) < count:
            self.idle.append((await h.AgentConn.open(self.socket), time.monotonic()))

    async def call(self, n: int) -> str | None:
        conn = None
        while self.idle and conn is None:
            conn, used = self.idle.pop()
            if time.monotonic() - used > self.REUSE_SECONDS:
                await conn.close()
                conn = None
        if conn is None:
            conn = await h.AgentConn.open(self.socket)
        try:
            failure = await conn.call(h.status_line(n))
        except BaseException:
            await conn.close()
            raise
        self.idle.append((conn, time.monotonic()))
        return failure

    async def close(self) -> None:
        for conn, _ in self.idle:
            await conn.close()
        self.idle.clear()


@contextlib.asynccontextmanager
async def daemon_pullers(daemon: h.Daemon, sample: Sample) -> Any:
    """big_pullers.py against ``daemon``, from its first answers until the block ends."""
    helper = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("big_pullers.py")),
            str(os.getpid()),
            str(daemon.socket),
            "bench_huge",
            str(PULLERS),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    assert helper.stdout is not None
    try:
        loop = asyncio.get_running_loop()
        first = await asyncio.wait_for(
            loop.run_in_executor(None, helper.stdout.readline), PULLERS_START_TIMEOUT_S
        )
        if first.strip() != b"started":
            raise RuntimeError(f"pullers did not start: {first[:300]!r} {daemon.tail()}")
        yield
    finally:
        if helper.poll() is None:
            helper.send_signal(signal.SIGTERM)
        out, _ = await asyncio.get_running_loop().run_in_executor(None, helper.communicate)
        lines = out.strip().splitlines()
        if lines:
            stats = json.loads(lines[-1])
            sample.big_ms = [1000 * s for s in stats["seconds"]]
            sample.big_fails = stats["failed"] + stats["closed"]
            sample.big_wall = stats["wall"]


@contextlib.asynccontextmanager
async def raw_pullers(env: h.Env, sample: Sample) -> Any:
    """PULLERS raw asyncssh pulls of bench_huge's command in this process, back to back."""
    command = env.commands.rows("bench_huge")
    stop = asyncio.Event()
    answered = [asyncio.Event() for _ in range(PULLERS)]

    async def pull(index: int) -> None:
        while not stop.is_set():
            ns, failure = await h.timed(env.raw.run(command, h.ROWS_EXPECT))
            if failure is None:
                sample.big_ms.append(ns / 1e6)
            else:
                sample.big_fails += 1
            answered[index].set()

    started = time.perf_counter()
    tasks = [asyncio.create_task(pull(i)) for i in range(PULLERS)]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(a.wait() for a in answered)), PULLERS_START_TIMEOUT_S
        )
        yield
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        sample.big_wall = time.perf_counter() - started


async def run_phase(env: h.Env, agents: AgentPool, phase: str, plan: Plan) -> Sample:
    sample = Sample()
    daemon = next(iter(env.daemons.values()))
    if phase.endswith("daemon"):
        call: Callable[[int], Awaitable[str | None]] = agents.call
    else:

        def call(n: int) -> Awaitable[str | None]:
            return env.raw.run(env.commands.status(n), h.STATUS_EXPECT)

    load: Any = contextlib.nullcontext()
    if phase == "load daemon":
        load = daemon_pullers(daemon, sample)
    elif phase == "load raw":
        load = raw_pullers(env, sample)
    async with load:
        await probe(call, plan.probe_seconds, sample)
    return sample


def p(values: list[float], q: float) -> float:
    return h.pct(values, q)


async def amain(args: argparse.Namespace) -> None:
    plan = QUICK if args.quick else FULL
    if args.rounds:
        plan = Plan(args.rounds, plan.probe_seconds)
    started = time.monotonic()
    print(h.machine())
    print(f"load at start: {h.loadavg()}")
    print(
        f"plan: {plan}; fsync = {args.fsync}; {PULLERS} pullers of {h.HUGE_BYTES:,} B "
        f"(max_bytes {h.HUGE_MAX_BYTES:,}); small calls every {1000 * PROBE_INTERVAL_S:.0f} ms "
        "on average",
        flush=True,
    )
    rng = random.Random(args.seed)
    rounds: list[dict[str, Sample]] = []
    async with h.bench_env([("load", args.fsync)]) as env:
        agents = AgentPool(env.daemons["load"].socket)
        try:
            await agents.fill(PROBE_MAX_INFLIGHT)
            for n in range(3 * PROBE_MAX_INFLIGHT):  # warm: the pool grows, paths get hot
                await agents.call(n)
                await env.raw.run(env.commands.status(n), h.STATUS_EXPECT)
            for r in range(plan.rounds):
                samples = {}
                for phase in h.shuffled(PHASES, rng):
                    samples[phase] = await run_phase(env, agents, phase, plan)
                rounds.append(samples)
                print(
                    f"  round {r + 1}/{plan.rounds}: "
                    + ", ".join(f"{ph} p90 {p(samples[ph].small_ms, 90):.1f} ms" for ph in PHASES)
                    + f"; load {h.loadavg()}; {time.monotonic() - started:.0f} s",
                    flush=True,
                )
        finally:
            await agents.close()
        print(f"raw pool: {env.raw.open_retries} refused channel opens retried")
    report(rounds)
    print(f"\nload at end: {h.loadavg()}; whole run {time.monotonic() - started:.0f} s")


def report(rounds: list[dict[str, Sample]]) -> None:
    print("\nsmall calls (ms) and big pulls, per phase over all rounds")
    print(
        f"  {'phase':<12} {'small n':>7} {'p50':>8} {'p90':>8} {'p99':>8} {'fail':>5} "
        f"{'big pulls':>9} {'big/s':>6} {'big p50 ms':>10} {'big fail':>8}"
    )
    for phase in PHASES:
        small = [x for r in rounds for x in r[phase].small_ms]
        big = [x for r in rounds for x in r[phase].big_ms]
        fails = sum(sum(r[phase].small_fails.values()) for r in rounds)
        wall = sum(r[phase].big_wall for r in rounds)
        big_fails = sum(r[phase].big_fails for r in rounds)
        rate = f"{len(big) / wall:6.2f}" if wall else f"{'-':>6}"
        print(
            f"  {phase:<12} {len(small):>7} {p(small, 50):>8.2f} {p(small, 90):>8.2f} "
            f"{p(small, 99):>8.2f} {fails:>5} {len(big):>9} {rate} "
            f"{p(big, 50) if big else float('nan'):>10.1f} {big_fails:>8}"
        )
    failures = {
        ph: dict(sum((r[ph].small_fails for r in rounds), Counter()))
        for ph in PHASES
        if any(r[ph].small_fails for r in rounds)
    }
    print(f"  failed small calls: {failures or 'none'}")

    vs_idle = [p(r["load daemon"].small_ms, 90) / p(r["idle daemon"].small_ms, 90) for r in rounds]
    vs_raw = [p(r["load daemon"].small_ms, 90) / p(r["load raw"].small_ms, 90) for r in rounds]
    print(
        "\nper round, load/idle and daemon/raw: "
        + ", ".join(f"{a:.2f} / {b:.2f}" for a, b in zip(vs_idle, vs_raw, strict=True))
    )

    def pooled(phase: str) -> float:
        return p([x for r in rounds for x in r[phase].small_ms], 90)

    print(
        f"all rounds pooled: {pooled('load daemon') / pooled('idle daemon'):.2f} / "
        f"{pooled('load daemon') / pooled('load raw'):.2f}"
    )
    rows = [
        Row(
            "small-call p90 under load / its p90 idle (daemon)",
            h.median(vs_idle),
            "<=",
            TARGET_VS_IDLE,
            "x",
            "rounds {}; p50 idle {:.1f} -> load {:.1f} ms".format(
                " ".join(f"{x:.1f}" for x in vs_idle),
                h.median(p(r["idle daemon"].small_ms, 50) for r in rounds),
                h.median(p(r["load daemon"].small_ms, 50) for r in rounds),
            ),
        ),
        Row(
            "small-call p90 under load, daemon / raw asyncssh",
            h.median(vs_raw),
            "<=",
            TARGET_VS_RAW,
            "x",
            "rounds {}; raw p50 {:.1f}, p90 {:.1f} ms".format(
                " ".join(f"{x:.1f}" for x in vs_raw),
                h.median(p(r["load raw"].small_ms, 50) for r in rounds),
                h.median(p(r["load raw"].small_ms, 90) for r in rounds),
            ),
        ),
    ]
    print_rows(f"issue 9 defect 6 targets (median of {len(rounds)} rounds)", rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 short rounds (about 45 s)")
    parser.add_argument("--rounds", type=int, default=0, help="override the number of rounds")
    parser.add_argument("--fsync", choices=h.FSYNC_MODES, default="always")
    parser.add_argument("--seed", type=int, default=7, help="shuffle seed")
    h.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
    sys.exit(0)  # a benchmark: PASS/FAIL is printed, never the exit status
