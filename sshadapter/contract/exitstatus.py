"""Stage 6: what an exit status means, by the status alone or, where declared, by stderr.

Reference: docs/command-files.md "exit_codes" and docs/protocol.md "Stages" (6). Many tools use
one status for "the thing does not exist" and for "I failed" (findmnt exits 1
both when nothing is mounted at the target, silently, and on a usage error; df
exits 1 for a missing path and for a permission or NFS error). A declared code
must never state a false fact, so such a status may name a test on stderr and
two meanings: ``then`` when stderr passes the test, ``otherwise`` when it does
not. Success is still decided by the exit status alone: stderr only ever
chooses between failure codes (``commandfile`` refuses ``success`` there).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, NamedTuple

from sshadapter.contract.linear_regex import LinearPattern

# How a dispatch host's sshadapter-dispatch says no (docs/dispatcher.md): this status and one
# stderr line starting so. Recognised before the operation's own exit statuses are read; the
# host's program keeps its own copy (tests/dispatch/test_dispatch.py holds them equal).
REFUSED_STATUS: Final = 77  # sysexits.h EX_NOPERM
REFUSAL_PREFIX: Final = b"sshadapter-dispatch: refused"


class ExitMeaning(NamedTuple):
    """What one attempt's exit status means, and why (for the audit detail)."""

    meaning: str
    """`success` or an error code."""
    because: str
    """Empty for a plain status; otherwise which stderr case applied."""


@dataclass(frozen=True, slots=True)
class ByStderr:
    """An exit status whose meaning is ``then`` when stderr passes ``test``, else ``otherwise``."""

    test: Literal["empty"] | LinearPattern
    """`empty`: stderr has no byte at all. A pattern (linear time: stderr is untrusted
    too): it matches the whole of stderr (less one final newline, as `pattern` does for
    stdout); stderr that is not UTF-8 never matches."""
    then: str
    otherwise: str

    def meaning(self, stderr: bytes) -> ExitMeaning:
        if self.test == "empty":
            passed = not stderr
            because = "stderr empty" if passed else "stderr not empty"
        else:
            passed = _matches(self.test, stderr)
            because = "stderr matches" if passed else "stderr does not match"
        return ExitMeaning(self.then if passed else self.otherwise, because)


def _matches(pattern: LinearPattern, stderr: bytes) -> bool:
    try:
        stderr.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return pattern.matches(stderr.removesuffix(b"\n"))


@dataclass(frozen=True, slots=True)
class ExitCodes:
    """An operation's declared exit statuses; any other status is undeclared."""

    table: Mapping[int, str | ByStderr]

    def meaning(self, status: int | None, stderr: bytes) -> ExitMeaning | None:
        """The meaning of ``status`` given ``stderr``; None when the status is undeclared."""
        entry = None if status is None else self.table.get(status)
        if entry is None:
            return None
        if isinstance(entry, ByStderr):
            return entry.meaning(stderr)
        return ExitMeaning(entry, "")
