"""The catalog switched on: `[catalog]` families through the one registry, their overrides
and errors, `check`, `policy` and `sudoers` over them, docs/catalog.md as generated, and
the actions behind a person, through the real socket."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Final

import pytest
from daemon_harness import Running, with_daemon
from sshd import login_account
from test_approvals import APPROVER, ask_as, pending
from test_cli import run_cli
from test_root_operations import require_sudo, sudoers_cli

from sshadapter.catalog import CATALOG_DIR, catalog_operation_files
from sshadapter.check.catalog_doc import PROVEN_PREFIX, markdown
from sshadapter.config import ApprovalsSection, GroupSection, load_config
from sshadapter.contract.commandfile import parse_command_file, read_command_bytes
from sshadapter.daemon.server import load
from sshadapter.runners.interface import RunResult
from sshadapter.runners.scripted import ScriptedRunner
from sshadapter.sections import CATALOG_FAMILIES, ActionsFamily, CatalogSection

ROOT: Final = Path(__file__).resolve().parents[2]
UNITS: Final = ("nginx.service", "php8.2-fpm.service")
# Every family on, with the keys the actions and cert_expiry need.
ALL_ON: Final = f"""
[catalog]
families = ["all", "actions"]

[catalog.maintenance]
certificate_paths = ["/etc/ssl/certs/ISRG_Root_X1.pem"]

[catalog.actions]
targets = ["web"]
units = {json.dumps(list(UNITS))}
"""
RESTART: Final = "/usr/bin/sudo -n -u root -- /usr/bin/systemctl restart nginx.service"


def write_config(tmp_path: Path, catalog: str, *, user: str = "sshadapter") -> Path:
    """A configuration with host `local` (a dispatch host), group `web` of it, an approver,
    an empty commands/ and ``catalog`` (TOML)."""
    for name in ("commands", "schemas"):
        (tmp_path / name).mkdir(exist_ok=True)
    (tmp_path / "known_hosts").write_text("")
    config = tmp_path / "config.toml"
    config.write_text(
        f"""[paths]
commands = "commands"
schemas = "schemas"

[approvals]
uids = [{APPROVER}]

[hosts.local]
address = "127.0.0.1"
user = "{user}"
known_hosts = "known_hosts"
dispatch = true

[groups.web]
members = ["local"]
{catalog}"""
    )
    return config


def catalog_tools() -> set[str]:
    return {path.stem for path in catalog_operation_files()}


def test_docs_catalog_is_what_sshadapter_catalog_prints() -> None:
    """docs/catalog.md is generated from the files: regenerate it with `sshadapter catalog`."""
    done = run_cli("catalog")
    assert done.returncode == 0, done.stderr
    assert done.stdout == markdown()
    assert (ROOT / "docs" / "catalog.md").read_text() == done.stdout, (
        "docs/catalog.md is stale: sshadapter catalog > docs/catalog.md"
    )
    for tool in catalog_tools():
        assert f"\n### {tool}\n" in done.stdout


def test_check_passes_with_every_family_switched_on(tmp_path: Path) -> None:
    """`check` runs every catalog operation's fixtures and near-misses: all ok, none left out."""
    done = run_cli("check", "--json", "--config", str(write_config(tmp_path, ALL_ON)))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr
    rows = json.loads(done.stdout)
    assert all(row["ok"] for row in rows)
    assert {row["tool"] for row in rows} == catalog_tools()
    kinds = {(row["tool"], row["kind"]) for row in rows}
    for tool in catalog_tools():
        assert (tool, "banner") in kinds, f"{tool}: no accepted fixture"


def test_policy_and_sudoers_carry_the_catalog_and_its_closed_sets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The dispatch host's policy holds every catalog operation; sudoers the actions' units."""
    config = write_config(tmp_path, ALL_ON)
    done = run_cli("policy", "local", "--config", str(config))
    assert done.returncode == 0, done.stderr
    operations = json.loads(done.stdout)["operations"]
    assert set(operations) == catalog_tools()
    assert operations["restart_unit"]["params"]["unit"] == {"type": "string", "enum": list(UNITS)}
    status, out, err = sudoers_cli(config, capsys)
    assert status == 0, err
    assert "/usr/bin/systemctl ^restart (nginx[.]service|php8[.]2-fpm[.]service)$" in out


def test_the_actions_rule_passes_visudo_and_sudo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`sudoers --check` proves the actions' drop-in with this machine's visudo and sudo -l."""
    require_sudo()
    config = write_config(tmp_path, ALL_ON, user=login_account())
    status, _, err = sudoers_cli(config, capsys, "--check")
    assert status == 0, err
    assert "visudo -c: ok" in err


