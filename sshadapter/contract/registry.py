"""The registry: every command file of a directory, loaded and checked as an Operation.

Reference: docs/command-files.md. The file stem is the tool name; every
placeholder is a declared parameter and every parameter is used; every string
parameter is constrained; the fields named by checks and projection are
properties of the output schema. A directory loads whole or not at all: the
first bad file raises ConfigError naming the file, the key and the reason.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final, Literal

import orjson

from sshadapter import __version__
from sshadapter.catalog import LISTED_PARAMETERS, NO_CATALOG, CatalogFile, CatalogSource
from sshadapter.catalog import SCHEMAS_DIR as CATALOG_SCHEMAS_DIR
from sshadapter.contract import envelope
from sshadapter.contract.argv import ArgvElement, ArgvTemplate, parse_template
from sshadapter.contract.codes import (
    HINT_PARAMETER_PATTERN,
    HINT_RULES,
    RESERVED_TOOL_PREFIX,
    SYSTEM_TOOL,
    TOOL_NAME_PATTERN,
)
from sshadapter.contract.commandfile import CommandFile, parse_command_file, read_command_bytes
from sshadapter.contract.exitstatus import ByStderr, ExitCodes, ExitMeaning
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
from sshadapter.contract.params import check_params_used, param_warnings, params_schema_of
from sshadapter.contract.run_as import RootCommand, root_command, sudo_prefix
from sshadapter.contract.schemas import (
    LoadedSchema,
    SchemaSet,
    Validator,
    read_schema_files,
)
from sshadapter.errors import ConfigError, EvidenceError, RequestError

TOOL_NAME: Final = re.compile(TOOL_NAME_PATTERN)


@dataclass(frozen=True)
class Operation:
    """A loaded, checked operation: everything the pipeline needs for one tool."""

    name: str
    file: Path
    sha256: str
    """Of the command file's bytes (and, for a catalog file, the config's changes to it)."""
    spec: CommandFile
    argv: ArgvTemplate
    exit_codes: ExitCodes
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
    host_guard: Validator
    """The guard of one host's envelope: ``envelope_guard`` for an operation on one
    ``host``; for one with ``targets``, each host's own envelope inside the fan-out answer."""
    host_validator: Validator
    """One host's envelope, in full (``envelope_validator`` for an operation on one host):
    what `sshadapter check` holds each fixture's envelope to."""
    warnings: tuple[tuple[str, str], ...] = ()
    """(key, text) an operator should read: `sshadapter check` prints them, loads log them."""
    dispatched: bool = False
    """Its host runs sshadapter-dispatch (`dispatch = true`): see docs/dispatcher.md."""
    root: RootCommand | None = None
    """It runs as ``run_as`` through sudo (``argv`` starts with the sudo prefix): its rule."""

    @cached_property
    def audit_fields(self) -> Mapping[str, Any]:
        """What every audit record of this operation says of it (built once, not per call)."""
        return {
            "tool": self.name,
            "tool_version": self.spec.version,
            "command_sha256": self.sha256,
            "schema_sha256": self.schema.sha256,
            "adapter_version": __version__,
            **({"host": self.spec.host} if self.spec.host is not None else {}),
        }

    @property
    def multi(self) -> bool:
        """The agent names a target (``targets``): the answer is a fan-out envelope."""
        return self.spec.multi

    @cached_property
    def list_entry(self) -> Mapping[str, Any]:
        """What `list` says of this operation (docs/protocol.md), built once."""
        return {
            "name": self.name,
            "description": self.spec.description,
            "version": self.spec.version,
            "read_only": self.spec.read_only,
            "idempotent": self.spec.idempotent,
            "input_schema": self.params_schema,
            "output_schema": self.envelope_schema,
        }

    def command(self, args: Mapping[str, Any]) -> str:
        """The exact remote command string: every element shell-quoted once."""
        return self.argv.command(args)

    def exit_meaning(self, status: int | None, stderr: bytes = b"") -> ExitMeaning | None:
        """`success` or an error code (and why), or None for an undeclared status."""
        return self.exit_codes.meaning(status, stderr)

    def check_args(self, args: Any) -> None:
        """Stage 3: the arguments against the closed parameter schema."""
        try:
            self.params_validator.validate(args)
        except EvidenceError as exc:  # the validator speaks of evidence; here the caller erred
            where = exc.instance_path or "/"
            hint = argument_hint(self.params_schema, args, exc.schema_path)
            raise RequestError("bad_arguments", f"{where}: {exc.detail[:200]}", hint) from exc


