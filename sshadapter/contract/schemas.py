"""Schemas: load, lint and compile every file in ``schemas/``.

Reference: docs/command-files.md "Schemas". Every schema is Draft 2020-12
(``$schema`` required) and valid against its metaschema; ``$ref`` resolves only
to files of the same directory and is never fetched over a network; ``format``
is an assertion; and the lint refuses an object that is not closed, a string
without a bound and an array without ``maxItems`` or ``items``, because each of
those lets a remote side grow what the agent can be shown.

Two libraries, one job each: ``jsonschema`` checks schemas against the
metaschema (its error messages name the key), ``jsonschema-rs`` validates
results on the hot path (about 100x faster). tests/contract/test_schema_agreement.py
shows they agree on every fixture and near-miss.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urljoin

import jsonschema
import jsonschema_rs
import referencing.exceptions
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from sshadapter.bounded_read import read_bounded
from sshadapter.contract.linear_regex import LinearRegexError, compile_linear
from sshadapter.contract.rfc3339 import is_date_time
from sshadapter.errors import ConfigError, EvidenceError
from sshadapter.strict_json import StrictJSONError, strict_loads

DRAFT_2020_12: Final = "https://json-schema.org/draft/2020-12/schema"
BASE_URI: Final = "https://sshadapter.invalid/schemas/"  # .invalid: never resolvable (RFC 2606)
MAX_SCHEMA_BYTES: Final = 1024 * 1024  # a schema is written by hand; a larger file is a mistake
MAX_SCHEMA_DEPTH: Final = 64  # nesting of a hand-written schema document
# `pattern` and `patternProperties` run on untrusted values: the Rust `regex` engine
# (linear time), never jsonschema-rs's default fancy-regex, which backtracks.
PATTERN_OPTIONS: Final = jsonschema_rs.RegexOptions()


# jsonschema's own date-time check (rfc3339-validator) refuses every leap second, which
# jsonschema-rs accepts at 23:59:60 UTC as RFC 3339 section 5.7 allows. The reference
# validator uses the project's definition so both libraries agree (a test holds them).
REFERENCE_FORMATS: Final = jsonschema.FormatChecker()
REFERENCE_FORMATS.checks("date-time")(is_date_time)


def _refuse_retrieval(uri: str) -> Any:
    """jsonschema-rs fetches unknown ``$ref`` targets over HTTP by default; never here."""
    raise LookupError(f"$ref {uri} is not a file in schemas/ (nothing is fetched)")


@dataclass(frozen=True)
class Projection:
    """Some top-level properties of a schema file, made self-contained for publication.

    What an agent is shown of the output schema (docs/protocol.md stage 10): only the
    projected fields' subschemas, nothing of the file around them (its title,
    its description of the upstream command, the fields never projected), and
    every ``$ref`` inside them rewritten to ``#/$defs/<name>`` of the document
    they are published in, with ``defs`` holding each target once. Nothing
    points outside that document: 2026-07-28 clients must not fetch a ``$ref``
    (SEP-2106), and the TypeScript SDK v1 fails its whole ``listTools()`` on one
    it cannot resolve.
    """

    properties: Mapping[str, Any]
    required: tuple[str, ...]
    defs: Mapping[str, Any]


@dataclass(frozen=True)
class LoadedSchema:
    """One schema file, linted."""

    name: str
    """File name inside ``schemas/``, e.g. ``job_run_status.v1.json``."""
    uri: str
    """The URI it is registered under (its ``$id``, or BASE_URI + name)."""
    contents: Mapping[str, Any]
    sha256: str
    """Of the file's bytes, for the audit record."""


