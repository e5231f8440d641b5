"""SchemaSet and lint: what a schemas/ directory may hold (docs/command-files.md "Schemas").

Each test writes a small schemas/ directory in tmp_path, starting from one
closed, bounded schema and changing one thing.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from sshadapter.contract.schemas import BASE_URI, DRAFT_2020_12, SchemaSet, Validator, lint
from sshadapter.errors import ConfigError, EvidenceError

REPO = Path(__file__).resolve().parents[2]

NAME = {"type": "string", "pattern": "^[a-z]{1,16}$"}


def closed(properties: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A valid top-level schema: a closed object with ``properties``, all required."""
    return {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "required": sorted(properties),
        "properties": properties,
        "additionalProperties": False,
        **extra,
    }


# The article's composition example, verbatim plus `$schema`.
ARTICLE = {
    "$schema": DRAFT_2020_12,
    "allOf": [
        {
            "type": "object",
            "required": ["subject"],
            "properties": {"subject": {"type": "string", "minLength": 1, "maxLength": 128}},
        },
        {
            "type": "object",
            "required": ["source"],
            "properties": {"source": {"enum": ["directory", "review_service"]}},
        },
    ],
    "unevaluatedProperties": False,
}


def write(root: Path, files: dict[str, Any]) -> Path:
    """A schemas/ directory holding ``files`` (JSON values, or raw text as given)."""
    directory = root / "schemas"
    directory.mkdir()
    for name, contents in files.items():
        text = contents if isinstance(contents, str) else json.dumps(contents)
        (directory / name).write_text(text)
    return directory


def refused(root: Path, files: dict[str, Any]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        SchemaSet(write(root, files))
    return info.value


def validator(schemas: SchemaSet, name: str) -> Validator:
    loaded = schemas.schemas[name]
    return schemas.compile(loaded.contents, file=name, base_uri=loaded.uri)


def test_minimal_schema_loads(tmp_path: Path) -> None:
    """The closed, bounded starting point loads and is registered under BASE_URI + name."""
    schemas = SchemaSet(write(tmp_path, {"a.json": closed({"name": NAME})}))
    assert schemas.schemas["a.json"].uri == BASE_URI + "a.json"
    assert validator(schemas, "a.json").is_valid({"name": "abc"})
    assert not validator(schemas, "a.json").is_valid({"name": "abc", "extra": 1})


def test_shipped_schemas_load_and_lint_clean() -> None:
    """Every example schema in the repository passes the loader and the lint."""
    assert_load_and_lint_clean(REPO / "schemas")


def assert_load_and_lint_clean(directory: Path) -> None:
    """Every schema of ``directory`` loads, and the lint finds nothing in it."""
    schemas = SchemaSet(directory)
    assert schemas.schemas
    for loaded in schemas.schemas.values():
        assert list(lint(loaded.contents)) == []


# --- dialect and metaschema ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "dialect", [None, "http://json-schema.org/draft-07/schema#", DRAFT_2020_12 + "#"]
)
def test_only_draft_2020_12_is_accepted(tmp_path: Path, dialect: str | None) -> None:
    """`$schema` is required and must name Draft 2020-12 exactly."""
    schema = {k: v for k, v in closed({"name": NAME}).items() if k != "$schema"}
    if dialect is not None:
        schema["$schema"] = dialect
    exc = refused(tmp_path, {"a.json": schema})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert exc.key == "$schema"
    assert "Draft 2020-12 only" in exc.reason


@pytest.mark.parametrize(
    ("keyword", "value"), [("type", "strnig"), ("maxLength", -1), ("required", "name")]
)
def test_schema_invalid_against_metaschema_names_the_pointer(
    tmp_path: Path, keyword: str, value: Any
) -> None:
    """A schema the metaschema refuses is named by the pointer of the bad keyword."""
    exc = refused(tmp_path, {"a.json": closed({"name": {**NAME, keyword: value}})})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert exc.key == f"/properties/name/{keyword}"
    assert "not a valid Draft 2020-12 schema" in exc.reason


