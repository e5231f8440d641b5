"""Operator contract: load ``commands/<tool>.toml`` into a registry of operations.

Contract: DESIGN.md "Operator contract". The file stem is the tool name;
unknown keys are errors; every string parameter is constrained; every
placeholder is a declared parameter and every parameter is used; ``exit_codes``
map statuses to a known outcome; retries after the command may have run need
``idempotent = true``. A directory loads whole or not at all: the first bad
file raises ConfigError naming the file, the key and the reason.
"""

from __future__ import annotations

import hashlib
import re
import shlex
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sshadapter import envelope
from sshadapter.checks import Checks
from sshadapter.config import Allow
from sshadapter.errors import ConfigError, EvidenceError, RequestError
from sshadapter.extract import (
    DEFAULT_MAX_ROWS,
    FieldType,
    JsonFormat,
    JsonlFormat,
    KvFormat,
    LinesFormat,
    OutputFormat,
    RegexFormat,
)
from sshadapter.schemas import DRAFT_2020_12, LoadedSchema, SchemaSet, Validator
from sshadapter.strict_json import DEFAULT_MAX_DEPTH, MAX_DEPTH_LIMIT

TOOL_NAME: Final = re.compile(r"[a-z][a-z0-9_]{1,62}")
RESERVED_TOOL: Final = "sshadapter"  # answers requests that name no known tool
PARAM_NAME: Final = r"^[a-z][a-z0-9_]{0,62}$"

DEFAULT_TIMEOUT_SECONDS: Final = 10.0  # a status query that takes longer is not a status query
MAX_TIMEOUT_SECONDS: Final = 600.0
DEFAULT_MAX_OUTPUT_BYTES: Final = 64 * 1024  # a fact for an agent is small; raise per tool
MAX_OUTPUT_BYTES: Final = 16 * 1024 * 1024  # hard ceiling: the daemon buffers the output
DEFAULT_MAX_STDERR_BYTES: Final = 64 * 1024  # stderr is audited, never shown: keep it bounded
MAX_COMMAND_FILE_BYTES: Final = 256 * 1024
MAX_RETRY_ATTEMPTS: Final = 5
RETRYABLE_ON: Final = ("UPSTREAM_UNAVAILABLE", "INVALID_RESPONSE")
EXIT_MEANINGS: Final = ("success", "NOT_FOUND", "UPSTREAM_UNAVAILABLE", "INVALID_RESPONSE")

_PLACEHOLDER: Final = re.compile(r"\{\{|\}\}|\{([a-z][a-z0-9_]*)\}|[{}]")


class _Table(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=False)


