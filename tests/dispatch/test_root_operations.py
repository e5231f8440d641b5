"""Root operations (``run_as``): the command-file rules, the sudoers drop-in, real sudo and sshd.

The drop-in is proved with this machine's sudo (``visudo -c -f``, ``sudo -l -U``)
and installed for a scenario under a temporary name in /etc/sudoers.d, removed
afterwards. End to end, the daemon's command goes through a real sshd, the
dispatcher as the key's forced command, and sudo, and runs as root; anything
else is refused by the dispatcher and, tried directly as the account, by sudo.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import asyncssh
import pytest
from dispatch_support import install_dispatcher, syslog_listener, write_policy
from sshd import Sshd, host_directory, login_account, policy_owner_args, running_sshd

from sshadapter.cli import main as cli_main
from sshadapter.contract.registry import Registry, load_registry
from sshadapter.contract.run_as import SUDO_PROGRAM, sudo_prefix
from sshadapter.dispatch import dispatcher, policy, sudoers
from sshadapter.errors import ConfigError

HOSTS: Final = ("local", "other")
# Prints who it runs as and its arguments: the proof of which account and argv arrived.
ROOT_ECHO: Final = (
    "#!/usr/bin/python3 -IS\nimport json, os, sys\n"
    'print(json.dumps({"uid": os.getuid(), "args": sys.argv[1:]}))\n'
)
SCHEMA: Final = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "uid": {"type": "integer", "minimum": 0, "maximum": 2**32},
        "args": {
            "type": "array",
            "maxItems": 8,
            "items": {"type": "string", "pattern": "^[ -~]{0,64}$", "maxLength": 64},
        },
    },
    "required": ["uid", "args"],
    "additionalProperties": False,
}
ECHO: Final = "/usr/bin/echo"  # a program sudo finds here (sudo -l refuses a missing one)
UNIT: Final = "^[a-z][a-z0-9_-]{0,15}\\.service$"
OTHER_ACCOUNT: Final = "nobody"  # a second dispatch account: its drop-in beside the test's
RESTART: Final = {"unit": "nginx.service", "mode": "slow"}  # valid arguments of "restart"


def command_file(program: str, *, run_as: str | None = "root", extra: str = "") -> str:
    """A command file restarting a unit through ``program``, as ``run_as``."""
    who = f'run_as = "{run_as}"\n' if run_as else ""
    return f"""description = "restart a unit"
version = 1
host = "local"
{who}argv = ["{program}", "restart", "{{unit}}", "--mode={{mode}}"]
{extra}
[params.unit]
type = "string"
pattern = '{UNIT}'

[params.mode]
type = "string"
enum = ["fast", "slow"]

[output]
format = "json"
schema = "root_echo.v1.json"

[agent]
fields = ["uid", "args"]
"""


def make_commands(root: Path, files: dict[str, str]) -> tuple[Path, Path]:
    commands, schemas = root / "commands", root / "schemas"
    commands.mkdir(parents=True, exist_ok=True)
    schemas.mkdir(exist_ok=True)
    (schemas / "root_echo.v1.json").write_text(json.dumps(SCHEMA))
    for name, text in files.items():
        (commands / f"{name}.toml").write_text(text)
    return commands, schemas


def registry_of(root: Path, files: dict[str, str], dispatch: tuple[str, ...] = HOSTS) -> Registry:
    commands, schemas = make_commands(root, files)
    return load_registry(commands, schemas, hosts=HOSTS, dispatch_hosts=dispatch)


def require_sudo() -> None:
    """Skip without sudo or root (sudo -l -U and /etc/sudoers.d need both); fail under $CI."""
    if shutil.which("sudo") and shutil.which("visudo") and os.geteuid() == 0:
        return
    message = "sudo/visudo not installed or not root: run scripts/install-test-deps as root"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


# The command file ---------------------------------------------------------------------


def test_run_as_prefixes_sudo_and_the_policy_carries_it(tmp_path: Path) -> None:
    """The daemon sends sudo -n -u root -- PROGRAM ARGS, and the policy's template says so."""
    registry = registry_of(tmp_path, {"restart": command_file("/usr/local/bin/root-echo")})
    op = registry.operations["restart"]
    args = {"unit": "nginx.service", "mode": "fast"}
    assert op.command(args) == (
        "/usr/bin/sudo -n -u root -- /usr/local/bin/root-echo restart nginx.service --mode=fast"
    )
    entry = policy.host_policies(registry)["local"]["operations"]["restart"]
    assert entry["argv"][:6] == [*sudo_prefix("root"), "/usr/local/bin/root-echo"]
    assert op.root is not None
    assert op.root.arguments == (
        "^restart [abcdefghijklmnopqrstuvwxyz][0123456789_abcdefghijklmnopqrstuvwxyz-]{0,15}"
        "[.]service --mode=(fast|slow)$"
    )


