"""The argv template of an operation: placeholders filled, every element quoted once.

Contract: docs/command-files.md "argv". A template element is literal text and
``{name}`` placeholders (``{{`` and ``}}`` are literal braces). Filling it
renders each argument as text and shell-quotes the whole element exactly once
(``shlex.quote``), so the remote shell (or the host's dispatcher, which splits
with ``shlex`` in POSIX mode) sees exactly the argv the template describes, and
no argument can add, remove or reinterpret an element.

This is the security-critical half of a command file: nothing else builds the
string that goes to the remote side, and nothing is sent that no remote
command could receive: a NUL byte (sshd refuses an exec request holding one
and drops the whole connection, every other call on it included; execve could
not pass it on anyway) or a command longer than ``MAX_COMMAND_BYTES``. Those
are the caller's mistakes (``RequestError``), refused before anything runs.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sshadapter.errors import ConfigError, RequestError

# The longest command string ever sent. The remote shell gets it as one argument
# (`sh -c COMMAND`), and Linux refuses a single argument over MAX_ARG_STRLEN
# (128 KiB) with E2BIG; sshd refuses packets over 256 KiB by dropping the
# connection. 64 KiB is far above any real operation and far below both.
MAX_COMMAND_BYTES: Final = 64 * 1024

_PLACEHOLDER: Final = re.compile(r"\{\{|\}\}|\{([a-z][a-z0-9_]*)\}|[{}]")


@dataclass(frozen=True, slots=True)
class ArgvElement:
    """One argv element: literal text and placeholders, quoted once as a whole."""

    parts: tuple[tuple[bool, str], ...]
    """(is_placeholder, text-or-name) in order."""

    def fill(self, args: Mapping[str, Any]) -> str:
        return "".join(render(args[text]) if is_param else text for is_param, text in self.parts)

    @property
    def literal(self) -> str | None:
        """The element's text when it has no placeholder, else None."""
        if any(is_param for is_param, _ in self.parts):
            return None
        return "".join(text for _, text in self.parts)


@dataclass(frozen=True, slots=True)
class ArgvTemplate:
    """The whole argv of an operation."""

    elements: tuple[ArgvElement, ...]
    _quoted: tuple[str | None, ...] = field(init=False, repr=False, compare=False)
    """Literal elements quoted once at load; None where a placeholder is filled per call."""

    def __post_init__(self) -> None:
        quoted = tuple(
            None if (text := element.literal) is None else shlex.quote(text)
            for element in self.elements
        )
        object.__setattr__(self, "_quoted", quoted)

    @property
    def placeholders(self) -> frozenset[str]:
        return frozenset(
            text for element in self.elements for is_param, text in element.parts if is_param
        )

    def argv(self, args: Mapping[str, Any]) -> list[str]:
        """The argv the remote program receives, unquoted."""
        return [element.fill(args) for element in self.elements]

    def command(self, args: Mapping[str, Any]) -> str:
        """The exact remote command string: every element shell-quoted once.

        Raises RequestError when no remote command could receive it (see above).
        """
        text = " ".join(
            quoted if quoted is not None else shlex.quote(element.fill(args))
            for element, quoted in zip(self.elements, self._quoted, strict=True)
        )
        if "\x00" in text:  # only an argument can hold one: literals are checked at load
            names = sorted(n for n, v in args.items() if isinstance(v, str) and "\x00" in v)
            raise RequestError("unsendable_argument", f"NUL byte in {', '.join(names)}")
        if len(text) * 4 > MAX_COMMAND_BYTES and len(text.encode()) > MAX_COMMAND_BYTES:
            raise RequestError(
                "command_too_long", f"{len(text.encode())} bytes > {MAX_COMMAND_BYTES}"
            )
        return text


def render(value: Any) -> str:
    """An argument as the text that goes into its element."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():  # JSON Schema: 5.0 is the integer 5
        return str(int(value))
    return str(value)


def parse_template(file: str, argv: Sequence[str]) -> ArgvTemplate:
    """The template of a command file's ``argv``, or ConfigError naming the element."""
    for index, element in enumerate(argv):
        if "\x00" in element:
            raise ConfigError(file, f"argv[{index}]", "holds a NUL byte: no command receives it")
    template = ArgvTemplate(tuple(_parse_element(file, i, e) for i, e in enumerate(argv)))
    fixed = sum(len(e.encode()) for e in argv) + len(argv)
    if fixed > MAX_COMMAND_BYTES:
        raise ConfigError(
            file, "argv", f"longer than {MAX_COMMAND_BYTES} bytes before any argument"
        )
    return template


def _parse_element(file: str, index: int, element: str) -> ArgvElement:
    parts: list[tuple[bool, str]] = []
    literal = ""
    position = 0
    for match in _PLACEHOLDER.finditer(element):
        literal += element[position : match.start()]
        position = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            literal += token[0]
        elif match.group(1) is None:
            raise ConfigError(
                file,
                f"argv[{index}]",
                "stray brace: write {{ or }} for a literal brace, {name} for a parameter",
            )
        else:
            if literal:
                parts.append((False, literal))
                literal = ""
            parts.append((True, match.group(1)))
    literal += element[position:]
    if literal or not parts:
        parts.append((False, literal))
    return ArgvElement(tuple(parts))
