"""SSH servers for tests and benchmarks: a real OpenSSH sshd, and an asyncssh fault server.

``running_sshd()`` starts ``/usr/sbin/sshd -D -e -f <config>`` on 127.0.0.1 at a
free port, with a host key and a client key generated for the run, and yields
an ``Sshd`` whose ``host_section()`` is ready for ``SshRunner``. As root it logs
in as a dedicated unprivileged account (``sshadapter-test``, created on first
use); otherwise as the current user, the only one a non-root sshd can log in.

``running_fault_server()`` runs an asyncssh server in its own thread and event
loop for what sshd cannot do on demand; the command string picks the behaviour:

    hang                 never answer (until the client closes the channel)
    drop N               write N bytes of stdout, then drop the TCP connection
    flood-stdout N       write N bytes of stdout in chunks, honouring flow control
    flood-stderr N       the same on stderr
    echo WORDS...        print WORDS and a newline, exit 0
    sleep S WORDS...     wait S seconds, then echo WORDS
    blob N               print a JSON object {"blob": "yyy..."} of exactly N bytes, exit 0
    exit N               exit with status N

and with ``disconnect_reason`` set it disconnects after key exchange with those words.
``running_early_disconnect()`` is a bare TCP server that sends a DISCONNECT before any
key exchange, as anyone on the path to a host can.

Neither needs pytest-asyncio: the servers live outside the test's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncssh
import pytest

from sshadapter.config import HostSection

SSHD: Final = Path("/usr/sbin/sshd")
TEST_ACCOUNT: Final = "sshadapter-test"
READY_TIMEOUT_SECONDS: Final = 10.0  # sshd starts in ~50 ms; a loaded CI box gets slack
STOP_TIMEOUT_SECONDS: Final = 5.0  # SIGTERM, then SIGKILL after this
START_ATTEMPTS: Final = 3  # another run may grab the free port between probe and bind
FLOOD_CHUNK_BYTES: Final = 64 * 1024  # the fault server writes floods in chunks this size
SSH_MSG_DISCONNECT: Final = 1  # RFC 4253 11.1

# The test sshd's whole configuration. Deliberate choices:
# - StrictModes no: sshd would refuse authorized_keys in a temp dir not owned the
#   way it wants (ownership of every parent directory); acceptable only in a test.
# - AcceptEnv LC_*: sshd would accept such variables, so the "no environment
#   forwarded" test proves the client sends none rather than that sshd drops them.
# - PermitUserRC no: ~/.ssh/rc output would precede every command's stdout.
# - MaxSessions and MaxStartups are OpenSSH's defaults, written out because the
#   runner's pool bounds are tuned against them.
# - Subsystem sftp: as on a stock host (Debian's sshd_config has one), so scp and sftp
#   have something to ask for; behind a forced command they reach the dispatcher.
SSHD_CONFIG: Final = """\
ListenAddress 127.0.0.1:{port}
HostKey {host_key}
PidFile {workdir}/sshd.pid
AuthorizedKeysFile {workdir}/authorized_keys
AllowUsers {user}
StrictModes no
UsePAM no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
PermitUserRC no
PrintMotd no
PrintLastLog no
X11Forwarding no
AllowAgentForwarding no
AllowTcpForwarding no
AcceptEnv LC_*
Subsystem sftp internal-sftp
MaxSessions {max_sessions}
MaxStartups 10:30:100
LogLevel ERROR
"""


@dataclass(frozen=True)
class Sshd:
    """A running test sshd and the files a client needs to reach it."""

    address: str
    port: int
    user: str
    client_key: Path
    known_hosts: Path
    host_key: Path
    workdir: Path

    def host_section(self, **overrides: Any) -> HostSection:
        """A [hosts.<alias>] section for this server; keyword arguments override fields."""
        fields: dict[str, Any] = {
            "address": self.address,
            "port": self.port,
            "user": self.user,
            "client_keys": (self.client_key,),
            "known_hosts": self.known_hosts,
            "connect_timeout_seconds": 5.0,
        }
        fields.update(overrides)
        return HostSection(**fields)

    def host_toml(self, *aliases: str, **overrides: Any) -> str:
        """``[hosts.<alias>]`` tables reaching this server, for a test's config file;
        keyword arguments add or override keys, and None leaves a key out."""
        section = self.host_section()
        return hosts_toml(aliases, section, overrides)

    def authorize(self, options: str = "", *, more: Mapping[Path, str] | None = None) -> str:
        """Put ``options`` (``restrict,command="..."``) in front of the client key, and
        ``more`` keys (private key path -> options) after it; returns the client key's line.
        sshd reads the file at every login; ``authorize()`` puts the plain key back."""
        lines = [_key_line(self.client_key, options)]
        lines += [_key_line(key, opts) for key, opts in (more or {}).items()]
        (self.workdir / "authorized_keys").write_text("".join(f"{line}\n" for line in lines))
        return lines[0]


def hosts_toml(aliases: tuple[str, ...], section: HostSection, overrides: Mapping[str, Any]) -> str:
    """``[hosts.<alias>]`` tables with ``section``'s address, port, user, client keys and
    known_hosts; ``overrides`` add or override keys, and None leaves a key out."""
    keys: dict[str, Any] = {
        "address": section.address,
        "port": section.port,
        "user": section.user,
        "client_keys": list(section.client_keys),
        "known_hosts": section.known_hosts,
        **overrides,
    }
    body = "".join(f"{key} = {_toml(value)}\n" for key, value in keys.items() if value is not None)
    return "".join(f"[hosts.{alias}]\n{body}\n" for alias in aliases)


def _toml(value: Any) -> str:
    """A TOML value: JSON's strings, numbers and arrays are TOML's too."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def _key_line(private_key: Path, options: str) -> str:
    key = private_key.with_suffix(".pub").read_text().strip()
    return f"{options} {key}" if options else key


