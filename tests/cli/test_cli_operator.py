"""The operator's commands for fleets and approvals, run in-process: answers and one-line errors."""

from __future__ import annotations

import asyncio
import os
import pwd
from pathlib import Path

import orjson
import pytest
from daemon_harness import JOB_COMMAND, JOB_OUT, ROOT, Running, shipped_commands, with_daemon
from test_approvals import TOOL, approval_commands
from test_audit import other_account
from test_inventory import HEAD, write

from sshadapter.cli import main
from sshadapter.config import ApprovalsSection
from sshadapter.inventory.fleet import host_set_digest
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_inventory_alone_lists_every_group_with_its_digest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sshadapter inventory` prints each group's size and digest, then the totals."""
    status, out, _ = run(capsys, "inventory", "--config", str(write(tmp_path)))
    assert status == 0
    assert out.splitlines()[-1] == "4 host(s), 3 group(s)"
    assert f"prod      2  {host_set_digest(('local', 'web1'))}" in out


def test_inventory_lists_the_implicit_group_all_and_shows_its_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inventory` lists `all` (no file declares it); `inventory show all` prints every alias."""
    config = str(write(tmp_path))
    every = ("ci", "local", "web1", "web2")
    status, out, _ = run(capsys, "inventory", "--config", config)
    assert status == 0 and f"all       4  {host_set_digest(every)}" in out.splitlines()
    status, out, _ = run(capsys, "inventory", "show", "all", "--config", config)
    assert status == 0 and out.splitlines() == [*every, f"# 4 host(s), {host_set_digest(every)}"]


def test_inventory_json_gives_the_groups_and_one_targets_hosts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inventory show --json`, with and without a target, is JSON a script can read."""
    config = str(write(tmp_path))
    status, out, _ = run(capsys, "inventory", "show", "--json", "--config", config)
    assert status == 0 and orjson.loads(out)["groups"]["web"]["hosts"] == 2
    status, out, _ = run(capsys, "inventory", "show", "web", "--json", "--config", config)
    assert orjson.loads(out) == {
        "target": "web",
        "hosts": ["web1", "web2"],
        "hosts_sha256": host_set_digest(("web1", "web2")),
    }


def test_inventory_show_of_a_host_gives_where_and_how_it_is_reached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`inventory show HOST` prints its address, port, user, labels, via and groups."""
    config = str(write(tmp_path))
    status, out, _ = run(capsys, "inventory", "show", "web1", "--config", config)
    assert status == 0
    assert out.splitlines() == [
        "web1",
        "  address  10.0.0.1",
        "  port     2222",
        "  user     sshadapter",
        "  labels   dc=fra1, env=prod, role=web",
        "  via      -",
        "  groups   all, prod, web",
        f"# 1 host(s), {host_set_digest(('web1',))}",
    ]
    status, out, _ = run(capsys, "inventory", "show", "web1", "--json", "--config", config)
    assert orjson.loads(out)["host"] == {
        "address": "10.0.0.1",
        "port": 2222,
        "user": "sshadapter",
        "labels": {"dc": "fra1", "env": "prod", "role": "web"},
        "via": "",
        "groups": ["all", "prod", "web"],
    }


def test_inventory_show_of_a_host_escapes_its_address(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An address with an ESC sequence and a bidi override reaches the screen escaped."""
    hostile = '[hosts.odd]\naddress = "h\\u001b[2J\\u202eost"\nvia = "local"\n'
    config = str(write(tmp_path, odd=hostile))
    status, out, _ = run(capsys, "inventory", "show", "odd", "--config", config)
    assert status == 0 and out.isascii() and all(c.isprintable() for c in out.splitlines())
    assert "  address  h\\x1b[2J\\u202eost" in out.splitlines()
    assert "  via      local" in out.splitlines()


