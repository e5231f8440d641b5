"""Strict JSON: the JSONTestSuite corpus, every rejection reason, the fast-path guards.

The reference parser is the specification; every test that can also checks that
the fast path (orjson plus guards) reaches the same verdict, reason and value.
"""

from __future__ import annotations

import contextlib
import json
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shared_data import find_shared

from sshadapter import strict_json
from sshadapter.errors import EVIDENCE_REASONS
from sshadapter.rfc8259 import _reference_parse
from sshadapter.strict_json import (
    DEFAULT_MAX_DEPTH,
    EXPLAIN_MAX_BYTES,
    MAX_DEPTH_LIMIT,
    ORJSON_MAX_BYTES,
    REASONS,
    StrictJSONError,
    strict_loads,
)

MIB = 1024 * 1024
CORPUS_SUBDIR = Path("conformance") / "jsontestsuite" / "test_parsing"
CORPUS_SIZE = 318


CORPUS = find_shared(CORPUS_SUBDIR)
MISSING = "corpus-missing"
CORPUS_FILES = (
    sorted(p.name for p in CORPUS.glob("*.json")) if CORPUS and CORPUS.is_dir() else []
) or [MISSING]  # a missing corpus fails below, it is never skipped

DUPLICATE_Y = {"y_object_duplicated_key.json", "y_object_duplicated_key_and_value.json"}

# Our documented choice for every implementation-defined file (docs/strict-json.md).
I_OUTCOMES: dict[str, str] = {
    "i_number_double_huge_neg_exp.json": "accept",  # underflow -> 0.0
    "i_number_huge_exp.json": "non_finite_number",
    "i_number_neg_int_huge_exp.json": "non_finite_number",
    "i_number_pos_double_huge_exp.json": "non_finite_number",
    "i_number_real_neg_overflow.json": "non_finite_number",
    "i_number_real_pos_overflow.json": "non_finite_number",
    "i_number_real_underflow.json": "accept",  # underflow -> 0.0
    "i_number_too_big_neg_int.json": "number_out_of_range",
    "i_number_too_big_pos_int.json": "number_out_of_range",
    "i_number_very_big_negative_int.json": "number_out_of_range",
    "i_object_key_lone_2nd_surrogate.json": "lone_surrogate",
    "i_string_1st_surrogate_but_2nd_missing.json": "lone_surrogate",
    "i_string_1st_valid_surrogate_2nd_invalid.json": "lone_surrogate",
    "i_string_UTF-16LE_with_BOM.json": "not_utf8",
    "i_string_UTF-8_invalid_sequence.json": "not_utf8",
    "i_string_UTF8_surrogate_U+D800.json": "not_utf8",
    "i_string_incomplete_surrogate_and_escape_valid.json": "lone_surrogate",
    "i_string_incomplete_surrogate_pair.json": "lone_surrogate",
    "i_string_incomplete_surrogates_escape_valid.json": "lone_surrogate",
    "i_string_invalid_lonely_surrogate.json": "lone_surrogate",
    "i_string_invalid_surrogate.json": "lone_surrogate",
    "i_string_invalid_utf-8.json": "not_utf8",
    "i_string_inverted_surrogates_U+1D11E.json": "lone_surrogate",
    "i_string_iso_latin_1.json": "not_utf8",
    "i_string_lone_second_surrogate.json": "lone_surrogate",
    "i_string_lone_utf8_continuation_byte.json": "not_utf8",
    "i_string_not_in_unicode_range.json": "not_utf8",
    "i_string_overlong_sequence_2_bytes.json": "not_utf8",
    "i_string_overlong_sequence_6_bytes.json": "not_utf8",
    "i_string_overlong_sequence_6_bytes_null.json": "not_utf8",
    "i_string_truncated-utf-8.json": "not_utf8",
    "i_string_utf16BE_no_BOM.json": "not_utf8",  # e9 00 is invalid UTF-8 before any syntax check
    "i_string_utf16LE_no_BOM.json": "not_utf8",
    "i_structure_500_nested_arrays.json": "too_deep",
    "i_structure_UTF-8_BOM_empty_object.json": "bom",
}

Outcome = tuple[str, ...]


def _outcome(parse: Callable[[], Any]) -> Outcome:
    """("accept", repr(value)) or ("reject", reason, offset); repr tells 1 from 1.0."""
    try:
        value = parse()
    except StrictJSONError as err:
        assert err.reason in REASONS
        return ("reject", err.reason, str(err.offset))
    return ("accept", repr(value))


