"""Issue 29: what judging costs for each catalog operation, beside ``orjson.loads``.

Run: ``python tests/bench/bench_catalog.py`` (about 30 s; ``--budget S``). A benchmark,
not a test: it exits 0 and prints figures (the issue asks for them, it sets no target).

Every operation under ``sshadapter/catalog/<family>/`` (found there, so operations added
to any family are measured too), loaded as the daemon loads it: a configuration with
every family on (``actions`` too, with one listed unit, and one listed certificate path,
so the closed sets are injected). For each, its largest accepted fixture: a real output,
since every accepted catalog fixture is one (PROVENANCE.md beside it). Judging is what
the daemon does with a successful call's bytes (bench_offline.py's ``stage``):
``evaluate`` (stages 6-10) + ``seal`` + ``orjson.dumps``, with the fixture's arguments.
The floor is ``orjson.loads`` of an equivalent JSON document: for a ``json`` or
``jsonl`` operation the same bytes, for a text extractor the value it extracts, as
JSON. Both are timed in the same run, interleaved and shuffled call by call
(bench_offline.run_interleaved: medians of thread CPU time).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Final

import orjson

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tests" / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "support"))

from bench_offline import REQUEST_ID, run_interleaved  # noqa: E402
from harness import loadavg, machine  # noqa: E402

from sshadapter.catalog import catalog_operation_files  # noqa: E402
from sshadapter.check.fixtures import Fixture, load_fixtures  # noqa: E402
from sshadapter.config import load_config  # noqa: E402
from sshadapter.contract.evaluate import evaluate, seal  # noqa: E402
from sshadapter.contract.registry import Operation  # noqa: E402
from sshadapter.daemon.server import load  # noqa: E402
from sshadapter.runners.interface import RunResult  # noqa: E402

# Every family on, the closed sets given one value each (a fixture's listed argument takes
# the first value the configuration lists: docs/fixtures.md "Catalog cases").
CONFIG: Final = """[paths]
commands = "commands"
schemas = "schemas"

[approvals]
uids = [0]

[hosts.local]
address = "127.0.0.1"
user = "sshadapter"
known_hosts = "known_hosts"
dispatch = true

[catalog]
families = ["all", "actions"]

[catalog.actions]
targets = ["local"]
units = ["nginx.service"]

[catalog.maintenance]
certificate_paths = ["/etc/ssl/certs/catalog-bench.pem"]
"""
BUDGET_S: Final = 30.0


@dataclass(frozen=True)
class Case:
    """One operation's largest accepted fixture and its floor document."""

    family: str
    op: Operation
    fixture: Fixture
    floor_input: bytes
    """The equivalent JSON document ``orjson.loads`` parses."""


def largest_accepted(op: Operation) -> Fixture | None:
    """The accepted fixture with the most stdout bytes (None: the operation has none)."""
    accepted = [f for f in load_fixtures(op) if f.expect["outcome"] == "success"]
    return max(accepted, key=lambda f: (len(f.stdout), f.case), default=None)


def equivalent_json(op: Operation, stdout: bytes) -> bytes:
    """The same facts as one JSON document: the bytes themselves for JSON formats, else the
    value the text extractor makes of them."""
    if op.spec.output.format in ("json", "jsonl"):
        return stdout if op.spec.output.format == "json" else orjson.dumps(op.parser.parse(stdout))
    return orjson.dumps(op.parser.parse(stdout))


def judge(op: Operation, fixture: Fixture) -> bytes:
    """What the daemon does with the bytes of a successful call: stages 6-10, seal, serialize."""
    run = RunResult(fixture.stdout, fixture.stderr, fixture.exit_status)
    sealed = seal(op, REQUEST_ID, evaluate(op, fixture.args, run, fixture.now))
    if sealed["outcome"] != "success":  # the fixture is accepted by check: a broken tree
        raise SystemExit(f"{op.name}/{fixture.case}: not accepted ({sealed['error']['code']})")
    return orjson.dumps(sealed)


def catalog_operations() -> dict[str, Operation]:
    """Every catalog operation, loaded through the daemon's loader with every family on."""
    with tempfile.TemporaryDirectory() as directory:
        base = Path(directory)
        for name in ("commands", "schemas"):
            (base / name).mkdir()
        (base / "known_hosts").write_text("")
        (base / "config.toml").write_text(CONFIG)
        config, _ = load_config(base / "config.toml")
        loaded = load(config, str(base / "config.toml"))
    return dict(loaded.registry.operations)


def cases() -> list[Case]:
    found = []
    operations = catalog_operations()
    for path in catalog_operation_files():
        op = operations[path.stem]
        fixture = largest_accepted(op)
        if fixture is None:
            print(f"  {path.parent.name}/{op.name}: no accepted fixture, not measured")
            continue
        found.append(Case(path.parent.name, op, fixture, equivalent_json(op, fixture.stdout)))
    return found


def measure(found: list[Case], budget_s: float) -> dict[tuple[str, str], float]:
    timed: dict[tuple[str, str], Any] = {}
    for case in found:
        timed[(case.op.name, "judge")] = partial(judge, case.op, case.fixture)
        timed[(case.op.name, "floor")] = partial(orjson.loads, case.floor_input)
    return run_interleaved(timed, budget_s)


def print_table(found: list[Case], medians: dict[tuple[str, str], float]) -> None:
    head = ("family", "operation", "fixture", "format", "stdout B", "json B", "judge µs")
    print(
        f"\n  {head[0]:<9} {head[1]:<16} {head[2]:<20} {head[3]:<6} {head[4]:>9} {head[5]:>8}"
        f" {head[6]:>9} {'orjson.loads µs':>16} {'ratio':>7}"
    )
    ratios = []
    for case in found:
        judge_us = medians[(case.op.name, "judge")] / 1000
        floor_us = medians[(case.op.name, "floor")] / 1000
        ratios.append(judge_us / floor_us)
        print(
            f"  {case.family:<9} {case.op.name:<16} {case.fixture.case:<20} "
            f"{case.op.spec.output.format:<6} {len(case.fixture.stdout):>9} "
            f"{len(case.floor_input):>8} {judge_us:>9.1f} {floor_us:>16.2f} {ratios[-1]:>7.1f}"
        )
    if ratios:
        ordered = sorted(ratios)
        print(
            f"\n  {len(ratios)} operations; ratio judge / orjson.loads: min {ordered[0]:.1f}, "
            f"median {ordered[len(ordered) // 2]:.1f}, max {ordered[-1]:.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds of timing")
    args = parser.parse_args()
    print(f"sshadapter catalog judging, {machine()}")
    print(f"load average at start: {loadavg()}", flush=True)
    found = cases()
    medians = measure(found, args.budget)
    print_table(found, medians)
    print(f"\nload average at end: {loadavg()}")


if __name__ == "__main__":
    main()
    sys.exit(0)  # a benchmark: figures are printed, never the exit status
