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
a key that failed to load is tried again at the next connect. A client certificate is
looked at like a known_hosts file (parsed again only when it changed), so a renewed
short-lived certificate applies to the next connection, and checked for its validity
window at every connect: an expired one is not offered (certificates.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import asyncssh

from sshadapter.config import HostSection
from sshadapter.runners.ssh.certificates import (
    check_client_certificate,
    not_valid,
    seconds_left,
)
from sshadapter.runners.ssh.dial import (
    ClientKeys,
    certificate_label,
    certified,
    load_certificate,
    load_keys,
    read_known_hosts,
)
from sshadapter.runners.ssh.translate import KeyLoadError

_Version = tuple[int, int, int, int]  # st_dev, st_ino, st_mtime_ns, st_size
_KeySource = tuple[tuple[Path, ...], str]  # client_keys, credential
_Certified = tuple[_Version | None, asyncssh.SSHCertificate, ClientKeys]


class FileCache:
    """Parsed known_hosts by path (its latest version only) and loaded keys by source."""

    def __init__(self, credentials_dir: Path | None) -> None:
        self._credentials_dir = credentials_dir
        self._known_hosts: dict[Path, tuple[_Version, asyncssh.SSHKnownHosts]] = {}
        self._keys: dict[tuple[tuple[Path, ...], str], list[asyncssh.SSHKey]] = {}
        # By (certificate_label, key source): (file version, certificate, keypair built with it).
        self._certs: dict[tuple[str, _KeySource], _Certified] = {}
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

    def keys(self, section: HostSection) -> ClientKeys:
        """The host's client keys, loaded at the first connect that needs them; with a
        certificate, only the key with its certificate, when the certificate is valid now."""
        source = (section.client_keys, section.credential)
        keys = self._keys.get(source)
        if keys is None:
            keys = load_keys(section, self._credentials_dir)
            self._keys[source] = keys
        label = certificate_label(section)
        if label is None:
            return keys
        cert, pairs = self.certificate(section, label, keys)
        check_client_certificate(cert)
        return pairs

    def certificate_expiries(self, sections: Iterable[HostSection]) -> dict[str, float]:
        """Seconds to expiry per distinct certificate of ``sections`` that can be read now
        (the ``sshadapter_credential_expiry_seconds`` gauge); a broken one has no series.

        Called from the metrics listener's thread: it reads the certificate files
        itself and touches none of the caches the event loop uses."""
        now = time.time()
        found: dict[str, float] = {}
        for section in sections:
            label = certificate_label(section)
            if label is None or label in found:
                continue
            try:
                cert = load_certificate(section, self._credentials_dir)
            except KeyLoadError:  # no series: reported when connecting and by `check --hosts`
                cert = None
            if cert is not None:
                found[label] = seconds_left(cert, now)
        return found

    def certificate(
        self, section: HostSection, label: str, keys: list[asyncssh.SSHKey]
    ) -> tuple[asyncssh.SSHCertificate, ClientKeys]:
        if section.certificate:
            path: Path | None = Path(section.certificate)
        elif self._credentials_dir is not None:
            path = self._credentials_dir / section.credential_certificate
        else:
            path = None  # load_certificate says why
        version: _Version | None = None
        if path is not None:
            try:
                st = os.stat(path)
            except OSError:
                pass  # load_certificate says why
            else:
                version = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        key = (label, (section.client_keys, section.credential))
        cached = self._certs.get(key)
        if cached is not None and version is not None and cached[0] == version:
            return cached[1], cached[2]
        cert = load_certificate(section, self._credentials_dir)
        assert cert is not None  # certificate_label said there is one
        pairs = certified(keys, cert)
        if version is not None:
            self._certs[key] = (version, cert, pairs)
        return cert, pairs


def certificate_problems(
    hosts: Mapping[str, HostSection], credentials_dir: Path | None
) -> list[tuple[str, str, str]]:
    """(alias, certificate, why) for each host whose client certificate cannot be used now:
    unreadable, not for the key, expired or not yet valid (``sshadapter check --hosts``)."""
    files = FileCache(credentials_dir)
    now = time.time()
    problems = []
    for alias, section in sorted(hosts.items()):
        label = certificate_label(section)
        if label is None:
            continue
        try:
            keys = load_keys(section, credentials_dir)
            cert, _ = files.certificate(section, label, keys)
            why = not_valid(cert, now)
        except KeyLoadError as exc:
            why = str(exc)
        if why is not None:
            problems.append((alias, label, why))
    return problems
