"""The fleet: host aliases and named groups, every group resolved to a closed set at load.

Reference: docs/operations.md "Inventory". A group is the hosts whose labels
include all of its ``match`` pairs, plus its ``members`` (aliases or groups),
minus its ``exclude`` (aliases or groups), computed once when the configuration
loads: no pattern from anyone reaches a call. Host aliases and group names share
one namespace, the names an agent may give as ``target``. The group ``all`` is
implicit (as Ansible's): every host alias, jump hosts included; no file may
declare it or name a host so. Errors name the file that defined the group, the
key and the reason: an unknown name, an empty group, an empty ``match``, a cycle.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from sshadapter.config import Config, GroupSection, HostSection
from sshadapter.errors import ConfigError
from sshadapter.shown import shown

# A group may name groups that name groups: deeper than this is a mistake, not a design.
MAX_GROUP_NESTING: Final = 16
# The implicit group of every host alias (Ansible's name for it): no file declares it.
ALL_GROUP: Final = "all"
# Jump hosts before a target (``via`` chains): each hop adds a handshake and a round trip
# to every call's connect; real fleets use one, rarely two (docs/operations.md "Bastions").
MAX_VIA_HOPS: Final = 3


@dataclass(frozen=True)
class Inventory:
    """Every host alias and every group, resolved: what targets mean."""

    hosts: Mapping[str, HostSection]
    groups: Mapping[str, tuple[str, ...]]
    """Group name -> its members, sorted, never empty."""
    origins: Mapping[str, str]
    """Target name -> the file that defined it."""

    def members(self, target: str) -> tuple[str, ...]:
        """The sorted aliases ``target`` stands for (an alias stands for itself); () if none."""
        if target in self.hosts:
            return (target,)
        return self.groups.get(target, ())

    def is_group(self, target: str) -> bool:
        return target in self.groups

    def exists(self, target: str) -> bool:
        return target in self.hosts or target in self.groups

    def warnings(self) -> list[str]:
        """What `sshadapter check` should point out: two aliases for one address and port
        (a copy slip: one host then has two names, two pins and two connection pools)."""
        seen: dict[tuple[str, int], str] = {}
        found = []
        for alias, host in sorted(self.hosts.items()):
            address, port = getattr(host, "address", None), getattr(host, "port", 0)
            if address is None:  # a bare inventory: aliases only
                continue
            first = seen.setdefault((address.lower(), port), alias)
            if first != alias:
                where = self.origins.get(alias, "<config>")
                found.append(  # the address is any text the file gives: shown, never raw
                    f"{shown(where, None)}: hosts.{alias}: same address and port as {first!r} "
                    f"({shown(address)}:{port})"
                )
        return found

    @classmethod
    def bare(cls, aliases: Iterable[str]) -> Inventory:
        """Host aliases only, no groups and no connection settings (a daemon built without
        a configuration's inventory: tests, offline tools)."""
        return cls(dict.fromkeys(aliases), {}, {})  # type: ignore[arg-type]

    def digest(self, target: str) -> str:
        """sha256 of the sorted member list: the audit names a fan-out's host set by it."""
        return host_set_digest(self.members(target))


def host_set_digest(aliases: tuple[str, ...]) -> str:
    """sha256 (hex) of the sorted aliases joined by newlines: the audit's ``hosts_sha256``."""
    return hashlib.sha256("\n".join(aliases).encode()).hexdigest()


def load_inventory(config: Config) -> Inventory:
    """The inventory of a loaded configuration, or ConfigError on the first bad group."""
    origins = config.origins
    for kind, names in (("hosts", config.hosts), ("groups", config.groups)):
        if ALL_GROUP in names:
            raise ConfigError(
                origins.get(ALL_GROUP, "<config>"),
                f"{kind}.{ALL_GROUP}",
                f"{ALL_GROUP!r} is the implicit group of every host: it cannot be declared; "
                "choose another name",
            )
    for name in config.groups:
        if name in config.hosts:
            raise ConfigError(
                origins.get(name, "<config>"),
                f"groups.{name}",
                f"{name!r} is also a host alias ({origins.get(name, '?')}): one name, one target",
            )
    for alias in sorted(config.hosts):
        via_chain(alias, config.hosts, origins)
    resolved: dict[str, tuple[str, ...]] = {}
    levels: dict[str, int] = {}
    if config.hosts:  # a group is never empty: no hosts, no `all`
        resolved[ALL_GROUP], levels[ALL_GROUP] = tuple(sorted(config.hosts)), 1
    for name in sorted(config.groups):
        _resolve(name, config, resolved, levels, ())
    return Inventory(dict(config.hosts), resolved, dict(origins))


def via_chain(
    alias: str, hosts: Mapping[str, HostSection], origins: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The jump hosts before ``alias``, nearest first (``via``, its ``via``, ...); () for a
    direct host. ConfigError for an unknown alias, a cycle, or more than MAX_VIA_HOPS."""
    chain: list[str] = []
    current = alias
    while via := hosts[current].via:
        where = (origins or {}).get(current, "<config>")
        key = f"hosts.{current}.via"
        if via not in hosts:
            raise ConfigError(where, key, f"{via!r} is no host alias")
        if via == alias or via in chain:
            cycle = " -> ".join((alias, *chain, via))
            raise ConfigError(where, key, f"jump hosts name each other in a cycle: {cycle}")
        chain.append(via)
        if len(chain) > MAX_VIA_HOPS:
            hops = " -> ".join((alias, *chain))
            raise ConfigError(where, key, f"more than {MAX_VIA_HOPS} jump hosts: {hops}")
        current = via
    return tuple(chain)


def _resolve(
    name: str,
    config: Config,
    resolved: dict[str, tuple[str, ...]],
    levels: dict[str, int],
    path: tuple[str, ...],
) -> tuple[str, ...]:
    """``name``'s hosts. ``levels`` holds each resolved group's levels of groups, itself
    included, so a chain is measured whole whichever of its groups was resolved first."""
    group: GroupSection = config.groups[name]
    file = config.origins.get(name, "<config>")
    if len(path) + levels.get(name, 1) > MAX_GROUP_NESTING:
        raise ConfigError(file, f"groups.{name}", f"nested deeper than {MAX_GROUP_NESTING} groups")
    if name in resolved:
        return resolved[name]
    if name in path:
        cycle = " -> ".join((*path[path.index(name) :], name))
        raise ConfigError(file, f"groups.{name}", f"groups name each other in a cycle: {cycle}")
    if "match" in group.model_fields_set and not group.match:  # a slip, or "every host"
        raise ConfigError(
            file,
            f"groups.{name}.match",
            f"an empty match selects nothing: for every host, name the group {ALL_GROUP!r} "
            f"(as a target, or in members = [{ALL_GROUP!r}])",
        )
    below = 0
    chosen: set[str] = set()
    if group.match:
        wanted = group.match.items()
        chosen = {alias for alias, host in config.hosts.items() if wanted <= host.labels.items()}
    for key, names in (("members", group.members), ("exclude", group.exclude)):
        found: set[str] = set()
        for member in names:
            if member in config.hosts:
                found.add(member)
            elif member == ALL_GROUP and member in resolved:
                found.update(resolved[member])
            elif member in config.groups:
                found.update(_resolve(member, config, resolved, levels, (*path, name)))
                below = max(below, levels[member])
            else:
                raise ConfigError(
                    file, f"groups.{name}.{key}", f"{member!r} is no host alias and no group"
                )
        chosen = chosen | found if key == "members" else chosen - found
    if not chosen:
        why = "its match selects no host" if group.match else "it names no host"
        raise ConfigError(file, f"groups.{name}", f"empty group: {why} (after exclude)")
    resolved[name] = tuple(sorted(chosen))
    levels[name] = 1 + below
    return resolved[name]