BAD_FILES: Final = [
    # (what to change in the good file, key, reason fragment)
    ((UNIT, "^[a-z ]+$"), "params.unit.pattern", "' '"),
    ((UNIT, "^.+$"), "params.unit.pattern", "'.'"),
    ((UNIT, "^[^/]+$"), "params.unit.pattern", "negated class"),
    ((UNIT, "^a|b$"), "params.unit.pattern", "alternation outside a group"),
    ((UNIT, "[a-z]+"), "params.unit.pattern", "not anchored"),
    ((UNIT, "^[+-=]+$"), "params.unit.pattern", "range"),
    (('enum = ["fast", "slow"]', 'enum = ["fast", "very slow"]'), "params.mode.enum", "very slow"),
    (("--mode={mode}", "--mode {mode}"), "argv[3]", "literal argument"),
    (('"/usr/local/bin/root-echo"', '"root-echo"'), "argv[0]", "absolute path"),
    (("'\n", "'\nmaxLength = 20\n"), "params.unit.maxLength", "exactly"),
]


@pytest.mark.parametrize(("change", "key", "reason"), BAD_FILES)
def test_what_sudo_could_not_match_exactly_is_a_load_error(
    tmp_path: Path, change: tuple[str, str], key: str, reason: str
) -> None:
    """Whitespace-capable or inexact parameters of a root operation do not load."""
    text = command_file("/usr/local/bin/root-echo").replace(*change, 1)
    with pytest.raises(ConfigError) as caught:
        registry_of(tmp_path, {"restart": text})
    assert caught.value.key == key
    assert reason in caught.value.reason


def test_run_as_needs_a_dispatch_host(tmp_path: Path) -> None:
    """Without sshadapter-dispatch the host would trust the command string: a load error."""
    with pytest.raises(ConfigError, match="needs a dispatch host") as caught:
        registry_of(tmp_path, {"restart": command_file("/bin/x")}, dispatch=())
    assert caught.value.key == "run_as"


# The drop-in and its proof --------------------------------------------------------------


def write_config(root: Path, files: dict[str, str], user: str) -> Path:
    commands, schemas = make_commands(root, files)
    known = root / "known_hosts"
    known.write_text("")
    config = root / "config.toml"
    config.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{schemas}"\n'
        + "".join(
            f'[hosts.{alias}]\naddress = "127.0.0.1"\nuser = "{user}"\n'
            f'known_hosts = "{known}"\ndispatch = true\n'
            for alias in HOSTS
        )
    )
    return config


def sudoers_cli(
    config: Path, capsys: pytest.CaptureFixture[str], *more: str, target: str = "local"
) -> tuple[int, str, str]:
    status = cli_main(["sudoers", target, "--config", str(config), *more])
    out, err = capsys.readouterr()
    return status, out, err


