"""Stage 7: turn a command's stdout into exactly one value, or reject it.

``json`` output goes through the strict parser (stage ``parse``). Text output
goes through a strict extractor (stage ``extract``) in which every line must be
accounted for: each pattern must match a whole line (``fullmatch``), any line
that matches nothing rejects the whole output, named groups become fields and
``types`` converts them strictly. Line numbers go to the audit detail, never to
the agent (docs/command-files.md "Text formats").
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from sshadapter.contract.linear_regex import LinearPattern
from sshadapter.errors import EvidenceError
from sshadapter.strict_json import StrictJSONError, strict_loads

FieldType = Literal["integer", "number", "boolean", "string"]
Shape = Literal["one", "rows", "keyed"]

KEY_GROUP: Final = "key"  # the group that names a member of a `keyed` table

DEFAULT_MAX_ROWS: Final = 1000  # rows a text table or jsonl stream may have unless declared
# Distinct values a `count_by` column may take: a count is a handful of states, priorities
# or unit names; more is no summary (the schema's maxProperties usually says fewer).
MAX_COUNT_KEYS: Final = 1000

# Strict conversions: the whole field must have the shape, no spaces, no '+', no '0x'.
# (The project's own patterns below are deterministic: Python's `re` runs them in linear
# time. Operator patterns never run on `re`: see linear_regex.)
_NUMBER_TEXT: Final = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_NUMBER: Final = re.compile(_NUMBER_TEXT)
# Whole columns, one value a line: up to 19 digits (int64 checked after), no sign but "-".
_INTEGER_TEXT: Final = r"-?(?:0|[1-9][0-9]{0,18})"
_INTEGER_COLUMN: Final = re.compile(rf"{_INTEGER_TEXT}(?:\n{_INTEGER_TEXT})*")
_NUMBER_COLUMN: Final = re.compile(rf"{_NUMBER_TEXT}(?:\n{_NUMBER_TEXT})*")
_INT64: Final = range(-(2**63), 2**63)
# C0 controls other than tab and newline, DEL, and C1 controls: an ANSI escape or a
# carriage return hidden in a line is never a fact.
_CONTROL: Final = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class OutputFormat(Protocol):
    """Something that turns stdout bytes into a value or raises EvidenceError."""

    def parse(self, stdout: bytes) -> Any: ...


@dataclass(frozen=True, slots=True)
class JsonFormat:
    """Exactly one strict JSON document; only JSON whitespace around it."""

    max_bytes: int
    max_depth: int
    wrap: str | None = None
    """``output.wrap``: the document becomes ``{wrap: document}``, so a command whose
    document is an array (``ip -j``) has a top-level member for ``[agent] fields``."""

    def parse(self, stdout: bytes) -> Any:
        try:
            document = strict_loads(stdout, max_bytes=self.max_bytes, max_depth=self.max_depth)
        except StrictJSONError as exc:
            raise EvidenceError("parse", exc.reason, exc.detail) from exc
        return document if self.wrap is None else {self.wrap: document}


@dataclass(frozen=True, slots=True)
class JsonlFormat:
    """One strict JSON value per line; yields ``{"rows": [...]}``."""

    max_bytes: int
    max_depth: int
    max_rows: int

    def parse(self, stdout: bytes) -> Any:
        if not stdout:  # an empty stream is zero rows, which the schema may refuse
            return {"rows": []}
        # Raw control characters cannot hide here: the strict parser refuses them in strings.
        lines = _split_lines(_decode(stdout, self.max_bytes, allow_control=True))
        if len(lines) > self.max_rows:
            raise EvidenceError("extract", "too_many_rows", f"{len(lines)} > {self.max_rows}")
        rows = []
        for number, line in enumerate(lines, 1):
            try:
                rows.append(
                    strict_loads(line.encode(), max_bytes=self.max_bytes, max_depth=self.max_depth)
                )
            except StrictJSONError as exc:
                raise EvidenceError("parse", exc.reason, f"line {number}: {exc.detail}") from exc
        return {"rows": rows}


@dataclass(frozen=True, slots=True)
class RegexFormat:
    """One pattern that fullmatches the whole stdout (one trailing newline allowed)."""

    max_bytes: int
    pattern: LinearPattern
    types: Mapping[str, FieldType]

    def parse(self, stdout: bytes) -> Any:
        _decode(stdout, self.max_bytes)  # UTF-8, no control characters
        data = stdout[:-1] if stdout.endswith(b"\n") else stdout
        fields = self.pattern.groupdict(data)
        if fields is None:
            raise EvidenceError("extract", "unmatched_line", "output does not match `pattern`")
        return convert(fields, self.types, line=1)


@dataclass(frozen=True, slots=True)
class LinesFormat:
    """Header lines in order, then rows, each line fullmatched.

    ``keyed``: the rows become one object, a member per row named by its ``key`` group
    (``/proc/meminfo``, ``/etc/os-release``: keys that vary by version, each line
    accounted for). A row whose ``key`` took no part in the match (a blank line, a
    comment, matched by another alternative of ``row``) makes no member. The member's
    value is the one other group that took part: several groups are several spellings
    of one value (quoted and bare), never several values.
    """

    max_bytes: int
    header: Sequence[LinearPattern]
    row: LinearPattern
    shape: Shape
    max_rows: int
    types: Mapping[str, FieldType]
    count_by: str | None = None
    """With ``shape = "rows"``: the rows become ``{"total": N, "counts": {value: n}}``, counted
    by this (string) field, so a count needs no tool on the host (docs/command-files.md)."""
    _columns: tuple[tuple[int, str, Converter], ...] = field(init=False, repr=False)
    """The row's typed groups, (index, name, converter), resolved once per operation."""

    def __post_init__(self) -> None:
        columns = tuple(
            (index, name, _CONVERTERS[kind])
            for index, name in enumerate(self.row.groups)
            if (kind := self.types.get(name, "string")) != "string"
        )
        object.__setattr__(self, "_columns", columns)

    def parse(self, stdout: bytes) -> Any:
        if not stdout and self.shape == "rows" and not self.header:
            # A table without a header prints nothing when it has no row (systemctl
            # --no-legend, journalctl -q): zero rows, as an empty jsonl stream.
            return {"total": 0, "counts": {}} if self.count_by is not None else {"rows": []}
        text = _decode(stdout, self.max_bytes)
        raw_lines = _split_raw(stdout)
        for number, pattern in enumerate(self.header, 1):
            if number > len(raw_lines) or not pattern.matches(raw_lines[number - 1]):
                raise EvidenceError("extract", "missing_header", f"line {number}")
        first = len(self.header)
        if self.count_by is not None:
            return self._counted(raw_lines, first)
        # ASCII (almost every table): byte offsets are character offsets, so groups are
        # sliced from the decoded lines instead of decoded one by one.
        text_lines: list[str] | list[None] = (
            _split_lines(text) if text.isascii() else [None] * len(raw_lines)
        )
        values_of = self.row.values
        table: list[list[Any]] = []
        # One line past max_rows is read: a row there is too many, anything else unmatched.
        stop = first + self.max_rows + 1
        for number, data, line in zip(
            range(first + 1, stop + 1), raw_lines[first:stop], text_lines[first:stop], strict=False
        ):
            values = values_of(data, line)
            if values is None:
                raise EvidenceError("extract", "unmatched_line", f"line {number}")
            if len(table) == self.max_rows:
                raise EvidenceError("extract", "too_many_rows", f"line {number}")
            table.append(values)
        if self.shape == "keyed":
            return self._keyed(table, first)
        rows = self._typed_rows(table, first)
        if self.shape == "rows":
            return {"rows": rows}
        if not rows:
            raise EvidenceError("extract", "no_rows", "shape 'one' needs exactly one row")
        return rows[0]

    def makes_member(self, line: bytes) -> bool:
        """Whether ``line`` is a row that names a member (``keyed``): duplicating it is a lie,
        while a blank or comment line twice is the same file."""
        values = self.row.values(line)
        return values is not None and values[self.row.groups.index(KEY_GROUP)] is not None

    def _keyed(self, table: list[list[Any]], first: int) -> dict[str, Any]:
        """One member per row that names one: a key twice, or two spellings at once, rejects."""
        at = self.row.groups.index(KEY_GROUP)
        converters = {index: to for index, _, to in self._columns}
        spellings = [index for index in range(len(self.row.groups)) if index != at]
        members: dict[str, Any] = {}
        for number, values in enumerate(table, first + 1):
            key = values[at]
            if key is None:
                continue
            if key in members:
                raise EvidenceError("extract", "duplicate_key", f"line {number}: {key}")
            spelled = [index for index in spellings if values[index] is not None]
            if len(spelled) != 1:
                if spelled:
                    raise EvidenceError("extract", "ambiguous_value", f"line {number}: {key}")
                members[key] = None
                continue
            raw = values[spelled[0]]
            to = converters.get(spelled[0])
            try:
                members[key] = raw if to is None else to(raw)
            except ValueError as exc:
                name = self.row.groups[spelled[0]]
                kind = self.types[name]
                raise EvidenceError(
                    "extract", "bad_type", f"line {number}: {name}: not {kind}"
                ) from exc
        return members

    def _counted(self, raw_lines: list[bytes], first: int) -> dict[str, Any]:
        """``{"total": rows counted, "counts": {value: rows with it}}`` of the rows after
        the header, every line matched as for a table.

        A count's lines repeat (a state letter, a priority, a unit name), and a line's
        match is a function of the line: each distinct line is matched once. A row whose
        `count_by` group did not take part (another alternative of `row` matched it) is
        accounted for, as every line is, and not counted.
        """
        index = self.row.groups.index(self.count_by)
        matched: dict[bytes, list[str | None] | None] = {}
        counts: dict[str, int] = {}
        total = 0
        # One line past max_rows is read: a row there is too many, anything else unmatched.
        stop = first + self.max_rows + 1
        for number, data in enumerate(raw_lines[first:stop], first + 1):
            if data in matched:
                values = matched[data]
            else:
                values = matched[data] = self.row.values(data)
            if values is None:
                raise EvidenceError("extract", "unmatched_line", f"line {number}")
            if number - first > self.max_rows:
                raise EvidenceError("extract", "too_many_rows", f"line {number}")
            if (key := values[index]) is None:
                continue
            total += 1
            counts[key] = counts.get(key, 0) + 1
            if len(counts) > MAX_COUNT_KEYS:
                raise EvidenceError("extract", "too_many_count_keys", f"line {number}")
        return {"total": total, "counts": counts}

    def _typed_rows(self, table: list[list[Any]], first: int) -> list[dict[str, Any]]:
        """Rows as objects, each typed column converted at once (column by column)."""
        if not table:
            return []
        columns: list[Sequence[Any]] = list(zip(*table, strict=True))
        for index, name, _ in self._columns:
            kind = self.types[name]
            converted = convert_column(columns[index], kind)
            if converted is None:  # somewhere a value is not of its type: say which line
                for offset, raw in enumerate(columns[index]):
                    if raw is not None:
                        try:
                            _CONVERTERS[kind](raw)
                        except ValueError as exc:
                            raise EvidenceError(
                                "extract",
                                "bad_type",
                                f"line {first + 1 + offset}: {name}: not {kind}",
                            ) from exc
                raise AssertionError("a column failed with no failing value")  # pragma: no cover
            columns[index] = converted
        names = self.row.groups
        return [dict(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def convert_column(values: Sequence[str | None], kind: FieldType) -> Sequence[Any] | None:
    """``values`` converted to ``kind``, or None if any one is not of it (the caller says which).

    The same rules as the one-value converters, checked over the whole column with one
    match of the project's own deterministic patterns and converted with ``map``.
    """
    if None in values:  # an optional group that did not match: value by value
        try:
            return [None if v is None else _CONVERTERS[kind](v) for v in values]
        except ValueError:
            return None
    present: Sequence[str] = values  # type: ignore[assignment]  # no None, checked above
    joined = "\n".join(present)
    if kind == "integer":
        if _INTEGER_COLUMN.fullmatch(joined) is None:
            return None
        integers = list(map(int, present))
        long = max(map(len, present), default=0) > 18  # 19 digits may be over 64 bits
        return None if long and not all(i in _INT64 for i in integers) else integers
    if kind == "number":
        if _NUMBER_COLUMN.fullmatch(joined) is None:
            return None
        numbers = list(map(float, present))
        return numbers if all(map(math.isfinite, numbers)) else None
    if kind == "boolean":
        if not set(present) <= {"true", "false"}:
            return None
        return [v == "true" for v in present]
    return present


@dataclass(frozen=True, slots=True)
class KvFormat:
    """``key<separator>value`` lines: every key exactly once, each optional key at most once,
    no other line. An absent optional key is an absent field (never null): the schema decides."""

    max_bytes: int
    separator: str
    keys: Sequence[str]
    types: Mapping[str, FieldType]
    optional: Sequence[str] = ()
    """Keys the command prints only sometimes (systemctl show prints a property only if the
    unit has it: a .target has no MainPID)."""

    def parse(self, stdout: bytes) -> Any:
        lines = _split_lines(_decode(stdout, self.max_bytes))
        fields: dict[str, str] = {}
        for number, line in enumerate(lines, 1):
            key, sep, value = line.partition(self.separator)
            if not sep or (key not in self.keys and key not in self.optional):
                raise EvidenceError("extract", "unmatched_line", f"line {number}")
            if key in fields:
                raise EvidenceError("extract", "duplicate_key", f"line {number}: {key}")
            fields[key] = value
        missing = [key for key in self.keys if key not in fields]
        if missing:
            raise EvidenceError("extract", "missing_key", ", ".join(missing))
        return convert(fields, self.types, line=0)


def convert(
    fields: Mapping[str, str | None], types: Mapping[str, FieldType], *, line: int
) -> dict[str, Any]:
    """Apply ``types`` to the captured strings; a failed conversion rejects the output."""
    out: dict[str, Any] = {}
    for name, raw in fields.items():
        kind = types.get(name, "string")
        if raw is None or kind == "string":
            out[name] = raw
            continue
        try:
            out[name] = _CONVERTERS[kind](raw)
        except ValueError as exc:
            where = f"line {line}: " if line else ""
            raise EvidenceError("extract", "bad_type", f"{where}{name}: not {kind}") from exc
    return out


def _to_integer(raw: str) -> int:
    """``-?(0|[1-9][0-9]*)`` within 64 bits: no sign, spaces, underscores or other digits."""
    digits = raw[1:] if raw.startswith("-") else raw
    if (
        not (digits.isascii() and digits.isdigit())  # isdigit alone admits "²" and "٣"
        or (digits[0] == "0" and len(digits) > 1)
        or len(digits) > 19
    ):
        raise ValueError(raw)
    value = int(digits) if digits is raw else -int(digits)
    if value not in _INT64:
        raise ValueError(raw)
    return value


def _to_number(raw: str) -> float:
    if _NUMBER.fullmatch(raw) is None or not math.isfinite(value := float(raw)):
        raise ValueError(raw)
    return value


def _to_boolean(raw: str) -> bool:
    if raw not in ("true", "false"):
        raise ValueError(raw)
    return raw == "true"


Converter = Callable[[str], Any]
_CONVERTERS: Final[dict[str, Converter]] = {
    "integer": _to_integer,
    "number": _to_number,
    "boolean": _to_boolean,
}


def _decode(stdout: bytes, max_bytes: int, *, allow_control: bool = False) -> str:
    if len(stdout) > max_bytes:
        raise EvidenceError("extract", "too_large", f"{len(stdout)} > {max_bytes} bytes")
    if not stdout:
        raise EvidenceError("extract", "empty", "no output")
    try:
        text = stdout.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EvidenceError("extract", "not_utf8", f"byte {exc.start}") from exc
    if not allow_control and (found := _CONTROL.search(text)) is not None:
        line = text.count("\n", 0, found.start()) + 1
        raise EvidenceError("extract", "control_character", f"line {line}")
    return text


def _split_raw(stdout: bytes) -> list[bytes]:
    """``_split_lines`` on the raw bytes (the same lines: UTF-8 never hides a newline)."""
    if stdout.endswith(b"\n"):
        stdout = stdout[:-1]
    return stdout.split(b"\n")


def _split_lines(text: str) -> list[str]:
    """Lines without their terminator; one final newline is the terminator of the last line."""
    if text.endswith("\n"):
        text = text[:-1]
    return text.split("\n")
