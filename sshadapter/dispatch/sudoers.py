"""The sudoers drop-in of a dispatch host (or group): one rule per ``run_as`` operation, proved.

Reference: docs/dispatcher.md "Root operations" and its "What sudo was measured
to do". ``sshadapter sudoers TARGET`` prints it; ``--check`` proves it against the
sudo of the machine it runs on (as root, where the dispatch account exists: the
host itself, or one like it). ``visudo -c`` alone proves little: it passes a rule
whose regular expression is invalid, and that rule then never matches. So the
proof also asks sudo itself, ``sudo -l -U ACCOUNT -u RUN_AS -- PROGRAM ARGS...``
(exit 0: allowed; nothing runs), for every example argument list of each
operation (each must be allowed) and for mutations of them (each must be
refused): an extra or a missing argument, a space, a tab, ``#`` or ``;`` inside
one, another literal, no arguments, another target account.

sudo reads every drop-in into one namespace of aliases: a name two files define
is ``Alias "..." already defined``, printed on stderr by every sudo run (the
daemon's call then fails on that stderr) while sudo still answers. So each
drop-in's names carry its own ``namespace``, a digest of its account and target,
and the proof reads the whole installed sudoers as sudo does (``visudo -c``, and
every ``sudo -l``'s stderr): anything either prints is a failure.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sshadapter import __version__
from sshadapter.contract.run_as import RootCommand
from sshadapter.dispatch import policy
from sshadapter.errors import ConfigError

if TYPE_CHECKING:
    from sshadapter.config import Config
    from sshadapter.contract.registry import Operation, Registry
    from sshadapter.inventory.fleet import Inventory

SUDO: Final = "/usr/bin/sudo"
VISUDO: Final = "/usr/sbin/visudo"
SUDOERS_DIR: Final = Path("/etc/sudoers.d")
# A drop-in's file name and the prefix of its aliases: sudo skips file names with a "." or
# ending in "~"; an alias name is an upper-case letter, then upper-case letters, digits, "_".
INSTALL_PREFIX: Final = "sshadapter"
ALIAS_PREFIX: Final = "SSHADAPTER"
# Hex digits of sha256(account, target) in a drop-in's names: 40 bits, so two drop-ins of one
# host (a handful, named by one operator) share them by chance about once in 10**12.
NAMESPACE_HEX_DIGITS: Final = 10
DROP_IN_MODE: Final = 0o440  # visudo -c refuses anything else, and sudo ignores the file
# One sudo or visudo run reads the sudoers files and answers: well under a second; a
# machine that takes longer is broken, and the proof says so instead of hanging.
SUDO_TIMEOUT_SECONDS: Final = 20.0
# sudoers(5) Defaults for these commands: a fixed environment (env_reset, no
# SETENV: a caller cannot pass LD_PRELOAD or PATH through), and no shell escape
# for dynamically linked programs (NOEXEC; it does not bind static ones).
HARDENING: Final = ("env_reset", "!setenv")
OTHER_ACCOUNTS: Final = ("nobody", "root")  # one is not the operation's: it must be refused
# How sudo and visudo start a diagnostic ("FILE:LINE:COLUMN: ...", "Warning: ...", "sudo:
# ..."); the lines after one (the sudoers line it quotes, a caret) are not repeated.
_DIAGNOSTIC: Final = re.compile(r"(Warning: |visudo: |sudo: |>>> )|/\S*:\d+:\d+: ")


@dataclass(frozen=True, slots=True)
class Rule:
    """One operation's sudo rule."""

    operation: str
    alias: str
    command: RootCommand


@dataclass(frozen=True, slots=True)
class Proof:
    """One ``sudo -l`` question and its answer."""

    operation: str
    argv: tuple[str, ...]
    """``-u ACCOUNT -- PROGRAM ARGS...`` as asked."""
    expected: bool
    allowed: bool

    @property
    def ok(self) -> bool:
        return self.expected == self.allowed


