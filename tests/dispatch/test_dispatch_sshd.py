"""sshadapter-dispatch as the forced command of a real sshd: what passes, and what a thief gets.

The test sshd (tests/support/sshd.py) has the dispatcher in front of its key::

    restrict,from="127.0.0.1",command="HOST/sshadapter-dispatch --log-socket HOST/log
    HOST/P.json" ssh-ed25519 ...   (one line)

(``--log-socket`` points the host's syslog lines at a socket of the test
instead of /dev/log). Through it: every shipped operation with every
fixture's arguments, the daemon's calls, and a thief holding the same key
with plain ``ssh``, ``scp``, ``sftp`` and asyncssh. Nothing a thief sends
may run: the commands would create a marker file, which must never appear,
and every refusal leaves exactly one line in the host's log.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import asyncssh
import pytest
from dispatch_support import (
    REFUSAL,
    ROOT,
    daemon_would_send,
    install_dispatcher,
    open_commands,
    policy_without,
    read_log,
    syslog_listener,
    write_policy,
)
from sshd import Sshd, generate_key, host_directory, policy_owner_args, running_sshd
from test_commands import HOSTILE_ARGUMENTS
from test_integration import cli
from test_logs import call, journal_lines, serving_on_the_journal

from sshadapter.check.fixtures import load_fixtures
from sshadapter.cli import main as cli_main
from sshadapter.config import (
    AuditSection,
    Config,
    PathsSection,
    PoolSection,
    ServerSection,
    load_config,
)
from sshadapter.contract.exitstatus import REFUSAL_PREFIX
from sshadapter.contract.registry import Registry, load_registry
from sshadapter.daemon.assemble import assemble
from sshadapter.daemon.drift import PolicyMonitor
from sshadapter.daemon.server import Daemon
from sshadapter.daemon.unix_socket import bind_socket
from sshadapter.dispatch import dispatcher, policy
from sshadapter.sections import Allow

HOSTS = ("ci", "local")
# A client that gives up early (ssh -tt without a PTY) may exit before the dispatcher logs.
LOG_WAIT_SECONDS = 5.0
CI_PROGRAMS = ("ci-cli", "review-cli", "deploy-cli")

# Prints its arguments as JSON: the proof of exactly which argv arrived.
ARGV_ECHO = "#!/usr/bin/python3 -IS\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n"
# The made-up CLIs of the ci examples, answering as the fixtures do (fresh, for the request).
FAKE_CLI = """\
#!/usr/bin/python3 -IS
import datetime, json, os, sys
tool, last = os.path.basename(sys.argv[0]), sys.argv[-1]
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
answers = {
    "ci-cli": {"project_id": last, "run_id": "run_8fK2mQ9xLp3a", "state": "failed",
               "observed_at": now, "url": "https://ci.example.invalid/r", "log_tail": "ok"},
    "review-cli": {"change_id": last, "decision": "approved", "reviewed_by": "a.martin"},
    "deploy-cli": {"environment": last, "revision": "a83f19c", "state": "healthy"},
}
print(json.dumps(answers[tool]))
"""


@dataclass
class Host:
    """The test sshd standing for a host, its files, and the host's log."""

    sshd: Sshd
    root: Path
    dispatch: Path
    log_socket: Path
    log: Any
    marker: Path
    bin: Path

    def install(self, name: str, document: Mapping[str, Any]) -> Path:
        return write_policy(self.root / f"{name}.json", document)

    def options(self, policy_file: Path, *, restrict: bool = True) -> str:
        owner = "".join(f"{arg} " for arg in policy_owner_args())
        command = f"{self.dispatch} {owner}--log-socket {self.log_socket} {policy_file}"
        return ("restrict," if restrict else "") + f'from="127.0.0.1",command="{command}"'

    def use(self, policy_file: Path, *, restrict: bool = True) -> str:
        read_log(self.log)  # start each scenario with an empty log
        return self.sshd.authorize(self.options(policy_file, restrict=restrict))

    def client(self, program: str = "ssh") -> list[str]:
        port = "-P" if program in ("scp", "sftp") else "-p"
        return [
            program,
            "-F",
            "/dev/null",
            "-i",
            str(self.sshd.client_key),
            "-o",
            f"UserKnownHostsFile={self.sshd.known_hosts}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            port,
            str(self.sshd.port),
        ]

    def ssh(
        self, *command: str, options: tuple[str, ...] = (), stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        """The OpenSSH client with the adapter's key: ``options`` before the host."""
        return subprocess.run(
            [*self.client(), *options, f"{self.sshd.user}@127.0.0.1", *command],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
        )

    def logged(self, at_least: int = 0) -> list[str]:
        """The host's log lines since the last look (waiting a little for ``at_least``)."""
        lines: list[str] = []
        deadline = time.monotonic() + LOG_WAIT_SECONDS
        while True:
            lines += read_log(self.log)
            if len(lines) >= at_least or time.monotonic() > deadline:
                return lines
            time.sleep(0.02)


@pytest.fixture(scope="module")
def host() -> Iterator[Host]:
    with running_sshd() as sshd, host_directory() as root:
        marker_dir = root / "writable"
        marker_dir.mkdir()
        marker_dir.chmod(0o777)  # if a thief's command ran, it could create the marker here
        bin_dir = root / "bin"
        bin_dir.mkdir()
        for name, text in [("argv-echo", ARGV_ECHO), ("fake-cli", FAKE_CLI)]:
            (bin_dir / name).write_text(text)
            (bin_dir / name).chmod(0o755)
        for name in CI_PROGRAMS:
            (bin_dir / name).symlink_to(bin_dir / "fake-cli")
        with syslog_listener(root / "log") as log:
            yield Host(
                sshd, root, install_dispatcher(root), root / "log", log, marker_dir / "M", bin_dir
            )
        sshd.authorize()


def commands_with_programs(target: Path, programs: Mapping[str, str]) -> Path:
    """The shipped commands (allow opened) with some programs replaced by absolute paths."""
    open_commands(target)
    for path in target.glob("*.toml"):
        text = path.read_text()
        for old, new in programs.items():
            text = text.replace(f'argv = ["{old}"', f'argv = ["{new}"')
        path.write_text(text)
    return target


def registry_of(commands: Path) -> Registry:
    return load_registry(commands, ROOT / "schemas", hosts=HOSTS, dispatch_hosts=HOSTS)


async def run_all(sshd: Sshd, commands: list[str], key: Path | None = None) -> list[Any]:
    """Each command on one asyncssh connection with the test key, as the daemon would send it."""
    async with asyncssh.connect(
        "127.0.0.1",
        sshd.port,
        username=sshd.user,
        client_keys=[str(key or sshd.client_key)],
        known_hosts=str(sshd.known_hosts),
        config=None,
    ) as conn:
        return [
            await conn.run(command, check=False, stdin=asyncssh.DEVNULL) for command in commands
        ]


# What passes ------------------------------------------------------------------------------


def test_every_shipped_operation_passes_with_every_fixtures_arguments(
    host: Host, tmp_path: Path
) -> None:
    """Through sshd and the dispatcher, each fixture's command reaches its program intact."""
    echo = str(host.bin / "argv-echo")
    programs = {p: echo for p in ("env", "cat", "findmnt", "systemctl", *CI_PROGRAMS)}
    registry = registry_of(commands_with_programs(tmp_path / "commands", programs))
    total = 0
    for alias in HOSTS:
        host.use(host.install(f"echo-{alias}", policy.host_policies(registry)[alias]))
        ops = [op for op in registry.operations.values() if op.spec.host == alias]
        cases = [(op, fixture.args) for op in ops for fixture in load_fixtures(op)]
        results = asyncio.run(run_all(host.sshd, [op.command(args) for op, args in cases]))
        for (op, args), result in zip(cases, results, strict=True):
            assert result.exit_status == 0, (op.name, args, result.stderr)
            assert json.loads(result.stdout) == op.argv.argv(args)[1:], op.name
        log = host.logged(len(cases))
        assert len(log) == len(cases)
        assert all("allowed operation=" in line for line in log)
        total += len(cases)
    assert total >= 50  # every fixture of the seven operations


def daemon_config(tmp_path: Path, host: Host, keys: Mapping[str, Path], dispatch: bool) -> Config:
    commands = commands_with_programs(
        tmp_path / "commands", {p: str(host.bin / p) for p in CI_PROGRAMS}
    )
    return Config(
        server=ServerSection(socket_path=tmp_path / "d.sock", allow=Allow(uids=(os.getuid(),))),
        paths=PathsSection(commands=commands, schemas=ROOT / "schemas"),
        audit=AuditSection(
            path=tmp_path / "audit.jsonl", fsync="never", quarantine_dir=tmp_path / "q"
        ),
        hosts={
            alias: host.sshd.host_section(client_keys=(keys[alias],), dispatch=dispatch)
            for alias in HOSTS
        },
        pool=PoolSection(warm=HOSTS if dispatch else ()),  # dispatch hosts checked at start
    )


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("load_average", {}),
    ("disk_usage", {"path": "/"}),
    ("mount_info", {"target": "/"}),
    ("service_state", {"unit": "ssh.service"}),
    ("job_run_status", {"project_id": "bluebird"}),
    ("review_status", {"change_id": "CR-1042"}),
    ("deploy_status", {"environment": "production"}),
    ("disk_usage", {"path": "/no/such/dir"}),
]