FAMILIES_SAID: Final = ", ".join(CATALOG_FAMILIES)


ACTIONS_ON: Final = '[catalog]\nfamilies = ["actions"]\n[catalog.actions]\n'
MAINTENANCE_ON: Final = '[catalog]\nfamilies = ["maintenance"]\n[catalog.maintenance]\n'


@pytest.mark.parametrize(
    ("catalog", "key", "phrase"),
    [
        (
            '[catalog]\nfamilies = ["sytem"]\n',
            "catalog.families",
            f"no family 'sytem'; the families are {FAMILIES_SAID}",
        ),
        (
            "[catalog.sytem]\nexclude = []\n",
            "catalog.sytem",
            f"no family 'sytem'; the families are {FAMILIES_SAID}",
        ),
        ('[catalog]\nfamilies = ["storage", "storage"]\n', "catalog.families", "listed twice"),
        (ACTIONS_ON + 'units = ["a.service"]\n', "catalog.actions.targets", "required"),
        (
            ACTIONS_ON + 'targets = ["web"]\n',
            "catalog.actions.units",
            "empty: reload_unit takes its 'unit' from this list",
        ),
        (
            ACTIONS_ON + 'targets = ["web"]\nunits = ["a b.service"]\n',
            "catalog.actions.units.0",
            "should match pattern",
        ),
        (
            '[catalog]\nfamilies = ["maintenance"]\n',
            "catalog.maintenance.certificate_paths",
            'exclude = ["cert_expiry"]',
        ),
        (
            MAINTENANCE_ON + 'exclude = ["nope"]\n',
            "catalog.maintenance.exclude",
            "maintenance has no operation 'nope'",
        ),
        (
            MAINTENANCE_ON + 'targets = ["db"]\ncertificate_paths = ["/a.pem"]\n',
            "catalog.maintenance.targets",
            "cert_expiry: 'db' is no host alias and no group",
        ),
        (
            ACTIONS_ON + 'targets = ["plain"]\nunits = ["a.service"]\n',
            "catalog.actions.targets",
            "needs a dispatch host",
        ),
    ],
)
def test_a_catalog_mistake_is_one_line_naming_the_config_key(
    tmp_path: Path, catalog: str, key: str, phrase: str
) -> None:
    """Unknown families, missing targets or closed sets, unknown names: file, key, reason."""
    config = write_config(
        tmp_path,
        '[hosts.plain]\naddress = "127.0.0.1"\nuser = "sshadapter"\n'
        f'known_hosts = "known_hosts"\n\n{catalog}',
    )
    done = run_cli("check", "--config", str(config))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"sshadapter: {config}: {key}: "), line
    assert phrase in line, line


def test_a_name_in_commands_and_in_the_catalog_names_both_files(tmp_path: Path) -> None:
    """An operator's cert_expiry.toml beside the enabled catalog's: a load error naming both."""
    config = write_config(tmp_path, ALL_ON)
    shutil.copy(ROOT / "commands" / "load_average.toml", tmp_path / "commands" / "cert_expiry.toml")
    shutil.copy(ROOT / "schemas" / "load_average.v1.json", tmp_path / "schemas")
    done = run_cli("check", "--config", str(config))
    assert done.returncode == 2
    mine, theirs = tmp_path / "commands" / "cert_expiry.toml", CATALOG_DIR / "maintenance"
    assert done.stderr == (
        f"sshadapter: {mine}: 'cert_expiry' is also the catalog's {theirs}/cert_expiry.toml\n"
    )


def test_the_config_replaces_targets_allow_and_leaves_out_what_it_excludes(
    tmp_path: Path,
) -> None:
    """[catalog.<family>] targets, allow, exclude and the closed set reach the Operation.

    The audit's command_sha256 covers the file and what the config changed."""
    config_path = write_config(
        tmp_path,
        ALL_ON.replace(
            'targets = ["web"]',
            'targets = ["web"]\nallow = { uids = [7] }\nexclude = ["reload_unit"]',
        ),
    )
    config, _ = load_config(config_path)
    registry = load(config, str(config_path)).registry
    assert "reload_unit" not in registry.operations
    restart = registry.operations["restart_unit"]
    assert restart.spec.targets == ("web",) and restart.spec.allow is not None
    assert restart.spec.allow.uids == (7,)
    assert restart.params_schema["properties"]["unit"]["enum"] == list(UNITS)
    assert restart.sha256 != hashlib.sha256(restart.file.read_bytes()).hexdigest()
    cert = registry.operations["cert_expiry"]
    assert cert.spec.targets == ("all",) and cert.spec.allow is None
    assert cert.params_schema["properties"]["path"]["enum"] == ["/etc/ssl/certs/ISRG_Root_X1.pem"]


