"""A parameter's ``pattern``, rewritten for the host's dispatcher with the daemon's meaning.

Reference: docs/dispatcher.md "Patterns". The daemon checks ``pattern`` with
jsonschema-rs: an ECMA-262 pattern translated onto Rust's ``regex`` (``$`` is
the end of the text, ``\\d`` is ``[0-9]``, ``.`` excludes line terminators).
The dispatcher has only Python's ``re``, where ``$`` also matches before a
final newline (``^/[a-z]*$`` accepts ``"/\\n"``), ``\\d`` and ``\\w`` are
Unicode classes, and class syntax differs (``[[:alpha:]]``, ``[a&&b]``).

So the policy never carries an operator's pattern as written. ``translate``
parses it in the constructs both engines read alike, refuses everything else
(ValueError naming the construct), and writes the same language out in
explicit Python syntax: ``\\A``/``\\Z`` anchors, ``[0-9]`` for ``\\d``,
``[A-Za-z0-9_]`` for ``\\w``, ECMA-262's white space for ``\\s``,
``[^\\n\\r\\u2028\\u2029]`` for ``.``, groups without captures or names, every
escaped character as itself. tests/dispatch/test_dispatch_patterns.py holds the
rewritten pattern under Python's ``re`` equal to jsonschema-rs (with its
default engine and with ``RegexOptions``) on the shipped patterns, on a table
of every supported escape and on random patterns and strings.

Supported: literals, ``\\`` before a metacharacter or ``/``, ``\\n \\t \\r \\f
\\v \\xHH \\uHHHH \\u{H...} \\cX``, ``\\d \\D \\w \\W \\s \\S``, ``.``, ``^``,
``$``, classes ``[...]`` and ``[^...]`` of characters, ranges, ``\\d``, ``\\w``
and ``\\s``, groups ``(...)``, ``(?:...)``, ``(?<name>...)`` and
``(?P<name>...)``, ``|``, and one quantifier per atom (``* + ? {n} {n,}
{n,m}``, optionally lazy). Refused, because the engines read them
differently or one of them not at all: ``\\b \\B`` (word boundaries: Unicode
word characters differ), lookaround and backreferences (not in Rust's
``regex``), flags such as ``(?i)`` (case folding differs), ``\\p`` (not in
Python's ``re``), ``\\0``, a surrogate ``\\uD800``-``\\uDFFF`` (no JSON string
holds one alone), ``\\D \\W \\S`` inside a class, a quantifier on a quantifier
or an anchor, and unescaped ``] } {`` or a ``[``, ``&&``, ``--`` or ``~~``
inside a class (Rust reads them as class syntax).

contract/run_as.py parses a narrower subset of the same syntax for ``run_as``
(a tree of character sets, for sudo's POSIX expression): its comment says why
the two parsers stay two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MAX_REPEAT: Final = 1000  # a counted repetition beyond this is not a parameter's pattern
MAX_PATTERN_CHARS: Final = 4096  # a hand-written parameter pattern is short

# ECMA-262 `.` (and jsonschema-rs's): anything but the line terminators.
_DOT: Final = "[^\\n\\r\\u2028\\u2029]"
_DIGIT: Final = "0-9"
_WORD: Final = "A-Za-z0-9_"
# ECMA-262 `\s` (WhiteSpace and LineTerminator), which jsonschema-rs keeps: not Python's
# Unicode `\s` (that one has \x1c-\x1f and \x85 and lacks \ufeff).
_SPACE: Final = (
    "\\t\\n\\x0b\\x0c\\r\\x20\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
)
_CLASS_ESCAPES: Final = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_MAX_CODE_POINT: Final = 0x10FFFF
_SURROGATES: Final = range(0xD800, 0xE000)  # no JSON string holds one alone: never a value
_GROUP_NAME_FIRST: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_GROUP_NAME_REST: Final = _GROUP_NAME_FIRST | frozenset("0123456789")
_META: Final = frozenset("\\.^$|()[]{}*+?")
_ESCAPABLE: Final = _META | {"/", "-"}
_CONTROL_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v"}
_HEX: Final = frozenset("0123456789abcdefABCDEF")


@dataclass
class _Parser:
    pattern: str
    pos: int = 0

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.pattern[index] if index < len(self.pattern) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise ValueError("the pattern ends too early")
        self.pos += 1
        return char

    def fail(self, what: str) -> ValueError:
        return ValueError(f"{what} at offset {self.pos} is not supported on a dispatch host")


def translate(pattern: str) -> str:
    """The Python ``re`` pattern that accepts exactly what jsonschema-rs accepts for ``pattern``.

    Raises ValueError saying which construct is outside the subset.
    """
    if len(pattern) > MAX_PATTERN_CHARS:
        raise ValueError(f"longer than {MAX_PATTERN_CHARS} characters")
    parser = _Parser(pattern)
    out = _alternation(parser)
    if parser.pos != len(pattern):
        raise parser.fail(f"unbalanced {parser.peek()!r}")
    return out


def _alternation(p: _Parser) -> str:
    branches = [_sequence(p)]
    while p.peek() == "|":
        p.take()
        branches.append(_sequence(p))
    return "|".join(branches)


def _sequence(p: _Parser) -> str:
    out = []
    while p.peek() not in ("", "|", ")"):
        atom, quantifiable = _atom(p)
        quantifier = _quantifier(p)
        if quantifier and not quantifiable:
            raise p.fail("a quantifier on an anchor")
        out.append(atom + quantifier)
    return "".join(out)


def _atom(p: _Parser) -> tuple[str, bool]:
    """One atom in Python syntax, and whether a quantifier may follow it."""
    char = p.take()
    if char == "^":
        return "\\A", False
    if char == "$":
        return "\\Z", False
    if char == ".":
        return _DOT, True
    if char == "(":
        if p.peek() == "?":
            _group_kind(p)
        inner = _alternation(p)
        if p.peek() != ")":
            raise p.fail("an unclosed group")
        p.take()
        return f"(?:{inner})", True
    if char == "[":
        return _class(p), True
    if char == "\\":
        return _escape(p, in_class=False), True
    if char in "*+?{":
        raise p.fail(f"a quantifier {char!r} with nothing to repeat")
    if char in "]})":
        raise p.fail(f"an unescaped {char!r}")
    return _literal(p, char), True


def _group_kind(p: _Parser) -> None:
    """Past ``?:``, ``?<name>`` or ``?P<name>`` (a name changes nothing the engines match);
    ValueError on a flag or lookaround."""
    for opener in ("?:", "?<", "?P<"):
        if p.pattern.startswith(opener, p.pos):
            break
    else:
        raise p.fail("a group flag or lookaround")
    if opener == "?<" and p.peek(2) in ("=", "!"):
        raise p.fail("a group flag or lookaround")
    p.pos += len(opener)
    if opener == "?:":
        return
    start = p.pos
    end = p.pattern.find(">", start)
    name = p.pattern[start:end] if end >= 0 else ""
    if not name or name[0] not in _GROUP_NAME_FIRST or not set(name) <= _GROUP_NAME_REST:
        raise p.fail("a named group whose name is not an identifier")
    p.pos = end + 1


def _literal(p: _Parser, char: str) -> str:
    if ord(char) < 0x20 or ord(char) == 0x7F:
        raise p.fail("a raw control character (write \\n, \\t or \\xHH)")
    return _code(char)


def _escape(p: _Parser, *, in_class: bool) -> str:
    """The escape after a backslash, as Python syntax (inside a class: class items only)."""
    char = p.take()
    if char in _CLASS_ESCAPES:
        inner = _CLASS_ESCAPES[char]
        return inner if in_class else f"[{inner}]"
    if char.lower() in _CLASS_ESCAPES and not in_class:
        return f"[^{_CLASS_ESCAPES[char.lower()]}]"
    return _code(_escaped_char(p, char))


def _escaped_char(p: _Parser, char: str) -> str:
    """The one character an escape stands for, or ValueError."""
    if char in _ESCAPABLE:
        return char
    if char in _CONTROL_ESCAPES:
        return _CONTROL_ESCAPES[char]
    if char == "x" and p.peek() in _HEX and p.peek(1) in _HEX and p.peek():
        value = chr(int(p.pattern[p.pos : p.pos + 2], 16))
        p.pos += 2
        return value
    if char == "u":
        return _unicode_escape(p)
    if char == "c" and p.peek().isascii() and p.peek().isalpha():
        return chr(ord(p.take()) % 32)  # ECMA-262's control escape: \cJ is \n
    p.pos -= 1
    raise p.fail(f"the escape \\{char}")


def _unicode_escape(p: _Parser) -> str:
    """After ``\\u``: ECMA-262's ``HHHH``, or ``{H...}`` as jsonschema-rs reads it too."""
    start = p.pos - 2
    if p.peek() == "{":
        end = p.pattern.find("}", p.pos)
        digits = p.pattern[p.pos + 1 : end] if end >= 0 else ""
        after = end + 1
    else:
        digits = p.pattern[p.pos : p.pos + 4]
        after = p.pos + 4
        if len(digits) != 4:
            digits = ""
    if not digits or not set(digits) <= _HEX or len(digits) > 6:
        p.pos = start
        raise p.fail("the escape \\u without its hexadecimal digits")
    value = int(digits, 16)
    if value > _MAX_CODE_POINT or value in _SURROGATES:
        p.pos = start
        raise p.fail(f"the escape \\u{digits} (a surrogate or beyond Unicode)")
    p.pos = after
    return chr(value)


