"""The published envelope schema: self-contained, only the projected fields, a content $id."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import referencing.exceptions
from referencing import Registry as RefRegistry
from referencing.jsonschema import DRAFT202012

from sshadapter.contract.registry import load_registry
from sshadapter.contract.schemas import DRAFT_2020_12

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = load_registry(ROOT / "commands", ROOT / "schemas", hosts=None)


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def resolve_alone(schema: dict[str, Any]) -> None:
    """Resolve every $ref of ``schema`` with nothing but the document itself."""
    resource = DRAFT202012.create_resource(schema)
    resolver = RefRegistry().with_resource(schema["$id"], resource).resolver(schema["$id"])
    for ref in refs(schema):
        resolver.lookup(ref)


@pytest.mark.parametrize("name", sorted(SHIPPED.operations))
def test_shipped_schemas_are_self_contained_and_show_only_the_contract(name: str) -> None:
    """Every $ref stays in the document; nothing names the command or a field never projected."""
    assert_shows_only_the_contract(SHIPPED.operations[name])


def assert_shows_only_the_contract(op: Any) -> None:
    """``op``'s published envelope schema is self-contained and shows only the agent's fields."""
    published = dict(op.envelope_schema)
    jsonschema.Draft202012Validator.check_schema(published)
    assert all(ref.startswith("#/") for ref in refs(published))
    resolve_alone(published)
    text = json.dumps(published)
    program = next(word for word in op.spec.argv if word != "env" and "=" not in word)
    assert f'"{program} ' not in text and f" {program} " not in text  # descriptions named it
    if "description" in op.schema.contents:  # optional: an output schema may have none
        assert op.schema.contents["description"] not in text
    data = published["oneOf"][0]["properties"]["data"]
    assert list(data["properties"]) == list(op.spec.agent.fields)
    hidden = set(op.schema.contents["properties"]) - set(op.spec.agent.fields)
    for field in hidden:
        assert f'"{field}"' not in text


def test_job_run_status_keeps_field_descriptions_but_not_url_or_log_tail() -> None:
    """A projected field keeps its own description; url and log_tail are gone entirely."""
    published = SHIPPED.operations["job_run_status"].envelope_schema
    data = published["oneOf"][0]["properties"]["data"]
    assert "freshness" in data["properties"]["observed_at"]["description"]
    assert "url" not in json.dumps(published) and "log_tail" not in json.dumps(published)


TREE: dict[str, Any] = {
    "$schema": DRAFT_2020_12,
    "$id": "https://sshadapter.invalid/schemas/tree.v1.json",
    "description": "What tree-cli --json prints.",
    "type": "object",
    "required": ["root", "secret"],
    "properties": {
        "root": {"$ref": "#/$defs/node"},
        "label": {"$ref": "common.v1.json#/$defs/name", "description": "From another file."},
        "secret": {"type": "string", "maxLength": 8},
    },
    "additionalProperties": False,
    "$defs": {
        "node": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"$ref": "common.v1.json#/$defs/name"},
                "children": {"type": "array", "maxItems": 4, "items": {"$ref": "#/$defs/node"}},
            },
            "additionalProperties": False,
        }
    },
}
COMMON: dict[str, Any] = {
    "$schema": DRAFT_2020_12,
    "$id": "https://sshadapter.invalid/schemas/common.v1.json",
    "type": "object",
    "additionalProperties": False,
    "$defs": {"name": {"type": "string", "pattern": "^[a-z]{1,8}$"}},
}
TREE_COMMAND = """\
description = "A small tree."
version = 1
host = "ci"
argv = ["tree-cli", "--json"]

[output]
format = "json"
schema = "tree.v1.json"

[agent]
fields = ["root", "label"]
"""


def tree_registry(tmp_path: Path, *, tree: dict[str, Any] = TREE) -> Any:
    (tmp_path / "commands").mkdir(parents=True)
    (tmp_path / "schemas").mkdir()
    (tmp_path / "commands" / "tree.toml").write_text(TREE_COMMAND)
    (tmp_path / "schemas" / "tree.v1.json").write_text(json.dumps(tree))
    (tmp_path / "schemas" / "common.v1.json").write_text(json.dumps(COMMON))
    return load_registry(tmp_path / "commands", tmp_path / "schemas", hosts=None)


def test_recursive_and_cross_file_refs_are_brought_into_the_document(tmp_path: Path) -> None:
    """Refs to another file and to the schema itself land in $defs once; validation holds."""
    op = tree_registry(tmp_path).operations["tree"]
    published = dict(op.envelope_schema)
    resolve_alone(published)
    assert set(published["$defs"]) == {"node", "name"}
    assert "secret" not in json.dumps(published) and "tree-cli" not in json.dumps(published)
    label = published["oneOf"][0]["properties"]["data"]["properties"]["label"]
    assert label == {"$ref": "#/$defs/name", "description": "From another file."}
    envelope = {
        "tool": "tree",
        "request_id": "req.0123456789",
        "outcome": "success",
        "data": {"root": {"name": "a", "children": [{"name": "b", "children": []}]}},
    }
    alone = jsonschema.Draft202012Validator(published, registry=RefRegistry())
    assert alone.is_valid(envelope) and op.envelope_validator.is_valid(envelope)
    deep_bad = {**envelope, "data": {"root": {"name": "a", "children": [{"name": "B!"}]}}}
    assert not alone.is_valid(deep_bad) and not op.envelope_validator.is_valid(deep_bad)


def test_an_unresolvable_ref_never_gets_published(tmp_path: Path) -> None:
    """The empty registry really is empty: a ref out of the document would not resolve."""
    published = dict(tree_registry(tmp_path).operations["tree"].envelope_schema)
    published["$defs"] = {}
    with pytest.raises(referencing.exceptions.Unresolvable):
        resolve_alone(published)


def test_id_follows_the_published_content_only(tmp_path: Path) -> None:
    """$id changes with a projected field's schema, not with a field the agent never sees."""
    before = tree_registry(tmp_path / "a").operations["tree"].envelope_schema["$id"]
    same = tree_registry(tmp_path / "b").operations["tree"].envelope_schema["$id"]
    hidden = copy.deepcopy(TREE)
    hidden["properties"]["secret"]["maxLength"] = 9  # a field the agent never sees
    unseen = tree_registry(tmp_path / "c", tree=hidden).operations["tree"].envelope_schema["$id"]
    deeper = copy.deepcopy(TREE)
    deeper["$defs"]["node"]["properties"]["children"]["maxItems"] = 5  # reached through $ref
    after = tree_registry(tmp_path / "d", tree=deeper).operations["tree"].envelope_schema["$id"]
    assert before == same == unseen
    assert after != before
    assert before.startswith("https://sshadapter.invalid/envelopes/tree.v1.")


def test_shipped_ids_differ_per_tool() -> None:
    """Each tool publishes its own $id (a validator cache keyed by $id never mixes two tools)."""
    ids = [op.envelope_schema["$id"] for op in SHIPPED.operations.values()]
    assert len(set(ids)) == len(ids)


def test_projection_leaves_the_loaded_schema_alone() -> None:
    """Projection copies: the output schema the daemon validates with keeps description and refs."""
    op = SHIPPED.operations["mount_info"]
    assert op.schema.contents["properties"]["filesystems"]["items"] == {
        "$ref": "#/$defs/filesystem"
    }
    assert "findmnt" in op.schema.contents["description"]
