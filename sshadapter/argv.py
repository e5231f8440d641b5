"""The argv template of an operation: placeholders filled, every element quoted once.

Contract: docs/command-files.md "argv". A template element is literal text and
``{name}`` placeholders (``{{`` and ``}}`` are literal braces). Filling it
renders each argument as text and shell-quotes the whole element exactly once
(``shlex.quote``), so the remote shell (or the host's dispatcher, which splits
with ``shlex`` in POSIX mode) sees exactly the argv the template describes, and
no argument can add, remove or reinterpret an element.

This is the security-critical half of a command file: nothing else builds the
string that goes to the remote side.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from sshadapter.errors import ConfigError

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
        """The exact remote command string: every element shell-quoted once."""
        return " ".join(
            quoted if quoted is not None else shlex.quote(element.fill(args))
            for element, quoted in zip(self.elements, self._quoted, strict=True)
        )


def render(value: Any) -> str:
    """An argument as the text that goes into its element."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():  # JSON Schema: 5.0 is the integer 5
        return str(int(value))
    return str(value)


def parse_template(file: str, argv: Sequence[str]) -> ArgvTemplate:
    """The template of a command file's ``argv``, or ConfigError naming the element."""
    return ArgvTemplate(tuple(_parse_element(file, i, e) for i, e in enumerate(argv)))


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
