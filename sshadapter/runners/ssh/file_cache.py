"""known_hosts files and client keys, parsed once and shared by every host's pool.

A known_hosts file is looked at (``stat``) at every connect and parsed again only when
it changed: a new ``(st_dev, st_ino, st_mtime_ns, st_size)``, so an operator's edit,
or a file replaced by ``mv``, applies to the next connection. asyncssh keeps the parsed
object for the life of each connection, so one object for all hosts also means one copy
in memory. Measured with 1,000 aliases sharing one 1,000-line file
(tests/bench/bench_known_hosts.py, 2 shared vCPUs): parsed at every connect, 8.9 ms of
CPU and 0.56 MiB held per connection (8.9 s and 558 MiB for 1,000); from here, one
parse (one 0.56 MiB object) and 37 us per connect (a ``stat`` and the host's match).

Client keys are loaded once per distinct (``client_keys``, ``credential``) and shared;
a key that failed to load is tried again at the next connect.
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh

from sshadapter.config import HostSection
from sshadapter.runners.ssh.dial import load_keys, read_known_hosts

_Version = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size


class FileCache:
    """Parsed known_hosts by path (its latest version only) and loaded keys by source."""

    def __init__(self, credentials_dir: Path | None) -> None:
        self._credentials_dir = credentials_dir
        self._known_hosts: dict[Path, tuple[_Version, asyncssh.SSHKnownHosts]] = {}
        self._keys: dict[tuple[tuple[Path, ...], str], list[asyncssh.SSHKey]] = {}
        self.known_hosts_parses = 0
        """How many times a known_hosts file was parsed (tests and the benchmark read it)."""

    def __repr__(self) -> str:  # no paths of keys: see dial.py
        return f"FileCache(known_hosts={len(self._known_hosts)}, keys={len(self._keys)})"

    def known_hosts(self, path: Path) -> asyncssh.SSHKnownHosts:
        """The parsed file at ``path`` as it is now; raises like ``dial.read_known_hosts``."""
        try:
            st = os.stat(path)
        except OSError:
            version = None  # read_known_hosts says why, as before
        else:
            version = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
            cached = self._known_hosts.get(path)
            if cached is not None and cached[0] == version:
                return cached[1]
        parsed = read_known_hosts(path)
        self.known_hosts_parses += 1
        if version is not None:
            self._known_hosts[path] = (version, parsed)
        return parsed

    def keys(self, section: HostSection) -> list[asyncssh.SSHKey]:
        """The host's client keys, loaded at the first connect that needs them."""
        source = (section.client_keys, section.credential)
        keys = self._keys.get(source)
        if keys is None:
            keys = load_keys(section, self._credentials_dir)
            self._keys[source] = keys
        return keys
