"""Operator patterns that run on untrusted text: compiled by RE2, linear in the input.

Python's ``re`` backtracks: a pattern such as ``^(?P<x>(\\S+ ?)+)$`` takes time
exponential in the length of a line that almost matches (26 bytes: seconds;
each byte doubles it), and a command's output is chosen by whoever controls the
host. Every operator-written pattern applied to output (extractor ``pattern``,
``header``, ``row``) is therefore compiled by RE2 (google-re2), whose matching
time is linear in the input whatever the pattern. What RE2 cannot do in linear
time it refuses to compile (lookaround, backreferences, possessive and atomic
groups, repetition counts over 1000): a load-time error naming the file, the
key and the construct. Parameter and schema patterns go through jsonschema-rs
with its linear engine (``schemas.PATTERN_OPTIONS``).

Syntax differences from Python ``re`` that operators meet (docs/command-files.md
"Patterns"): ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are ASCII-only; ``\\Z`` is written
``\\z``; there is no lookaround and no backreference.

The binding: google-re2's ``_re2.RE2.Match`` returns byte spans in one call; its
public ``re2`` module wraps that in Python (about 4x the cost per line, the
difference between a 10,000-line table costing 20 ms or 60 ms). The fast path
uses the binding and is pinned to the google-re2 versions the project is tested
with (pyproject.toml); if the binding ever changes shape, ``FAST_PATH`` is False
and the public module is used, slower but with the same results
(tests/contract/test_linear_regex.py fails loudly when that happens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import re2


def _find_binding() -> tuple[Any, Any]:
    """google-re2's pybind11 module and its ANCHOR_BOTH, or (None, None) if its shape changed."""
    try:
        from re2 import _re2 as binding
    except ImportError:  # pragma: no cover - only with an unexpected google-re2
        return None, None
    names = ("Match", "NamedCapturingGroups", "NumberOfCapturingGroups", "ok", "error")
    rx = getattr(binding, "RE2", None)
    anchor = getattr(getattr(rx, "Anchor", None), "ANCHOR_BOTH", None)
    if rx is None or anchor is None or not all(hasattr(rx, name) for name in names):
        return None, None  # pragma: no cover
    return binding, anchor


_binding, _ANCHOR_BOTH = _find_binding()
FAST_PATH: Final = _binding is not None

# RE2's memory budget per compiled pattern (its default). Past it a match falls back
# from the DFA to the NFA: slower, still linear. Patterns too big for it do not compile.
MAX_PATTERN_MEMORY_BYTES: Final = 8 * 1024 * 1024

Span = tuple[int, int]


class LinearRegexError(ValueError):
    """The pattern is not valid RE2 syntax, or uses a construct RE2 refuses."""


def _options() -> Any:
    options = re2.Options()
    options.log_errors = False  # RE2 would write its own message to stderr as well
    options.max_mem = MAX_PATTERN_MEMORY_BYTES
    options.encoding = re2.Options.Encoding.UTF8
    return options


class LinearPattern:
    """A compiled operator pattern; ``groups`` are its named groups, in order."""

    __slots__ = ("_compiled", "_contiguous", "_fallback", "_indexes", "groups", "pattern")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        encoded = pattern.encode()
        if FAST_PATH:
            compiled = _binding.RE2(encoded, _options())
            if not compiled.ok():
                raise LinearRegexError(compiled.error().decode(errors="replace"))
            named = sorted(compiled.NamedCapturingGroups(), key=lambda item: item[1])
            self._compiled = compiled
            self._fallback = None
        else:  # pragma: no cover - see FAST_PATH
            try:
                self._fallback = re2.compile(encoded, _options())
            except re2.error as exc:
                raise LinearRegexError(str(exc)) from exc
            named = sorted(self._fallback.groupindex.items(), key=lambda item: item[1])
            self._compiled = None
        self.groups: tuple[str, ...] = tuple(
            name.decode() if isinstance(name, bytes) else name for name, _ in named
        )
        self._indexes: tuple[int, ...] = tuple(index for _, index in named)
        # The named groups are groups 1..n, in order: their spans are found[1 : n + 1].
        # Unnamed groups (``( [0-9]+)?``, ``(\\S+ ?)+``) are only structure: never values.
        self._contiguous = self._indexes == tuple(range(1, len(self._indexes) + 1))

    def __repr__(self) -> str:
        return f"LinearPattern({self.pattern!r})"

    def spans(self, data: bytes) -> list[Span] | None:
        """Byte spans of the named groups if the whole of ``data`` matches, else None.

        ``(-1, -1)`` for a group that did not take part in the match.
        """
        if self._compiled is not None:
            found = self._compiled.Match(_ANCHOR_BOTH, data, 0, len(data))
            if found[0][0] < 0:
                return None
            return [found[i] for i in self._indexes]
        assert self._fallback is not None  # pragma: no cover - see FAST_PATH
        match = self._fallback.fullmatch(data)  # pragma: no cover
        if match is None:  # pragma: no cover
            return None
        return [match.span(i) for i in self._indexes]  # pragma: no cover

    def values(self, data: bytes, text: str | None = None) -> list[str | None] | None:
        """The named groups' values of a whole match of ``data`` (``group_values``), or None.

        One value per name of ``groups``, in order; unnamed groups give none. The hot
        path of a table: one call per line.
        """
        if self._compiled is None or not self._contiguous:
            spans = self.spans(data)
            return None if spans is None else group_values(spans, data, text)
        found = self._compiled.Match(_ANCHOR_BOTH, data, 0, len(data))
        if found[0][0] < 0:
            return None
        named = found[1 : 1 + len(self._indexes)]  # unnamed groups after them are left out
        if text is not None:
            return [text[a:b] if a >= 0 else None for a, b in named]
        return [data[a:b].decode() if a >= 0 else None for a, b in named]

    def matches(self, data: bytes) -> bool:
        """Whether the whole of ``data`` matches."""
        return self.spans(data) is not None

    def groupdict(self, data: bytes, text: str | None = None) -> dict[str, str | None] | None:
        """The named groups of a whole match of ``data``, decoded; None if no match.

        ``text``: ``data`` already decoded, when it is ASCII (byte offsets are then
        character offsets, and slicing it saves a decode per group).
        """
        spans = self.spans(data)
        if spans is None:
            return None
        return dict(zip(self.groups, group_values(spans, data, text), strict=True))


def group_values(spans: Sequence[Span], data: bytes, text: str | None) -> list[str | None]:
    """The text of each span (None for a group that did not take part)."""
    if text is not None:
        return [text[a:b] if a >= 0 else None for a, b in spans]
    return [data[a:b].decode() if a >= 0 else None for a, b in spans]


def compile_linear(pattern: str) -> LinearPattern:
    """Compile ``pattern`` with RE2, or raise LinearRegexError naming what RE2 refuses."""
    return LinearPattern(pattern)
