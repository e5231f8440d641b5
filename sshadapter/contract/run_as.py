"""Operations that run as another account (``run_as``): the sudo prefix, and the sudo rule.

Reference: docs/dispatcher.md "Root operations". The daemon sends
``/usr/bin/sudo -n -u ACCOUNT -- PROGRAM ARGS...`` (quoted once like any argv,
argv.py), so the host's dispatcher and its sudoers drop-in both see exactly
one known command. ``sshadapter sudoers`` writes the drop-in from
``RootCommand.arguments``: one POSIX extended regular expression over the
arguments, which sudo (since 1.9.10; Debian 12 ships 1.9.13) matches against
the arguments *joined by single spaces* (sudoers(5) "Wildcards in command
arguments": ``/bin/cat /var/log/messages*`` also allows
``cat /var/log/messages /etc/shadow``).

That join is why this module is strict. Every literal argument and every
value a parameter may take is made of ``VALUE_CHARACTERS`` only (no
whitespace, nothing sudoers or a regex reads specially), so the joined string
has exactly one space between arguments and the expression, which holds
exactly that many spaces, matches the same argument lists the command file
allows, no more (a load error otherwise, naming the parameter). A parameter
says its language in a way written out exactly: a ``pattern`` anchored
``^...$`` in a small subset (literals, classes, ``\\d``, ``\\w``, groups,
alternation inside a group, quantifiers), or an ``enum``/``const``. Class
ranges are written out character by character, so no locale's collation
changes them. One limit stays: sudo cannot see where one argument ends, so
a local user of the account may regroup the same words into other
arguments; through SSH the dispatcher refuses any argv but the template's.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from sshadapter.contract.argv import ArgvElement, ArgvTemplate, render
from sshadapter.errors import ConfigError

SUDO_PROGRAM: Final = "/usr/bin/sudo"
# sudoers(5) "Regular expressions": "limited to 1024 characters".
MAX_SUDO_REGEX_CHARS: Final = 1024
# What a literal argument and a parameter's value may hold: no whitespace (sudo joins the
# arguments with spaces), no "#" (sudoers' comment), none of sudoers' or a regex's special
# characters, ASCII only (a locale could class a byte differently).
VALUE_CHARACTERS: Final = frozenset(string.ascii_letters + string.digits + "_.@+/:=-")
MAX_EXAMPLE_REPEAT: Final = 3  # an example value repeats an unbounded atom this often
_MAX_COUNT: Final = 255  # RE_DUP_MAX in POSIX: a larger {n,m} is not portable ERE
_META: Final = frozenset("\\.^$|()[]{}*+?")
_ESCAPED: Final = _META | {"/", "-"}
_ERE_META: Final = frozenset(".+")  # the VALUE_CHARACTERS a POSIX ERE reads specially
# Bounds sudo's expression could not say beside a pattern (an enum's values are exact).
_INEXACT_KEYWORDS: Final = frozenset(
    {
        "minLength",
        "maxLength",
        "format",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    }
)
_GROUP_NAME: Final = frozenset(string.ascii_letters + string.digits + "_")


def sudo_prefix(account: str) -> tuple[str, ...]:
    """The argv before the operation's own: never a password prompt (``-n``), one account."""
    return (SUDO_PROGRAM, "-n", "-u", account, "--")


@dataclass(frozen=True, slots=True)
class RootCommand:
    """What a sudoers rule for one operation says, and the examples that prove it."""

    account: str
    """The account the command runs as (``run_as``)."""
    program: str
    """The absolute path sudo matches."""
    arguments: str
    """``^...$`` over the space-joined arguments, or ``""`` (sudoers: no arguments at all)."""
    examples: tuple[tuple[str, ...], ...]
    """Argument lists the operation may send (each must be allowed by the rule)."""
    literal: frozenset[int]
    """Indexes of the arguments that are fixed text (no placeholder)."""


# The language of one value, as a small tree: written out as ERE and as examples.
@dataclass(frozen=True, slots=True)
class _Chars:
    chars: frozenset[str]


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    branches: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Repeat:
    node: _Node
    low: int
    high: int | None


_Node = _Chars | _Seq | _Alt | _Repeat