HINT_PARAMETER: Final = re.compile(HINT_PARAMETER_PATTERN)


def argument_hint(
    schema: Mapping[str, Any], args: Mapping[str, Any], schema_path: str
) -> dict[str, str] | None:
    """``error.hint`` for arguments that failed ``schema`` at ``schema_path`` (the first
    failing keyword): which parameter and which rule (codes.HINT_RULES), from the schema's
    own names and the agent's own keys only, never a value. None when the keyword is none
    of the rules (no hint rather than a wrong one)."""
    properties: Mapping[str, Any] = schema.get("properties", {})
    keyword, *rest = schema_path.strip("/").split("/")
    if keyword == "additionalProperties":
        extra = sorted(k for k in args if k not in properties)
        return _hint(extra[0] if extra else None, "unknown")
    if keyword == "required":
        missing = sorted(n for n in schema.get("required", ()) if n not in args)
        return _hint(missing[0] if missing else None, "missing")
    if keyword == "properties" and len(rest) >= 2:
        name, rule = rest[0], rest[1]
        if name in properties and rule in HINT_RULES:
            return {"parameter": name, "rule": rule}
    return None


def _hint(parameter: str | None, rule: str) -> dict[str, str]:
    """A hint naming ``parameter`` only when it fits HINT_PARAMETER (a key the agent made up
    may be anything: long, not an identifier); the rule alone otherwise."""
    if parameter is not None and HINT_PARAMETER.fullmatch(parameter):
        return {"parameter": parameter, "rule": rule}
    return {"rule": rule}


@dataclass(frozen=True)
class RegistrySource:
    """The bytes a registry is built from, read once: the same bytes build the same registry
    anywhere (the evaluation workers build theirs from it)."""

    commands_dir: Path
    schemas_dir: Path
    commands: Mapping[str, bytes]
    """`<tool>.toml` -> bytes."""
    schemas: Mapping[str, bytes]
    """`<name>.json` -> bytes."""
    dispatch_hosts: frozenset[str] = frozenset()
    """Host aliases behind sshadapter-dispatch (`dispatch = true`): their operations must
    be ones the dispatcher can enforce: ``dispatch.policy.host_policies`` builds their
    policies from the registry (docs/dispatcher.md)."""
    dispatch_groups: frozenset[str] = frozenset()
    """Groups with at least one dispatch host among their members."""
    catalog: CatalogSource = NO_CATALOG
    """The catalog families the configuration enables (sshadapter/catalog/), read once."""

    @classmethod
    def read(
        cls,
        commands_dir: Path,
        schemas_dir: Path,
        dispatch_hosts: Collection[str] = (),
        dispatch_groups: Collection[str] = (),
        catalog: CatalogSource = NO_CATALOG,
    ) -> RegistrySource:
        if not commands_dir.is_dir():
            raise ConfigError(str(commands_dir), "", "commands directory does not exist")
        commands = {p.name: read_command_bytes(p) for p in sorted(commands_dir.glob("*.toml"))}
        schemas = read_schema_files(schemas_dir)
        return cls(
            commands_dir,
            schemas_dir,
            commands,
            schemas,
            frozenset(dispatch_hosts),
            frozenset(dispatch_groups),
            catalog,
        )

    @property
    def digest(self) -> str:
        """sha256 over every file name and content: changes whenever any file does."""
        h = hashlib.sha256()
        for kind, files in (("commands", self.commands), ("schemas", self.schemas)):
            for name, raw in sorted(files.items()):
                h.update(f"{kind}/{name}\0{len(raw)}\0".encode())
                h.update(raw)
        for alias in sorted(self.dispatch_hosts):
            h.update(f"dispatch/{alias}\0".encode())
        for group in sorted(self.dispatch_groups):
            h.update(f"dispatch-group/{group}\0".encode())
        self.catalog.update(h)
        return h.hexdigest()