def fast(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Outcome:
    return _outcome(lambda: strict_loads(data, max_bytes=MIB, max_depth=max_depth))


def ref(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Outcome:
    return _outcome(lambda: _reference_parse(data, max_depth))


def verdict(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Outcome:
    """The fast path's outcome, after checking that the reference parser agrees.

    Over EXPLAIN_MAX_BYTES a rejection is explained by the C parsers: the fault
    they meet first, at their offset (or -1). With one fault that is the
    reference's reason (test_a_large_rejected_output_is_explained_...); with
    several it may be another, so only the verdict is compared.
    """
    result = fast(data, max_depth)
    expected = ref(data, max_depth)
    if len(data) > EXPLAIN_MAX_BYTES and result[0] == "reject":
        assert expected[0] == "reject"
    else:
        assert result == expected
    return result


def reason(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    result = verdict(data, max_depth)
    return result[1] if result[0] == "reject" else "accept"


def loads(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Any:
    return strict_loads(data, max_bytes=MIB, max_depth=max_depth)


@pytest.fixture
def no_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any call of the reference parser fail: proves the guards alone decided."""

    def forbidden(data: bytes, max_depth: int) -> Any:
        raise AssertionError("reference parser called")

    monkeypatch.setattr(strict_json, "_reference_parse", forbidden)


# --- JSONTestSuite ----------------------------------------------------------


def test_corpus_is_complete() -> None:
    """The corpus exists with all 318 files and every i_ file has a pinned outcome."""
    assert CORPUS is not None and CORPUS.is_dir(), "JSONTestSuite corpus not found"
    assert len(CORPUS_FILES) == CORPUS_SIZE
    assert {n for n in CORPUS_FILES if n.startswith("i_")} == set(I_OUTCOMES)


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_file(name: str) -> None:
    """n_ rejected, y_ accepted (bar duplicates), i_ as pinned; both parsers agree."""
    assert name != MISSING and CORPUS is not None, "JSONTestSuite corpus not found"
    result = verdict((CORPUS / name).read_bytes())
    if name.startswith("n_"):
        assert result[0] == "reject"
    elif name in DUPLICATE_Y:
        assert result[:2] == ("reject", "duplicate_name")
    elif name.startswith("y_"):
        assert result[0] == "accept"
    else:
        expected = I_OUTCOMES[name]
        assert (result[0] if expected == "accept" else result[1]) == expected


# --- one test per reason ------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected", "offset"),
    [
        (b"[1, 2]x", "trailing_data", 6),
        (b"[1, 2] [3]", "trailing_data", 7),
        (b"", "empty", 0),
        (b" \t\r\n", "empty", 4),
        (b'{"a": 1, "a": 2}', "duplicate_name", 9),
        (b"[NaN]", "non_finite_number", 1),
        (b"[-Infinity]", "non_finite_number", 1),
        (b"[1e400]", "non_finite_number", 1),
        (b"[-1.5E+309]", "non_finite_number", 1),
        (b"[18446744073709551616]", "number_out_of_range", 1),
        (b'["\\ud800"]', "lone_surrogate", 2),
        (b'["\\udc00"]', "lone_surrogate", 2),
        (b'["\\ud800x"]', "lone_surrogate", 2),
        (b'["\\ud800\\ud800"]', "lone_surrogate", 2),
        (b"[[[]]]", "too_deep", 2),
        (b'["\xff"]', "not_utf8", 2),
        (b'["\xed\xa0\x80"]', "not_utf8", 2),  # UTF-8-encoded surrogate
        (b"\xef\xbb\xbf[]", "bom", 0),
        (b'["a\tb"]', "syntax", 3),  # raw control character
        (b'["\\x"]', "syntax", 2),  # bad escape
        (b'["\\u12"]', "syntax", 2),  # short \u escape
        (b'["\\ud800\\uzzzz"]', "syntax", 8),  # bad escape beats the lone surrogate
        (b"[01]", "syntax", 1),  # leading zero
        (b"[1.]", "syntax", 1),
        (b"[.5]", "syntax", 1),
        (b"[+1]", "syntax", 1),
        (b"[1,]", "syntax", 3),
        (b"{'a': 1}", "syntax", 1),
        (b'{"a" 1}', "syntax", 5),
        (b"[true", "syntax", 5),
        (b"01", "syntax", 0),
        (b"[\x0c]", "syntax", 1),  # form feed is not JSON whitespace
    ],
)
def test_each_reason(data: bytes, expected: str, offset: int) -> None:
    """Each rule rejects with its own reason at the byte offset of the problem."""
    assert verdict(data, max_depth=2) == ("reject", expected, str(offset))


def test_too_large_is_checked_first() -> None:
    """Size is checked before anything else, even a BOM or invalid UTF-8."""
    with pytest.raises(StrictJSONError) as info:
        strict_loads(b"\xef\xbb\xbf\xff[]", max_bytes=4, max_depth=1)
    assert info.value.reason == "too_large"
    assert strict_loads(b"[1]", max_bytes=3, max_depth=1) == [1]


def test_reasons_match_evidence_reasons() -> None:
    """Every reason is a valid parse-stage evidence reason, so it can become one."""
    assert REASONS.issubset(EVIDENCE_REASONS["parse"])


def test_error_shape() -> None:
    """StrictJSONError is a ValueError with reason, offset and a short detail naming the name."""
    with pytest.raises(StrictJSONError) as info:
        loads(b'{"a": {"approved": false, "approved": true}}')
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.reason, err.offset) == ("duplicate_name", 26)
    assert err.detail == "duplicate member name 'approved' at $.a"
    with pytest.raises(ValueError, match="unknown"):
        StrictJSONError("nope", 0, "")


@pytest.mark.parametrize(
    ("max_bytes", "max_depth"), [(1, 0), (1, MAX_DEPTH_LIMIT + 1), (0, 1), (-1, 1)]
)
def test_bad_limits_are_programming_errors(max_bytes: int, max_depth: int) -> None:
    """Out-of-range limits raise a plain ValueError, not a StrictJSONError."""
    with pytest.raises(ValueError) as info:
        strict_loads(b"1", max_bytes=max_bytes, max_depth=max_depth)
    assert not isinstance(info.value, StrictJSONError)


def test_defaults() -> None:
    """The defaults are within the limits they are checked against."""
    assert DEFAULT_MAX_DEPTH == 32 and 1 <= DEFAULT_MAX_DEPTH <= MAX_DEPTH_LIMIT <= 254
    assert loads(b"[]", max_depth=MAX_DEPTH_LIMIT) == []


def test_str_input_is_a_type_error() -> None:
    """Only bytes are accepted: a str has no byte offsets and no encoding to check."""
    with pytest.raises(TypeError):
        strict_loads("[]", max_bytes=10, max_depth=1)  # type: ignore[arg-type]


# --- duplicates ----------------------------------------------------------------


def test_approved_twice_rejected() -> None:
    """The motivating case: orjson would silently answer approved=true."""
    data = b'{"approved": false, "approved": true}'
    assert orjson.loads(data) == {"approved": True}
    assert verdict(data) == ("reject", "duplicate_name", "20")


def test_duplicate_deep_inside_arrays() -> None:
    """A duplicate at any depth is found, and the detail gives its path."""
    data = b'[[[{"x": [{"a": 1, "b": [2], "a": {"c": 3}}]}]]]'
    assert reason(data) == "duplicate_name"
    with pytest.raises(StrictJSONError) as info:
        loads(data)
    assert info.value.detail == "duplicate member name 'a' at $[0][0][0].x[0]"


@pytest.mark.parametrize(
    "data",
    [
        b'{"a": 1, "\\u0061": 2}',
        b'{"\\u00e9": 1, "\xc3\xa9": 2}',
        b'{"\\ud83d\\ude00": 1, "\xf0\x9f\x98\x80": 2}',
        b'{"\\/": 1, "/": 2}',
        b'{"x": {}, "x": {}}',
    ],
)
def test_escaped_name_duplicates(data: bytes) -> None:
    """Names are compared after decoding escapes, so spellings of one name collide."""
    assert reason(data) == "duplicate_name"


def test_escaped_colon_cannot_hide_a_duplicate() -> None:
    """A \\u003a decodes to one extra colon, exactly offsetting a dropped member's colon."""
    for data in (b'{"a": 1, "a": "\\u003a"}', b'{"a": 1, "a": "\\u003A"}'):
        assert data.count(b":") == orjson.dumps(orjson.loads(data)).count(b":")
        assert reason(data) == "duplicate_name"


def test_escaped_colon_no_false_positive() -> None:
    """\\u003a in names and values is accepted with the right value."""
    data = b'{"a\\u003ab": "\\u003A", "c": ["x\\u003ay", {"\\u003a": ":"}]}'
    assert loads(data) == {"a:b": ":", "c": ["x:y", {":": ":"}]}
    assert verdict(data)[0] == "accept"


def test_colons_brackets_newlines_in_strings(no_reference: None) -> None:
    """Strings full of colons, brackets and \\n escapes trip no guard."""
    value = {"a:b": "c:d::", "[[[{{{": "]]]}}}", "t": "x\n" + " " * 80 + "y", "k": ["\n  :"]}
    for data in (orjson.dumps(value), json.dumps(value, indent=4).encode()):
        assert loads(data, max_depth=3) == value  # depth 2; 3 keeps the depth guard quiet


def test_typical_document_stays_on_fast_path(no_reference: None) -> None:
    """A realistic document (ns timestamps included) never reaches the reference parser."""
    rows = [
        {
            "id": i,
            "ts_ns": 1715240125123456789 + i,
            "host": f"h{i}",
            "ok": True,
            "load": [0.5, 1.25],
            "at": "2026-05-09T07:35:25Z",
            "note": None,
        }
        for i in range(50)
    ]
    data = orjson.dumps({"rows": rows})
    assert loads(data) == {"rows": rows}


# --- numbers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("literal", "expected"),
    [
        (str(2**64 - 1), "accept"),
        (str(2**64), "number_out_of_range"),
        (str(-(2**63)), "accept"),
        (str(-(2**63) - 1), "number_out_of_range"),
        (str(2**63), "accept"),
        (str(2**63 - 1), "accept"),
        ("9999999999999999999", "accept"),  # 19 digits, > 2**63, < 2**64
        ("99999999999999999999", "number_out_of_range"),  # 20 digits, > 2**64
        ("-0", "accept"),
        ("1" * 5000, "number_out_of_range"),  # beyond int()'s digit limit
        ("1e19", "accept"),  # a float, not an integer literal
        ("100000000000000000000.0", "accept"),
        ("1234567890123456789012345e-5", "accept"),
    ],
)
def test_integer_boundaries(literal: str, expected: str) -> None:
    """Integers must fit [-2**63, 2**64-1] exactly; fraction or exponent makes a float."""
    data = f'{{"n": [{literal}]}}'.encode()
    assert reason(data) == expected
    if expected == "accept":
        assert repr(loads(data)["n"][0]) == repr(json.loads(literal))


def test_long_digit_runs_in_strings() -> None:
    """A 19+ digit run inside a string is not a number."""
    data = b'{"id": "12345678901234567890123", "t": "1234567890:123456789"}'
    assert loads(data) == orjson.loads(data)


def test_underflow_accepted() -> None:
    """1e-400 underflows to 0.0 (and -1e-400 to -0.0); that is not an error."""
    assert repr(loads(b"[1e-400, -1e-400, 4.9e-324]")) == "[0.0, -0.0, 5e-324]"
    assert verdict(b"1e-400") == ("accept", "0.0")


# --- encodings -----------------------------------------------------------------


def test_bom_rejected_anywhere() -> None:
    """A leading BOM is 'bom'; after whitespace U+FEFF is just a syntax error."""
    assert verdict(b"\xef\xbb\xbf{}") == ("reject", "bom", "0")
    assert verdict(b"\xef\xbb\xbf") == ("reject", "bom", "0")
    assert verdict(b" \xef\xbb\xbf{}") == ("reject", "syntax", "1")


@pytest.mark.parametrize(
    ("text", "codec", "expected"),
    [
        ('{"a": 1}', "utf-16-le", ("reject", "syntax", "1")),  # NUL bytes are valid UTF-8
        ('{"a": 1}', "utf-16-be", ("reject", "syntax", "0")),
        ('["é"]', "utf-16-le", ("reject", "not_utf8", "4")),  # e9 00 is not UTF-8
        ('["é"]', "utf-16-be", ("reject", "not_utf8", "5")),
        ('{"a": 1}', "utf-32-le", ("reject", "syntax", "1")),
        ('{"a": 1}', "utf-16", ("reject", "not_utf8", "0")),  # with a UTF-16 BOM
    ],
)
def test_no_utf16_guessing(text: str, codec: str, expected: Outcome) -> None:
    """UTF-16/32 is never guessed: ASCII-only text is 'syntax', other text 'not_utf8'."""
    assert verdict(text.encode(codec)) == expected


# --- depth -----------------------------------------------------------------------


def _nest(depth: int, inner: str, kinds: str) -> bytes:
    """`depth` containers; `inner` ("empty" or "full") decides the innermost content."""
    text = (
        ("[]" if kinds[(depth - 1) % len(kinds)] == "a" else "{}")
        if inner == "empty"
        else ("[1]" if kinds[(depth - 1) % len(kinds)] == "a" else '{"k": 1}')
    )
    for level in reversed(range(depth - 1)):
        text = f"[{text}]" if kinds[level % len(kinds)] == "a" else f'{{"k": {text}}}'
    return text.encode()


@pytest.mark.parametrize("max_depth", [1, 2, 3, 7, 32, MAX_DEPTH_LIMIT])
@pytest.mark.parametrize("inner", ["empty", "full"])
@pytest.mark.parametrize("kinds", ["a", "o", "ao", "oa"])
def test_depth_boundary(max_depth: int, inner: str, kinds: str) -> None:
    """Depth max_depth is accepted and max_depth + 1 rejected, for every container shape."""
    ok = _nest(max_depth, inner, kinds)
    assert verdict(ok, max_depth)[0] == "accept"
    assert loads(ok, max_depth) == orjson.loads(ok)
    assert reason(_nest(max_depth + 1, inner, kinds), max_depth) == "too_deep"


@pytest.mark.parametrize("max_depth", [1, 2, 32])
@pytest.mark.parametrize("kinds", ["a", "o", "ao"])
def test_depth_guard_alone_is_enough(max_depth: int, kinds: str, no_reference: None) -> None:
    """At depth max_depth with empty innermost containers, the indent guard decides alone."""
    data = _nest(max_depth, "empty", kinds)
    assert loads(data, max_depth) == orjson.loads(data)


def test_depth_of_scalars() -> None:
    """A top-level scalar has depth 0 and passes even max_depth=1 without the reference."""
    for data in (b"1", b'"x"', b"null", b"  true  ", b"[]", b"{}"):
        assert verdict(data, max_depth=1)[0] == "accept"


def test_no_recursion_error() -> None:
    """100000 nested brackets give too_deep from both parsers, never RecursionError."""
    for data in (b"[" * 100_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000):
        assert reason(data, MAX_DEPTH_LIMIT) == "too_deep"
        assert reason(data, 1) == "too_deep"
    deep_ok = b"[" * 600 + b"]" * 600  # orjson.loads accepts, orjson.dumps cannot
    assert reason(deep_ok, MAX_DEPTH_LIMIT) == "too_deep"


# --- properties --------------------------------------------------------------------

_chars = st.characters(codec="utf-8") | st.sampled_from(list(':[]{}",\\\n 0123456789'))
_text = st.text(_chars, max_size=8)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=25,
)
SERIALIZERS: list[Callable[[Any], bytes]] = [
    orjson.dumps,
    lambda v: orjson.dumps(v, option=orjson.OPT_INDENT_2),
    lambda v: json.dumps(v).encode(),  # ASCII-only: \u escapes, surrogate pairs
    lambda v: json.dumps(v, indent=1, ensure_ascii=False).encode(),
]
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


@PROPERTY
@given(json_values, st.sampled_from(SERIALIZERS), st.integers(1, 6))
def test_property_valid_documents(value: Any, dump: Callable[[Any], bytes], depth: int) -> None:
    """Any serialized JSON value parses to what orjson gives, or is too_deep, in both parsers."""
    raw = dump(value)
    result = verdict(raw, depth)
    if _depth(value) <= depth:
        assert result == ("accept", repr(orjson.loads(raw)))
    else:
        assert result[:2] == ("reject", "too_deep")


@st.composite
def mutated_documents(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SERIALIZERS))(draw(json_values)))
    for _ in range(draw(st.integers(1, 3))):
        pos = draw(st.integers(0, len(raw)))
        op = draw(st.sampled_from(["flip", "insert", "delete"]))
        if op == "insert" or not raw:
            raw.insert(pos, draw(st.integers(0, 255)))
        elif op == "flip":
            raw[min(pos, len(raw) - 1)] ^= draw(st.integers(1, 255))
        else:
            del raw[min(pos, len(raw) - 1)]
    return bytes(raw)


_jsonish = st.text(st.sampled_from(list('[]{}",:0123456789.eE-+ \\utrfalsnN\tIy')), max_size=40)


@PROPERTY
@given(st.binary(max_size=64) | mutated_documents() | _jsonish.map(str.encode))
def test_property_arbitrary_bytes(data: bytes) -> None:
    """Any bytes: a value or a StrictJSONError, and both parsers give the same outcome."""
    verdict(data, 4)


# --- what a hostile output cannot buy (issue 17 defect 1) ------------------------

PAD: Final = b" " * (EXPLAIN_MAX_BYTES + 1)  # trailing whitespace: the same verdict, large


def _row(i: int) -> dict[str, Any]:
    return {"id": i, "host": f"node-{i}", "bytes": i * 1000, "tags": ["a", "b"]}


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("escaped colons", b'{"a\\u003ab": "\\u003A", "c": ["x\\u003ay", {"\\u003a": ":"}]}'),
        ("escaped backslash, then u003a", b'{"a": "\\\\u003a", "b": "\\\\\\u003a"}'),
        (
            "20-digit runs in strings",
            b'{"id": "123456789012345678901234", "n": "-99999999999999999999"}',
        ),
        (
            "integers at both edges",
            f"[{2**64 - 1}, {-(2**63)}, {2**63}, 18446744073709551615]".encode(),
        ),
        (
            "fractions and exponents of 20+ digits",
            b"[0.123456789012345678901234, 1e-0000000000000000000001]",
        ),
        (
            "a float with a 21-digit integer part",
            b"[100000000000000000000.0, 123456789012345678901e-5]",
        ),
        ("depth exactly max_depth, innermost non-empty", b"[" * 32 + b"1" + b"]" * 32),
        ("objects to max_depth", b'{"a":' * 31 + b"[1]" + b"}" * 31),
        ("brackets in strings", orjson.dumps({"s": "[" * 100 + "{" * 100})),
    ],
)
def test_hostile_shapes_are_accepted_without_the_reference(
    name: str, data: bytes, no_reference: None
) -> None:
    """The shapes that once sent a whole output to the pure-Python parser are judged in C."""
    value = orjson.loads(data)
    small = orjson.dumps({"rows": [_row(i) for i in range(40)], "x": value})
    large = orjson.dumps({"rows": [_row(i) for i in range(1500)], "x": value})  # > 64 KiB
    assert len(large) > ORJSON_MAX_BYTES
    for raw, depth in ((data, 32), (data + PAD, 32), (small, 33), (large, 33)):  # "x": a level
        assert repr(loads(raw, depth)) == repr(json.loads(raw)), name  # json keeps big ints exact


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        (b'"x"] 1', "trailing_data"),
        (b'"x", ]', "syntax"),
        (b'"x", [1, 2', "syntax"),  # cut short: msgspec says truncated, and no surrogate escape
        (b'"\\ud800"]', "lone_surrogate"),
        (b'"\\ud800', "lone_surrogate"),  # msgspec: truncated; the tail names it
        (b'"\\ud800\\', "lone_surrogate"),
        (b'"\\ud800\\ud', "syntax"),  # the pair's escape cut short
        (b'"\\\\ud800', "syntax"),  # an escaped backslash: text, then the end
        (b'"\\ud800", "x"]', "lone_surrogate"),  # msgspec: end of the escaped pair
        (b"NaN]", "non_finite_number"),
        (b"1e400]", "non_finite_number"),
        (b"18446744073709551616]", "number_out_of_range"),
        (b"-9223372036854775809]", "number_out_of_range"),
        (b"1" * 5000 + b"]", "number_out_of_range"),
        (b'{"a": 1, "a": 2}]', "duplicate_name"),
        (b'{"a": 1, "a": "\\u003a"}]', "duplicate_name"),
        (b"[" * 40 + b"]" * 41, "too_deep"),
        (b"[" * 5000 + b"]" * 5001, "too_deep"),
        (b'"\xff"]', "not_utf8"),
    ],
)
@pytest.mark.parametrize("rows", [40, 1500])  # orjson's inputs and msgspec's (> 64 KiB)
def test_a_large_rejected_output_is_explained_without_the_reference(
    fault: bytes, expected: str, rows: int, no_reference: None
) -> None:
    """Over EXPLAIN_MAX_BYTES, the fault at the very end is named from the C parsers' errors."""
    data = b"[" + orjson.dumps([_row(i) for i in range(rows)])[1:-1] + b", " + fault
    assert len(data) > EXPLAIN_MAX_BYTES
    with pytest.raises(StrictJSONError) as err:
        loads(data)
    assert err.value.reason == expected
    assert err.value.offset == -1 or data[err.value.offset - 40 : err.value.offset + 40]


