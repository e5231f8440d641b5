"""A command file's parameters: the keywords they may use, their closed schema, their warnings.

Reference: docs/command-files.md "params". Every string parameter is constrained
(a ``pattern`` or an ``enum``), every integer bounded, and no keyword opens a schema
further; a parameter that admits a NUL byte is only warned about, since every call with
one is refused anyway (argv.py).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from typing import Any, Final

from sshadapter.contract.argv import ArgvTemplate
from sshadapter.contract.commandfile import CommandFile
from sshadapter.contract.schemas import DRAFT_2020_12, pattern_refusal
from sshadapter.errors import ConfigError

# The parser and constants of `re` itself (see admits_nul); untyped private modules.
_sre_parser: Any = importlib.import_module("re._parser")
_sre_constants: Any = importlib.import_module("re._constants")


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
    """The closed schema a call's arguments are validated against, or ConfigError."""
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
        values = [*param.get("enum", ()), param.get("const", "")]
        if (isinstance(pattern, str) and admits_nul(pattern)) or any(
            isinstance(v, str) and "\x00" in v for v in values
        ):
            yield (
                f"params.{name}",
                "admits a NUL byte, which no remote command can receive: every call with one "
                "is refused (INVALID_REQUEST, unsendable_argument); say what you mean, e.g. "
                "[^\\x00] or an explicit class instead of `.`",
            )


def admits_nul(pattern: str) -> bool:
    """Whether some atom of ``pattern`` can match NUL (a warning's heuristic, not a proof).

    Reads the pattern with Python's own regex parser, whose syntax covers what the
    linear engines accept; a pattern it cannot read is not warned about.
    """
    try:
        parsed = _sre_parser.parse(pattern)
    except (re.error, RecursionError):
        return False
    return _nul_in(parsed)


def _nul_in(items: Any) -> bool:
    c = _sre_constants
    for op, av in items:
        if op is c.ANY or (op is c.LITERAL and av == 0) or (op is c.NOT_LITERAL and av != 0):
            return True
        if op is c.IN and _class_has_nul(av):
            return True
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT) and av[1] > 0:
            if _nul_in(av[2]):
                return True
        elif (
            (op is c.SUBPATTERN and _nul_in(av[3]))
            or (op is c.BRANCH and any(_nul_in(branch) for branch in av[1]))
            or (op is c.ATOMIC_GROUP and _nul_in(av))
        ):
            return True
    return False


def _class_has_nul(items: Any) -> bool:
    c = _sre_constants
    negate = bool(items) and items[0][0] is c.NEGATE
    covered = False
    for op, av in items[1:] if negate else items:
        if (
            (op is c.LITERAL and av == 0)
            or (op is c.RANGE and av[0] == 0)
            or (
                op is c.CATEGORY
                and av
                in (
                    c.CATEGORY_NOT_DIGIT,
                    c.CATEGORY_NOT_SPACE,
                    c.CATEGORY_NOT_WORD,
                )
            )
        ):
            covered = True
    return covered != negate