def test_inventory_show_of_an_unknown_name_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target that is no alias and no group: exit 2, one line."""
    status, out, err = run(capsys, "inventory", "show", "nosuch", "--config", str(write(tmp_path)))
    assert (status, out) == (2, "")
    assert err == "sshadapter: 'nosuch' is no host alias and no group\n"


@pytest.mark.parametrize(
    ("who", "tool", "status", "said"),
    [
        ("0", "no_such_tool", 2, "no tool 'no_such_tool'"),
        ("no-such-user-here", "disk_usage", 2, "no user 'no-such-user-here'"),
        ("\u00b2", "disk_usage", 2, "no user '\u00b2'"),  # a digit to isdigit(), not to int()
        ("0", "disk_usage", 1, "decision: DENY"),
    ],
)
def test_grants_explain_refuses_in_one_line_and_denies_by_default(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    who: str,
    tool: str,
    status: int,
    said: str,
) -> None:
    """Unknown tools and users are one line (exit 2); no grant and no allow is DENY (exit 1)."""
    config = str(write(tmp_path))
    got, out, err = run(capsys, "grants", "explain", who, tool, "local", "--config", config)
    assert got == status and said in out + err


def test_grants_explain_takes_a_uid_without_a_passwd_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A uid no passwd entry names is explained as the daemon decides it: by the uid alone."""
    uid = next(n for n in range(54321, 64000) if n not in {u.pw_uid for u in pwd.getpwall()})
    grant = f'[[grants]]\nuids = [{uid}]\ntools = ["disk_usage"]\ntargets = ["local"]\n'
    config = str(write(tmp_path, HEAD + grant))
    status, out, err = run(
        capsys, "grants", "explain", str(uid), "disk_usage", "local", "--config", config
    )
    assert (status, err) == (0, "")
    assert out.splitlines()[0] == (
        f"uid {uid} (no passwd entry; groups: none known, only grants and allow naming the uid "
        "count), disk_usage, local"
    )
    assert "  grants[0] gives local" in out and "decision: ALLOW" in out


def test_a_load_error_naming_a_host_with_control_characters_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host name with a newline, ESC and U+202E: `inventory show` says why in one line."""
    forged = "web\\nCRITICAL sshadapter: approved\\u001b[2J\\u202e"
    config = str(write(tmp_path, more=f'[hosts."{forged}"]\naddress = "10.0.0.9"\n'))
    status, out, err = run(capsys, "inventory", "show", "--config", config)
    assert (status, out) == (2, "")
    assert err == (
        f"sshadapter: {tmp_path}/inventory.d/more.toml: "
        "hosts.web\\nCRITICAL sshadapter: approved\\x1b[2J\\u202e.[key]: "
        "String should match pattern '^[a-z][a-z0-9_-]{0,62}$'\n"
    )


def test_check_shows_a_duplicate_hosts_address_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two aliases for one address holding a newline: `check`'s warning stays one line."""
    address = "10.0.0.9\\n<0>CRITICAL sshadapter: approved"
    hosts = "".join(f'[hosts.{name}]\naddress = "{address}"\n' for name in ("dup1", "dup2"))
    status, _, err = run(capsys, "check", "--config", str(write(tmp_path, more=hosts)))
    (warning,) = [line for line in err.splitlines() if "same address" in line]
    assert warning.endswith(
        "hosts.dup2: same address and port as 'dup1' "
        "(10.0.0.9\\n<0>CRITICAL sshadapter: approved:22)"
    )
    assert status == 0 and all(line.startswith("sshadapter: ") for line in err.splitlines())


def test_examples_refuses_a_directory_that_is_not_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`examples --write` never overwrites: a non-empty directory is one line, exit 2."""
    (tmp_path / "keep").write_text("mine\n")
    status, out, err = run(capsys, "examples", "--write", str(tmp_path))
    assert (status, out) == (2, "") and err.count("\n") == 1
    assert (tmp_path / "keep").read_text() == "mine\n"


def planted(tmp_path: Path) -> Path:
    """A root-only file outside the directory written to: what a planted link points at."""
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_text("root only\n")
    secret.chmod(0o600)
    return secret


def test_examples_never_write_through_a_link_planted_in_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A link named like a file it writes (LICENSE): refused in one line, its target unchanged."""
    secret = planted(tmp_path)
    target = tmp_path / "examples"
    target.mkdir()
    (target / "LICENSE").symlink_to(secret)
    status, out, err = run(capsys, "examples", "--write", str(target))
    assert (status, out) == (2, "")
    assert err == f"sshadapter examples: {target} exists and is not an empty directory\n"
    assert secret.read_text() == "root only\n"


