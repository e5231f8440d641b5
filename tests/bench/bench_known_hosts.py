"""Issue 19: the known_hosts step of 1,000 connects, parsed per connect vs once (file_cache).

1,000 host aliases share one 1,000-line known_hosts file (one ed25519 key per line, as
`ssh-keyscan` writes them). "Before" is what each connect did until issue 19:
``dial.read_known_hosts`` and ``lists_host``, the parsed object kept by its connection;
"after" is ``FileCache.known_hosts`` (a ``stat``, one parse for all). Figures: CPU time
of the 1,000 steps, and the Python memory still held once all 1,000 objects are kept
(tracemalloc), as the connections would keep them. Not SSH: the handshake is the same.

    .venv/bin/python tests/bench/bench_known_hosts.py      (~40 s)
"""

from __future__ import annotations

import platform
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import asyncssh

from sshadapter.config import HostSection
from sshadapter.runners.ssh.dial import lists_host, read_known_hosts
from sshadapter.runners.ssh.file_cache import FileCache

HOSTS: Final = 1000
LINES: Final = 1000
MIB: Final = 1024 * 1024


def write_file(path: Path) -> None:
    key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().strip()
    path.write_text("".join(f"10.1.{i // 250}.{i % 250 + 1} {key}\n" for i in range(LINES)))


def measure(step: Callable[[HostSection], Any], sections: list[HostSection]) -> tuple[float, float]:
    """CPU seconds for every section's step (untraced), and MiB held with every result kept
    (a second run, under tracemalloc, which slows it)."""
    started = time.process_time()
    kept = [step(section) for section in sections]
    seconds = time.process_time() - started
    del kept
    tracemalloc.start()
    kept = [step(section) for section in sections]
    held = tracemalloc.get_traced_memory()[0] / MIB
    tracemalloc.stop()
    del kept
    return seconds, held


def main() -> int:
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "known_hosts"
        write_file(path)
        sections = [
            HostSection(address=f"10.1.{i // 250}.{i % 250 + 1}", user="u", known_hosts=path)
            for i in range(HOSTS)
        ]

        def before(section: HostSection) -> asyncssh.SSHKnownHosts:
            parsed = read_known_hosts(section.known_hosts)
            lists_host(parsed, section)
            return parsed

        cache = FileCache(None)

        def after(section: HostSection) -> asyncssh.SSHKnownHosts:
            parsed = cache.known_hosts(section.known_hosts)
            lists_host(parsed, section)
            return parsed

        # "after" first: freeing "before"'s ~560 MiB of objects would be timed with it.
        new_s, new_mib = measure(after, sections)
        old_s, old_mib = measure(before, sections)
    print(f"python {sys.version.split()[0]}, asyncssh {asyncssh.__version__}, {platform.node()}")
    print(f"{HOSTS} connects, one {LINES}-line known_hosts:")
    print(f"  parsed per connect: {old_s:.2f} s CPU ({old_s / HOSTS * 1000:.2f} ms each), ", end="")
    print(f"{old_mib:.0f} MiB held ({old_mib / HOSTS:.2f} MiB each)")
    print(f"  parsed once:        {new_s:.3f} s CPU ({new_s / HOSTS * 1e6:.0f} us each), ", end="")
    print(f"{new_mib:.2f} MiB held, {cache.known_hosts_parses} parse")
    ok = new_s * 10 < old_s and new_mib * 10 < old_mib
    print(("PASS" if ok else "FAIL") + ": at least 10x less CPU and memory")
    return 0


if __name__ == "__main__":
    sys.exit(main())
