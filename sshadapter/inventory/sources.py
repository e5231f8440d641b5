"""The sources of `sshadapter inventory import`: what hosts and groups they describe.

Reference: docs/operations.md "Import". Neither source says which key a host
has; ``importer`` decides what is written.

- ``ansible``: the JSON of ``ansible-inventory --list`` (with or without
  ``--export``): groups with ``hosts`` and ``children``, ``vars`` (export) and
  ``_meta.hostvars``. Group variables apply the way Ansible applies them
  (parents before children, then ``ansible_group_priority``, then the name;
  the host's own last). ``all`` and ``ungrouped`` become no group. A host
  Ansible reaches otherwise than by plain SSH is left out here.
- ``ssh-config``: ``ssh -G ALIAS`` per alias, OpenSSH's own answer (``Host``,
  ``Match``, ``Include``, ``%`` tokens) instead of a parser of ours; a host whose
  ProxyJump is one alias imported in the same run gets ``via`` (``importer`` checks
  that the jump host made it); another ProxyJump (user@host:port, a chain, a host
  not imported) or a ProxyCommand leaves the host out.
"""

from __future__ import annotations

import os
import pwd
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sshadapter.bounded_read import read_bounded
from sshadapter.config import LABEL_WORD, MAX_LABELS
from sshadapter.errors import ConfigError
from sshadapter.shown import shown
from sshadapter.strict_json import StrictJSONError, strict_loads

# `ansible-inventory --list` without --export copies every group variable into every host:
# a 10,000-host inventory with a few KiB of variables each; larger is not an inventory.
MAX_ANSIBLE_JSON_BYTES: Final = 64 * 1024 * 1024
# groups > a group > hosts > a host > its variables > a structured value: a little room above.
MAX_ANSIBLE_JSON_DEPTH: Final = 64
# `ssh -G` reads files and may run `Match exec` or canonicalise a name through DNS; it never
# connects, so a few seconds is generous, and a hung resolver must not hang the import.
SSH_G_TIMEOUT_SECONDS: Final = 10.0
# What `ssh -G` prints is a few KiB; its last error line (the reason) is all a report needs.
MAX_SSH_ERROR_CHARS: Final = 300
# The user `_stated_user` sets after the configuration: a name no configuration would give.
UNSTATED_USER: Final = "sshadapter-import-no-user-line"
# What `ssh` reads without -F: the user's file, then the system's (OpenSSH's SSHDIR).
DEFAULT_SSH_CONFIGS: Final = ("~/.ssh/config", "/etc/ssh/ssh_config")
DEFAULT_SSH_PORT: Final = 22  # known_hosts entries for port 22 carry no "[host]:port"
ANSIBLE_DEFAULT_PRIORITY: Final = 1  # ansible_group_priority when a group does not set it
# Ansible connection plugins that are OpenSSH (or speak SSH like it); anything else is not a host
# the daemon can reach.
SSH_CONNECTIONS: Final = frozenset({"ssh", "smart", "paramiko", "paramiko_ssh"})
# Variables that change how Ansible reaches a host in ways an inventory entry cannot say
# (jump hosts, proxies, other options): a host that sets one is left out, never half-imported.
ANSIBLE_SSH_ARGS: Final = ("ansible_ssh_common_args", "ansible_ssh_extra_args", "ansible_ssh_args")
# Groups Ansible always has: `all` is every host, `ungrouped` the rest; neither is a group here.
ANSIBLE_IMPLICIT_GROUPS: Final = frozenset({"all", "ungrouped"})
_NOT_A_NAME_CHAR: Final = re.compile(r"[^a-z0-9_-]")


@dataclass(frozen=True)
class Host:
    """One host as a source describes it, before names, keys and values are checked."""

    source: str
    """Its name in the source (Ansible's inventory_hostname, the ssh alias)."""
    address: str
    port: int
    user: str
    """Empty: the source gives none (the configuration's [host_defaults] user applies)."""
    labels: Mapping[str, Any]
    """Label key -> the variable's value as the source gives it (checked as a word later)."""
    via: str = ""
    """The source name of the host it is reached through (ssh-config ProxyJump); "": none."""


