"""Operator patterns run in linear time on untrusted text, whatever the operator wrote.

Extractor patterns go through RE2 (sshadapter/contract/linear_regex.py), parameter and
schema patterns through jsonschema-rs's linear engine; a construct neither can
run in linear time is a load error naming the file, the key and the construct.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from test_commands import replaced, write

from sshadapter.contract import linear_regex
from sshadapter.contract.linear_regex import LinearRegexError, compile_linear
from sshadapter.contract.registry import load_registry
from sshadapter.contract.schemas import SchemaSet
from sshadapter.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
# The example: nested quantifiers; Python's re needs seconds for 26 bytes, and
# each byte more doubles it. 40 bytes would take hours.
PATHOLOGICAL_ROW = r"^(?P<x>(\S+ ?)+)$"
PATHOLOGICAL_LINE = "a" * 39 + "\t"


def test_the_fast_binding_is_in_use() -> None:
    """google-re2's binding has the shape linear_regex relies on (else: the slow public path)."""
    assert linear_regex.FAST_PATH


def test_named_groups_and_spans_match_the_python_engine() -> None:
    """Groups come back by name, unmatched optional groups as None, ASCII and UTF-8 alike."""
    pattern = compile_linear(r"^(?P<a>[a-z]+)(?: (?P<b>[0-9]+))?(?P<c>é*)$")
    assert pattern.groups == ("a", "b", "c")
    assert pattern.groupdict(b"abc 12") == {"a": "abc", "b": "12", "c": ""}
    assert pattern.groupdict(b"abc") == {"a": "abc", "b": None, "c": ""}
    assert pattern.groupdict("xé".encode()) == {"a": "x", "b": None, "c": "é"}
    assert pattern.groupdict(b"abc 12", "abc 12") == {"a": "abc", "b": "12", "c": ""}
    assert pattern.groupdict(b"ABC") is None


def test_the_pathological_line_is_rejected_without_backtracking() -> None:
    """The ReDoS row on a 40-byte line: rejected at once (a 60 s guard, not a timing)."""
    script = f"""
from sshadapter.contract.extract import LinesFormat
from sshadapter.errors import EvidenceError
from sshadapter.contract.linear_regex import compile_linear
fmt = LinesFormat(1 << 20, (), compile_linear({PATHOLOGICAL_ROW!r}), "rows", 100000, {{}})
try:
    fmt.parse(({PATHOLOGICAL_LINE!r} + "\\n").encode() * 20000)
except EvidenceError as exc:
    print(exc.reason)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert done.stdout.strip() == "unmatched_line", done.stderr


@pytest.mark.parametrize(
    ("construct", "pattern"),
    [
        ("lookahead", r"^(?=x)(?P<item_id>[a-z]+) (?P<state>up|down)$"),
        ("backreference", r"^(?P<item_id>[a-z]+) (?P<state>up|down) \1$"),
        ("\\Z", r"^(?P<item_id>[a-z]+) (?P<state>up|down)\Z"),
    ],
)
def test_an_extractor_pattern_re2_refuses_is_a_load_error(
    tmp_path: Path, construct: str, pattern: str
) -> None:
    """Lookaround, backreferences, \\Z: refused at load, naming file, key and what RE2 said."""
    text = replaced('format = "json"', f"format = \"regex\"\npattern = '{pattern}'")
    commands, schemas = write(tmp_path, {"item_status.toml": text})
    with pytest.raises(ConfigError) as refused:
        load_registry(commands, schemas, hosts=None)
    assert refused.value.key == "output.pattern"
    assert "linear-time engine (RE2)" in refused.value.reason
    assert ("invalid" in refused.value.reason) or ("missing" in refused.value.reason)


def test_a_parameter_pattern_with_lookaround_is_a_load_error(tmp_path: Path) -> None:
    """A parameter pattern the linear engine cannot run: refused, naming params.NAME.pattern."""
    text = replaced("pattern = '^[a-z]{1,8}$'", "pattern = '^(?!x)[a-z]{1,8}$'")
    commands, schemas = write(tmp_path, {"item_status.toml": text})
    with pytest.raises(ConfigError) as refused:
        load_registry(commands, schemas, hosts=None)
    assert refused.value.key == "params.item_id.pattern"
    assert "invalid perl operator: (?!" in refused.value.reason


def test_a_schema_pattern_with_a_backreference_is_a_load_error(tmp_path: Path) -> None:
    """A schema `pattern` the linear engine refuses: the schema file and its JSON pointer."""
    (tmp_path / "a.json").write_text(
        '{"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",'
        ' "properties": {"x": {"type": "string", "pattern": "^(a)\\\\1$"}},'
        ' "additionalProperties": false}'
    )
    with pytest.raises(ConfigError) as refused:
        SchemaSet(tmp_path)
    assert (refused.value.file, refused.value.key) == (
        str(tmp_path / "a.json"),
        "/properties/x/pattern",
    )


def test_schema_patterns_run_on_the_linear_engine(tmp_path: Path) -> None:
    """`^(a+)+$` on a long near-match: the schema validator answers (a 60 s guard)."""
    script = """
