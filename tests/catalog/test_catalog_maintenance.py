"""The maintenance family of the catalog: its fixtures, and the corpus of real kernel files."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Final

import pytest
from catalog_corpus import family, misses
from catalog_family import corpus_files, judged, require_corpus

FILE_NR: Final = "proc_sys_fs_file_nr"
# What a person reads in each corpus file of /proc/sys/fs/file-nr (allocated, unused, max).
FILE_NR_READ: Final = {
    "coreos_sos": (1408, 0, 807650),
    "d2000_arm720t": (10, 0, 8192),
    "node_exporter": (1024, 0, 1631329),
    "sysstat_root1": (16704, 0, 809467),
    "xilinx_armv7": (192, 0, 23541),
    "zte_router_armv7": (672, 0, 9402),
}


def test_every_fixture_and_near_miss_comes_out_as_declared() -> None:
    """`sshadapter check` over the family: every fixture as declared, every near-miss refused."""
    assert misses(family("maintenance")) == []


def test_the_corpus_is_whole() -> None:
    """Every file-nr of the corpus has its reading below, and every reading its file."""
    require_corpus(FILE_NR)
    assert {p.stem for p in corpus_files(FILE_NR)} == set(FILE_NR_READ)


@pytest.mark.parametrize("name", sorted(FILE_NR_READ))
def test_file_nr_of_every_corpus_system_is_read_as_a_person_reads_it(name: str) -> None:
    """Each real file-nr (2.6 to 5.x kernels, x86 and ARM) gives exactly its three numbers."""
    require_corpus(FILE_NR)
    stdout = next(p for p in corpus_files(FILE_NR) if p.stem == name).read_bytes()
    allocated, unused, maximum = FILE_NR_READ[name]
    _, sealed = judged(family("maintenance"), "file_descriptors", stdout)
    assert sealed["data"] == {"allocated": allocated, "unused": unused, "max": maximum}


def test_file_nr_of_this_machine_is_accepted() -> None:
    """This host's own /proc/sys/fs/file-nr, read now, is accepted with its three numbers."""
    stdout = Path("/proc/sys/fs/file-nr").read_bytes()
    _, sealed = judged(family("maintenance"), "file_descriptors", stdout)
    assert sealed["data"] == dict(
        zip(("allocated", "unused", "max"), map(int, stdout.split()), strict=True)
    )


def test_pending_updates_of_this_machine_are_counted_by_suite() -> None:
    """apt on this machine, run now: every package counted once, under the suites it names."""
    argv = ["env", "LC_ALL=C", "apt", "list", "--upgradable"]
    stdout = subprocess.run(argv, capture_output=True, check=True).stdout
    _, sealed = judged(family("maintenance"), "pending_updates_apt", stdout)
    data = sealed["data"]
    assert data["total"] == len(stdout.splitlines()) - 1 == sum(data["counts"].values())


def test_this_machine_flags_no_reboot() -> None:
    """find on this machine, run now, finds no flag file: total 0, a success, not a failure."""
    argv = ["find", "/run", "-maxdepth", "1", "-name", "reboot-required", "-type", "f"]
    stdout = subprocess.run(argv, capture_output=True, check=True).stdout
    _, sealed = judged(family("maintenance"), "reboot_required_apt", stdout)
    assert sealed["data"] == {"total": 1 if Path("/run/reboot-required").is_file() else 0}
