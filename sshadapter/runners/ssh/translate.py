"""The one place asyncssh and OS exceptions become ``UpstreamError`` (errors.TRANSPORT_REASONS).

CONTRIBUTING.md: errors by blame, mapped in one place. The dialler's own failures
(a key or a known_hosts file that cannot be used) are raised as the two errors below
and mapped here with the rest.
"""

from __future__ import annotations

import errno
from typing import Final

import asyncssh

from sshadapter.errors import UpstreamError
from sshadapter.runners.ssh.certificates import ClientCertificateInvalid, is_certificate_refusal
from sshadapter.shown import shown

DETAIL_MAX_CHARS: Final = 200  # an audit detail is a hint, not a transcript


class KeyLoadError(Exception):
    """A client key or credential cannot be read or parsed. Carries no key material."""


class KnownHostsError(Exception):
    """The host's known_hosts file cannot be read or parsed."""


def translate(
    exc: BaseException,
    *,
    ran: bool,
    connecting: bool = False,
    host_listed: bool = False,
    certificate: bool = False,
) -> UpstreamError:
    """The one place asyncssh and OS exceptions become UpstreamError (errors.TRANSPORT_REASONS).

    ``ran``: the command may have started. ``connecting``: raised while opening
    a connection. ``host_listed``: known_hosts names the host, so a key it
    rejects has changed rather than being unknown. ``certificate``: the client
    offered a certificate (only it), so a refusal is the certificate's.
    """
    detail = describe(exc)

    def error(reason: str, *, retryable: bool, ran: bool = ran) -> UpstreamError:
        return UpstreamError(reason, retryable=retryable, ran=ran, detail=detail)

    if isinstance(exc, KeyLoadError):
        return error("no_credentials", retryable=False, ran=False)
    if isinstance(exc, KnownHostsError):
        return error("host_key_unknown", retryable=False, ran=False)
    if isinstance(exc, ClientCertificateInvalid):
        return error("client_certificate_invalid", retryable=False, ran=False)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable) and is_certificate_refusal(str(exc)):
        return error("host_certificate_refused", retryable=False, ran=False)
    if isinstance(exc, asyncssh.HostKeyNotVerifiable):
        reason = "host_key_mismatch" if host_listed else "host_key_unknown"
        return error(reason, retryable=False, ran=False)
    if isinstance(exc, asyncssh.KeyExchangeFailed) and host_listed and "host key" in str(exc):
        # known_hosts lists only key types the server no longer offers: a changed key too.
        return error("host_key_mismatch", retryable=False, ran=False)
    if isinstance(exc, asyncssh.PermissionDenied) and certificate:
        # sshd says why only in its log: expired there (clock skew), unknown CA, principal.
        return UpstreamError(
            "client_certificate_refused",
            retryable=False,
            ran=False,
            detail=f"{detail}; the host refused the client certificate (see its sshd log)"[
                :DETAIL_MAX_CHARS
            ],
        )
    if isinstance(exc, asyncssh.PermissionDenied):
        return error("auth_failed", retryable=False, ran=False)
    if isinstance(exc, asyncssh.ChannelOpenError) and connecting:  # a jump host's tunnel
        if exc.code == asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED:  # its permitopen says no
            return error("tunnel_refused", retryable=False, ran=False)
        return error("connect_failed", retryable=True, ran=False)  # e.g. nothing listens there
    if isinstance(exc, asyncssh.ChannelOpenError):
        return error("channel_open_failed", retryable=True, ran=False)
    if isinstance(exc, TimeoutError):
        return error("connect_timeout" if connecting else "command_timeout", retryable=True)
    # A name with several addresses all refusing raises a plain OSError("Multiple
    # exceptions: ...") without errno: that one ends up as connect_failed.
    if isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno == errno.ECONNREFUSED
    ):
        return error("connect_refused", retryable=True, ran=False)
    if connecting:  # DNS, unreachable, a drop during the handshake, any other surprise
        return error("connect_failed", retryable=True, ran=False)
    return error("connection_lost", retryable=True)


def again(error: UpstreamError) -> UpstreamError:
    """A fresh copy of a shared connect failure, so each waiter raises its own exception."""
    return UpstreamError(
        error.reason, retryable=error.retryable, ran=error.ran, detail=error.detail
    )


def describe(exc: BaseException, *, with_path: bool = True) -> str:
    """Exception class and message for the audit trail; never key material (see load_keys).

    Escaped and cut (``shown``): the message can be a peer's disconnect reason, sent by
    the host after key exchange or by anyone on the path before it, and this detail
    reaches log lines, `audit show` and `check --hosts`."""
    if isinstance(exc, (KeyLoadError, KnownHostsError, ClientCertificateInvalid)):
        text = str(exc)  # already described where it was raised
    elif isinstance(exc, OSError) and exc.strerror:
        text = f"{type(exc).__name__}: {exc.strerror}"
        if exc.filename and with_path:
            text += f": {exc.filename}"
    else:
        text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return shown(text, DETAIL_MAX_CHARS)
