"""The specification of strict JSON: RFC 8259 plus the rules of docs/strict-json.md.

``_reference_parse`` is a pure-Python recursive-descent parser written from the
RFC 8259 grammar, section by section. It decides every input, with the exact
reason, byte offset and JSON path, and ``strict_json.strict_loads`` (the fast
path, in C) must agree with it. It costs up to ~1 us a byte, so the fast path
calls it only to explain a small rejected input. The reasons, the error and the
limits are the specification's, and live here; strict_json re-exports them.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

# Reasons an input is rejected. Finite on purpose: they become metric labels
# (errors.EVIDENCE_REASONS["parse"] is a superset).
REASONS: Final[frozenset[str]] = frozenset(
    {
        "too_large",
        "bom",
        "not_utf8",
        "syntax",
        "trailing_data",
        "empty",
        "duplicate_name",
        "non_finite_number",
        "number_out_of_range",
        "lone_surrogate",
        "too_deep",
    }
)

# Default nesting cap (docs/command-files.md "max_depth"). Depth: scalar 0, [] 1, [[]] 2.
DEFAULT_MAX_DEPTH: Final[int] = 32
# Upper bound for any configured max_depth. The reference parser uses two Python
# frames per level and stops at max_depth + 1, so it stays far below Python's
# recursion limit (1000); and 128 is below orjson.dumps's own nesting limit
# (254, strict_json._DUMPS_MAX_DEPTH), which the depth check needs room above.
MAX_DEPTH_LIMIT: Final[int] = 128
_BOM: Final = b"\xef\xbb\xbf"
_INT_MIN: Final = -(2**63)  # the integers orjson (and so every consumer of
_INT_MAX: Final = 2**64 - 1  # the value, orjson.dumps included) holds exactly
_OUT_OF_RANGE: Final = "integer outside [-2**63, 2**64-1]"


class StrictJSONError(ValueError):
    """Not strict JSON. ``reason`` is from REASONS; ``detail`` is for the audit trail only."""

    def __init__(self, reason: str, offset: int, detail: str) -> None:
        if reason not in REASONS:
            raise ValueError(f"unknown strict JSON reason {reason!r}")  # a bug, not input
        self.reason = reason
        self.offset = offset
        self.detail = detail
        super().__init__(f"{reason} at byte {offset}: {detail}")


def _check_limits(max_bytes: int, max_depth: int) -> None:
    """Limits are configuration: a bad one is a programming error, not bad input."""
    if not 1 <= max_depth <= MAX_DEPTH_LIMIT:
        raise ValueError(f"max_depth must be 1..{MAX_DEPTH_LIMIT}, got {max_depth}")
    if max_bytes < 1:
        raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")


# --------------------------------------------------------------------------
# Reference parser: RFC 8259, section by section. Works on bytes so offsets
# are byte offsets. Raises _Fail internally; each container level adds its
# path segment on the way out, so the happy path pays nothing for paths.


class _Fail(Exception):
    def __init__(self, reason: str, offset: int, message: str) -> None:
        self.reason = reason
        self.offset = offset
        self.message = message
        self.path: list[str | int] = []  # innermost segment first


# RFC 8259 section 2: ws = *( %x20 / %x09 / %x0A / %x0D )
_WS: Final = re.compile(rb"[ \t\n\r]*")
# Section 6: number = [ minus ] int [ frac ] [ exp ]; int = zero / ( digit1-9 *DIGIT )
_NUMBER: Final = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")
_NUMBER_CHARS: Final = frozenset(b"0123456789+-.eE")
# Section 7: unescaped = %x20-21 / %x23-5B / %x5D-10FFFF (UTF-8 checked up front)
_UNESCAPED: Final = re.compile(rb'[^"\\\x00-\x1f]*')
_HEX4: Final = re.compile(rb"[0-9a-fA-F]{4}")
# Section 7: the two-character escapes.
_ESCAPES: Final = {
    ord('"'): '"',
    ord("\\"): "\\",
    ord("/"): "/",
    ord("b"): "\b",
    ord("f"): "\f",
    ord("n"): "\n",
    ord("r"): "\r",
    ord("t"): "\t",
}
# Section 3: false / null / true. Section 6: NaN and Infinity are not numbers.
_LITERALS: Final = ((b"true", True), (b"false", False), (b"null", None))
_NON_FINITE: Final = (b"NaN", b"Infinity", b"-Infinity")


def _reference_parse(data: bytes, max_depth: int) -> Any:
    """The specification: parse ``data`` or raise StrictJSONError (size is the caller's)."""
    _check_limits(1, max_depth)  # bounds the recursion below: 2 frames per level
    if data.startswith(_BOM):  # section 8.1: MUST NOT add a BOM; we refuse one
        raise StrictJSONError("bom", 0, "UTF-8 byte order mark")
    try:  # section 8.1: exchanged JSON MUST be UTF-8; never guess another encoding
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise StrictJSONError("not_utf8", exc.start, f"invalid UTF-8: {exc.reason}") from None
    # Section 2: JSON-text = ws value ws
    pos = _ws(data, 0)
    if pos == len(data):
        raise StrictJSONError("empty", pos, "no JSON value")
    try:
        value, pos = _value(data, pos, max_depth)
    except _Fail as f:
        path = "$" + "".join(
            f"[{seg}]"
            if isinstance(seg, int)
            else f".{seg}"
            if seg.isidentifier() and seg.isascii()
            else f"[{orjson.dumps(seg[:64]).decode()}]"
            for seg in reversed(f.path)
        )
        raise StrictJSONError(f.reason, f.offset, f"{f.message} at {path}"[:300]) from None
    pos = _ws(data, pos)
    if pos != len(data):
        raise StrictJSONError("trailing_data", pos, "data after the JSON value")
    return value


def _ws(data: bytes, pos: int) -> int:
    """Section 2: skip ws; returns the position of the first other byte."""
    match = _WS.match(data, pos)
    return match.end() if match else pos


def _value(data: bytes, pos: int, depth_left: int) -> tuple[Any, int]:
    """Section 3: value = false / null / true / object / array / number / string."""
    if pos >= len(data):
        raise _Fail("syntax", pos, "unexpected end of input, expected a value")
    c = data[pos]
    if c == 0x7B or c == 0x5B:  # '{' or '['
        if depth_left == 0:  # checked before descending
            raise _Fail("too_deep", pos, "nesting deeper than max_depth")
        if c == 0x7B:
            return _object(data, pos, depth_left - 1)
        return _array(data, pos, depth_left - 1)
    if c == 0x22:  # '"'
        return _string(data, pos)
    if data.startswith(_NON_FINITE, pos):
        name = next(n for n in _NON_FINITE if data.startswith(n, pos)).decode()
        raise _Fail("non_finite_number", pos, f"{name} is not a JSON number")
    if c == 0x2D or 0x30 <= c <= 0x39:  # '-' or digit
        return _number(data, pos)
    for literal, result in _LITERALS:
        if data.startswith(literal, pos):
            return result, pos + len(literal)
    raise _Fail("syntax", pos, f"unexpected byte 0x{c:02x}, expected a value")


def _object(data: bytes, pos: int, depth_left: int) -> tuple[dict[str, Any], int]:
    """Section 4: object = { [ member *( , member ) ] }; member = string : value.

    Names SHOULD be unique (section 4); here they MUST be, compared after decoding.
    """
    result: dict[str, Any] = {}
    pos = _ws(data, pos + 1)
    if data.startswith(b"}", pos):
        return result, pos + 1
    while True:
        if not data.startswith(b'"', pos):
            raise _Fail("syntax", pos, "expected a member name")
        name_pos = pos
        name, pos = _string(data, pos)
        if name in result:
            raise _Fail("duplicate_name", name_pos, f"duplicate member name {name[:64]!r}")
        pos = _ws(data, pos)
        if not data.startswith(b":", pos):
            raise _Fail("syntax", pos, "expected ':' after member name")
        pos = _ws(data, pos + 1)
        try:
            result[name], pos = _value(data, pos, depth_left)
        except _Fail as f:
            f.path.append(name)
            raise
        pos = _ws(data, pos)
        if data.startswith(b"}", pos):
            return result, pos + 1
        if not data.startswith(b",", pos):
            raise _Fail("syntax", pos, "expected ',' or '}'")
        pos = _ws(data, pos + 1)


def _array(data: bytes, pos: int, depth_left: int) -> tuple[list[Any], int]:
    """Section 5: array = [ [ value *( , value ) ] ]."""
    result: list[Any] = []
    pos = _ws(data, pos + 1)
    if data.startswith(b"]", pos):
        return result, pos + 1
    while True:
        try:
            item, pos = _value(data, pos, depth_left)
        except _Fail as f:
            f.path.append(len(result))
            raise
        result.append(item)
        pos = _ws(data, pos)
        if data.startswith(b"]", pos):
            return result, pos + 1
        if not data.startswith(b",", pos):
            raise _Fail("syntax", pos, "expected ',' or ']'")
        pos = _ws(data, pos + 1)


def _number(data: bytes, pos: int) -> tuple[int | float, int]:
    """Section 6. Integers must fit orjson's range; other numbers must be finite doubles."""
    match = _NUMBER.match(data, pos)
    if match is None:
        raise _Fail("syntax", pos, "malformed number")
    end = match.end()
    if end < len(data) and data[end] in _NUMBER_CHARS:  # e.g. 01, 1., 1e, -0x
        raise _Fail("syntax", pos, "malformed number")
    text = data[pos:end]
    if match.group(1) is None and match.group(2) is None:  # no frac, no exp: an integer
        # > 20 digits is out of range; checking first keeps int() off its digit limit.
        if len(text.lstrip(b"-")) <= 20 and _INT_MIN <= (integer := int(text)) <= _INT_MAX:
            return integer, end
        raise _Fail("number_out_of_range", pos, _OUT_OF_RANGE)
    number = float(text)  # correctly rounded; underflow gives 0.0, which is accepted
    if number in (float("inf"), float("-inf")):
        raise _Fail("non_finite_number", pos, "number overflows a double")
    return number, end


def _string(data: bytes, pos: int) -> tuple[str, int]:
    """Section 7: string = quotation-mark *char quotation-mark."""
    parts: list[str] = []
    pos += 1
    while True:
        match = _UNESCAPED.match(data, pos)
        end = match.end() if match else pos
        if end > pos:  # stops only at ASCII bytes, so never inside a UTF-8 sequence
            parts.append(data[pos:end].decode("utf-8"))
        if end == len(data):
            raise _Fail("syntax", end, "unterminated string")
        c = data[end]
        if c == 0x22:  # closing quotation mark
            return "".join(parts), end + 1
        if c != 0x5C:  # not a backslash: U+0000..U+001F MUST be escaped
            raise _Fail("syntax", end, f"raw control character 0x{c:02x} in string")
        escape = data[end + 1] if end + 1 < len(data) else -1
        if escape in _ESCAPES:
            parts.append(_ESCAPES[escape])
            pos = end + 2
            continue
        if escape != 0x75:  # 'u'
            raise _Fail("syntax", end, "invalid escape")
        unit, pos = _hex4(data, end + 2)
        # Section 7/8.2: a UTF-16 surrogate pair is two \u escapes; a lone one is
        # not a Unicode character and would make parsers disagree.
        if 0xD800 <= unit <= 0xDBFF and data.startswith(b"\\u", pos):
            low, after = _hex4(data, pos + 2)
            if 0xDC00 <= low <= 0xDFFF:
                parts.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
                pos = after
                continue
        if 0xD800 <= unit <= 0xDFFF:
            raise _Fail("lone_surrogate", end, f"lone surrogate \\u{unit:04x}")
        parts.append(chr(unit))


def _hex4(data: bytes, pos: int) -> tuple[int, int]:
    """Section 7: \\u followed by four hex digits (either case)."""
    if _HEX4.match(data, pos) is None:
        raise _Fail("syntax", pos - 2, "\\u escape needs four hex digits")
    return int(data[pos : pos + 4], 16), pos + 4
