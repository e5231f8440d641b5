"""`sshadapter examples | dispatcher | policy | sudoers`: what an operator installs, here
and on each dispatch host."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

from sshadapter.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_config, load, write_json
from sshadapter.errors import ConfigError


def add(sub: Any) -> None:
    examples_ = sub.add_parser(
        "examples",
        help="write out the shipped examples: commands/, schemas/, systemd/, prometheus/, "
        "docs/, config.example.toml",
        description="Copy the files shipped with this install into DIR (new or empty; never "
        "overwrites), to edit and install as the README's operator guide says.",
    )
    examples_.add_argument(
        "--write", type=Path, required=True, metavar="DIR", help="a new or empty directory"
    )
    examples_.set_defaults(handler=examples)

    policy_ = sub.add_parser(
        "policy",
        help="print the dispatch policy of a host alias, or the one of a group's members (JSON)",
        description="Print the policy a dispatch host installs. For a group, one document "
        '(its "host" the group) every member installs, refused unless all members run '
        "the same operations.",
    )
    add_config(policy_)
    policy_.add_argument("target", metavar="TARGET", help="a host alias or a group")
    policy_.set_defaults(handler=policy)

    sudoers_ = sub.add_parser(
        "sudoers",
        help="print the sudoers drop-in of a dispatch host's or group's run_as operations",
        description="Print the sudoers drop-in for the dispatch account: one rule per "
        "operation with run_as, the exact command and its arguments (see the dispatcher "
        "reference, Root operations). --check proves it with this machine's visudo and "
        "sudo (as root, where the account exists): examples allowed, mutations refused.",
    )
    add_config(sudoers_)
    sudoers_.add_argument("target", metavar="TARGET", help="a host alias or a group")
    sudoers_.add_argument(
        "--check",
        action="store_true",
        help="also prove it (visudo -c, then sudo -l -U on allowed and mutated arguments and "
        "visudo -c on the whole installed sudoers, any warning a failure; installs it in "
        "/etc/sudoers.d under a temporary name meanwhile)",
    )
    sudoers_.set_defaults(handler=sudoers)

    dispatcher_ = sub.add_parser(
        "dispatcher",
        help="write out the host's sshadapter-dispatch",
        description="Write the host's sshadapter-dispatch. Install it as root, then run "
        "PATH --compile on the host, so calls skip compiling it (docs/dispatcher.md).",
    )
    dispatcher_.add_argument(
        "--write", type=Path, required=True, metavar="PATH", help="the file to write (mode 0755)"
    )
    dispatcher_.set_defaults(handler=dispatcher)


def examples(args: argparse.Namespace) -> int:
    from sshadapter.shipped import ExamplesMissing, write_examples

    try:
        written = write_examples(args.write)
    except (ExamplesMissing, OSError, ConfigError) as exc:
        print(f"sshadapter examples: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"wrote {' '.join(written)} to {args.write}")
    return EXIT_OK


def dispatcher(args: argparse.Namespace) -> int:
    """Write the host's dispatcher (one stdlib-only file) to PATH, mode 0755, whole: an old
    one (or a link) there is replaced, never written through (sshadapter/safe_write.py)."""
    from sshadapter.dispatch import policy
    from sshadapter.safe_write import TargetDirectory

    path: Path = args.write
    with TargetDirectory.open(path.parent, key="--write") as out:
        out.publish(path.name, policy.dispatcher_source(), 0o755, overwrite=True)
    return EXIT_OK


def policy(args: argparse.Namespace) -> int:
    """Every operation of a host alias, or of each member of a group, as its dispatcher
    enforces it (docs/dispatcher.md)."""
    from sshadapter.dispatch.policy import group_policy

    _, _, loaded = load(args, also_dispatch=args.target)
    if loaded.inventory.is_group(args.target):
        document = group_policy(args.target, loaded.registry, loaded.inventory)
    else:
        document = loaded.policies[args.target]
    write_json(document)
    return EXIT_OK


def sudoers(args: argparse.Namespace) -> int:
    """The sudoers drop-in of a dispatch host alias or group; with --check, proved."""
    from sshadapter.dispatch import sudoers
    from sshadapter.shown import shown

    path, config, loaded = load(args)
    where = str(path or "<defaults>")
    target = sudoers.target_of(
        args.target, config, loaded.registry, loaded.inventory, loaded.policies, where
    )
    account, found = target.account, target.rules
    if not found:
        print(f"sshadapter: no operation on {args.target} has run_as", file=sys.stderr)
        return EXIT_USAGE
    text = sudoers.drop_in(args.target, account, found, target.policy_digest)
    sys.stdout.write(text)
    if not args.check:
        return EXIT_OK
    missing = sudoers.missing_programs(found)
    if missing:
        print(
            f"sshadapter: sudoers --check: {', '.join(missing)} not on this machine: sudo "
            "refuses a command it cannot find, so run --check on the host (or one like it)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    install = sudoers.install_path(account, args.target)
    try:
        if sudoers.stale(text, install):
            print(
                f"sshadapter: sudoers --check: {install} holds other rules under this drop-in's "
                "names: sudo would read both, so check before installing (or on a machine "
                "like the host)",
                file=sys.stderr,
            )
            return EXIT_FAILED
        passed, said = sudoers.visudo_check(text)
        proved = sudoers.prove(text, account, found, install) if passed else None
    except (OSError, subprocess.SubprocessError) as exc:
        print(
            f"sshadapter: sudoers --check: {exc} (it needs sudo, visudo and root)", file=sys.stderr
        )
        return EXIT_FAILED
    print(f"visudo -c: {'ok' if passed else 'FAILED'}: {shown(said)}", file=sys.stderr)
    if proved is None:
        return EXIT_FAILED
    for line in proved.diagnostics:  # another file's text, a terminal's to show
        print(f"installed sudoers: {shown(line)}", file=sys.stderr)
    for proof in proved.proofs:
        if not proof.ok:
            want = "allowed" if proof.expected else "refused"
            print(
                f"sudo -l: {proof.operation}: {' '.join(proof.argv)!r} must be {want}",
                file=sys.stderr,
            )
    bad = sum(not proof.ok for proof in proved.proofs)
    print(
        f"sudo -l: {len(proved.proofs) - bad} of {len(proved.proofs)} answers as required, "
        f"{len(proved.diagnostics)} diagnostic(s) of the installed sudoers",
        file=sys.stderr,
    )
    return EXIT_OK if proved.ok else EXIT_FAILED
