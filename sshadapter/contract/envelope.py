"""The agent contract: the closed envelope, its per-tool schema, and the error codes.

Reference: docs/protocol.md "The envelope". An envelope is either
``{"tool", "request_id", "outcome": "success", "data"}`` or
``{"tool", "request_id", "outcome": "failure", "error": {"code", "retryable"}}``;
nothing else. Each tool publishes a JSON Schema for its envelope (an object at
the root, the ``oneOf`` inside it, as in the article), and every envelope is
validated against it before it leaves the daemon.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, Final

import orjson

from sshadapter.contract.codes import CODES, HINT_PARAMETER_PATTERN, HINT_RULES, SYSTEM_TOOL
from sshadapter.contract.schemas import DRAFT_2020_12, Projection

REQUEST_ID_PATTERN: Final = "^[A-Za-z0-9][A-Za-z0-9_.]{7,63}$"
ENVELOPE_BASE_URI: Final = "https://sshadapter.invalid/envelopes/"


def new_request_id() -> str:
    """Made by the daemon, never taken from the client or the remote side: 80 random bits.

    One getrandom call (``secrets.choice`` per character made 16 and cost 28 µs a call).
    """
    return "req." + secrets.token_hex(10)


def success(tool: str, request_id: str, data: Mapping[str, Any]) -> dict[str, Any]:
    return {"tool": tool, "request_id": request_id, "outcome": "success", "data": data}


def failure(
    tool: str,
    request_id: str,
    code: str,
    retryable: bool | None = None,
    hint: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A failure envelope; ``hint`` (INVALID_REQUEST of a known tool only) says which
    argument and which rule of the tool's own schema (HINT_SCHEMA)."""
    if code not in CODES:
        raise ValueError(f"unknown error code {code}")  # a bug, never input
    error: dict[str, Any] = {
        "code": code,
        "retryable": CODES[code] if retryable is None else retryable,
    }
    if hint is not None and code == "INVALID_REQUEST":
        error["hint"] = dict(hint)
    return {"tool": tool, "request_id": request_id, "outcome": "failure", "error": error}


HINT_SCHEMA: Final[Mapping[str, Any]] = {
    "type": "object",
    "required": ["rule"],
    "properties": {
        "parameter": {"type": "string", "pattern": HINT_PARAMETER_PATTERN},
        "rule": {"enum": list(HINT_RULES)},
    },
    "additionalProperties": False,
}
"""``error.hint``: closed and bounded (a name of at most 63 characters, a rule of a closed
list); never an argument's value, never anything a host returned."""


def _branches(
    tool: str, data: Mapping[str, Any], codes: list[str], *, hinted: bool = True
) -> list[dict[str, Any]]:
    common = {
        "tool": {"const": tool},
        "request_id": {"type": "string", "pattern": REQUEST_ID_PATTERN},
    }
    return [
        {
            "title": "Success result",
            "type": "object",
            "required": ["tool", "request_id", "outcome", "data"],
            "properties": {**common, "outcome": {"const": "success"}, "data": data},
            "additionalProperties": False,
        },
        {
            "title": "Failure result",
            "type": "object",
            "required": ["tool", "request_id", "outcome", "error"],
            "properties": {
                **common,
                "outcome": {"const": "failure"},
                "error": _error_schema(codes, hint=hinted),
            },
            "additionalProperties": False,
        },
    ]


def envelope_schema(
    tool: str,
    *,
    version: int,
    description: str,
    projection: Projection,
    declares_not_found: bool,
) -> dict[str, Any]:
    """The tool's published envelope schema: exactly what the contract promises the agent.

    Self-contained (no ``$ref`` leaves the document, see ``schemas.Projection``):
    `data` holds the `[agent].fields` subschemas and nothing else of the output
    schema. The ``$id`` names the tool and version and ends in a digest of the
    content, so it changes whenever the content does: the TypeScript SDK v1
    caches compiled validators by ``$id``, and a reload that changed a field's
    schema must not be validated with the old one.
    """
    data = {
        "type": "object",
        "properties": dict(projection.properties),
        "required": list(projection.required),
        "additionalProperties": False,
    }
    codes = [c for c in CODES if c != "NOT_FOUND" or declares_not_found]
    title = f"{tool} v{version} result envelope"
    return _published(tool, version, title, description, _branches(tool, data, codes), projection)


