"""A command file's parameters: the keywords they may use, their closed schema, their warnings,
and the hint an agent gets when its arguments fail that schema.

Reference: docs/command-files.md "params". Every string parameter is constrained
(a ``pattern`` or an ``enum``), every integer bounded, and no keyword opens a schema
further; a parameter that admits a NUL byte is only warned about, since every call with
one is refused anyway (argv.py). A parameter of an operation that needs approval must
admit no control character (``SCREEN_CONTROLS``: C0, DEL, C1, the line separators, the
bidi controls): the approver reads the command it is part of, and such a character can
make a screen show another one.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from sshadapter.contract.argv import ArgvTemplate
from sshadapter.contract.codes import HINT_PARAMETER_PATTERN, HINT_RULES
from sshadapter.contract.commandfile import CommandFile
from sshadapter.contract.schemas import DRAFT_2020_12, pattern_refusal
from sshadapter.errors import ConfigError

# The parser and constants of `re` itself (see admits); untyped private modules.
_sre_parser: Any = importlib.import_module("re._parser")
_sre_constants: Any = importlib.import_module("re._constants")

# What an argument of an operation that needs approval must not hold: what a terminal acts
# on or reorders, so that the command an approver reads is the one that runs. C0 (ESC, CR,
# LF among them), DEL, C1 (CSI among them), the line and paragraph separators, and every
# Unicode Bidi_Control character (the marks, embeddings, overrides and isolates,
# CVE-2021-42574).
SCREEN_CONTROLS: Final = frozenset(
    [
        *range(0x00, 0x20),
        0x7F,
        *range(0x80, 0xA0),
        0x061C,
        0x200E,
        0x200F,
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    ]
)
# Where the two readers of a pattern differ on a control character: Python's `re` (which
# parses it here) calls U+001C-U+001F whitespace, the Rust engine (which runs it) does not.
# The analysis takes the reading that admits more.
_SPACES_IN_BOTH: Final = frozenset(map(ord, "\t\n\x0b\x0c\r\x85\u2028\u2029"))
_SPACES_IN_PYTHON: Final = frozenset(range(0x1C, 0x20))


def check_params_used(file: str, spec: CommandFile, argv: ArgvTemplate) -> None:
    """Every placeholder is a declared parameter, and every parameter is used."""
    used = argv.placeholders
    for name in sorted(used - spec.params.keys()):
        raise ConfigError(file, "argv", f"placeholder {{{name}}} is not a declared [params.{name}]")
    for name in sorted(spec.params.keys() - used):
        raise ConfigError(file, f"params.{name}", "parameter is not used in argv")


# Keywords a parameter schema may use: enough to constrain a scalar, nothing that opens it.
PARAM_KEYWORDS: Final = frozenset(
    {
        "type",
        "description",
        "pattern",
        "enum",
        "const",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "format",
    }
)


def params_schema_of(file: str, spec: CommandFile) -> dict[str, Any]:
    """The closed schema a call's arguments are validated against, or ConfigError (for an
    operation that needs approval also when a parameter admits a screen control)."""
    for name, param in spec.params.items():
        key = f"params.{name}"
        for keyword in sorted(param.keys() - PARAM_KEYWORDS):  # a typo must not drop a bound
            raise ConfigError(file, f"{key}.{keyword}", "unknown parameter keyword")
        kind = param.get("type")
        if kind not in ("string", "integer", "boolean"):
            raise ConfigError(file, f"{key}.type", "must be string, integer or boolean")
        if kind == "string" and "pattern" not in param and "enum" not in param:
            raise ConfigError(
                file,
                key,
                "string parameter needs `pattern` or `enum` (free text on purpose: "
                "write the pattern that says so)",
            )
        if kind == "integer" and ("minimum" not in param or "maximum" not in param):
            raise ConfigError(file, key, "integer parameter needs `minimum` and `maximum`")
        pattern = param.get("pattern")
        if isinstance(pattern, str) and (refused := pattern_refusal(pattern)):
            raise ConfigError(file, f"{key}.pattern", refused)
        if spec.approval.required:
            _refuse_screen_controls(file, key, param)
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "properties": dict(spec.params),
        "required": sorted(spec.params),
        "additionalProperties": False,
    }


def param_warnings(spec: CommandFile) -> Iterator[tuple[str, str]]:
    """Parameters whose schema admits a NUL byte, which is refused at every call anyway."""
    for name, param in spec.params.items():
        pattern = param.get("pattern")
        if (isinstance(pattern, str) and admits(pattern, _NUL)) or _listed(param, _NUL):
            yield (
                f"params.{name}",
                "admits a NUL byte, which no remote command can receive: every call with one "
                "is refused (INVALID_REQUEST, unsendable_argument); say what you mean, e.g. "
                "[^\\x00] or an explicit class instead of `.`",
            )


_NUL: Final = frozenset({0})
_CONTROLS_NAMED: Final = "control characters (C0, DEL, C1, line separators, bidi controls)"


def _refuse_screen_controls(file: str, key: str, param: dict[str, Any]) -> None:
    """ConfigError unless the parameter ``key`` admits no SCREEN_CONTROLS character."""
    pattern = param.get("pattern")
    found = admits(pattern, SCREEN_CONTROLS) if isinstance(pattern, str) else False
    if isinstance(pattern, str) and found is False and not anchored(pattern):
        found = True  # a pattern is searched for: what it does not cover may surround it
    if found is None:
        key, why = f"{key}.pattern", "cannot be read to show that it admits no control character"
    elif found:
        key, why = f"{key}.pattern", f"admits {_CONTROLS_NAMED}"
    elif _listed(param, SCREEN_CONTROLS):
        key, why = key, f"lists a value with one of the {_CONTROLS_NAMED}"
    else:
        return
    raise ConfigError(
        file,
        key,
        f"{why}, and the operation needs approval: the approver could read another command "
        "than the one that runs; write a class that leaves them out (`[a-z0-9._-]`, not `.`, "
        "`\\S` or `[^ ]`)",
    )


def _listed(param: dict[str, Any], chars: frozenset[int]) -> bool:
    """Whether an ``enum`` or ``const`` value of the parameter holds one of ``chars``."""
    values = [*param.get("enum", ()), param.get("const", "")]
    return any(isinstance(v, str) and any(ord(ch) in chars for ch in v) for v in values)


def admits(pattern: str, chars: frozenset[int]) -> bool | None:
    """Whether some atom of ``pattern`` can match one of ``chars`` (control characters
    only, a subset of SCREEN_CONTROLS), or None when the pattern cannot be read.

    Reads the pattern with Python's own regex parser, whose syntax covers most of what
    the linear engines accept; an atom counts if either engine's reading lets it match.
    Over-approximate: an atom that can never take part in a match still counts.
    """
    try:
        parsed = _sre_parser.parse(pattern)
    except (re.error, RecursionError):
        return None
    return _admits(parsed, chars)


def anchored(pattern: str) -> bool:
    """Whether every match of ``pattern`` spans the whole value: it begins with ``^`` (or
    ``\\A``) and ends with ``$`` on every branch, not in multi-line mode. A JSON Schema
    ``pattern`` is searched for, not matched whole: ``[a-z]+`` admits anything around it."""
    try:
        parsed = _sre_parser.parse(pattern)
    except (re.error, RecursionError):
        return False
    c = _sre_constants
    if parsed.state.flags & re.MULTILINE:
        return False  # `^` and `$` match at each line
    starts = (c.AT_BEGINNING, c.AT_BEGINNING_STRING)
    ends = (c.AT_END, c.AT_END_STRING)
    return _bound(parsed, 0, starts) and _bound(parsed, -1, ends)


def _bound(items: Any, at: int, anchors: tuple[Any, ...]) -> bool:
    """Whether the item at ``at`` (first or last) is one of ``anchors`` on every path."""
    c = _sre_constants
    if not items:
        return False
    op, av = items[at]
    if op is c.AT:
        return av in anchors
    if op is c.SUBPATTERN:
        return _bound(av[3], at, anchors)
    if op is c.BRANCH:
        return all(_bound(branch, at, anchors) for branch in av[1])
    return False


def _admits(items: Any, chars: frozenset[int]) -> bool:
    c = _sre_constants
    for op, av in items:
        if (
            op is c.ANY
            or (op is c.LITERAL and av in chars)
            or (op is c.NOT_LITERAL and bool(chars - {av}))
            or (op is c.IN and any(_class_may_match(av, char) for char in chars))
        ):
            return True
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and av[1] > 0:
            if _admits(av[2], chars):
                return True
        elif (
            (op is c.SUBPATTERN and _admits(av[3], chars))
            or (op is c.BRANCH and any(_admits(branch, chars) for branch in av[1]))
            or (op is c.ATOMIC_GROUP and _admits(av, chars))
        ):
            return True
    return False


def _class_may_match(items: Any, char: int) -> bool:
    """Whether a character class may match the control character ``char``: a plain class
    if an item may match it, a negated one unless an item surely does."""
    c = _sre_constants
    negate = bool(items) and items[0][0] is c.NEGATE
    for op, av in items[1:] if negate else items:
        if (op is c.LITERAL and av == char) or (op is c.RANGE and av[0] <= char <= av[1]):
            return not negate
        if op is c.CATEGORY and _category_has(av, char, surely=negate):
            return not negate
    return negate


def _category_has(category: Any, char: int, *, surely: bool) -> bool:
    """Whether ``\\d``, ``\\s``, ``\\w`` or their negations hold the control character
    ``char``: in both engines' reading (``surely``), or in either's."""
    c = _sre_constants
    spaces = _SPACES_IN_BOTH if surely else _SPACES_IN_BOTH | _SPACES_IN_PYTHON
    if category is c.CATEGORY_SPACE:
        return char in spaces
    if category is c.CATEGORY_NOT_SPACE:
        return char not in (_SPACES_IN_BOTH | _SPACES_IN_PYTHON if surely else _SPACES_IN_BOTH)
    if category in (c.CATEGORY_DIGIT, c.CATEGORY_WORD):
        return False  # no control character is a digit or a word character in either
    if category in (c.CATEGORY_NOT_DIGIT, c.CATEGORY_NOT_WORD):
        return True
    return not surely  # another category (line breaks): unknown, so taken as admitting


HINT_PARAMETER: Final = re.compile(HINT_PARAMETER_PATTERN)


def argument_hint(
    schema: Mapping[str, Any], args: Mapping[str, Any], schema_path: str
) -> dict[str, str] | None:
    """``error.hint`` for arguments that failed ``schema`` at ``schema_path`` (the first
    failing keyword): which parameter and which rule (codes.HINT_RULES), from the schema's
    own names and the agent's own keys only, never a value. None when the keyword is none
    of the rules (no hint rather than a wrong one)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    keyword, *rest = schema_path.strip("/").split("/")
    if keyword == "additionalProperties":
        extra = sorted(k for k in args if k not in properties)
        return _hint(extra[0] if extra else None, "unknown")
    if keyword == "required":
        missing = sorted(n for n in schema.get("required", ()) if n not in args)
        return _hint(missing[0] if missing else None, "missing")
    if keyword == "properties" and len(rest) >= 2:
        name, rule = rest[0], rest[1]
        if name in properties and rule in HINT_RULES:
            return {"parameter": name, "rule": rule}
    return None


def _hint(parameter: str | None, rule: str) -> dict[str, str]:
    """A hint naming ``parameter`` only when it fits HINT_PARAMETER (a key the agent made up
    may be anything: long, not an identifier); the rule alone otherwise."""
    if parameter is not None and HINT_PARAMETER.fullmatch(parameter):
        return {"parameter": parameter, "rule": rule}
    return {"rule": rule}
