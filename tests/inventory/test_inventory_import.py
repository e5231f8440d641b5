"""`sshadapter inventory import`: Ansible JSON and ssh -G in, a reviewed inventory file out."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import asyncssh
import pytest
from test_inventory import write

from sshadapter.cli import main
from sshadapter.config import load_config
from sshadapter.inventory.fleet import load_inventory, via_chain
from sshadapter.shown import shown

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_INVENTORY = Path.home() / ".cache/sshadapter-bench/ansible-venv/bin/ansible-inventory"

# What `ansible-inventory -i hosts.ini --list --export` prints (ansible-core 2.x) for an INI
# with a child group, group vars, a host named by its FQDN and one left ungrouped.
EXPORT: dict[str, Any] = {
    "_meta": {
        "hostvars": {
            "db1": {"ansible_host": "10.0.1.1", "ansible_user": "postgres", "role": "db"},
            "db2": {"ansible_host": "10.0.1.2", "role": "db"},
            "lone": {"ansible_host": "192.0.2.50"},
            "web1.example.com": {"ansible_host": "10.0.0.1", "env": "prod", "role": "web"},
            "web2": {"ansible_host": "10.0.0.2", "ansible_port": 2222, "role": "Web"},
            "web3": {"ansible_host": "10.0.0.3"},
        },
        "profile": "inventory_legacy",
    },
    "all": {"children": ["ungrouped", "prod"], "vars": {"ansible_user": "ops"}},
    "db": {"hosts": ["db1", "db2"]},
    "prod": {"children": ["web", "db"]},
    "ungrouped": {"hosts": ["lone"]},
    "web": {"children": ["web_eu"], "hosts": ["web1.example.com", "web2"], "vars": {}},
    "web_eu": {"hosts": ["web3"], "vars": {"ansible_user": "deploy", "env": "prod"}},
}


def public_key() -> str:
    key = asyncssh.generate_private_key("ssh-ed25519")
    return key.export_public_key().decode().strip()


def known_hosts(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def run(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def import_ansible(
    tmp_path: Path, document: Any, pins: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, str, Path]:
    source = tmp_path / "inventory.json"
    source.write_text(json.dumps(document, indent=4))
    directory = tmp_path / "inventory.d"
    directory.mkdir(exist_ok=True)
    target = directory / "imported.toml"
    argv = ["inventory", "import", "ansible", str(source), "--known-hosts", str(pins)]
    status, _, err = run(*argv, "--write", str(target), *extra, capsys=capsys)
    return status, err, target


def import_ssh_config(
    tmp_path: Path, text: str, pins: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, str, str, Path]:
    """`inventory import ssh-config ARGV` with ``text`` as its --ssh-config file."""
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text(text)
    (tmp_path / "inventory.d").mkdir(exist_ok=True)
    target = tmp_path / "inventory.d" / "ssh.toml"
    options = ["--ssh-config", str(ssh_config), "--known-hosts", str(pins), "--write", str(target)]
    status, out, err = run("inventory", "import", "ssh-config", *argv, *options, capsys=capsys)
    return status, out, err, target


def test_ansible_groups_children_and_hostvars_become_hosts_and_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hosts keep address, port, user (group vars applied) and labels; children become members."""
    key = public_key()
    pins = known_hosts(
        tmp_path,
        f"10.0.0.1,10.0.0.3,10.0.1.1,10.0.1.2,192.0.2.50 {key}",
        f"[10.0.0.2]:2222 {key}",
    )
    status, err, target = import_ansible(tmp_path, EXPORT, pins, capsys, "--labels", "role,env")
    assert (status, err) == (0, "")
    written = tomllib.loads(target.read_text())
    assert written["host_defaults"] == {"known_hosts": str(pins)}
    assert written["hosts"] == {
        "db1": {"address": "10.0.1.1", "user": "postgres", "labels": {"role": "db"}},
        "db2": {"address": "10.0.1.2", "user": "ops", "labels": {"role": "db"}},
        "lone": {"address": "192.0.2.50", "user": "ops"},
        "web1-example-com": {
            "address": "10.0.0.1",
            "user": "ops",
            "labels": {"env": "prod", "role": "web"},
        },
        "web2": {"address": "10.0.0.2", "port": 2222, "user": "ops", "labels": {"role": "web"}},
        "web3": {"address": "10.0.0.3", "user": "deploy", "labels": {"env": "prod"}},
    }
    assert written["groups"] == {
        "db": {"members": ["db1", "db2"]},
        "prod": {"members": ["db", "web"]},
        "web": {"members": ["web1-example-com", "web2", "web_eu"]},
        "web_eu": {"members": ["web3"]},
    }
    assert '# "web1.example.com" in the source\n[hosts.web1-example-com]' in target.read_text()


