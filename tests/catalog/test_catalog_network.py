"""The network catalog on real kernel files of other systems (tests/support/kernel_corpus.py).

Each corpus file of /proc/net/dev, /proc/net/sockstat and /proc/net/snmp is judged by
the shipped operation and must be accepted with exactly the data a person reads from
it: the expected data is read here by a plain split of the file, independently of the
operation's patterns.
"""

from __future__ import annotations

from typing import Any, Final

import pytest
from catalog_corpus import CATALOG, family
from kernel_corpus import Reader, cases, corpus_bytes, corpus_data

from sshadapter.check.nearmiss import derive
from sshadapter.contract.registry import Registry

NET_DEV_COUNTERS: Final = [
    "rx_bytes",
    "rx_packets",
    "rx_errors",
    "rx_dropped",
    "rx_fifo",
    "rx_frame",
    "rx_compressed",
    "rx_multicast",
    "tx_bytes",
    "tx_packets",
    "tx_errors",
    "tx_dropped",
    "tx_fifo",
    "tx_collisions",
    "tx_carrier",
    "tx_compressed",
]
# The Tcp names of /proc/net/snmp as the agent gets them (RFC 1213's tcp group).
FIXTURES: Final = CATALOG / "network"
TCP_FIELDS: Final = {
    "ActiveOpens": "active_opens",
    "PassiveOpens": "passive_opens",
    "AttemptFails": "attempt_fails",
    "EstabResets": "estab_resets",
    "CurrEstab": "curr_estab",
    "InSegs": "in_segs",
    "OutSegs": "out_segs",
    "RetransSegs": "retrans_segs",
    "InErrs": "in_errs",
    "OutRsts": "out_rsts",
    "InCsumErrors": "in_csum_errors",
}


@pytest.fixture(scope="module")
def network() -> Registry:
    return family("network")


def read_net_dev(text: str) -> list[dict[str, Any]]:
    """/proc/net/dev as a person reads it: two header lines, then name: 16 counters."""
    rows = []
    for line in text.splitlines()[2:]:
        name, counters = line.split(":", 1)
        values = [int(v) for v in counters.split()]
        rows.append({"interface": name.strip(), **dict(zip(NET_DEV_COUNTERS, values, strict=True))})
    return rows


def read_sockstat(text: str) -> dict[str, Any]:
    """/proc/net/sockstat as a person reads it: ``PROTO: name value name value ...``."""
    table: dict[str, dict[str, int]] = {}
    for line in text.splitlines():
        proto, rest = line.split(": ", 1)
        words = rest.split()
        table[proto] = {k: int(v) for k, v in zip(words[::2], words[1::2], strict=True)}
    return {
        "sockets_used": table["sockets"]["used"],
        "tcp_inuse": table["TCP"]["inuse"],
        "tcp_orphan": table["TCP"]["orphan"],
        "tcp_time_wait": table["TCP"]["tw"],
        "tcp_alloc": table["TCP"]["alloc"],
        "tcp_mem_pages": table["TCP"]["mem"],
        "udp_inuse": table["UDP"]["inuse"],
        "udp_mem_pages": table["UDP"].get("mem"),
        "udplite_inuse": table.get("UDPLITE", {}).get("inuse"),
        "raw_inuse": table["RAW"]["inuse"],
        "frag_inuse": table["FRAG"]["inuse"],
        "frag_memory_bytes": table["FRAG"]["memory"],
    }


def read_tcp(text: str) -> dict[str, Any]:
    """The Tcp pair of /proc/net/snmp as a person reads it: names over values."""
    lines = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp: ")]
    names, values = lines
    tcp = dict(zip(names, map(int, values), strict=True))
    return {field: tcp.get(name) for name, field in TCP_FIELDS.items()}


READERS: Final[dict[str, tuple[str, Reader]]] = {
    "interface_counters": ("proc_net_dev", lambda text: {"rows": read_net_dev(text)}),
    "socket_counts": ("proc_net_sockstat", read_sockstat),
    "tcp_stats": ("proc_net_snmp", read_tcp),
}


@pytest.mark.parametrize(("tool", "id_"), cases(READERS))
def test_each_corpus_file_is_read_exactly(network: Registry, tool: str, id_: str) -> None:
    """Each real /proc/net/dev, sockstat and snmp (Linux 2.6 to 6.x) is read exactly.

    What older kernels lack (2.6's UDP mem and UDPLITE, InCsumErrors before 3.10) is null.
    """
    got, read = corpus_data(network, READERS, tool, id_)
    assert got == read


def test_the_2_6_sockstat_has_the_null_fields() -> None:
    """The ARM720T board's Linux 2.6 file is the one that proves the short UDP line is read."""
    data = read_sockstat(corpus_bytes("proc_net_sockstat", "d2000_arm720t").decode())
    assert data["udp_mem_pages"] is None and data["udplite_inuse"] is None


def test_a_null_the_schema_admits_is_no_near_miss(network: Registry) -> None:
    """ip -j prints "link": null for a tunnel on nothing: nulling it is no near-miss; ifname is."""
    op = network.operations["network_interfaces"]
    stdout = (
        FIXTURES / "network_interfaces.fixtures" / "debian12_netns_veth_bridge.stdout"
    ).read_bytes()
    kinds = {kind for kind, _ in derive(op, stdout)}
    assert "null:/1/ifname" in kinds and "null:/1/mtu" in kinds
    assert "null:/1/link" not in kinds