async def serving(config: Config, body: Any) -> Any:
    daemon = assemble(config)
    sock = bind_socket(config.server.socket_path, 0o600, "")
    task = asyncio.create_task(daemon.serve(sock))
    try:
        return await body(daemon)
    finally:
        daemon.stop()
        await asyncio.wait_for(task, 30)


async def ask(config: Config, tool: str, args: Mapping[str, Any]) -> dict[str, Any]:
    reader, writer = await asyncio.open_unix_connection(str(config.server.socket_path))
    try:
        writer.write(json.dumps({"op": "call", "tool": tool, "args": args}).encode() + b"\n")
        await writer.drain()
        answer: dict[str, Any] = json.loads(await reader.readline())
        return answer
    finally:
        writer.close()


async def policy_state(daemon: Daemon, alias: str, result: str) -> None:
    monitor = daemon.service.dispatch
    assert monitor is not None
    for _ in range(500):
        state = monitor.state(alias)
        if state is not None and state.result == result:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{alias}: policy never {result}: {monitor.state(alias)}")


def outcome(envelope: Mapping[str, Any]) -> Any:
    if envelope["outcome"] == "success":
        return ("success", sorted(envelope["data"]))
    return ("failure", envelope["error"]["code"])


def test_calls_through_the_daemon_succeed_as_before(host: Host, tmp_path: Path) -> None:
    """The same calls through the dispatcher and without it: the same outcomes, field for field."""
    keys = {alias: tmp_path / f"{alias}_key" for alias in HOSTS}
    for key in keys.values():
        generate_key(key)

    def run(dispatch: bool) -> list[Any]:
        config = daemon_config(tmp_path / f"d{int(dispatch)}", host, keys, dispatch)
        registry = load_registry(
            config.paths.commands, config.paths.schemas, hosts=HOSTS, dispatch_hosts=HOSTS
        )
        if dispatch:
            more = {
                keys[a]: host.options(
                    host.install(f"daemon-{a}", policy.host_policies(registry)[a])
                )
                for a in HOSTS
            }
        else:
            more = {keys[a]: 'restrict,from="127.0.0.1"' for a in HOSTS}
        host.sshd.authorize(more=more)
        read_log(host.log)

        async def calls(daemon: Daemon) -> list[Any]:
            if dispatch:
                for alias in HOSTS:
                    await policy_state(daemon, alias, "current")
            return [outcome(await ask(config, tool, args)) for tool, args in CALLS]

        return list(asyncio.run(serving(config, calls)))

    plain, dispatched = run(False), run(True)
    assert dispatched == plain
    assert sum(o[0] == "success" for o in dispatched) >= 6, dispatched
    log = host.logged(len(CALLS))
    assert sum("allowed operation=" in line for line in log) == len(CALLS)
    assert not any("refused" in line for line in log)


