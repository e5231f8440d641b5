"""OpenSSH certificates: host certificates pinned to the host's address, user certificates.

Host certificates (docs/operations.md "Host certificates"): ``@cert-authority`` and
``@revoked`` lines in the host's known_hosts are asyncssh's; asyncssh 2.24 then checks
the certificate's validity and, only when it names principals, that the name dialled
is one of them: a certificate signed without principals passes for any host (measured
with asyncssh 2.24.1; OpenSSH's ssh before 10.3 does the same). asyncssh has
no hook that sees the certificate, so ``pin_host_principal`` wraps the connection's
``validate_server_host_key`` when the connection is made, before key exchange: after
asyncssh's own checks pass, a certificate must name the host's ``address`` among its
principals. Without that method the connection is refused (fail closed).

User certificates: a key plus its certificate (``certificate`` or
``credential_certificate`` in the host's section); the validity window is read here
(asyncssh keeps it in private attributes, guarded below) so an expired or not yet
valid certificate is refused before connecting, and its expiry is a metric.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

import asyncssh
from asyncssh.public_key import SSHOpenSSHCertificate, decode_ssh_certificate

# ssh-keygen's "forever": valid_before is 2**64 - 1.
FOREVER: Final = 2**64 - 1
HOST_VALIDATE: Final = "validate_server_host_key"  # asyncssh 2.24's method, wrapped below


class HostCertificateError(ValueError):
    """A host certificate refused by the daemon's own rule (no principals, not the host)."""


class ClientCertificateInvalid(Exception):
    """The host's client certificate is expired or not yet valid: not offered."""


def validity(cert: asyncssh.SSHCertificate) -> tuple[int, int]:
    """(valid_after, valid_before) in seconds since the epoch; ValueError if unreadable."""
    after = getattr(cert, "_valid_after", None)
    before = getattr(cert, "_valid_before", None)
    if not isinstance(after, int) or not isinstance(before, int):
        # asyncssh moved its private fields: refuse rather than guess (fail closed).
        raise ValueError("certificate validity unreadable with this asyncssh version")
    return after, before


def seconds_left(cert: asyncssh.SSHCertificate, now: float) -> float:
    """Seconds to valid_before (negative once expired; +inf for "forever")."""
    _, before = validity(cert)
    return float("inf") if before == FOREVER else before - now


def not_valid(cert: asyncssh.SSHCertificate, now: float) -> str | None:
    """Why the certificate cannot be used at ``now``, or None when it can."""
    after, before = validity(cert)
    if now < after:
        return f"certificate not valid before {_utc(after)}"
    if now >= before:
        return f"certificate expired at {_utc(before)}"
    return None


def check_client_certificate(cert: asyncssh.SSHCertificate) -> None:
    """Raise ClientCertificateInvalid when ``cert`` cannot be used now."""
    why = not_valid(cert, time.time())
    if why is not None:
        raise ClientCertificateInvalid(why)


def check_host_certificate(key_data: bytes, principal: str) -> None:
    """A host certificate must name ``principal``; a plain host key passes (raise: refuse)."""
    try:
        cert = decode_ssh_certificate(key_data)
    except (ValueError, asyncssh.KeyImportError):
        return  # not a certificate: a plain key, already checked against known_hosts
    if not isinstance(cert, SSHOpenSSHCertificate):
        return  # X.509: x509_trusted_certs=None, so asyncssh refuses these itself
    if not cert.principals:
        raise HostCertificateError("Certificate has no principals (valid for any host)")
    if principal not in cert.principals:
        raise HostCertificateError("Certificate principal mismatch")


def pin_host_principal(conn: asyncssh.SSHClientConnection, principal: str) -> None:
    """Make ``conn`` refuse a host certificate that does not name ``principal``."""
    original: Callable[[bytes], asyncssh.SSHKey] | None = getattr(conn, HOST_VALIDATE, None)

    def validate(key_data: bytes) -> asyncssh.SSHKey:
        if original is None:
            raise asyncssh.HostKeyNotVerifiable("host key check unavailable in this asyncssh")
        key = original(key_data)  # asyncssh's checks first: known_hosts, @revoked, CA, validity
        try:
            check_host_certificate(key_data, principal)
        except HostCertificateError as exc:
            raise asyncssh.HostKeyNotVerifiable(f"{exc} for host {principal}") from None
        return key

    setattr(conn, HOST_VALIDATE, validate)


def is_certificate_refusal(message: str) -> bool:
    """Whether asyncssh's HostKeyNotVerifiable message is about a host certificate."""
    return message.startswith(("Certificate", "Host CA key"))


def _utc(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