@dataclass(frozen=True)
class Registry:
    """Every operation of a commands directory, with the schemas they use."""

    operations: Mapping[str, Operation]
    schemas: SchemaSet
    source: RegistrySource
    digest: str
    """``sha256:`` + ``source.digest``: changes whenever any command file or schema does.
    Sent with `list`, so a client that caches the list (``sshadapter mcp``) notices a
    reload without comparing schemas."""

    def get(self, name: str) -> Operation | None:
        return self.operations.get(name)


def load_registry(
    commands_dir: Path,
    schemas_dir: Path,
    *,
    hosts: Collection[str] | None,
    dispatch_hosts: Collection[str] = (),
    groups: Collection[str] = (),
    dispatch_groups: Collection[str] = (),
    catalog: CatalogSource = NO_CATALOG,
) -> Registry:
    """Load a whole directory, and the enabled ``catalog``, or raise ConfigError;
    ``hosts=None`` skips the check that each ``host`` and ``targets`` name is a host alias
    or (``groups``) a group."""
    source = RegistrySource.read(
        commands_dir, schemas_dir, dispatch_hosts, dispatch_groups, catalog
    )
    return build_registry(source, hosts=hosts, groups=groups)


def build_registry(
    source: RegistrySource, *, hosts: Collection[str] | None, groups: Collection[str] = ()
) -> Registry:
    """The registry of ``source``, or ConfigError naming the first bad file.

    Whether a dispatch host's dispatcher can enforce its operations is decided where
    its policy is built (``dispatch.policy.host_policies``), not here.
    """
    schemas = SchemaSet(source.schemas_dir, source.schemas)
    operations = {}
    for name, raw in sorted(source.commands.items()):
        operation = load_operation(
            source.commands_dir / name,
            schemas,
            hosts=hosts,
            groups=groups,
            raw=raw,
            dispatch_hosts=source.dispatch_hosts | source.dispatch_groups,
        )
        operations[operation.name] = operation
    if source.catalog.files:
        catalog_schemas = SchemaSet(CATALOG_SCHEMAS_DIR, source.catalog.schemas)
        for entry in source.catalog.files:
            operation = _catalog_operation(source, entry, catalog_schemas, hosts, groups)
            other = operations.get(operation.name)
            if other is not None:
                raise ConfigError(
                    str(other.file), "", f"{operation.name!r} is also the catalog's {entry.path}"
                )
            operations[operation.name] = operation
    return Registry(operations, schemas, source, f"sha256:{source.digest}")


def _catalog_operation(
    source: RegistrySource,
    entry: CatalogFile,
    schemas: SchemaSet,
    hosts: Collection[str] | None,
    groups: Collection[str],
) -> Operation:
    """A catalog file as an Operation; a mistake in what the config replaced in it is named
    at the config's key (``catalog.<family>.targets``...), not in the shipped file."""
    try:
        return load_operation(
            entry.path,
            schemas,
            hosts=hosts,
            groups=groups,
            raw=entry.raw,
            dispatch_hosts=source.dispatch_hosts | source.dispatch_groups,
            overrides=entry.overrides,
        )
    except ConfigError as exc:
        key, _, rest = exc.key.partition(".")
        if key == "run_as":  # its hosts are the configured targets: they lack the dispatcher
            key = "targets"
        if key not in entry.overrides:
            raise
        if key == "params":  # a listed parameter: the list it came from
            key = LISTED_PARAMETERS.get((entry.family, rest.split(".", 1)[0]), key)
        raise ConfigError(
            source.catalog.config_file,
            f"catalog.{entry.family}.{key}",
            f"{entry.path.stem}: {exc.reason}",
        ) from exc