def _published(
    tool: str,
    version: int,
    title: str,
    description: str,
    branches: list[dict[str, Any]],
    projection: Projection,
) -> dict[str, Any]:
    """A published envelope schema: its branches, the projection's ``$defs``, and an
    ``$id`` naming the tool and version and ending in a digest of the content."""
    content: dict[str, Any] = {
        "$schema": DRAFT_2020_12,
        "title": title,
        "description": description,
        "type": "object",
        "oneOf": branches,
    }
    if projection.defs:
        content["$defs"] = dict(projection.defs)
    digest = hashlib.sha256(orjson.dumps(content, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return {"$id": f"{ENVELOPE_BASE_URI}{tool}.v{version}.{digest[:16]}.json", **content}


def envelope_guard_schema(published: Mapping[str, Any]) -> dict[str, Any]:
    """The published envelope schema with each `data` field's value schema replaced by `true`.

    Used by ``evaluate.seal`` on every response. It checks everything the
    envelope adds (closed branches, tool, request_id, outcome, the exact set of
    data fields, the error object) without validating the data values a second
    time: each one is the very object stage 8 validated against the subschema
    the published schema holds a copy of (``#/properties/<field>`` of the
    output schema), so re-validating it would only cost time (18% of a 100 KB
    call).
    Tests and ``sshadapter check`` validate against the full published schema.
    """
    success, failure_branch = published["oneOf"]
    data = success["properties"]["data"]
    guarded_data = {**data, "properties": {name: True for name in data["properties"]}}
    guarded_success = {**success, "properties": {**success["properties"], "data": guarded_data}}
    return {"$schema": DRAFT_2020_12, "type": "object", "oneOf": [guarded_success, failure_branch]}


FANOUT_TARGET_PATTERN: Final = "^[a-z][a-z0-9_-]{0,62}$"  # config.TARGET_NAME


def host_entry(tool: str, request_id: str, host: str, line: bytes) -> bytes:
    """One host's entry of a fan-out answer, cut from that host's own sealed envelope line:
    the same bytes with `host` in place of `tool` and `request_id`. A host's data is
    serialized once, when its envelope is sealed, and never parsed again.

    ``line`` is an envelope of this call as ``evaluate.seal_line`` wrote it (its keys in
    ``success``'s and ``failure``'s order); anything else is a bug, never input.
    """
    head = orjson.dumps({"tool": tool, "request_id": request_id})[:-1] + b","
    if not (line.startswith(head) and line.endswith(b"}\n")):
        raise ValueError(f"not an envelope line of {request_id}")
    return b'{"host":' + orjson.dumps(host) + b"," + line[len(head) : -1]


def fanout_line(
    tool: str, request_id: str, counts: Mapping[str, Any], entries: Sequence[bytes]
) -> bytes:
    """A fan-out's success envelope as its response line: ``counts`` is its `data` but
    `results` (``_FANOUT_KEYS`` in order), ``entries`` the hosts shown (``host_entry``)."""
    head = orjson.dumps(success(tool, request_id, {**counts, "results": []}))
    if not head.endswith(_NO_RESULTS):  # `results` is data's last key, data the envelope's
        raise ValueError("fan-out counts out of order")  # a bug
    return head[: -len(_NO_RESULTS)] + b'"results":[' + b",".join(entries) + b"]}}\n"


_NO_RESULTS: Final = b'"results":[]}}'


def fanout_schema(
    tool: str,
    *,
    version: int,
    description: str,
    projection: Projection,
    declares_not_found: bool,
    max_results: int,
) -> dict[str, Any]:
    """The published envelope of an operation with ``targets``: a fan-out answer.

    `data` holds counts and one entry per host (at most ``max_results``), each entry
    that host's own closed envelope without `tool` and `request_id`: the host alias
    and the operation's `[agent].fields`, or a failure with one of the codes. The
    top-level failure branch is for a call on which nothing ran.
    """
    host_data = {
        "type": "object",
        "properties": dict(projection.properties),
        "required": list(projection.required),
        "additionalProperties": False,
    }
    codes = [c for c in CODES if c != "NOT_FOUND" or declares_not_found]
    host = {"type": "string", "pattern": FANOUT_TARGET_PATTERN}
    count = {"type": "integer", "minimum": 0}
    entry = {
        "oneOf": [
            {
                "type": "object",
                "required": ["host", "outcome", "data"],
                "properties": {"host": host, "outcome": {"const": "success"}, "data": host_data},
                "additionalProperties": False,
            },
            {
                "type": "object",
                "required": ["host", "outcome", "error"],
                "properties": {
                    "host": host,
                    "outcome": {"const": "failure"},
                    "error": _error_schema(codes),
                },
                "additionalProperties": False,
            },
        ]
    }
    data = {
        "type": "object",
        "required": list(_FANOUT_KEYS),
        "properties": {
            "target": host,
            "hosts": {"type": "integer", "minimum": 1},
            "succeeded": count,
            "failed": count,
            "omitted": count,
            "failures_by_code": {
                "type": "object",
                "propertyNames": {"enum": codes},
                "additionalProperties": {"type": "integer", "minimum": 1},
            },
            "results": {"type": "array", "maxItems": max_results, "items": entry},
        },
        "additionalProperties": False,
    }
    title = f"{tool} v{version} fan-out result envelope"
    return _published(tool, version, title, description, _branches(tool, data, codes), projection)


_FANOUT_KEYS: Final = (
    "target",
    "hosts",
    "succeeded",
    "failed",
    "omitted",
    "failures_by_code",
    "results",
)


def fanout_guard_schema(published: Mapping[str, Any]) -> dict[str, Any]:
    """``envelope_guard_schema`` for a fan-out: each host's data values are not validated
    again (each is the very object its host's stages validated), the rest is."""
    success, failure_branch = published["oneOf"]
    data = success["properties"]["data"]
    results = data["properties"]["results"]
    host_ok, host_failed = results["items"]["oneOf"]
    host_data = host_ok["properties"]["data"]
    guarded_ok = {
        **host_ok,
        "properties": {
            **host_ok["properties"],
            "data": {**host_data, "properties": {n: True for n in host_data["properties"]}},
        },
    }
    guarded_results = {**results, "items": {"oneOf": [guarded_ok, host_failed]}}
    guarded_data = {**data, "properties": {**data["properties"], "results": guarded_results}}
    guarded_success = {**success, "properties": {**success["properties"], "data": guarded_data}}
    return {"$schema": DRAFT_2020_12, "type": "object", "oneOf": [guarded_success, failure_branch]}


def _error_schema(codes: list[str], *, hint: bool = False) -> dict[str, Any]:
    """The closed `error` object; with ``hint``, the optional ``hint`` (a tool's top-level
    failure: stage 3 refusals), never inside a fan-out's host entries."""
    properties: dict[str, Any] = {"code": {"enum": codes}, "retryable": {"type": "boolean"}}
    if hint:
        properties["hint"] = dict(HINT_SCHEMA)
    return {
        "type": "object",
        "required": ["code", "retryable"],
        "properties": properties,
        "additionalProperties": False,
    }


SYSTEM_ENVELOPE_SCHEMA: Final[Mapping[str, Any]] = {
    "$schema": DRAFT_2020_12,
    "$id": f"{ENVELOPE_BASE_URI}{SYSTEM_TOOL}.json",
    "title": "envelope for a request that names no known tool or cannot be parsed",
    "type": "object",
    "oneOf": _branches(
        SYSTEM_TOOL, {"not": {}}, ["INVALID_REQUEST", "OVERLOADED", "INTERNAL"], hinted=False
    ),
}