class SchemaSet:
    """All schemas of one directory, loaded whole or not at all."""

    def __init__(self, directory: Path, files: Mapping[str, bytes] | None = None) -> None:
        """Load ``directory``, or ``files`` (name -> bytes) read from it earlier."""
        self.directory = directory
        self.schemas: dict[str, LoadedSchema] = {}
        if files is None:
            files = read_schema_files(directory)
        for name, raw in sorted(files.items()):
            path = directory / name
            loaded = _load_file(path, raw)
            for other in self.schemas.values():  # else a $ref to that URI means either file
                if other.uri.removesuffix("#") == loaded.uri.removesuffix("#"):
                    raise ConfigError(str(path), "$id", f"{loaded.uri} is also {other.name}'s URI")
            self.schemas[loaded.name] = loaded
        resources: list[tuple[str, Any]] = [(s.uri, s.contents) for s in self.schemas.values()]
        wanted: list[str] = []  # what the registry tried to fetch: names the file at fault

        def refuse(uri: str) -> Any:
            wanted.append(uri)
            return _refuse_retrieval(uri)

        try:  # the registry resolves every $ref of every file now, through _refuse_retrieval
            self._rs_registry = jsonschema_rs.Registry(resources, retriever=refuse)
        except (jsonschema_rs.ReferencingError, ValueError) as exc:
            file, pointer = self._ref_to(wanted)
            raise ConfigError(file, pointer, _first_line(exc)) from exc
        self._py_registry: Registry[Any] = Registry().with_resources(
            (uri, DRAFT202012.create_resource(dict(c))) for uri, c in resources
        )
        for loaded in self.schemas.values():
            self.compile(loaded.contents, file=str(directory / loaded.name), base_uri=loaded.uri)

    def _ref_to(self, uris: Sequence[str]) -> tuple[str, str]:
        """(file, JSON pointer) of the first ``$ref`` that resolves to one of ``uris``."""
        targets = {uri.split("#", 1)[0] for uri in uris}
        for loaded in self.schemas.values():
            for pointer, target in _refs(loaded.contents, loaded.uri):
                if target in targets:
                    return str(self.directory / loaded.name), pointer
        return str(self.directory), "$ref"  # not found: at least the directory

    def get(self, name: str, *, file: str, key: str) -> LoadedSchema:
        try:
            return self.schemas[name]
        except KeyError:
            raise ConfigError(file, key, f"no schema {name!r} in {self.directory}") from None

    def compile(
        self, schema: Mapping[str, Any], *, file: str, base_uri: str | None = None
    ) -> Validator:
        """A fast validator with format assertion on; refs resolve only inside this set."""
        try:
            compiled = jsonschema_rs.Draft202012Validator(
                dict(schema),
                validate_formats=True,
                ignore_unknown_formats=False,
                pattern_options=PATTERN_OPTIONS,
                registry=self._rs_registry,
                retriever=_refuse_retrieval,
                base_uri=base_uri,
            )
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
            raise ConfigError(file, "", f"schema does not compile: {_first_line(exc)}") from exc
        return Validator(compiled)

    def project(
        self, schema: LoadedSchema, fields: Sequence[str], *, rows: int | None = None
    ) -> Projection:
        """The subschemas of ``fields`` (top-level properties of ``schema``), self-contained;
        with ``rows`` (`[agent] rows`), the array ``rows`` holds at most that many items."""
        defs: dict[str, Any] = {}
        names: dict[int, str] = {}  # id() of a $ref target in the registry -> its $defs key

        def target(ref: str, resolver: Any) -> str:
            try:
                resolved = resolver.lookup(ref)
            except referencing.exceptions.Unresolvable as exc:  # the loader resolved them all
                file = str(self.directory / schema.name)
                raise ConfigError(file, "$ref", f"cannot resolve {ref}") from exc
            key = names.get(id(resolved.contents))
            if key is None:
                stem = _DEFS_NAME.sub("_", ref.rstrip("/").rsplit("/", 1)[-1]) or "ref"
                key, suffix = stem, 1
                while key in defs:  # two targets with the same last segment
                    suffix += 1
                    key = f"{stem}_{suffix}"
                names[id(resolved.contents)] = key
                defs[key] = {}  # reserved before the walk, so a recursive $ref finds it
                defs[key] = walk(resolved.contents, resolved.resolver)
            return key

        def walk(node: Any, resolver: Any) -> Any:
            if not isinstance(node, dict):
                return node  # true/false, or a keyword's data value
            if "$id" in node:  # an embedded resource: its refs resolve against its own $id
                resolver = resolver.in_subresource(DRAFT202012.create_resource(node))
            out: dict[str, Any] = {}
            for key, value in node.items():
                if key in ("$id", "$schema", "$anchor", "$dynamicAnchor"):
                    continue  # the published document has one $id and one dialect
                if key == "$ref":
                    out[key] = f"#/$defs/{target(value, resolver)}"
                elif key in _ONE:
                    out[key] = walk(value, resolver)
                elif key in _LIST:
                    out[key] = [walk(sub, resolver) for sub in value]
                elif key in _MAP:
                    out[key] = {name: walk(sub, resolver) for name, sub in value.items()}
                else:
                    out[key] = value
            return out

        root = self._py_registry.resolver(base_uri=schema.uri)
        properties = schema.contents.get("properties", {})
        projected = {name: walk(properties[name], root) for name in fields}
        if rows is not None:
            shown = projected["rows"]
            projected["rows"] = {**shown, "maxItems": min(rows, shown.get("maxItems", rows))}
        required = tuple(name for name in fields if name in schema.contents.get("required", ()))
        return Projection(projected, required, defs)

    def reference_validator(self, schema: Mapping[str, Any]) -> jsonschema.Validator:
        """The pure-Python validator, used by tests to check the two libraries agree."""
        return jsonschema.Draft202012Validator(
            dict(schema), registry=self._py_registry, format_checker=REFERENCE_FORMATS
        )


