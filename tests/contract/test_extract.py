"""Strict extractors for text output: every line accounted for, strict types."""

from __future__ import annotations

import pytest

from sshadapter.contract.extract import (
    MAX_COUNT_KEYS,
    JsonFormat,
    JsonlFormat,
    KvFormat,
    LinesFormat,
    RegexFormat,
    convert,
)
from sshadapter.contract.linear_regex import compile_linear
from sshadapter.errors import EvidenceError

DF_HEADER = compile_linear(r"^Filesystem +1024-blocks +Used +Available +Capacity +Mounted on$")
DF_ROW = compile_linear(
    r"^(?P<filesystem>\S+) +(?P<size_kb>[0-9]+) +(?P<used_kb>[0-9]+) +(?P<available_kb>[0-9]+)"
    r" +(?P<capacity_pct>[0-9]{1,3})% +(?P<mounted_on>/\S*)$"
)
DF_TYPES = {"size_kb": "integer", "used_kb": "integer", "capacity_pct": "integer"}
DF_OUT = (
    b"Filesystem     1024-blocks     Used Available Capacity Mounted on\n"
    b"/dev/vda         264212084 22831984  83558928      22% /\n"
)
LOADAVG = compile_linear(
    r"^(?P<load1>[0-9]+\.[0-9]+) (?P<load5>[0-9]+\.[0-9]+) (?P<load15>[0-9]+\.[0-9]+)"
    r" (?P<running>[0-9]+)/(?P<total>[0-9]+) (?P<last_pid>[0-9]+)$"
)


def df(shape: str = "one", max_rows: int = 1) -> LinesFormat:
    return LinesFormat(4096, (DF_HEADER,), DF_ROW, shape, max_rows, DF_TYPES)  # type: ignore[arg-type]


def reason_of(fmt: object, stdout: bytes) -> tuple[str, str, str]:
    with pytest.raises(EvidenceError) as info:
        fmt.parse(stdout)  # type: ignore[attr-defined]
    return info.value.stage, info.value.reason, info.value.detail


def test_lines_one_row_is_the_result() -> None:
    """df output with its header and one row becomes the typed row object."""
    row = df().parse(DF_OUT)
    assert row == {
        "filesystem": "/dev/vda",
        "size_kb": 264212084,
        "used_kb": 22831984,
        "available_kb": "83558928",
        "capacity_pct": 22,
        "mounted_on": "/",
    }


def test_lines_rows_shape_wraps_rows() -> None:
    """shape = rows yields {"rows": [...]} with every row typed."""
    out = DF_OUT + b"tmpfs 100 0 100 0% /tmp\n"
    assert [r["mounted_on"] for r in df("rows", 5).parse(out)["rows"]] == ["/", "/tmp"]


def test_lines_unmatched_line_names_its_number_for_the_audit() -> None:
    """An extra line rejects the whole output; the line number is in the detail only."""
    assert reason_of(df("rows", 5), DF_OUT + b"df: /mnt: Permission denied\n") == (
        "extract",
        "unmatched_line",
        "line 3",
    )


def test_lines_missing_header_rejects() -> None:
    """Without the header line, the data line cannot be trusted as a row."""
    assert reason_of(df(), DF_OUT.split(b"\n", 1)[1])[1] == "missing_header"


def test_lines_shape_one_refuses_a_second_row() -> None:
    """shape = one means exactly one row: a second row is too many."""
    assert reason_of(df(), DF_OUT + DF_OUT.split(b"\n", 1)[1])[1] == "too_many_rows"


def test_lines_shape_one_refuses_no_row() -> None:
    """A header alone is not a fact."""
    assert reason_of(df(), DF_OUT.split(b"\n", 1)[0] + b"\n")[1] == "no_rows"


def test_banner_before_output_rejects() -> None:
    """A login banner is an unmatched line, not something to skip."""
    assert reason_of(df(), b"Welcome to prod-7!\n" + DF_OUT)[1] == "missing_header"