# What a thief gets ---------------------------------------------------------------------


DF = "env LC_ALL=C df -P -k"  # disk_usage's command, less its path


def thief_commands(marker: Path) -> list[str]:
    touch = f"touch {marker}"
    python = f"open({str(marker)!r}, 'w')"
    commands = [
        touch,
        f"sh -c {shlex.quote(touch)}",
        f"/bin/sh -c {shlex.quote(touch)}",
        f"bash -c {shlex.quote(touch)}",
        f"python3 -c {shlex.quote(python)}",
        f"cat /proc/loadavg; {touch}",
        f"cat /proc/loadavg && {touch}",
        f"cat /proc/loadavg | tee {marker}",
        f"cat /proc/loadavg > {marker}",
        f"cat /proc/loadavg\n{touch}",
        f"{DF} $({touch})",
        f"{DF} `{touch}`",
        f"{DF} {shlex.quote('/$(' + touch + ')')}",
        f"{DF} '/'$({touch})",
        f"{DF} /;{touch}",
        f"{DF} / /etc",  # an extra argument
        f"{DF}",  # a missing one
        f"{DF} --output=source /",
        f"{DF} -- /",
        "cat /proc/loadavg /etc/shadow",
        "cat /etc/shadow",
        "ci-cli run status --json --project bluebird",  # another host's operation
        "findmnt -J -o TARGET,SOURCE,FSTYPE,OPTIONS --raw /",
        f"systemctl show -p ActiveState,SubState,MainPID {shlex.quote('ssh.service; ' + touch)}",
        "scp -t /tmp",
        "internal-sftp",
        "/usr/lib/openssh/sftp-server",
        f"env {touch}",
        f"exec {touch}",
    ]
    for text in HOSTILE_ARGUMENTS:
        commands.append(f"{DF} {text}")
        commands.append(f"{DF} {shlex.quote(text)}")
        if text:  # "/" alone is a valid path
            commands.append(f"{DF} {shlex.quote('/' + text)}")
    return commands


