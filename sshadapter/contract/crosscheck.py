"""One command file's keys checked against each other and its output schema, and the
pieces compiled from them: the output parser, the exit-status table, operator patterns.

Reference: docs/command-files.md. The fields that checks, projection and text
extractors name are properties of the schema; a key the command may leave out is
not one the schema requires; ``output.types`` names only fields of the extractor.
Each mistake is a ConfigError naming the file, the key and the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, Literal

from sshadapter.contract.commandfile import CommandFile
from sshadapter.contract.exitstatus import ByStderr, ExitCodes
from sshadapter.contract.extract import (
    DEFAULT_MAX_ROWS,
    KEY_GROUP,
    JsonFormat,
    JsonlFormat,
    KvFormat,
    LinesFormat,
    OutputFormat,
    RegexFormat,
)
from sshadapter.contract.linear_regex import LinearPattern, LinearRegexError, compile_linear
from sshadapter.contract.schemas import LoadedSchema
from sshadapter.errors import ConfigError


def check_fields(file: str, spec: CommandFile, schema: LoadedSchema) -> None:
    """Fields named by checks and projection must be top-level properties of the schema."""
    properties = schema.contents.get("properties", {})
    for name in spec.agent.fields:
        if name not in properties:
            raise ConfigError(file, "agent.fields", f"{name!r} is not a property of {schema.name}")
    if len(set(spec.agent.fields)) != len(spec.agent.fields):
        raise ConfigError(file, "agent.fields", "a field is listed twice")
    if spec.agent.rows is not None and (
        "rows" not in spec.agent.fields or properties.get("rows", {}).get("type") != "array"
    ):
        raise ConfigError(
            file, "agent.rows", f"needs `rows` in agent.fields, an array in {schema.name}"
        )
    for field, param in spec.checks.equal.items():
        if field not in properties:
            raise ConfigError(file, f"checks.equal.{field}", f"not a property of {schema.name}")
        if param not in spec.params:
            raise ConfigError(file, f"checks.equal.{field}", f"{param!r} is not a parameter")
    if spec.checks.fresh and spec.checks.fresh.field not in properties:
        raise ConfigError(file, "checks.fresh.field", f"not a property of {schema.name}")


def check_optional_keys(file: str, spec: CommandFile, schema: LoadedSchema) -> None:
    """A key the command may leave out cannot be one the schema requires."""
    required = set(schema.contents.get("required", ()))
    for key in spec.output.optional_keys:
        if key in required:
            raise ConfigError(
                file, "output.optional_keys", f"{key!r} may be absent but {schema.name} requires it"
            )


def check_extracted_fields(
    file: str, spec: CommandFile, schema: LoadedSchema, parser: OutputFormat
) -> None:
    """Every field a text extractor makes must be a property the schema declares.

    Otherwise each accepted output fails at the schema stage (an unknown property
    of a closed object), and the fixtures say so without saying why.
    """
    out = spec.output
    if isinstance(parser, RegexFormat):
        key, fields, row = "output.pattern", parser.pattern.groups, schema.contents
    elif isinstance(parser, LinesFormat) and parser.count_by is not None:
        key, fields, row = "output.count_by", ("total", "counts"), schema.contents
    elif isinstance(parser, LinesFormat):
        if out.shape == "keyed":
            return  # its members are named by the output, and the schema bounds their names
        key, fields = "output.row", parser.row.groups
        row = schema.contents if out.shape == "one" else _rows_item(schema.contents)
    elif isinstance(parser, KvFormat):
        key, fields, row = "output.keys", (*parser.keys, *parser.optional), schema.contents
    else:
        return
    properties = row.get("properties") if isinstance(row, dict) else None
    if not isinstance(properties, dict):
        return  # a row schema this check cannot read (composed, or in another file)
    for name in fields:
        if name not in properties:
            where = schema.name if row is schema.contents else f"a row in {schema.name}"
            raise ConfigError(
                file,
                key,
                f"field {name!r} is not a property of {where}: every output would fail the schema",
            )


def _rows_item(contents: Mapping[str, Any]) -> Any:
    """The schema of one row of ``{"rows": [...]}``, following a local ``$ref``."""
    item = contents.get("properties", {}).get("rows", {}).get("items")
    ref = item.get("$ref") if isinstance(item, dict) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = contents
        for part in ref[2:].split("/"):
            node = (
                node.get(part.replace("~1", "/").replace("~0", "~"), {})
                if isinstance(node, dict)
                else {}
            )
        return node
    return item


def compile_pattern(file: str, key: str, pattern: str) -> LinearPattern:
    """An operator's pattern (an extractor's or a stderr case's), or ConfigError naming its key.

    Compiled by RE2, linear in the text it runs on (see linear_regex).
    """
    try:
        return compile_linear(pattern)
    except LinearRegexError as exc:
        raise ConfigError(
            file,
            key,
            f"not a valid regular expression for the linear-time engine (RE2): {exc} "
            "(it has no lookaround, backreferences, possessive or atomic groups; "
            "write \\Z as \\z)",
        ) from exc


def exit_codes(file: str, spec: CommandFile) -> ExitCodes:
    table: dict[int, str | ByStderr] = {}
    for status, entry in spec.output.exit_codes.items():
        if isinstance(entry, str):
            table[int(status)] = entry
            continue
        if entry.if_stderr_matches is None:
            test: Literal["empty"] | LinearPattern = "empty"
        else:
            key = f"output.exit_codes.{status}.if_stderr_matches"
            test = compile_pattern(file, key, entry.if_stderr_matches)
        table[int(status)] = ByStderr(test, entry.then, entry.otherwise)
    return ExitCodes(table)


def build_parser(file: str, spec: CommandFile) -> OutputFormat:
    out = spec.output

    def compile_(key: str, pattern: str) -> LinearPattern:
        return compile_pattern(file, f"output.{key}", pattern)

    def check_types(groups: Collection[str]) -> None:
        for name in out.types:
            if name not in groups:
                raise ConfigError(file, f"output.types.{name}", "no such field in the extractor")

    if out.format == "json":
        return JsonFormat(out.max_bytes, out.max_depth, out.wrap)
    if out.format == "jsonl":
        return JsonlFormat(out.max_bytes, out.max_depth, out.max_rows or DEFAULT_MAX_ROWS)
    if out.format == "regex":
        assert out.pattern is not None  # guaranteed by OutputSection
        pattern = compile_("pattern", out.pattern)
        check_types(pattern.groups)
        return RegexFormat(out.max_bytes, pattern, out.types)
    if out.format == "lines":
        assert out.row is not None and out.shape is not None  # by OutputSection
        row = compile_("row", out.row)
        check_types(row.groups)
        if out.shape == "keyed" and (KEY_GROUP not in row.groups or len(row.groups) < 2):
            raise ConfigError(
                file,
                "output.row",
                f"shape 'keyed' needs a group named {KEY_GROUP!r} and at least one value group",
            )
        header = tuple(compile_(f"header[{i}]", h) for i, h in enumerate(out.header))
        max_rows = out.max_rows or (1 if out.shape == "one" else DEFAULT_MAX_ROWS)
        if out.count_by is not None and out.count_by not in row.groups:
            raise ConfigError(file, "output.count_by", f"{out.count_by!r} is no field of `row`")
        return LinesFormat(out.max_bytes, header, row, out.shape, max_rows, out.types, out.count_by)
    assert out.separator is not None and out.keys is not None  # by OutputSection
    check_types((*out.keys, *out.optional_keys))
    return KvFormat(out.max_bytes, out.separator, out.keys, out.types, out.optional_keys)