def _code(char: str) -> str:
    """One character, written so Python reads it as itself in and out of a class.

    A backslash before ASCII punctuation is always that character in Python's
    ``re``; space and control characters are written ``\\xHH``.
    """
    if (char.isascii() and char.isalnum()) or char in "_/" or ord(char) > 0x7F:
        return char
    if 0x20 < ord(char) < 0x7F:
        return "\\" + char
    return f"\\x{ord(char):02x}"


def _class_char(p: _Parser) -> str:
    """One character of a class (for ranges); ValueError on anything else."""
    char = p.take()
    if char == "\\":
        escaped = p.take()
        if escaped in "dwDWsS":
            p.pos -= 1
            raise p.fail(f"the class escape \\{escaped} as a range end")
        return _escaped_char(p, escaped)
    if char == "[":
        raise p.fail("an unescaped '[' inside a class")
    if ord(char) < 0x20 or ord(char) == 0x7F:
        raise p.fail("a raw control character in a class")
    return char


def _class(p: _Parser) -> str:
    negated = p.peek() == "^"
    if negated:
        p.take()
    items: list[str] = []
    first = True
    while p.peek() != "]":
        if not p.peek():
            raise p.fail("an unclosed class")
        for operator in ("&&", "--", "~~"):
            if p.pattern.startswith(operator, p.pos):
                raise p.fail(f"{operator!r} inside a class")
        if p.peek() == "-" and not first and p.peek(1) != "]":
            raise p.fail("a '-' that is neither a range nor at an end of the class")
        if p.peek() == "\\" and p.peek(1) in _CLASS_ESCAPES:
            p.pos += 1
            items.append(_escape(p, in_class=True))
            first = False
            continue
        if p.peek() == "\\" and p.peek(1) in "DWSbB":
            p.pos += 1
            raise p.fail(f"the class escape \\{p.peek()}")
        low = _class_char(p)
        if p.pattern.startswith("--", p.pos):
            raise p.fail("'--' inside a class")
        if p.peek() == "-" and p.peek(1) not in ("]", ""):
            p.take()
            high = _class_char(p)
            if ord(high) < ord(low):
                raise p.fail("a range whose end is before its start")
            items.append(f"{_code(low)}-{_code(high)}")
        else:
            items.append(_code(low))
        first = False
    p.take()
    if not items:
        raise p.fail("an empty class")
    return f"[{'^' if negated else ''}{''.join(items)}]"


