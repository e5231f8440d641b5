"""Parameter patterns rewritten for the dispatcher mean what jsonschema-rs makes of them.

The daemon judges ``pattern`` with jsonschema-rs (ECMA-262 onto Rust's regex);
the host's dispatcher with Python's ``re`` on ``dispatch.patterns.translate``'s
rewrite. A value the daemon refuses must never pass on the host, so the two
are compared here on the shipped patterns, on the traps that tell the engines
apart, and on random patterns and strings of the supported subset, against
both of jsonschema-rs's engines (its default, and ``RegexOptions``, the linear
one the daemon is moving to).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from sshadapter.dispatch.patterns import MAX_REPEAT, translate

ROOT = Path(__file__).resolve().parents[2]
ENGINES: dict[str, dict[str, Any]] = {
    "default": {},
    "regex": {"pattern_options": jsonschema_rs.RegexOptions()},
}


def daemon_loads(pattern: str) -> bool:
    """Whether the daemon takes the pattern at all (a command file with it does not load)."""
    try:
        jsonschema_rs.validator_for({"type": "string", "pattern": pattern})
    except jsonschema_rs.ValidationError:
        return False
    return True


def daemon_accepts(pattern: str, value: str, engine: str = "default") -> bool:
    """What the daemon's schema validator says about ``value`` for ``pattern``."""
    schema = {"type": "string", "pattern": pattern}
    return bool(jsonschema_rs.validator_for(schema, **ENGINES[engine]).is_valid(value))


def host_accepts(pattern: str, value: str) -> bool:
    """What the dispatcher says: Python's re.search on the rewritten pattern."""
    return re.search(translate(pattern), value) is not None


def shipped_patterns() -> list[str]:
    patterns = []
    for path in sorted((ROOT / "commands").glob("*.toml")):
        for param in tomllib.loads(path.read_text()).get("params", {}).values():
            if "pattern" in param:
                patterns.append(param["pattern"])
    return patterns


# Where Python's re alone would say yes and the daemon says no (or the reverse).
TRAPS = [
    (r"^/[a-z]*$", "/\n"),  # $ before a final newline
    (r"^/[a-z]*$", "/abc\n"),
    (r"^[0-9a-z-]+$", "bluebird\n"),
    (r"^\d+$", "٣"),  # Arabic-Indic digit: Unicode \d
    (r"^\d+$", "12\n"),
    (r"^\w+$", "é"),  # Unicode \w
    (r"^\W$", "é"),
    (r"^\D$", "٣"),
    (r"^.$", "\n"),
    (r"^.$", "\r"),  # ECMA's . excludes every line terminator
    (r"^.$", "\u2028"),
    (r"^.$", "\u2029"),
    (r"^.$", "\x85"),
    (r"^a.c$", "a\nc"),
    (r"^[^a]$", "\n"),
    (r"^(a|b)$", "a\n"),
    (r"^ab$", "ab\n"),
    (r"^a", "ba"),
    (r"b$", "b\n"),
    (r"^\x41$", "A"),
    (r"^[\x41-\x43]+$", "ABC"),
    (r"^a{2,3}$", "aaaa"),
    (r"^(?:ab)+?$", "abab"),
    (r"^[\d\w-]+$", "a-1_"),
    (r"^[é-ü]$", "ñ"),
    (r"^$", ""),
    (r"^$", "\n"),
    (r"^a\.b$", "a.b"),
    (r"^a\.b$", "axb"),
    (r"^\/x$", "/x"),
]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize(("pattern", "value"), TRAPS)
def test_the_traps_are_judged_as_the_daemon_judges_them(
    pattern: str, value: str, engine: str
) -> None:
    """Each case that tells Python's re from jsonschema-rs gets the daemon's answer."""
    assert host_accepts(pattern, value) == daemon_accepts(pattern, value, engine)


def test_a_trailing_newline_never_passes_where_the_daemon_refuses_it() -> None:
    """The brief's trap: ^/[a-z]*$ takes "/\\n" in Python's re, not on the host."""
    assert re.search(r"^/[a-z]*$", "/\n") is not None  # why the rewrite exists
    assert not host_accepts(r"^/[a-z]*$", "/\n")
    assert translate(r"^/[a-z]*$") == r"\A/[a-z]*\Z"


SAMPLE_VALUES = [
    "/",
    "/\n",
    "/etc/passwd",
    "/var/log/../x",
    "-rf",
    "ssh.service",
    "ssh.service\n",
    "a b",
    "CR-1042",
    "CR-1042\n",
    "bluebird",
    "blue_bird",
    "",
    "é",
    "/" + "a" * 300,
]