def test_the_written_file_round_trips_through_load_config_and_load_inventory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The project's own loader reads the file back: hosts, defaults and resolved groups."""
    pins = known_hosts(tmp_path, f"10.0.0.*,10.0.1.*,192.0.2.50 {public_key()}")
    status, _, _ = import_ansible(tmp_path, EXPORT, pins, capsys, "--labels", "role")
    assert status == 0
    config_path = tmp_path / "config.toml"
    config_path.write_text(
        f'[paths]\ncommands = "{ROOT / "commands"}"\nschemas = "{ROOT / "schemas"}"\n'
        'inventory = "inventory.d"\n\n[host_defaults]\nuser = "fallback"\n'
    )
    config, _ = load_config(config_path)
    inventory = load_inventory(config)
    assert sorted(inventory.hosts) == ["db1", "db2", "lone", "web1-example-com", "web2", "web3"]
    web2, db2, lone = inventory.hosts["web2"], inventory.hosts["db2"], inventory.hosts["lone"]
    assert (web2.port, web2.user, web2.known_hosts, web2.labels) == (
        2222,
        "ops",
        pins,
        {"role": "web"},
    )
    assert (db2.user, lone.user) == ("ops", "ops")  # the `all` group's ansible_user
    assert inventory.members("prod") == tuple(sorted(inventory.hosts.keys() - {"lone"}))
    assert inventory.members("web") == ("web1-example-com", "web2", "web3")


def test_hosts_without_a_pinned_key_are_left_out_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No key line, a revoked key, a key for another port: left out, one stderr line each."""
    key = public_key()
    pins = known_hosts(
        tmp_path,
        f"10.0.0.1,10.0.0.3,10.0.1.1,10.0.1.2 {key}",
        f"[10.0.0.2]:22 {key}",  # web2 listens on 2222
        f"@revoked 192.0.2.50 {key}",
    )
    status, err, target = import_ansible(tmp_path, EXPORT, pins, capsys)
    assert status == 1
    assert err.splitlines() == [
        f"sshadapter: left out: host lone: no key pinned for 192.0.2.50 in {pins} "
        "(import never fetches keys)",
        f"sshadapter: left out: host web2: no key pinned for [10.0.0.2]:2222 in {pins} "
        "(import never fetches keys)",
    ]
    assert set(tomllib.loads(target.read_text())["hosts"]) == {
        "db1",
        "db2",
        "web1-example-com",
        "web3",
    }


def test_a_cert_authority_line_pins_a_range_and_empty_groups_are_not_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One @cert-authority line for 10.0.1.* pins the db hosts; groups left empty are reported."""
    pins = known_hosts(tmp_path, f"@cert-authority 10.0.1.* {public_key()}")
    status, err, target = import_ansible(tmp_path, EXPORT, pins, capsys)
    written = tomllib.loads(target.read_text())
    assert status == 1
    assert set(written["hosts"]) == {"db1", "db2"}
    assert written["groups"] == {"db": {"members": ["db1", "db2"]}, "prod": {"members": ["db"]}}
    for group in ("web", "web_eu"):
        assert f"left out: group {group}: no imported host (an empty group is refused)" in err