@pytest.fixture
def local_host(host: Host, tmp_path: Path) -> Host:
    registry = registry_of(open_commands(tmp_path / "commands"))
    host.use(host.install("local", policy.host_policies(registry)["local"]))
    if host.marker.exists():
        host.marker.unlink()
    return host


def assert_refused_once_each(host: Host, reasons: list[str]) -> None:
    log = host.logged(len(reasons))
    assert len(log) == len(reasons), log
    for line, reason in zip(log, reasons, strict=True):
        assert f"refused reason={reason}" in line, (line, reason)
    assert not host.marker.exists()


def test_a_thiefs_commands_are_refused_and_nothing_runs(local_host: Host) -> None:
    """Shells, injections, substitutions, wrong arguments, other hosts' and unknown programs."""
    host = local_host
    registry = registry_of(open_commands(host.root / "thief-commands"))
    assert f"{DF} /" == registry.operations["disk_usage"].command({"path": "/"})
    every = thief_commands(host.marker)
    # Only what the daemon would never send (a path "/-n" is valid, and harmless).
    commands = [c for c in every if not daemon_would_send(registry, "local", c)]
    assert len(every) - len(commands) <= 2 and len(commands) > 60
    results = asyncio.run(run_all(host.sshd, commands))
    reasons = []
    for command, result in zip(commands, results, strict=True):
        assert result.exit_status == dispatcher.REFUSED_STATUS, (command, result.stdout)
        assert result.stdout == ""
        match = REFUSAL.fullmatch(result.stderr)
        assert match is not None, (command, result.stderr)
        reasons.append(match["reason"])
    assert set(reasons) <= {"not_canonical", "no_match", "bad_argument"}
    assert_refused_once_each(host, reasons)
    for line in host.logged():
        assert "touch" not in line


def test_the_command_line_client_gets_no_shell(local_host: Host) -> None:
    """`ssh host`, `ssh -tt host`, `ssh host ''` and shell syntax: refused, nothing runs."""
    host = local_host
    touch = f"touch {host.marker}"
    cases: list[tuple[tuple[str, ...], tuple[str, ...], str]] = [
        ((), (), "no_command"),
        (("-tt",), (), "no_command"),
        ((), ("",), "no_command"),  # ssh host '': sshd sees no command
        ((), ("''",), "no_match"),  # the two characters: one empty argument
        (("-tt",), ("sh",), "no_match"),
        ((), (touch,), "no_match"),
        (("-o", "SetEnv=LC_EVIL=x"), (touch,), "no_match"),
        (("-o", "SetEnv=LC_ALL=C"), (f"sh -c {shlex.quote(touch)}",), "no_match"),
        ((), (f'sh -c "{touch}"',), "not_canonical"),
    ]
    for options, command, reason in cases:
        done = host.ssh(*command, options=options)
        if "-tt" not in options:
            assert done.returncode == dispatcher.REFUSED_STATUS, (options, command, done)
            assert f"({reason})" in done.stderr
            assert_refused_once_each(host, [reason])
            continue
        # restrict: no PTY. The client gives up at once; the dispatcher may still be started.
        assert done.returncode == 255 and "PTY allocation request failed" in done.stderr
        log = host.logged(1)  # its line may come after the client has gone: not in the next case
        assert log == [] or (len(log) == 1 and f"refused reason={reason}" in log[0]), log
        assert not host.marker.exists()


