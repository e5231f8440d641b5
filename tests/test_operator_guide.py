"""The operator guide (docs/guide.md), run from "Add a host" to "Read the audit trail" on sshd.

The guide's code blocks are the test's input, found by the HTML comment in
front of each (see the top of the guide): ``guide:run`` blocks are executed
with ``sh -e``, ``guide:file`` blocks are written byte for byte (``guide:append``
blocks appended), ``guide:output`` blocks are compared with what the preceding command printed,
and ``guide:root`` blocks (root on this machine, systemd as PID 1, or the
remote host) are pinned in ``PINNED`` with the way each command is exercised
instead; test_systemd_units.py runs the install commands offline.

One substitution table maps the guide's world onto the test's: a temporary
directory for /etc/sshadapter, /var/lib/sshadapter and /var/log/sshadapter, the
test sshd (tests/support/sshd.py) for ci.internal.example and its host key file (and
for the fleet's web1 and web2 too: one sshd plays the three hosts), this
test's uid for the agent's. The daemon is started the way the units start it:
the unit's ``ExecStart=`` with the socket ``sshadapter.socket`` describes
passed as fd 3, its ``LoadCredential=`` copied into ``$CREDENTIALS_DIRECTORY``,
a ``NOTIFY_SOCKET``, and ``ExecReload=`` for ``systemctl reload``.

The bastion section runs on two more sshds (web3 and the bastion): its host CA
block signs their host keys, its sshd drop-ins (HostCertificate, web3's user CA and
principals file, the jump account's Match block) are Included by them, and the
printed authorized_keys line is the bastion's only key.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pytest
from sshd import Sshd, host_directory, login_account, running_sshd
from test_integration import free_port, notifications

from sshadapter.dispatch import sudoers

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide.md"  # the part between guide:begin and guide:end
SERVICE = ROOT / "systemd" / "sshadapter.service"
SOCKET_UNIT = ROOT / "systemd" / "sshadapter.socket"
REQUEST_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.]{7,63}$")
COMMAND_TIMEOUT_SECONDS = 60
HOSTS = ("ci", "web1", "web2")  # the guide's fleet: one test sshd plays them all

# Every command of a guide:root block, and how it is exercised since it cannot run here.
# "test_systemd_units" entries are run there against a temporary root (--root=).
PINNED: dict[str, str] = {
    "apt-get install python3-venv openssh-client": (
        "not run: package installation (scripts/install-test-deps installs OpenSSH alike)"
    ),
    "python3 -m venv /opt/sshadapter": "scripts/test builds .venv the same way",
    "/opt/sshadapter/bin/pip install .": "scripts/test installs the checkout with pip",
    "ln -s /opt/sshadapter/bin/sshadapter /usr/local/bin/sshadapter": (
        "test_systemd_units: ExecStart= must resolve through the link"
    ),
    "install -m 0644 systemd/sshadapter.sysusers /etc/sysusers.d/sshadapter.conf": (
        "test_systemd_units: installed into a temporary root"
    ),
    "systemd-sysusers": "test_systemd_units: systemd-sysusers --root=",
    "install -m 0644 systemd/sshadapter.tmpfiles /etc/tmpfiles.d/sshadapter.conf": (
        "test_systemd_units: installed into a temporary root"
    ),
    "systemd-tmpfiles --create sshadapter.conf": "test_systemd_units: systemd-tmpfiles --root=",
    "install -m 0644 systemd/sshadapter.service systemd/sshadapter.socket /etc/systemd/system/": (
        "test_systemd_units: installed into a temporary root, then verified"
    ),
    "systemctl daemon-reload": "not run: needs systemd as PID 1",
    "usermod -a -G sshadapter-agents agent": (
        "here: the socket is 0660 as SocketMode= says; the opt-in boot test in "
        "test_systemd_units connects as a member of sshadapter-agents"
    ),
    "id -u agent": "here: the test's uid replaces 1001 in allow",
    "useradd --system --create-home --shell /bin/sh sshadapter": (
        "tests/support/sshd.py creates its login account with these options"
    ),
    "usermod -p '*' sshadapter": "tests/support/sshd.py unlocks its login account the same way",
    "install -d -m 0755 ~sshadapter/.ssh": (
        "here: the test sshd reads AuthorizedKeysFile from its workdir instead"
    ),
    'echo \'restrict,from="192.0.2.10",command="/usr/local/libexec/sshadapter-dispatch'
    " /etc/sshadapter-dispatch/policy.json\" ssh-ed25519 AAAAC3Nza... sshadapter@adapter'"
    " >> ~sshadapter/.ssh/authorized_keys": (
        "here: the line the keygen block printed is appended to the test sshd's file"
    ),
    "systemctl enable --now sshadapter.socket sshadapter.service": (
        "test_systemd_units: systemctl --root= enable; here ExecStart= runs as activated"
    ),
    "systemctl status sshadapter.service": "not run: needs systemd as PID 1",
    "systemctl reload sshadapter": (
        "here: the unit's ExecReload= is run and READY=1 awaited; for real in the boot test"
    ),
    "journalctl -u sshadapter --since today": "not run: needs systemd as PID 1",
    "systemctl daemon-reload && systemctl restart sshadapter": (
        "here: SIGTERM, then ExecStart= again as activated, with the drop-in's credential"
    ),
    # Reach hosts behind a bastion: the test's target and bastion sshds (reach_behind_a_bastion).
    "sshd -t && systemctl reload ssh": (
        "here: each test sshd starts with the guide's drop-ins Included (sshd checks them)"
    ),
    "useradd --system --create-home --shell /bin/sh jump": (
        "here: the bastion sshd logs in tests/support/sshd.py's account, created with these options"
    ),
    "usermod -p '*' jump": "tests/support/sshd.py unlocks its login account the same way",
    "install -d -m 0755 ~jump/.ssh": (
        "here: the bastion sshd reads AuthorizedKeysFile from its workdir instead"
    ),
    'echo \'restrict,port-forwarding,permitopen="web3.internal.example:22",command="/bin/false"'
    ',from="192.0.2.10" ssh-ed25519 AAAAC3Nza... sshadapter-jump@adapter\''
    " >> ~jump/.ssh/authorized_keys": (
        "here: the line the bastion-keygen block printed is the bastion sshd's only key"
    ),
    "usermod -a -G sshadapter-agents alice": (
        "here: the socket's group becomes the approver's own (nogroup), standing for it"
    ),
    "systemctl restart sshadapter": "here: SIGTERM, then ExecStart= again as activated",
}


@dataclass(frozen=True)
class Block:
    """One fenced code block of the guide and the marker in front of it."""

    kind: str
    """run, file, append, output or root."""
    arg: str
    """The block's name (run, output) or path (file, append); empty for root."""
    text: str
    """The content, dedented, ending in a newline."""
    line: int