def test_a_lone_surrogate_at_the_end_is_named_without_a_second_parse() -> None:
    """A lone surrogate at a large output's very end costs no more memory than msgspec's try.

    A second parse by orjson, to name the fault, peaked at ~1.6x that attempt."""
    data = b"[" + orjson.dumps([_row(i) for i in range(20_000)])[1:-1] + b', "\\ud800"]'

    def peak(parse: Callable[[], Any]) -> int:
        tracemalloc.start()
        try:
            with contextlib.suppress(ValueError):  # StrictJSONError and msgspec's DecodeError
                parse()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    msgspec_alone = peak(lambda: msgspec.json.decode(data))
    strict = peak(lambda: strict_loads(data, max_bytes=len(data), max_depth=DEFAULT_MAX_DEPTH))
    with pytest.raises(StrictJSONError) as err:
        strict_loads(data, max_bytes=len(data), max_depth=DEFAULT_MAX_DEPTH)
    assert err.value.reason == "lone_surrogate"
    assert data.startswith(b"\\ud800", err.value.offset)
    assert strict < 1.2 * msgspec_alone, f"{strict / msgspec_alone:.2f}x msgspec's own peak"


def test_large_whitespace_is_empty_without_the_reference(no_reference: None) -> None:
    """A large output of whitespace only is empty, found without the reference."""
    assert fast(PAD) == ("reject", "empty", str(len(PAD)))


