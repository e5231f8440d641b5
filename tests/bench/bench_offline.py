"""Benchmark of the offline stage (docs/protocol.md "Stages", 6-10 + seal).

Run: ``python tests/bench/bench_offline.py`` (about 1 min; ``--quick`` about 15 s).
A benchmark, not a test: it always exits 0 and prints PASS/FAIL per target.
``bench_ssh.py`` runs ``measure()`` too and puts its figures in issue 13's table; the
same rows are issue 22's offline targets (the same thresholds).

"Stage" is what the daemon does with the bytes of one successful call, through
the package's public functions: ``evaluate()`` + ``seal()`` +
``orjson.dumps(envelope)``. Each is timed against a floor measured in the same
run, interleaved round by round, call by call in a shuffled order, so machine
noise hits every case alike (medians of single calls, GC on as in the daemon;
thread CPU time, see ``run_interleaved``). Three operations, loaded with ``load_registry``:

  bench_rows   JSON rows with 11 fields each (patterns, enums, date-times),
               checks.equal and checks.fresh; at ~1 KB, ~100 KB, ~1 MB.
  mounts       the shipped schemas/mount_info.v2.json ($ref, long-string patterns)
               with maxItems raised; at ~1 KB, ~100 KB, ~1 MB.
  df_rows      a ``lines`` extractor: the shipped disk_usage header and row regex
               with its 4 integer conversions, shape rows; 1k and 10k lines.

The floor is ``orjson.loads`` of the same bytes; for ``lines`` it is
``orjson.loads`` of the same rows as a JSON document. The full run adds the naive
pipeline (``json.loads`` + a ``jsonschema`` Draft 2020-12 validator, formats on)
and a breakdown of the stage at 100 KB.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any, Final

import jsonschema
import orjson

ROOT: Final = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(ROOT / "tests" / "bench"))

import parser_cost  # noqa: E402
from table import Row, print_rows  # noqa: E402

from sshadapter import strict_json  # noqa: E402
from sshadapter.contract.evaluate import evaluate, seal  # noqa: E402
from sshadapter.contract.registry import Operation, Registry, load_registry  # noqa: E402
from sshadapter.runners.interface import RunResult  # noqa: E402

BUDGET_S: Final = 40.0  # the main comparison; the breakdown gets a quarter of that
QUICK_BUDGET_S: Final = 8.0
MIN_ROUNDS, MAX_ROUNDS = 5, 400
SLICE_NS: Final = 2_000_000  # per case per round: ~2 ms of calls (at least one)
CLOCK_CALIBRATION_PAIRS: Final = 2001
JSON_SIZES: Final = {"1 KB": 1_000, "100 KB": 100_000, "1 MB": 1_000_000}
LINE_COUNTS: Final = {"1k lines": 1_000, "10k lines": 10_000}
NOW: Final = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
ARGS: Final = {"project_id": "proj-alpha"}
REQUEST_ID: Final = "req.benchBENCHbench23"

# Issues 13's and 22's targets for this stage (issue 22 keeps 13's thresholds).
TARGET_1KB_US: Final = 25.0
TARGET_100KB_RATIO: Final = 3.0
TARGET_LINES_RATIO: Final = 6.0

BENCH_ROWS_TOML: Final = """\
description = "Benchmark: rows observed for one project."
version = 1
host = "bench"
argv = ["bench-cli", "rows", "--json", "--project", "{project_id}"]
idempotent = true

[params.project_id]
type = "string"
pattern = '^[a-z0-9][a-z0-9-]{2,62}$'
maxLength = 63

[output]
format = "json"
schema = "bench_rows.v1.json"
max_bytes = 2097152
max_depth = 16

[checks]
equal = { project_id = "project_id" }
fresh = { field = "observed_at", max_age_seconds = 300, max_skew_seconds = 30 }

[agent]
fields = ["project_id", "observed_at", "rows"]
"""

MOUNTS_TOML: Final = """\
description = "Benchmark: findmnt -J output, the shipped mount_info schema with room for rows."
version = 1
host = "bench"
argv = ["findmnt", "-J", "-o", "TARGET,SOURCE,FSTYPE,OPTIONS"]
idempotent = true

[output]
format = "json"
schema = "mount_info.v2.json"
max_bytes = 2097152
max_depth = 8

[agent]
fields = ["filesystems"]
"""

DF_HEADER: Final = "Filesystem     1024-blocks      Used Available Capacity Mounted on"
_SHIPPED_DF: Final = tomllib.loads((ROOT / "commands" / "disk_usage.toml").read_text())["output"]
DF_ROWS_TOML: Final = (
    """\