def test_scp_and_sftp_are_refused(local_host: Host, tmp_path: Path) -> None:
    """The sftp subsystem (sftp, scp) and the old scp protocol reach the dispatcher: refused."""
    host = local_host
    source = tmp_path / "payload"
    source.write_text("payload")
    target = f"{host.sshd.user}@127.0.0.1:{host.marker}"
    got = str(tmp_path / "got")
    runs = [
        (["sftp", *host.client("sftp")[1:], f"{host.sshd.user}@127.0.0.1"], "ls\n", "no_match"),
        ([*host.client("scp"), str(source), target], "", "no_match"),
        ([*host.client("scp"), "-O", str(source), target], "", "no_match"),
        (
            [
                *host.client("scp"),
                "-O",
                f"{host.sshd.user}@127.0.0.1:/etc/passwd",
                got,
            ],
            "",
            "no_match",
        ),
    ]
    for argv, stdin, reason in runs:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=30)
        assert done.returncode != 0, argv
        assert_refused_once_each(host, [reason])
    assert not (tmp_path / "got").exists()


def test_asyncssh_subsystems_environment_and_pty_requests(local_host: Host) -> None:
    """A subsystem, a command with variables, a forced PTY, no command at all: refused."""
    host = local_host

    async def attempts() -> list[Any]:
        async with asyncssh.connect(
            "127.0.0.1",
            host.sshd.port,
            username=host.sshd.user,
            client_keys=[str(host.sshd.client_key)],
            known_hosts=str(host.sshd.known_hosts),
            config=None,
        ) as conn:
            got = []
            for kwargs in (
                {"subsystem": "sftp"},
                {"command": f"touch {host.marker}", "env": {"LC_X": "1", "LANG": "C"}},
                {"command": None},
            ):
                got.append(await conn.run(**kwargs, check=False, stdin=asyncssh.DEVNULL))
            with pytest.raises(asyncssh.ChannelOpenError, match="PTY"):
                await conn.run(f"touch {host.marker}", term_type="xterm", request_pty="force")
            return got

    results = asyncio.run(attempts())
    assert [r.exit_status for r in results] == [dispatcher.REFUSED_STATUS] * 3
    assert_refused_once_each(host, ["no_match", "no_match", "no_command"])


def test_a_key_without_restrict_still_gets_no_terminal(host: Host, tmp_path: Path) -> None:
    """Without `restrict` sshd grants a PTY; the dispatcher sees it and runs nothing."""
    registry = registry_of(open_commands(tmp_path / "commands"))
    host.use(host.install("local", policy.host_policies(registry)["local"]), restrict=False)
    try:
        done = host.ssh("cat /proc/loadavg", options=("-tt",))
        assert done.returncode == dispatcher.REFUSED_STATUS
        assert "(terminal)" in done.stdout + done.stderr  # a PTY merges the streams
        assert_refused_once_each(host, ["terminal"])
    finally:
        host.sshd.authorize()


def test_what_the_program_gets_from_a_session(host: Host, tmp_path: Path) -> None:
    """Client variables, a PTY request and stdin do not reach the program; argv is exact."""
    probes = {
        "environment": ["/usr/bin/env"],
        "stdin": ["/usr/bin/readlink", "/proc/self/fd/0"],
        "terminal": ["/usr/bin/tty"],
    }
    body = {
        "format": policy.POLICY_FORMAT,
        "host": "probe",
        "operations": {k: {"argv": v, "params": {}} for k, v in probes.items()},
    }
    host.use(host.install("probe", {**body, "digest": policy.digest(body)}))
    smuggle = ("-o", "SetEnv=LC_EVIL=$(id) LANG=xx")
    env = host.ssh("/usr/bin/env", options=smuggle, stdin="secret\n")
    assert env.returncode == 0, env.stderr
    names = sorted(line.split("=", 1)[0] for line in env.stdout.splitlines())
    assert names == ["HOME", "LOGNAME", "PATH", "USER"]
    assert f"USER={host.sshd.user}" in env.stdout
    stdin = host.ssh("/usr/bin/readlink /proc/self/fd/0", stdin="secret\n")
    assert stdin.stdout.strip() == "/dev/null"
    tty = host.ssh("/usr/bin/tty")
    assert tty.stdout.strip() == "not a tty" and tty.returncode == 1


# Drift, through sshd --------------------------------------------------------------------