import jsonschema_rs
from pathlib import Path
from sshadapter.contract.schemas import SchemaSet
schemas = SchemaSet(Path(__import__("sys").argv[1]))
v = schemas.compile({"type": "string", "pattern": "^(a+)+$", "maxLength": 100000}, file="x")
print(v.is_valid("a" * 50000 + "!"))
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.stdout.strip() == "False", done.stderr


def test_an_invalid_pattern_says_so() -> None:
    """A syntax error is a LinearRegexError with RE2's own words."""
    with pytest.raises(LinearRegexError, match="missing"):
        compile_linear("[a-z")


# Unnamed groups around, after, inside and before named ones: structure only, never values.
UNNAMED_GROUP_ROWS = [
    (r"^(?P<x>[a-z]+)( [0-9]+)?$", ["abc 12", "abc"]),  # the issue's: optional, after
    (r"^(?P<x>(\S+ ?)+)$", ["a b c", "abc"]),  # nested inside the named group
    (r"^(?:(?P<x>[a-z]+) )?(y|z)$", ["abc y", "z"]),  # named inside an optional group
    (r"^([0-9]+) (?P<x>[a-z]+)$", ["12 abc"]),  # unnamed before named: not contiguous
    (r"^((?P<x>[a-zé]+)|([0-9]+))( (?P<y>[a-z]+))?$", ["abc def", "12", "12 xy", "é"]),
    (r"^(?P<x>[a-z]+)(((( )))(?P<y>[0-9]*))$", ["ab ", "ab 7"]),
]


@pytest.mark.parametrize(("pattern", "lines"), UNNAMED_GROUP_ROWS)
def test_unnamed_groups_give_no_values(pattern: str, lines: list[str]) -> None:
    """values() and groupdict() give exactly the named groups, as Python's re does."""
    import re

    compiled = compile_linear(pattern)
    for line in lines:
        expected = re.fullmatch(pattern, line)
        assert expected is not None
        data = line.encode()
        ascii_text = line if line.isascii() else None
        assert compiled.groupdict(data) == expected.groupdict()
        assert compiled.values(data, ascii_text) == [expected[n] for n in compiled.groups]


@pytest.mark.parametrize(("pattern", "lines"), UNNAMED_GROUP_ROWS)
def test_a_lines_row_with_unnamed_groups_extracts_its_named_fields(
    pattern: str, lines: list[str]
) -> None:
    """A table whose row has unnamed groups: every line a row of its named fields (no INTERNAL)."""
    import re

    from sshadapter.contract.extract import LinesFormat

    fmt = LinesFormat(1 << 20, (), compile_linear(pattern), "rows", 100, {})
    stdout = "".join(f"{line}\n" for line in lines).encode()
    rows = [re.fullmatch(pattern, line).groupdict() for line in lines]  # type: ignore[union-attr]
    assert fmt.parse(stdout) == {"rows": rows}