class _KeyedError(ValueError):
    """A cross-key rule broken inside a table: pydantic locates it at the table, this at the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(reason)
        self.key = key


class OutputSection(_Table):
    format: Literal["json", "jsonl", "regex", "lines", "kv"]
    schema_file: str = Field(alias="schema", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}\.json$")
    max_bytes: Annotated[int, Field(ge=1, le=MAX_OUTPUT_BYTES)] = DEFAULT_MAX_OUTPUT_BYTES
    max_stderr_bytes: Annotated[int, Field(ge=0, le=MAX_OUTPUT_BYTES)] = DEFAULT_MAX_STDERR_BYTES
    max_depth: Annotated[int, Field(ge=1, le=MAX_DEPTH_LIMIT)] = DEFAULT_MAX_DEPTH
    stderr: Literal["ignore", "reject"] = "ignore"
    exit_codes: dict[str, str] = {"0": "success"}
    # text extractors
    pattern: str | None = None
    header: tuple[str, ...] = ()
    row: str | None = None
    shape: Literal["one", "rows"] | None = None
    max_rows: Annotated[int, Field(ge=1, le=100_000)] | None = None
    types: dict[str, FieldType] = {}
    separator: Annotated[str, Field(min_length=1, max_length=8)] | None = None
    keys: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _keys_fit_format(self) -> OutputSection:
        allowed = {
            "json": {"max_depth"},
            "jsonl": {"max_depth", "max_rows"},
            "regex": {"pattern", "types"},
            "lines": {"header", "row", "shape", "max_rows", "types"},
            "kv": {"separator", "keys", "types"},
        }[self.format]
        extractor_keys = {
            "pattern",
            "header",
            "row",
            "shape",
            "max_rows",
            "types",
            "separator",
            "keys",
            "max_depth",
        }
        for key in sorted((extractor_keys & self.model_fields_set) - allowed):
            raise _KeyedError(key, f"does not apply to format {self.format!r}")
        required = {"regex": ("pattern",), "lines": ("row", "shape"), "kv": ("separator", "keys")}
        for key in required.get(self.format, ()):
            if getattr(self, key) is None:
                raise _KeyedError(key, f"required key is missing for format {self.format!r}")
        for status, meaning in self.exit_codes.items():
            if not re.fullmatch(r"0|[1-9][0-9]{0,2}", status) or int(status) > 255:
                raise _KeyedError(f"exit_codes.{status}", "not an exit status 0-255")
            if meaning not in EXIT_MEANINGS:
                raise _KeyedError(
                    f"exit_codes.{status}", f"{meaning!r} is not one of {', '.join(EXIT_MEANINGS)}"
                )
        if "success" not in self.exit_codes.values():
            raise _KeyedError("exit_codes", "no status means success")
        return self


class AgentSection(_Table):
    fields: tuple[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")], ...] = Field(
        min_length=1
    )


class RetrySection(_Table):
    attempts: Annotated[int, Field(ge=1, le=MAX_RETRY_ATTEMPTS)] = 1
    budget_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = 30.0
    on: tuple[Literal["UPSTREAM_UNAVAILABLE", "INVALID_RESPONSE"], ...] = ()


class CommandFile(_Table):
    description: Annotated[str, Field(min_length=1, max_length=500)]
    version: Annotated[int, Field(ge=1)]
    host: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,62}$")]
    argv: tuple[Annotated[str, Field(max_length=4096)], ...] = Field(min_length=1, max_length=256)
    timeout_seconds: Annotated[float, Field(gt=0, le=MAX_TIMEOUT_SECONDS)] = DEFAULT_TIMEOUT_SECONDS
    idempotent: bool = False
    allow: Allow | None = None
    params: dict[Annotated[str, Field(pattern=PARAM_NAME)], dict[str, Any]] = {}
    output: OutputSection
    checks: Checks = Checks()
    agent: AgentSection
    retry: RetrySection = RetrySection()

    @model_validator(mode="after")
    def _retries_need_idempotence(self) -> CommandFile:
        if self.retry.attempts > 1 and self.retry.on and not self.idempotent:
            raise _KeyedError(
                "retry", "retrying after the command may have run needs `idempotent = true`"
            )
        return self


@dataclass(frozen=True)
class ArgvElement:
    """One argv element: literal text and placeholders, quoted once as a whole."""

    parts: tuple[tuple[bool, str], ...]
    """(is_placeholder, text-or-name) in order."""

    def fill(self, args: Mapping[str, Any]) -> str:
        return "".join(_render(args[text]) if is_param else text for is_param, text in self.parts)


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():  # JSON Schema: 5.0 is the integer 5
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Operation:
    """A loaded, checked operation: everything the pipeline needs for one tool."""

    name: str
    file: Path
    sha256: str
    """Of the command file's bytes, for the audit record."""
    spec: CommandFile
    argv: tuple[ArgvElement, ...]
    params_schema: Mapping[str, Any]
    """Closed JSON Schema of the `args` object, published in `list`."""
    params_validator: Validator
    parser: OutputFormat
    schema: LoadedSchema
    output_validator: Validator
    envelope_schema: Mapping[str, Any]
    """Published in `list` and by `sshadapter schema`."""
    envelope_validator: Validator
    """The published schema, in full: tests and `sshadapter check`."""
    envelope_guard: Validator
    """The same minus re-validating data values: every response (see envelope_guard_schema)."""

    def command(self, args: Mapping[str, Any]) -> str:
        """The exact remote command string: every element shell-quoted once."""
        return " ".join(shlex.quote(element.fill(args)) for element in self.argv)

    def exit_meaning(self, status: int | None) -> str | None:
        """`success`, an error code, or None for an undeclared status."""
        return None if status is None else self.spec.output.exit_codes.get(str(status))

    def check_args(self, args: Any) -> None:
        """Stage 3: the arguments against the closed parameter schema."""
        try:
            self.params_validator.validate(args)
        except EvidenceError as exc:  # the validator speaks of evidence; here the caller erred
            where = exc.instance_path or "/"
            raise RequestError("bad_arguments", f"{where}: {exc.detail[:200]}") from exc