description = "Benchmark: df -P rows through the lines extractor (the shipped disk_usage regex)."
version = 1
host = "bench"
argv = ["df", "-P", "-k"]
idempotent = true

[output]
format = "lines"
schema = "df_rows.v1.json"
max_bytes = 2097152
header = [HEADER]
row = ROW
shape = "rows"
max_rows = 20000
types = TYPES

[agent]
fields = ["rows"]
""".replace("HEADER", json.dumps(_SHIPPED_DF["header"][0]))
    .replace("ROW", json.dumps(_SHIPPED_DF["row"]))
    .replace(
        "TYPES",
        "{ " + ", ".join(f'{k} = "{v}"' for k, v in _SHIPPED_DF["types"].items()) + " }",
    )
)


def _str(pattern: str, max_length: int) -> dict[str, Any]:
    return {"type": "string", "pattern": pattern, "maxLength": max_length}


DATE_TIME: Final[dict[str, Any]] = {"type": "string", "format": "date-time", "maxLength": 35}
ROW: Final[dict[str, Any]] = {
    "type": "object",
    "required": [
        "row_id",
        "host",
        "job_id",
        "state",
        "severity",
        "attempts",
        "bytes_out",
        "cpu_ratio",
        "started_at",
        "finished_at",
        "tags",
    ],
    "properties": {
        "row_id": _str("^row_[A-Za-z0-9]{16}$", 20),
        "host": _str("^[a-z][a-z0-9-]{1,62}$", 63),
        "job_id": _str("^job-[0-9]{6,12}$", 16),
        "state": {"type": "string", "enum": ["queued", "running", "succeeded", "failed"]},
        "severity": {"type": "string", "enum": ["info", "warning", "error", "critical"]},
        "attempts": {"type": "integer", "minimum": 0, "maximum": 1000},
        "bytes_out": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1},
        "cpu_ratio": {"type": "number", "minimum": 0, "maximum": 1},
        "started_at": DATE_TIME,
        "finished_at": DATE_TIME,
        "tags": {"type": "array", "maxItems": 4, "items": _str("^[a-z][a-z0-9-]{0,15}$", 16)},
    },
    "additionalProperties": False,
}
BENCH_ROWS_SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://sshadapter.invalid/schemas/bench_rows.v1.json",
    "type": "object",
    "required": ["project_id", "observed_at", "rows"],
    "properties": {
        "project_id": _str("^[a-z0-9][a-z0-9-]{2,62}$", 63),
        "observed_at": DATE_TIME,
        "rows": {"type": "array", "maxItems": 10000, "items": ROW},
    },
    "additionalProperties": False,
}
MAX_ROWS: Final = 20000  # mounts and df_rows: room for the 1 MB and 10k-line cases


def mounts_schema() -> dict[str, Any]:
    """The shipped mount_info schema, with room for the large cases."""
    schema: dict[str, Any] = json.loads((ROOT / "schemas" / "mount_info.v2.json").read_text())
    schema["properties"]["filesystems"]["maxItems"] = MAX_ROWS
    return schema


def df_rows_schema() -> dict[str, Any]:
    """{"rows": [...]} of the shipped disk_usage row schema."""
    row: dict[str, Any] = json.loads((ROOT / "schemas" / "disk_usage.v2.json").read_text())
    for key in ("$schema", "$id", "title", "description"):
        row.pop(key, None)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://sshadapter.invalid/schemas/df_rows.v1.json",
        "type": "object",
        "required": ["rows"],
        "properties": {"rows": {"type": "array", "maxItems": MAX_ROWS, "items": row}},
        "additionalProperties": False,
    }


def load_operations(tmp: Path) -> Registry:
    commands, schemas = tmp / "commands", tmp / "schemas"
    commands.mkdir()
    schemas.mkdir()
    for name, toml in (
        ("bench_rows", BENCH_ROWS_TOML),
        ("mounts", MOUNTS_TOML),
        ("df_rows", DF_ROWS_TOML),
    ):
        (commands / f"{name}.toml").write_text(toml)
    for name, schema in (
        ("bench_rows.v1.json", BENCH_ROWS_SCHEMA),
        ("mount_info.v2.json", mounts_schema()),
        ("df_rows.v1.json", df_rows_schema()),
    ):
        (schemas / name).write_bytes(orjson.dumps(schema))
    return load_registry(commands, schemas, hosts=None)


# The inputs --------------------------------------------------------------------------


def bench_rows(count: int) -> list[dict[str, Any]]:
    rng = random.Random(2025)
    alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    tags = ["prod", "canary", "eu-west-1", "batch", "gpu", "nightly", "retry"]
    states, severities = ROW["properties"]["state"]["enum"], ROW["properties"]["severity"]["enum"]
    rows = []
    for i in range(count):
        start = NOW - timedelta(seconds=rng.randint(60, 86_400), microseconds=rng.randint(0, 999))
        rows.append(
            {
                "row_id": "row_" + "".join(rng.choice(alnum) for _ in range(16)),
                "host": f"node-{rng.randint(1, 400):03d}",
                "job_id": f"job-{100000 + i}",
                "state": rng.choice(states),
                "severity": rng.choice(severities),
                "attempts": rng.randint(0, 5),
                "bytes_out": rng.randint(0, 10**12),
                "cpu_ratio": round(rng.random(), 6),
                "started_at": start.isoformat(timespec="microseconds").replace("+00:00", "Z"),
                "finished_at": (start + timedelta(seconds=rng.randint(1, 3600))).isoformat(),
                "tags": rng.sample(tags, rng.randint(0, 3)),
            }
        )
    return rows


def mount_entries(count: int) -> list[dict[str, str]]:
    fstypes = ["ext4", "xfs", "tmpfs", "nfs4", "overlay"]
    options = [
        "rw,relatime,discard",
        "ro,nosuid,nodev,noexec,relatime",
        "rw,nosuid,nodev,size=65536k,mode=755,inode64",
        "rw,relatime,vers=4.2,rsize=1048576,wsize=1048576,hard,proto=tcp",
    ]
    return [
        {
            "target": f"/srv/volumes/vol-{i:05d}",
            "source": f"/dev/vd{chr(98 + i % 20)}{i % 60}" if i % 3 else f"nas-{i % 7}:/export/{i}",
            "fstype": fstypes[i % len(fstypes)],
            "options": options[i % len(options)],
        }
        for i in range(count)
    ]


def fit(make: Callable[[int], bytes], target: int) -> bytes:
    """The output of ``make(n)`` whose size is closest to ``target`` bytes."""
    per_item = (len(make(101)) - len(make(1))) / 100
    n = max(1, round((target - len(make(0))) / per_item))
    return make(n)


@dataclass(frozen=True)
class Case:
    """One input: the operation, its stdout, and the floor's input (the same data as JSON)."""

    op: Operation
    stdout: bytes
    floor_input: bytes


