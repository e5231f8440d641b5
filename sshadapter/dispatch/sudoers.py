"""The sudoers drop-in of a dispatch host (or group): one rule per ``run_as`` operation, proved.

Reference: docs/dispatcher.md "Root operations". ``sshadapter sudoers TARGET``
prints it; ``--check`` proves it against the sudo of the machine it runs on
(as root, where the dispatch account exists: the host itself, or one like
it). ``visudo -c`` alone proves little: it passes a rule whose regular
expression is invalid, and that rule then never matches (measured with sudo
1.9.13, /work/shared/research/privilege.md A5). So the proof also asks sudo
itself, ``sudo -l -U ACCOUNT -u RUN_AS -- PROGRAM ARGS...`` (exit 0: allowed;
nothing runs), for every example argument list of each operation (each must be
allowed) and for mutations of them (each must be refused): an extra or a
missing argument, a space, a tab, ``#`` or ``;`` inside one, another literal, no
arguments, another target account.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from sshadapter import __version__
from sshadapter.contract.root import RootCommand

if TYPE_CHECKING:
    from sshadapter.contract.registry import Operation

SUDO: Final = "/usr/bin/sudo"
VISUDO: Final = "/usr/sbin/visudo"
SUDOERS_DIR: Final = Path("/etc/sudoers.d")
INSTALL_NAME: Final = "sshadapter"  # sudo skips names with a "." or ending in "~"
DROP_IN_MODE: Final = 0o440  # visudo -c refuses anything else, and sudo ignores the file
# One sudo or visudo run reads the sudoers files and answers: well under a second; a
# machine that takes longer is broken, and the proof says so instead of hanging.
SUDO_TIMEOUT_SECONDS: Final = 20.0
# sudoers(5) Defaults for these commands: a fixed environment (env_reset, no
# SETENV: a caller cannot pass LD_PRELOAD or PATH through), and no shell escape
# for dynamically linked programs (NOEXEC; it does not bind static ones).
HARDENING: Final = ("env_reset", "!setenv")
OTHER_ACCOUNTS: Final = ("nobody", "root")  # one is not the operation's: it must be refused


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


def rules(operations: Iterable[Operation]) -> list[Rule]:
    """The rule of each ``run_as`` operation, by name."""
    return [
        Rule(op.name, "SSHADAPTER_" + op.name.upper(), op.root)
        for op in sorted(operations, key=lambda op: op.name)
        if op.root is not None
    ]


def drop_in(target: str, account: str, found: Sequence[Rule], policy_digest: str) -> str:
    """The drop-in text for ``account`` (the dispatch host's login) on ``target``."""
    lines = [
        f"# sshadapter {__version__}: sudo rules of {target}'s root operations, for {account}.",
        f"# Install as {SUDOERS_DIR / INSTALL_NAME}, owner root, mode 0440; check with",
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
    """``visudo -c -f`` on the drop-in: (passed, what it said)."""
    with _written(text, Path(tempfile.gettempdir()), "sshadapter-sudoers-") as path:
        done = _run([VISUDO, "-c", "-f", str(path)])
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def prove(text: str, account: str, found: Sequence[Rule]) -> list[Proof]:
    """Every question of the proof, asked of this machine's sudo with the drop-in installed
    (under a temporary name in /etc/sudoers.d, removed afterwards)."""
    with _written(text, SUDOERS_DIR, "sshadapter-check-"):
        return [
            Proof(rule.operation, argv, expected, _allowed(account, argv))
            for rule in found
            for argv, expected in questions(rule.command)
        ]


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


def _allowed(account: str, argv: Sequence[str]) -> bool:
    return _run([SUDO, "-n", "-l", "-U", account, *argv]).returncode == 0


def missing_programs(found: Sequence[Rule]) -> list[str]:
    """Programs not on this machine: sudo -l refuses them whatever the rule says."""
    return sorted({r.command.program for r in found if not os.path.isfile(r.command.program)})


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    # Fixed programs (sudo, visudo), an argv list, no shell.
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=SUDO_TIMEOUT_SECONDS,
        stdin=subprocess.DEVNULL,
        check=False,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"},
    )


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