def test_regex_fullmatches_whole_output_with_one_trailing_newline() -> None:
    """/proc/loadavg with its newline parses; two newlines do not."""
    fmt = RegexFormat(4096, LOADAVG, {"load1": "number", "running": "integer"})
    assert fmt.parse(b"0.07 0.11 0.05 1/80 2344\n")["load1"] == 0.07
    assert reason_of(fmt, b"0.07 0.11 0.05 1/80 2344\n\n")[1] == "unmatched_line"
    assert reason_of(fmt, b"0.07 0.11 0.05 1/80 2344 extra")[1] == "unmatched_line"


def test_kv_needs_every_key_exactly_once_and_nothing_else() -> None:
    """kv: a missing key, a repeated key and an unknown key each reject."""
    fmt = KvFormat(4096, "=", ("ActiveState", "SubState", "MainPID"), {"MainPID": "integer"})
    good = b"MainPID=812\nActiveState=active\nSubState=running\n"
    assert fmt.parse(good) == {"MainPID": 812, "ActiveState": "active", "SubState": "running"}
    assert reason_of(fmt, b"MainPID=812\nActiveState=active\n")[1] == "missing_key"
    assert reason_of(fmt, good + b"SubState=dead\n")[1] == "duplicate_key"
    assert reason_of(fmt, good + b"Description=pwned\n")[1:] == ("unmatched_line", "line 4")
    assert reason_of(fmt, good.replace(b"MainPID=812", b"MainPID 812"))[1] == "unmatched_line"


def test_kv_optional_key_may_be_absent_but_not_repeated() -> None:
    """An optional key absent is an absent field (not null); present, it is typed; twice rejects."""
    fmt = KvFormat(4096, "=", ("ActiveState", "SubState"), {"MainPID": "integer"}, ("MainPID",))
    target = b"ActiveState=active\nSubState=active\n"
    assert fmt.parse(target) == {"ActiveState": "active", "SubState": "active"}
    assert fmt.parse(b"MainPID=812\n" + target)["MainPID"] == 812
    assert reason_of(fmt, b"MainPID=812\nMainPID=813\n" + target)[1] == "duplicate_key"
    assert reason_of(fmt, b"MainPID=x\n" + target)[1] == "bad_type"
    assert reason_of(fmt, b"MainPID=812\nActiveState=active\n")[1:] == ("missing_key", "SubState")
    assert reason_of(fmt, target + b"ControlPID=0\n")[1] == "unmatched_line"


def test_kv_value_keeps_later_separators() -> None:
    """Only the first separator splits: a value may contain '='."""
    fmt = KvFormat(4096, "=", ("Environment",), {})
    assert fmt.parse(b"Environment=A=1 B=2\n") == {"Environment": "A=1 B=2"}


@pytest.mark.parametrize(
    ("kind", "raw"),
    [
        ("integer", "12a"),
        ("integer", "+1"),
        ("integer", " 1"),
        ("integer", "0x10"),
        ("integer", "01"),
        ("integer", "99999999999999999999"),
        ("number", "1e999"),
        ("number", "nan"),
        ("number", "1."),
        ("boolean", "yes"),
        ("boolean", "True"),
    ],
)
def test_types_convert_strictly(kind: str, raw: str) -> None:
    """A field that is almost a number or a boolean rejects instead of being coerced."""
    with pytest.raises(EvidenceError) as info:
        convert({"f": raw}, {"f": kind}, line=2)  # type: ignore[dict-item]
    assert (info.value.reason, info.value.detail) == ("bad_type", f"line 2: f: not {kind}")


def test_types_accept_canonical_forms() -> None:
    """Canonical integers, numbers and booleans convert to Python values."""
    got = convert(
        {"i": "-42", "n": "1.5e3", "b": "false", "s": "x"},
        {"i": "integer", "n": "number", "b": "boolean"},
        line=1,
    )
    assert got == {"i": -42, "n": 1500.0, "b": False, "s": "x"}


def test_control_characters_reject_text_output() -> None:
    """ANSI escapes and carriage returns hidden in a line are refused."""
    fmt = KvFormat(4096, "=", ("A",), {})
    assert reason_of(fmt, b"A=\x1b[31mred\n")[1:] == ("control_character", "line 1")
    assert reason_of(fmt, b"A=ok\r\n")[1] == "control_character"


