"""`sshadapter inventory import`: a source's hosts -> an inventory file, only pinned hosts.

Reference: docs/operations.md "Import". A source (``sources``) says
which hosts exist, where they are and how they are grouped; it never says
which key they have. So every host must already be pinned by the operator's
known_hosts file (a key line for its address, or an ``@cert-authority`` line
that covers it), matched the way asyncssh matches it when the daemon
connects. Import never connects and never fetches a key: a host without a pin
is left out and reported, like a host whose name cannot become a target name
or whose values the configuration would refuse; names that collide are all
left out, never merged. The result is a file for review, checked by the
configuration's own models and written atomically; the daemon never reads a
source.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncssh
import orjson
from pydantic import ValidationError

from sshadapter.bounded_read import read_bounded
from sshadapter.config import LABEL_WORD, HostDefaults
from sshadapter.errors import ConfigError
from sshadapter.inventory.fleet import MAX_GROUP_NESTING, MAX_VIA_HOPS
from sshadapter.inventory.sources import (
    DEFAULT_SSH_PORT,
    Host,
    Source,
    named_first,
    target_name,
)
from sshadapter.safe_write import TargetDirectory, check_directory
from sshadapter.sections import TARGET_NAME
from sshadapter.shown import shown

# The daemon reads known_hosts with the same cap (runners/ssh/dial.py MAX_KNOWN_HOSTS_BYTES).
MAX_KNOWN_HOSTS_BYTES: Final = 4 * 1024 * 1024
# A DNS name (253 characters at most), an IPv4 address, or an IPv6 address with its zone:
# nothing a source could smuggle into a path, an option or a TOML string.
ADDRESS: Final = re.compile(r"[A-Za-z0-9._:%-]{1,253}")
INVENTORY_MODE: Final = 0o644  # for review, like the configuration: no secrets in it


@dataclass
class Plan:
    """The inventory file to write, and every host, group and label left out, with why."""

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    """alias -> the source's name, when they differ (a comment in the file)."""
    left_out: list[str] = field(default_factory=list)
    flattened: list[str] = field(default_factory=list)
    """Source names of the groups written with their hosts: more than MAX_GROUP_NESTING
    levels of groups below them, which the daemon refuses."""


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
                    f"{shown(claimant)}: {name!r} is no target name ({TARGET_NAME}; name it in the "
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
            result.left_out.append(f"host {shown(host.source)}: {checked}")
            continue
        entry, dropped = checked
        result.left_out.extend(f"label of host {shown(host.source)}: {why}" for why in dropped)
        result.hosts[alias] = entry
        host_aliases[host.source] = alias
        if alias != host.source:
            result.renamed[alias] = host.source
    _plan_vias(source, host_aliases, result)
    _plan_groups(source, usable, host_aliases, result)
    return result


def _host_entry(
    host: Host, known_hosts: asyncssh.SSHKnownHosts, known_hosts_path: Path, user: str
) -> str | tuple[dict[str, Any], list[str]]:
    """The host's TOML table and the labels dropped, or why the host is left out."""
    address = host.address
    if "{{" in address or "{%" in address:
        return f"address {address!r} is an Ansible template, not a value"
    if ADDRESS.fullmatch(address) is None:
        return f"address {address!r} is no host name or IP address"
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
    if host.user and not user:  # --user wins: it is every host's user, in [host_defaults]
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


def _plan_vias(source: Source, host_aliases: dict[str, str], result: Plan) -> None:
    """``via`` for each host behind a jump host that was imported; a host in a jump cycle,
    behind more than MAX_VIA_HOPS, or whose jump host was left out is left out too."""
    jumps = {h.source: h.via for h in source.hosts if h.via and h.source in host_aliases}
    for name in sorted(jumps):
        hops: list[str] = []
        hop = jumps[name]
        while hop and hop != name and hop not in hops:
            hops.append(hop)
            hop = jumps.get(hop, "")
        if hop or len(hops) > MAX_VIA_HOPS:
            why = "in a cycle" if hop else f"more than {MAX_VIA_HOPS}"
            chain = shown(" -> ".join([name, *hops]))
            result.left_out.append(f"host {shown(name)}: jump hosts {why}: {chain}")
            del result.hosts[host_aliases.pop(name)]
    changed = True
    while changed:  # a host behind one left out (or behind one behind it) goes too
        changed = False
        for name, via in sorted(jumps.items()):
            if name in host_aliases and via not in host_aliases:
                result.left_out.append(
                    f"host {shown(name)}: its jump host {shown(via)} is not imported"
                )
                del result.hosts[host_aliases.pop(name)]
                changed = True
    for name, via in jumps.items():
        if name in host_aliases:
            result.hosts[host_aliases[name]]["via"] = host_aliases[via]


def _plan_groups(
    source: Source, usable: Mapping[str, str], host_aliases: Mapping[str, str], result: Plan
) -> None:
    """Groups with their imported members; a group left with no host is reported, not
    written; a group with more than MAX_GROUP_NESTING levels of groups below it is written
    with its hosts instead (flattened: the same set), so the daemon loads every file."""
    groups_in = {
        name: [m for m in members if m in source.groups and m in usable]
        for name, members in source.groups.items()
    }
    hosts_of: dict[str, set[str]] = {}
    levels: dict[str, int] = {}  # a written group's levels of groups, itself the first
    written: dict[str, list[str]] = {}
    for name in named_first(groups_in, "the source"):  # a group after the groups it names
        kept = [group for group in groups_in[name] if hosts_of[group]]
        hosts = {host_aliases[m] for m in source.groups[name] if m in host_aliases}
        hosts_of[name] = hosts.union(*(hosts_of[group] for group in kept))
        levels[name] = 1 + max((levels[group] for group in kept), default=0)
        written[name] = sorted(hosts | {usable[group] for group in kept})
        if levels[name] > MAX_GROUP_NESTING:
            levels[name] = 1
            written[name] = sorted(hosts_of[name])
            if name in usable:
                result.flattened.append(name)
    for name in sorted(source.groups):
        target = usable.get(name)
        if target is None:
            continue
        if not hosts_of[name]:
            result.left_out.append(
                f"group {shown(name)}: no imported host (an empty group is refused)"
            )
            continue
        result.groups[target] = written[name]
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

    Checked before the sources are read, and again when writing."""
    file = str(path)
    if path.suffix != ".toml":
        raise ConfigError(file, "--write", "an inventory file name ends in .toml")
    if not path.parent.is_dir():
        raise ConfigError(file, "--write", f"{path.parent} is not a directory")
    check_directory(path.parent, key="--write")
    if os.path.lexists(path) and not force:
        raise ConfigError(file, "--write", "exists (give --force to replace it)")


def write_new(path: Path, text: str, *, force: bool) -> None:
    """``text`` to ``path`` all at once (sshadapter/safe_write.py: never through a link,
    only into a directory nobody else can write to); an existing file stays unless
    ``force``. The temporary name does not end in .toml: the loader never sees a
    half-written file."""
    check_target(path, force=force)
    with TargetDirectory.open(path.parent, key="--write") as out:
        out.publish(path.name, text.encode(), INVENTORY_MODE, overwrite=force)


def check_user(user: str) -> None:
    """``--user``: a user name the configuration accepts, or ConfigError."""
    try:
        HostDefaults.model_validate_json(orjson.dumps({"user": user}), strict=True)
    except ValidationError as exc:
        raise ConfigError("--user", user, str(exc.errors()[0]["msg"])) from None
