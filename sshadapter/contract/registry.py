"""The registry: every command file of a directory, loaded and checked as an Operation.

Reference: docs/command-files.md. The file stem is the tool name; every
placeholder is a declared parameter and every parameter is used; every string
parameter is constrained; the fields named by checks and projection are
properties of the output schema. A directory loads whole or not at all: the
first bad file raises ConfigError naming the file, the key and the reason.

Beside it: sources.py (the bytes a registry is built from) and crosscheck.py (one
file's keys checked together and against its schema, and its output parser built).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Final

import orjson

from sshadapter import __version__
from sshadapter.catalog import LISTED_PARAMETERS, NO_CATALOG, CatalogFile, CatalogSource
from sshadapter.catalog import SCHEMAS_DIR as CATALOG_SCHEMAS_DIR
from sshadapter.contract import envelope
from sshadapter.contract.argv import ArgvElement, ArgvTemplate, parse_template
from sshadapter.contract.codes import RESERVED_TOOL_PREFIX, SYSTEM_TOOL, TOOL_NAME_PATTERN
from sshadapter.contract.commandfile import CommandFile, parse_command_file, read_command_bytes
from sshadapter.contract.crosscheck import (
    build_parser,
    check_extracted_fields,
    check_fields,
    check_optional_keys,
    exit_codes,
)
from sshadapter.contract.exitstatus import ExitCodes, ExitMeaning
from sshadapter.contract.extract import OutputFormat
from sshadapter.contract.params import (
    argument_hint,
    check_params_used,
    param_warnings,
    params_schema_of,
)
from sshadapter.contract.run_as import RootCommand, root_command, sudo_prefix
from sshadapter.contract.schemas import LoadedSchema, SchemaSet, Validator
from sshadapter.contract.sources import RegistrySource
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
    check_fields(file, spec, schema)
    check_optional_keys(file, spec, schema)
    parser = build_parser(file, spec)
    check_extracted_fields(file, spec, schema, parser)
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
        exit_codes=exit_codes(file, spec),
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
