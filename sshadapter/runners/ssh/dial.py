"""One authenticated SSH connection, with every client-side default that matters pinned.

Security (docs/operations.md "Hosts"): host keys are checked strictly against the
host's ``known_hosts`` file, read again at every connect, and nothing else; a host
certificate must name the host's ``address`` among its principals (certificates.py).
Client keys come from ``client_keys`` files or a systemd credential, with an optional
certificate (then only the certificate is offered); no agent, no
forwarding, no ``~/.ssh/config``, public key authentication only. Key material never
appears in logs, errors or reprs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Final

import asyncssh

from sshadapter.bounded_read import read_bounded
from sshadapter.config import HostSection
from sshadapter.errors import ConfigError
from sshadapter.runners.ssh.certificates import pin_host_principal, validity
from sshadapter.runners.ssh.coalesce import coalesce_writes
from sshadapter.runners.ssh.ignore_packets import skip_ignore_packets
from sshadapter.runners.ssh.translate import KeyLoadError, KnownHostsError, describe

KEEPALIVE_COUNT_MAX: Final = 3  # unanswered keepalives before a connection is declared dead
# AES-GCM first (measured: ~0.55 ms less CPU per call than chacha20 with AES-NI); the
# OpenSSH-style "^" prefix keeps asyncssh's default list after them.
CIPHERS: Final = "^aes128-gcm@openssh.com,aes256-gcm@openssh.com"
DEFAULT_SSH_PORT: Final = 22  # known_hosts entries for port 22 carry no "[host]:port"
# Read on the event loop at every connect (sshadapter/bounded_read.py): ~100 bytes a line,
# so tens of thousands of hosts; a larger file is not a known_hosts file.
MAX_KNOWN_HOSTS_BYTES: Final = 4 * 1024 * 1024
# An OpenSSH private key, even RSA 16384 with a certificate, is under 16 KiB.
MAX_PRIVATE_KEY_BYTES: Final = 64 * 1024
# A user certificate: an RSA 16384 key, a few hundred principals and options, under 16 KiB.
MAX_CERTIFICATE_BYTES: Final = 64 * 1024
ClientKeys = list[asyncssh.SSHKey] | list[asyncssh.SSHKeyPair]


async def dial(
    section: HostSection,
    keys: ClientKeys,
    known_hosts: asyncssh.SSHKnownHosts,
    on_lost: Callable[[asyncssh.SSHClientConnection], None],
    *,
    tunnel: asyncssh.SSHClientConnection | None = None,
) -> asyncssh.SSHClientConnection:
    """One authenticated connection, with every client-side default that matters pinned.

    ``tunnel``: a connection to the host's jump host, itself dialled here with its own
    pins; the TCP stream is then a direct-tcpip channel on it. Never a string: asyncssh
    opens a string's hops with its defaults (~/.ssh/known_hosts, default keys, agent).
    """
    if tunnel is not None and not isinstance(tunnel, asyncssh.SSHClientConnection):
        raise TypeError("tunnel must be a connection dialled here")  # a bug, not input
    return await asyncssh.connect(
        section.address,
        section.port,
        tunnel=tunnel,
        config=None,  # never read ~/.ssh/config
        client_factory=functools.partial(_Client, on_lost, section.address),
        username=section.user,
        known_hosts=known_hosts,  # strict: the file's keys only, never None
        x509_trusted_certs=None,  # no ~/.ssh/ca-bundle.crt
        client_keys=keys,
        agent_path=None,
        agent_forwarding=False,
        x11_forwarding=False,
        pkcs11_provider=None,
        preferred_auth="publickey",
        password_auth=False,
        kbdint_auth=False,
        host_based_auth=False,
        gss_auth=False,
        gss_kex=False,
        proxy_command=None,
        request_pty=False,
        env=None,
        send_env=None,
        encryption_algs=CIPHERS,
        connect_timeout=section.connect_timeout_seconds,
        login_timeout=section.connect_timeout_seconds,
        keepalive_interval=section.keepalive_seconds,
        keepalive_count_max=KEEPALIVE_COUNT_MAX,
    )


class _Client(asyncssh.SSHClient):
    """Tells the pool when its connection closes; asyncssh's defaults refuse unknown host keys,
    and a host certificate must name the address dialled (certificates.pin_host_principal)."""

    def __init__(
        self, on_lost: Callable[[asyncssh.SSHClientConnection], None], principal: str
    ) -> None:
        self._on_lost = on_lost
        self._principal = principal
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn
        pin_host_principal(conn, self._principal)  # before the version exchange and kex
        coalesce_writes(conn)  # one send() per loop turn from here on
        skip_ignore_packets(conn)  # no CBC countermeasure under AES-GCM

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._on_lost(self._conn)


def load_keys(section: HostSection, credentials_dir: Path | None) -> list[asyncssh.SSHKey]:
    """Client keys from files, then the systemd credential. No passphrase: see SshRunner."""
    keys: list[asyncssh.SSHKey] = []
    try:
        for path in section.client_keys:
            keys.append(asyncssh.import_private_key(read_bounded(path, MAX_PRIVATE_KEY_BYTES)))
        if section.credential:
            keys.append(
                asyncssh.import_private_key(_read_credential(section.credential, credentials_dir))
            )
    except ConfigError as exc:  # not a regular file, too large, unreadable
        raise KeyLoadError(exc.reason) from None  # the reason alone: no path (see below)
    except (OSError, ValueError) as exc:  # asyncssh.KeyImportError is a ValueError
        # from None: a parser's context could quote the bytes it choked on.
        # No file name either: where the keys live is nobody's business but the operator's.
        raise KeyLoadError(describe(exc, with_path=False)) from None
    if not keys:
        raise KeyLoadError("no client_keys and no credential configured")
    return keys


def load_certificate(
    section: HostSection, credentials_dir: Path | None
) -> asyncssh.SSHCertificate | None:
    """The host's client certificate (``certificate`` or ``credential_certificate``), or None."""
    try:
        if section.certificate:
            data = read_bounded(Path(section.certificate), MAX_CERTIFICATE_BYTES)
        elif section.credential_certificate:
            data = _read_credential(
                section.credential_certificate, credentials_dir, MAX_CERTIFICATE_BYTES
            )
        else:
            return None
        cert = asyncssh.import_certificate(data)
        if cert.is_x509:
            raise KeyLoadError("certificate: an OpenSSH user certificate is expected, not X.509")
        validity(cert)  # readable, or refused here rather than at every connect
    except ConfigError as exc:
        raise KeyLoadError(f"certificate: {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise KeyLoadError(f"certificate: {describe(exc, with_path=False)}") from None
    return cert


def certified(keys: list[asyncssh.SSHKey], cert: asyncssh.SSHCertificate) -> ClientKeys:
    """The key with its certificate, alone: asyncssh would also offer the bare key after a
    refused certificate (docs/operations.md "User certificates"), which would hide the
    refusal's cause."""
    try:
        pairs = asyncssh.load_keypairs([(keys[0], cert)])
    except (OSError, ValueError) as exc:  # "Certificate key mismatch"
        raise KeyLoadError(f"certificate: {describe(exc, with_path=False)}") from None
    with_cert = [pair for pair in pairs if pair.algorithm == cert.algorithm]
    if not with_cert:
        raise KeyLoadError("certificate: not attached to the key")
    return with_cert


def certificate_label(section: HostSection) -> str | None:
    """The ``credential`` label of the expiry gauge: the file, or ``credential:NAME``."""
    if section.certificate:
        return section.certificate
    if section.credential_certificate:
        return f"credential:{section.credential_certificate}"
    return None


def _read_credential(
    name: str, credentials_dir: Path | None, limit: int = MAX_PRIVATE_KEY_BYTES
) -> bytes:
    if credentials_dir is None:
        raise ValueError("credential configured but $CREDENTIALS_DIRECTORY is not set")
    if "/" in name or name in {".", ".."}:
        raise ValueError("credential name must be a plain file name")
    return read_bounded(credentials_dir / name, limit)


def read_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    """Read on every connect, so an operator's edit applies to the next connection."""
    try:
        return asyncssh.import_known_hosts(read_bounded(path, MAX_KNOWN_HOSTS_BYTES).decode())
    except ConfigError as exc:  # not a regular file, too large, unreadable
        raise KnownHostsError(str(exc)) from exc
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        raise KnownHostsError(describe(exc)) from exc


def lists_host(known_hosts: asyncssh.SSHKnownHosts, section: HostSection) -> bool:
    """Whether known_hosts names this host at all: tells a changed key from an unknown host.

    Matched by name (and by address when ``address`` is one), like asyncssh;
    an entry only for the resolved IP of a host name is not seen here.
    """
    port = None if section.port == DEFAULT_SSH_PORT else section.port
    host_keys, ca_keys, *_ = known_hosts.match(section.address, "", port)
    return bool(host_keys or ca_keys)
