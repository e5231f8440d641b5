"""What the dispatcher tests and the benchmark share: registries, policies, arguments, oracle."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from sshd import default_signals, policy_owner_args

from sshadapter.contract.registry import Operation, Registry, load_registry
from sshadapter.dispatch import dispatcher, policy

ROOT = Path(__file__).resolve().parents[2]
DISPATCHER_SOURCE = ROOT / "sshadapter" / "dispatch" / policy.DISPATCHER_FILE
HOSTS = ("ci", "local")


def shipped_registry(dispatch_hosts: tuple[str, ...] = HOSTS) -> Registry:
    """The shipped commands and schemas, with the given hosts behind a dispatcher."""
    return registry_of(ROOT / "commands", ROOT / "schemas", dispatch_hosts)


def registry_of(commands: Path, schemas: Path, dispatch_hosts: tuple[str, ...] = HOSTS) -> Registry:
    """The operations of ``commands`` and ``schemas``, with the given hosts behind a dispatcher."""
    return load_registry(commands, schemas, hosts=HOSTS, dispatch_hosts=dispatch_hosts)


def policy_for(registry: Registry, op: Operation) -> dict[str, Any]:
    assert op.spec.host is not None, "an operation on one host"
    return dict(policy.host_policies(registry)[op.spec.host])


def write_policy(path: Path, document: Mapping[str, Any]) -> Path:
    """The policy file as `sshadapter policy` writes it, readable by the login account."""
    path.write_text(json.dumps(document, indent=2) + "\n")
    path.chmod(0o644)
    return path


# What the written file's first line names (the tests' sshd runs it by that line).
HOST_PYTHON = "/usr/bin/python3"


def host_python() -> str:
    return HOST_PYTHON if os.access(HOST_PYTHON, os.X_OK) else sys.executable


def install_dispatcher(directory: Path, *, compiled: bool = True) -> Path:
    """The dispatcher as `sshadapter dispatcher --write` leaves it (0755, first line intact),
    and with ``compiled`` as the install step leaves it: `PATH --compile` by the host's
    Python, so calls run the code compiled ahead (docs/dispatcher.md "Start-up")."""
    target = directory / "sshadapter-dispatch"
    target.write_bytes(policy.dispatcher_source())
    target.chmod(0o755)
    if compiled:
        done = subprocess.run(
            [host_python(), "-IS", str(target), "--compile"],
            capture_output=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, done.stderr
    return target


def forced_command(dispatch: Path, policy_file: Path, log_socket: Path | None) -> str:
    log = f"--log-socket {log_socket} " if log_socket else ""
    return " ".join([str(dispatch), *policy_owner_args()]) + f" {log}{policy_file}"


# Valid arguments, as the daemon would accept them ---------------------------------------


def _param_values(schema: Mapping[str, Any]) -> st.SearchStrategy[Any]:
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema["type"] == "boolean":
        return st.booleans()
    if schema["type"] == "integer":
        return st.integers(int(schema["minimum"]), int(schema["maximum"]))
    return st.from_regex(schema["pattern"])


def valid_args(op: Operation) -> st.SearchStrategy[dict[str, Any]]:
    """Arguments the daemon accepts for ``op`` (from its patterns, filtered by its validator)."""
    strategy = st.fixed_dictionaries(
        {name: _param_values(schema) for name, schema in op.spec.params.items()}
    )
    return strategy.filter(lambda args: op.params_validator.is_valid(args))


# The oracle: would the daemon ever send exactly this command? ----------------------------


def daemon_would_send(registry: Registry, host: str, command: str) -> list[str]:
    """The operations of ``host`` for which valid arguments give exactly ``command``.

    The daemon's own side of the contract: shlex.split (the inverse of its
    quoting), each template's literal text, the parameter's type as the daemon
    renders it, its jsonschema-rs validator, and the exact command string.
    """
    try:
        argv = shlex.split(command)
    except ValueError:
        return []
    found = []
    for op in registry.operations.values():
        if op.spec.host != host or len(op.argv.elements) != len(argv):
            continue
        args = _args_from(op, argv)
        if args is not None and op.params_validator.is_valid(args) and op.command(args) == command:
            found.append(op.name)
    return found


def _args_from(op: Operation, argv: list[str]) -> dict[str, Any] | None:
    args: dict[str, Any] = {}
    for element, text in zip(op.argv.elements, argv, strict=True):
        pattern = "".join(
            f"(?P<{value}>.*)" if is_param else re.escape(value)
            for is_param, value in element.parts
        )
        match = re.fullmatch(pattern, text, re.S)
        if match is None:
            return None
        for name, value in match.groupdict().items():
            typed = _typed(op.spec.params[name]["type"], value)
            if typed is None or args.setdefault(name, typed) != typed:
                return None
    return args


def _typed(kind: str, text: str) -> Any:
    if kind == "string":
        return text
    if kind == "boolean":
        return {"true": True, "false": False}.get(text)
    return int(text) if re.fullmatch(r"-?[0-9]{1,20}", text) else None


# Running the dispatcher file as sshd would -----------------------------------------------


def run_dispatcher(
    policy_file: Path,
    command: str | bytes | None,
    *,
    log_socket: Path | None = None,
    python: str | None = None,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """The dispatcher file run with SSH_ORIGINAL_COMMAND set, stdin and terminal like sshd's."""
    environ = {"PATH": "/usr/bin:/bin", "HOME": "/", **(env or {})}
    environb = {k.encode(): v.encode() for k, v in environ.items()}
    if command is not None:
        environb[b"SSH_ORIGINAL_COMMAND"] = (
            command if isinstance(command, bytes) else command.encode()
        )
    args = [str(p) for p in ((log_socket,) if log_socket else ())]
    argv = [python or sys.executable, "-IS", str(DISPATCHER_SOURCE), *policy_owner_args()]
    if args:
        argv += ["--log-socket", *args]
    return subprocess.run(
        [*argv, str(policy_file)],
        env=environb,  # bytes keys and values: a command need not be UTF-8
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        preexec_fn=default_signals(),  # as sshd starts a session, whatever started the suite
    )