def test_sudoers_prints_one_rule_per_root_operation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The drop-in names the account, the exact command, the hardening and the policy digest."""
    files = {
        "restart": command_file("/usr/local/bin/root-echo"),
        "look": command_file("/usr/local/bin/look", run_as=None).replace("restart", "status"),
    }
    status, out, _ = sudoers_cli(write_config(tmp_path, files, "adapter"), capsys)
    assert status == 0
    rules = [line for line in out.splitlines() if not line.startswith("#")]
    alias = f"SSHADAPTER_{sudoers.namespace('adapter', 'local').upper()}_RESTART"
    assert rules == [
        f"Cmnd_Alias {alias} = /usr/local/bin/root-echo ^restart "
        "[abcdefghijklmnopqrstuvwxyz][0123456789_abcdefghijklmnopqrstuvwxyz-]{0,15}"
        "[.]service --mode=(fast|slow)$",
        f"Defaults!{alias} env_reset, !setenv",
        f"adapter ALL = (root) NOPASSWD:NOEXEC: {alias}",
    ]
    registry_digest = cli_digest(tmp_path / "config.toml", capsys)
    assert f"# {registry_digest}: install both together." in out
    assert f"# Install as {sudoers.install_path('adapter', 'local')}, owner root" in out


def cli_digest(config: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert cli_main(["policy", "local", "--config", str(config)]) == 0
    return str(json.loads(capsys.readouterr().out)["digest"])


def test_sudoers_check_proves_the_drop_in_with_real_sudo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """visudo -c passes, and sudo -l -U allows every example and refuses every mutation."""
    require_sudo()
    files = {"restart": command_file(ECHO)}
    config = write_config(tmp_path, files, login_account())
    before = set(sudoers.SUDOERS_DIR.iterdir())
    status, out, err = sudoers_cli(config, capsys, "--check")
    assert status == 0, err
    assert "visudo -c: ok" in err
    assert set(sudoers.SUDOERS_DIR.iterdir()) == before  # the temporary rule is gone
    assert err.endswith(" answers as required, 0 diagnostic(s) of the installed sudoers\n")
    proved = proof_of(out, rules_of(tmp_path, login_account()))
    assert proved.ok
    assert sum(proof.expected for proof in proved.proofs) == 2  # shortest and longest examples
    assert sum(not proof.expected for proof in proved.proofs) >= 15


def rules_of(root: Path, account: str, target: str = "local") -> list[sudoers.Rule]:
    registry = load_registry(root / "commands", root / "schemas", hosts=HOSTS, dispatch_hosts=HOSTS)
    return sudoers.rules(registry.operations.values(), account, target)


def proof_of(text: str, found: list[sudoers.Rule], target: str = "local") -> sudoers.Proved:
    """The proof of the drop-in of the login account on ``target``, as --check runs it."""
    account = login_account()
    return sudoers.prove(text, account, found, sudoers.install_path(account, target))


def test_an_invalid_regex_passes_visudo_and_fails_the_proof(tmp_path: Path) -> None:
    """visudo -c accepts a rule whose expression never matches; the sudo -l proof does not."""
    require_sudo()
    registry = registry_of(tmp_path, {"restart": command_file(ECHO)})
    found = sudoers.rules(registry.operations.values(), login_account(), "local")
    text = sudoers.drop_in("local", login_account(), found, "sha256:-").replace(
        "(fast|slow)$", "(fast|slow$", 1
    )  # an unbalanced parenthesis: regcomp refuses it, visudo does not look
    passed, _ = sudoers.visudo_check(text)
    assert passed
    proved = proof_of(text, found)
    assert [p.ok for p in proved.proofs if p.expected] == [False, False]


def test_sudoers_check_fails_on_what_sudo_says_of_the_whole_installed_sudoers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two old drop-ins defining one alias make sudo warn: --check fails, in one line."""
    require_sudo()
    config = write_config(tmp_path, {"restart": command_file(ECHO)}, login_account())
    old = (
        f"Cmnd_Alias SSHADAPTER_RESTART = {ECHO} ^restart$\n"
        f"{login_account()} ALL = (root) NOPASSWD: SSHADAPTER_RESTART\n"
    )
    # The second's name holds ESC, a bidi override and a byte that is no UTF-8: sudo prints
    # the name, the check shows it escaped.
    with drop_ins_installed({"old-a": old, "old-b\x1b[2J\u202e\udcff": old}):
        status, _, err = sudoers_cli(config, capsys, "--check")
    lines = err.splitlines()
    assert status == 1, err
    assert len(lines) == 3 and lines[0].startswith("visudo -c: ok: ")
    warned = re.fullmatch(
        r'installed sudoers: (\S+):1:\d+: Alias "SSHADAPTER_RESTART" already defined', lines[1]
    )
    assert warned and warned[1].endswith("-old-b\\x1b[2J\\u202e\\xff"), lines[1]
    assert re.fullmatch(r"sudo -l: (\d+) of \1 answers as required, 1 diagnostic\(s\) .*", lines[2])


def test_sudoers_check_reads_its_installed_file_and_refuses_beside_another_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Installed as printed, --check proves it in place; installed with other text, one line."""
    require_sudo()
    config = write_config(tmp_path, {"restart": command_file(ECHO)}, login_account())
    status, text, err = sudoers_cli(config, capsys)
    assert status == 0, err
    install = sudoers.install_path(login_account(), "local")
    with installed_as(install, text):
        status, _, err = sudoers_cli(config, capsys, "--check")
        assert status == 0, err
        assert " 0 diagnostic(s) of the installed sudoers" in err
    with installed_as(install, text.replace("--mode=(fast|slow)", "--mode=(fast)")):
        status, out, err = sudoers_cli(config, capsys, "--check")
    assert (status, out) == (1, text)
    assert err == (
        f"sshadapter: sudoers --check: {install} holds other rules under this drop-in's names: "
        "sudo would read both, so check before installing (or on a machine like the host)\n"
    )


def test_a_drop_in_visudo_rejects_fails_the_check(tmp_path: Path) -> None:
    """A syntax error is visudo's refusal, said in one line."""
    require_sudo()
    passed, said = sudoers.visudo_check("adapter ALL = NOPASSWD /usr/bin/id\n")
    assert not passed
    assert "syntax error" in said