@pytest.mark.parametrize("pattern", shipped_patterns())
def test_every_shipped_pattern_agrees_on_sample_values(pattern: str) -> None:
    """The shipped parameter patterns translate, and agree on values near their edges."""
    for value in SAMPLE_VALUES:
        for engine in ENGINES:
            assert host_accepts(pattern, value) == daemon_accepts(pattern, value, engine), value


@pytest.mark.parametrize(
    ("pattern", "construct"),
    [
        (r"^a\b", r"\b"),
        (r"^\Bx", r"\B"),
        (r"^(?=a)", "lookaround"),
        (r"^(?!a)", "lookaround"),
        (r"^(a)\1$", r"\1"),
        (r"^\p{L}$", r"\p"),
        (r"(?i)^a$", "flag"),
        (r"^(?<=a)b$", "lookaround"),
        (r"^(?<!a)b$", "lookaround"),
        (r"^(?<1x>a)$", "named group"),
        (r"^(?<x a)$", "named group"),
        (r"^[\S]$", r"\S"),
        (r"^[a-\s]$", "range end"),
        (r"^\uD800$", "surrogate"),
        (r"^\uDE00$", "surrogate"),
        (r"^\u{D800}$", "surrogate"),
        (r"^\u{110000}$", "beyond Unicode"),
        (r"^\u12$", "hexadecimal digits"),
        (r"^\u{}$", "hexadecimal digits"),
        (r"^\u{12$", "hexadecimal digits"),
        (r"^\u00g1$", "hexadecimal digits"),
        (r"^\c1$", r"\c"),
        (r"^\c$", r"\c"),
        (r"^[[:alpha:]]$", "'['"),
        (r"^[a&&b]$", "&&"),
        (r"^[a--b]$", "--"),
        (r"^[a~~b]$", "~~"),
        (r"^a**$", "quantifier on a quantifier"),
        (r"^a{2}{3}$", "quantifier on a quantifier"),
        (r"^a*+$", "quantifier on a quantifier"),
        (r"^*a$", "anchor"),
        (r"*a", "nothing to repeat"),
        (r"^a{,2}$", "{n,m}"),
        (r"^a{3,2}$", "m < n"),
        (r"^a{1001}$", f"over {MAX_REPEAT}"),
        (r"^a]$", "unescaped"),
        (r"^a}$", "unescaped"),
        (r"^a{$", "{n,m}"),
        (r"^(a$", "unclosed group"),
        (r"^a)$", "unbalanced"),
        (r"^[a$", "unclosed class"),
        (r"^[]$", "empty class"),
        (r"^[a-b-c]$", "'-'"),
        (r"^[z-a]$", "range"),
        (r"^[\d-z]$", "'-'"),
        (r"^[a-\d]$", "range end"),
        ("^a\tb$", "control character"),
        (r"^\k<x>$", r"\k"),
        (r"^\0$", r"\0"),
        (r"^\x4$", r"\x"),
    ],
)
def test_constructs_outside_the_subset_are_refused_by_name(pattern: str, construct: str) -> None:
    """Anything the two engines might read differently is refused, saying what and where."""
    with pytest.raises(ValueError, match=re.escape(construct)):
        translate(pattern)


# Every escape and group form the rewrite supports, against both engines, on strings at
# their edges (defect: `\u` was refused, so such an operation could not run on a dispatch host).
ECMA_SPACES = "\t\n\x0b\x0c\r \xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
NOT_SPACES = "\x1c\x1d\x1e\x1f\x85\u180e\u200b\u2060a0_"
SUPPORTED: list[tuple[str, list[str]]] = [
    (r"^[a-z\u00e0-\u00ff]{1,20}$", ["abc", "àbc", "ÿ", "é", "ā", "À", "a\n", "", "a" * 21]),
    (r"^\u0041\u00e9$", ["Aé", "A", "Aé\n", "ae"]),
    (r"^\u0000?a$", ["\x00a", "a", "\x00"]),
    (r"^[\u0000-\u001f]+$", ["\x00\x1f", "\t", " ", "\x7f"]),
    (r"^\u2028$", ["\u2028", "\n"]),
    (r"^[^\u0041-\u005a]$", ["A", "a", "Z", "["]),
    (r"^\uFFFD\uffff$", ["\ufffd\uffff", "\ufffd"]),
    (r"^\u{41}\u{1F600}$", ["A😀", "A", "u" * 41]),
    (r"^[\u{1F600}-\u{1F64F}]$", ["😀", "🙏", "😀😀", "a"]),
    (r"^\u002e$", [".", "a"]),  # an escaped metacharacter is the character itself
    (r"^[\u005d\u005c]$", ["]", "\\", "a"]),
    (r"^\cJ\cj\cI$", ["\n\n\t", "cJcjcI"]),
    (r"^[\cA-\cZ]$", ["\x01", "\x1a", "\x1b", "A"]),
    (r"^\s$", [*ECMA_SPACES, *NOT_SPACES]),
    (r"^\S$", [*ECMA_SPACES, *NOT_SPACES]),
    (r"^[\s\d]+$", [" 1\t2\ufeff", "1\x85", "\u200b"]),
    (r"^[^\s]+$", ["abc", "a b", "a\x85", "a\ufeff"]),
    (r"^a\s*b$", ["ab", "a \u3000b", "a\x1cb"]),
    (r"^(?<year>[0-9]{4})-(?<month>[0-9]{2})$", ["2026-01", "2026-1", "2026-01\n"]),
    (r"^(?P<x>a|b)+$", ["abba", "abc", ""]),
    (r"^(?<x>a)(?:b)(c)$", ["abc", "ab"]),
]