def test_small_rejections_keep_the_reference_explanation() -> None:
    """Up to EXPLAIN_MAX_BYTES a rejection names the offset and JSON path of the fault."""
    data = b'{"rows": [{"a": 1}, {"a": 2, "a": 3}]}'
    with pytest.raises(StrictJSONError) as err:
        loads(data)
    assert (err.value.reason, err.value.offset) == ("duplicate_name", 29)
    assert "$.rows[1]" in err.value.detail


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_the_dumps_depth_limit_is_measured_for_lists_and_dicts(kind: str) -> None:
    """orjson.dumps writes exactly _DUMPS_MAX_DEPTH levels of lists or of objects, no more."""
    limit = strict_json._DUMPS_MAX_DEPTH
    assert limit > MAX_DEPTH_LIMIT

    def nest(depth: int) -> Any:
        value: Any = [] if kind == "list" else {}
        for _ in range(depth - 1):
            value = [value] if kind == "list" else {"k": value}
        return value

    orjson.dumps(nest(limit))
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(nest(limit + 1))


@PROPERTY
@given(mutated_documents() | _jsonish.map(str.encode))
def test_property_large_inputs_agree_on_the_verdict(data: bytes) -> None:
    """Padded past EXPLAIN_MAX_BYTES, any input gets the reference's verdict."""
    verdict(data + PAD, 4)


