"""The registry: every command file of a directory, loaded and checked as an Operation.

Reference: docs/command-files.md. The file stem is the tool name; every
placeholder is a declared parameter and every parameter is used; every string
parameter is constrained; the fields named by checks and projection are
properties of the output schema. A directory loads whole or not at all: the
first bad file raises ConfigError naming the file, the key and the reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from sshadapter import envelope, policy
from sshadapter.argv import ArgvTemplate, parse_template
from sshadapter.commandfile import CommandFile, read_command_file
from sshadapter.errors import ConfigError, EvidenceError, RequestError
from sshadapter.extract import (
    DEFAULT_MAX_ROWS,
    JsonFormat,
    JsonlFormat,
    KvFormat,
    LinesFormat,
    OutputFormat,
    RegexFormat,
)
from sshadapter.schemas import DRAFT_2020_12, LoadedSchema, SchemaSet, Validator

TOOL_NAME: Final = re.compile(r"[a-z][a-z0-9_]{1,62}")
RESERVED_TOOL: Final = "sshadapter"  # answers requests that name no known tool


@dataclass(frozen=True)
class Operation:
    """A loaded, checked operation: everything the pipeline needs for one tool."""

    name: str
    file: Path
    sha256: str
    """Of the command file's bytes, for the audit record."""
    spec: CommandFile
    argv: ArgvTemplate
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
    dispatched: bool = False
    """Its host runs sshadapter-dispatch (`dispatch = true`): see docs/dispatcher.md."""

    def command(self, args: Mapping[str, Any]) -> str:
        """The exact remote command string: every element shell-quoted once."""
        return self.argv.command(args)

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
    policies: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """The dispatch policy of each dispatch host alias, as the daemon expects the host's."""

    def get(self, name: str) -> Operation | None:
        return self.operations.get(name)


def load_registry(
    commands_dir: Path,
    schemas_dir: Path,
    *,
    hosts: Collection[str] | None,
    dispatch_hosts: Collection[str] = (),
) -> Registry:
    """Load a whole directory or raise ConfigError; ``hosts=None`` skips the host check.

    The operations of ``dispatch_hosts`` must also be ones the host's dispatcher
    can enforce (sshadapter/policy.py); their policies are built here.
    """
    if not commands_dir.is_dir():
        raise ConfigError(str(commands_dir), "", "commands directory does not exist")
    schemas = SchemaSet(schemas_dir)
    operations = {}
    for path in sorted(commands_dir.glob("*.toml")):
        operation = load_operation(path, schemas, hosts=hosts, dispatch_hosts=dispatch_hosts)
        operations[operation.name] = operation
    policies = {
        alias: policy.host_policy(alias, operations.values(), schemas)
        for alias in sorted(dispatch_hosts)
    }
    return Registry(operations, schemas, policies)


def load_operation(
    path: Path,
    schemas: SchemaSet,
    *,
    hosts: Collection[str] | None,
    dispatch_hosts: Collection[str] = (),
) -> Operation:
    file = str(path)
    name = path.stem
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(file, "", f"tool name {name!r} must match ^[a-z][a-z0-9_]{{1,62}}$")
    if name == RESERVED_TOOL:
        raise ConfigError(file, "", f"{RESERVED_TOOL!r} is reserved")
    raw, spec = read_command_file(path)
    if hosts is not None and spec.host not in hosts:
        raise ConfigError(file, "host", f"no [hosts.{spec.host}] in the configuration")
    argv = parse_template(file, spec.argv)
    _check_params_used(file, spec, argv)
    params_schema = _params_schema(file, spec)
    schema = schemas.get(spec.output.schema_file, file=file, key="output.schema")
    _check_fields(file, spec, schema)
    env_schema = envelope.envelope_schema(
        name,
        version=spec.version,
        description=spec.description,
        fields=spec.agent.fields,
        output=schema,
        declares_not_found="NOT_FOUND" in spec.output.exit_codes.values(),
    )
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
        dispatched=spec.host in dispatch_hosts,
    )


def _check_params_used(file: str, spec: CommandFile, argv: ArgvTemplate) -> None:
    used = argv.placeholders
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