@dataclass(frozen=True)
class Registry:
    """Every operation of a commands directory, with the schemas they use."""

    operations: Mapping[str, Operation]
    schemas: SchemaSet

    def get(self, name: str) -> Operation | None:
        return self.operations.get(name)


def load_registry(
    commands_dir: Path, schemas_dir: Path, *, hosts: Collection[str] | None
) -> Registry:
    """Load a whole directory or raise ConfigError; ``hosts=None`` skips the host check."""
    if not commands_dir.is_dir():
        raise ConfigError(str(commands_dir), "", "commands directory does not exist")
    schemas = SchemaSet(schemas_dir)
    operations = {}
    for path in sorted(commands_dir.glob("*.toml")):
        operation = load_operation(path, schemas, hosts=hosts)
        operations[operation.name] = operation
    return Registry(operations, schemas)


def load_operation(path: Path, schemas: SchemaSet, *, hosts: Collection[str] | None) -> Operation:
    file = str(path)
    name = path.stem
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(file, "", f"tool name {name!r} must match ^[a-z][a-z0-9_]{{1,62}}$")
    if name == RESERVED_TOOL:
        raise ConfigError(file, "", f"{RESERVED_TOOL!r} is reserved")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from exc
    if len(raw) > MAX_COMMAND_FILE_BYTES:
        raise ConfigError(file, "", f"larger than {MAX_COMMAND_FILE_BYTES} bytes")
    try:
        spec = CommandFile.model_validate(tomllib.loads(raw.decode("utf-8")))
    except UnicodeDecodeError as exc:
        raise ConfigError(file, "", "not UTF-8") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(p) for p in first["loc"]]
        cause = first.get("ctx", {}).get("error")
        if isinstance(cause, _KeyedError):
            loc.append(cause.key)
        key = ".".join(loc)
        reason = {"extra_forbidden": "unknown key", "missing": "required key is missing"}.get(
            first["type"], str(first["msg"]).removeprefix("Value error, ")
        )
        raise ConfigError(file, key, reason) from exc
    if hosts is not None and spec.host not in hosts:
        raise ConfigError(file, "host", f"no [hosts.{spec.host}] in the configuration")
    argv = tuple(_parse_argv_element(file, i, e) for i, e in enumerate(spec.argv))
    _check_params_used(file, spec, argv)
    params_schema = _params_schema(file, spec)
    schema = schemas.get(spec.output.schema_file, file=file, key="output.schema")
    _check_fields(file, spec, schema)
    env_schema = envelope.envelope_schema(name, spec, schema)
    return Operation(
        name=name,
        file=path,
        sha256=hashlib.sha256(raw).hexdigest(),
        spec=spec,
        argv=argv,
        params_schema=params_schema,
        params_validator=schemas.compile(params_schema, file=file),
        parser=_build_parser(file, spec),
        schema=schema,
        output_validator=schemas.compile(schema.contents, file=file, base_uri=schema.uri),
        envelope_schema=env_schema,
        envelope_validator=schemas.compile(env_schema, file=file),
        envelope_guard=schemas.compile(envelope.envelope_guard_schema(env_schema), file=file),
    )


