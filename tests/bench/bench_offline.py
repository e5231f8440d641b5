"""Benchmark of the offline stage (docs/protocol.md "Stages", 6-10 + seal).

Run: ``python tests/bench/bench_offline.py``. A benchmark, not a test: it always
exits 0 and prints PASS/MISS per target. Three results (~1 KB, ~100 KB, ~1 MB)
of one operation built in a temporary directory are timed interleaved, round
by round, call by call in a shuffled order, so machine noise hits every case alike:

  (a) daemon:  evaluate() + seal() + orjson.dumps(envelope)
  (b) floor:   orjson.loads(stdout)
  (c) naive:   json.loads(stdout) + jsonschema Draft 2020-12 .validate() (formats on)

Medians of single calls (time.perf_counter_ns), GC on as in the daemon.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

import jsonschema
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

from sshadapter.checks import run_checks
from sshadapter.evaluate import Verdict, evaluate, project, seal
from sshadapter.registry import Operation, load_operation
from sshadapter.runners.interface import RunResult
from sshadapter.schemas import SchemaSet

BUDGET_S = 40.0  # main comparison; the breakdown gets a quarter of that
MIN_ROUNDS, MAX_ROUNDS = 15, 400
SLICE_NS = 2_000_000  # per case per round: ~2 ms of calls (at least one)
SIZES = {"1 KB": 1_000, "100 KB": 100_000, "1 MB": 1_000_000}
NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
ARGS = {"project_id": "proj-alpha"}
REQUEST_ID = "req.benchBENCHbench23"
DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")  # as strict_json's guard

COMMAND = """\
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


def _str(pattern: str, max_length: int) -> dict[str, Any]:
    return {"type": "string", "pattern": pattern, "maxLength": max_length}