def test_examples_refuse_a_directory_that_is_a_link(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """DIR a link to an empty directory elsewhere: one line, nothing written there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = tmp_path / "examples"
    target.symlink_to(elsewhere)
    status, out, err = run(capsys, "examples", "--write", str(target))
    assert (status, out) == (2, "")
    assert err == f"sshadapter examples: {target}: --write: is a symlink: give the real directory\n"
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("shared", ["mode 0777", "another account's"])
def test_examples_refuse_a_directory_others_can_write_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], shared: str
) -> None:
    """An empty DIR another account can write to (and plant a link in): one line, no file."""
    target = tmp_path / "shared"
    target.mkdir()
    if shared == "mode 0777":
        target.chmod(0o777)
        said = "directory mode 0777 lets other accounts write to it"
    else:
        nobody = other_account()
        os.chown(target, nobody, -1)
        said = f"directory is owned by nobody (uid {nobody}), not by "
    status, out, err = run(capsys, "examples", "--write", str(target))
    assert (status, out) == (2, "") and err.count("\n") == 1
    assert err.startswith(f"sshadapter examples: {target}: --write: {said}")
    assert list(target.iterdir()) == []


def test_examples_write_public_files_into_a_new_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new DIR: made 0755 with parents, every file 0644 whatever the umask, nothing else."""
    target = tmp_path / "new" / "examples"
    old_umask = os.umask(0o002)  # a umask that would leave group write on what it makes
    try:
        status, out, _ = run(capsys, "examples", "--write", str(target))
    finally:
        os.umask(old_umask)
    assert status == 0 and out.startswith("wrote CHANGELOG.md LICENSE ")
    assert target.stat().st_mode & 0o777 == 0o755
    files = [p for p in target.rglob("*") if p.is_file()]
    assert (target / "LICENSE") in files and (target / "commands" / "load_average.toml") in files
    assert {p.stat().st_mode & 0o777 for p in files} == {0o644}
    assert {p.stat().st_mode & 0o777 for p in target.rglob("*") if p.is_dir()} == {0o755}
    assert not any(p.is_symlink() for p in target.rglob("*"))


@pytest.mark.parametrize(
    "argv", [("approvals", "list"), ("approvals", "approve", "req.0123456789abcdef0123")]
)
def test_approvals_without_a_daemon_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    """No daemon at the socket: the approver is told so in one line, exit 1."""
    socket = str(tmp_path / "none.sock")
    status, out, err = run(capsys, *argv, "--socket", socket)
    assert (status, out) == (1, "") and err.count("\n") == 1


def test_approvals_list_and_an_unknown_request_as_an_approver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An approver with nothing pending is told so; approving an unknown id is refused."""
    seen: list[tuple[int, str, str]] = []

    async def body(d: Running) -> None:
        for argv in (
            ("approvals", "list"),
            ("approvals", "deny", "req.0123456789abcdef0123"),
        ):
            seen.append(await asyncio.to_thread(run, capsys, *argv, "--socket", str(d.path)))

    with_daemon(tmp_path, body, approvals=ApprovalsSection(uids=(os.getuid(),)))
    (listed, out, _), (denied, _, err) = seen
    assert (listed, out) == (0, "no call waits for approval\n")
    assert denied == 1 and "no call waits under req.0123456789abcdef0123" in err


def test_approvals_from_someone_who_is_no_approver_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A caller outside [approvals] gets a refusal, never the list."""
    seen: list[tuple[int, str, str]] = []

    async def body(d: Running) -> None:
        argv = ("approvals", "list", "--socket", str(d.path))
        seen.append(await asyncio.to_thread(run, capsys, *argv))

    with_daemon(tmp_path, body, approvals=ApprovalsSection(uids=(os.getuid() + 4242,)))
    ((status, out, err),) = seen
    assert (status, out) == (1, "")
    assert "refused: not an approver" in err


def test_call_shows_a_string_fields_control_characters_as_json_escapes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A projected free-text field's DEL, C1 and bidi bytes reach the terminal as \\u escapes."""
    hostile = "ok\x7f\x9b31m\u202eeurt/nib/rsu/\u2066x\U000e0041"
    commands = shipped_commands(tmp_path)
    op = commands / "job_run_status.toml"
    op.write_text(op.read_text().replace('"observed_at"]', '"observed_at", "log_tail"]'))
    result = RunResult(orjson.dumps({**JOB_OUT, "log_tail": hostile}), b"", 0)
    seen: list[tuple[int, str, str]] = []

    async def body(d: Running) -> None:
        argv = ("call", "job_run_status", "project_id=bluebird", "--socket", str(d.path))
        seen.append(await asyncio.to_thread(run, capsys, *argv))

    runner = ScriptedRunner({JOB_COMMAND: result})
    with_daemon(tmp_path, body, runner=runner, commands=commands)
    ((status, out, _),) = seen
    assert status == 0 and all(line.isprintable() for line in out.splitlines())
    assert "\\u202e" in out and "\\udb40\\udc41" in out
    assert orjson.loads(out)["data"]["log_tail"] == hostile  # the same JSON value


def test_call_list_and_approvals_find_the_socket_by_config_or_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--config FILE gives the socket_path, the environment the default; both flags: usage."""
    seen: dict[str, tuple[int, str, str]] = {}

    async def body(d: Running) -> None:
        config = tmp_path / "client.toml"
        config.write_text(f'[server]\nsocket_path = "{d.path}"\n')
        for name, argv in {
            "list": ("list", "--config", str(config)),
            "call": ("call", "job_run_status", "project_id=bluebird", "--config", str(config)),
            "approvals": ("approvals", "list", "--config", str(config)),
        }.items():
            seen[name] = await asyncio.to_thread(run, capsys, *argv)
        monkeypatch.setenv("SSHADAPTER_SERVER__SOCKET_PATH", str(d.path))
        seen["environment"] = await asyncio.to_thread(run, capsys, "list")

    runner = ScriptedRunner({JOB_COMMAND: RunResult(orjson.dumps(JOB_OUT), b"", 0)})
    with_daemon(tmp_path, body, runner=runner, approvals=ApprovalsSection(uids=(os.getuid(),)))
    tools = {tool["name"] for tool in orjson.loads(seen["list"][1])["tools"]}
    assert seen["list"][0] == 0 and "job_run_status" in tools
    assert seen["environment"] == seen["list"]
    status, out, _ = seen["call"]
    assert status == 0 and orjson.loads(out)["outcome"] == "success"
    assert seen["approvals"] == (0, "no call waits for approval\n", "")
    with pytest.raises(SystemExit) as usage:
        main(["list", "--socket", "a.sock", "--config", "b.toml"])
    assert usage.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [("check",), ("schema", TOOL), ("inventory",), ("grants", "explain", "0", TOOL, "ci")],
)
def test_every_command_refuses_an_approval_without_an_approver_as_serve_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: tuple[str, ...]
) -> None:
    """The command line loads as the daemon: no approver is one line naming file and key."""
    commands = approval_commands(tmp_path)
    config = tmp_path / "config.toml"
    host = f'address = "127.0.0.1"\nuser = "nobody"\nknown_hosts = "{tmp_path / "known_hosts"}"\n'
    config.write_text(
        f'[paths]\ncommands = "{commands}"\nschemas = "{ROOT / "schemas"}"\n'
        f"[hosts.ci]\n{host}[hosts.local]\n{host}"
    )
    status = main([*command, "--config", str(config)])
    out, err = capsys.readouterr()
    assert (status, out) == (2, "")
    assert (
        err == f"sshadapter: {commands / 'job_rerun.toml'}: approval.required: no approver: "
        "[approvals] names no uid and no group\n"
    )