def test_no_family_is_loaded_unless_the_config_names_it(tmp_path: Path) -> None:
    """Without [catalog], `check` sees the operator's commands only; "all" leaves actions out."""
    done = run_cli("check", "--json", "--config", str(write_config(tmp_path, "")))
    assert not {row["tool"] for row in json.loads(done.stdout)} & catalog_tools()
    assert "actions" not in CatalogSection(families=("all",)).enabled


@pytest.mark.parametrize("path", catalog_operation_files(), ids=lambda p: p.stem)
def test_each_catalog_file_keeps_the_layout(path: Path) -> None:
    """Each catalog file keeps the layout, with fixtures and a PROVENANCE.md.

    Read-only files: targets ["all"], read_only, idempotent; actions: approval, root, an
    absolute program, no fan-out; the PROVENANCE.md says where they are proven
    (docs/fixtures.md "Catalog cases")."""
    spec = parse_command_file(path, read_command_bytes(path))
    assert path.parent.name in CATALOG_FAMILIES
    if path.parent.name == "actions":
        assert spec.approval.required and spec.run_as == "root" and not spec.read_only
        assert spec.argv[0].startswith("/") and spec.fanout.enabled is False
    else:
        assert spec.targets == ("all",) and spec.read_only and spec.idempotent
        assert spec.run_as is None or spec.approval.required
    provenance = path.with_name(f"{path.stem}.fixtures") / "PROVENANCE.md"
    lines = [line for line in provenance.read_text().splitlines() if line.strip()]
    assert lines[0] == f"# Provenance: {path.stem}"
    assert re.fullmatch(rf"{PROVEN_PREFIX}[^;]+(; [^;]+)*", lines[1]), lines[1]


# The actions, through the socket: a person decides ------------------------------------


def with_actions(tmp_path: Path, socket_dir: Path, runner: ScriptedRunner, body: Any) -> None:
    (tmp_path / "commands").mkdir()
    with_daemon(
        tmp_path,
        body,
        runner=runner,
        commands=tmp_path / "commands",
        dispatch_hosts=("local",),
        groups={"web": GroupSection(members=("local",))},
        approvals=ApprovalsSection(uids=(APPROVER,)),
        catalog=CatalogSection(
            families=("actions",), actions=ActionsFamily(targets=("web",), units=UNITS)
        ),
        socket_dir=socket_dir,
        socket_mode=0o666,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="a second uid (the approver) needs root")
def test_an_action_runs_only_approved_on_one_host_for_a_listed_unit(
    tmp_path: Path, socket_dir: Path
) -> None:
    """An action runs once, approved, on one host, for a listed unit; else nothing runs.

    An unlisted unit and a group are refused at once; a listed unit waits for the person,
    who sees the exact sudo command; approved, it runs once; denied, nothing runs."""
    runner = ScriptedRunner({RESTART: RunResult(b"", b"", 0)})

    async def body(running: Running) -> None:
        def call(tool: str, **args: str) -> Any:
            return running.ask({"op": "call", "tool": tool, "args": args})

        unlisted = await call("restart_unit", unit="sshd.service", run_on="local")
        assert unlisted["error"]["code"] == "INVALID_REQUEST"
        assert unlisted["error"]["hint"] == {"parameter": "unit", "rule": "enum"}
        on_group = await call("restart_unit", unit="nginx.service", run_on="web")
        assert on_group["outcome"] == "failure"
        assert on_group["error"]["code"] == "INVALID_REQUEST"
        assert runner.calls == []

        task = asyncio.create_task(call("restart_unit", unit="nginx.service", run_on="local"))
        [entry] = await pending(running)
        assert (entry["tool"], entry["target"], entry["hosts"]) == (
            "restart_unit",
            "local",
            ["local"],
        )
        assert entry["command"] == RESTART
        decision = {"op": "approve", "request_id": entry["request_id"], "digest": entry["digest"]}
        await ask_as(APPROVER, running, decision)
        done = await task
        assert (done["outcome"], done["data"]["succeeded"]) == ("success", 1)
        assert done["data"]["results"] == [
            {"host": "local", "outcome": "success", "data": {"rows": []}}
        ]
        assert runner.calls == [RESTART]

        task = asyncio.create_task(call("reset_failed_unit", unit="nginx.service", run_on="local"))
        [entry] = await pending(running)
        await ask_as(APPROVER, running, {"op": "deny", "request_id": entry["request_id"]})
        denied = await task
        assert denied["error"]["code"] == "DENIED"
        assert runner.calls == [RESTART]

    with_actions(tmp_path, socket_dir, runner, body)