def make_cases(registry: Registry) -> dict[str, Case]:
    ops = registry.operations
    rows = bench_rows(5000)
    head = {
        "project_id": ARGS["project_id"],
        "observed_at": (NOW - timedelta(seconds=5)).isoformat().replace("+00:00", "Z"),
    }
    mounts = mount_entries(MAX_ROWS)
    cases: dict[str, Case] = {}
    for size, target in JSON_SIZES.items():
        out = fit(lambda n: orjson.dumps({**head, "rows": rows[:n]}) + b"\n", target)
        cases[f"bench_rows {size}"] = Case(ops["bench_rows"], out, out)
        out = fit(lambda n: orjson.dumps({"filesystems": mounts[: max(n, 1)]}) + b"\n", target)
        cases[f"mounts {size}"] = Case(ops["mounts"], out, out)
    for label, count in LINE_COUNTS.items():
        lines = [DF_HEADER] + [
            f"/dev/vd{chr(98 + i % 20)}{i % 60:<6} {264212084 + i:>11} {24453260 + 7 * i:>9} "
            f"{81937652 - 3 * i:>9} {(i * 7) % 101:>7}% /srv/volumes/vol-{i:05d}"
            for i in range(count)
        ]
        stdout = ("\n".join(lines) + "\n").encode()
        rows_as_json = orjson.dumps(ops["df_rows"].parser.parse(stdout))
        cases[f"df_rows {label}"] = Case(ops["df_rows"], stdout, rows_as_json)
    return cases


def stage(op: Operation, stdout: bytes) -> bytes:
    """What the daemon does with a successful call's bytes: stages 6-10, seal, serialize."""
    verdict = evaluate(op, ARGS, RunResult(stdout, b"", 0), NOW)
    return orjson.dumps(seal(op, REQUEST_ID, verdict))


# Timing ------------------------------------------------------------------------------

Key = tuple[str, str]  # (case, what)


def clock_cost_ns() -> int:
    """What one pair of thread_time_ns() calls adds to a measured interval (a syscall each)."""
    clock = time.thread_time_ns
    pairs = []
    for _ in range(CLOCK_CALIBRATION_PAIRS):
        t0 = clock()
        pairs.append(clock() - t0)
    return int(statistics.median(pairs))


