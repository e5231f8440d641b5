"""`shown`: untrusted text reaches a screen or a log line as one line where nothing acts."""

from __future__ import annotations

import orjson
import pytest

from sshadapter.shown import json_shown, one_line, shown

HOSTILE = [
    "\n",
    "\r",
    "\x1b[2J",
    "\x07",
    "\x7f",
    "\x9b31m",
    "\u202e",
    "\u2066",
    "\u2069",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\x00",
]


@pytest.mark.parametrize("char", HOSTILE)
def test_every_acting_character_is_a_visible_escape(char: str) -> None:
    """C0, DEL, C1, the bidi controls and the line separators come out as escapes."""
    out = shown(f"a{char}b")
    assert out.isprintable() and out.startswith("a\\") and out.endswith("b")


def test_printable_text_is_kept_as_it_is() -> None:
    """Accents, CJK and punctuation are not escaped: an operator reads their own names."""
    assert shown("héllo 中文 [x]=1") == "héllo 中文 [x]=1"


def test_a_backslash_cannot_pass_for_an_escape() -> None:
    """A literal ``\\n`` in the text is shown doubled, so it differs from a real newline."""
    assert shown("a\\nb") == "a\\\\nb"
    assert shown("a\nb") == "a\\nb"


def test_bytes_that_are_no_utf8_are_shown_as_bytes() -> None:
    """A host's bytes: valid UTF-8 read as text, each other byte as ``\\xNN``."""
    assert shown(b"ok\xff\x1b") == "ok\\xff\\x1b"


def test_long_values_are_cut_with_an_ellipsis() -> None:
    """The default limit names a thing without reproducing it; ``None`` keeps it whole."""
    assert shown("x" * 500) == "x" * 200 + "..."
    assert shown("x" * 500, limit=None) == "x" * 500


def test_one_line_keeps_printable_text_and_escapes_the_rest() -> None:
    """Printable text (an error's advice about ``\\z``) stays; anything else is ``shown``."""
    assert one_line("write \\Z as \\z") == "write \\Z as \\z"
    assert one_line("db\u202e01\\z") == "db\\u202e01\\\\z"
    assert one_line("x" * 10, limit=4) == "xxxx..."


def test_json_shown_escapes_inside_strings_and_keeps_the_value() -> None:
    """DEL, C1, bidi and a non-printable astral character become \\u escapes of one value."""
    text = orjson.dumps({"a": "x\x7f\x9b\u202e\U000e0041"}, option=orjson.OPT_INDENT_2).decode()
    out = json_shown(text)
    assert all(line.isprintable() for line in out.splitlines())
    assert orjson.loads(out) == orjson.loads(text)
    assert json_shown('{\n  "a": "é"\n}') == '{\n  "a": "é"\n}'