# End to end: sshd, the dispatcher, sudo --------------------------------------------------


@pytest.fixture(scope="module")
def sudo_host() -> Iterator[tuple[Sshd, Path, Any]]:
    require_sudo()
    with running_sshd() as sshd, host_directory() as root:
        program = root / "root-echo"
        program.write_text(ROOT_ECHO)
        program.chmod(0o755)
        with syslog_listener(root / "log") as log:
            yield sshd, root, log
        sshd.authorize()


@contextlib.contextmanager
def drop_ins_installed(texts: dict[str, str]) -> Iterator[None]:
    """Each drop-in (by a name of this run) in /etc/sudoers.d, 0440; all removed afterwards."""
    with contextlib.ExitStack() as stack:
        for name, text in texts.items():
            path = sudoers.SUDOERS_DIR / f"sshadapter-test-{os.getpid()}-{name}"
            stack.enter_context(installed_as(path, text))
        yield


@contextlib.contextmanager
def installed_as(path: Path, text: str) -> Iterator[None]:
    """``text`` as the new drop-in ``path``, 0440; removed afterwards."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o440)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)  # created 0440: sudo ignores a drop-in with any other mode
        yield
    finally:
        path.unlink(missing_ok=True)


@pytest.fixture
def installed(
    sudo_host: tuple[Sshd, Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> Iterator[Any]:
    """The dispatcher and the policy of "local"; the drop-ins `sshadapter sudoers local`
    prints for two configurations, the test's account and another, each proved by --check
    with the one before installed, both installed side by side; removed afterwards."""
    sshd, root, log = sudo_host
    program = str(root / "root-echo")
    files = {
        "restart": command_file(program),
        "status": command_file(program, run_as=None).replace('"restart"', '"status"'),
    }
    registry = registry_of(tmp_path, files)
    policy_file = write_policy(root / "policy.json", policy.host_policies(registry)["local"])
    dispatch = install_dispatcher(root)
    with contextlib.ExitStack() as stack:
        for account in (sshd.user, OTHER_ACCOUNT):
            config = write_config(tmp_path / account, files, account)
            status, text, err = sudoers_cli(config, capsys, "--check")
            assert status == 0, err
            stack.enter_context(drop_ins_installed({account: text}))
        owner = "".join(f"{arg} " for arg in policy_owner_args())
        sshd.authorize(
            f'restrict,from="127.0.0.1",command="{dispatch} {owner}--log-socket '
            f'{root / "log"} {policy_file}"'
        )
        yield sshd, registry, program, log


async def run_all(sshd: Sshd, commands: list[str]) -> list[asyncssh.SSHCompletedProcess]:
    async with asyncssh.connect(
        "127.0.0.1",
        sshd.port,
        username=sshd.user,
        client_keys=[str(sshd.client_key)],
        known_hosts=str(sshd.known_hosts),
        config=None,
    ) as conn:
        return [await conn.run(c, check=False, stdin=asyncssh.DEVNULL) for c in commands]


def test_the_declared_root_operation_runs_as_root_through_sshd_and_sudo(installed: Any) -> None:
    """The daemon's command for valid arguments runs the program as root with that argv."""
    sshd, registry, _, _ = installed
    op = registry.operations["restart"]
    args = RESTART
    (result,) = asyncio.run(run_all(sshd, [op.command(args)]))
    assert result.exit_status == 0, result.stderr
    assert isinstance(result.stdout, str)
    assert json.loads(result.stdout) == {"uid": 0, "args": op.argv.argv(args)[6:]}


def test_two_drop_ins_side_by_side_leave_sudo_silent(installed: Any) -> None:
    """Drop-ins of two accounts side by side: a root call's stderr is empty, visudo -c clean.

    Each has its own names, so sudo prints no `Alias ... already defined`."""
    sshd, registry, _, _ = installed
    (result,) = asyncio.run(run_all(sshd, [registry.operations["restart"].command(RESTART)]))
    assert (result.exit_status, result.stderr) == (0, "")
    whole = subprocess.run(["visudo", "-c"], capture_output=True, text=True, timeout=30)
    assert (whole.returncode, whole.stderr) == (0, "")


