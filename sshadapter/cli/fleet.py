"""`sshadapter inventory show | import` and `grants explain`: the fleet, and who may run
what where in it."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from sshadapter.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_config,
    load,
    registry_dir,
    write_json,
)
from sshadapter.shown import shown

if TYPE_CHECKING:
    from sshadapter.inventory.fleet import Inventory

# `grants explain` of a uid without a passwd entry: its primary group is unknown, and no
# gid a group name resolves to is negative, so this one matches no `groups` of a grant.
NO_GID: Final = -1


def add(sub: Any) -> None:
    inventory = sub.add_parser("inventory", help="show the fleet: hosts, groups, their members")
    inventory_sub = inventory.add_subparsers(dest="inventory_command", metavar="COMMAND")
    show = inventory_sub.add_parser(
        "show",
        help="list the groups (or one target's resolved hosts) with their digests",
        description="Without TARGET: every group with its size and digest, and the number "
        "of hosts. With TARGET (a group or a host alias): its hosts, sorted, one per line, "
        "then its digest (the audit's hosts_sha256); for a host alias, its address, port, "
        "user, labels, via (jump host) and groups between them.",
    )
    add_config(show)
    show.add_argument("target", nargs="?", metavar="TARGET", default="")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(handler=inventory_show)
    _add_import(inventory_sub)
    add_config(inventory)  # `sshadapter inventory` alone: `show` of every group
    inventory.set_defaults(handler=inventory_show, target="", json=False)

    grants = sub.add_parser("grants", help="explain who may run what where")
    grants_sub = grants.add_subparsers(dest="grants_command", metavar="COMMAND", required=True)
    explain = grants_sub.add_parser(
        "explain",
        help="say whether a uid may run TOOL on TARGET, and why",
        description="The decision the daemon would take for a caller with this uid (and the "
        "groups the system gives its user) calling TOOL with run_on TARGET (for an operation "
        "on one host, its host alias). Exit 0: allowed, 1: denied.",
    )
    add_config(explain)
    explain.add_argument("uid", metavar="UID_OR_USER")
    explain.add_argument("tool")
    explain.add_argument("target", metavar="TARGET")
    explain.set_defaults(handler=grants_explain)


def _add_import(inventory_sub: Any) -> None:
    """`sshadapter inventory import ansible|ssh-config`: inventory files for review."""
    import_ = inventory_sub.add_parser(
        "import",
        help="write an inventory file from Ansible or ssh -G, for review (never fetches keys)",
        description="Read Ansible's inventory or OpenSSH's resolution and write one inventory "
        "file. Only hosts with a key pinned in --known-hosts (a key line or an "
        "@cert-authority line) are written; every host, group or label left out is reported "
        "on stderr. Exit 0: all imported, 1: something left out, 2: a usage or input error.",
    )
    sources = import_.add_subparsers(dest="import_source", metavar="SOURCE", required=True)
    ansible = sources.add_parser(
        "ansible",
        help="the JSON of `ansible-inventory --list [--export]`",
        description="Hosts from _meta.hostvars and the groups (ansible_host, ansible_port, "
        "ansible_user; group vars applied as Ansible applies them); groups with their hosts "
        "and children as [groups.*] members; all and ungrouped become no group.",
    )
    ansible.add_argument("file", type=Path, metavar="FILE.json")
    ansible.add_argument(
        "--labels",
        default="",
        metavar="VAR,...",
        help="host variables to write as labels (values must be label words)",
    )
    ssh_config = sources.add_parser(
        "ssh-config",
        help="hosts as `ssh -G ALIAS` resolves them (hostname, port, user)",
        description="Runs `ssh -G` for each alias (never connects). A ProxyJump to another "
        "alias given here becomes `via`; any other ProxyJump or a ProxyCommand leaves the "
        "host out.",
    )
    ssh_config.add_argument("aliases", nargs="+", metavar="ALIAS")
    ssh_config.add_argument(
        "--ssh-config", type=Path, default=None, metavar="FILE", help="ssh -F FILE"
    )
    for source in (ansible, ssh_config):
        source.add_argument(
            "--known-hosts",
            type=Path,
            required=True,
            metavar="FILE",
            help="the known_hosts file that must pin each host; written as the hosts' known_hosts",
        )
        source.add_argument(
            "--user",
            default="",
            help="every host's user, over ansible_user and User lines ([host_defaults] user)",
        )
        source.add_argument(
            "--write",
            type=Path,
            required=True,
            metavar="DIR/NAME.toml",
            help="the inventory file to write (atomically)",
        )
        source.add_argument("--force", action="store_true", help="replace an existing file")
        source.set_defaults(handler=inventory_import)


def inventory_show(args: argparse.Namespace) -> int:
    """The resolved inventory: what each target name stands for (docs/operations.md)."""
    from sshadapter.inventory.fleet import host_set_digest

    inventory = load(args)[2].inventory
    if args.target:
        if not inventory.exists(args.target):
            print(f"sshadapter: {args.target!r} is no host alias and no group", file=sys.stderr)
            return EXIT_USAGE
        members = inventory.members(args.target)
        host = _host_facts(inventory, args.target) if args.target in inventory.hosts else None
        if args.json:
            answer: dict[str, Any] = {"target": args.target, "hosts": list(members)}
            answer["hosts_sha256"] = host_set_digest(members)
            if host is not None:
                answer["host"] = host
            write_json(answer)
        else:
            print("\n".join(members))
            for key, value in (host or {}).items():
                print(f"  {key:<8} {_shown_fact(value)}")
            print(f"# {len(members)} host(s), {host_set_digest(members)}")
        return EXIT_OK
    groups = {
        name: {"hosts": len(members), "hosts_sha256": host_set_digest(members)}
        for name, members in sorted(inventory.groups.items())
    }
    if args.json:
        answer = {"hosts": len(inventory.hosts), "groups": groups}
        write_json(answer)
        return EXIT_OK
    width = max((len(name) for name in groups), default=5)
    print(f"{'group':<{width}}  {'hosts':>5}  digest")
    for name, row in groups.items():
        print(f"{name:<{width}}  {row['hosts']:>5}  {row['hosts_sha256']}")
    print(f"{len(inventory.hosts)} host(s), {len(groups)} group(s)")
    return EXIT_OK


def _host_facts(inventory: Inventory, alias: str) -> dict[str, Any]:
    """What a host alias stands for: where the daemon connects, as whom, through which jump
    host, with which labels, and the groups it is a member of."""
    host = inventory.hosts[alias]
    return {
        "address": host.address,
        "port": host.port,
        "user": host.user,
        "labels": dict(sorted(host.labels.items())),
        "via": host.via,
        "groups": sorted(name for name, members in inventory.groups.items() if alias in members),
    }


def _shown_fact(value: Any) -> str:
    """One fact of ``_host_facts`` on one line, escaped: a file's text (an address, a label)
    reaches the terminal through ``shown`` only; nothing is cut."""
    if isinstance(value, dict):
        value = ", ".join(f"{key}={item}" for key, item in value.items())
    elif isinstance(value, list):
        value = ", ".join(value)
    return shown(value, None) if value != "" else "-"


def inventory_import(args: argparse.Namespace) -> int:
    """Hosts pinned in known_hosts, from Ansible or ssh -G, into one file (docs/operations.md)."""
    import json

    from sshadapter.inventory import importer, sources
    from sshadapter.inventory.fleet import MAX_GROUP_NESTING

    importer.check_target(args.write, force=args.force)
    if args.user:
        importer.check_user(args.user)
    known_hosts_path = args.known_hosts.resolve()
    known_hosts = importer.read_known_hosts(known_hosts_path)
    if args.import_source == "ansible":
        labels = sources.label_names(args.labels)
        source = sources.from_ansible(args.file, labels)
        origin = f"sshadapter inventory import ansible {json.dumps(args.file.name)}"
    else:
        source = sources.from_ssh_config(args.aliases, args.ssh_config, args.user)
        origin = "sshadapter inventory import ssh-config"  # the aliases are in the file
    plan = importer.plan(source, known_hosts, known_hosts_path, args.user)
    for line in plan.left_out:
        print(f"sshadapter: left out: {line}", file=sys.stderr)
    if plan.flattened:
        print(
            f"sshadapter: note: {len(plan.flattened)} group(s) with more than "
            f"{MAX_GROUP_NESTING} levels of groups below them written with their hosts as "
            f"members (flattened: same hosts): {shown(', '.join(plan.flattened))}",
            file=sys.stderr,
        )
    if not plan.hosts:
        print(f"sshadapter: no host imported: {args.write} not written", file=sys.stderr)
        return EXIT_FAILED
    text = importer.render(plan, known_hosts_path, args.user, origin)
    importer.write_new(args.write, text, force=args.force)
    without_user = sum(1 for entry in plan.hosts.values() if "user" not in entry)
    if without_user and not args.user:
        print(
            f"sshadapter: note: {without_user} host(s) without a user take the configuration's "
            "[host_defaults] user",
            file=sys.stderr,
        )
    print(
        f"wrote {args.write}: {len(plan.hosts)} host(s), {len(plan.groups)} group(s), "
        f"{len(plan.left_out)} left out"
    )
    return EXIT_FAILED if plan.left_out else EXIT_OK


def grants_explain(args: argparse.Namespace) -> int:
    """Whether a uid may call a tool on a target, the way the daemon decides it."""
    import grp
    import pwd

    from sshadapter.daemon.access import Access, Peer

    _, config, loaded = load(args)
    registry = loaded.registry
    op = registry.get(args.tool)
    if op is None:
        print(f"sshadapter: no tool {args.tool!r} in {registry_dir(registry)}", file=sys.stderr)
        return EXIT_USAGE
    numeric = args.uid.isascii() and args.uid.isdigit()
    try:
        user = pwd.getpwuid(int(args.uid)) if numeric else pwd.getpwnam(args.uid)
    except KeyError:
        user = None
    except OverflowError:
        print(f"sshadapter: uid {args.uid} is out of range", file=sys.stderr)
        return EXIT_USAGE
    if user is not None:
        groups = frozenset(os.getgrouplist(user.pw_name, user.pw_gid))
        peer = Peer(pid=0, uid=user.pw_uid, gid=user.pw_gid, groups=groups)
        names = ", ".join(sorted(grp.getgrgid(g).gr_name for g in groups if _group_exists(g)))
        who = f"{user.pw_name}; groups: {names or '-'}"
    elif numeric:
        # The daemon honours a uid without a passwd entry ([[grants]] uids, SO_PEERCRED): its
        # groups are the calling process's, unknown here, so only what names the uid counts.
        peer = Peer(pid=0, uid=int(args.uid), gid=NO_GID)
        who = "no passwd entry; groups: none known, only grants and allow naming the uid count"
    else:
        print(f"sshadapter: no user '{shown(args.uid)}' on this system", file=sys.stderr)
        return EXIT_USAGE
    access = Access(registry, loaded.inventory, config.grants, config.server.allow)
    print(f"uid {peer.uid} ({who}), {op.name}, {shown(args.target)}")
    for line in access.explain(op, peer, args.target):
        print(f"  {line}")
    return EXIT_OK if args.target in access.choices(op, peer) else EXIT_FAILED


def _group_exists(gid: int) -> bool:
    import grp

    try:
        grp.getgrgid(gid)
    except KeyError:
        return False
    return True