@PROPERTY
@given(json_values, st.sampled_from(SERIALIZERS), st.integers(1, 6))
def test_property_large_valid_documents(
    value: Any, dump: Callable[[Any], bytes], depth: int
) -> None:
    """Valid documents padded past EXPLAIN_MAX_BYTES: the value, or too_deep, as the reference."""
    verdict(dump(value) + PAD, depth)


# 2.6 MB of rows: over ORJSON_MAX_BYTES, and written in three slices of ~1 MiB.
_PAD_ROWS: Final = orjson.dumps([{"i": i, "s": "x:y"} for i in range(120_000)])


def big(data: bytes, max_depth: int = DEFAULT_MAX_DEPTH) -> Outcome:
    """The fast path's outcome for an input of any size."""
    return _outcome(lambda: strict_loads(data, max_bytes=len(data), max_depth=max_depth))


def _large(value: bytes, where: str) -> bytes:
    """``value`` inside an output sliced when written: on the spine or inside a slice."""
    if where == "slice":
        cut = _PAD_ROWS.index(b"},{", len(_PAD_ROWS) // 2) + 2  # a row boundary mid-slice
        return b'{"pad":' + _PAD_ROWS[:cut] + value + b"," + _PAD_ROWS[cut:] + b"}"
    return b'{"pad":' + _PAD_ROWS + b',"v":' + value + b"}"


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values, st.sampled_from(["spine", "slice"]), st.integers(3, 8))
def test_property_large_outputs_are_written_in_pieces_exactly(
    value: Any, where: str, max_depth: int
) -> None:
    """Over 64 KiB the value is checked piece by piece: the same value, or too_deep, exactly."""
    data = _large(orjson.dumps(value), where)
    assert len(data) > 2 * strict_json.DUMP_SLICE_BYTES
    depth = max(3, 2 + _depth(value)) if where == "slice" else max(3, 1 + _depth(value))
    expected = ("accept", repr(orjson.loads(data))) if depth <= max_depth else "too_deep"
    result = big(data, max_depth)
    assert (result if result[0] == "accept" else result[1]) == expected