def root_command(
    file: str, account: str, spec_params: Mapping[str, Any], argv: ArgvTemplate
) -> RootCommand:
    """The sudo rule of an operation whose ``argv`` runs as ``account``, or ConfigError
    when sudo's matching could not say exactly what the command file allows."""
    program = argv.elements[0].literal
    if program is None or not program.startswith("/") or not set(program) <= VALUE_CHARACTERS:
        raise ConfigError(
            file, "argv[0]", "with run_as the program is an absolute path (sudoers matches it)"
        )
    languages = {
        name: _param_language(file, f"params.{name}", schema)
        for name, schema in spec_params.items()
    }
    seen: set[str] = set()
    parts: list[str] = []
    element_trees: list[_Node] = []
    for index, element in enumerate(argv.elements[1:], start=1):
        tree = _element_tree(file, index, element, languages, seen)
        element_trees.append(tree)
        parts.append(_ere(tree))
    arguments = f"^{' '.join(parts)}$" if parts else ""
    if len(arguments) > MAX_SUDO_REGEX_CHARS:
        raise ConfigError(
            file,
            "argv",
            f"its sudo rule would be {len(arguments)} characters, over sudoers' "
            f"{MAX_SUDO_REGEX_CHARS}: narrow the parameters' patterns",
        )
    examples = {
        tuple(_example(tree, largest) for tree in element_trees) for largest in (False, True)
    }
    literal = frozenset(i for i, e in enumerate(argv.elements[1:]) if e.literal is not None)
    return RootCommand(account, program, arguments, tuple(sorted(examples)), literal)


def _element_tree(
    file: str, index: int, element: ArgvElement, languages: Mapping[str, _Node], seen: set[str]
) -> _Node:
    items: list[_Node] = []
    for is_param, text in element.parts:
        if is_param:
            if text in seen:
                raise ConfigError(
                    file,
                    f"argv[{index}]",
                    f"with run_as a parameter is used once: sudo cannot check {{{text}}} "
                    "is the same value twice",
                )
            seen.add(text)
            items.append(languages[text])
            continue
        bad = sorted(set(text) - VALUE_CHARACTERS)
        if bad or (not text and len(element.parts) == 1):
            raise ConfigError(
                file,
                f"argv[{index}]",
                f"with run_as a literal argument holds only {_ALLOWED_TEXT} "
                f"(sudo joins arguments with spaces): not {''.join(bad) or 'empty'!r}",
            )
        items.extend(_Chars(frozenset(char)) for char in text)
    return _Seq(tuple(items))


_ALLOWED_TEXT: Final = "letters, digits and _.@+/:=-"


def _param_language(file: str, key: str, schema: Mapping[str, Any]) -> _Node:
    """The exact language of a parameter's rendered value, or ConfigError."""
    kind = schema["type"]
    listed = "enum" in schema or "const" in schema
    for keyword in _INEXACT_KEYWORDS & schema.keys():
        raise ConfigError(
            file,
            f"{key}.{keyword}",
            "with run_as sudo's rule must say the value exactly: give the length in "
            "`pattern` ({n,m}) or list the values in `enum`",
        )
    if kind == "integer" and not listed:
        raise ConfigError(
            file, key, "with run_as an integer parameter lists its values in `enum` or `const`"
        )
    values: list[Any] | None = None
    if "const" in schema:
        values = [schema["const"]]
    elif "enum" in schema:
        values = list(schema["enum"])
    elif kind == "boolean":
        values = [False, True]
    if values is not None:
        if "pattern" in schema:
            raise ConfigError(
                file, f"{key}.pattern", "with run_as give `pattern` or `enum`, not both"
            )
        branches = []
        for value in values:
            text = render(value)
            bad = sorted(set(text) - VALUE_CHARACTERS)
            if bad or not text:
                raise ConfigError(
                    file,
                    f"{key}.enum",
                    f"with run_as a value holds only {_ALLOWED_TEXT}: not {text!r}",
                )
            branches.append(_Seq(tuple(_Chars(frozenset(c)) for c in text)))
        return _Alt(tuple(branches))
    if kind != "string" or "pattern" not in schema:
        raise ConfigError(
            file, key, "with run_as a parameter is an `enum`/`const`, or a string with `pattern`"
        )
    return _parse_pattern(file, f"{key}.pattern", schema["pattern"])