def test_text_output_must_be_utf8_and_bounded() -> None:
    """Latin-1 bytes and output over max_bytes are rejected before matching."""
    fmt = KvFormat(16, "=", ("A",), {})
    assert reason_of(fmt, b"A=caf\xe9\n")[1] == "not_utf8"
    assert reason_of(fmt, b"A=" + b"x" * 20)[1] == "too_large"
    assert reason_of(fmt, b"")[1] == "empty"


def test_jsonl_parses_each_line_strictly() -> None:
    """jsonl: one strict value per line; a duplicate name on line 2 is named in the detail."""
    fmt = JsonlFormat(4096, 8, 10)
    assert fmt.parse(b'{"a":1}\n{"a":2}\n') == {"rows": [{"a": 1}, {"a": 2}]}
    stage, reason, detail = reason_of(fmt, b'{"a":1}\n{"a":1,"a":2}\n')
    assert (stage, reason) == ("parse", "duplicate_name") and detail.startswith("line 2")
    assert reason_of(fmt, b'{"a":1}\n\n{"a":2}\n')[1] == "empty"


def test_jsonl_bounds_rows_and_allows_an_empty_stream() -> None:
    """More rows than max_rows rejects; no output at all is zero rows."""
    fmt = JsonlFormat(4096, 8, 2)
    assert reason_of(fmt, b"1\n2\n3\n")[1] == "too_many_rows"
    assert fmt.parse(b"") == {"rows": []}


OS_RELEASE_ROW = compile_linear(
    r'^(?:(?P<key>[A-Z][A-Z0-9_]*)=(?:"(?P<quoted>[^"]*)"|(?P<bare>[a-z0-9.]*))|#.*|)$'
)


def keyed(row: object = OS_RELEASE_ROW, types: dict[str, str] | None = None) -> LinesFormat:
    return LinesFormat(4096, (), row, "keyed", 100, types or {})  # type: ignore[arg-type]


def test_keyed_rows_become_one_object_named_by_their_key() -> None:
    """shape = keyed: a member per row, valued by whichever spelling took part."""
    out = b'NAME="Debian GNU/Linux"\n# a comment\n\nID=debian\nVERSION_ID="12"\n'
    assert keyed().parse(out) == {"NAME": "Debian GNU/Linux", "ID": "debian", "VERSION_ID": "12"}


def test_keyed_values_are_typed_under_their_group_name() -> None:
    """/proc/meminfo: the value group's type converts every member's value."""
    row = compile_linear(r"^(?P<key>[A-Za-z_()]+): +(?P<value>[0-9]+)(?: kB)?$")
    out = b"MemTotal:       24683784 kB\nHugePages_Total:       0\n"
    assert keyed(row, {"value": "integer"}).parse(out) == {
        "MemTotal": 24683784,
        "HugePages_Total": 0,
    }
    assert reason_of(keyed(row, {"value": "integer"}), b"MemTotal: 099 kB\n")[:2] == (
        "extract",
        "bad_type",
    )


def test_keyed_refuses_a_key_twice_and_any_unmatched_line() -> None:
    """A key written twice is a lie about which value holds; a stray line is unaccounted for."""
    assert reason_of(keyed(), b"ID=debian\nID=fedora\n") == (
        "extract",
        "duplicate_key",
        "line 2: ID",
    )
    assert reason_of(keyed(), b"ID=debian\nID='x'\n")[:2] == ("extract", "unmatched_line")


def test_keyed_two_spellings_at_once_are_ambiguous() -> None:
    """Value groups are alternatives: a row pattern that lets two take part is refused per line."""
    row = compile_linear(r"^(?P<key>[A-Z]+)=(?P<a>[a-z]+)(?P<b>[0-9]+)?$")
    assert keyed(row).parse(b"ID=x\n") == {"ID": "x"}
    assert reason_of(keyed(row), b"ID=x1\n") == ("extract", "ambiguous_value", "line 1: ID")


def test_keyed_with_only_blank_lines_is_an_empty_object() -> None:
    """Lines that name nothing make no member: the schema decides what must be there."""
    assert keyed().parse(b"# nothing\n\n") == {}


STATE_ROW = compile_linear(r"^ *(?P<state>[A-Za-z])(?P<extra> x)?$")


def counted(max_rows: int = 100) -> LinesFormat:
    return LinesFormat(4096, (), STATE_ROW, "rows", max_rows, {}, "state")