@pytest.mark.parametrize(
    ("inner", "expected"),
    [
        (b'{"a": 1, "a": 2}', "duplicate_name"),
        (b'{"a": {"b": 1, "b": 1}}', "duplicate_name"),
        (
            b"{" + b",".join(b'"k%d": %d' % (i, i) for i in range(40)) + b', "k3": 0}',
            "duplicate_name",
        ),
        (b'{"a\\u003a": 1, "a:": 2}', "duplicate_name"),
        (b'{"a\\u003a": 1, "b:": [":"]}', "accept"),
        (b"[18446744073709551616]", "number_out_of_range"),
        (b"-9223372036854775809", "number_out_of_range"),
        (b"[18446744073709551615, -9223372036854775808]", "accept"),
        (b"[[[[[[[[]]]]]]]]", "too_deep"),  # depth 8: 9 on the spine, 10 in a slice
        (b"[[[[]]]]", "accept"),  # depth 4: 5 or 6
        (b"{}", "accept"),
        (b"[]", "accept"),
    ],
)
@pytest.mark.parametrize("where", ["spine", "slice"])
def test_a_fault_in_any_piece_of_a_large_output_is_found(
    inner: bytes, expected: str, where: str, no_reference: None
) -> None:
    """Duplicates, big integers and depth are found on the spine and inside slices alike."""
    data = _large(inner, where)
    result = big(data, max_depth=8)
    assert (result[0] if expected == "accept" else result[1]) == expected


