"""Stage 2, authorize: who is calling, and which tools and targets they may use.

Reference: docs/protocol.md "Who may call". Who is calling comes from the kernel
(``Peer``), never from the request. Deny by default: the caller's uid, or its
primary or one of its supplementary groups, must be listed in an ``allow`` table.
Group names are resolved to gids once per load and reload, never per call: a name
lookup goes through NSS, which can block on LDAP or sssd, and costs ~0.2 ms even
for a local name that does not exist. A group that does not exist admits nobody.

Which targets a caller may name for a tool has two sources, resolved once per load:

- an operation's ``allow`` (or ``[server] allow``) is the shorthand: a caller it
  admits may use every target the operation lists;
- ``[[grants]]`` in the configuration: callers (uids, unix groups) x tools x
  targets. A target is usable when every host it stands for is a host some grant
  gives this caller for this tool. ``tools = ["*"]`` covers read-only tools only.

A caller's *choices* for an operation are what it may give as ``run_on``: the
groups the operation lists (when it fans out), the hosts it lists, and the
members of its groups (when ``[fanout] single_host``), each kept only when usable.
The choices are computed per caller identity and kept until the next reload.
"""

from __future__ import annotations

import grp
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from sshadapter.config import Grant
from sshadapter.contract.registry import Operation, Registry
from sshadapter.inventory.fleet import Inventory
from sshadapter.sections import Allow

log = logging.getLogger(__name__)

ANY_READ_ONLY_TOOL: Final = "*"
# Identities whose choices are kept between reloads: agents on one machine are few.
MAX_CACHED_CALLERS: Final = 1024


@dataclass(frozen=True, slots=True)
class Peer:
    """Who is calling, from the kernel (SO_PEERCRED), never from the request."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = frozenset()
    """Supplementary groups of the calling process, when the kernel tells them."""


@dataclass(frozen=True, slots=True)
class Callers:
    """An ``allow`` table with its group names resolved to gids."""

    uids: frozenset[int]
    gids: frozenset[int]

    def admit(self, peer: Peer) -> bool:
        return (
            peer.uid in self.uids or peer.gid in self.gids or not self.gids.isdisjoint(peer.groups)
        )


def resolve(allow: Allow, *, where: str = "allow") -> Callers:
    """Resolve ``allow`` now; an unknown group is logged once and admits nobody."""
    gids = set()
    for name in allow.groups:
        try:
            gids.add(grp.getgrnam(name).gr_gid)
        except KeyError:
            log.warning("%s: group %r does not exist: it admits nobody", where, name)
    return Callers(frozenset(allow.uids), frozenset(gids))


@dataclass(frozen=True, slots=True)
class _Grant:
    callers: Callers
    tools: frozenset[str]
    hosts: frozenset[str]
    """Every host of every target it names."""
    targets: tuple[str, ...]

    def covers(self, op: Operation) -> bool:
        return op.name in self.tools or (ANY_READ_ONLY_TOOL in self.tools and op.spec.read_only)


class Access:
    """Who may run what where, for one registry and inventory."""

    def __init__(
        self,
        registry: Registry,
        inventory: Inventory,
        grants: Sequence[Grant],
        default_allow: Allow,
    ) -> None:
        self.inventory = inventory
        default = resolve(default_allow, where="[server] allow")
        self.allow: dict[str, Callers] = {
            name: resolve(op.spec.allow, where=f"{op.file}: allow") if op.spec.allow else default
            for name, op in registry.operations.items()
        }
        self._grants = tuple(
            _Grant(
                resolve(Allow(uids=g.uids, groups=g.groups), where=f"grants[{i}]"),
                frozenset(g.tools),
                frozenset(h for t in g.targets for h in inventory.members(t)),
                g.targets,
            )
            for i, g in enumerate(grants)
        )
        self._candidates = {
            name: _candidates(op, inventory) for name, op in registry.operations.items()
        }
        self._cache: dict[tuple[str, int, int, frozenset[int]], tuple[str, ...]] = {}

    def candidates(self, op: Operation) -> tuple[str, ...]:
        """Every name ``run_on`` could ever take for ``op``, whoever calls (sorted)."""
        return self._candidates[op.name]

    def granted_hosts(self, op: Operation, peer: Peer) -> frozenset[str]:
        """The hosts the grants give ``peer`` for ``op``."""
        found: set[str] = set()
        for grant in self._grants:
            if grant.covers(op) and grant.callers.admit(peer):
                found |= grant.hosts
        return frozenset(found)

    def choices(self, op: Operation, peer: Peer) -> tuple[str, ...]:
        """The targets ``peer`` may name for ``op``, sorted; () when none (DENIED).

        An operation on one fixed ``host`` has one choice, that host, or none.
        """
        key = (op.name, peer.uid, peer.gid, peer.groups)
        found = self._cache.get(key)
        if found is None:
            found = self._choices(op, peer)
            if len(self._cache) >= MAX_CACHED_CALLERS:
                self._cache.clear()
            self._cache[key] = found
        return found

    def _choices(self, op: Operation, peer: Peer) -> tuple[str, ...]:
        if self.allow[op.name].admit(peer):
            return self._candidates[op.name]
        hosts = self.granted_hosts(op, peer)
        if not hosts:
            return ()
        members = self.inventory.members
        return tuple(t for t in self._candidates[op.name] if hosts.issuperset(members(t)))

    def explain(self, op: Operation, peer: Peer, target: str) -> list[str]:
        """Why ``peer`` may or may not name ``target`` for ``op``: lines for an operator."""
        lines = []
        hosts = self.inventory.members(target)
        if not self.inventory.exists(target):
            lines.append(f"{target!r} is no host alias and no group in the inventory")
        elif target not in self._candidates[op.name]:
            lines.append(f"{op.name} does not list {target!r} (its targets: {_names(op)})")
        else:
            lines.append(f"{target!r} stands for {len(hosts)} host(s)")
        if self.allow[op.name].admit(peer):
            source = f"{op.file}: allow" if op.spec.allow else "[server] allow"
            lines.append(f"{source} admits uid {peer.uid}: every target {op.name} lists")
        else:
            lines.append(f"no `allow` admits uid {peer.uid} for {op.name}")
            for i, grant in enumerate(self._grants):
                if grant.covers(op) and grant.callers.admit(peer):
                    lines.append(f"grants[{i}] gives {', '.join(grant.targets)}")
            missing = sorted(set(hosts) - self.granted_hosts(op, peer))
            if hosts and missing:
                shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
                lines.append(f"not granted: {len(missing)} host(s) of {target!r}: {shown}")
        allowed = target in self.choices(op, peer)
        lines.append(f"decision: {'ALLOW' if allowed else 'DENY'}")
        return lines


def _names(op: Operation) -> str:
    return ", ".join(op.spec.targets) if op.spec.targets else str(op.spec.host)


def _candidates(op: Operation, inventory: Inventory) -> tuple[str, ...]:
    if not op.multi:
        return (op.spec.host,) if op.spec.host is not None else ()
    found: set[str] = set()
    for target in op.spec.targets:
        if not inventory.is_group(target):
            found.add(target)
            continue
        if op.spec.fans_out:
            found.add(target)
        if op.spec.fanout.single_host:
            found.update(inventory.members(target))
    return tuple(sorted(found))


def hosts_of(ops: Iterable[Operation], inventory: Inventory) -> Mapping[str, frozenset[str]]:
    """Each operation's hosts: every host it may run on, whoever calls."""
    return {
        op.name: frozenset(
            h for t in (op.spec.targets or (op.spec.host,)) if t for h in inventory.members(t)
        )
        for op in ops
    }
