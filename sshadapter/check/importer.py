"""`sshadapter inventory import`: Ansible's inventory or OpenSSH's resolution -> an inventory file.

Reference: docs/operations.md "Import". A source says which hosts exist, where
they are and how they are grouped; it never says which key they have. So every
host must already be pinned by the operator's known_hosts file (a key line for
its address, or an ``@cert-authority`` line that covers it), matched the way
asyncssh matches it when the daemon connects. Import never connects and never
fetches a key: a host without a pin is left out and reported, like a host whose
name cannot become a target name, whose values the configuration would refuse,
or whose connection goes through a jump host (bastions are not supported yet).

Sources:

- ``ansible``: the JSON of ``ansible-inventory --list`` (with or without
  ``--export``): groups with ``hosts`` and ``children``, ``vars`` (export) and
  ``_meta.hostvars``. Group variables apply the way Ansible applies them
  (parents before children, then ``ansible_group_priority``, then the name;
  the host's own last). ``all`` and ``ungrouped`` become no group.
- ``ssh-config``: ``ssh -G ALIAS`` per alias, OpenSSH's own answer (``Host``,
  ``Match``, ``Include``, ``%`` tokens) instead of a parser of ours.

The result is a file for review, checked by the configuration's own models
(``HostDefaults``, ``GroupSection``) and written atomically; the daemon never
reads a source.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncssh
import orjson
from pydantic import ValidationError

from sshadapter.bounded_read import read_bounded
from sshadapter.config import LABEL_WORD, MAX_LABELS, TARGET_NAME, HostDefaults
from sshadapter.errors import ConfigError
from sshadapter.strict_json import StrictJSONError, strict_loads

# `ansible-inventory --list` without --export copies every group variable into every host:
# a 10,000-host inventory with a few KiB of variables each; larger is not an inventory.
MAX_ANSIBLE_JSON_BYTES: Final = 64 * 1024 * 1024
# groups > a group > hosts > a host > its variables > a structured value: a little room above.
MAX_ANSIBLE_JSON_DEPTH: Final = 64
# The daemon reads known_hosts with the same cap (runners/ssh/dial.py MAX_KNOWN_HOSTS_BYTES).
MAX_KNOWN_HOSTS_BYTES: Final = 4 * 1024 * 1024
# `ssh -G` reads files and may run `Match exec` or canonicalise a name through DNS; it never
# connects, so a few seconds is generous, and a hung resolver must not hang the import.
SSH_G_TIMEOUT_SECONDS: Final = 10.0
# What `ssh -G` prints is a few KiB; its first error line is all a report needs.
MAX_SSH_ERROR_CHARS: Final = 300
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
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Source:
    """What a source gave: hosts, groups (by source names) and what it already left out."""

    hosts: Sequence[Host]
    groups: Mapping[str, tuple[str, ...]]
    """Source group name -> its hosts' and child groups' source names."""
    left_out: Sequence[str] = ()


@dataclass
class Plan:
    """The inventory file to write, and every host, group and label left out, with why."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    """alias -> the source's name, when they differ (a comment in the file)."""
    left_out: list[str] = field(default_factory=list)


def target_name(raw: str) -> str:
    """``raw`` as a target name: lower case, anything but ``[a-z0-9_-]`` turned into ``-``.

    The result may still not be a name (it starts with a digit, it is too long):
    the caller checks it against TARGET_NAME and reports it.
    """
    return _NOT_A_NAME_CHAR.sub("-", raw.lower())


def read_known_hosts(path: Path) -> asyncssh.SSHKnownHosts:
    """The operator's known_hosts file, parsed by asyncssh as the daemon parses it."""
    try:
        return asyncssh.import_known_hosts(read_bounded(path, MAX_KNOWN_HOSTS_BYTES).decode())
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), "", f"not UTF-8 (byte {exc.start})") from None
    except ValueError as exc:  # asyncssh: an invalid entry or marker
        raise ConfigError(str(path), "", str(exc)) from None


def pinned(known_hosts: asyncssh.SSHKnownHosts, address: str, port: int) -> bool:
    """Whether the daemon would accept some key for ``address:port``: a key line or a CA line.

    asyncssh's ``match(host, addr, port)`` (what asyncssh.connect does with the
    daemon's ``address`` and the peer's IP): a port other than 22 is looked up as
    ``[address]:port``, then as the bare address; an address that is an IP also
    matches CIDR patterns. ``@revoked`` lines pin nothing. A name is never resolved
    here, so a line only for a name's IP is not seen: the host is left out.
    """
    port_or_none = None if port == DEFAULT_SSH_PORT else port
    host_keys, ca_keys, *_ = known_hosts.match(address, "", port_or_none)
    return bool(host_keys or ca_keys)


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
    in_groups: dict[str, set[str]] = {}
    for name in groups:
        for below in _hosts_below(name, members, children):
            in_groups.setdefault(below, set()).add(name)
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
            left_out.append(f"host {source}: {described}")
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
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(file, key, "expected a list of names")
    return value