def load_operation(
    path: Path,
    schemas: SchemaSet,
    *,
    hosts: Collection[str] | None,
    groups: Collection[str] = (),
    raw: bytes | None = None,
    dispatch_hosts: Collection[str] = (),
    overrides: Mapping[str, Any] | None = None,
) -> Operation:
    """One command file (``raw``: its bytes, when already read) as an Operation;
    ``overrides``: what the configuration replaces in a catalog file."""
    file = str(path)
    name = path.stem
    if not TOOL_NAME.fullmatch(name):
        raise ConfigError(file, "", f"tool name {name!r} must match ^[a-z][a-z0-9_]{{1,62}}$")
    if name == SYSTEM_TOOL:
        raise ConfigError(file, "", f"{SYSTEM_TOOL!r} is reserved")
    if name.startswith(RESERVED_TOOL_PREFIX):
        raise ConfigError(
            file, "", f"names starting {RESERVED_TOOL_PREFIX!r} are reserved for the MCP bridge"
        )
    if raw is None:
        raw = read_command_bytes(path)
    spec = parse_command_file(path, raw, overrides)
    if hosts is not None and spec.host is not None and spec.host not in hosts:
        raise ConfigError(file, "host", f"no [hosts.{spec.host}] in the configuration")
    known = set() if hosts is None else {*hosts, *groups}
    for target in spec.targets if hosts is not None else ():
        if target not in known:
            raise ConfigError(file, "targets", f"{target!r} is no host alias and no group")
    argv = parse_template(file, spec.argv)
    check_params_used(file, spec, argv)
    params_schema = params_schema_of(file, spec)
    root = None
    if spec.run_as is not None:
        if not any(t in dispatch_hosts for t in (spec.host, *spec.targets) if t):
            raise ConfigError(
                file,
                "run_as",
                "needs a dispatch host (`dispatch = true`): without sshadapter-dispatch the "
                "host would trust the command string",
            )
        root = root_command(file, spec.run_as, spec.params, argv)
        argv = ArgvTemplate(
            tuple(ArgvElement(((False, text),)) for text in sudo_prefix(spec.run_as))
            + argv.elements
        )
    schema = schemas.get(spec.output.schema_file, file=file, key="output.schema")
    _check_fields(file, spec, schema)
    _check_optional_keys(file, spec, schema)
    parser = _build_parser(file, spec)
    _check_extracted_fields(file, spec, schema, parser)
    projection = schemas.project(schema, spec.agent.fields, rows=spec.agent.rows)
    declares_not_found = "NOT_FOUND" in spec.output.meanings
    env_schema = envelope.envelope_schema(
        name,
        version=spec.version,
        description=spec.description,
        projection=projection,
        declares_not_found=declares_not_found,
    )
    host_guard = schemas.compile(envelope.envelope_guard_schema(env_schema), file=file)
    host_validator = schemas.compile(env_schema, file=file)
    if spec.multi:
        env_schema = envelope.fanout_schema(
            name,
            version=spec.version,
            description=spec.description,
            projection=projection,
            declares_not_found=declares_not_found,
            max_results=spec.fanout.max_results,
        )
    return Operation(
        name=name,
        file=path,
        sha256=_sha256(raw, overrides),
        spec=spec,
        argv=argv,
        exit_codes=_exit_codes(file, spec),
        params_schema=params_schema,
        params_validator=schemas.compile(params_schema, file=file),
        parser=parser,
        schema=schema,
        output_validator=schemas.compile(schema.contents, file=file, base_uri=schema.uri),
        envelope_schema=env_schema,
        envelope_validator=(
            schemas.compile(env_schema, file=file) if spec.multi else host_validator
        ),
        envelope_guard=(
            schemas.compile(envelope.fanout_guard_schema(env_schema), file=file)
            if spec.multi
            else host_guard
        ),
        host_guard=host_guard,
        host_validator=host_validator,
        warnings=tuple(param_warnings(spec)),
        dispatched=any(t in dispatch_hosts for t in (spec.host, *spec.targets) if t),
        root=root,
    )


def _sha256(raw: bytes, overrides: Mapping[str, Any] | None) -> str:
    """Of the command file's bytes; for a catalog file the config changes, of its bytes and
    the changes (canonical JSON after a NUL): the audit names what actually ran."""
    h = hashlib.sha256(raw)
    if overrides:
        h.update(b"\0" + orjson.dumps(overrides, option=orjson.OPT_SORT_KEYS))
    return h.hexdigest()


def _check_fields(file: str, spec: CommandFile, schema: LoadedSchema) -> None:
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


def _check_optional_keys(file: str, spec: CommandFile, schema: LoadedSchema) -> None:
    """A key the command may leave out cannot be one the schema requires."""
    required = set(schema.contents.get("required", ()))
    for key in spec.output.optional_keys:
        if key in required:
            raise ConfigError(
                file, "output.optional_keys", f"{key!r} may be absent but {schema.name} requires it"
            )


def _check_extracted_fields(
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


def _exit_codes(file: str, spec: CommandFile) -> ExitCodes:
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


def _build_parser(file: str, spec: CommandFile) -> OutputFormat:
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
