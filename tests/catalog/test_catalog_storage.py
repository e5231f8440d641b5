"""The storage catalog on real kernel files of other systems (tests/support/kernel_corpus.py).

Each corpus file of /proc/diskstats and /proc/mounts is judged by the shipped operation
and must be accepted with exactly the data a person reads from it: the expected data is
read here by a plain split of the file, independently of the operation's patterns.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final

import pytest
from catalog_corpus import CATALOG, family
from kernel_corpus import Reader, cases, corpus_data, judged, shared_bytes

from sshadapter.contract.registry import Registry

# Documentation/admin-guide/iostats.rst, in order: 11 counters, 4 discard (4.18), 2 flush (5.5).
DISKSTATS: Final = [
    "reads_completed",
    "reads_merged",
    "sectors_read",
    "read_ms",
    "writes_completed",
    "writes_merged",
    "sectors_written",
    "write_ms",
    "in_flight",
    "io_ms",
    "weighted_io_ms",
    "discards_completed",
    "discards_merged",
    "sectors_discarded",
    "discard_ms",
    "flushes_completed",
    "flush_ms",
]


@pytest.fixture(scope="module")
def storage() -> Registry:
    return family("storage")


def read_diskstats(text: str) -> list[dict[str, Any]]:
    """/proc/diskstats as a person reads it: major, minor, name, then 11, 15 or 17 counters."""
    rows = []
    for line in text.splitlines():
        major, minor, device, *counters = line.split()
        values = [int(v) for v in counters] + [None] * (len(DISKSTATS) - len(counters))
        rows.append(
            {"major": int(major), "minor": int(minor), "device": device}
            | dict(zip(DISKSTATS, values, strict=True))
        )
    return rows


def read_mounts(text: str) -> list[dict[str, Any]]:
    """/proc/mounts as a person reads it: the target, the type, the first option (rw or ro)."""
    rows = []
    for line in text.splitlines():
        _, target, fstype, options, _, _ = line.split(" ")
        rows.append({"target": target, "fstype": fstype, "mode": options.split(",")[0]})
    return rows


READERS: Final[dict[str, tuple[str, Reader]]] = {
    "disk_io": ("proc_diskstats", lambda text: {"rows": read_diskstats(text)}),
    "mounts": ("proc_mounts", lambda text: {"rows": read_mounts(text)}),
}


@pytest.mark.parametrize(("tool", "id_"), cases(READERS))
def test_each_corpus_file_is_read_exactly(storage: Registry, tool: str, id_: str) -> None:
    """Each real /proc/diskstats (14 and 18 fields) and /proc/mounts (routers to gVisor) is read."""
    got, read = corpus_data(storage, READERS, tool, id_)
    assert got == read


def test_filesystem_usage_reads_busybox_on_alpine(storage: Registry) -> None:
    """BusyBox 1.33.1's df on Alpine 3.14 (an issue report in ../shared/realworld) gives its row."""
    stdout = shared_bytes(Path("realworld/outputs/disk_usage/issue_busybox_cifs.txt"))
    sealed = judged(storage.operations["filesystem_usage"], stdout)
    assert sealed.get("data") == {
        "rows": [
            {
                "mounted_on": "/data0",
                "size_kb": 59979045276,
                "used_kb": 50147765800,
                "available_kb": 9831279476,
                "capacity_pct": 84,
            }
        ]
    }, sealed


def test_block_devices_takes_the_all_strings_form_of_util_linux_2_32(storage: Registry) -> None:
    """The Debian 12 capture as util-linux 2.27-2.32 print it (strings, null) is read alike.

    A derived output, not a capture: libsmartcols before 2.33 quoted every value and
    wrote null for an empty cell (libsmartcols/src/table_print.c at v2.32).
    """
    fixtures = CATALOG / "storage" / "block_devices.fixtures"
    typed = json.loads((fixtures / "debian12.stdout").read_bytes())
    strings = {
        "blockdevices": [
            {
                **device,
                "size": str(device["size"]),
                "ro": "1" if device["ro"] else "0",
                "rm": "1" if device["rm"] else "0",
            }
            for device in typed["blockdevices"]
        ]
    }
    sealed = judged(storage.operations["block_devices"], json.dumps(strings).encode())
    assert sealed.get("data") == strings, sealed