def _parse_argv_element(file: str, index: int, element: str) -> ArgvElement:
    parts: list[tuple[bool, str]] = []
    literal = ""
    position = 0
    for match in _PLACEHOLDER.finditer(element):
        literal += element[position : match.start()]
        position = match.end()
        token = match.group(0)
        if token in ("{{", "}}"):
            literal += token[0]
        elif match.group(1) is None:
            raise ConfigError(
                file,
                f"argv[{index}]",
                "stray brace: write {{ or }} for a literal brace, {name} for a parameter",
            )
        else:
            if literal:
                parts.append((False, literal))
                literal = ""
            parts.append((True, match.group(1)))
    literal += element[position:]
    if literal or not parts:
        parts.append((False, literal))
    return ArgvElement(tuple(parts))


def _check_params_used(file: str, spec: CommandFile, argv: tuple[ArgvElement, ...]) -> None:
    used = {text for element in argv for is_param, text in element.parts if is_param}
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


def _params_schema(file: str, spec: CommandFile) -> dict[str, Any]:
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
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "properties": dict(spec.params),
        "required": sorted(spec.params),
        "additionalProperties": False,
    }


def _check_fields(file: str, spec: CommandFile, schema: LoadedSchema) -> None:
    """Fields named by checks and projection must be top-level properties of the schema."""
    properties = schema.contents.get("properties", {})
    for name in spec.agent.fields:
        if name not in properties:
            raise ConfigError(file, "agent.fields", f"{name!r} is not a property of {schema.name}")
    if len(set(spec.agent.fields)) != len(spec.agent.fields):
        raise ConfigError(file, "agent.fields", "a field is listed twice")
    for field, param in spec.checks.equal.items():
        if field not in properties:
            raise ConfigError(file, f"checks.equal.{field}", f"not a property of {schema.name}")
        if param not in spec.params:
            raise ConfigError(file, f"checks.equal.{field}", f"{param!r} is not a parameter")
    if spec.checks.fresh and spec.checks.fresh.field not in properties:
        raise ConfigError(file, "checks.fresh.field", f"not a property of {schema.name}")


def _build_parser(file: str, spec: CommandFile) -> OutputFormat:
    out = spec.output

    def compile_(key: str, pattern: str) -> re.Pattern[str]:
        try:
            return re.compile(pattern)
        except re.error as exc:
            raise ConfigError(
                file, f"output.{key}", f"not a valid regular expression: {exc}"
            ) from exc

    def check_types(groups: Collection[str]) -> None:
        for name in out.types:
            if name not in groups:
                raise ConfigError(file, f"output.types.{name}", "no such field in the extractor")

    if out.format == "json":
        return JsonFormat(out.max_bytes, out.max_depth)
    if out.format == "jsonl":
        return JsonlFormat(out.max_bytes, out.max_depth, out.max_rows or DEFAULT_MAX_ROWS)
    if out.format == "regex":
        assert out.pattern is not None  # guaranteed by OutputSection
        pattern = compile_("pattern", out.pattern)
        check_types(pattern.groupindex)
        return RegexFormat(out.max_bytes, pattern, out.types)
    if out.format == "lines":
        assert out.row is not None and out.shape is not None  # by OutputSection
        row = compile_("row", out.row)
        check_types(row.groupindex)
        header = tuple(compile_(f"header[{i}]", h) for i, h in enumerate(out.header))
        max_rows = out.max_rows or (1 if out.shape == "one" else DEFAULT_MAX_ROWS)
        return LinesFormat(out.max_bytes, header, row, out.shape, max_rows, out.types)
    assert out.separator is not None and out.keys is not None  # by OutputSection
    check_types(out.keys)
    return KvFormat(out.max_bytes, out.separator, out.keys, out.types)