def test_names_that_collide_or_cannot_be_targets_are_reported_never_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """'Web1', 'web1' and a group 'WEB1' all become 'web1': none is imported; an IP is no name."""
    document = {
        "_meta": {
            "hostvars": {
                "Web1": {"ansible_host": "10.0.0.1"},
                "web1": {"ansible_host": "10.0.0.2"},
                "10.0.0.3": {},
                "web4": {"ansible_host": "10.0.0.4"},
            }
        },
        "all": {"children": ["ungrouped", "WEB1", "fleet"]},
        "WEB1": {"hosts": ["web4"]},
        "fleet": {"hosts": ["Web1", "web1", "10.0.0.3", "web4"]},
    }
    pins = known_hosts(tmp_path, f"10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4 {public_key()}")
    status, err, target = import_ansible(tmp_path, document, pins, capsys)
    assert status == 1
    assert "left out: 'Web1', 'web1', 'WEB1': all become 'web1': none imported" in err
    assert "left out: 10.0.0.3: '10-0-0-3' is no target name" in err
    written = tomllib.loads(target.read_text())
    assert written["hosts"] == {"web4": {"address": "10.0.0.4"}}
    assert written["groups"] == {"fleet": {"members": ["web4"]}}


def test_label_values_that_are_not_words_and_unreachable_hosts_are_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A label that is no word is dropped and named; non-SSH, jump-host, odd addresses: left out."""
    document = {
        "_meta": {
            "hostvars": {
                "a1": {"ansible_host": "10.0.0.1", "rack": 12, "tier": "Front End"},
                "a2": {"ansible_host": "10.0.0.2", "ansible_connection": "winrm"},
                "a3": {"ansible_host": "10.0.0.3", "ansible_ssh_common_args": "-J bastion"},
                "a4": {"ansible_host": "10.0.0.4", "ansible_user": "Bad User"},
                "a5": {"ansible_host": "10.0.0.5 -oProxyCommand=x"},
                "a6": {"ansible_host": "{{ lookup('env', 'A6') }}"},
            }
        },
        "all": {"children": ["ungrouped"]},
        "ungrouped": {"hosts": ["a1", "a2", "a3", "a4", "a5", "a6"]},
    }
    pins = known_hosts(tmp_path, f"10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4 {public_key()}")
    status, err, target = import_ansible(tmp_path, document, pins, capsys, "--labels", "rack,tier")
    assert status == 1
    assert "left out: label of host a1: rack = 12 is not a label word" in err
    assert "left out: host a2: ansible_connection is 'winrm', not SSH" in err
    assert "left out: host a3: ansible_ssh_common_args is set" in err
    assert "left out: host a4: user: String should match pattern" in err
    assert "left out: host a5: address '10.0.0.5 -oProxyCommand=x' is no host name" in err
    assert "left out: host a6: address \"{{ lookup('env', 'A6') }}\" is an Ansible template" in err
    written = tomllib.loads(target.read_text())
    assert written["hosts"] == {"a1": {"address": "10.0.0.1", "labels": {"tier": "front-end"}}}


def test_ssh_g_resolves_aliases_and_a_proxyjump_host_is_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """OpenSSH's own answer (Host, Match, Port, User, -l); a jump host not imported: out."""
    text = (
        "Host web-a\n  HostName 10.0.0.1\n  Port 2222\n\n"
        "Host inner\n  HostName 10.0.0.9\n  ProxyJump bastion\n\n"
        "Match host db-*\n  HostName 10.0.1.1\n  User postgres\n\n"
        "Host *\n  User fleet\n"
    )
    pins = known_hosts(tmp_path, f"[10.0.0.1]:2222,10.0.1.1,10.0.0.9 {public_key()}")
    status, out, err, target = import_ssh_config(
        tmp_path, text, pins, capsys, "web-a", "db-main", "inner"
    )
    assert status == 1
    assert err == (
        "sshadapter: left out: host inner: proxyjump bastion (mapped to via only when it is "
        "one other alias imported in the same run: add it to the aliases)\n"
    )
    assert out == f"wrote {target}: 2 host(s), 0 group(s), 1 left out\n"
    assert tomllib.loads(target.read_text())["hosts"] == {
        "db-main": {"address": "10.0.1.1", "user": "postgres"},
        "web-a": {"address": "10.0.0.1", "port": 2222, "user": "fleet"},
    }
    status, _, _, _ = import_ssh_config(
        tmp_path, text, pins, capsys, "web-a", "db-main", "--user", "ops", "--force"
    )
    written = tomllib.loads(target.read_text())
    assert status == 0
    assert written["host_defaults"]["user"] == "ops"
    assert written["hosts"]["db-main"] == {"address": "10.0.1.1"}  # -l wins over User