@dataclass(frozen=True, slots=True)
class Proved:
    """A drop-in's proof with the whole installed sudoers: it holds when both parts are clean."""

    diagnostics: tuple[str, ...]
    """What visudo -c on /etc/sudoers and each sudo -l printed, one line per problem."""
    proofs: tuple[Proof, ...]

    @property
    def ok(self) -> bool:
        return not self.diagnostics and all(proof.ok for proof in self.proofs)


def namespace(account: str, target: str) -> str:
    """What the file and alias names of the drop-in of ``account`` on ``target`` carry: a
    digest, so another account or target gets other names."""
    seed = hashlib.sha256(f"{account}\n{target}".encode()).hexdigest()
    return seed[:NAMESPACE_HEX_DIGITS]


def install_path(account: str, target: str) -> Path:
    """Where the drop-in of ``account`` on ``target`` is installed (one per pair)."""
    return SUDOERS_DIR / f"{INSTALL_PREFIX}-{target}-{namespace(account, target)}"


def rules(operations: Iterable[Operation], account: str, target: str) -> list[Rule]:
    """The rule of each ``run_as`` operation, by name, its alias in the drop-in's namespace."""
    prefix = f"{ALIAS_PREFIX}_{namespace(account, target).upper()}_"
    return [
        Rule(op.name, prefix + op.name.upper(), op.root)
        for op in sorted(operations, key=lambda op: op.name)
        if op.root is not None
    ]


@dataclass(frozen=True, slots=True)
class Target:
    """What one drop-in serves: a dispatch host alias, or a group whose dispatch members
    run the same operations and log in as one account."""

    account: str
    rules: tuple[Rule, ...]
    policy_digest: str
    """The digest of the policy the target installs (its group policy, for a group)."""


def target_of(
    name: str,
    config: Config,
    registry: Registry,
    inventory: Inventory,
    policies: dict[str, dict[str, object]],
    where: str,
) -> Target:
    """The drop-in's account, rules and policy digest for host alias or group ``name``, or
    ConfigError (``where`` names the configuration): it has no dispatch host, or its
    members log in as several accounts (one drop-in serves one)."""
    if inventory.is_group(name):
        document = policy.group_policy(name, registry, inventory)
        members = [m for m in inventory.members(name) if m in policies]
    else:
        document = policies.get(name, {})
        members = [name] if name in policies else []
    if not members:
        raise ConfigError(where, f"hosts.{name}", "no dispatch host of that name or group")
    accounts = sorted({config.hosts[m].user for m in members})
    if len(accounts) > 1:
        raise ConfigError(
            where,
            f"groups.{name}",
            f"members log in as {', '.join(accounts)}: one drop-in serves one account",
        )
    account = accounts[0]
    placed = policy.operations_by_host(registry.operations.values(), members[:1], inventory)
    found = rules(placed[members[0]], account, name)
    return Target(account, tuple(found), str(document["digest"]))


def drop_in(target: str, account: str, found: Sequence[Rule], policy_digest: str) -> str:
    """The drop-in text for ``account`` (the dispatch host's login) on ``target``."""
    lines = [
        f"# sshadapter {__version__}: sudo rules of {target}'s root operations, for {account}.",
        f"# Install as {install_path(account, target)}, owner root, mode 0440; check with",
        "# visudo -c -f FILE and sshadapter sudoers --check. It matches the dispatch policy",
        f"# {policy_digest}: install both together.",
    ]
    for rule in found:
        arguments = rule.command.arguments or '""'
        lines += [
            f"Cmnd_Alias {rule.alias} = {rule.command.program} {arguments}",
            f"Defaults!{rule.alias} {', '.join(HARDENING)}",
            f"{account} ALL = ({rule.command.account}) NOPASSWD:NOEXEC: {rule.alias}",
        ]
    return "\n".join(lines) + "\n"


def visudo_check(text: str) -> tuple[bool, str]:
    """``visudo -c -f`` on the drop-in: (passed, what it said, one line)."""
    with _written(text, Path(tempfile.gettempdir()), "sshadapter-sudoers-") as path:
        done = _run([VISUDO, "-c", "-f", str(path)])
    return done.returncode == 0, "; ".join(diagnostics([done.stderr + done.stdout]))


