"""Stage 2, authorize: who is calling (from the kernel) and whether they may call a tool.

Reference: docs/protocol.md "Who may call". Deny by default: the caller's uid,
or its primary or one of its supplementary groups, must be listed in the
operation's ``allow`` (or the server's default). Group names are resolved to
gids once per load and reload, never per call: a name lookup goes through NSS,
which can block on LDAP or sssd, and costs ~0.2 ms even for a local name that
does not exist. A group that does not exist admits nobody.
"""

from __future__ import annotations

import grp
import logging
from dataclasses import dataclass

from sshadapter.sections import Allow

log = logging.getLogger(__name__)


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
