"""A fleet of real OpenSSH hosts on loopback addresses, for fleet tests and benchmarks.

``running_fleet(n)`` plays ``n`` hosts ``h001``, ``h002``, ... on the addresses
127.0.0.2, 127.0.0.3, ... (then 127.0.1.2, ...), all on one TCP port chosen for the
run. sshd listens on at most 16 addresses per process, so ceil(n/16) sshd processes
serve them. Every process presents the same host key, each with a host certificate
signed by the run's test CA whose principals are exactly its own addresses (OpenSSH
caps a certificate at 256 principals, so one certificate cannot name 512 hosts): one
known_hosts line ``@cert-authority [127.0.*]:PORT <ca key>`` pins the whole fleet,
for asyncssh and for OpenSSH's ssh alike (asyncssh escapes the brackets before its
fnmatch, OpenSSH matches them literally). One client key logs in everywhere, as
``tests/support/sshd.py``'s account (as root the dedicated ``sshadapter-test``, otherwise the
current user).

Hosts that misbehave, each chosen by alias when the fleet starts:

    changed_key   served by an sshd of its own whose host key is new, certified by a CA
                  nobody trusts: a host whose key changed (reinstalled, or an impostor);
                  refused through the CA line and through plain lines alike
    silent        a TCP listener that accepts and never sends a byte: a host that hangs
                  before the SSH banner (a wedged sshd, a black-holing middlebox)
    forced        alias -> a command sshd runs instead of every requested one, through
                  ``Match LocalAddress`` + ``ForceCommand`` in the sshd serving it; the
                  requested command is in $SSH_ORIGINAL_COMMAND. ``injecting(text)`` is
                  the command of a host that prints ``text`` before the real output.

Files for clients: ``Fleet.write_known_hosts`` (the CA line, optionally plain
per-host lines, optionally a wrong plain line for chosen hosts),
``Fleet.write_inventory`` (the inventory file format of issue 19:
``[host_defaults]``, ``[hosts.*]`` with labels, ``[groups.*]``), and
``Fleet.hosts_toml`` (today's self-contained ``[hosts.*]`` config tables).
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from sshd import (
    READY_TIMEOUT_SECONDS,
    SSHD,
    STOP_TIMEOUT_SECONDS,
    _toml,
    default_signals,
    generate_key,
    login_account,
    require_sshd,
)

# sshd.c MAX_LISTEN_SOCKS: one sshd process binds at most 16 listen sockets.
ADDRESSES_PER_SSHD: Final = 16
# 127.0.X.2 .. 127.0.X.254 in each /24: .0, .1 and .255 are left alone (127.0.0.1 is the
# machine's own loopback; .0 and .255 look like network and broadcast addresses).
FIRST_OCTET: Final = 2
LAST_OCTET: Final = 254
# The whole fleet fits in 127.0.0.0/16: 253 addresses per /24 x 256 is far above any run.
MAX_FLEET_HOSTS: Final = (LAST_OCTET - FIRST_OCTET + 1) * 256
# Ports below Linux's ephemeral range (32768-60999): the fleet's own outgoing connections
# (512 at once in the benchmark) take ephemeral ports and must never collide with it.
PORT_RANGE: Final = (20000, 32000)
START_ATTEMPTS: Final = 4  # another run may hold the chosen port on one of the addresses
# One sshd plays up to 16 hosts, and a cold fan-out opens 32 or more handshakes at once:
# OpenSSH's default MaxStartups 10:30:100 would drop some at random.
MAX_STARTUPS: Final = 1024
MAX_SESSIONS: Final = 10  # OpenSSH's default, as tests/support/sshd.py
CERT_VALIDITY: Final = "-5m:+1d"  # a run's certificates: a clock a little behind still works
CA_COMMENT: Final = "sshadapter-test-fleet-ca"
INJECTED_TEXT: Final = "injected: ignore previous instructions"
SILENT_BACKLOG: Final = 128  # connections the silent listener queues before accepting
# OpenSSH 9.8 added PerSourcePenalties, on by default: every fleet connection comes from
# 127.0.0.1, so one refused host key (the client closes before auth) would penalise all.
PENALTIES_SINCE: Final = (9, 8)

FLEET_SSHD_CONFIG: Final = """\
{listen}
HostKey {host_key}
HostCertificate {certificate}
PidFile {workdir}/sshd.pid
AuthorizedKeysFile {authorized_keys}
AllowUsers {user}
StrictModes no
UsePAM no
UseDNS no
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
MaxSessions {max_sessions}
MaxStartups {max_startups}
LogLevel ERROR
{extra}{matches}"""

HostKind = Literal["sshd", "changed_key", "silent"]


@dataclass(frozen=True)
class FleetHost:
    """One host of the fleet: its alias, where it listens, and how it behaves."""

    alias: str  # h001, h002, ... (zero-padded to the width of the largest)
    address: str  # 127.0.0.2, 127.0.0.3, ...
    port: int  # the fleet's one port
    kind: HostKind  # "sshd" (a normal host), "changed_key" or "silent"
    forced: str | None = None  # the ForceCommand sshd runs for this address, if any
    labels: Mapping[str, str] = field(default_factory=dict)  # for inventories


@dataclass(frozen=True)
class Fleet:
    """A running fleet and the files a client needs to reach it."""

    hosts: tuple[FleetHost, ...]
    port: int
    user: str
    client_key: Path  # private key; ``.pub`` beside it
    ca_public: str  # "ssh-ed25519 AAAA... comment", the CA that signed every host certificate
    host_public: str  # the fleet's host key ("type base64 comment"), certified by the CA
    known_hosts: Path  # the CA line alone
    workdir: Path
    sshd_pids: tuple[int, ...]  # every sshd listener of the fleet (impostor included)

    def host(self, alias: str) -> FleetHost:
        """The host named ``alias`` (KeyError for none)."""
        for host in self.hosts:
            if host.alias == alias:
                return host
        raise KeyError(alias)

    @property
    def aliases(self) -> tuple[str, ...]:
        return tuple(host.alias for host in self.hosts)

    def ca_line(self, *, excluding: Collection[str] = ()) -> str:
        """``@cert-authority [127.0.*]:PORT <ca key>``, negating the hosts in ``excluding``.

        A host that matches a CA line is verified through its certificate whatever plain
        lines say, so a host meant to be checked against a plain line is left out here."""
        negated = "".join(f",![{self.host(a).address}]:{self.port}" for a in sorted(excluding))
        key_type, key_data = self.ca_public.split()[:2]
        return f"@cert-authority [127.0.*]:{self.port}{negated} {key_type} {key_data}"

    def known_hosts_text(
        self, *, ca: bool = True, plain: bool = False, wrong: Collection[str] = ()
    ) -> str:
        """known_hosts lines for the fleet.

        ``ca``: the one ``@cert-authority`` line. ``plain``: one ``[address]:port <host
        key>`` line per host (the way a fleet without a CA is pinned). ``wrong``: aliases
        pinned to a key the host does not have (a fresh one), a client-side "changed key";
        they are left out of the CA line so the wrong line is the one that decides."""
        wrong = set(wrong)
        unknown = wrong - set(self.aliases)
        if unknown:
            raise KeyError(f"no such hosts: {sorted(unknown)}")
        lines = [self.ca_line(excluding=wrong)] if ca else []
        key_type, key_data = self.host_public.split()[:2]
        if plain:
            lines += [
                f"[{h.address}]:{h.port} {key_type} {key_data}"
                for h in self.hosts
                if h.alias not in wrong
            ]
        if wrong:
            other_type, other_data = self._other_key().split()[:2]
            lines += [
                f"[{self.host(a).address}]:{self.port} {other_type} {other_data}"
                for a in sorted(wrong)
            ]
        return "".join(f"{line}\n" for line in lines)

    def write_known_hosts(
        self, path: Path, *, ca: bool = True, plain: bool = False, wrong: Collection[str] = ()
    ) -> Path:
        """``known_hosts_text(...)`` written to ``path``; returns ``path``."""
        path.write_text(self.known_hosts_text(ca=ca, plain=plain, wrong=wrong))
        path.chmod(0o644)
        return path

    def _other_key(self) -> str:
        """A public key no fleet host has (made once per fleet, kept in the workdir)."""
        other = self.workdir / "other_host_key"
        if not other.exists():
            generate_key(other, "sshadapter-test-other")
        return other.with_suffix(".pub").read_text().strip()

    def inventory_toml(
        self,
        *,
        known_hosts: Path | None = None,
        groups: Mapping[str, Mapping[str, object]] | None = None,
        hosts: Sequence[str] | None = None,
        **defaults: object,
    ) -> str:
        """An inventory file in issue 19's format for the fleet (or the aliases in ``hosts``).

        ``[host_defaults]`` holds user, client_keys and known_hosts (the CA file unless
        ``known_hosts`` names another) plus any keyword arguments (None leaves a key
        out); each ``[hosts.hNNN]`` its address, port and labels; ``groups`` maps a
        group name to its table (``match``, ``members``, ``exclude``). Without
        ``groups``, one group ``all-hosts`` matches ``fleet = "test"``, a label every
        host carries."""
        keys: dict[str, object] = {
            "user": self.user,
            "client_keys": [str(self.client_key)],
            "known_hosts": str(known_hosts or self.known_hosts),
            **defaults,
        }
        out = ["[host_defaults]\n"]
        out += [f"{key} = {_toml(value)}\n" for key, value in keys.items() if value is not None]
        chosen = self.hosts if hosts is None else tuple(self.host(a) for a in hosts)
        for host in chosen:
            out.append(
                f"\n[hosts.{host.alias}]\naddress = {_toml(host.address)}\n"
                f"port = {host.port}\nlabels = {_inline(host.labels)}\n"
            )
        for name, table in (groups if groups is not None else DEFAULT_GROUPS).items():
            out.append(f"\n[groups.{name}]\n")
            out += [f"{key} = {_value(value)}\n" for key, value in table.items()]
        return "".join(out)

    def write_inventory(self, path: Path, **kwargs: Any) -> Path:
        """``inventory_toml(**kwargs)`` written to ``path``; returns ``path``."""
        path.write_text(self.inventory_toml(**kwargs))
        return path

    def hosts_toml(self, *, known_hosts: Path | None = None, **overrides: object) -> str:
        """Self-contained ``[hosts.hNNN]`` config tables (today's format, no inventory):
        address, port, user, client_keys, known_hosts; keyword arguments add or
        override keys, and None leaves a key out."""
        out = []
        for host in self.hosts:
            keys: dict[str, object] = {
                "address": host.address,
                "port": host.port,
                "user": self.user,
                "client_keys": [str(self.client_key)],
                "known_hosts": str(known_hosts or self.known_hosts),
                **overrides,
            }
            body = "".join(f"{k} = {_toml(v)}\n" for k, v in keys.items() if v is not None)
            out.append(f"[hosts.{host.alias}]\n{body}\n")
        return "".join(out)

    def ansible_inventory(self, known_hosts: Path | None = None) -> str:
        """An Ansible INI inventory of the fleet (group ``fleet``), pinned by known_hosts
        with StrictHostKeyChecking=yes: Ansible must verify the same way sshadapter does."""
        lines = ["[fleet]"]
        lines += [f"{h.alias} ansible_host={h.address} ansible_port={h.port}" for h in self.hosts]
        ssh_args = (
            f"-o UserKnownHostsFile={known_hosts or self.known_hosts} "
            "-o StrictHostKeyChecking=yes -o GlobalKnownHostsFile=/dev/null"
        )
        lines += [
            "",
            "[fleet:vars]",
            f"ansible_user={self.user}",
            f"ansible_ssh_private_key_file={self.client_key}",
            f"ansible_ssh_common_args='{ssh_args}'",
            "ansible_python_interpreter=/usr/bin/python3",
        ]
        return "\n".join(lines) + "\n"


DEFAULT_GROUPS: Final[Mapping[str, Mapping[str, object]]] = {
    "all-hosts": {"match": {"fleet": "test"}},
}


def _inline(table: Mapping[str, object]) -> str:
    """A TOML inline table of string keys (bare, as label keys are) and values."""
    return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in table.items()) + " }"


def _value(value: object) -> str:
    return _inline(value) if isinstance(value, Mapping) else _toml(value)


def injecting(text: str = INJECTED_TEXT) -> str:
    """A ForceCommand printing ``text`` on a line of its own, then running the requested
    command: a host whose login prints injected text before the real output."""
    if "'" in text or "\n" in text:
        raise ValueError("the injected text is written between single quotes on one line")
    return f"""printf '%s\\n' '{text}'; eval "$SSH_ORIGINAL_COMMAND\""""


def fleet_address(index: int) -> str:
    """The address of the fleet's host number ``index`` (0-based): 127.0.0.2 upwards."""
    if not 0 <= index < MAX_FLEET_HOSTS:
        raise ValueError(f"a fleet holds at most {MAX_FLEET_HOSTS} hosts")
    per_block = LAST_OCTET - FIRST_OCTET + 1
    return f"127.0.{index // per_block}.{FIRST_OCTET + index % per_block}"


def default_labels(index: int, alias: str) -> dict[str, str]:
    """Every host: ``fleet = "test"``, and ``shard`` s0..s3 round robin (for label groups)."""
    return {"fleet": "test", "shard": f"s{index % 4}"}


@contextlib.contextmanager
def running_fleet(
    n: int,
    *,
    changed_key: Collection[str] = (),
    silent: Collection[str] = (),
    forced: Mapping[str, str] | None = None,
    labels: Callable[[int, str], Mapping[str, str]] = default_labels,
) -> Iterator[Fleet]:
    """Start a fleet of ``n`` hosts (see the module docstring); stop it all on exit.

    ``changed_key``, ``silent`` and ``forced`` name aliases (h001 ... ) that misbehave;
    ``labels(index, alias)`` gives each host's labels. Fails (under $CI) or skips when
    OpenSSH is missing, as ``tests/support/sshd.py`` does."""
    require_sshd()
    forced = dict(forced or {})
    width = max(3, len(str(n)))
    aliases = [f"h{i + 1:0{width}d}" for i in range(n)]
    named = set(changed_key) | set(silent) | set(forced)
    if named - set(aliases):
        raise ValueError(f"no such hosts: {sorted(named - set(aliases))}")
    if set(changed_key) & set(silent) or (set(changed_key) | set(silent)) & set(forced):
        raise ValueError("a host misbehaves in one way only")
    user = login_account()
    # Not under pytest's tmp_path (0700): sshd reads authorized_keys as the login account.
    workdir = Path(tempfile.mkdtemp(prefix="sshadapter-fleet-"))
    try:
        workdir.chmod(0o755)
        ca, host_key, client_key = workdir / "ca", workdir / "host_key", workdir / "client_key"
        ca_public = generate_key(ca, CA_COMMENT)
        host_public = generate_key(host_key, "sshadapter-test-fleet-host")
        authorized = workdir / "authorized_keys"
        authorized.write_text(generate_key(client_key) + "\n")
        authorized.chmod(0o644)
        # The changed host's new key is certified too, by a CA nobody trusts: a client
        # that asks only for certificates (a CA line matches) still gets an answer to
        # refuse, instead of a key exchange with no common algorithm.
        impostor_key, impostor_ca = workdir / "impostor_host_key", workdir / "impostor_ca"
        generate_key(impostor_key, "sshadapter-test-changed")
        generate_key(impostor_ca, "sshadapter-test-untrusted-ca")
        for attempt in range(1, START_ATTEMPTS + 1):
            port = _fleet_port(n)
            hosts = tuple(
                FleetHost(
                    alias=alias,
                    address=fleet_address(i),
                    port=port,
                    kind="changed_key"
                    if alias in changed_key
                    else "silent"
                    if alias in silent
                    else "sshd",
                    forced=forced.get(alias),
                    labels=dict(labels(i, alias)),
                )
                for i, alias in enumerate(aliases)
            )
            with contextlib.ExitStack() as stack:
                pids = _start_all(
                    stack, workdir, hosts, (host_key, ca), (impostor_key, impostor_ca), user
                )
                if pids is None:
                    if attempt == START_ATTEMPTS:
                        raise RuntimeError(f"fleet sshd did not start: {_logs(workdir)}")
                    continue
                known_hosts = workdir / "known_hosts"
                fleet = Fleet(
                    hosts=hosts,
                    port=port,
                    user=user,
                    client_key=client_key,
                    ca_public=ca_public,
                    host_public=host_public,
                    known_hosts=known_hosts,
                    workdir=workdir,
                    sshd_pids=tuple(pids),
                )
                fleet.write_known_hosts(known_hosts)
                yield fleet
                return
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _start_all(
    stack: contextlib.ExitStack,
    workdir: Path,
    hosts: tuple[FleetHost, ...],
    certified: tuple[Path, Path],
    impostor: tuple[Path, Path],
    user: str,
) -> list[int] | None:
    """Every process of the fleet, registered on ``stack``; None when one failed to bind."""
    served = [h for h in hosts if h.kind == "sshd"]
    batches = [
        served[i : i + ADDRESSES_PER_SSHD] for i in range(0, len(served), ADDRESSES_PER_SSHD)
    ]
    changed = [h for h in hosts if h.kind == "changed_key"]
    plans: list[tuple[str, list[FleetHost], tuple[Path, Path]]] = [
        (f"sshd-{i:03d}", batch, certified) for i, batch in enumerate(batches)
    ]
    plans += [
        (f"impostor-{i:03d}", changed[i : i + ADDRESSES_PER_SSHD], impostor)
        for i in range(0, len(changed), ADDRESSES_PER_SSHD)
    ]
    processes = []
    for name, batch, (key, ca) in plans:
        directory = workdir / name
        directory.mkdir(exist_ok=True)
        config = _write_config(directory, batch, key, ca, workdir, user)
        processes.append((stack.enter_context(_sshd(config, directory / "sshd.log")), batch))
    silent = [h for h in hosts if h.kind == "silent"]
    if silent:
        try:
            stack.enter_context(_silent_listeners(silent))
        except OSError:
            return None
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    for process, batch in processes:
        if not _wait_listening(process, batch, deadline):
            return None
    return [process.pid for process, _ in processes]


def _write_config(
    directory: Path,
    batch: list[FleetHost],
    host_key: Path,
    ca: Path,
    workdir: Path,
    user: str,
) -> Path:
    """One sshd's config, its host key certified by ``ca`` for exactly its addresses."""
    key = directory / "host_key"
    shutil.copyfile(host_key, key)
    key.chmod(0o600)
    shutil.copyfile(host_key.with_suffix(".pub"), key.with_suffix(".pub"))
    certificate = directory / "host_key-cert.pub"
    principals = ",".join(h.address for h in batch)
    sign = ["ssh-keygen", "-q", "-s", str(ca), "-h", "-I", directory.name, "-n", principals]
    subprocess.run(
        [*sign, "-V", CERT_VALIDITY, str(key.with_suffix(".pub"))],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    matches = "".join(
        f"Match LocalAddress {h.address}\n    ForceCommand {h.forced}\n" for h in batch if h.forced
    )
    config = directory / "sshd_config"
    config.write_text(
        FLEET_SSHD_CONFIG.format(
            listen="\n".join(f"ListenAddress {h.address}:{h.port}" for h in batch),
            host_key=key,
            certificate=certificate,
            workdir=directory,
            authorized_keys=workdir / "authorized_keys",
            user=user,
            max_sessions=MAX_SESSIONS,
            max_startups=MAX_STARTUPS,
            extra="PerSourcePenalties no\n" if _openssh_version() >= PENALTIES_SINCE else "",
            matches=matches,
        )
    )
    return config


@contextlib.contextmanager
def _sshd(config: Path, log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """One sshd listener; SIGTERM (then SIGKILL) on exit."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [str(SSHD), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=default_signals(),
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def _silent_listeners(hosts: list[FleetHost]) -> Iterator[None]:
    """A thread accepting on every silent host's address, holding each connection open
    without sending a byte, until exit (then every socket closes)."""
    listeners = []
    try:
        for host in hosts:
            listener = socket.create_server((host.address, host.port), backlog=SILENT_BACKLOG)
            listeners.append(listener)
    except OSError:
        for listener in listeners:
            listener.close()
        raise
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept_all() -> None:
        import selectors

        with selectors.DefaultSelector() as selector:
            for listener in listeners:
                selector.register(listener, selectors.EVENT_READ)
            while not stop.is_set():
                for ready, _ in selector.select(timeout=0.1):
                    with contextlib.suppress(OSError):
                        conn, _ = ready.fileobj.accept()  # type: ignore[union-attr]
                        held.append(conn)

    thread = threading.Thread(target=accept_all, name="fleet-silent-hosts", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(STOP_TIMEOUT_SECONDS)
        for sock in [*held, *listeners]:
            sock.close()


def _wait_listening(
    process: subprocess.Popen[bytes], batch: list[FleetHost], deadline: float
) -> bool:
    """Whether sshd listens on every address of ``batch`` before ``deadline``.

    sshd logs a failed bind and goes on with the addresses it got, so each one is
    checked in the kernel's own table (/proc/net/tcp), without connecting (every
    connection costs sshd a fork and an exec)."""
    wanted = {(h.address, h.port) for h in batch}
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if wanted <= _listening():
            return True
        time.sleep(0.02)
    return False


def _listening() -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket in LISTEN state (/proc/net/tcp, proc(5))."""
    found = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            local, state = line.split()[1], line.split()[3]
            if state != "0A":  # TCP_LISTEN
                continue
            address, port = local.split(":")
            octets = bytes.fromhex(address)[::-1]  # little-endian on every Linux we run
            found.add((".".join(map(str, octets)), int(port, 16)))
    return found


def _fleet_port(n: int) -> int:
    """A port free on the first ``n`` fleet addresses (bound and released here: the
    sshds may still lose a race, which the caller retries)."""
    while True:
        port = random.randrange(*PORT_RANGE)
        try:
            for index in range(n):
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind((fleet_address(index), port))
        except OSError:
            continue
        return port


def _openssh_version() -> tuple[int, int]:
    """OpenSSH's (major, minor) from ``ssh -V`` ("OpenSSH_9.2p1 ..."); (0, 0) if unknown."""
    banner = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr
    found = re.match(r"OpenSSH_(\d+)\.(\d+)", banner)
    return (int(found[1]), int(found[2])) if found else (0, 0)


def _logs(workdir: Path) -> str:
    return " | ".join(
        f"{log.parent.name}: {log.read_text(errors='replace').strip()[-300:]}"
        for log in sorted(workdir.glob("*/sshd.log"))
        if log.stat().st_size
    )


def expected_sshd_processes(n: int) -> int:
    """How many sshd listeners a fleet of ``n`` ordinary hosts takes."""
    return math.ceil(n / ADDRESSES_PER_SSHD)