def run_interleaved(cases: dict[Key, Callable[[], object]], budget_s: float) -> dict[Key, float]:
    """Median CPU ns per case. Each round runs every case for about SLICE_NS, one call at a time
    in a shuffled order, so no case gets caches warmed by a run of its own calls.

    The clock is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), its own cost subtracted: on
    this shared machine a 40 ms call is nearly always preempted by other work, which wall time
    would count and CPU time does not. On a quiet machine the two agree.
    """
    cost = clock_cost_ns()
    calls = {}
    for key, fn in cases.items():  # warm up and calibrate
        for _ in range(3):
            fn()
        t0 = time.perf_counter_ns()
        fn()
        calls[key] = max(1, min(500, SLICE_NS // max(1, time.perf_counter_ns() - t0)))
    samples: dict[Key, list[int]] = {key: [] for key in cases}
    schedule = [key for key in cases for _ in range(calls[key])]
    shuffle = random.Random(7).shuffle
    clock = time.thread_time_ns
    start = time.monotonic()
    rounds = 0
    while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or time.monotonic() - start < budget_s):
        shuffle(schedule)
        for key in schedule:
            fn = cases[key]
            t0 = clock()
            fn()
            samples[key].append(clock() - t0 - cost)
        rounds += 1
    counts = sorted(map(len, samples.values()))
    print(
        f"  ({rounds} rounds, {time.monotonic() - start:.1f} s, samples per case "
        f"{counts[0]}-{counts[-1]}; thread CPU time, clock cost {cost} ns subtracted)",
        flush=True,
    )
    return {key: statistics.median(s) for key, s in samples.items()}


@dataclass(frozen=True)
class Figures:
    """Median µs of the stage and of its floor, per case."""

    sizes: dict[str, int]
    stage_us: dict[str, float]
    floor_us: dict[str, float]

    def ratio(self, case: str) -> float:
        return self.stage_us[case] / self.floor_us[case]


def measure(budget_s: float) -> Figures:
    """The stage and its floor for every case, interleaved; checks every case is accepted."""
    with tempfile.TemporaryDirectory(prefix="sshadapter-offline-") as tmp:
        cases = make_cases(load_operations(Path(tmp)))
    for name, case in cases.items():  # sanity: every case is an accepted call
        envelope = orjson.loads(stage(case.op, case.stdout))
        assert envelope["outcome"] == "success", (name, envelope)
    print(
        "offline stage inputs: "
        + ", ".join(f"{name} = {len(c.stdout):,} B" for name, c in cases.items()),
        flush=True,
    )
    timed: dict[Key, Callable[[], object]] = {}
    for name, case in cases.items():
        timed[name, "stage"] = partial(stage, case.op, case.stdout)
        timed[name, "floor"] = partial(orjson.loads, case.floor_input)
    med = run_interleaved(timed, budget_s)
    return Figures(
        {name: len(c.stdout) for name, c in cases.items()},
        {name: med[name, "stage"] / 1000 for name in cases},
        {name: med[name, "floor"] / 1000 for name in cases},
    )


def print_figures(figures: Figures) -> None:
    print(f"\n{'case':<20} {'bytes':>10} {'stage µs':>10} {'floor µs':>10} {'stage/floor':>12}")
    for name, size in figures.sizes.items():
        print(
            f"{name:<20} {size:>10,} {figures.stage_us[name]:>10.1f} "
            f"{figures.floor_us[name]:>10.1f} {figures.ratio(name):>12.2f}"
        )
    print(
        "  stage = evaluate + seal + orjson.dumps(envelope); floor = orjson.loads of the same "
        "bytes (df_rows: of the same rows as JSON)"
    )


def target_rows(figures: Figures) -> list[Row]:
    """The offline rows of issues 13 and 22 (the same thresholds)."""
    rows = [
        Row(
            f"offline stage, {op} 1 KB",
            figures.stage_us[f"{op} 1 KB"],
            "<=",
            TARGET_1KB_US,
            "us",
            f"{figures.ratio(f'{op} 1 KB'):.1f}x orjson.loads",
        )
        for op in ("bench_rows", "mounts")
    ]
    rows += [
        Row(
            f"offline stage, {op} 100 KB / orjson.loads",
            figures.ratio(f"{op} 100 KB"),
            "<=",
            TARGET_100KB_RATIO,
            "x",
            f"{figures.stage_us[f'{op} 100 KB']:.0f} vs {figures.floor_us[f'{op} 100 KB']:.0f} us",
        )
        for op in ("bench_rows", "mounts")
    ]
    lines = "df_rows 10k lines"
    rows.append(
        Row(
            "lines extractor 10k lines / orjson.loads of the rows",
            figures.ratio(lines),
            "<=",
            TARGET_LINES_RATIO,
            "x",
            f"{figures.stage_us[lines] / 1000:.1f} vs {figures.floor_us[lines] / 1000:.1f} ms",
        )
    )
    return rows


# The full run's extras -------------------------------------------------------------------


def naive_comparison(budget_s: float) -> None:
    """The daemon's stage against json.loads + jsonschema (formats on), bench_rows."""
    with tempfile.TemporaryDirectory(prefix="sshadapter-offline-") as tmp:
        cases = make_cases(load_operations(Path(tmp)))
    naive = jsonschema.Draft202012Validator(
        BENCH_ROWS_SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    timed: dict[Key, Callable[[], object]] = {}
    for size in JSON_SIZES:
        case = cases[f"bench_rows {size}"]
        naive.validate(json.loads(case.stdout))  # sanity: the naive pipeline accepts it too
        timed[size, "stage"] = partial(stage, case.op, case.stdout)
        timed[size, "naive"] = partial(lambda s: naive.validate(json.loads(s)), case.stdout)
    print("\nagainst the naive pipeline (json.loads + jsonschema, formats on), bench_rows")
    med = run_interleaved(timed, budget_s)
    print(f"{'size':>7} {'stage µs':>10} {'naive µs':>12} {'naive/stage':>12}")
    for size in JSON_SIZES:
        a, c = med[size, "stage"] / 1000, med[size, "naive"] / 1000
        print(f"{size:>7} {a:>10.1f} {c:>12.1f} {c / a:>12.1f}")


def breakdown(budget_s: float) -> None:
    """The stage at 100 KB (bench_rows), part by part, on the inputs each part sees."""
    with tempfile.TemporaryDirectory(prefix="sshadapter-offline-") as tmp:
        case = make_cases(load_operations(Path(tmp)))["bench_rows 100 KB"]
    op, stdout = case.op, case.stdout
    value = op.parser.parse(stdout)
    sealed = orjson.loads(stage(op, stdout))
    max_depth = op.spec.output.max_depth
    wraps = strict_json._DUMPS_MAX_DEPTH - max_depth
    spine = partial(strict_json._written_colons, value, wraps, len(stdout))
    parts: dict[Key, Callable[[], object]] = {
        ("total", "stage (evaluate + seal + dumps)"): partial(stage, op, stdout),
        ("part", "strict parse (op.parser.parse)"): partial(op.parser.parse, stdout),
        ("part", "  orjson.loads"): partial(orjson.loads, stdout),
        ("part", "  C parse (_parse: msgspec > 64 KiB)"): partial(strict_json._parse, stdout),
        ("part", "  guard: dumps colons, depth wraps"): spine,
        ("part", "  guard: count(':') of the input"): partial(stdout.count, b":"),
        ("part", "schema (op.output_validator)"): partial(op.output_validator.validate, value),
        ("part", "envelope guard (op.envelope_guard)"): partial(op.envelope_guard.is_valid, sealed),
        ("part", "orjson.dumps(envelope)"): partial(orjson.dumps, sealed),
    }
    print("\nbreakdown of the stage at 100 KB, bench_rows (median µs per call)")
    med = run_interleaved(parts, budget_s)
    total = med["total", "stage (evaluate + seal + dumps)"]
    for (_, name), ns in med.items():
        print(f"  {name:<36} {ns / 1000:>9.1f} µs {100 * ns / total:>6.1f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a shorter run, targets only")
    parser.add_argument("--parser", action="store_true", help="the strict parser's cost only")
    args = parser.parse_args()
    print(
        f"sshadapter offline stage, Python {sys.version.split()[0]}, "
        + ", ".join(f"{name} {version(name)}" for name in ("orjson", "jsonschema", "jsonschema-rs"))
    )
    if args.parser:
        parser_cost.run()
        return
    figures = measure(QUICK_BUDGET_S if args.quick else BUDGET_S)
    print_figures(figures)
    print_rows("targets (issues 13 and 22)", target_rows(figures))
    if not args.quick:
        naive_comparison(BUDGET_S / 4)
        breakdown(BUDGET_S / 4)
        parser_cost.run()


if __name__ == "__main__":
    main()
    sys.exit(0)  # a benchmark: PASS/FAIL is printed, never the exit status