@pytest.mark.parametrize("engine", sorted(ENGINES))
@pytest.mark.parametrize(("pattern", "values"), SUPPORTED, ids=[p for p, _ in SUPPORTED])
def test_each_supported_escape_is_judged_as_the_daemon_judges_it(
    pattern: str, values: list[str], engine: str
) -> None:
    """\\u, \\u{..}, \\c, \\s, \\S and named groups: the host says what jsonschema-rs says."""
    assert daemon_loads(pattern)
    for value in values:
        assert host_accepts(pattern, value) == daemon_accepts(pattern, value, engine), value


# Random patterns of the subset, and strings made of the characters that matter to them.

_LITERALS = st.sampled_from(
    [*"ab-_/.:é", r"\.", r"\-", r"\/", r"\n", r"\x41", r"\$", r"\u00e9", r"\u{41}", r"\cJ"]
)
_CLASS_ITEMS = st.sampled_from(
    [
        *("a", "b", "z", "0", "9", "a-c", "0-9", "é", r"\d", r"\w", r"\s", r"\n", r"\-", r"\]"),
        *(".", "_", "/", r"\u00e0-\u00ff", r"\u0041", r"\cI"),
    ]
)


@st.composite
def _class(draw: Callable[..., Any]) -> str:
    items = draw(st.lists(_CLASS_ITEMS, min_size=1, max_size=4))
    negated = draw(st.booleans())
    return "[" + ("^" if negated else "") + "".join(items) + "]"


_ATOMS = st.one_of(
    _LITERALS,
    _class(),
    st.sampled_from([".", r"\d", r"\D", r"\w", r"\W", r"\s", r"\S"]),
)
_QUANTIFIERS = st.sampled_from(["", "", "*", "+", "?", "{2}", "{0,3}", "{1,}", "*?", "{1,2}?"])


def _patterns() -> st.SearchStrategy[str]:
    def sequence(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        quantified = st.tuples(inner, _QUANTIFIERS).map("".join)
        return st.lists(quantified, min_size=0, max_size=4).map("".join)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        grouped = st.lists(sequence(inner), min_size=1, max_size=3).map(
            lambda branches: "(" + "|".join(branches) + ")"
        )
        return st.one_of(
            grouped,
            grouped.map(lambda g: "(?:" + g[1:]),
            grouped.map(lambda g: "(?<g>" + g[1:]),
        )

    body = st.recursive(_ATOMS, extend, max_leaves=6)
    anchored = st.tuples(
        st.sampled_from(["", "^"]), sequence(body), st.sampled_from(["", "$"])
    ).map("".join)
    return st.lists(anchored, min_size=1, max_size=2).map("|".join)


_ALPHABET = st.sampled_from(list("ab-_/.:0A9zé٣\n\r\u2028\u2029\x85 $]\t\xa0\ufeff\x1cÿà"))


@settings(max_examples=400, deadline=None)
@given(_patterns(), st.lists(st.lists(_ALPHABET, max_size=8).map("".join), max_size=12))
def test_random_patterns_agree_with_both_engines(pattern: str, values: list[str]) -> None:
    """For random patterns of the subset and random strings, host and daemon agree."""
    assume(daemon_loads(pattern))  # one the daemon refuses never reaches a policy
    translated = translate(pattern)
    for value in values:
        for engine in ENGINES:
            expected = daemon_accepts(pattern, value, engine)
            assert (re.search(translated, value) is not None) == expected, (pattern, value, engine)


@settings(max_examples=200, deadline=None)
@given(_patterns())
def test_a_rewritten_pattern_compiles_on_every_python(pattern: str) -> None:
    """The rewrite uses no syntax newer than Python 3.9's re, and no warning-worthy set."""
    translated = translate(pattern)
    assert re.search(r"\(\?[^:]", translated) is None  # only (?: groups
    re.compile(translated)  # FutureWarning (nested sets, && and --) is an error here