def default_signals() -> Callable[[], None]:
    """A ``preexec_fn`` giving a child every signal at its default disposition.

    An ignored signal stays ignored across fork and exec, and a shell that
    starts the suite in the background (``./scripts/test &``, or under ``trap
    '' QUIT INT``) hands it ignored SIGQUIT and SIGINT. ``restore_signals``
    puts back only what Python itself ignores (SIGPIPE, SIGXFSZ), so a test
    that looks at a child's signals, or a child that must die of one, would
    depend on how the suite was started. The list is taken here, in the
    parent; the child only resets.
    """
    fatal = {signal.SIGKILL, signal.SIGSTOP}
    ignored = [
        sig
        for sig in signal.valid_signals()
        if sig not in fatal and signal.getsignal(sig) == signal.SIG_IGN
    ]

    def reset() -> None:
        for sig in ignored:
            signal.signal(sig, signal.SIG_DFL)

    return reset


def require_sshd() -> None:
    """Skip when OpenSSH is not installed, or fail when $CI says it must be."""
    if SSHD.exists() and shutil.which("ssh-keygen"):
        return
    message = "OpenSSH sshd/ssh-keygen not installed: run scripts/install-test-deps"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def generate_key(path: Path, comment: str = "sshadapter-test") -> str:
    """An unencrypted ed25519 key pair at ``path`` (+ ``.pub``); returns the public line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def write_known_hosts(path: Path, address: str, port: int, public_key_line: str) -> Path:
    """known_hosts naming ``[address]:port`` with one key ("type base64 [comment]")."""
    key_type, key_data = public_key_line.split()[:2]
    path.write_text(f"[{address}]:{port} {key_type} {key_data}\n")
    return path


def login_account() -> str:
    """The account sshd logs the tests in as (created when running as root)."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name
    _ensure_test_account()
    return TEST_ACCOUNT


def _ensure_test_account() -> None:
    """Create ``sshadapter-test`` once; idempotent, and safe when runs race."""
    try:
        pwd.getpwnam(TEST_ACCOUNT)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--create-home", "--shell", "/bin/sh", TEST_ACCOUNT],
            capture_output=True,
            text=True,
            check=False,
        )
        try:
            pwd.getpwnam(TEST_ACCOUNT)  # another run may have created it meanwhile
        except KeyError:
            raise RuntimeError(f"useradd {TEST_ACCOUNT} failed: {created.stderr}") from None
    # useradd leaves the password "!" (locked); sshd without PAM refuses locked
    # accounts even for key logins. "*" means "no password" without the lock.
    if _shadow_password(TEST_ACCOUNT).startswith("!"):
        subprocess.run(["usermod", "-p", "*", TEST_ACCOUNT], check=True, capture_output=True)
    # sshd as root wants its privilege separation directory (Debian creates it at boot).
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)


