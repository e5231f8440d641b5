"""The compute family of the catalog on real files of other systems (../shared/catalog/corpus).

Each legitimate file is accepted with exactly the data a person reads from it, worked out
here by a plain reading of the file (split() on whitespace), and every near-miss
`sshadapter check` derives from it is refused. Kernels from 2.6 to 6.x: /proc/stat with 8,
9 and 10 cpu columns, /proc/meminfo with and without MemAvailable, PSI with and without
the cpu "full" line.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from catalog_corpus import (
    accepted,
    corpus_file,
    corpus_ids,
    family,
    lines_starting,
    misses,
    near_misses_refused,
    provenance_gaps,
)

from sshadapter.contract.registry import Registry

CPU_COLUMNS: Final = (
    "user",
    "nice",
    "system",
    "idle",
    "iowait",
    "irq",
    "softirq",
    "steal",
    "guest",
    "guest_nice",
)
MEMORY_SHOWN: Final = (
    "MemTotal",
    "MemFree",
    "MemAvailable",
    "Buffers",
    "Cached",
    "Shmem",
    "Dirty",
    "SwapTotal",
    "SwapFree",
    "CommitLimit",
    "Committed_AS",
    "HugePages_Total",
    "HugePages_Free",
    "Hugepagesize",
)
PRESSURE_FILES: Final = [
    (resource, file_id)
    for resource in ("cpu", "memory", "io")
    for file_id in corpus_ids(f"proc_pressure_{resource}")
]


@pytest.fixture(scope="module")
def compute() -> Registry:
    return family("compute")


@pytest.mark.parametrize("file_id", corpus_ids("proc_loadavg"))
def test_system_load_is_the_five_numbers(compute: Registry, file_id: str) -> None:
    """Three load averages, runnable/total entities; the last PID is not shown."""
    data = corpus_file("proc_loadavg", file_id).data
    load1, load5, load15, entities, _ = data.split()
    running, total = entities.split(b"/")
    expected = {"load1": float(load1), "load5": float(load5), "load15": float(load15)}
    op = compute.operations["system_load"]
    assert accepted(op, data) == {**expected, "running": int(running), "total": int(total)}
    near_misses_refused(op, data)


@pytest.mark.parametrize("file_id", corpus_ids("proc_stat"))
def test_cpu_times_has_every_cpu_line_and_null_for_columns_the_kernel_lacks(
    compute: Registry, file_id: str
) -> None:
    """What grep '^cpu' prints from each /proc/stat: a row per line, null past its columns."""
    stdout = lines_starting(corpus_file("proc_stat", file_id).data, b"cpu")
    expected = []
    for line in stdout.decode().splitlines():
        name, *numbers = line.split()
        columns: list[int | None] = [int(n) for n in numbers]
        columns += [None] * (len(CPU_COLUMNS) - len(columns))
        expected.append({"cpu": name, **dict(zip(CPU_COLUMNS, columns, strict=True))})
    op = compute.operations["cpu_times"]
    assert accepted(op, stdout) == {"rows": expected}
    assert expected[0]["cpu"] == "cpu" and len(expected) >= 2
    near_misses_refused(op, stdout)


@pytest.mark.parametrize("file_id", corpus_ids("proc_meminfo"))
def test_memory_usage_shows_the_counters_the_kernel_has(compute: Registry, file_id: str) -> None:
    """Every counter a name and a number; the shown ones as written, absent when missing."""
    data = corpus_file("proc_meminfo", file_id).data
    counters = {}
    for line in data.decode().splitlines():
        name, _, value = line.partition(":")
        counters[name] = int(value.split()[0])
    op = compute.operations["memory_usage"]
    assert accepted(op, data) == {k: counters[k] for k in MEMORY_SHOWN if k in counters}
    near_misses_refused(op, data)


@pytest.mark.parametrize("file_id", corpus_ids("proc_swaps"))
def test_swap_devices_are_the_rows_under_the_header(compute: Registry, file_id: str) -> None:
    """One row per swap area, none when the header stands alone."""
    data = corpus_file("proc_swaps", file_id).data
    rows: list[dict[str, Any]] = []
    for line in data.decode().splitlines()[1:]:
        path, kind, size, used, priority = line.split()
        rows.append(
            {
                "path": path,
                "type": kind,
                "size_kb": int(size),
                "used_kb": int(used),
                "priority": int(priority),
            }
        )
    op = compute.operations["swap_devices"]
    assert accepted(op, data) == {"rows": rows}
    near_misses_refused(op, data)


@pytest.mark.parametrize(("resource", "file_id"), PRESSURE_FILES)
def test_pressure_reads_some_and_full(compute: Registry, resource: str, file_id: str) -> None:
    """Percentages and total microseconds; full_* null where the kernel wrote no full line."""
    data = corpus_file(f"proc_pressure_{resource}", file_id).data
    expected: dict[str, Any] = {
        f"full_{name}": None for name in ("avg10", "avg60", "avg300", "total_us")
    }
    for line in data.decode().splitlines():
        kind, *fields = line.split()
        for field in fields:
            name, _, value = field.partition("=")
            if name == "total":
                expected[f"{kind}_total_us"] = int(value)
            else:
                expected[f"{kind}_{name}"] = float(value)
    op = compute.operations["pressure"]
    assert accepted(op, data, {"resource": resource}) == expected
    near_misses_refused(op, data, {"resource": resource})


@pytest.mark.parametrize("file_id", corpus_ids("sys_devices_system_cpu_online"))
def test_cpus_online_is_the_list_as_written(compute: Registry, file_id: str) -> None:
    """The kernel's cpu list, as the file holds it."""
    data = corpus_file("sys_devices_system_cpu_online", file_id).data
    op = compute.operations["cpus_online"]
    assert accepted(op, data) == {"online": data.decode().strip()}
    near_misses_refused(op, data)


def test_the_compute_fixtures_pass_check() -> None:
    """`sshadapter check` on the shipped fixtures: each as declared, every near-miss refused."""
    assert misses(family("compute")) == []


def test_every_compute_fixture_says_where_it_came_from() -> None:
    """PROVENANCE.md in the catalog's format beside each fixtures directory, naming every case."""
    assert provenance_gaps("compute") == []
