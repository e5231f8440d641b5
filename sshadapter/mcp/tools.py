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
from sshadapter.contract.codes import CODES, SYSTEM_TOOL, TOOL_NAME_PATTERN
from sshadapter.mcp.protocol import SERVER_INFO_KEY, Era

# The failure shape of envelope.failure is written out in bridge_envelope rather than
# imported: sshadapter.contract.envelope pulls in the schema libraries, 130 ms and 17 MB at
# every start of a process each agent session starts. tests/test_mcp_tools.py holds them
# equal. The names and codes come from contract.codes, which imports nothing.
TOOL_NAME: Final = re.compile(TOOL_NAME_PATTERN)

SERVER_INFO: Final = {"name": "sshadapter", "title": "sshadapter", "version": __version__}
INSTRUCTIONS: Final = (
    "Each tool runs one fixed, operator-reviewed command on one fixed host and answers "
    "with a closed envelope: outcome success with the validated data, or outcome failure "
    f"with error.code ({', '.join(CODES)}) and error.retryable. Retry only when "
    "retryable is true."
)
BRIDGE_REQUEST_ID_PREFIX: Final = "mcp."
"""A request_id the bridge made: the daemon never saw the call, no audit record exists.

The daemon's own ids start with ``req.``; both fit the envelope's request_id pattern."""
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

    Any other name (another case, a look-alike character, empty, ``sshadapter``) is an
    unknown tool whatever the daemon's registry holds; the bridge says so without asking.
    """
    return TOOL_NAME.fullmatch(name) is not None and name != SYSTEM_TOOL


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
    fixed command on one fixed, configured host and its answer is closed and
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
    return tool


def list_result(tools: Listing, era: Era) -> dict[str, Any]:
    result: dict[str, Any] = {"tools": [mcp_tool(t, era) for t in tools.tools]}
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