_MARKED = re.compile(
    r"^(?P<indent> *)<!-- guide:(?P<kind>[a-z]+)(?: (?P<arg>\S+))? -->\n"
    r"(?P=indent)```[a-z]*\n(?P<body>.*?)^(?P=indent)```$",
    re.M | re.S,
)


def guide_text() -> str:
    """The operator guide part of docs/guide.md, from `<!-- guide:begin -->` to `guide:end`."""
    text = GUIDE.read_text()
    begin, end = text.index("<!-- guide:begin -->"), text.index("<!-- guide:end -->")
    return text[:end].replace(text[:begin], "\n" * text.count("\n", 0, begin), 1)


def guide_blocks() -> list[Block]:
    text = guide_text()
    blocks = []
    for m in _MARKED.finditer(text):
        indent = len(m["indent"])
        body = "".join(line[indent:] for line in m["body"].splitlines(keepends=True))
        blocks.append(Block(m["kind"], m["arg"] or "", body, text.count("\n", 0, m.start()) + 1))
    return blocks


def root_commands(blocks: list[Block]) -> list[str]:
    return [line for b in blocks if b.kind == "root" for line in b.text.splitlines() if line]


def test_every_code_block_is_marked_and_every_root_command_pinned() -> None:
    """Each code block of the guide has its marker, and each root command says how it is tested."""
    blocks = guide_blocks()
    fences = [line for line in guide_text().splitlines() if line.lstrip().startswith("```")]
    assert len(fences) == 2 * len(blocks), "a code block without a guide: marker"
    assert {b.kind for b in blocks} == {"run", "file", "append", "output", "root"}
    names = [(b.kind, b.arg) for b in blocks if b.kind != "root"]
    assert len(names) == len(set(names)), "two blocks with one name"
    assert sorted(root_commands(blocks)) == sorted(PINNED)


# The walk-through ------------------------------------------------------------