# The pattern subset -------------------------------------------------------------------
# Not dispatch/patterns.py's parser, on purpose: that one reads everything jsonschema-rs
# and Python's re read alike (``.``, ``\s``, ``\uHHHH``, lazy quantifiers, any code point)
# and writes it back out as Python syntax, text to text. This one must know every atom's
# characters as a finite set of VALUE_CHARACTERS, to write a POSIX ERE and the example
# arguments, so it reads a strict subset into a tree and refuses the rest. One parser for
# both would either narrow what a dispatch host accepts or widen what sudo is given.


class _Parser:
    def __init__(self, file: str, key: str, pattern: str) -> None:
        self.file, self.key, self.pattern, self.pos = file, key, pattern, 0

    def peek(self, ahead: int = 0) -> str:
        index = self.pos + ahead
        return self.pattern[index] if index < len(self.pattern) else ""

    def take(self) -> str:
        char = self.peek()
        if not char:
            raise self.fail("the pattern ends too early")
        self.pos += 1
        return char

    def fail(self, what: str) -> ConfigError:
        return ConfigError(
            self.file,
            self.key,
            f"with run_as: {what} at offset {self.pos} (the pattern must be ^...$ of "
            f"{_ALLOWED_TEXT}, classes, \\d, \\w, groups and quantifiers: sudo joins "
            "arguments with spaces)",
        )


def _parse_pattern(file: str, key: str, pattern: str) -> _Node:
    p = _Parser(file, key, pattern)
    if not pattern.startswith("^") or not pattern.endswith("$") or pattern.endswith("\\$"):
        raise p.fail("not anchored as ^...$")
    p.pattern = pattern[:-1]
    p.pos = 1
    branches = _alternation(p)
    if p.pos != len(p.pattern):
        raise p.fail(f"an unbalanced {p.peek()!r}")
    if len(branches.branches) > 1:
        raise p.fail("an alternation outside a group (write ^(a|b)$)")
    return branches.branches[0]


def _alternation(p: _Parser) -> _Alt:
    branches = [_sequence(p)]
    while p.peek() == "|":
        p.take()
        branches.append(_sequence(p))
    return _Alt(tuple(branches))


def _sequence(p: _Parser) -> _Node:
    items: list[_Node] = []
    while p.peek() not in ("", "|", ")"):
        items.append(_quantified(p, _atom(p)))
    if not items:
        raise p.fail("an empty alternative")
    return _Seq(tuple(items))


def _atom(p: _Parser) -> _Node:
    char = p.take()
    if char == "(":
        if p.peek() == "?":
            _group_kind(p)
        inner = _alternation(p)
        if p.take() != ")":
            raise p.fail("an unclosed group")
        return inner
    if char == "[":
        return _class(p)
    if char == "\\":
        return _escape(p)
    if char in VALUE_CHARACTERS and char not in _META:
        return _Chars(frozenset(char))
    raise p.fail(f"{char!r}")


def _group_kind(p: _Parser) -> None:
    for opener in ("?:", "?P<", "?<"):
        if p.pattern.startswith(opener, p.pos):
            p.pos += len(opener)
            if opener == "?:":
                return
            end = p.pattern.find(">", p.pos)
            name = p.pattern[p.pos : end] if end > p.pos else ""
            if not name or not set(name) <= _GROUP_NAME or name[0].isdigit():
                raise p.fail("a group flag or lookaround")
            p.pos = end + 1
            return
    raise p.fail("a group flag or lookaround")


def _escape(p: _Parser) -> _Chars:
    char = p.take()
    if char == "d":
        return _Chars(frozenset(string.digits))
    if char == "w":
        return _Chars(frozenset(string.ascii_letters + string.digits + "_"))
    if char in _ESCAPED and char in VALUE_CHARACTERS:
        return _Chars(frozenset(char))
    raise p.fail(f"the escape \\{char}")