@pytest.mark.parametrize("duplicate", [False, True])
def test_a_large_object_is_written_in_slices_of_members(duplicate: bool) -> None:
    """An object of 150 000 members is written in pieces; a name repeated across them is found."""
    members = [b'"m%d": "v:%d"' % (i, i) for i in range(150_000)]
    if duplicate:
        members.append(b'"m7": 0')
    data = b"{" + b",".join(members) + b"}"
    assert len(data) > 2 * strict_json.DUMP_SLICE_BYTES
    result = big(data)
    assert (result[1] if duplicate else result[0]) == ("duplicate_name" if duplicate else "accept")


@pytest.mark.parametrize("between", [b"", b"\\\\", b"\\\\\\\\\\\\", b"ab"])
@pytest.mark.parametrize("duplicate", [False, True])
def test_escaped_colons_are_counted_exactly_across_pieces(between: bytes, duplicate: bool) -> None:
    """Over 1 MiB the escaped colons are counted piece by piece: none split, none missed."""
    text = (b"\\\\\\u003a" + between + b"x\\u003A") * 160_000  # backslash+colon, then a colon
    tail = b'{"a": 1, "a": "\\u003a"}' if duplicate else b'{"a": 1, "b": "\\u003a"}'
    data = b'{"s": "' + text + b'", "t": ' + tail + b"}"
    assert len(data) > 2 * strict_json.DUMP_SLICE_BYTES
    result = big(data)
    assert (result[1] if duplicate else result[0]) == ("duplicate_name" if duplicate else "accept")
    if not duplicate:
        assert loads_big(data)["s"] == json.loads(data)["s"]