class Walkthrough:
    """The guide's world mapped onto temporary paths and the test sshd."""

    def __init__(self, tmp: Path, sshd: Sshd, host: Path) -> None:
        self.tmp = tmp
        self.sshd = sshd
        self.root = tmp / "root"  # stands for /
        self.work = tmp / "work"  # the operator's current directory
        self.bin = tmp / "bin"
        self.metrics_port = free_port()
        # The host's own files: where its login account can read them and where nobody
        # but root could change the dispatcher's policy (host_directory: not under /tmp).
        self.host = host
        self.socket_path = self.root / "run/sshadapter/sshadapter.sock"
        self.blocks = {(b.kind, b.arg): b for b in guide_blocks() if b.kind != "root"}
        self.used: set[tuple[str, str]] = set()
        self.substitutions = [
            ("/usr/local/libexec/sshadapter-dispatch", f"{self.host}/libexec/sshadapter-dispatch"),
            ("/etc/sshadapter-dispatch", f"{self.host}/conf/sshadapter-dispatch"),
            # The unit's drop-ins: in the test's directory, never this machine's /etc.
            (
                "/etc/systemd/system/sshadapter.service.d/",
                f"{self.root}/etc/systemd/system/sshadapter.service.d/",
            ),
            ("/etc/sshadapter", f"{self.root}/etc/sshadapter"),
            ("/var/lib/sshadapter", f"{self.root}/var/lib/sshadapter"),
            ("/var/log/sshadapter", f"{self.root}/var/log/sshadapter"),
            ("/etc/ssh/ssh_host_ed25519_key.pub", f"{sshd.host_key}.pub"),
            ("ci.internal.example", sshd.address),
            # The fleet's hosts: the same sshd, so ci's known_hosts line and policy serve.
            ("web1.internal.example", sshd.address),
            ("web2.internal.example", sshd.address),
            ("-p 22 ", f"-p {sshd.port} "),
            ("port = 22", f"port = {sshd.port}"),
            ('user = "sshadapter"', f'user = "{sshd.user}"'),
            ("uids = [1001]", f"uids = [{os.getuid()}]"),
            ("grants explain 1001 ", f"grants explain {os.getuid()} "),
            ("127.0.0.1:9464", f"127.0.0.1:{self.metrics_port}"),
            ('from="192.0.2.10"', f'from="{sshd.address}"'),
        ]
        self.unused = {old for old, _ in self.substitutions}
        for directory in (self.work, self.bin, self.socket_path.parent):
            directory.mkdir(parents=True)
        # `sshadapter` is this checkout, whatever else is installed.
        shim = self.bin / "sshadapter"
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m sshadapter.cli "$@"\n')
        shim.chmod(0o755)
        self.env = {
            **os.environ,
            "PATH": f"{self.bin}:{os.environ['PATH']}",
            "PYTHONPATH": str(ROOT),
        }

    def localize(self, text: str) -> str:
        for old, new in self.substitutions:
            if old in text:
                self.unused.discard(old)
                text = text.replace(old, new)
        return re.sub(
            r"\bsshadapter (call|list)\b", rf"sshadapter \1 --socket {self.socket_path}", text
        )

    def block(self, kind: str, name: str) -> Block:
        self.used.add((kind, name))
        return self.blocks[(kind, name)]

    def run(self, name: str, expect_status: int = 0) -> str:
        script = self.localize(self.block("run", name).text)
        done = subprocess.run(
            ["sh", "-e", "-c", script],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
        assert done.returncode == expect_status, f"{name}: {done.stdout}{done.stderr}"
        return done.stdout

    def write(self, path: str) -> Path:
        target = Path(self.localize(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(self.localize(self.block("file", path).text))
        return target

    def append(self, path: str) -> Path:
        target = Path(self.localize(path))
        assert target.is_file(), f"{path}: appended to before a guide:file block wrote it"
        with target.open("a") as file:
            file.write(self.localize(self.block("append", path).text))
        return target

    def output(self, name: str) -> str:
        return self.block("output", name).text

    def tmpfiles(self) -> None:
        """What systemd-tmpfiles makes from systemd/sshadapter.tmpfiles (run for real in
        test_systemd_units), without the chown to a group this machine may not have."""
        for line in (ROOT / "systemd" / "sshadapter.tmpfiles").read_text().splitlines():
            fields = line.split()
            if fields and fields[0] == "d":
                directory = self.root / fields[1].lstrip("/")
                directory.mkdir(parents=True, exist_ok=True)
                directory.chmod(int(fields[2], 8))


def unit_values(path: Path, key: str) -> list[str]:
    return [
        line.split("=", 1)[1].strip()
        for line in path.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]


@pytest.fixture
def walk(tmp_path: Path) -> Iterator[Walkthrough]:
    if not shutil.which("curl"):  # the guide reads the metrics with it
        message = "curl not installed (the guide's metrics command)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    with running_sshd() as sshd, host_directory() as host:
        yield Walkthrough(tmp_path, sshd, host)


def test_the_guide_from_adding_a_host_to_reading_the_audit(walk: Walkthrough) -> None:
    """The guide, run block by block on sshd from adding a host to the audit, shows what it says."""
    walk.tmpfiles()

    # Add a host: a key, its authorized_keys line, the host key checked out of band.
    printed = walk.run("keygen").strip().splitlines()[-1]
    dispatch = f"{walk.host}/libexec/sshadapter-dispatch"
    forced = f'command="{dispatch} {walk.host}/conf/sshadapter-dispatch/policy.json"'
    assert printed.startswith(f'restrict,from="{walk.sshd.address}",{forced} ssh-ed25519 '), printed
    key = walk.root / "etc/sshadapter/keys/ci.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    with (walk.sshd.workdir / "authorized_keys").open("a") as authorized:
        authorized.write(printed + "\n")
    scanned = walk.run("keyscan").split()
    on_host = walk.run("host-fingerprint").split()
    assert scanned[1].startswith("SHA256:") and scanned[1] == on_host[1]
    walk.run("known-hosts")
    config = walk.write("/etc/sshadapter/config.toml")

    # The dispatcher and the host's policy (no operation yet), installed on the host.
    walk.run("dispatcher")
    walk.run("dispatcher-install")
    assert stat.S_IMODE(os.stat(dispatch).st_mode) == 0o755
    assert os.path.isfile(f"{dispatch}.compiled")  # --compile: calls skip compiling it
    assert json.loads((walk.work / "ci.policy.json").read_text())["operations"] == {}

    # Start it, the way sshadapter.socket and sshadapter.service do.
    with started_daemon(walk, config) as (daemon, notify):
        # Write an operation, check it, reload.
        for path in (
            "/etc/sshadapter/commands/file_stat.toml",
            "/etc/sshadapter/schemas/file_stat.v1.json",
            *(
                f"/etc/sshadapter/commands/file_stat.fixtures/{name}"
                for name in (
                    "passwd.stdout",
                    "passwd.case.json",
                    "missing.stderr",
                    "missing.case.json",
                    "other_file.stdout",
                    "other_file.case.json",
                )
            ),
        ):
            walk.write(path)
        table = walk.run("check")
        assert _lines(table) == _lines(walk.output("check"))

        # The policy on the host first, checked from here, then the reload.
        walk.run("policy-update")
        walk.run("policy-install")
        checked = _lines(walk.run("check-hosts"))
        expected = _lines(walk.output("check-hosts"))
        assert checked[-len(expected) :] == expected
        assert checked[: -len(expected)] == _lines(table)
        reload = unit_values(SERVICE, "ExecReload")[0].replace("$MAINPID", str(daemon.pid))
        subprocess.run(shlex.split(reload), check=True)
        assert notifications(notify, "READY=1") == ["RELOADING=1", "READY=1"]

        # Call it.
        envelope = json.loads(walk.run("call"))
        shown = json.loads(walk.output("call"))
        assert REQUEST_ID.match(envelope.pop("request_id"))
        assert REQUEST_ID.match(shown.pop("request_id"))
        assert envelope["outcome"] == shown["outcome"] == "success"
        assert envelope["data"] == {
            "path": "/etc/passwd",
            "size": os.stat("/etc/passwd").st_size,
            "modified": int(os.stat("/etc/passwd").st_mtime),
        }
        assert envelope.keys() == shown.keys() and envelope["data"].keys() == shown["data"].keys()
        tools = json.loads(walk.run("list"))["tools"]
        assert [tool["name"] for tool in tools] == ["file_stat"]
        for name in ("call-missing", "call-invalid"):
            got, expected = json.loads(walk.run(name, 1)), json.loads(walk.output(name))
            assert REQUEST_ID.match(got.pop("request_id"))
            expected.pop("request_id")
            assert got == expected

        # Read the audit trail and the metrics.
        last = json.loads(walk.run("audit"))
        assert (last["type"], last["tool"], last["code"], last["stage"]) == (
            "result",
            "file_stat",
            "INVALID_REQUEST",
            "request",
        )
        failures = [json.loads(line) for line in walk.run("audit-failures").splitlines()]
        assert [r["code"] for r in failures] == ["NOT_FOUND", "INVALID_REQUEST"]
        assert failures[0]["attempts"][0]["exit_status"] == 1
        assert failures[0]["caller"]["uid"] == os.getuid()
        assert set(_lines(walk.run("metrics"))) == set(_lines(walk.output("metrics")))

    # Run it on a fleet: web1 and web2 are this same sshd, reached with the fleet's key.
    printed = walk.run("fleet-keygen").strip().splitlines()[-1]
    assert printed.startswith(f'restrict,from="{walk.sshd.address}",{forced} ssh-ed25519 ')
    with (walk.sshd.workdir / "authorized_keys").open("a") as authorized:
        authorized.write(printed + "\n")
    drop_in = walk.write("/etc/systemd/system/sshadapter.service.d/fleet.conf")
    scanned = walk.run("fleet-keyscan").split()
    assert scanned[1] == on_host[1]  # the fingerprint the host shows (one sshd: one key)
    walk.run("fleet-known-hosts")
    walk.write("/etc/sshadapter/inventory.d/web.toml")
    assert _lines(walk.run("inventory")) == _lines(walk.output("inventory"))
    walk.write("/etc/sshadapter/commands/kernel_release.toml")
    walk.write("/etc/sshadapter/schemas/kernel_release.v1.json")
    for case in ("debian12", "two_lines"):
        for suffix in ("stdout", "case.json"):
            walk.write(f"/etc/sshadapter/commands/kernel_release.fixtures/{case}.{suffix}")
    walk.run("fleet-policies")
    policies = {h: json.loads((walk.work / f"{h}.policy.json").read_text()) for h in HOSTS}
    assert [sorted(p["operations"]) for p in policies.values()] == [
        ["file_stat", "kernel_release"],
        ["kernel_release"],
        ["kernel_release"],
    ]
    # One sshd for three hosts: ci's policy, which holds the web hosts' one operation.
    walk.run("policy-install")
    walk.append("/etc/sshadapter/config.toml")
    explained = walk.run("grants-explain").splitlines()
    shown = walk.output("grants-explain").replace("1001", str(os.getuid())).splitlines()
    assert explained[0].startswith(f"uid {os.getuid()} (") and explained[0].endswith(
        ", kernel_release, fleet"
    )
    assert explained[1:] == shown[1:]

    # The restart (new hosts), with the drop-in's credential: the group is called on.
    with started_daemon(walk, config, drop_ins=(drop_in,)):
        envelope = json.loads(walk.run("call-fleet"))
        shown_call = json.loads(walk.output("call-fleet"))
        assert REQUEST_ID.match(envelope.pop("request_id"))
        shown_call.pop("request_id")
        results = envelope["data"].pop("results")
        shown_results = shown_call["data"].pop("results")
        assert envelope == shown_call  # outcome and counts
        assert [(r["host"], r["outcome"]) for r in results] == [
            (r["host"], r["outcome"]) for r in shown_results
        ]
        assert all(r["data"] == {"release": os.uname().release} for r in results)
        assert _lines(walk.run("audit-fleet")) == _lines(walk.output("audit-fleet"))
        got, expected_refusal = (
            json.loads(walk.run("call-fleet-refused", 1)),
            json.loads(walk.output("call-fleet-refused")),
        )
        assert REQUEST_ID.match(got.pop("request_id"))
        expected_refusal.pop("request_id")
        assert got == expected_refusal

    # Reach hosts behind a bastion, pinned by a certificate authority: web3 behind it.
    reach_behind_a_bastion(walk, config, drop_in)
    # Run something as root, with a person's consent: real sudo, the approver another uid.
    root_operation_with_approval(walk, config, drop_in)

    # Every block of the guide was used here, or in test_systemd_units (the unit drop-ins).
    drop_ins = {
        (b.kind, b.arg)
        for b in guide_blocks()
        if b.kind == "file" and b.arg.startswith("/etc/systemd/")
    } - walk.used
    assert set(walk.blocks) - walk.used == drop_ins
    assert not walk.unused, f"substitutions the guide no longer needs: {walk.unused}"


@contextlib.contextmanager
def started_daemon(
    walk: Walkthrough, config: Path, drop_ins: tuple[Path, ...] = ()
) -> Iterator[tuple[subprocess.Popen[bytes], socket.socket]]:
    """ExecStart= with the socket passed as fd 3, credentials (the unit's and its drop-ins')
    and notify; then systemctl stop. Again after a stop: systemctl restart."""
    listen = unit_values(SOCKET_UNIT, "ListenStream")[0]
    assert walk.socket_path == walk.root / listen.lstrip("/")
    for stale in (walk.socket_path, walk.tmp / "notify"):  # a previous start's
        stale.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(walk.socket_path))
    walk.socket_path.chmod(int(unit_values(SOCKET_UNIT, "SocketMode")[0], 8))
    listener.listen()
    credentials = walk.tmp / "credentials" / "sshadapter.service"
    credentials.mkdir(parents=True, exist_ok=True)
    # The drop-ins were written localized already; the shipped unit names the real paths.
    loaded = [walk.localize(entry) for entry in unit_values(SERVICE, "LoadCredential")]
    loaded += [entry for unit in drop_ins for entry in unit_values(unit, "LoadCredential")]
    for entry in loaded:
        name, _, source = entry.partition(":")
        (credentials / name).unlink(missing_ok=True)
        shutil.copyfile(source, credentials / name)
        (credentials / name).chmod(0o400)
    argv = shlex.split(walk.localize(unit_values(SERVICE, "ExecStart")[0]))
    argv[0] = str(walk.bin / "sshadapter")
    env = {
        **walk.env,
        "NOTIFY_SOCKET": str(walk.tmp / "notify"),
        "CREDENTIALS_DIRECTORY": str(credentials),
        # Used only if activation failed: never the real /run.
        "SSHADAPTER_SERVER__SOCKET_PATH": str(walk.tmp / "not-activated.sock"),
    }
    log_path = walk.tmp / "daemon.log"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, log_path.open("wb") as log:
        notify.bind(str(walk.tmp / "notify"))
        fd = listener.fileno()
        daemon = subprocess.Popen(
            ["bash", "-c", f'export LISTEN_FDS=1 LISTEN_PID=$$; exec "$@" 3<&{fd}', "bash", *argv],
            env=env,
            pass_fds=(fd,),
            stderr=log,
        )
        listener.close()
        try:
            assert "READY=1" in notifications(notify, "READY=1")
            yield daemon, notify
            daemon.send_signal(signal.SIGTERM)  # systemctl stop
            stop = float(unit_values(SERVICE, "TimeoutStopSec")[0].removesuffix("s"))
            assert daemon.wait(stop) == 0
        except BaseException:
            print(log_path.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            if daemon.poll() is None:
                daemon.kill()
            daemon.wait()


# Run something as root, with a person's consent -------------------------------------------

APPROVER_UID: Final = 65534  # nobody: the guide's alice, any uid but the agent's
APPROVER_GID: Final = 65534  # nogroup: stands for sshadapter-agents, the socket's group
SUDOERS_DIR: Final = Path("/etc/sudoers.d")  # sudo reads drop-ins only here
SHOWN_REQUEST_ID: Final = "req.5d2c8e1f0a7b3946c1e8"  # the guide's example id
ROOT_COMMAND: Final = "/usr/bin/sudo -n -u root -- /usr/bin/id -un"
ROOT_DIGEST: Final = hashlib.sha256(ROOT_COMMAND.encode()).hexdigest()  # what is approved
APPROVAL_TIMEOUT_SECONDS: Final = 300  # whoami_root.toml's [approval] timeout_seconds
# Listing until the call waits: it is held once its arguments are checked, in milliseconds;
# 200 listings of a process start each leave it ample time on a loaded machine.
PENDING_POLLS: Final = 200
PENDING_POLL_SECONDS: Final = 0.05
# The files of every top-level module `sshadapter approvals list` imports, this package and
# its libraries among them (what the approver's copy holds).
_IMPORTED: Final = """
import sys
from sshadapter.cli import _parser
_parser().parse_args(["approvals", "list"])
for name, module in list(sys.modules.items()):
    if "." not in name and getattr(module, "__file__", None):
        print(module.__file__)
"""
# This interpreter where the approver may run it, else the system's: the copied extensions
# (orjson, pydantic_core) load only in the minor version they were built for, as the probe
# shows (scripts/test builds .venv from the system's python3).
APPROVER_PYTHONS: Final = (os.path.realpath(sys.executable), "/usr/bin/python3")
_NO_CACHE: Final = shutil.ignore_patterns("__pycache__")
_CALLER: Final = re.compile(r"^  caller     uid (\d+) gid (\d+) pid (\d+)$")
_EXPIRES: Final = re.compile(r"^  expires    (\S+)$")
_WAITING: Final = re.compile(r"^  waiting    (\d+)s$")


def require_root_and_sudo() -> None:
    """The section installs a sudoers drop-in and runs the approver as another uid: root
    and sudo/visudo (scripts/install-test-deps), or a skip here and a failure under $CI."""
    if os.geteuid() == 0 and shutil.which("sudo") and shutil.which("visudo"):
        return
    message = "root operations need root and sudo/visudo: run scripts/install-test-deps as root"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass(frozen=True)
class Approver:
    """The approver's own process: its uid, and a directory it can reach holding a shim for
    `sshadapter` and a hard link to the daemon's socket (the walk's tree is root's alone)."""

    directory: Path
    socket: Path

    def run(self, walk: Walkthrough, name: str, request_id: str = SHOWN_REQUEST_ID) -> str:
        """The guide's block run as the approver, the socket given and the id the real one."""
        script = walk.localize(walk.block("run", name).text).replace(SHOWN_REQUEST_ID, request_id)
        script = re.sub(
            r"\bsshadapter approvals (list|approve|deny)\b",
            rf"sshadapter approvals \1 --socket {self.socket}",
            script,
        )
        done = subprocess.run(
            ["sh", "-e", "-c", script],
            cwd=self.directory,
            env={
                **walk.env,
                "PATH": f"{self.directory}:{os.environ['PATH']}",
                "PYTHONPATH": str(self.directory / "lib"),
            },
            user=APPROVER_UID,
            group=APPROVER_GID,
            extra_groups=[],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        return done.stdout


@contextlib.contextmanager
def approver_of(walk: Walkthrough) -> Iterator[Approver]:
    """The approver's directory (0755), its shim, the socket's group set to its gid."""
    directory = Path(tempfile.mkdtemp(prefix="sshadapter-approver-"))
    try:
        directory.chmod(0o755)
        link = directory / "sshadapter.sock"
        os.link(walk.socket_path, link)  # one socket, two names: connect() finds its inode
        os.chown(walk.socket_path, -1, APPROVER_GID)
        # This checkout and its interpreter may be root's alone (under /root): the approver
        # runs a copy of the packages its command imports, as if installed for every user.
        found = subprocess.run(
            [sys.executable, "-c", _IMPORTED],
            env=walk.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
        )
        for path in map(Path, found.stdout.split()):
            if "site-packages" in path.parts or path.is_relative_to(ROOT):
                if path.name == "__init__.py":
                    shutil.copytree(
                        path.parent, directory / "lib" / path.parent.name, ignore=_NO_CACHE
                    )
                else:
                    (directory / "lib").mkdir(exist_ok=True)
                    shutil.copy(path, directory / "lib")
        shim = directory / "sshadapter"
        for python in APPROVER_PYTHONS:
            shim.write_text(f'#!/bin/sh\nexec "{python}" -m sshadapter.cli "$@"\n')
            shim.chmod(0o755)
            probe = subprocess.run(
                [str(shim), "--version"],
                cwd=directory,
                env={**walk.env, "PYTHONPATH": str(directory / "lib")},
                user=APPROVER_UID,
                group=APPROVER_GID,
                extra_groups=[],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_SECONDS,
            )
            if probe.returncode == 0:
                break
        else:
            raise AssertionError(f"no Python the approver's uid can run: {probe.stderr}")
        yield Approver(directory, link)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def root_operation_with_approval(walk: Walkthrough, config: Path, drop_in: Path) -> None:
    """The guide's root operation: approver configured, sudoers drop-in proved and installed
    (in the real /etc/sudoers.d, removed at the end), restart, a call held until the approver
    approves it, then run as root through sshd, the dispatcher and sudo; and the audit."""
    require_root_and_sudo()
    installed = SUDOERS_DIR / f"sshadapter-guide-{os.getpid()}"  # no ".": sudo would skip it
    for old, new in (
        (str(sudoers.install_path("sshadapter", "ci")), str(installed)),
        ("uids = [1002]", f"uids = [{APPROVER_UID}]"),
    ):
        walk.substitutions.insert(0, (old, new))
        walk.unused.add(old)
    walk.run("approvals-config")
    walk.write("/etc/sshadapter/commands/whoami_root.toml")
    walk.write("/etc/sshadapter/schemas/whoami_root.v1.json")
    for case in ("root", "not_root"):
        for suffix in ("stdout", "case.json"):
            walk.write(f"/etc/sshadapter/commands/whoami_root.fixtures/{case}.{suffix}")
    # Following the guide leaves `check` green: every operation has fixtures, all rows ok.
    assert _lines(walk.run("check-all")) == _lines(walk.output("check-all"))
    try:
        printed = walk.run("sudoers")
        # The guide's account is sshadapter, the walk's the test's: another namespace.
        shown = (
            walk.output("sudoers")
            .replace("sshadapter ALL", f"{walk.sshd.user} ALL")
            .replace(
                sudoers.namespace("sshadapter", "ci").upper(),
                sudoers.namespace(walk.sshd.user, "ci").upper(),
            )
        )
        assert _lines(printed) == _lines(shown)
        operations = json.loads((walk.work / "ci.policy.json").read_text())["operations"]
        assert sorted(operations) == ["file_stat", "kernel_release", "whoami_root"]
        walk.run("sudoers-install")
        assert stat.S_IMODE(installed.stat().st_mode) == 0o440 and installed.stat().st_uid == 0
        digest = json.loads((walk.work / "ci.policy.json").read_text())["digest"]
        assert f"# {digest}: install both together." in installed.read_text()

        with started_daemon(walk, config, drop_ins=(drop_in,)), approver_of(walk) as approver:
            call = subprocess.Popen(
                ["sh", "-e", "-c", walk.localize(walk.block("run", "call-root").text)],
                cwd=walk.work,
                env=walk.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                listed = _pending_listing(walk, approver)
                request_id = listed[0].split()[0]
                assert REQUEST_ID.match(request_id)
                _assert_shown(listed, walk.output("approvals-list"), request_id)
                approved = approver.run(walk, "approvals-approve", request_id).splitlines()
                _assert_shown(approved, walk.output("approvals-approve"), request_id)
                out, err = call.communicate(timeout=COMMAND_TIMEOUT_SECONDS)
            finally:
                if call.poll() is None:
                    call.kill()
                    call.wait()
            assert call.returncode == 0, out + err
            envelope = json.loads(out)
            expected = json.loads(walk.output("call-root"))
            assert envelope == {**expected, "request_id": request_id}

            events = walk.run("audit-approval")
            assert _lines(events) == _lines(
                walk.output("audit-approval").replace("1002", str(APPROVER_UID))
            )
            records = [
                json.loads(line)
                for line in (walk.root / "var/log/sshadapter/audit.jsonl").read_text().splitlines()
            ]
            intent = next(
                r for r in records if r["type"] == "intent" and r["request_id"] == request_id
            )
            assert intent["command"] == ROOT_COMMAND
            assert intent["approval"]["approver"]["uid"] == APPROVER_UID
            assert intent["approval"]["digest"] == ROOT_DIGEST
    finally:
        installed.unlink(missing_ok=True)


def _pending_listing(walk: Walkthrough, approver: Approver) -> list[str]:
    """The approver's listing once the agent's call waits in it."""
    for _ in range(PENDING_POLLS):
        listed = _lines(approver.run(walk, "approvals-list"))
        if listed != ["no call waits for approval"]:
            return listed
        time.sleep(PENDING_POLL_SECONDS)
    raise AssertionError("the agent's call never waited for approval")


def _assert_shown(got: list[str], shown: str, request_id: str) -> None:
    """What the approver is shown is the guide's, but for the caller's ids, its wait and the
    expiry."""
    expected = _lines(shown.replace(SHOWN_REQUEST_ID, request_id))
    assert len(got) == len(expected), got
    for line, want in zip(got, expected, strict=True):
        if (caller := _CALLER.match(line)) and _CALLER.match(want):
            assert caller.group(1, 2) == (str(os.getuid()), str(os.getgid()))
        elif (waiting := _WAITING.match(line)) and _WAITING.match(want):
            assert int(waiting[1]) <= APPROVAL_TIMEOUT_SECONDS
        elif (expires := _EXPIRES.match(line)) and _EXPIRES.match(want):
            left = datetime.fromisoformat(expires[1]) - datetime.now(UTC)
            assert 0 < left.total_seconds() <= APPROVAL_TIMEOUT_SECONDS
        else:
            assert line == want
    assert f"  sha256     {ROOT_DIGEST}" in expected  # the guide shows the true digest


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip().splitlines()]


# Reach hosts behind a bastion, pinned by a certificate authority ---------------------------


def reach_behind_a_bastion(walk: Walkthrough, config: Path, fleet_drop_in: Path) -> None:
    """The guide's bastion section on two more real sshds: web3 (host key signed by the
    guide's host CA block, trusting its user CA through the principals file, no
    authorized_keys line) behind the bastion (host key signed too, the guide's Match block
    Included, the printed authorized_keys line its only key); the daemon restarted with
    both, the call and metrics compared, the bastion key tried as a thief."""
    ca = walk.tmp / "ca"  # the machine that keeps the CAs: not the operator's directory
    ca.mkdir()
    run_on(walk, "host-ca", ca)
    run_on(walk, "user-ca", ca)
    # What sshd runs is known only once running_sshd made each host's key: the CA signs
    # it and the host's drop-ins are written (and Included) before that sshd starts.
    jump_conf = walk.block("file", "/etc/ssh/sshd_config.d/sshadapter-jump.conf").text
    # web3 and the bastion: two more test sshds, on the same address as the others.
    walk.substitutions.insert(0, ("web3.internal.example", walk.sshd.address))
    walk.unused.add("web3.internal.example")
    # The credential drop-ins: in the test's directory, not this machine's /etc.
    bastion_conf = "/etc/systemd/system/sshadapter.service.d/bastion.conf"
    web3_conf = "/etc/systemd/system/sshadapter.service.d/web3.conf"
    for unit in (bastion_conf, web3_conf):
        walk.substitutions.insert(0, (unit, str(walk.tmp / "systemd" / Path(unit).name)))
        walk.unused.add(unit)
    login = login_account()

    def certified(*drop_ins: str, user_ca: bool = False) -> Callable[[Path], str]:
        def configure(workdir: Path) -> str:
            run_on(walk, "host-cert", ca, host=workdir)
            if user_ca:  # the copy of the user CA's public half, and the principals file
                shutil.copyfile(
                    ca / "fleet_user_ca.pub", on_host("/etc/ssh/sshadapter-user-ca.pub", workdir)
                )
                write_on_host(walk, "/etc/ssh/sshadapter-principals", workdir)
            included = [write_on_host(walk, path, workdir) for path in drop_ins]
            return "".join(f"Include {path}\n" for path in included)

        return configure

    with (
        running_sshd(
            configure=certified(
                "/etc/ssh/sshd_config.d/host-certificate.conf",
                "/etc/ssh/sshd_config.d/sshadapter-user-ca.conf",
                user_ca=True,
            )
        ) as web3,
        running_sshd(
            configure=certified(
                "/etc/ssh/sshd_config.d/host-certificate.conf",
                "/etc/ssh/sshd_config.d/sshadapter-jump.conf",
            )
        ) as bastion,
    ):
        # Each host's address and port, and the bastion's account (the Match block's too).
        walk.substitutions[:0] = [
            ("web3.internal.example:22", f"{web3.address}:{web3.port}"),
            (
                'address = "web3.internal.example"',
                f'address = "{web3.address}"\nport = {web3.port}',
            ),
            (
                'address = "bastion.internal.example"',
                f'address = "{bastion.address}"\nport = {bastion.port}',
            ),
            ('user = "jump"', f'user = "{bastion.user}"'),
            # One @cert-authority line for both: the names the daemon looks them up by.
            (
                "*.internal.example",
                f"[{web3.address}]:{web3.port},[{bastion.address}]:{bastion.port}",
            ),
        ]
        walk.unused |= {old for old, _ in walk.substitutions[:5]}
        assert (
            f"Match User {login}\n"
            in (bastion.workdir / "sshd_config.d/sshadapter-jump.conf").read_text()
        )
        assert jump_conf.startswith("Match User jump\n")

        shutil.copyfile(ca / "fleet_host_ca.pub", walk.work / "fleet_host_ca.pub")  # the copy
        walk.run("host-ca-known-hosts")
        pinned = (walk.root / "etc/sshadapter/known_hosts").read_text().splitlines()[-1]
        assert pinned.startswith("@cert-authority ") and pinned.endswith(" fleet-host-ca")

        # The bastion's only key: the line printed for it.
        printed = walk.run("bastion-keygen").strip().splitlines()[-1]
        assert printed.startswith(
            f'restrict,port-forwarding,permitopen="{web3.address}:{web3.port}",'
            f'command="/bin/false",from="{walk.sshd.address}" ssh-ed25519 '
        ), printed
        (bastion.workdir / "authorized_keys").write_text(printed + "\n")
        # web3 accepts no key by authorized_keys: only the certificate, by the principals file.
        (web3.workdir / "authorized_keys").write_text("")
        keys = walk.root / "etc/sshadapter/keys"
        shutil.copyfile(keys / "fleet.key.pub", ca / "fleet.key.pub")  # the copy there
        run_on(walk, "user-cert", ca)
        shutil.copyfile(ca / "fleet.key-cert.pub", keys / "fleet.key-cert.pub")  # and back
        web3_drop_in = walk.write(web3_conf)
        bastion_drop_in = walk.write(bastion_conf)
        walk.write("/etc/sshadapter/inventory.d/dc2.toml")
        walk.run("bastion-policy")
        # web3 shares ci's installed policy (tests/support/sshd.py: one policy path for the run).
        assert sorted(json.loads((walk.work / "web3.policy.json").read_text())["operations"]) == [
            "kernel_release"
        ]

        # The restart: new hosts, the bastion's key and the certificate as credentials.
        with started_daemon(walk, config, drop_ins=(fleet_drop_in, bastion_drop_in, web3_drop_in)):
            assert _lines(walk.run("call-bastion")) == _lines(walk.output("call-bastion"))
            assert _lines(walk.run("bastion-tunnels")) == _lines(walk.output("bastion-tunnels"))
            # The series the guide shows; its value: the day it was signed for, less a little.
            (series, left), (shown, _) = (
                line.rsplit(" ", 1)
                for line in (walk.run("cert-expiry").strip(), walk.output("cert-expiry").strip())
            )
            assert series == shown and 0 < float(left) <= USER_CERT_SECONDS, left

        # A thief with the bastion key: a command and a shell run nothing.
        key = walk.root / "etc/sshadapter/keys/bastion.key"
        for command in (["id"], []):
            stolen = thief_ssh(key, bastion, command)
            assert (stolen.returncode, stolen.stdout) == (1, ""), stolen


USER_CERT_SECONDS: Final = 86400  # the guide's user certificate: -V +1d


def run_on(walk: Walkthrough, name: str, cwd: Path, host: Path | None = None) -> str:
    """A guide:run block run on another machine (``cwd``); ``host``: the sshd workdir
    standing for that machine's /etc/ssh."""
    text = walk.block("run", name).text
    if host is not None:
        text = on_host(text, host)
    done = subprocess.run(
        ["sh", "-e", "-c", walk.localize(text)],
        cwd=cwd,
        env=walk.env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
    return done.stdout


def on_host(text: str, workdir: Path) -> str:
    """A host's /etc/ssh paths and its jump account, on the test sshd that plays it."""
    return (
        text.replace("/etc/ssh/ssh_host_ed25519_key", f"{workdir}/host_key")
        .replace("/etc/ssh/", f"{workdir}/")
        .replace("Match User jump\n", f"Match User {login_account()}\n")
        .replace("Match User sshadapter\n", f"Match User {login_account()}\n")
    )


def write_on_host(walk: Walkthrough, path: str, workdir: Path) -> Path:
    """A guide:file block of a host's /etc/ssh, written into the sshd's workdir."""
    target = Path(on_host(path, workdir))
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(walk.localize(on_host(walk.block("file", path).text, workdir)))
    return target


def thief_ssh(key: Path, bastion: Sshd, command: list[str]) -> subprocess.CompletedProcess[str]:
    """OpenSSH's client with the bastion's key, no config, agent or known_hosts of its own."""
    options = ["-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes"]
    options += ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
    return subprocess.run(
        ["ssh", *options, "-p", str(bastion.port), f"{bastion.user}@{bastion.address}", *command],
        stdin=subprocess.DEVNULL if command else None,
        input=None if command else "id\n",
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_SECONDS,
        env={"PATH": os.environ["PATH"], "SSH_AUTH_SOCK": ""},
    )
