"""The inventory: host defaults, labels, groups resolved at load, and one-line load errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sshadapter.config import load_config
from sshadapter.errors import ConfigError
from sshadapter.inventory.fleet import host_set_digest, load_inventory

ROOT = Path(__file__).resolve().parents[2]

HEAD = f"""
[paths]
commands = "{ROOT / "commands"}"
schemas = "{ROOT / "schemas"}"
inventory = "inventory.d"

[host_defaults]
user = "sshadapter"
known_hosts = "/etc/ssh/ssh_known_hosts"
labels = {{ dc = "fra1" }}

[hosts.local]
address = "127.0.0.1"

[hosts.ci]
address = "ci.example"
"""

WEB = """
[host_defaults]
labels = { role = "web" }
port = 2222

[hosts.web1]
address = "10.0.0.1"
labels = { env = "prod" }

[hosts.web2]
address = "10.0.0.2"
port = 22

[groups.web]
match = { role = "web" }

[groups.prod]
match = { env = "prod" }
members = ["local"]
"""


def write(tmp_path: Path, head: str = HEAD, **files: str) -> Path:
    config = tmp_path / "config.toml"
    config.write_text(head)
    directory = tmp_path / "inventory.d"
    directory.mkdir(exist_ok=True)
    for name, text in {"web": WEB, **files}.items():
        (directory / f"{name}.toml").write_text(text)
    return config


def load_error(tmp_path: Path, head: str = HEAD, **files: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        config, _ = load_config(write(tmp_path, head, **files))
        load_inventory(config)
    return caught.value


def test_hosts_inherit_defaults_and_merge_labels(tmp_path: Path) -> None:
    """A host takes each default key it does not set; a file's defaults win over the config's."""
    config, _ = load_config(write(tmp_path))
    web1, web2, ci = config.hosts["web1"], config.hosts["web2"], config.hosts["ci"]
    assert (web1.user, web1.port, web2.port, ci.port) == ("sshadapter", 2222, 22, 22)
    assert web1.labels == {"dc": "fra1", "role": "web", "env": "prod"}
    assert ci.labels == {"dc": "fra1"}
    assert config.origins["web1"].endswith("web.toml") and config.origins["ci"].endswith(
        "config.toml"
    )


def test_groups_resolve_to_sorted_closed_sets(tmp_path: Path) -> None:
    """`match` selects by label equality, `members` adds, the result is sorted and digested."""
    inventory = load_inventory(load_config(write(tmp_path))[0])
    assert inventory.groups == {
        "all": ("ci", "local", "web1", "web2"),
        "web": ("web1", "web2"),
        "prod": ("local", "web1"),
    }
    assert inventory.members("ci") == ("ci",) and inventory.members("nosuch") == ()
    assert inventory.digest("prod") == host_set_digest(("local", "web1"))


def test_groups_of_groups_and_exclude(tmp_path: Path) -> None:
    """A group may name groups; `exclude` (an alias or a group) is taken away last."""
    extra = '[groups.most]\nmembers = ["web", "ci"]\nexclude = ["prod"]\n'
    inventory = load_inventory(load_config(write(tmp_path, more=extra))[0])
    assert inventory.groups["most"] == ("ci", "web2")


def test_all_is_every_host_jump_hosts_included_and_a_group_may_name_it(tmp_path: Path) -> None:
    """`all` is implicit: every alias, a jump host too; `members = ["all"]` with `exclude` works."""
    extra = (
        '[hosts.bastion]\naddress = "10.0.0.9"\n'
        '[hosts.web3]\naddress = "10.0.0.3"\nvia = "bastion"\n'
        '[groups.rest]\nmembers = ["all"]\nexclude = ["web", "bastion"]\n'
    )
    inventory = load_inventory(load_config(write(tmp_path, more=extra))[0])
    assert inventory.members("all") == ("bastion", "ci", "local", "web1", "web2", "web3")
    assert inventory.is_group("all")
    assert inventory.groups["rest"] == ("ci", "local", "web3")


@pytest.mark.parametrize(
    ("more", "key", "reason"),
    [
        (
            '[groups.bad]\nmembers = ["nosuch"]\n',
            "groups.bad.members",
            "no host alias and no group",
        ),
        ('[groups.bad]\nmatch = { role = "db" }\n', "groups.bad", "empty group"),
        ('[groups.bad]\nmembers = ["web1"]\nexclude = ["web"]\n', "groups.bad", "empty group"),
        (
            '[groups.a]\nmembers = ["b"]\n[groups.b]\nmembers = ["a"]\n',
            "groups.a",
            "cycle: a -> b -> a",
        ),
        ('[hosts.web1]\naddress = "10.9.9.9"\n', "hosts.web1", "already defined in"),
        ('[groups.ci]\nmembers = ["web1"]\n', "groups.ci", "already defined in"),
        ('[hosts.db1]\naddress = "x"\nlabels = { Role = "db" }\n', "hosts.db1.labels.Role", ""),
        ('[hosts.db1]\naddress = "x"\nbogus = 1\n', "hosts.db1.bogus", "unknown key"),
        ('[groups.all]\nmembers = ["web1"]\n', "groups.all", "implicit group of every host"),
        ('[hosts.all]\naddress = "10.0.0.8"\n', "hosts.all", "implicit group of every host"),
        ("[groups.bad]\nmatch = {}\n", "groups.bad.match", "name the group 'all'"),
        (
            '[groups.bad]\nmatch = {}\nmembers = ["web1"]\n',
            "groups.bad.match",
            "an empty match selects nothing",
        ),
    ],
)
def test_load_errors_name_file_key_and_reason(
    tmp_path: Path, more: str, key: str, reason: str
) -> None:
    """Each bad inventory is one error naming the file that defined it, the key and why."""
    error = load_error(tmp_path, more=more)
    assert error.file.endswith(("more.toml", "web.toml")), error
    assert error.key.startswith(key), error
    assert reason in error.reason, error
    assert "\n" not in str(error)


@pytest.mark.parametrize(("levels", "refused"), [(16, False), (17, True)])
def test_group_nesting_is_measured_whole_whichever_group_resolves_first(
    tmp_path: Path, levels: int, refused: bool
) -> None:
    """A chain named so its deepest groups load first is held to the same 16 levels."""
    chain = "".join(
        f'[groups.g{n:02d}]\nmembers = ["{f"g{n - 1:02d}" if n else "web1"}"]\n'
        for n in range(levels)
    )
    if refused:
        error = load_error(tmp_path, more=chain)
        assert "nested deeper than 16 groups" in error.reason, error
    else:
        inventory = load_inventory(load_config(write(tmp_path, more=chain))[0])
        assert inventory.groups[f"g{levels - 1:02d}"] == ("web1",)


def test_a_bad_default_is_named_at_host_defaults(tmp_path: Path) -> None:
    """A wrong value in [host_defaults] is reported there, not at every host."""
    error = load_error(tmp_path, HEAD.replace("user = ", "port = 0\nuser = "))
    assert error.file.endswith("config.toml") and error.key == "host_defaults.port"


def test_cli_inventory_shows_a_groups_members_and_digest(tmp_path: Path) -> None:
    """`sshadapter inventory show GROUP` prints the resolved hosts and the audit's digest."""
    config = write(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sshadapter.cli",
            "inventory",
            "show",
            "prod",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.splitlines() == [
        "local",
        "web1",
        f"# 2 host(s), {host_set_digest(('local', 'web1'))}",
    ]


def test_cli_grants_explain_says_why(tmp_path: Path) -> None:
    """`sshadapter grants explain` gives the decision and the grant behind it."""
    head = HEAD + f'[[grants]]\nuids = [{os.getuid()}]\ntools = ["*"]\ntargets = ["local"]\n'
    config = write(tmp_path, head)
    explain = ["grants", "explain", str(os.getuid()), "disk_usage", "local"]
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", *explain, "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "grants[0] gives local" in done.stdout and "decision: ALLOW" in done.stdout


def test_a_grant_naming_an_unknown_target_is_a_load_error(tmp_path: Path) -> None:
    """`check` refuses a grant whose target is no alias or group, naming the grant."""
    head = HEAD + '[[grants]]\nuids = [0]\ntools = ["*"]\ntargets = ["nosuch"]\n'
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "check", "--config", str(write(tmp_path, head))],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "grants[0].targets: 'nosuch' is no host alias and no group" in done.stderr


def test_check_warns_of_two_aliases_for_one_address(tmp_path: Path) -> None:
    """Two aliases with one address and port: `check` says so (a warning, not an error)."""
    more = '[hosts.web9]\naddress = "10.0.0.1"\nport = 2222\n'
    inventory = load_inventory(load_config(write(tmp_path, more=more))[0])
    (warning,) = inventory.warnings()
    assert "hosts.web9: same address and port as 'web1' (10.0.0.1:2222)" in warning