class Validator:
    """A compiled schema; the one place jsonschema-rs errors are translated."""

    __slots__ = ("_compiled",)

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def is_valid(self, value: Any) -> bool:
        return bool(self._compiled.is_valid(value))

    def validate(self, value: Any) -> None:
        """Raise EvidenceError(stage="schema") naming the schema and instance paths.

        ``is_valid`` first: on a valid value it is the only pass, and it costs
        ~0.7x ``validate`` (which keeps what it needs to report an error).
        ``validate`` runs only to explain a value ``is_valid`` refused; if the
        two ever disagreed, the value is refused all the same.
        """
        if self._compiled.is_valid(value):
            return
        try:
            self._compiled.validate(value)
        except jsonschema_rs.ValidationError as exc:
            raise EvidenceError(
                "schema",
                "schema_mismatch",
                _first_line(exc)[:500],
                schema_path=_pointer(exc.schema_path),
                instance_path=_pointer(exc.instance_path),
            ) from exc
        raise EvidenceError(  # pragma: no cover - jsonschema-rs's two entry points disagree
            "schema", "schema_mismatch", "refused by is_valid, accepted by validate"
        )


def read_schema_files(directory: Path) -> dict[str, bytes]:
    """Every ``*.json`` of ``directory``, name -> bytes, or ConfigError."""
    if not directory.is_dir():
        raise ConfigError(str(directory), "", "schemas directory does not exist")
    return {
        path.name: read_bounded(path, MAX_SCHEMA_BYTES) for path in sorted(directory.glob("*.json"))
    }


def _load_file(path: Path, raw: bytes) -> LoadedSchema:
    file = str(path)
    try:
        contents = strict_loads(raw, max_bytes=MAX_SCHEMA_BYTES, max_depth=MAX_SCHEMA_DEPTH)
    except StrictJSONError as exc:
        raise ConfigError(file, "", f"not strict JSON ({exc.reason}): {exc.detail}") from exc
    if not isinstance(contents, dict):
        raise ConfigError(file, "", "a schema must be a JSON object")
    if contents.get("$schema") != DRAFT_2020_12:
        raise ConfigError(file, "$schema", f"must be {DRAFT_2020_12!r} (Draft 2020-12 only)")
    error = jsonschema.exceptions.best_match(
        jsonschema.Draft202012Validator(jsonschema.Draft202012Validator.META_SCHEMA).iter_errors(
            contents
        )
    )
    if error is not None:
        key = _pointer(error.absolute_path) or "/"
        raise ConfigError(file, key, f"not a valid Draft 2020-12 schema: {error.message}")
    for pointer, reason in lint(contents):
        raise ConfigError(file, pointer, reason)
    for pointer, reason in nonlinear_patterns(contents):
        raise ConfigError(file, pointer, reason)
    uri = contents.get("$id", BASE_URI + path.name)
    return LoadedSchema(path.name, uri, contents, hashlib.sha256(raw).hexdigest())


# Keywords whose value is one subschema / a list of them / a map of them.
_ONE: Final = (
    "additionalProperties",
    "unevaluatedProperties",
    "items",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
    "unevaluatedItems",
)
_LIST: Final = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP: Final = ("properties", "patternProperties", "$defs", "dependentSchemas")
_DEFS_NAME: Final = re.compile(r"[^A-Za-z0-9_.-]")  # what a $defs key may hold, unescaped
_CONDITIONS: Final = ("if", "not", "contains", "propertyNames")
_COMPOSED: Final = ("allOf", "anyOf", "oneOf", "then", "else")
# Not `not`: `{"not": {"type": "null"}}` still accepts any object, array or string.
_DEFINES_VALUES: Final = ("type", "enum", "const", "$ref", "allOf", "anyOf", "oneOf")