def test_a_proxyjump_to_an_imported_alias_becomes_via(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ProxyJump ALIAS, ALIAS imported too: via; user@host:port, a cycle, an unpinned jump: out."""
    text = (
        "Host bastion\n  HostName 10.0.0.8\n  ProxyJump none\n\n"
        "Host inner\n  HostName 10.0.0.9\n  ProxyJump bastion\n\n"
        "Host deeper\n  HostName 10.0.0.10\n  ProxyJump inner\n\n"
        "Host odd\n  HostName 10.0.0.11\n  ProxyJump jump@10.0.0.8:22\n\n"
        "Host loop-a\n  HostName 10.0.0.12\n  ProxyJump loop-b\n\n"
        "Host loop-b\n  HostName 10.0.0.13\n  ProxyJump loop-a\n\n"
        "Host behind-unpinned\n  HostName 10.0.0.14\n  ProxyJump unpinned\n\n"
        "Host unpinned\n  HostName 10.9.9.9\n\n"
        "Host *\n  User fleet\n"
    )
    pins = known_hosts(tmp_path, f"10.0.0.* {public_key()}")
    aliases = ["bastion", "inner", "deeper", "odd", "loop-a", "loop-b", "behind-unpinned"]
    status, _, err, target = import_ssh_config(tmp_path, text, pins, capsys, *aliases, "unpinned")
    assert status == 1
    assert "host odd: proxyjump jump@[10.0.0.8]:22 (mapped to via only when" in err
    assert "host loop-a: jump hosts in a cycle: loop-a -> loop-b\n" in err
    assert "host loop-b: jump hosts in a cycle: loop-b -> loop-a\n" in err
    assert "host behind-unpinned: its jump host unpinned is not imported" in err
    hosts = tomllib.loads(target.read_text())["hosts"]
    assert sorted(hosts) == ["bastion", "deeper", "inner"]
    assert (hosts["inner"]["via"], hosts["deeper"]["via"]) == ("bastion", "inner")
    assert "via" not in hosts["bastion"]
    loaded = tmp_path / "loaded"
    loaded.mkdir()
    config, _ = load_config(write(loaded, more=target.read_text()))
    assert via_chain("deeper", load_inventory(config).hosts) == ("inner", "bastion")


def test_an_existing_file_is_kept_and_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, file, key and reason: an existing file without --force, bad JSON, bad ssh_config."""
    pins = known_hosts(tmp_path, f"10.0.0.* {public_key()}")
    target = tmp_path / "inventory.d" / "imported.toml"
    target.parent.mkdir()
    target.write_text("# mine\n")
    status, err, _ = import_ansible(tmp_path, EXPORT, pins, capsys)
    assert (status, err) == (
        2,
        f"sshadapter: {target}: --write: exists (give --force to replace it)\n",
    )
    assert target.read_text() == "# mine\n"
    assert list(target.parent.iterdir()) == [target]  # no temporary file left behind
    status, err, _ = import_ansible(tmp_path, {"web": {"hosts": "web1"}}, pins, capsys, "--force")
    assert (status, err) == (
        2,
        f"sshadapter: {tmp_path / 'inventory.json'}: web.hosts: expected a list of names, "
        "found str\n",
    )
    missing = tmp_path / "absent_config"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "sshadapter.cli", "inventory", "import", "ssh-config", "web"),
            *("--ssh-config", str(missing), "--known-hosts", str(pins)),
            *("--write", str(target), "--force"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"sshadapter: {missing}: web: ssh -G exited 255: ")
    assert len(done.stderr.splitlines()) == 1