def test_count_by_counts_every_row_by_its_field() -> None:
    """count_by turns matched rows into a total and a count per value of one field."""
    assert counted().parse(b"S\nR\n S\nI\nS\n") == {
        "total": 5,
        "counts": {"S": 3, "R": 1, "I": 1},
    }


def test_count_by_still_accounts_for_every_line() -> None:
    """A line the row pattern does not match rejects the whole count, as it would the rows."""
    assert reason_of(counted(), b"S\nLast login: today\nR\n") == (
        "extract",
        "unmatched_line",
        "line 2",
    )
    assert reason_of(counted(max_rows=2), b"S\nR\nS\n")[:2] == ("extract", "too_many_rows")


def test_count_by_counts_only_the_rows_that_have_the_field() -> None:
    """A row matched by another alternative of the pattern is accounted for, not counted."""
    row = compile_linear(r"^(?:(?P<verdict>yes|no)|  \* [a-z]+|)$")
    fmt = LinesFormat(4096, (), row, "rows", 10, {}, "verdict")
    assert fmt.parse(b"  * kernel\n\nyes\n") == {"total": 1, "counts": {"yes": 1}}
    assert reason_of(fmt, b"  * kernel\nmaybe\n") == ("extract", "unmatched_line", "line 2")


def test_count_by_refuses_more_distinct_values_than_its_bound() -> None:
    """More distinct values than MAX_COUNT_KEYS is no summary: the output is refused."""
    row = compile_linear(r"^(?P<unit>[a-z0-9]+)$")
    fmt = LinesFormat(10**6, (), row, "rows", 5000, {}, "unit")
    many = b"".join(b"u%d\n" % i for i in range(MAX_COUNT_KEYS + 1))
    assert reason_of(fmt, many)[:2] == ("extract", "too_many_count_keys")
    assert fmt.parse(b"a\nb\na\n") == {"total": 3, "counts": {"a": 2, "b": 1}}


def test_count_by_on_an_empty_table_is_zero_rows() -> None:
    """An empty table after the header counts nothing: total 0 and no keys."""
    header = compile_linear(r"^STATE$")
    fmt = LinesFormat(4096, (header,), STATE_ROW, "rows", 10, {}, "state")
    assert fmt.parse(b"STATE\n") == {"total": 0, "counts": {}}


def test_count_by_with_no_output_is_a_count_of_nothing() -> None:
    """Empty stdout and no header is zero rows counted; the schema decides if zero answers."""
    assert counted().parse(b"") == {"total": 0, "counts": {}}


def test_a_table_without_header_may_have_no_line_but_one_with_a_header_may_not() -> None:
    """Empty stdout is zero rows for a headerless table; with a header it is refused (missing)."""
    headerless = LinesFormat(4096, (), STATE_ROW, "rows", 10, {})
    assert headerless.parse(b"") == {"rows": []}
    assert reason_of(df("rows", 10), b"")[:2] == ("extract", "empty")
    assert reason_of(df(), b"")[:2] == ("extract", "empty")


def test_count_by_matches_each_distinct_line_once_with_the_same_verdicts() -> None:
    """Repeated lines are matched once; the line numbers of a refusal are still exact."""
    assert counted(5).parse(b"S\nS\nS\nR\nS\n") == {"total": 5, "counts": {"S": 4, "R": 1}}
    assert reason_of(counted(5), b"S\nS\nS\nR\nS\nS\n") == ("extract", "too_many_rows", "line 6")
    assert reason_of(counted(5), b"S\nS\nS\nR\nS\nQQ\n") == ("extract", "unmatched_line", "line 6")


def test_json_wrap_makes_a_top_level_array_a_member() -> None:
    """output.wrap: an array document (ip -j) becomes {wrap: array}; without it, the document."""
    assert JsonFormat(4096, 8, "links").parse(b'[{"ifname":"lo"}]\n') == {
        "links": [{"ifname": "lo"}]
    }
    assert JsonFormat(4096, 8).parse(b'[{"ifname":"lo"}]') == [{"ifname": "lo"}]
    assert reason_of(JsonFormat(4096, 8, "links"), b"[1] x")[:2] == ("parse", "trailing_data")