def lint(
    schema: Any, pointer: str = "", *, closed_by_parent: bool = False
) -> Iterator[tuple[str, str]]:
    """Yield (JSON pointer, reason) for every subschema that is open or unbounded."""
    if schema is False:
        return
    if schema is True:
        yield pointer or "/", "`true` accepts any value: write the schema it stands for"
        return
    if not isinstance(schema, dict):
        return
    at = pointer or "/"
    types = schema.get("type", [])
    types = [types] if isinstance(types, str) else types
    if not any(key in schema for key in _DEFINES_VALUES):
        yield at, "accepts any value: give it a `type`, `enum`, `const` or `$ref`"
    is_object = "object" in types or "properties" in schema
    if is_object and not closed_by_parent and not _closes(schema):
        yield (
            at,
            "object is not closed: add `additionalProperties: false` (or "
            "`unevaluatedProperties: false` after `allOf`/`oneOf`)",
        )
    if "string" in types and not any(
        k in schema for k in ("maxLength", "pattern", "enum", "const", "format")
    ):
        yield at, "string has no bound: add `maxLength`, `pattern`, `enum`, `const` or `format`"
    if "array" in types or "items" in schema or "prefixItems" in schema:
        if "maxItems" not in schema:
            yield at, "array has no `maxItems`"
        if "items" not in schema:  # absent `items` is `items: true`
            yield at, "array items accept any value: add `items` (`false` after `prefixItems`)"
    closes_branches = schema.get("unevaluatedProperties") is False
    for key in _ONE:
        # Conditions (`if`, `not`, `contains`, `propertyNames`) admit no value themselves.
        if key in schema and key not in _CONDITIONS:
            yield from lint(
                schema[key],
                f"{pointer}/{key}",
                closed_by_parent=closes_branches and key in _COMPOSED,
            )
    for key in _LIST:
        for index, sub in enumerate(schema.get(key, [])):
            yield from lint(
                sub,
                f"{pointer}/{key}/{index}",
                closed_by_parent=closes_branches and key in _COMPOSED,
            )
    for key in _MAP:
        for name, sub in schema.get(key, {}).items():
            yield from lint(sub, f"{pointer}/{key}/{_escape(name)}")


def nonlinear_patterns(schema: Any, pointer: str = "") -> Iterator[tuple[str, str]]:
    """Yield (JSON pointer, reason) for every pattern the linear-time engine refuses."""
    if isinstance(schema, list):
        for index, item in enumerate(schema):
            yield from nonlinear_patterns(item, f"{pointer}/{index}")
        return
    if not isinstance(schema, dict):
        return
    for key, value in schema.items():
        at = f"{pointer}/{_escape(key)}"
        if key == "pattern" and isinstance(value, str):
            patterns = [(at, value)]
        elif key == "patternProperties" and isinstance(value, dict):
            patterns = [(f"{at}/{_escape(name)}", name) for name in value]
        else:
            patterns = []
        for where, pattern in patterns:
            reason = pattern_refusal(pattern)
            if reason:
                yield where, reason
        if key not in ("enum", "const", "examples", "default"):  # values, not subschemas
            yield from nonlinear_patterns(value, at)


def pattern_refusal(pattern: str) -> str | None:
    """Why the linear-time engine refuses ``pattern`` (RE2's words when it has some), or None."""
    try:
        jsonschema_rs.Draft202012Validator({"pattern": pattern}, pattern_options=PATTERN_OPTIONS)
    except (jsonschema_rs.ValidationError, ValueError):
        try:
            compile_linear(pattern)
            why = "not valid for the Rust regex engine"
        except LinearRegexError as exc:
            why = str(exc)
        return (
            f"pattern {pattern!r} is not one the linear-time engine accepts: {why} "
            "(no lookaround or backreferences)"
        )
    return None


def _refs(node: Any, base: str, pointer: str = "") -> Iterator[tuple[str, str]]:
    """(JSON pointer, absolute URI without fragment) of every ``$ref`` under ``node``."""
    if isinstance(node, list):
        for index, item in enumerate(node):
            yield from _refs(item, base, f"{pointer}/{index}")
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("$id"), str):  # an embedded resource: its refs are relative to it
        base = urljoin(base, node["$id"])
    for key, value in node.items():
        at = f"{pointer}/{_escape(key)}"
        if key == "$ref" and isinstance(value, str):
            yield at, urljoin(base, value).split("#", 1)[0]
        elif key not in ("enum", "const", "examples", "default"):  # values, not subschemas
            yield from _refs(value, base, at)


def _closes(schema: Mapping[str, Any]) -> bool:
    return schema.get("additionalProperties") is False or (
        schema.get("unevaluatedProperties") is False
    )


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


def _pointer(path: Any) -> str:
    return "".join(f"/{_escape(str(p))}" for p in path)


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "message", None) or str(exc)
    return str(text).splitlines()[0] if text else type(exc).__name__