def test_the_inventory_is_never_written_through_a_link_or_into_a_shared_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A shared directory: one line, none written; --force replaces a planted link, not its file."""
    pins = known_hosts(tmp_path, f"10.0.*,192.0.2.50 {public_key()}")
    directory = tmp_path / "inventory.d"
    directory.mkdir()
    directory.chmod(0o777)
    status, err, target = import_ansible(tmp_path, EXPORT, pins, capsys)
    assert status == 2 and err.count("\n") == 1
    assert err.startswith(f"sshadapter: {directory}: --write: directory mode 0777 lets ")
    assert list(directory.iterdir()) == []
    directory.chmod(0o755)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    target.symlink_to(secret)
    status, err, _ = import_ansible(tmp_path, EXPORT, pins, capsys)
    assert (status, err) == (
        2,
        f"sshadapter: {target}: --write: exists (give --force to replace it)\n",
    )
    status, _, _ = import_ansible(tmp_path, EXPORT, pins, capsys, "--force")
    assert status == 0 and not target.is_symlink() and target.stat().st_mode & 0o777 == 0o644
    assert "db1" in tomllib.loads(target.read_text())["hosts"]
    assert secret.read_text() == "root only\n"
    assert sorted(directory.iterdir()) == [target]  # no temporary file left behind


def test_hostile_source_names_reach_the_report_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ESC, BEL, U+202E and a newline in source names: every report line one escaped line."""
    forged = "\x1b[2J\x07\u202eweb\nCRITICAL sshadapter: approved"
    document = {
        "_meta": {"hostvars": {forged: {"ansible_host": "10.0.0.1"}, "ok": {}}},
        "all": {"children": ["ungrouped", "fleet\x07"]},
        "ungrouped": {"hosts": [forged]},
        "fleet\x07": {"hosts": ["ok"]},
    }
    pins = known_hosts(tmp_path, f"10.0.0.1 {public_key()}")
    status, err, _ = import_ansible(tmp_path, document, pins, capsys)
    assert (status, err.splitlines()) == (
        1,
        [
            "sshadapter: left out: \\x1b[2J\\x07\\u202eweb\\nCRITICAL sshadapter: approved: "
            "'--2j--web-critical-sshadapter--approved' is no target name (^[a-z][a-z0-9_-]{0,62}$; "
            "name it in the source, e.g. an Ansible alias with ansible_host)",
            "sshadapter: left out: host ok: no key pinned for ok in "
            f"{pins} (import never fetches keys)",
            "sshadapter: left out: group fleet\\x07: no imported host (an empty group is refused)",
            f"sshadapter: no host imported: {tmp_path / 'inventory.d' / 'imported.toml'} "
            "not written",
        ],
    )


def test_a_value_of_the_wrong_type_is_one_line_naming_file_key_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A newline-named group's non-list hosts, a list as connection, "²" as port: one line each."""
    pins = known_hosts(tmp_path, f"10.0.0.1 {public_key()}")
    status, err, _ = import_ansible(tmp_path, {"web\nCRITICAL x": {"hosts": 5}}, pins, capsys)
    assert (status, err) == (
        2,
        f"sshadapter: {tmp_path / 'inventory.json'}: web\\nCRITICAL x.hosts: "
        "expected a list of names, found int\n",
    )
    document = {
        "_meta": {
            "hostvars": {
                "a1": {"ansible_host": "10.0.0.1", "ansible_connection": []},
                "a2": {"ansible_host": "10.0.0.1", "ansible_port": "\u00b2"},
            }
        },
        "all": {"children": ["ungrouped"]},
        "ungrouped": {"hosts": ["a1", "a2"]},
    }
    status, err, _ = import_ansible(tmp_path, document, pins, capsys)
    assert (status, err) == (
        1,
        "sshadapter: left out: host a1: ansible_connection is [], not SSH\n"
        "sshadapter: left out: host a2: ansible_port is not a number: '\u00b2'\n"
        "sshadapter: no host imported: "
        f"{tmp_path / 'inventory.d' / 'imported.toml'} not written\n",
    )