class SyslogListener:
    """A datagram socket standing for /dev/log, drained by a thread (a full queue blocks the
    sender); anyone may write to it (the login account)."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chmod(path, 0o666)
        self.sock.settimeout(0.1)
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._lines.append(data.decode("ascii", "replace"))

    def take(self) -> list[str]:
        """Every line received since the last take."""
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@contextmanager
def syslog_listener(path: Path) -> Iterator[SyslogListener]:
    listener = SyslogListener(path)
    try:
        yield listener
    finally:
        listener.close()


def read_log(listener: SyslogListener, settle: float = 0.05) -> list[str]:
    """Every line received so far (after a moment for datagrams in flight)."""
    time.sleep(settle)
    return listener.take()


REFUSAL = re.compile(
    re.escape(dispatcher.REFUSAL_PREFIX)
    + r" \((?P<reason>[a-z_]+)\) sha256:(?P<sha>[0-9a-f]{64})\n"
)


def open_commands(target: Path, *, drop: tuple[str, ...] = ()) -> Path:
    """The shipped command files with `allow` opened to this uid, minus ``drop``."""
    target.mkdir(parents=True, exist_ok=True)
    for path in (ROOT / "commands").glob("*.toml"):
        if path.stem in drop:
            continue
        text = path.read_text().replace(
            'allow = { groups = ["sshadapter-agents"] }', f"allow = {{ uids = [{os.getuid()}] }}"
        )
        (target / path.name).write_text(text)
        fixtures = path.with_suffix(".fixtures")
        if fixtures.is_dir() and not (target / fixtures.name).exists():
            shutil.copytree(fixtures, target / fixtures.name)
    return target


def policy_without(document: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The same host's policy with some operations left out, sealed again: a host behind."""
    body = {
        "format": document["format"],
        "host": document["host"],
        "operations": {k: v for k, v in document["operations"].items() if k not in names},
    }
    return {**body, "digest": policy.digest(body)}


def modules_imported(argv: list[str], command: str) -> set[str]:
    """The modules a fresh ``-X importtime`` process imports (its stderr), after it exits 0."""
    done = subprocess.run(
        [sys.executable, "-IS", "-X", "importtime", *argv],
        env={"PATH": "/usr/bin:/bin", "SSH_ORIGINAL_COMMAND": command},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.decode().splitlines() if "import time:" in line]
    return {line.rsplit("|", 1)[1].strip() for line in lines[1:]}