def _depths(children: Mapping[str, list[str]], file: str) -> dict[str, int]:
    """Each group's depth below ``all`` (0), the longest way down, as Ansible counts it."""
    parents: dict[str, set[str]] = {name: set() for name in children}
    for name, kids in children.items():
        for kid in kids:
            parents[kid].add(name)
    depth: dict[str, int] = {}

    def visit(name: str, path: tuple[str, ...]) -> int:
        if name in path:
            cycle = " -> ".join((*path[path.index(name) :], name))
            raise ConfigError(file, f"{name}.children", f"groups contain each other: {cycle}")
        if name not in depth:
            above = [visit(p, (*path, name)) for p in parents[name]]
            depth[name] = 0 if name == "all" else max(above, default=0) + 1
        return depth[name]

    for name in children:
        visit(name, ())
    return depth


def _hosts_below(
    name: str, members: Mapping[str, list[str]], children: Mapping[str, list[str]]
) -> set[str]:
    seen: set[str] = set()
    todo = [name]
    found: set[str] = set()
    while todo:
        group = todo.pop()
        if group not in seen:
            seen.add(group)
            found.update(members.get(group, ()))
            todo.extend(children.get(group, ()))
    return found


def _priority(group: Mapping[str, Any]) -> int:
    value = group.get("vars", {}).get("ansible_group_priority", ANSIBLE_DEFAULT_PRIORITY)
    return value if isinstance(value, int) else ANSIBLE_DEFAULT_PRIORITY


def _ansible_host(
    source: str, variables: Mapping[str, Any], label_vars: Sequence[str]
) -> Host | str:
    """A Host, or the reason it is left out."""
    connection = variables.get("ansible_connection", "ssh")
    if connection not in SSH_CONNECTIONS:
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
    if isinstance(port, str) and port.isdigit():
        port = int(port)  # INI inventories give text
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
    for alias in aliases:
        resolved = _ssh_g(alias, ssh_config, user)
        for key in ("proxyjump", "proxycommand"):
            if resolved.get(key, "none") != "none":
                left_out.append(
                    f"host {alias}: {key} {resolved[key]} (bastions are not supported yet)"
                )
                break
        else:
            port = resolved.get("port", str(DEFAULT_SSH_PORT))
            if not port.isdigit():
                left_out.append(f"host {alias}: ssh -G gives port {port!r}")
                continue
            address = resolved.get("hostname", alias)
            hosts.append(Host(alias, address, int(port), resolved.get("user", ""), {}))
    return Source(hosts, {}, left_out)


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


def plan(
    source: Source, known_hosts: asyncssh.SSHKnownHosts, known_hosts_path: Path, user: str
) -> Plan:
    """Names checked, keys required, values checked by the configuration's models, groups
    without a host dropped: what to write, and what was left out and why."""
    result = Plan(left_out=list(source.left_out))
    claims: dict[str, list[str]] = {}
    for name in [h.source for h in source.hosts] + list(source.groups):
        claims.setdefault(target_name(name), []).append(name)
    usable: dict[str, str] = {}  # source name -> target name
    for name, claimants in sorted(claims.items()):
        if re.fullmatch(TARGET_NAME, name) is None:
            for claimant in claimants:
                result.left_out.append(
                    f"{claimant}: {name!r} is no target name ({TARGET_NAME}; name it in the "
                    "source, e.g. an Ansible alias with ansible_host)"
                )
        elif len(claimants) > 1:
            together = ", ".join(repr(c) for c in claimants)
            result.left_out.append(f"{together}: all become {name!r}: none imported")
        else:
            usable[claimants[0]] = name
    host_aliases: dict[str, str] = {}
    for host in source.hosts:
        alias = usable.get(host.source)
        if alias is None:
            continue
        checked = _host_entry(host, known_hosts, known_hosts_path, user)
        if isinstance(checked, str):
            result.left_out.append(f"host {host.source}: {checked}")
            continue
        entry, dropped = checked
        result.left_out.extend(f"label of host {host.source}: {why}" for why in dropped)
        result.hosts[alias] = entry
        host_aliases[host.source] = alias
        if alias != host.source:
            result.renamed[alias] = host.source
    _plan_groups(source, usable, host_aliases, result)
    return result