@dataclass(frozen=True)
class Source:
    """What a source gave: hosts, groups (by source names) and what it already left out."""

    hosts: Sequence[Host]
    groups: Mapping[str, tuple[str, ...]]
    """Source group name -> its hosts' and child groups' source names."""
    left_out: Sequence[str] = ()


def target_name(raw: str) -> str:
    """``raw`` as a target name: lower case, anything but ``[a-z0-9_-]`` turned into ``-``.

    The result may still not be a name (it starts with a digit, it is too long):
    the caller checks it against TARGET_NAME and reports it.
    """
    return _NOT_A_NAME_CHAR.sub("-", raw.lower())


def from_ansible(path: Path, label_vars: Sequence[str]) -> Source:
    """The hosts and groups of ``ansible-inventory --list [--export]`` JSON, or ConfigError."""
    file = str(path)
    try:
        document = strict_loads(
            read_bounded(path, MAX_ANSIBLE_JSON_BYTES),
            max_bytes=MAX_ANSIBLE_JSON_BYTES,
            max_depth=MAX_ANSIBLE_JSON_DEPTH,
        )
    except StrictJSONError as exc:
        raise ConfigError(file, "", f"not the JSON of ansible-inventory --list: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(file, "", "not the JSON of ansible-inventory --list: not an object")
    meta = _object(document.get("_meta", {}), file, "_meta")
    hostvars = _object(meta.get("hostvars", {}), file, "_meta.hostvars")
    groups: dict[str, dict[str, Any]] = {}
    for name, group in document.items():
        if name != "_meta":
            groups[name] = _object(group, file, name)
    members: dict[str, list[str]] = {}
    children: dict[str, list[str]] = {}
    for name, group in groups.items():
        members[name] = _names(group.get("hosts", []), file, f"{name}.hosts")
        children[name] = _names(group.get("children", []), file, f"{name}.children")
        _object(group.get("vars", {}), file, f"{name}.vars")
    for name in {kid for kids in children.values() for kid in kids} - groups.keys():
        groups[name], members[name], children[name] = {}, [], []  # named, absent: empty
    depth = _depths(children, file)
    below: dict[str, set[str]] = {}  # a group's hosts, its children's included
    for name in named_first(children, file):  # a group after its children: one pass
        below[name] = set(members[name]).union(*(below[kid] for kid in children[name]))
    in_groups: dict[str, set[str]] = {}
    for name, found in below.items():
        for host in found:
            in_groups.setdefault(host, set()).add(name)
    for source in hostvars:  # every host is in `all`, listed or not
        in_groups.setdefault(source, set()).update({"all"} & groups.keys())
    hosts: list[Host] = []
    left_out: list[str] = []
    for source in sorted(set(in_groups) | set(hostvars)):
        own = _object(hostvars.get(source, {}), file, f"_meta.hostvars.{source}")
        ordered = sorted(
            in_groups.get(source, ()),
            key=lambda g: (depth.get(g, 1), _priority(groups[g]), g),
        )
        variables: dict[str, Any] = {}
        for name in ordered:
            variables.update(groups[name].get("vars", {}))
        variables.update(own)
        described = _ansible_host(source, variables, label_vars)
        if isinstance(described, str):
            left_out.append(f"host {shown(source)}: {described}")
        else:
            hosts.append(described)
    kept_groups = {
        name: (*members[name], *children[name])
        for name in groups
        if name not in ANSIBLE_IMPLICIT_GROUPS
    }
    return Source(hosts, kept_groups, left_out)


def _object(value: Any, file: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(file, key, f"expected an object, found {type(value).__name__}")
    return value


def _names(value: Any, file: str, key: str) -> list[str]:
    if not isinstance(value, list):
        raise ConfigError(file, key, f"expected a list of names, found {type(value).__name__}")
    if not all(isinstance(v, str) for v in value):
        raise ConfigError(file, key, "expected a list of names, found a list holding a non-name")
    return value


def _depths(children: Mapping[str, list[str]], file: str) -> dict[str, int]:
    """Each group's depth below ``all`` (0), the longest way down, as Ansible counts it."""
    parents: dict[str, list[str]] = {name: [] for name in children}
    for name, kids in children.items():
        for kid in kids:
            parents[kid].append(name)
    depth: dict[str, int] = {}
    for name in named_first(parents, file):
        above = [depth[p] for p in parents[name]]
        depth[name] = 0 if name == "all" else max(above, default=0) + 1
    return depth


def named_first(graph: Mapping[str, Sequence[str]], file: str) -> list[str]:
    """Every key of ``graph`` after the keys it names, or ConfigError for a cycle.

    A loop with its own stack, not recursion: a source may chain groups any number deep
    (a chain of 1,000 is no error here; Python's stack would end at about that depth).
    """
    order: list[str] = []
    done: set[str] = set()
    for start in graph:
        if start in done:
            continue
        stack = [(start, iter(graph[start]))]
        on_stack = {start}
        while stack:
            name, pending = stack[-1]
            for named in pending:
                if named in on_stack:
                    path = [n for n, _ in stack]
                    cycle = " -> ".join((*path[path.index(named) :], named))
                    raise ConfigError(
                        file, f"{named}.children", f"groups contain each other: {cycle}"
                    )
                if named in graph and named not in done:
                    stack.append((named, iter(graph[named])))
                    on_stack.add(named)
                    break
            else:
                stack.pop()
                on_stack.discard(name)
                done.add(name)
                order.append(name)
    return order


def _priority(group: Mapping[str, Any]) -> int:
    value = group.get("vars", {}).get("ansible_group_priority", ANSIBLE_DEFAULT_PRIORITY)
    return value if isinstance(value, int) else ANSIBLE_DEFAULT_PRIORITY


def _ansible_host(
    source: str, variables: Mapping[str, Any], label_vars: Sequence[str]
) -> Host | str:
    """A Host, or the reason it is left out."""
    connection = variables.get("ansible_connection", "ssh")
    if not isinstance(connection, str) or connection not in SSH_CONNECTIONS:
        return f"ansible_connection is {connection!r}, not SSH"
    for name in ANSIBLE_SSH_ARGS:
        if variables.get(name):
            return f"{name} is set (jump hosts and extra ssh options are not supported yet)"
    address = _one_of(variables, "ansible_host", "ansible_ssh_host", default=source)
    port = _one_of(variables, "ansible_port", "ansible_ssh_port", default=DEFAULT_SSH_PORT)
    user = _one_of(variables, "ansible_user", "ansible_ssh_user", default="")
    for value, key in ((address, "ansible_host"), (port, "ansible_port"), (user, "ansible_user")):
        if isinstance(value, _Conflict):
            return f"{key} and {value.other} differ ({value.values})"
    if isinstance(port, str) and port.isascii() and port.isdigit():
        port = int(port)  # INI inventories give text ("²" is a digit to isdigit, not to int)
    if not isinstance(port, int) or isinstance(port, bool):
        return f"ansible_port is not a number: {port!r}"
    if not isinstance(address, str) or not isinstance(user, str):
        return "ansible_host and ansible_user must be strings"
    labels: dict[str, str] = {}
    for name in label_vars:
        if name in variables:
            labels[target_name(name)] = variables[name]  # words checked with the other values
    return Host(source, address, port, user, labels)


@dataclass(frozen=True)
class _Conflict:
    other: str
    values: str


def _one_of(variables: Mapping[str, Any], key: str, old: str, *, default: Any) -> Any:
    """``key`` or its older spelling ``old``; both set to different values is a conflict."""
    if key in variables and old in variables and variables[key] != variables[old]:
        return _Conflict(old, f"{variables[key]!r} and {variables[old]!r}")
    return variables.get(key, variables.get(old, default))


def from_ssh_config(aliases: Sequence[str], ssh_config: Path | None, user: str) -> Source:
    """Each alias as ``ssh -G`` resolves it (``-F ssh_config``, ``-l user`` when given)."""
    hosts: list[Host] = []
    left_out: list[str] = []
    wanted = dict.fromkeys(aliases)  # an alias given twice is one host
    for alias in wanted:
        resolved = _ssh_g(alias, ssh_config, user)
        if resolved.get("proxycommand", "none") != "none":
            left_out.append(
                f"host {shown(alias)}: proxycommand {shown(resolved['proxycommand'])} (only a "
                "ProxyJump to another imported alias is mapped, to via)"
            )
            continue
        jump = resolved.get("proxyjump", "none")
        if jump != "none" and (jump not in wanted or jump == alias):
            left_out.append(
                f"host {shown(alias)}: proxyjump {shown(jump)} (mapped to via only when it is "
                "one other alias imported in the same run: add it to the aliases)"
            )
            continue
        port = resolved.get("port", str(DEFAULT_SSH_PORT))
        if not (port.isascii() and port.isdigit()):
            left_out.append(f"host {shown(alias)}: ssh -G gives port {port!r}")
            continue
        address = resolved.get("hostname", alias)
        via = "" if jump == "none" else jump
        said = resolved.get("user", "")
        stated = said if user else _stated_user(alias, ssh_config, said)
        hosts.append(Host(alias, address, int(port), stated, {}, via))
    return Source(hosts, {}, left_out)


def _stated_user(alias: str, ssh_config: Path | None, said: str) -> str:
    """The user a line of the configuration gives ``alias``, or "" when none does; ``said``
    is what ``ssh -G`` printed for it.

    ``ssh -G`` always prints a user: without a ``User`` line, the local account's name,
    which says nothing about the host. Any other name came from a line. The local name
    may be either, so the same configuration is asked again with ``Host * User
    UNSTATED_USER`` after it; OpenSSH keeps the first value it obtains, so the answer is
    UNSTATED_USER exactly when no line of the configuration matched with a ``User``. (The
    configuration is read as an ``Include`` there, which OpenSSH refuses when someone else
    may write it, as it refuses such a ~/.ssh/config.)
    """
    if said != pwd.getpwuid(os.getuid()).pw_name:  # the account ssh itself looks up
        return said
    included = [str(ssh_config.resolve())] if ssh_config is not None else DEFAULT_SSH_CONFIGS
    with tempfile.TemporaryDirectory(prefix="sshadapter-import-") as directory:
        probe = Path(directory) / "ssh_config"
        lines = [*(f'Include "{path}"' for path in included), "Host *", f"User {UNSTATED_USER}"]
        probe.write_text("\n".join(lines) + "\n")
        user = _ssh_g(alias, probe, "").get("user", "")
    return "" if user == UNSTATED_USER else user


def _ssh_g(alias: str, ssh_config: Path | None, user: str) -> dict[str, str]:
    """``ssh -G``'s answer for ``alias``: the first value of each key, or ConfigError."""
    command = ["ssh", "-G"]
    if ssh_config is not None:
        command += ["-F", str(ssh_config)]
    if user:
        command += ["-l", user]
    command += ["--", alias]
    where = str(ssh_config) if ssh_config is not None else "ssh -G"
    try:
        done = subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=SSH_G_TIMEOUT_SECONDS,
            check=False,
        )
    except FileNotFoundError:
        raise ConfigError("ssh", "", "not found: OpenSSH's client resolves ssh-config") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(where, alias, f"ssh -G took over {SSH_G_TIMEOUT_SECONDS:g} s") from None
    if done.returncode != 0:
        lines = done.stderr.decode(errors="replace").strip().splitlines() or ["no message"]
        reason = lines[-1][:MAX_SSH_ERROR_CHARS]
        raise ConfigError(where, alias, f"ssh -G exited {done.returncode}: {reason}")
    resolved: dict[str, str] = {}
    for line in done.stdout.decode(errors="replace").splitlines():
        key, _, value = line.partition(" ")
        resolved.setdefault(key.lower(), value.strip())
    return resolved


def label_names(raw: str) -> tuple[str, ...]:
    """``--labels var1,var2``: the variable names, each of which must make a label word."""
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    keys = [target_name(n) for n in names]
    for name, key in zip(names, keys, strict=True):
        if re.fullmatch(LABEL_WORD, key) is None:
            raise ConfigError("--labels", name, f"{key!r} is not a label word ({LABEL_WORD})")
    if len(set(keys)) != len(keys):
        raise ConfigError("--labels", raw, "two variables make the same label key")
    if len(keys) > MAX_LABELS:
        raise ConfigError("--labels", raw, f"more than {MAX_LABELS} labels")
    return names
