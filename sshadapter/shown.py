"""Untrusted text as a terminal or a log line may show it: one line, nothing that acts.

Reference: SECURITY.md "Bytes on screens and in logs". Bytes a host, a man in the middle, an
agent, an inventory or a command file controls can hold what a terminal or a log reader acts
on: C0 controls (CR, LF, BEL, ESC and the sequences it starts), DEL, C1 controls (CSI
U+009B among them), the bidirectional overrides and isolates (U+202A-202E, U+2066-2069,
Trojan Source, CVE-2021-42574) that make a reader see another order, and the line and
paragraph separators. ``shown`` writes every character Python does not call printable as a
visible escape (``\\n``, ``\\x1b``, ``\\u202e``), and the backslash as ``\\\\`` so an escape
the text spelled itself cannot pass for one of ours; everything printable (accents, CJK)
stays as it is. The result is one line whatever the input.

``str.isprintable`` is the rule: it is False for the categories Cc (C0, DEL, C1), Cf (the
bidi controls, zero-width joiners, the BOM), Cs, Co, Cn, Zl, Zp and every space but U+0020.
"""

from __future__ import annotations

from typing import Final

# A value longer than this is shortened with "..." unless the caller says otherwise: an
# error or a log line names a thing, it does not reproduce it.
DEFAULT_SHOWN_CHARS: Final = 200
_NAMED: Final = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    named = _NAMED.get(char)
    if named is not None:
        return named
    if char.isprintable():
        return char
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was no UTF-8 (surrogateescape): the byte
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def shown(value: object, limit: int | None = DEFAULT_SHOWN_CHARS) -> str:
    """``value`` as one printable line: every non-printable character a visible escape,
    then cut to ``limit`` characters with ``...`` (``None``: never cut).

    Bytes are read as UTF-8, a byte that is no UTF-8 shown as ``\\xNN``; anything else
    as its ``str``.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode("utf-8", "surrogateescape")
    text = value if isinstance(value, str) else str(value)
    if text.isprintable() and "\\" not in text:
        escaped = text  # the common case: a name, a code, an ASCII reason
    else:
        escaped = "".join(_escape(char) for char in text)
    if limit is not None and len(escaped) > limit:
        return escaped[:limit] + "..."
    return escaped


def one_line(text: str, limit: int | None = None) -> str:
    """``text`` as it is when it is printable already, else ``shown``; cut past ``limit``
    either way. For text that may hold escapes written on purpose (a pattern's ``\\z`` in
    an error's advice, a value ``shown`` where it was quoted): printable text cannot act on a
    terminal, so its backslashes are left single."""
    if not text.isprintable():
        return shown(text, limit)
    return text if limit is None or len(text) <= limit else text[:limit] + "..."


def json_shown(text: str) -> str:
    """JSON text as a terminal may show it, the same JSON value: each non-printable character
    (only inside a string: JSON's structure is ASCII) written as its ``\\uXXXX`` escape.

    orjson escapes the C0 controls in strings, not DEL, C1 or the bidi controls, which a
    string field of a validated answer may hold. The newlines of an indented document are
    structure and stay.
    """
    if all(char == "\n" or char.isprintable() for char in text):
        return text  # the common case: nothing to escape
    return "".join(
        char if char == "\n" or char.isprintable() else _json_escape(ord(char)) for char in text
    )


def _json_escape(code: int) -> str:
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # RFC 8259 section 7: a surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