@pytest.mark.parametrize(
    "text",
    [
        f'{{"$schema": "{DRAFT_2020_12}", "type": "string", "type": "object"}}',
        f'{{"$schema": "{DRAFT_2020_12}", "type": "string", "maxLength": 3,}}',
        f'{{"$schema": "{DRAFT_2020_12}", "type": "string", "maxLength": NaN}}',
        "[]",
    ],
    ids=["duplicate-key", "trailing-comma", "nan", "not-an-object"],
)
def test_schema_file_must_be_a_strict_json_object(tmp_path: Path, text: str) -> None:
    """Duplicate names, trailing commas and NaN are refused, naming the file."""
    exc = refused(tmp_path, {"a.json": text})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert "strict JSON" in exc.reason or "must be a JSON object" in exc.reason


def test_unreadable_schema_file_is_refused(tmp_path: Path) -> None:
    """A schema file that cannot be read (a dangling symlink) is a ConfigError, not a crash."""
    directory = write(tmp_path, {})
    (directory / "a.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError) as info:
        SchemaSet(directory)
    assert Path(info.value.file) == directory / "a.json"
    assert "cannot read" in info.value.reason


def test_missing_directory_is_refused(tmp_path: Path) -> None:
    """A schemas directory that does not exist is a ConfigError naming it."""
    with pytest.raises(ConfigError) as info:
        SchemaSet(tmp_path / "nope")
    assert info.value.file == str(tmp_path / "nope")


# --- lint: what is refused ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "pointer", "phrase"),
    [
        pytest.param(
            {k: v for k, v in closed({"name": NAME}).items() if k != "additionalProperties"},
            "/",
            "object is not closed",
            id="open-object",
        ),
        pytest.param(
            closed({"name": NAME, "meta": {"type": "object", "properties": {"a": NAME}}}),
            "/properties/meta",
            "object is not closed",
            id="open-nested-object",
        ),
        pytest.param(
            {k: v for k, v in ARTICLE.items() if k != "unevaluatedProperties"},
            "/allOf/0",
            "object is not closed",
            id="allOf-without-unevaluatedProperties",
        ),
        pytest.param(
            {
                **{k: v for k, v in ARTICLE.items() if k != "unevaluatedProperties"},
                "type": "object",
            },
            "/",
            "object is not closed",
            id="allOf-typed-root-without-unevaluatedProperties",
        ),
        pytest.param(
            {**ARTICLE, "unevaluatedProperties": True},
            "/unevaluatedProperties",
            "`true` accepts any value",
            id="unevaluatedProperties-true",
        ),
        pytest.param(
            closed({"name": {"type": "string", "minLength": 1}}),
            "/properties/name",
            "string has no bound",
            id="unbounded-string",
        ),
        pytest.param(
            closed({"names": {"type": "array", "items": NAME}}),
            "/properties/names",
            "array has no `maxItems`",
            id="array-without-maxItems",
        ),
        pytest.param(
            closed({"names": {"type": "array", "maxItems": 4}}),
            "/properties/names",
            "array items accept any value",
            id="array-without-items",
        ),
        pytest.param(
            closed({"name": {}}),
            "/properties/name",
            "accepts any value",
            id="empty-schema",
        ),
        pytest.param(
            closed({"name": True}),
            "/properties/name",
            "`true` accepts any value",
            id="true",
        ),
        pytest.param(
            closed({"name": NAME}, additionalProperties=True),
            "/",
            "object is not closed",
            id="additionalProperties-true",
        ),
        pytest.param(
            closed({"names": {"type": "array", "maxItems": 4, "items": True}}),
            "/properties/names/items",
            "`true` accepts any value",
            id="items-true",
        ),
        pytest.param(
            closed({"name": {"not": {"type": "null"}}}),
            "/properties/name",
            "accepts any value",
            id="not-alone",
        ),
        pytest.param(
            closed({"name": {"anyOf": [NAME, {"type": "string"}]}}),
            "/properties/name/anyOf/1",
            "string has no bound",
            id="anyOf-branch",
        ),
        pytest.param(
            closed({"id": {"$ref": "#/$defs/id"}}, **{"$defs": {"id": {"type": "string"}}}),
            "/$defs/id",
            "string has no bound",
            id="defs",
        ),
    ],
)
def test_lint_refuses(tmp_path: Path, schema: dict[str, Any], pointer: str, phrase: str) -> None:
    """Open objects, unbounded strings and arrays, and any-value subschemas are refused."""
    exc = refused(tmp_path, {"a.json": schema})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert exc.key == pointer
    assert phrase in exc.reason