def _host_entry(
    host: Host, known_hosts: asyncssh.SSHKnownHosts, known_hosts_path: Path, user: str
) -> str | tuple[dict[str, Any], list[str]]:
    """The host's TOML table and the labels dropped, or why the host is left out."""
    address = host.address
    if not 0 < len(address) <= 253 or any(c.isspace() or not c.isprintable() for c in address):
        return f"address {address!r} is no host name or IP address"
    if "{{" in address or "{%" in address:
        return f"address {address!r} is an Ansible template (export with the value)"
    if not pinned(known_hosts, address, host.port):
        where = address if host.port == DEFAULT_SSH_PORT else f"[{address}]:{host.port}"
        return f"no key pinned for {where} in {known_hosts_path} (import never fetches keys)"
    labels: dict[str, str] = {}
    dropped: list[str] = []
    for key, value in sorted(host.labels.items()):
        word = target_name(value) if isinstance(value, str) else None
        if word is None or re.fullmatch(LABEL_WORD, word) is None:
            dropped.append(f"{key} = {value!r} is not a label word ({LABEL_WORD})")
        else:
            labels[key] = word
    entry: dict[str, Any] = {"address": address}
    if host.port != DEFAULT_SSH_PORT:
        entry["port"] = host.port
    if host.user and host.user != user:
        entry["user"] = host.user
    if labels:
        entry["labels"] = labels
    # The configuration's own rules for every key but address (port range, user, labels).
    checked = {k: v for k, v in entry.items() if k != "address"}
    try:
        HostDefaults.model_validate_json(orjson.dumps(checked), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        return f"{key}: {str(first['msg']).removeprefix('Value error, ')}"
    return entry, dropped


def _plan_groups(
    source: Source, usable: Mapping[str, str], host_aliases: Mapping[str, str], result: Plan
) -> None:
    """Groups with their imported members; a group left with no host is reported, not written."""
    hosts_of: dict[str, set[str]] = {}

    def below(name: str, path: tuple[str, ...]) -> set[str]:
        if name not in hosts_of:
            found: set[str] = set()
            for member in source.groups.get(name, ()):
                if member in host_aliases:
                    found.add(host_aliases[member])
                elif member in source.groups and member not in path and member in usable:
                    found |= below(member, (*path, name))
            hosts_of[name] = found
        return hosts_of[name]

    for name in sorted(source.groups):
        target = usable.get(name)
        if target is None:
            continue
        if not below(name, ()):
            result.left_out.append(f"group {name}: no imported host (an empty group is refused)")
            continue
        members = []
        for member in source.groups[name]:
            if member in host_aliases:
                members.append(host_aliases[member])
            elif member in source.groups and member in usable and below(member, ()):
                members.append(usable[member])
        result.groups[target] = sorted(set(members))
        if target != name:
            result.renamed[target] = name


def render(result: Plan, known_hosts_path: Path, user: str, command: str) -> str:
    """The inventory file: a header, [host_defaults], [hosts.*] then [groups.*], sorted."""
    lines = [
        f"# Written by `{command}`: review it before the daemon reads it.",
        "# Every host has a key pinned in known_hosts; nothing was fetched.",
        "",
        "[host_defaults]",
        f"known_hosts = {_string(str(known_hosts_path))}",
    ]
    if user:
        lines.append(f"user = {_string(user)}")
    for alias, entry in sorted(result.hosts.items()):
        lines += ["", *_was(result, alias), f"[hosts.{alias}]"]
        lines += [f"{key} = {_value(value)}" for key, value in entry.items()]
    for name, members in sorted(result.groups.items()):
        lines += ["", *_was(result, name), f"[groups.{name}]", f"members = {_value(members)}"]
    return "\n".join(lines) + "\n"


def _was(result: Plan, name: str) -> list[str]:
    source = result.renamed.get(name)
    return [f"# {json.dumps(source)} in the source"] if source else []


def _string(text: str) -> str:
    # A JSON string with every non-ASCII character escaped is a TOML basic string.
    return json.dumps(text, ensure_ascii=True)


def _value(value: Any) -> str:
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_string(v)}" for k, v in value.items()) + " }"
    return "[" + ", ".join(_string(v) for v in value) + "]"


def check_target(path: Path, *, force: bool) -> None:
    """``--write``: an inventory file name in a directory, new unless ``force``; or ConfigError.

    Checked before the sources are read, and again just before writing."""
    file = str(path)
    if path.suffix != ".toml":
        raise ConfigError(file, "--write", "an inventory file name ends in .toml")
    if not path.parent.is_dir():
        raise ConfigError(file, "--write", f"{path.parent} is not a directory")
    if path.exists() and not force:
        raise ConfigError(file, "--write", "exists (give --force to replace it)")


def write_new(path: Path, text: str, *, force: bool) -> None:
    """``text`` to ``path`` all at once (a temporary file, then a rename); an existing file
    stays unless ``force``. The temporary name does not end in .toml: the loader never
    sees a half-written file."""
    file = str(path)
    check_target(path, force=force)
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise ConfigError(file, "--write", f"cannot write: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fchmod(out.fileno(), 0o644)  # for review, like the configuration: no secrets
            os.fsync(out.fileno())
        if force:
            os.replace(temporary, path)
        else:
            os.link(temporary, path)  # fails if the file appeared since: never clobbered
            os.unlink(temporary)
    except OSError as exc:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise ConfigError(file, "--write", f"cannot write: {exc.strerror}") from None
    _sync_directory(path.parent)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def check_user(user: str) -> None:
    """``--user``: a user name the configuration accepts, or ConfigError."""
    try:
        HostDefaults.model_validate_json(orjson.dumps({"user": user}), strict=True)
    except ValidationError as exc:
        raise ConfigError("--user", user, str(exc.errors()[0]["msg"])) from None
