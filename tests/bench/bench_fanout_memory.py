"""Issue 27 item 3: the daemon's peak RSS growth over one fan-out of large outputs.

Run: ``python tests/bench/bench_fanout_memory.py`` (N = 512 and 1,000; ~2 min each),
``--sizes 512``, ``--base DIR`` to run a second tree's package (a checkout of another
commit, e.g. ``git archive 5ed84bf sshadapter | tar -x -C DIR``) on the same fleet, one
daemon after the other. A benchmark, not a test: it always exits 0 and prints the
figures and PASS/MISS.

For each N, a fleet of N real OpenSSH hosts (``tests/support/fleet_sshd.py``), each printing
the same JSON document of ``--bytes`` (60 KB: a state and a list of lines) with
``cat``; the operation shows both fields (so a host's envelope is as large as its
output) and its answer keeps ``max_results`` = 4 entries. The daemon is ``sshadapter
serve`` as bench_fleet.py starts it, with the default ``max_fanout_hosts_in_flight``.
Two fan-outs of a small document first (``fleet_small``, the same operation on a
document of one line: the cold one connects every host, the second warms what is
left) so that no large output has grown the heap yet; then the peak RSS (VmHWM) is
reset to the current RSS (``/proc/PID/clear_refs``) and the large fan-out is made: its
growth is VmHWM after it minus VmRSS before it (then the same over a second one, as
information: the first grew its heap). The target is the issue's: under
3 x (hosts in flight x the output) + the answer's bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "support"))  # fleet_sshd, sshd

import orjson
from bench_fleet import CALL_TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS, daemon_config, launch
from fleet_sshd import Fleet, running_fleet
from harness import ROOT, AgentConn, loadavg, machine, proc_status, reset_peak_rss
from test_fanout import closed_schema

from sshadapter.config import DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT

DEFAULT_SIZES: Final = (512, 1000)
OUTPUT_BYTES: Final = 60_000  # the issue's: each host prints 60 KB
LINE_BYTES: Final = 100  # the document is a list of lines this long
MAX_RESULTS: Final = 4  # the answer of 4 entries
TOOL: Final = "fleet_lines"
SMALL_TOOL: Final = "fleet_small"  # the warm-up: the same operation on a one-line document
GROWTH_FACTOR: Final = 3  # the target: 3 x (hosts in flight x max output) + answer
HOSTS_IN_FLIGHT: Final = DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT  # the daemon's, left at its default

SCHEMA: Final = closed_schema(
    "fleet_lines",
    state={"enum": ["ok", "degraded"]},
    lines={"type": "array", "maxItems": 1000, "items": {"type": "string", "maxLength": 200}},
)


def operation(document: Path) -> str:
    """The fan-out over all-hosts: ``cat`` of the document, both fields shown."""
    return f"""
description = "A large document from every host, shown whole."
version = 1
targets = ["all-hosts"]
argv = ["cat", "{document}"]
timeout_seconds = 60
read_only = true
idempotent = true

[output]
format = "json"
schema = "fleet_lines.v1.json"
max_bytes = 65536

[fanout]
max_hosts = 1000
concurrency = 1024
deadline_seconds = 300
max_results = {MAX_RESULTS}