def test_a_host_one_operation_behind_is_refused_until_updated(host: Host, tmp_path: Path) -> None:
    """disk_usage missing on the host: refused unsent, counted; reload after the update frees it."""
    key = tmp_path / "local_key"
    generate_key(key)
    config = daemon_config(tmp_path / "d", host, {"ci": key, "local": key}, dispatch=True)
    config = config.model_copy(
        update={"hosts": {"local": config.hosts["local"]}, "pool": PoolSection(warm=("local",))}
    )
    commands = config.paths.commands
    for path in commands.glob("*.toml"):
        if 'host = "ci"' in path.read_text():
            path.unlink()
    registry = load_registry(
        commands, ROOT / "schemas", hosts=("local",), dispatch_hosts=("local",)
    )
    full = policy.host_policies(registry)["local"]
    behind = host.install("behind", policy_without(full, "disk_usage"))
    host.sshd.authorize(more={key: host.options(behind)})
    read_log(host.log)

    async def body(daemon: Daemon) -> None:
        await policy_state(daemon, "local", "drift")
        metrics = daemon.service.metrics.registry
        assert (
            metrics.get_sample_value(
                "sshadapter_dispatch_policy_checks_total", {"host": "local", "result": "drift"}
            )
            == 1
        )
        refused = await ask(config, "disk_usage", {"path": "/"})
        assert refused["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
        assert (await ask(config, "load_average", {}))["outcome"] == "success"
        log = host.logged()
        assert not any("disk_usage" in line for line in log)  # never sent
        assert any("allowed operation=load_average" in line for line in log)

        # The host gets the new policy, then the daemon reloads: current again.
        write_policy(behind, full)
        daemon.reload()
        await policy_state(daemon, "local", "current")
        assert (await ask(config, "disk_usage", {"path": "/"}))["outcome"] == "success"

        # Behind again without the daemon knowing: the host refuses, the daemon says so.
        write_policy(behind, policy_without(full, "disk_usage"))
        now = [time.monotonic() + 3600]
        monitor = PolicyMonitor(daemon.runner, daemon.service.metrics, clock=lambda: now[0])
        monitor.expect(policy.host_policies(daemon.service.registry))
        daemon.service.dispatch = monitor
        refused = await ask(config, "disk_usage", {"path": "/"})
        assert refused["error"] == {"code": "UPSTREAM_UNAVAILABLE", "retryable": False}
        assert "refused reason=no_match" in host.logged()[-1]
        await policy_state(daemon, "local", "drift")  # the refusal made it ask again

    asyncio.run(serving(config, body))
    records = [
        json.loads(line) for line in (tmp_path / "d" / "audit.jsonl").read_text().splitlines()
    ]
    results = [r for r in records if r["type"] == "result" and r["tool"] == "disk_usage"]
    assert [(r["stage"], r["reason"]) for r in results] == [
        ("transport", "policy_drift"),
        (None, None),
        ("exit", "remote_refused"),
    ]
    assert results[0]["attempts"] == [] and results[2]["detail"].startswith(
        "sshadapter-dispatch: refused (no_match) sha256:"
    )
    shutil.rmtree(tmp_path / "d" / "q", ignore_errors=True)


def local_dispatch_config(host: Host, tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    """A config file whose one host, local, is a dispatch host reached with a key of its own
    (for the test to authorize); returns the file, the key and local's whole policy."""
    key = tmp_path / "local_key"
    generate_key(key)
    commands = open_commands(tmp_path / "commands")
    for path in commands.glob("*.toml"):
        if 'host = "ci"' in path.read_text():
            path.unlink()
    local = ("local",)
    full = load_registry(commands, ROOT / "schemas", hosts=local, dispatch_hosts=local)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{ROOT / "schemas"}"\n\n'
        + host.sshd.host_toml("local", client_keys=[key], dispatch=True)
    )
    return config, key, policy.host_policies(full)["local"]


def test_check_hosts_names_what_a_host_lacks(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sshadapter check --hosts`: fixtures as offline, then the host's policy; drift is a miss."""
    config, key, full_policy = local_dispatch_config(host, tmp_path)
    installed = host.install("check", policy_without(full_policy, "mount_info"))
    host.sshd.authorize(more={key: host.options(installed)})
    assert cli_main(["check", "--config", str(config)]) == 0  # offline: no host asked
    capsys.readouterr()
    assert cli_main(["check", "--config", str(config), "--hosts"]) == 1
    lines = capsys.readouterr().out.splitlines()
    operations = len(full_policy["operations"])  # every shipped one of local
    row = f"local drift mount_info (1 of {operations} differ, 1 missing on the host) MISS"
    assert lines[-2].split() == row.split()
    assert lines[-1] == "1 dispatch hosts checked: 0 ok, 1 missed"
    assert cli_main(["check", "--config", str(config), "--hosts", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report[-1]["kind"] == "dispatch_policy" and report[-1]["ok"] is False
    assert report[-1]["got"]["refused"] == ["mount_info"]
    write_policy(installed, full_policy)
    assert cli_main(["check", "--config", str(config), "--hosts"]) == 0


# Answers as one program on the host writes them: {"stdout", "stderr", "status"} in a file.
SCRIPTED_ANSWER = """\
#!/usr/bin/python3 -IS
import json, sys
answer = json.load(open({path!r}))
sys.stdout.write(answer["stdout"])
sys.stderr.write(answer["stderr"])
sys.exit(answer["status"])
"""
# What a hostile host may write: a newline, another line's priority and head, a CR, an
# ESC sequence, a bidi override.
FORGED = "x\n<0>CRITICAL sshadapter.daemon.service: forged\r\x1b[2J\u202eok"


# The dispatcher's refusal is the first line of stderr: the forged line after FORGED's "\n".
FORGED_LINE: Final = FORGED.split("\n")[1]
FORGED_REFUSAL: Final = {
    "stdout": "",
    "stderr": f"{REFUSAL_PREFIX.decode()} (no_match) {FORGED_LINE}\n",
    "status": dispatcher.REFUSED_STATUS,
}
DRIFT_LOG_WAIT_SECONDS: Final = 30.0  # the daemon checks a host's policy just after connecting


def scripted_answers(host: Host, key: Path) -> Path:
    """The file whose {"stdout", "stderr", "status"} the host answers every command of
    ``key`` with (SCRIPTED_ANSWER as its forced command)."""
    answers = host.root / "answer.json"
    program = host.bin / "scripted-answer"
    program.write_text(SCRIPTED_ANSWER.format(path=str(answers)))
    program.chmod(0o755)
    host.sshd.authorize(more={key: f'restrict,from="127.0.0.1",command="{program}"'})
    return answers


def test_check_hosts_shows_a_hostile_hosts_words_escaped(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`check --hosts`: a host's name, extra operations and refusal line, escaped on one row."""
    config, key, full_policy = local_dispatch_config(host, tmp_path)
    digests = json.loads(dispatcher.digest_answer(full_policy))
    digests["host"] = FORGED
    digests["operations"][FORGED] = "sha256:" + "0" * 64
    answers = scripted_answers(host, key)
    cases = [
        ({"stdout": json.dumps(digests), "stderr": "", "status": 0}, 0, "ahead"),
        (FORGED_REFUSAL, 1, "refused"),
    ]
    for answer, status, result in cases:
        write_policy(answers, answer)
        assert cli_main(["check", "--config", str(config), "--hosts"]) == status, result
        out = capsys.readouterr().out
        lines = out.split("\n")
        assert all(line.isprintable() for line in lines), out
        (row,) = [line for line in lines if line.startswith("local ")]
        assert f" {result} " in row and "forged\\r\\x1b[2J\\u202eok" in row, row
        assert cli_main(["check", "--config", str(config), "--hosts", "--json"]) == status
        assert "\u202e" not in capsys.readouterr().out  # JSON escapes the rest itself


# Patterns with escapes -------------------------------------------------------------------


def test_an_operation_whose_pattern_has_unicode_escapes_runs_on_a_dispatch_host(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`^[a-z\\u00e0-\\u00ff]{1,20}$`: `sshadapter policy` writes it, the host runs the call."""
    commands = open_commands(tmp_path / "commands")
    for path in commands.glob("*.toml"):
        if 'host = "ci"' in path.read_text():
            path.unlink()
    greet = (
        (commands / "load_average.toml")
        .read_text()
        .replace(
            'argv = ["cat", "/proc/loadavg"]', f'argv = ["{host.bin / "argv-echo"}", "{{name}}"]'
        )
        .replace(
            "[output]",
            "[params.name]\ntype = \"string\"\npattern = '^[a-z\\u00e0-\\u00ff]{1,20}\\s?$'\n\n"
            "[output]",
        )
    )
    (commands / "greet.toml").write_text(greet)
    config = tmp_path / "config.toml"
    config.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{ROOT / "schemas"}"\n\n'
        + host.sshd.host_toml("local", dispatch=True)
    )
    assert cli_main(["policy", "local", "--config", str(config)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["operations"]["greet"]["params"]["name"]["pattern"].startswith("\\A[a-zà-ÿ]")
    host.use(host.install("greet", printed))
    op = registry_of(commands).operations["greet"]
    good, bad = ["àbcÿ", "zé\u3000", "ab\n"], ["Àbc", "ab\u0100", "ab\x85", "ab\n\n"]
    for name in good + bad:
        assert op.params_validator.is_valid({"name": name}) == (name in good), name
    results = asyncio.run(run_all(host.sshd, [op.command({"name": n}) for n in good + bad]))
    for name, result in zip(good + bad, results, strict=True):
        if name in good:
            assert result.exit_status == 0, (name, result.stderr)
            assert json.loads(result.stdout) == [name]
        else:
            assert result.exit_status == dispatcher.REFUSED_STATUS, name
            assert "(bad_argument)" in result.stderr
    log = host.logged(len(good + bad))
    assert sum("allowed operation=greet" in line for line in log) == len(good)


# A group's policy ------------------------------------------------------------------------


def test_a_groups_policy_installed_once_serves_every_member(
    host: Host, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`policy web` on the host: check --hosts --target web and the daemon find each current."""
    web = ("web-1", "web-2", "web-3")
    commands = open_commands(tmp_path / "commands")
    for path in commands.glob("*.toml"):
        text = path.read_text()
        if 'host = "ci"' in text:
            path.unlink()
        else:
            path.write_text(text.replace('host = "local"', 'targets = ["web"]'))
    config_file = tmp_path / "config.toml"
    config_file.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{ROOT / "schemas"}"\n\n'
        f'[server]\nsocket_path = "{tmp_path / "d.sock"}"\nallow = {{ uids = [{os.getuid()}] }}\n\n'
        f'[audit]\npath = "{tmp_path / "audit.jsonl"}"\nfsync = "never"\n'
        f'quarantine_dir = "{tmp_path / "q"}"\n\n'
        '[pool]\nwarm = ["web"]\n\n'  # a group: its members connected, so checked, at start
        + host.sshd.host_toml(*web, "solo", dispatch=True)
        + '[groups.web]\nmembers = ["web-1", "web-2", "web-3"]\n'
    )
    assert cli_main(["policy", "web", "--config", str(config_file)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["host"] == "web"
    host.use(host.install("web-group", document))  # one file behind every member's key

    check = ["check", "--config", str(config_file), "--hosts", "--target", "web"]
    status = cli_main([*check, "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and all(row["ok"] for row in report)
    rows = [row for row in report if row["kind"] == "dispatch_policy"]  # not solo's
    assert [(r["case"], r["got"]["policy"], r["ok"]) for r in rows] == [
        (alias, "current", True) for alias in web
    ]
    cli_main(check)
    lines = capsys.readouterr().out.splitlines()
    assert all(line.endswith("(installed as 'web')  ok") for line in lines[-4:-1])
    assert lines[-1] == "3 dispatch hosts checked: 3 ok, 0 missed"

    config, _ = load_config(config_file)

    async def body(daemon: Daemon) -> dict[str, Any]:
        for alias in web:
            await policy_state(daemon, alias, "current")
        return await ask(config, "load_average", {"run_on": "web"})

    answer = asyncio.run(serving(config, body))
    assert answer["outcome"] == "success", answer
    log = host.logged(3)
    assert sum("allowed operation=load_average" in line for line in log) == 3
    shutil.rmtree(tmp_path / "q", ignore_errors=True)


def test_the_daemons_drift_line_shows_a_refusal_escaped(host: Host, tmp_path: Path) -> None:
    """`serve` on the journal: the host's refusal of the policy question is one escaped <3> line."""
    config, key, _ = local_dispatch_config(host, tmp_path)
    write_policy(scripted_answers(host, key), FORGED_REFUSAL)
    config.write_text(
        f'[server]\nsocket_path = "{tmp_path / "sshadapter.sock"}"\n'
        f"allow = {{ uids = [{os.getuid()}] }}\n\n"
        f'[audit]\npath = "{tmp_path / "audit.jsonl"}"\nquarantine_dir = "{tmp_path / "q"}"\n\n'
        + config.read_text()
    )
    stderr_path = tmp_path / "stderr"
    with serving_on_the_journal(config, stderr_path) as serving:
        answer = call(serving.socket_path, {"op": "call", "tool": "load_average", "args": {}})
        deadline = time.monotonic() + DRIFT_LOG_WAIT_SECONDS
        while "policy refused" not in stderr_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
    assert answer["outcome"] == "failure", answer
    lines = journal_lines(stderr_path.read_text())
    (drift,) = [line for line in lines if "policy refused" in line[2]]
    assert drift[:2] == (3, "ERROR"), drift
    escaped = "(no_match) <0>CRITICAL sshadapter.daemon.service: forged\\r\\x1b[2J\\u202eok"
    assert escaped in drift[2], drift
    assert cli("audit", "verify", str(tmp_path / "audit.jsonl")).returncode == 0
