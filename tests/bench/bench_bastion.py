"""Issue 20: a call through one jump host (``via``) vs the same call direct, same run.

Two loopback OpenSSH sshds: the target, and a bastion locked down as docs/operations.md
"Bastions" says (tests/runners/test_ssh_bastion.py's key line and Match block). One SshRunner
has the target twice: ``direct`` and ``ci`` (``via = "edge"``); both warm, then calls
of ``true`` alternate between them, one at a time, and in rounds of ``--concurrency``
at once. Runner level, without the daemon: what the daemon adds is the same for both
paths, so this ratio is the stricter one. Target: p50 via / p50 direct <= 1.3 (warm).

    .venv/bin/python tests/bench/bench_bastion.py      (~20 s; --calls N)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Final

from harness import loadavg, machine, pct
from sshd import running_sshd
from table import Row, print_rows
from test_ssh_bastion import BASTION_MATCH, key_line

from sshadapter.runners.ssh.runner import SshRunner

TARGET_RATIO: Final = 1.3  # issue 20 "Speed"
CALL: Final = {"timeout": 30.0, "max_stdout": 1024, "max_stderr": 1024}


async def measure(runner: SshRunner, calls: int, concurrency: int) -> dict[str, list[float]]:
    """Per alias, the seconds of each call, the two aliases taking turns round by round."""
    times: dict[str, list[float]] = {"direct": [], "ci": []}

    async def one(alias: str) -> None:
        started = time.perf_counter()
        result = await runner.run(alias, "true", **CALL)
        assert result.exit_status == 0, result
        times[alias].append(time.perf_counter() - started)

    for _ in range(calls // concurrency):
        for alias in ("direct", "ci"):
            await asyncio.gather(*(one(alias) for _ in range(concurrency)))
    return times


async def bench(calls: int, concurrency: int) -> list[Row]:
    with running_sshd() as target, running_sshd(extra_config=BASTION_MATCH) as bastion:
        bastion.authorize(key_line(target))
        runner = SshRunner(
            {
                "edge": bastion.host_section(),
                "direct": target.host_section(),
                "ci": target.host_section(via="edge"),
            }
        )
        try:
            await runner.warm("direct")
            await runner.warm("ci")
            await measure(runner, 20, 1)  # spares, caches, the CPU's clock
            rows = []
            for n in (1, concurrency):
                times = await measure(runner, calls, n)
                direct, via = pct(times["direct"], 50), pct(times["ci"], 50)
                rows.append(
                    Row(
                        f"p50 via one hop / direct, {n} at once",
                        via / direct,
                        "<=",
                        TARGET_RATIO,
                        "x",
                        f"direct {direct * 1000:.2f} ms, via {via * 1000:.2f} ms, "
                        f"p99 {pct(times['direct'], 99) * 1000:.2f} / "
                        f"{pct(times['ci'], 99) * 1000:.2f} ms, {len(times['ci'])} calls each",
                    )
                )
            assert runner.connections().get("edge") == 1, runner.connections()
            return rows
        finally:
            await runner.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400, help="calls per path and round kind")
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    print(machine())
    print(f"load average at start: {loadavg()}")
    rows = asyncio.run(bench(args.calls, args.concurrency))
    print(f"load average at end: {loadavg()}")
    print_rows("Issue 20: one bastion hop", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