[agent]
fields = ["state", "lines"]
"""


def document(size: int) -> bytes:
    """``{"state": "ok", "lines": [...]}`` of about ``size`` bytes."""
    line = "x" * (LINE_BYTES - 3)  # each one, quoted with its comma, is LINE_BYTES
    return orjson.dumps({"state": "ok", "lines": [line] * (size // LINE_BYTES)})


@dataclass
class Figures:
    tree: str
    n: int
    answered: int = 0
    answer_bytes: int = 0
    cold_growth: int = 0
    growth: int = 0
    again: int = 0
    """The growth over the same large fan-out made once more (the heap already grown)."""
    rss_before: int = 0
    seconds: float = float("nan")
    note: str = ""


async def fan_out(socket: Path, tool: str = TOOL) -> tuple[int, int, str]:
    """One call on all-hosts: (hosts that answered, answer bytes, a note on failures)."""
    conn = await AgentConn.open(socket)
    try:
        line = orjson.dumps({"op": "call", "tool": tool, "args": {"run_on": "all-hosts"}})
        async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
            conn.writer.write(line + b"\n")
            await conn.writer.drain()
            answer = await conn.reader.readline()
    finally:
        await conn.close()
    data = orjson.loads(answer).get("data") or {}
    note = f"failures by code: {data.get('failures_by_code')}" if data.get("failed") else ""
    return int(data.get("succeeded", 0)), len(answer), note


async def measure(fleet: Fleet, work: Path, tree: str, package: Path, docs: Path) -> Figures:
    """A daemon of ``package`` on the fleet: two small fan-outs (cold, warm), the measured
    large one."""
    figures = Figures(tree, len(fleet.hosts))
    (work / "commands").mkdir(parents=True)
    (work / "schemas").mkdir()
    (work / "schemas" / "fleet_lines.v1.json").write_bytes(orjson.dumps(SCHEMA))
    (work / "commands" / f"{TOOL}.toml").write_text(operation(docs / "large.json"))
    (work / "commands" / f"{SMALL_TOOL}.toml").write_text(operation(docs / "small.json"))
    (work / "inventory.d").mkdir()
    fleet.write_inventory(
        work / "inventory.d" / "fleet.toml",
        max_connections=1,
        connect_timeout_seconds=CONNECT_TIMEOUT_SECONDS,
    )
    config = work / "config.toml"
    config.write_text(daemon_config(work, fleet.aliases, work / "schemas"))
    daemon, _ = launch(config, work, tree, package)
    try:
        await daemon.wait_ready()
        ready = proc_status(daemon.pid, "VmRSS")
        await fan_out(daemon.socket, SMALL_TOOL)  # cold: connects every host
        figures.cold_growth = proc_status(daemon.pid, "VmHWM") - ready
        await fan_out(daemon.socket, SMALL_TOOL)
        if not reset_peak_rss(daemon.pid):
            figures.note = "VmHWM not reset (no rights on clear_refs): growth is an upper bound"
        figures.rss_before = proc_status(daemon.pid, "VmRSS")
        started = time.perf_counter()
        figures.answered, figures.answer_bytes, note = await fan_out(daemon.socket)
        figures.seconds = time.perf_counter() - started
        figures.growth = proc_status(daemon.pid, "VmHWM") - figures.rss_before
        reset_peak_rss(daemon.pid)
        before = proc_status(daemon.pid, "VmRSS")
        await fan_out(daemon.socket)
        figures.again = proc_status(daemon.pid, "VmHWM") - before
        figures.note = "; ".join(x for x in (figures.note, note) if x)
    finally:
        for warning in daemon.stop():
            print(f"  warning: {warning}")
    return figures


def report(all_figures: list[Figures], output_bytes: int) -> None:
    print(
        f"\nOne fan-out, every host printing {output_bytes} bytes, answer of {MAX_RESULTS} "
        f"entries; hosts in flight = max_fanout_hosts_in_flight ({HOSTS_IN_FLIGHT})"
    )
    print(
        f"  {'tree':<8} {'N':>5} {'answered':>8} {'RSS before MB':>13} {'growth MB':>9} "
        f"{'bound MB':>8} {'again MB':>8} {'cold growth MB':>14} {'s':>6}"
    )
    for f in all_figures:
        bound = GROWTH_FACTOR * HOSTS_IN_FLIGHT * output_bytes + f.answer_bytes
        verdict = "PASS" if f.growth < bound and f.answered == f.n else "MISS"
        print(
            f"{verdict} {f.tree:<8} {f.n:>5} {f.answered:>8} {f.rss_before / 1e6:>13.1f} "
            f"{f.growth / 1e6:>9.2f} {bound / 1e6:>8.2f} {f.again / 1e6:>8.2f} "
            f"{f.cold_growth / 1e6:>14.1f} "
            f"{f.seconds:>6.2f}  {f.note}".rstrip()
        )
    print(
        f"  bound = {GROWTH_FACTOR} x ({HOSTS_IN_FLIGHT} hosts in flight x {output_bytes} "
        "bytes) + the answer's bytes; growth = VmHWM after the first large fan-out - VmRSS "
        "before it; again = the same over a second large fan-out (info: a heap already "
        "grown by the first); cold growth = VmHWM after the first small fan-out (connecting "
        "every host) - VmRSS at ready (info)"
    )


async def main(args: argparse.Namespace) -> None:
    sizes = tuple(int(s) for s in args.sizes.split(","))
    trees = [("this", ROOT)]
    if args.base is not None:
        trees.append(("base", Path(args.base).resolve()))
    print(machine())
    for name, package in trees:
        print(f"tree {name}: {package}")
    print(f"load average at start: {loadavg()}", flush=True)
    figures: list[Figures] = []
    with tempfile.TemporaryDirectory(prefix="sshadapter-bench-fanout-memory-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)  # the fleet's login account reads the document
        docs = work / "documents"
        docs.mkdir(mode=0o755)
        (docs / "large.json").write_bytes(document(args.bytes))
        (docs / "small.json").write_bytes(document(LINE_BYTES))
        for doc in docs.iterdir():
            doc.chmod(0o644)
        output_bytes = (docs / "large.json").stat().st_size
        for n in sizes:
            print(f"\nN = {n}: starting the fleet", flush=True)
            try:
                with running_fleet(n) as fleet:
                    for name, package in trees:
                        found = await measure(fleet, work / f"n{n}-{name}", name, package, docs)
                        print(
                            f"  {name}: growth {found.growth / 1e6:.2f} MB, "
                            f"{found.answered}/{n} answered",
                            flush=True,
                        )
                        figures.append(found)
            except Exception as exc:  # a benchmark reports and goes on; it never fails
                print(f"  N = {n} did not finish: {type(exc).__name__}: {exc}", flush=True)
    report(figures, output_bytes)
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="N values")
    parser.add_argument("--bytes", type=int, default=OUTPUT_BYTES, help="each host's output")
    parser.add_argument("--base", help="another tree whose package runs too, on the same fleet")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