def quoted(argv: list[str]) -> str:
    return " ".join(shlex.quote(e) for e in argv)


def test_anything_else_is_refused_by_the_dispatcher_and_by_sudo(installed: Any) -> None:
    """Other arguments, another account, an undeclared program: the dispatcher and sudo refuse."""
    sshd, _, program, _ = installed
    prefix = list(sudo_prefix("root"))
    others = [
        [*prefix, program, "restart", "nginx.service", "--mode=fast", "x"],
        [*prefix, program, "restart", "nginx.service --mode=fast"],  # sudo's blind spot
        [*prefix, program, "restart", "a b.service", "--mode=fast"],
        [*prefix, program, "stop", "nginx.service", "--mode=fast"],
        [*prefix, program, "restart", "nginx.service", "--mode=rude"],
        [SUDO_PROGRAM, "-n", "-u", "nobody", "--", program, "restart", "a.service", "--mode=fast"],
        [*prefix, "/usr/bin/id"],
        [*prefix, "/bin/sh", "-c", "id"],
        [program, "restart", "nginx.service", "--mode=fast"],  # status's shape: "status" differs
    ]
    results = asyncio.run(run_all(sshd, [quoted(argv) for argv in others]))
    for argv, result in zip(others, results, strict=True):
        assert result.exit_status == dispatcher.REFUSED_STATUS, argv
        assert result.stdout == ""
    # The account itself, without the dispatcher: sudo refuses all but its joined-string
    # blind spot (one argument holding a space), which the dispatcher above refused.
    for argv in [others[0], *others[2:8]]:
        done = subprocess.run(
            argv, user=sshd.user, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 1, (argv, done.stdout)
        assert "a password is required" in done.stderr
    blind = [SUDO_PROGRAM, "-n", "-l", "-U", sshd.user, *others[1][2:]]
    assert subprocess.run(blind, capture_output=True, timeout=30).returncode == 0
    declared = [*prefix, program, "restart", "nginx.service", "--mode=fast"]
    done = subprocess.run(declared, user=sshd.user, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["uid"] == 0


def test_sudoers_without_root_operations_or_programs_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No run_as operation: usage error; --check where the program is missing: a failure."""
    plain = write_config(tmp_path / "a", {"look": command_file(ECHO, run_as=None)}, "adapter")
    status, out, err = sudoers_cli(plain, capsys)
    assert (status, out) == (2, "")
    assert err == "sshadapter: no operation on local has run_as\n"
    absent = write_config(tmp_path / "b", {"restart": command_file("/no/such/prog")}, "adapter")
    status, out, err = sudoers_cli(absent, capsys, "--check")
    assert status == 1
    assert "_RESTART = /no/such/prog ^restart" in out
    assert err.count("\n") == 1 and "/no/such/prog not on this machine" in err


def test_a_group_whose_members_log_in_as_two_accounts_gets_no_drop_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One drop-in serves one account: a group of two is a configuration error, in one line."""
    text = command_file(ECHO).replace('host = "local"', 'targets = ["both"]')
    config = write_config(tmp_path, {"restart": text}, "adapter")
    config.write_text(
        config.read_text().replace('user = "adapter"', 'user = "other"', 1)
        + '[groups.both]\nmembers = ["local", "other"]\n'
    )
    status = cli_main(["sudoers", "both", "--config", str(config)])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert err.count("\n") == 1
    assert "groups.both: members log in as adapter, other" in err
    config.write_text(config.read_text().replace('user = "other"', 'user = "adapter"'))
    assert cli_main(["sudoers", "both", "--config", str(config)]) == 0
    alias = f"SSHADAPTER_{sudoers.namespace('adapter', 'both').upper()}_RESTART"
    assert f"adapter ALL = (root) NOPASSWD:NOEXEC: {alias}" in capsys.readouterr().out


def test_a_group_with_one_member_without_the_dispatcher_refuses_run_as(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every host a root operation can reach runs the dispatcher, or the load fails, naming it."""
    text = command_file(ECHO).replace('host = "local"', 'targets = ["both"]')
    config = write_config(tmp_path, {"restart": text}, "adapter")
    config.write_text(
        config.read_text().replace("dispatch = true", "dispatch = false", 1)
        + '[groups.both]\nmembers = ["local", "other"]\n'
    )
    status = cli_main(["check", "--config", str(config)])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert "run_as: may run on 1 host(s) without the dispatcher (" in err
    assert err.count("\n") == 1