# --- lint: what is accepted ---------------------------------------------------------------------


def test_article_composition_is_accepted_and_closed(tmp_path: Path) -> None:
    """allOf branches closed by `unevaluatedProperties: false` load, and stay closed."""
    schemas = SchemaSet(write(tmp_path, {"a.json": ARTICLE}))
    check = validator(schemas, "a.json")
    assert check.is_valid({"subject": "ada", "source": "directory"})
    assert not check.is_valid({"subject": "ada", "source": "directory", "admin": True})


@pytest.mark.parametrize(
    "bounded",
    [
        {"type": "string", "enum": ["a", "b"]},
        {"type": "string", "const": "a"},
        {"type": "string", "format": "date-time"},
        {"type": "string", "pattern": "^[a-z]+$"},
        {"type": "string", "maxLength": 3},
        {"enum": ["a", 1, None]},
        {"type": ["string", "null"], "maxLength": 3},
        {"type": "array", "maxItems": 2, "items": NAME},
        {"type": "array", "maxItems": 2, "prefixItems": [NAME], "items": False},
    ],
    ids=[
        "enum",
        "const",
        "format",
        "pattern",
        "maxLength",
        "untyped-enum",
        "nullable",
        "array",
        "tuple",
    ],
)
def test_bounded_values_are_accepted(tmp_path: Path, bounded: dict[str, Any]) -> None:
    """Each of the bounds the contract names is enough on its own."""
    SchemaSet(write(tmp_path, {"a.json": closed({"value": bounded})}))


def test_conditions_are_not_linted_as_values(tmp_path: Path) -> None:
    """`if` and `not` only constrain: they need not be typed, closed or bounded themselves."""
    schema = {
        "$schema": DRAFT_2020_12,
        "type": "object",
        "required": ["state", "code", "user"],
        "properties": {
            "state": {"type": "string", "enum": ["ok", "failed"]},
            "code": {"type": "integer", "minimum": 0, "maximum": 255},
            "user": {**NAME, "not": {"const": "root"}},
        },
        "if": {"properties": {"state": {"const": "failed"}}},
        "then": {"type": "object", "properties": {"code": {"type": "integer", "minimum": 1}}},
        "unevaluatedProperties": False,
    }
    schemas = SchemaSet(write(tmp_path, {"a.json": schema}))
    check = validator(schemas, "a.json")
    assert check.is_valid({"state": "failed", "code": 3, "user": "ada"})
    assert not check.is_valid({"state": "failed", "code": 0, "user": "ada"})
    assert not check.is_valid({"state": "ok", "code": 0, "user": "root"})


# --- $ref ---------------------------------------------------------------------------------------


def test_ref_by_relative_name_between_files_without_id(tmp_path: Path) -> None:
    """`$ref: "b.json"` in an $id-less file resolves to b.json of the same directory."""
    schemas = SchemaSet(
        write(
            tmp_path,
            {
                "a.json": closed({"name": {"$ref": "b.json"}}),
                "b.json": {"$schema": DRAFT_2020_12, "type": "string", "maxLength": 3},
            },
        )
    )
    check = validator(schemas, "a.json")
    assert check.is_valid({"name": "abc"})
    assert not check.is_valid({"name": "abcd"})


