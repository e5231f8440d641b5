"""The daemon's tools as MCP tools, and its envelopes as MCP tool results.

Pure: no I/O. What the daemon decides is passed on unchanged: the closed
parameter schema is the ``inputSchema``, the published envelope schema the
``outputSchema``, and the envelope itself the ``structuredContent``; the
bridge only chooses the MCP wrapping, per protocol revision (see docs/mcp.md).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from sshadapter import __version__
from sshadapter.contract.codes import (
    CODES,
    RESERVED_TOOL_PREFIX,
    SYSTEM_TOOL,
    TARGET_ARGUMENT,
    TOOL_NAME_PATTERN,
)
from sshadapter.mcp.protocol import INVALID_PARAMS, SERVER_INFO_KEY, Era, Message, ProtocolError

# The failure shape of envelope.failure is written out in bridge_envelope rather than
# imported: sshadapter.contract.envelope pulls in the schema libraries, 130 ms and 17 MB at
# every start of a process each agent session starts. tests/mcp/test_mcp_tools.py holds them
# equal. The names and codes come from contract.codes, which imports nothing.
TOOL_NAME: Final = re.compile(TOOL_NAME_PATTERN)

TARGETS_TOOL: Final = RESERVED_TOOL_PREFIX + "targets"
"""The bridge's own tool: a page of a tool's `run_on` choices (the daemon's `targets`).

Its name starts with the prefix the registry refuses to command files, so no operation
can take it."""
SERVER_INFO: Final = {"name": "sshadapter", "title": "sshadapter", "version": __version__}
INSTRUCTIONS: Final = (
    "Each tool runs one fixed, operator-reviewed command on a configured host and answers "
    "with a closed envelope: outcome success with the validated data, or outcome failure "
    f"with error.code ({', '.join(CODES)}) and error.retryable. Retry only when "
    f"retryable is true. A tool with a `{TARGET_ARGUMENT}` argument runs on the host or "
    "group it names (the choices are in its schema, or listed by "
    f"{TARGETS_TOOL}): "
    "its data.results holds each host's own outcome, failures first. An INVALID_REQUEST may "
    "carry error.hint: the parameter and the rule of the tool's input schema the arguments "
    "broke (missing, unknown, type, pattern, ...); correct that argument and call again."
)
BRIDGE_REQUEST_ID_PREFIX: Final = "mcp."
"""A request_id the bridge made: the daemon never saw the call, no audit record exists.

The daemon's own ids start with ``req.``; both fit the envelope's request_id pattern."""
REQUEST_ID_PATTERN: Final = "^[A-Za-z0-9][A-Za-z0-9_.]{7,63}$"  # contract.envelope's
TARGET_NAME_PATTERN: Final = "^[a-z][a-z0-9_-]{0,62}$"  # config.TARGET_NAME
TARGETS_CODES: Final = ("INVALID_REQUEST", "OVERLOADED", "INTERNAL")
"""What a `targets` request can fail with: the daemon's system answer's codes."""
TARGETS_ARGUMENTS: Final = frozenset({"tool", "after"})
LIST_TTL_MS: Final = 0
"""2026-07-28 caching hint: the list depends on the caller and on the daemon's current
registry, and fetching it again costs one local round trip; nothing to gain from a TTL."""


class DaemonAnswerError(Exception):
    """The daemon answered something that is not what its protocol promises."""


@dataclass(frozen=True)
class Listing:
    """The daemon's `list` answer for this caller."""

    tools: tuple[Mapping[str, Any], ...]
    digest: str | None
    """Changes when a reload changes a command file or a published schema."""

    @property
    def names(self) -> frozenset[str]:
        return frozenset(t["name"] for t in self.tools)

    @property
    def paged(self) -> tuple[str, ...]:
        """Tools whose `run_on` has too many choices for an enum: TARGETS_TOOL lists them."""
        return tuple(t["name"] for t in self.tools if _paged(t))


def _paged(entry: Mapping[str, Any]) -> bool:
    properties = entry["input_schema"].get("properties")
    run_on = properties.get(TARGET_ARGUMENT) if isinstance(properties, dict) else None
    return isinstance(run_on, dict) and "enum" not in run_on


def listing(answer: Any) -> Listing:
    """The daemon's `list` answer, checked for the fields the translation reads."""
    if not isinstance(answer, dict) or not isinstance(answer.get("tools"), list):
        raise DaemonAnswerError("list answer has no tools")
    for entry in answer["tools"]:
        if not (
            isinstance(entry, dict)
            and isinstance(entry.get("name"), str)
            and isinstance(entry.get("description"), str)
            and isinstance(entry.get("input_schema"), dict)
            and isinstance(entry.get("output_schema"), dict)
        ):
            raise DaemonAnswerError("list entry lacks name, description or a schema")
    digest = answer.get("digest")
    tools = sorted(answer["tools"], key=lambda t: t["name"])  # 2026: deterministic order
    return Listing(tuple(tools), digest if isinstance(digest, str) else None)


def can_name_tool(name: str) -> bool:
    """Whether the daemon could have a tool of this name: TOOL_NAME, and not the reserved one.

    Any other name (another case, a look-alike character, empty, ``sshadapter``, a name
    starting ``sshadapter_``, which the registry refuses too) is an unknown tool whatever the
    daemon's registry holds; the bridge says so without asking. Its own TARGETS_TOOL is
    told apart before this.
    """
    return (
        TOOL_NAME.fullmatch(name) is not None
        and name != SYSTEM_TOOL
        and not name.startswith(RESERVED_TOOL_PREFIX)
    )


def title(name: str) -> str:
    """Display name from the tool name: ``job_run_status`` -> ``Job run status``."""
    return name.replace("_", " ").capitalize()


def mcp_tool(entry: Mapping[str, Any], era: Era) -> dict[str, Any]:
    """One daemon tool as an MCP ``Tool`` (2025-11-25 ``schema.ts`` Tool; 2026-07-28 same).

    Annotations (all hints, server/tools.mdx): ``readOnlyHint`` is the operator's
    ``read_only``; ``destructiveHint`` is its opposite, since a command that may
    change the host may also destroy something and only the operator could say
    otherwise (the spec's default is true, too); ``idempotentHint`` is
    ``idempotent``; ``openWorldHint`` is false, since every operation runs one
    fixed command on fixed, configured hosts and its answer is closed and
    validated, the "closed domain" of the 2026-03-16 annotations post.
    """
    read_only = entry.get("read_only") is True
    name = entry["name"]
    tool: dict[str, Any] = {"name": name}
    if era.structured:
        tool["title"] = title(name)
    tool["description"] = entry["description"]
    # No $schema: 2020-12 is MCP's default dialect, and Gemini-backed hosts refuse the key.
    tool["inputSchema"] = {k: v for k, v in entry["input_schema"].items() if k != "$schema"}
    if era.structured:
        tool["outputSchema"] = entry["output_schema"]
    tool["annotations"] = {
        "title": title(name),
        "readOnlyHint": read_only,
        "destructiveHint": not read_only,
        "idempotentHint": entry.get("idempotent") is True,
        "openWorldHint": False,
    }
    if era.tasks:  # any daemon tool may outlast a host's request timeout (docs/mcp.md "Tasks")
        tool["execution"] = {"taskSupport": "optional"}
    return tool


def targets_tool(paged: tuple[str, ...], era: Era) -> dict[str, Any]:
    """TARGETS_TOOL as an MCP ``Tool``: a page of `run_on` choices for one of ``paged``.

    Published only while some tool's choices are too many for an enum (docs/mcp.md):
    ``tool`` is then an enum of exactly those. Its output is the page, or a failure in
    the envelope's closed vocabulary (tool TARGETS_TOOL), both in one ``oneOf``.
    """
    tool: dict[str, Any] = {"name": TARGETS_TOOL}
    if era.structured:
        tool["title"] = TARGETS_TITLE
    tool["description"] = (
        f"Lists the names the `{TARGET_ARGUMENT}` argument of a tool accepts, when they are "
        f"too many for its input schema to list ({', '.join(paged)}): one page per call, "
        "sorted. Pass `next` back as `after` for the following page; `next` is null on the "
        "last page."
    )
    tool["inputSchema"] = {
        "type": "object",
        "properties": {
            "tool": {"type": "string", "enum": list(paged), "description": "The tool."},
            "after": {
                "type": "string",
                "pattern": TARGET_NAME_PATTERN,
                "description": "The previous page's `next`; absent for the first page.",
            },
        },
        "required": ["tool"],
        "additionalProperties": False,
    }
    if era.structured:
        tool["outputSchema"] = targets_output_schema(paged)
    tool["annotations"] = {
        "title": TARGETS_TITLE,
        "readOnlyHint": True,
        "destructiveHint": False,
        "idempotentHint": True,
        "openWorldHint": False,
    }
    return tool


TARGETS_TITLE: Final = "Targets of a tool"


def targets_output_schema(paged: tuple[str, ...]) -> dict[str, Any]:
    """A page for one of ``paged``, or a failure envelope of TARGETS_TOOL. No ``$id``:
    the TypeScript SDK v1 caches validators by ``$id``, and ``paged`` changes on reloads."""
    target = {"type": "string", "pattern": TARGET_NAME_PATTERN}
    return {
        "type": "object",
        "oneOf": [
            {
                "title": "Page",
                "type": "object",
                "required": ["tool", "targets", "next"],
                "properties": {
                    "tool": {"enum": list(paged)},
                    "targets": {"type": "array", "items": target},
                    "next": {"anyOf": [target, {"type": "null"}]},
                },
                "additionalProperties": False,
            },
            {
                "title": "Failure result",
                "type": "object",
                "required": ["tool", "request_id", "outcome", "error"],
                "properties": {
                    "tool": {"const": TARGETS_TOOL},
                    "request_id": {"type": "string", "pattern": REQUEST_ID_PATTERN},
                    "outcome": {"const": "failure"},
                    "error": {
                        "type": "object",
                        "required": ["code", "retryable"],
                        "properties": {
                            "code": {"enum": list(TARGETS_CODES)},
                            "retryable": {"type": "boolean"},
                        },
                        "additionalProperties": False,
                    },
                },
                "additionalProperties": False,
            },
        ],
    }


def targets_page(answer: Any, tool: str) -> dict[str, Any] | None:
    """The daemon's `targets` answer for ``tool`` when it is a page, else None."""
    if not (isinstance(answer, dict) and answer.keys() == {"tool", "targets", "next"}):
        return None
    targets, following = answer["targets"], answer["next"]
    if (
        answer["tool"] != tool
        or not isinstance(targets, list)
        or not all(isinstance(t, str) for t in targets)
        or not (following is None or isinstance(following, str))
    ):
        return None
    return answer


def targets_failure(answer: Any) -> dict[str, Any] | None:
    """The daemon's system refusal of a `targets` request, as TARGETS_TOOL's failure."""
    if not (
        isinstance(answer, dict)
        and answer.get("tool") == SYSTEM_TOOL
        and answer.get("outcome") == "failure"
        and isinstance(answer.get("error"), dict)
        and answer["error"].get("code") in TARGETS_CODES
        and isinstance(answer.get("request_id"), str)
        and re.fullmatch(REQUEST_ID_PATTERN, answer["request_id"])
    ):
        return None
    error = answer["error"]
    return {
        "tool": TARGETS_TOOL,
        "request_id": answer["request_id"],
        "outcome": "failure",
        "error": {"code": error["code"], "retryable": error.get("retryable") is True},
    }


def list_result(tools: Listing, era: Era) -> dict[str, Any]:
    listed = [mcp_tool(t, era) for t in tools.tools]
    if tools.paged:
        listed.append(targets_tool(tools.paged, era))
        listed.sort(key=lambda t: t["name"])
    result: dict[str, Any] = {"tools": listed}
    if era.modern:
        # CacheableResult: the list depends on the caller (the daemon's `allow`).
        result.update(ttlMs=LIST_TTL_MS, cacheScope="private")
    return modern_fields(result, era)


def call_result(sealed: Mapping[str, Any], era: Era) -> dict[str, Any]:
    """An envelope as a ``CallToolResult``: the same compact JSON in both fields.

    Hosts differ in which field reaches the model (Claude Code shows the text of
    an error, Codex prefers ``structuredContent``), so both carry exactly the
    envelope. ``isError`` is true exactly for ``outcome: failure``: failures
    originate in the tool, so they are tool errors, not protocol errors
    (server/tools.mdx "Error Handling"; SEP-1303 for invalid arguments).
    """
    text = orjson.dumps(sealed).decode()
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
    if era.structured:
        result["structuredContent"] = sealed
    result["isError"] = sealed.get("outcome") == "failure"
    return modern_fields(result, era)


def modern_fields(result: dict[str, Any], era: Era) -> dict[str, Any]:
    """2026-07-28 results carry ``resultType`` and SHOULD carry serverInfo in ``_meta``."""
    if era.modern:
        result["resultType"] = "complete"
        result["_meta"] = {SERVER_INFO_KEY: SERVER_INFO}
    return result


def bridge_envelope(tool: str, code: str, retryable: bool) -> dict[str, Any]:
    """A failure the daemon never saw (it could not be reached): the same closed vocabulary.

    Marked by its request_id prefix; the bridge logs it on stderr with the reason.
    """
    request_id = BRIDGE_REQUEST_ID_PREFIX + secrets.token_hex(10)
    return {
        "tool": tool,
        "request_id": request_id,
        "outcome": "failure",
        "error": {"code": code, "retryable": retryable},
    }


def call_params(m: Message) -> tuple[str, Mapping[str, Any]]:
    """A tools/call's tool name and arguments, or ProtocolError (INVALID_PARAMS)."""
    name = m.params.get("name")
    if not isinstance(name, str):
        raise ProtocolError(INVALID_PARAMS, "Invalid params: name must be a string", id=m.id)
    if name != TARGETS_TOOL and not can_name_tool(
        name
    ):  # no list can hold it: never a tool result, even when
        # the daemon is down or refuses the connection (server/tools.mdx: unknown tool)
        raise ProtocolError(INVALID_PARAMS, f"Unknown tool: {name}", id=m.id)
    arguments = m.params.get("arguments")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise ProtocolError(INVALID_PARAMS, "Invalid params: arguments must be an object", id=m.id)
    return name, arguments