def loads_big(data: bytes) -> Any:
    return strict_loads(data, max_bytes=len(data), max_depth=DEFAULT_MAX_DEPTH)


@pytest.mark.parametrize("depth", [4, 5])
def test_depth_checked_past_bracket_count_size(depth: int) -> None:
    """Over BRACKET_COUNT_MAX_BYTES (no bracket count) depth is still exact, either side of it."""
    pad = "x" * strict_json.BRACKET_COUNT_MAX_BYTES
    data = ("[" * (depth - 1) + f'{{"a": "{pad}"}}' + "]" * (depth - 1)).encode()
    assert len(data) > strict_json.BRACKET_COUNT_MAX_BYTES
    if depth <= 4:
        assert strict_loads(data, max_bytes=len(data), max_depth=4) is not None
    else:
        with pytest.raises(StrictJSONError) as err:
            strict_loads(data, max_bytes=len(data), max_depth=4)
        assert err.value.reason == "too_deep"


def test_wrapping_chain_in_use_is_not_shared() -> None:
    """A chain holding a value (a re-entrant call) is never handed out again: a fresh one is."""
    outer, hole = strict_json._chain(7)
    assert strict_json._chain(7) == (outer, hole)  # cached, empty: the same chain
    hole.append(1)
    try:
        fresh_outer, fresh_hole = strict_json._chain(7)
        assert fresh_hole is not hole and not fresh_hole
        fresh_hole.append(1)
        assert orjson.dumps(fresh_outer) == orjson.dumps(outer) == b"[" * 7 + b"1" + b"]" * 7
    finally:
        hole.clear()


def test_wrapping_chains_cache_is_bounded() -> None:
    """Past MAX_CACHED_CHAINS wraps counts a chain is built each time, never cached."""
    for wraps in range(1, strict_json.MAX_CACHED_CHAINS + 3):
        outer, hole = strict_json._chain(wraps)
        hole.append(0)
        assert orjson.dumps(outer).count(b"[") == wraps
        hole.clear()
    big = strict_json.MAX_CACHED_CHAINS + 2
    assert strict_json._chain(big)[0] is not strict_json._chain(big)[0]