def _class(p: _Parser) -> _Chars:
    if p.peek() == "^":
        raise p.fail("a negated class (it holds whitespace)")
    chars: set[str] = set()
    first = True
    while p.peek() != "]":
        if p.peek() == "-" and (first or p.peek(1) == "]"):
            p.take()
            chars.add("-")
        elif p.peek() == "\\":
            p.take()
            chars |= _escape(p).chars
        else:
            low = p.take()
            if low not in VALUE_CHARACTERS or low == "[":
                raise p.fail(f"{low!r} in a class")
            if p.peek() == "-" and p.peek(1) not in ("]", ""):
                p.take()
                high = p.take()
                if high == "\\":
                    high = next(iter(_escape(p).chars))
                span = {chr(c) for c in range(ord(low), ord(high) + 1)}
                if not span or not span <= VALUE_CHARACTERS:
                    raise p.fail(f"the range {low}-{high} (it holds other characters)")
                chars |= span
            else:
                chars.add(low)
        first = False
    p.take()
    if not chars:
        raise p.fail("an empty class")
    return _Chars(frozenset(chars))


def _quantified(p: _Parser, node: _Node) -> _Node:
    char = p.peek()
    if char in ("*", "+", "?"):
        p.take()
        low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[char]
    elif char == "{":
        p.take()
        low_text = _digits(p)
        high_text: str | None = low_text
        if p.peek() == ",":
            p.take()
            high_text = _digits(p) or None
        if p.take() != "}" or not low_text:
            raise p.fail("a malformed {n,m}")
        low = int(low_text)
        high = None if high_text is None else int(high_text)
        if (high is not None and high < low) or max(low, high or 0) > _MAX_COUNT:
            raise p.fail(f"a repetition outside 0..{_MAX_COUNT} or with m < n")
    else:
        return node
    if p.peek() == "?":  # lazy: the same strings match the whole pattern
        p.take()
    if p.peek() in ("*", "+", "?", "{"):
        raise p.fail("a quantifier on a quantifier")
    return _Repeat(node, low, high)


def _digits(p: _Parser) -> str:
    start = p.pos
    while p.peek().isascii() and p.peek().isdigit():
        p.take()
    return p.pattern[start : p.pos]


# Writing the language out -------------------------------------------------------------


def _ere(node: _Node) -> str:
    """POSIX extended regular expression syntax, no locale-dependent range, no backslash."""
    if isinstance(node, _Chars):
        chars = sorted(node.chars)
        if len(chars) == 1 and chars[0] not in _ERE_META:
            return chars[0]
        # In a bracket expression only "]", "^" (first) and "-" (not at an end) are special:
        # "-" goes last, and the others are not VALUE_CHARACTERS.
        dash = "-" if "-" in node.chars else ""
        return "[" + "".join(c for c in chars if c != "-") + dash + "]"
    if isinstance(node, _Seq):
        return "".join(_ere(item) for item in node.items)
    if isinstance(node, _Alt):
        inner = "|".join(_ere(branch) for branch in node.branches)
        return inner if len(node.branches) == 1 else f"({inner})"
    inner = _ere(node.node)
    alternation = isinstance(node.node, _Alt) and len(node.node.branches) > 1
    if not (isinstance(node.node, _Chars) or alternation):
        inner = f"({inner})"
    if (node.low, node.high) == (0, None):
        return inner + "*"
    if (node.low, node.high) == (1, None):
        return inner + "+"
    if (node.low, node.high) == (0, 1):
        return inner + "?"
    if node.high == node.low:
        return f"{inner}{{{node.low}}}"
    return f"{inner}{{{node.low},{'' if node.high is None else node.high}}}"


def _example(node: _Node, largest: bool) -> str:
    """A string of the language: the shortest choices, or the longest bounded ones."""
    if isinstance(node, _Chars):
        return max(node.chars) if largest else min(node.chars)
    if isinstance(node, _Seq):
        return "".join(_example(item, largest) for item in node.items)
    if isinstance(node, _Alt):
        return _example(node.branches[-1 if largest else 0], largest)
    count = node.low
    if largest:
        count += MAX_EXAMPLE_REPEAT
        count = count if node.high is None else min(node.high, count)
    return "".join(_example(node.node, largest) for _ in range(count))