def test_ref_by_id(tmp_path: Path) -> None:
    """`$ref` to another file's `$id` resolves to that file."""
    schemas = SchemaSet(
        write(
            tmp_path,
            {
                "a.json": closed({"name": {"$ref": "https://example.invalid/short"}}),
                "b.json": {
                    "$schema": DRAFT_2020_12,
                    "$id": "https://example.invalid/short",
                    "type": "string",
                    "maxLength": 3,
                },
            },
        )
    )
    check = validator(schemas, "a.json")
    assert check.is_valid({"name": "abc"})
    assert not check.is_valid({"name": "abcd"})


def test_ref_to_missing_file_is_refused(tmp_path: Path) -> None:
    """A `$ref` to a file that is not in schemas/: a ConfigError naming the file and pointer."""
    exc = refused(tmp_path, {"a.json": closed({"name": {"$ref": "c.json"}})})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert exc.key == "/properties/name/$ref"
    assert "c.json" in exc.reason


def test_two_files_with_one_id_are_refused(tmp_path: Path) -> None:
    """Two files claiming one `$id` (a copied v1) would make a `$ref` to it ambiguous."""
    copy = closed({"name": NAME}, **{"$id": "https://example.invalid/item"})
    exc = refused(tmp_path, {"a.v1.json": copy, "a.v2.json": copy})
    assert Path(exc.file) == tmp_path / "schemas" / "a.v2.json"
    assert exc.key == "$id"
    assert "a.v1.json" in exc.reason


_LOAD_ONE = """
import sys
from pathlib import Path
from sshadapter.errors import ConfigError
from sshadapter.contract.schemas import SchemaSet
try:
    SchemaSet(Path(sys.argv[1]))
except ConfigError as exc:
    print(exc.key, exc.reason)
    sys.exit(3)
"""


def test_remote_ref_is_refused_without_any_network_attempt(tmp_path: Path) -> None:
    """A remote `$ref` fails at once: every proxy points at a socket that must see nothing."""
    directory = write(
        tmp_path,
        {
            "a.json": closed({"name": {"$ref": "https://example.com/x.json"}}),
        },
    )
    # jsonschema-rs's default retriever honours these; a fetch would reach this listener
    # and then wait for an answer that never comes.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        proxy = f"http://127.0.0.1:{listener.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if k.lower() != "no_proxy"}
        for name in ("http_proxy", "https_proxy", "all_proxy"):
            env[name] = env[name.upper()] = proxy
        env["PYTHONPATH"] = str(REPO)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-c", _LOAD_ONE, str(directory)],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        elapsed = time.monotonic() - started
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert done.returncode == 3, done.stderr
    assert done.stdout.startswith("/properties/name/$ref ")  # the pointer inside a.json
    assert "https://example.com/x.json" in done.stdout
    assert elapsed < 10


# --- format assertion ---------------------------------------------------------------------------


def test_format_is_asserted(tmp_path: Path) -> None:
    """`format: date-time` rejects an impossible timestamp and accepts a real one."""
    schemas = SchemaSet(
        write(
            tmp_path,
            {
                "a.json": closed(
                    {
                        "observed_at": {"type": "string", "format": "date-time", "maxLength": 35},
                    }
                )
            },
        )
    )
    check = validator(schemas, "a.json")
    check.validate({"observed_at": "2026-11-30T04:10:00Z"})
    with pytest.raises(EvidenceError) as info:
        check.validate({"observed_at": "2026-13-45T99:99:99Z"})
    assert (info.value.stage, info.value.reason) == ("schema", "schema_mismatch")
    assert info.value.instance_path == "/observed_at"
    assert info.value.schema_path == "/properties/observed_at/format"


def test_unknown_format_is_refused(tmp_path: Path) -> None:
    """A format name the validator does not know would assert nothing: refused at load."""
    exc = refused(tmp_path, {"a.json": closed({"name": {"type": "string", "format": "nope"}})})
    assert Path(exc.file) == tmp_path / "schemas" / "a.json"
    assert "nope" in exc.reason