DATE_TIME: dict[str, Any] = {"type": "string", "format": "date-time", "maxLength": 35}
ROW: dict[str, Any] = {
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
SCHEMA: dict[str, Any] = {
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


def make_rows(count: int) -> list[dict[str, Any]]:
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


Key = tuple[str, str]  # (size or stage, variant or part)


def make_outputs() -> dict[str, bytes]:
    """Each size: the row count whose compact document is closest to the target."""
    rows = make_rows(5000)
    head = {
        "project_id": ARGS["project_id"],
        "observed_at": (NOW - timedelta(seconds=5)).isoformat().replace("+00:00", "Z"),
    }
    out = {}
    for label, target in SIZES.items():
        per_row = len(orjson.dumps(rows[:100])) / 100
        n = max(1, round((target - 80) / per_row))
        out[label] = orjson.dumps({**head, "rows": rows[:n]}) + b"\n"
    return out


def run_interleaved(cases: dict[Key, Callable[[], object]], budget_s: float) -> dict[Key, float]:
    """Median ns per case. Each round runs every case for about SLICE_NS, one call at a time in
    a shuffled order, so no case gets caches warmed by a run of its own calls."""
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
    clock = time.perf_counter_ns
    start = time.monotonic()
    rounds = 0
    while rounds < MAX_ROUNDS and (rounds < MIN_ROUNDS or time.monotonic() - start < budget_s):
        shuffle(schedule)
        for key in schedule:
            fn = cases[key]
            t0 = clock()
            fn()
            samples[key].append(clock() - t0)
        rounds += 1
    counts = sorted(map(len, samples.values()))
    print(
        f"  ({rounds} rounds, {time.monotonic() - start:.1f} s, "
        f"samples per case {counts[0]}-{counts[-1]})"
    )
    return {key: statistics.median(s) for key, s in samples.items()}


def load_bench_operation() -> Operation:
    with tempfile.TemporaryDirectory() as tmp:
        schema, command = Path(tmp, "bench_rows.v1.json"), Path(tmp, "bench_rows.toml")
        schema.write_bytes(orjson.dumps(SCHEMA))
        command.write_text(COMMAND)
        return load_operation(command, SchemaSet(Path(tmp)), hosts=None)


def compare(outputs: dict[str, bytes], daemon: Callable[[bytes], bytes]) -> None:
    """(a), (b), (c) at every size, the table and the targets."""
    naive = jsonschema.Draft202012Validator(
        SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    cases: dict[Key, Callable[[], object]] = {}
    for label, stdout in outputs.items():
        naive.validate(json.loads(stdout))  # sanity: the naive pipeline accepts it too
        cases[label, "a"] = partial(daemon, stdout)
        cases[label, "b"] = partial(orjson.loads, stdout)
        cases[label, "c"] = partial(lambda s: naive.validate(json.loads(s)), stdout)
    print("\nmain comparison (median µs per call)")
    med = {key: ns / 1000 for key, ns in run_interleaved(cases, BUDGET_S).items()}
    print(
        f"\n{'size':>7} {'(a) daemon':>12} {'(b) orjson':>12} {'(c) naive':>12}"
        f" {'a/b':>7} {'c/a':>7}"
    )
    for label in outputs:
        a, b, c = (med[label, v] for v in "abc")
        print(f"{label:>7} {a:>12.1f} {b:>12.1f} {c:>12.1f} {a / b:>7.2f} {c / a:>7.1f}")
    a1 = med["1 KB", "a"]
    a_b = med["100 KB", "a"] / med["100 KB", "b"]
    c_a = med["100 KB", "c"] / med["100 KB", "a"]
    print()
    for name, ok, got in [
        ("(a) at 1 KB <= 50 µs", a1 <= 50, f"{a1:.1f} µs"),
        ("a/b at 100 KB <= 5", a_b <= 5, f"{a_b:.2f}"),
        ("c/a at 100 KB >= 20", c_a >= 20, f"{c_a:.1f}"),
    ]:
        print(f"  {'PASS' if ok else 'MISS'}  {name:<24} measured {got}")


def breakdown(op: Operation, stdout: bytes, daemon: Callable[[bytes], bytes]) -> None:
    """(a) stage by stage; indented parts are timed alone, on the inputs that stage sees."""
    value = op.parser.parse(stdout)
    verdict = Verdict(data=project(op, value))
    sealed = seal(op, REQUEST_ID, verdict)
    dumped = orjson.dumps(value, option=orjson.OPT_INDENT_2)
    scan = stdout.translate(DIGITS_TO_ZERO, b":")
    stages: dict[Key, Callable[[], object]] = {
        ("total", "(a) evaluate + seal + dumps"): partial(daemon, stdout),
        ("stage", "strict parse (op.parser.parse)"): partial(op.parser.parse, stdout),
        ("part", "  orjson.loads"): partial(orjson.loads, stdout),
        ("part", "  guard: translate + digit-run find"): lambda: (
            b"0" * 19 in stdout.translate(DIGITS_TO_ZERO, b":")
        ),
        ("part", "  guard: dumps(OPT_INDENT_2)"): lambda: orjson.dumps(
            value, option=orjson.OPT_INDENT_2
        ),
        ("part", "  guard: count(':') + indent find"): lambda: (
            len(stdout) - len(scan) == dumped.count(b":") and b"\n" + b" " * 32 in dumped
        ),
        ("stage", "schema (op.output_validator)"): partial(op.output_validator.validate, value),
        ("stage", "checks (run_checks)"): partial(run_checks, op.spec.checks, value, ARGS, NOW),
        ("stage", "projection (project + Verdict)"): lambda: Verdict(data=project(op, value)),
        ("stage", "seal (envelope + validation)"): partial(seal, op, REQUEST_ID, verdict),
        ("part", "  envelope_guard.is_valid"): partial(op.envelope_guard.is_valid, sealed),
        ("aside", "full envelope schema (check, tests)"): partial(
            op.envelope_validator.is_valid, sealed
        ),
        ("stage", "orjson.dumps(envelope)"): partial(orjson.dumps, sealed),
    }
    print("\nbreakdown of (a) at 100 KB (median µs per call)")
    parts = run_interleaved(stages, BUDGET_S / 4)
    total = parts["total", "(a) evaluate + seal + dumps"]
    for (_, name), ns in parts.items():
        print(f"  {name:<36} {ns / 1000:>9.1f} µs {100 * ns / total:>6.1f} %")
    stage_sum = sum(ns for (kind, _), ns in parts.items() if kind == "stage")
    print(
        f"  {'sum of the stages':<36} {stage_sum / 1000:>9.1f} µs {100 * stage_sum / total:>6.1f} %"
    )
    floor = parts["part", "  orjson.loads"]
    print(
        f"  total / orjson.loads = {total / floor:.2f} (the full envelope schema is not on the"
        " hot path: see envelope.envelope_guard_schema)"
    )


def main() -> None:
    op = load_bench_operation()
    outputs = make_outputs()

    def daemon(stdout: bytes) -> bytes:
        verdict = evaluate(op, ARGS, RunResult(stdout, b"", 0), NOW)
        return orjson.dumps(seal(op, REQUEST_ID, verdict))

    for label, stdout in outputs.items():  # sanity: every case is an accepted call
        envelope = orjson.loads(daemon(stdout))
        assert envelope["outcome"] == "success", (label, envelope)
    print(
        f"sshadapter offline stage, Python {sys.version.split()[0]}, "
        + ", ".join(f"{name} {version(name)}" for name in ("orjson", "jsonschema", "jsonschema-rs"))
    )
    print(
        "sizes: "
        + ", ".join(
            f"{k} = {len(v):,} B ({len(orjson.loads(v)['rows'])} rows)" for k, v in outputs.items()
        )
    )
    compare(outputs, daemon)
    breakdown(op, outputs["100 KB"], daemon)


if __name__ == "__main__":
    main()
    sys.exit(0)  # a benchmark: PASS/MISS is printed, never the exit status
