"""The system family of the catalog on real files of other systems (../shared/catalog/corpus).

Each legitimate file is accepted with exactly the data a person reads from it, worked out
here by a plain reading of the file (shlex for os-release's shell quoting, split() for
numbers), and every near-miss `sshadapter check` derives from it is refused. time_sync,
which has no kernel file, is tested on its shipped real outputs (jc's timedatectl fixtures)
and on this machine's own timedatectl through sshd.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Final

import pytest
from catalog_corpus import (
    CATALOG,
    accepted,
    corpus_file,
    corpus_ids,
    family,
    judged,
    lines_starting,
    misses,
    near_misses_refused,
    provenance_gaps,
)
from daemon_harness import Running, with_daemon
from sshd import running_sshd

from sshadapter.contract.registry import Registry

OS_RELEASE_SHOWN: Final = (
    "ID",
    "ID_LIKE",
    "NAME",
    "VERSION",
    "VERSION_ID",
    "VERSION_CODENAME",
    "PRETTY_NAME",
    "VARIANT_ID",
    "BUILD_ID",
)


TIME_SYNC_FIXTURES: Final = CATALOG / "system" / "time_sync.fixtures"
# systemd 219's RTC warning, as its timedatectl.c prints it (later versions write "cannot").
WARNING_219: Final = (
    "\n"
    "Warning: The system is configured to read the RTC time in the local time zone.\n"
    "         This mode can not be fully supported. It will create various problems\n"
    "         with time zone changes and daylight saving time adjustments. The RTC\n"
    "         time is never updated, it relies on external facilities to maintain it.\n"
    "         If at all possible, use RTC in UTC by calling\n"
    "         'timedatectl set-local-rtc 0'.\n"
)


@pytest.fixture(scope="module")
def system() -> Registry:
    return family("system")


def read_os_release(data: bytes) -> dict[str, Any]:
    """What a shell reading the file would assign, for the keys the operation shows."""
    values = {}
    for line in data.decode().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key] = "".join(shlex.split(value))
    return {key: values[key] for key in OS_RELEASE_SHOWN if key in values}


@pytest.mark.parametrize("file_id", corpus_ids("os_release"))
def test_os_release_of_every_distribution_is_read_as_a_shell_would(
    system: Registry, file_id: str
) -> None:
    """Blank lines, comments, quoted and bare values, vendor keys: the unquoted values, shown."""
    data = corpus_file("os_release", file_id).data
    op = system.operations["os_release"]
    assert accepted(op, data) == read_os_release(data)
    near_misses_refused(op, data)


def test_os_release_keeps_what_the_vendor_wrote() -> None:
    """openEuler's capital ID and Fedora's empty VERSION_CODENAME are shown as written."""
    op = family("system").operations["os_release"]
    assert accepted(op, corpus_file("os_release", "gosysinfo_openeuler20_03").data)["ID"] == (
        "openEuler"
    )
    fedora = accepted(op, corpus_file("os_release", "gosysinfo_fedora30").data)
    assert (fedora["VERSION_CODENAME"], fedora["VARIANT_ID"]) == ("", "container")
    suse = accepted(op, corpus_file("os_release", "gosysinfo_opensuse_tumbleweed").data)
    assert "VERSION" not in suse  # commented out in the file: absent, not the comment's value


@pytest.mark.parametrize("file_id", corpus_ids("proc_uptime"))
def test_uptime_is_the_first_number(system: Registry, file_id: str) -> None:
    """Seconds since boot, as the file says them; the idle sum is not shown."""
    data = corpus_file("proc_uptime", file_id).data
    op = system.operations["uptime"]
    assert accepted(op, data) == {"uptime_seconds": float(data.split()[0])}
    near_misses_refused(op, data)


@pytest.mark.parametrize("file_id", corpus_ids("proc_stat"))
def test_boot_time_is_the_btime_line(system: Registry, file_id: str) -> None:
    """What grep '^btime ' prints from each /proc/stat: its number, 0 included (no clock)."""
    stdout = lines_starting(corpus_file("proc_stat", file_id).data, b"btime ")
    op = system.operations["boot_time"]
    assert accepted(op, stdout) == {"boot_time": int(stdout.split()[1])}
    near_misses_refused(op, stdout)


@pytest.mark.parametrize("file_id", corpus_ids("proc_version"))
def test_kernel_release_refuses_the_proc_version_line(system: Registry, file_id: str) -> None:
    """/proc/version is another file: its line (build host, compiler) is never a release."""
    verdict, _ = judged(
        system.operations["kernel_release"], corpus_file("proc_version", file_id).data
    )
    assert (verdict.code, verdict.stage, verdict.reason) == (
        "INVALID_RESPONSE",
        "extract",
        "unmatched_line",
    )


def time_sync_output(case: str) -> str:
    """The stdout of a shipped time_sync fixture (real outputs: PROVENANCE.md)."""
    return (TIME_SYNC_FIXTURES / f"{case}.stdout").read_text()


@pytest.mark.parametrize(
    "zone", ["America/Argentina/Buenos_Aires", "Etc/GMT+5", "EST5EDT", "UTC", "n/a"]
)
def test_time_sync_shows_iana_zone_names(system: Registry, zone: str) -> None:
    """Three-part, signed and bare zone names, and `n/a` (no zone set), are shown as printed."""
    stdout = time_sync_output("ubuntu1804").replace("Etc/UTC", zone).encode()
    op = system.operations["time_sync"]
    assert accepted(op, stdout)["time_zone"] == zone
    near_misses_refused(op, stdout)


@pytest.mark.parametrize(
    "zone",
    ["Europe/Athens; reboot", "Zone With Spaces", "../../etc/shadow", "a/b/c/d", "Z" * 31, "Café"],
)
def test_time_sync_refuses_what_is_not_a_zone_name(system: Registry, zone: str) -> None:
    """The zone name is host-controlled: anything but an IANA-style name is never shown."""
    stdout = time_sync_output("ubuntu1804").replace("Etc/UTC", zone).encode()
    verdict, _ = judged(system.operations["time_sync"], stdout)
    assert (verdict.code, verdict.stage) == ("INVALID_RESPONSE", "extract")


def test_time_sync_reads_past_systemd_219_dst_and_warning(system: Registry) -> None:
    """Systemd 219's DST block and "can not" warning are checked, not shown.

    CentOS 7's real output with the RTC in local time and the warning appended: a
    combination made here from real parts, not a captured output.
    """
    stdout = time_sync_output("centos77").replace(" RTC in local TZ: no", " RTC in local TZ: yes")
    op = system.operations["time_sync"]
    data = (stdout + WARNING_219).encode()
    assert accepted(op, data) == {
        "synchronized": "yes",
        "ntp_service": None,
        "time_zone": "America/Los_Angeles",
        "rtc_in_local_tz": "yes",
    }
    near_misses_refused(op, data)


def test_time_sync_reads_systemd_219_without_dst(system: Registry) -> None:
    """In a zone without DST systemd 219 prints `DST active: n/a` and no change lines."""
    head = time_sync_output("centos77").split(" Last DST change")[0]
    stdout = head.replace("      DST active: yes", "      DST active: n/a").encode()
    assert accepted(system.operations["time_sync"], stdout)["synchronized"] == "yes"


def test_time_sync_runs_the_real_timedatectl_through_sshd(tmp_path: Path) -> None:
    """This machine over sshd: its own answer, or without systemd as init the declared failure."""
    seen: dict[str, Any] = {}

    async def body(running: Running) -> None:
        call = {"op": "call", "tool": "time_sync", "args": {"run_on": "local"}}
        seen["answer"] = await running.ask(call)
        seen["records"] = running.audit_records()

    with running_sshd() as sshd:
        with_daemon(
            tmp_path,
            body,
            ssh=True,
            hosts={"local": sshd.host_section()},
            commands=CATALOG / "system",
            schemas=CATALOG / "schemas",
        )
    (host,) = seen["answer"]["data"]["results"]
    (result,) = (r for r in seen["records"] if r["type"] == "result")
    (row,) = result["host_results"]
    if Path("/run/systemd/system").is_dir():  # sd_booted(): systemd is PID 1
        assert host["outcome"] == "success", host
        assert set(host["data"]) == {"synchronized", "ntp_service", "time_zone", "rtc_in_local_tz"}
    else:
        assert host["outcome"] == "failure", host
        assert host["error"]["code"] == "UPSTREAM_UNAVAILABLE"
        assert row["reason"] == "declared_exit_status"


def test_the_system_fixtures_pass_check() -> None:
    """`sshadapter check` on the shipped fixtures: each as declared, every near-miss refused."""
    assert misses(family("system")) == []


def test_every_system_fixture_says_where_it_came_from() -> None:
    """PROVENANCE.md in the catalog's format beside each fixtures directory, naming every case."""
    assert provenance_gaps("system") == []