@pytest.mark.parametrize("levels", [16, 17, 20, 1000])
def test_a_chain_of_groups_of_any_depth_imports_into_a_file_the_daemon_loads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], levels: int
) -> None:
    """g0 > g1 > ... > gN-1 > a host: groups too deep for the daemon are flattened, said once."""
    document: dict[str, Any] = {
        "_meta": {"hostvars": {"h1": {"ansible_host": "10.0.0.1"}}},
        "all": {"children": ["g0"]},
        f"g{levels - 1}": {"hosts": ["h1"]},
    }
    for level in range(levels - 1):
        document[f"g{level}"] = {"children": [f"g{level + 1}"]}
    pins = known_hosts(tmp_path, f"10.0.0.1 {public_key()}")
    status, err, target = import_ansible(tmp_path, document, pins, capsys, "--user", "ops")
    flattened = [f"g{level}" for level in range(levels - 17, -1, -16)]
    assert status == 0
    if flattened:
        assert err == (
            f"sshadapter: note: {len(flattened)} group(s) with more than 16 levels of groups "
            "below them written with their hosts as members (flattened: same hosts): "
            f"{shown(', '.join(flattened))}\n"
        )
    else:
        assert err == ""
    loaded = tmp_path / "loaded"
    loaded.mkdir()
    inventory = load_inventory(load_config(write(loaded, more=target.read_text()))[0])
    assert all(inventory.members(f"g{level}") == ("h1",) for level in range(levels))


def test_ssh_config_without_a_user_line_writes_no_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host no User line matches gets no user (not ssh -G's local account); one that does, it."""
    me = pwd.getpwuid(os.getuid()).pw_name
    text = (
        "Host web-a\n  HostName 10.0.0.1\n\nHost db-a\n  HostName 10.0.0.2\n  User postgres\n\n"
        f"Host mine\n  HostName 10.0.0.3\n  User {me}\n"
    )
    pins = known_hosts(tmp_path, f"10.0.0.1,10.0.0.2,10.0.0.3 {public_key()}")
    aliases = ("web-a", "db-a", "mine")
    status, _, err, target = import_ssh_config(tmp_path, text, pins, capsys, *aliases)
    assert (status, err) == (
        0,
        "sshadapter: note: 1 host(s) without a user take the configuration's "
        "[host_defaults] user\n",
    )
    assert tomllib.loads(target.read_text())["hosts"] == {
        "db-a": {"address": "10.0.0.2", "user": "postgres"},
        "mine": {"address": "10.0.0.3", "user": me},  # stated, though ssh -G's default too
        "web-a": {"address": "10.0.0.1"},
    }


def test_the_command_line_user_wins_over_ansible_user(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--user is every host's user, as with ssh-config's -l: no ansible_user is written."""
    pins = known_hosts(tmp_path, f"10.0.0.*,10.0.1.*,192.0.2.50 {public_key()}")
    status, _, target = import_ansible(tmp_path, EXPORT, pins, capsys, "--user", "ops")
    written = tomllib.loads(target.read_text())
    assert status == 0 and written["host_defaults"]["user"] == "ops"
    assert [alias for alias, host in written["hosts"].items() if "user" in host] == []


@pytest.mark.skipif(not ANSIBLE_INVENTORY.exists(), reason="ansible-inventory is not cached here")
def test_real_ansible_inventory_output_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ansible-inventory's own --list JSON of an INI file imports like the hand-written one."""
    ini = tmp_path / "hosts.ini"
    ini.write_text(
        "lone ansible_host=192.0.2.50\n\n[web]\nweb1.example.com ansible_host=10.0.0.1\n"
        "web2 ansible_host=10.0.0.2 ansible_port=2222\n\n[web:vars]\nansible_user=deploy\n"
    )
    done = subprocess.run(
        [str(ANSIBLE_INVENTORY), "-i", str(ini), "--list"],
        capture_output=True,
        check=True,
        cwd=tmp_path,
        env={"PATH": f"{ANSIBLE_INVENTORY.parent}:/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    pins = known_hosts(tmp_path, f"10.0.0.1,[10.0.0.2]:2222,192.0.2.50 {public_key()}")
    status, err, target = import_ansible(tmp_path, json.loads(done.stdout), pins, capsys)
    written = tomllib.loads(target.read_text())
    assert written["hosts"]["web2"] == {"address": "10.0.0.2", "port": 2222, "user": "deploy"}
    assert written["groups"] == {"web": {"members": ["web1-example-com", "web2"]}}
    assert status == 0 and "left out" not in err