def stale(text: str, path: Path) -> bool:
    """Whether ``path`` holds another drop-in than ``text``: one the proof cannot sit beside
    (the same names, defined twice)."""
    try:
        return path.read_bytes() != text.encode()
    except FileNotFoundError:
        return False


def prove(text: str, account: str, found: Sequence[Rule], install: Path) -> Proved:
    """Every question of the proof, asked of this machine's sudo with the drop-in installed
    beside every other (at ``install`` if it is there already, else under a temporary name
    in /etc/sudoers.d, removed afterwards), and what sudo and visudo said of the whole."""
    with _installed(text, install):
        said = [_whole_sudoers()]
        proofs = []
        for rule in found:
            for argv, expected in questions(rule.command):
                done = _run([SUDO, "-n", "-l", "-U", account, *argv])
                said.append(done.stderr)
                proofs.append(Proof(rule.operation, argv, expected, done.returncode == 0))
    return Proved(diagnostics(said), tuple(proofs))


def diagnostics(said: Iterable[str]) -> tuple[str, ...]:
    """The distinct diagnostics in what sudo or visudo printed on stderr, one line each."""
    found: dict[str, None] = {}
    for text in said:
        lines = text.splitlines()
        starts = [line for line in lines if _DIAGNOSTIC.match(line)]
        for line in starts or lines[:1]:  # an unknown form: its first line stands for it
            found[line.strip()] = None
    return tuple(found)


def _whole_sudoers() -> str:
    """What ``visudo -c`` says of /etc/sudoers with every file it includes (its stdout
    only lists the files parsed): anything on stderr, or a refusal."""
    done = _run([VISUDO, "-c"])
    if done.returncode != 0 and not done.stderr.strip():
        return f"visudo: visudo -c exits {done.returncode} on the installed sudoers"
    return done.stderr


def questions(command: RootCommand) -> Iterator[tuple[tuple[str, ...], bool]]:
    """(``-u ACCOUNT -- PROGRAM ARGS...``, must it be allowed) for one rule."""

    def ask(args: Sequence[str], account: str = command.account) -> tuple[str, ...]:
        return ("-u", account, "--", command.program, *args)

    for args in command.examples:
        yield ask(args), True
    first = list(command.examples[0])
    yield ask([*first, "x"]), False
    for other in OTHER_ACCOUNTS:
        if other != command.account:
            yield ask(first, other), False
            break
    if first:
        yield ask(first[:-1]), False
        yield ask([]), False
    for index, value in enumerate(first):
        changes = [f"{value} x", f"{value}\tx", f"{value}#", f"{value};"]
        if index in command.literal:
            changes.append(value + "x")
        for change in changes:
            yield ask([*first[:index], change, *first[index + 1 :]]), False


def missing_programs(found: Sequence[Rule]) -> list[str]:
    """Programs not on this machine: sudo -l refuses them whatever the rule says."""
    return sorted({r.command.program for r in found if not os.path.isfile(r.command.program)})


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # Fixed programs (sudo, visudo), an argv list, no shell. What they print quotes file names
    # and sudoers lines, any bytes: kept (surrogateescape), for shown() to escape.
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="surrogateescape",
        timeout=SUDO_TIMEOUT_SECONDS,
        stdin=subprocess.DEVNULL,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )


@contextmanager
def _installed(text: str, install: Path) -> Iterator[None]:
    """The drop-in where sudo reads it: already at ``install``, else beside it meanwhile."""
    if install.is_file() and not stale(text, install):
        yield
        return
    with _written(text, SUDOERS_DIR, f"{install.name}-check-"):
        yield


@contextmanager
def _written(text: str, directory: Path, prefix: str) -> Iterator[Path]:
    """``text`` in a new file of ``directory`` (mode 0440, a name sudo reads), then gone."""
    fd, name = tempfile.mkstemp(prefix=prefix, dir=directory)
    path = Path(name)
    try:
        os.fchmod(fd, DROP_IN_MODE)  # before the text: sudo never sees it with other modes
        with os.fdopen(fd, "w") as out:
            out.write(text)
        yield path
    finally:
        path.unlink(missing_ok=True)