def _quantifier(p: _Parser) -> str:
    char = p.peek()
    if char in ("*", "+", "?"):
        p.take()
        out = char
    elif char == "{":
        out = _counted(p)
    else:
        return ""
    if p.peek() == "?":
        p.take()
        out += "?"
    if p.peek() in ("*", "+", "?", "{"):
        raise p.fail("a quantifier on a quantifier")
    return out


def _counted(p: _Parser) -> str:
    p.take()
    low = _number(p)
    high: int | None = low
    if p.peek() == ",":
        p.take()
        high = _number(p) if p.peek() != "}" else None
    if p.peek() != "}":
        raise p.fail("a malformed {n,m}")
    p.take()
    if low is None or (high is not None and high < low):
        raise p.fail("a repetition {n,m} with m < n or without n")
    if max(low, high or 0) > MAX_REPEAT:
        raise p.fail(f"a repetition count over {MAX_REPEAT}")
    if high == low:
        return f"{{{low}}}"
    return f"{{{low},{'' if high is None else high}}}"


def _number(p: _Parser) -> int | None:
    start = p.pos
    while p.peek().isascii() and p.peek().isdigit():
        p.take()
    digits = p.pattern[start : p.pos]
    if len(digits) > 4:
        raise p.fail("a repetition count over 9999")
    return int(digits) if digits else None