def _shadow_password(user: str) -> str:
    with open("/etc/shadow") as shadow:
        for line in shadow:
            fields = line.split(":")
            if fields[0] == user:
                return fields[1]
    return ""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def running_sshd(
    *,
    max_sessions: int = 10,
    configure: Callable[[Path], str] | None = None,
    extra_config: str = "",
) -> Iterator[Sshd]:
    """Start a private sshd; stop it and remove its files on exit. ``configure(workdir)``,
    called once the keys exist (``host_key``, ``client_key`` and their ``.pub``), returns
    more sshd_config lines (``HostCertificate``, ``TrustedUserCAKeys``, ...);
    ``extra_config`` is appended after them (``{user}`` replaced by the login account): a
    ``Match`` block."""
    require_sshd()
    user = login_account()
    # Not under pytest's tmp_path: that is 0700 root, and sshd reads authorized_keys
    # as the login account, which must be able to traverse to it.
    workdir = Path(tempfile.mkdtemp(prefix="sshadapter-sshd-"))
    try:
        workdir.chmod(0o755)
        host_key, client_key = workdir / "host_key", workdir / "client_key"
        host_public = generate_key(host_key, "sshadapter-test-host")
        authorized = workdir / "authorized_keys"
        authorized.write_text(generate_key(client_key) + "\n")
        authorized.chmod(0o644)
        extra = configure(workdir) if configure is not None else ""
        for attempt in range(1, START_ATTEMPTS + 1):
            port = _free_port()
            config = workdir / "sshd_config"
            config.write_text(
                SSHD_CONFIG.format(
                    port=port,
                    host_key=host_key,
                    workdir=workdir,
                    user=user,
                    max_sessions=max_sessions,
                )
                + extra
                + extra_config.replace("{user}", user)
            )
            with _sshd_process(config, workdir / "sshd.log", port) as started:
                if not started:
                    if attempt == START_ATTEMPTS:
                        log = (workdir / "sshd.log").read_text(errors="replace")
                        raise RuntimeError(f"sshd did not start: {log}")
                    continue
                yield Sshd(
                    address="127.0.0.1",
                    port=port,
                    user=user,
                    client_key=client_key,
                    known_hosts=write_known_hosts(
                        workdir / "known_hosts", "127.0.0.1", port, host_public
                    ),
                    host_key=host_key,
                    workdir=workdir,
                )
                return
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def _sshd_process(config: Path, log_path: Path, port: int) -> Iterator[bool]:
    """Run sshd; yields whether it answered on ``port`` with an SSH banner in time."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=default_signals(),  # sessions inherit sshd's dispositions
        )
        try:
            yield _wait_ready(process, port)
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_ready(process: subprocess.Popen[bytes], port: int) -> bool:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False  # e.g. the port was taken after all
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=1.0) as probe,
        ):
            if probe.recv(4) == b"SSH-":
                return True
        time.sleep(0.02)
    return False


# The asyncssh fault server -------------------------------------------------


class FaultServer:
    """An asyncssh server in a thread of its own, scripted by the command string."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.user = "fault"
        self.flood_bytes_written = 0  # by the last flood, when the client cut it off
        self.commands_seen: list[str] = []  # every exec request the server acted on
        self.forced_command: str | None = None
        """Run this instead of what the client asked (like sshd's ForceCommand): one
        server of a fleet hangs or lies while the others answer the same command."""
        self.auth_delay = 0.0  # seconds each handshake waits before authentication
        self.handshaking = 0  # connections accepted and not yet authenticated
        self.handshakes_peak = 0  # the most of those at once (reset it before a test)
        self.accepted = 0  # connections accepted so far
        self.closed_by_client: list[str] = []
        """Commands whose channel the client closed while the server still held it open."""
        self.never_closed = 0  # channels of never-close: left open for good
        self.held = 0  # never-close-held commands waiting for release_held()
        self.disconnect_reason: str | None = None
        """After key exchange, instead of authenticating: disconnect with this reason (what
        a hostile host may say)."""
        host_key = asyncssh.generate_private_key("ssh-ed25519")
        client_key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = workdir / "fault_client_key"
        client_key.write_private_key(self.client_key)
        self.client_key.chmod(0o600)
        self._host_key = host_key
        self._host_public = host_key.export_public_key().decode()
        self._authorized = asyncssh.import_authorized_keys(client_key.export_public_key().decode())
        self.known_hosts = workdir / "fault_known_hosts"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._release: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[asyncssh.SSHServerConnection] = set()
        self._error: BaseException | None = None

    @property
    def open_connections(self) -> int:
        """Connections accepted and not closed yet, by either side."""
        return sum(not conn.is_closed() for conn in list(self._connections))

    def host_section(self, **overrides: Any) -> HostSection:
        fields: dict[str, Any] = {
            "address": "127.0.0.1",
            "port": self.port,
            "user": self.user,
            "client_keys": (self.client_key,),
            "known_hosts": self.known_hosts,
            "connect_timeout_seconds": 5.0,
        }
        fields.update(overrides)
        return HostSection(**fields)

    def host_toml(self, *aliases: str, **overrides: Any) -> str:
        """``[hosts.<alias>]`` tables reaching this server, as ``Sshd.host_toml``."""
        return hosts_toml(aliases, self.host_section(), overrides)

    def start(self) -> None:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(READY_TIMEOUT_SECONDS) or self._error is not None:
            raise RuntimeError(f"fault server did not start: {self._error!r}")
        write_known_hosts(self.known_hosts, "127.0.0.1", self.port, self._host_public)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(STOP_TIMEOUT_SECONDS)

    def release_held(self) -> None:
        """Let every never-close-held command answer, now and from now on."""
        if self._loop is not None and self._release is not None:
            self._loop.call_soon_threadsafe(self._release.set)

    def drop_connections(self) -> None:
        """Abort every server-side connection: the client's pooled ones go stale."""
        if self._loop is not None:
            done = threading.Event()

            def abort_all() -> None:
                for conn in list(self._connections):
                    conn.abort()
                done.set()

            self._loop.call_soon_threadsafe(abort_all)
            done.wait(STOP_TIMEOUT_SECONDS)

    def _serve(self, ready: threading.Event) -> None:
        try:
            asyncio.run(self._main(ready))
        except BaseException as exc:  # reported by start()
            self._error = exc
            ready.set()

    async def _main(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._release = asyncio.Event()
        server = self

        class Tracking(asyncssh.SSHServer):
            authenticated = False

            def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
                self.conn = conn
                server._connections.add(conn)
                server.accepted += 1
                server.handshaking += 1
                server.handshakes_peak = max(server.handshakes_peak, server.handshaking)

            async def begin_auth(self, username: str) -> bool:
                await asyncio.sleep(server.auth_delay)
                if server.disconnect_reason is not None:
                    self.conn.disconnect(asyncssh.DISC_PROTOCOL_ERROR, server.disconnect_reason)
                return True  # then the authorized client key, as configured below

            def auth_completed(self) -> None:
                self.authenticated = True
                server.handshaking -= 1

            def connection_lost(self, exc: Exception | None) -> None:
                if not self.authenticated:
                    server.handshaking -= 1
                server._connections.difference_update(
                    [c for c in server._connections if c.is_closed()]
                )

        acceptor = await asyncssh.create_server(
            Tracking,
            "127.0.0.1",
            0,
            config=None,
            server_host_keys=[self._host_key],
            authorized_client_keys=self._authorized,
            process_factory=self._handle,
            encoding=None,
        )
        self.port = acceptor.get_port()
        ready.set()
        try:
            await self._stop.wait()
        finally:
            acceptor.close()
            await acceptor.wait_closed()
            for conn in list(self._connections):
                conn.abort()

    async def _handle(self, process: asyncssh.SSHServerProcess[bytes]) -> None:
        self.commands_seen.append(process.command or "")
        verb, *args = (self.forced_command or process.command or "").split()
        status = 0
        try:
            if verb == "hang":
                await process.channel.wait_closed()
            elif verb == "drop":
                process.stdout.write(b"x" * int(args[0]))
                await process.stdout.drain()
                process.channel.get_connection().abort()
            elif verb in {"flood-stdout", "flood-stderr"}:
                stream = process.stdout if verb == "flood-stdout" else process.stderr
                await self._flood(stream, int(args[0]))
            elif verb == "echo":
                process.stdout.write(" ".join(args).encode() + b"\n")
            elif verb == "sleep":
                await asyncio.sleep(float(args[0]))
                process.stdout.write(" ".join(args[1:]).encode() + b"\n")
            elif verb == "blob":
                await self._blob(process.stdout, int(args[0]))
            elif verb == "exit":
                status = int(args[0])
            elif verb == "status-before-output":  # exit-status, then output, then EOF
                _send_exit_status(process, 3)
                await asyncio.sleep(0.05)
                process.stdout.write(b"late\n")
                await process.stdout.drain()
                await asyncio.sleep(0.05)
                process.channel.write_eof()
                process.channel.close()
                return
            elif verb == "no-close":  # output, EOF and exit-status; the server never closes
                process.stdout.write(b"done\n")
                process.channel.write_eof()
                _send_exit_status(process, 0)
                await process.channel.wait_closed()  # closed by the client
                self.closed_by_client.append(process.command or "")
                return
            elif verb in {"never-close", "never-close-held"}:  # like no-close, and not even
                # the client's close is answered: the channel stays half-closed until the
                # connection goes. -held answers only after release_held().
                if verb == "never-close-held" and self._release is not None:
                    self.held += 1
                    await self._release.wait()
                process.channel._close_send = _discard_close  # type: ignore[method-assign]
                process.stdout.write(" ".join(args).encode() + b"\n")
                process.channel.write_eof()
                _send_exit_status(process, 0)
                self.never_closed += 1
                await process.channel.wait_closed()  # only when the connection closes
                return
            else:
                process.stderr.write(b"unknown fault command\n")
                status = 127
        except (OSError, asyncssh.Error):
            pass  # the client went away, which is the point of most of these cases
        with contextlib.suppress(OSError, asyncssh.Error):
            process.exit(status)

    async def _blob(self, stream: asyncssh.SSHWriter[bytes], total: int) -> None:
        """A JSON object ``{"blob": "yyy..."}`` of exactly ``total`` bytes (total >= 12)."""
        stream.write(b'{"blob":"')
        await self._flood(stream, total - 12)
        stream.write(b'"}\n')

    async def _flood(self, stream: asyncssh.SSHWriter[bytes], total: int) -> None:
        chunk = b"y" * FLOOD_CHUNK_BYTES
        self.flood_bytes_written = 0
        while self.flood_bytes_written < total:
            piece = chunk[: total - self.flood_bytes_written]
            stream.write(piece)
            await stream.drain()
            self.flood_bytes_written += len(piece)


def _discard_close() -> None:
    """A channel's CHANNEL_CLOSE, never sent (asyncssh's ``_close_send`` replaced)."""


def _send_exit_status(process: asyncssh.SSHServerProcess[bytes], status: int) -> None:
    """The exit-status request alone: asyncssh's public exit() also closes the channel."""
    process.channel._send_request(b"exit-status", asyncssh.packet.UInt32(status))


@contextlib.contextmanager
def running_fault_server(workdir: Path) -> Iterator[FaultServer]:
    server = FaultServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def running_early_disconnect(reason: str) -> Iterator[int]:
    """A TCP server on 127.0.0.1 (its port yielded) that answers every connection with an
    SSH version line and, before any key exchange, an unencrypted SSH_MSG_DISCONNECT with
    ``reason``: what anyone on the path to a host can send, holding no host key."""
    payload = (
        bytes([SSH_MSG_DISCONNECT])
        + asyncssh.packet.UInt32(asyncssh.DISC_PROTOCOL_ERROR)
        + asyncssh.packet.String(reason.encode())
        + asyncssh.packet.String(b"")
    )
    # RFC 4253 6: length, padding length, payload, at least 4 bytes of padding, the whole
    # a multiple of 8 bytes.
    padding = 4 + (-(4 + 1 + len(payload) + 4) % 8)
    packet = (
        asyncssh.packet.UInt32(1 + len(payload) + padding)
        + bytes([padding])
        + payload
        + bytes(padding)
    )
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            with conn, contextlib.suppress(OSError):
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n" + packet)
                conn.settimeout(READY_TIMEOUT_SECONDS)
                while conn.recv(4096):  # until the client closes
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        listener.close()
        thread.join(STOP_TIMEOUT_SECONDS)


@contextlib.contextmanager
def host_directory() -> Iterator[Path]:
    """A directory standing for a host's files, readable by the login account (0755).

    The dispatcher reads a policy only where nobody but root (or the forced
    command's ``--policy-owner``) could change it, so not under /tmp (1777):
    as root under /run (0755 root), otherwise under the user's home, which
    ``policy_owner_args()`` then names."""
    directory = Path(tempfile.mkdtemp(prefix="sshadapter-host-", dir=trusted_base()))
    try:
        directory.chmod(0o755)
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def trusted_base() -> Path:
    """Where host_directory() makes its directories: a chain no one else may write."""
    return Path("/run") if os.geteuid() == 0 else Path.home()


def policy_owner_args() -> list[str]:
    """The dispatcher's ``--policy-owner`` when the tests cannot make root's files."""
    return [] if os.geteuid() == 0 else ["--policy-owner", str(os.geteuid())]
