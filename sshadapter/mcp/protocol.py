"""MCP over JSON-RPC 2.0 as ``sshadapter mcp`` speaks it: what a line may be, and the errors.

Pure: no I/O. Sources, cited where each rule is applied: JSON-RPC 2.0 sections
4-5; MCP 2025-11-25 ``basic/index.mdx``, ``basic/lifecycle.mdx`` and
``basic/transports.mdx`` (stdio); MCP 2026-07-28 ``basic/index.mdx`` (``_meta``,
error codes), ``basic/versioning.mdx``, ``server/discover.mdx``,
``basic/patterns/subscriptions.mdx``. The spec calls revisions up to
2025-11-25 *legacy* (an ``initialize`` handshake) and 2026-07-28 *modern* (the
version and client capabilities in every request's ``_meta``); this server is
*dual-era* and decides per request, as versioning.mdx allows ("A dual-era
server MAY serve both eras concurrently on the same endpoint or process").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from sshadapter.strict_json import StrictJSONError, strict_loads

MODERN_VERSIONS: Final = ("2026-07-28",)
LEGACY_VERSIONS: Final = ("2025-11-25", "2025-06-18", "2025-03-26")
"""Newest first. ``initialize`` echoes one of these, else offers the newest (lifecycle.mdx)."""
SUPPORTED_VERSIONS: Final = MODERN_VERSIONS + LEGACY_VERSIONS
STRUCTURED_SINCE: Final = "2025-06-18"
"""``title``, ``outputSchema`` and ``structuredContent`` exist from this revision on."""

PROTOCOL_VERSION_KEY: Final = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY: Final = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY: Final = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY: Final = "io.modelcontextprotocol/subscriptionId"

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
METHOD_NOT_FOUND: Final = -32601
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
UNSUPPORTED_PROTOCOL_VERSION: Final = -32022  # 2026-07-28, reserved MCP range

TASKS_METHODS: Final = frozenset({"tasks/get", "tasks/result", "tasks/list", "tasks/cancel"})
"""2025-11-25 basic/utilities/tasks.mdx: served in that revision only (2026-07-28 removed
tasks from the core protocol)."""
TASKS_VERSION: Final = "2025-11-25"
LEGACY_METHODS: Final = (
    frozenset({"initialize", "ping", "tools/list", "tools/call"}) | TASKS_METHODS
)
MODERN_METHODS: Final = frozenset(
    {"server/discover", "tools/list", "tools/call", "subscriptions/listen"}
)

MAX_LINE_BYTES: Final = 1024 * 1024
"""One message from the client. A ``tools/call`` carries at most the daemon's request
(64 KiB by default) plus its ``_meta``; 1 MiB leaves room for any client's metadata
and still bounds what one line can make the bridge hold."""
MAX_MESSAGE_DEPTH: Final = 32
"""Nesting of a client message: arguments are flat, capabilities a few levels deep."""


class ProtocolError(Exception):
    """A JSON-RPC error response to send. ``id`` is None when the request's id is unknown."""

    def __init__(
        self, code: int, message: str, *, id: Any = None, data: Any = None
    ) -> None:  # `id` is JSON-RPC's name
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id
        self.data = data

    def response(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": self.id, "error": error}


@dataclass(frozen=True, slots=True)
class Message:
    """A request (``id`` set) or a notification (``id`` None) from the client."""

    method: str
    id: str | int | None
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def is_request(self) -> bool:
        return self.id is not None


@dataclass(frozen=True, slots=True)
class Era:
    """The revision one request is served in, and so which fields its answer may carry."""

    version: str
    modern: bool

    @property
    def tasks(self) -> bool:
        """Task-augmented ``tools/call`` and the ``tasks/*`` methods exist in this revision."""
        return self.version == TASKS_VERSION

    @property
    def structured(self) -> bool:
        """``title``, ``outputSchema`` and ``structuredContent`` are part of this revision."""
        return self.modern or self.version >= STRUCTURED_SINCE  # ISO dates order as text


def parse_message(line: bytes) -> Message | None:
    """One line from the client; None for what needs no answer and no action.

    That is a response (the bridge never sends requests) and a notification
    whose params are not an object.

    Raises ProtocolError: -32700 for a line that is not strict JSON (the project's
    parser: duplicate names, lone surrogates and the like are refused), -32600 for
    JSON that is not a JSON-RPC 2.0 request or notification (a batch included:
    2025-06-18 removed batching, and no client of a later revision sends one),
    -32602 for params that are not an object (MCP params are always named).
    """
    try:
        value = strict_loads(line, max_bytes=MAX_LINE_BYTES, max_depth=MAX_MESSAGE_DEPTH)
    except StrictJSONError as exc:
        raise ProtocolError(PARSE_ERROR, f"Parse error: {exc.reason}") from exc
    if isinstance(value, list):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: batches are not supported")
    if not isinstance(value, dict):
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: not a JSON-RPC object")
    has_id = "id" in value
    request_id = value.get("id")
    # MCP basic/index.mdx: a request id is a string or an integer, never null.
    id_ok = isinstance(request_id, str) or (
        isinstance(request_id, int) and not isinstance(request_id, bool)
    )
    answer_to = request_id if has_id and id_ok else None
    if value.get("jsonrpc") != "2.0":
        raise ProtocolError(INVALID_REQUEST, 'Invalid Request: jsonrpc must be "2.0"', id=answer_to)
    if "method" not in value:
        if has_id and ("result" in value or "error" in value):
            return None
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: no method", id=answer_to)
    if has_id and not id_ok:
        raise ProtocolError(INVALID_REQUEST, "Invalid Request: id must be a string or an integer")
    method = value["method"]
    if not isinstance(method, str):
        raise ProtocolError(
            INVALID_REQUEST, "Invalid Request: method must be a string", id=answer_to
        )
    params = value.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        if not has_id:
            return None  # JSON-RPC 4.1: a notification is never answered, not even an error
        raise ProtocolError(INVALID_PARAMS, "Invalid params: not an object", id=answer_to)
    return Message(method, answer_to, params)


def has_modern_envelope(params: Mapping[str, Any]) -> bool:
    """The request claims 2026-07-28: its ``_meta`` names a protocol version.

    That key exists only in modern envelopes and its prefix is reserved, so a
    legacy request never carries it (a bare ``_meta`` may hold ``progressToken``).
    """
    meta = params.get("_meta")
    return isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta


def era_of(message: Message, negotiated: str | None) -> Era:
    """The era to serve ``message`` in, or the error the spec prescribes.

    Modern (2026-07-28 basic/index.mdx "Per-request protocol fields"): a request
    missing a required ``_meta`` key is malformed, -32602; an unsupported
    version is -32022 naming the supported ones (versioning.mdx). Legacy: the
    version ``initialize`` negotiated; before it, a request is refused with
    -32602, which is also what a modern request without its envelope must get.
    """
    meta = message.params.get("_meta")
    if meta is not None and not isinstance(meta, dict):
        raise ProtocolError(
            INVALID_PARAMS, "Invalid params: _meta must be an object", id=message.id
        )
    if has_modern_envelope(message.params):
        assert isinstance(meta, dict)  # by has_modern_envelope
        version = meta[PROTOCOL_VERSION_KEY]
        if CLIENT_CAPABILITIES_KEY not in meta:
            raise ProtocolError(
                INVALID_PARAMS,
                f"Invalid params: _meta is missing {CLIENT_CAPABILITIES_KEY}",
                id=message.id,
            )
        if not isinstance(version, str):
            raise ProtocolError(
                INVALID_PARAMS,
                f"Invalid params: {PROTOCOL_VERSION_KEY} must be a string",
                id=message.id,
            )
        if version not in MODERN_VERSIONS:
            raise ProtocolError(
                UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
                id=message.id,
                data={"supported": list(SUPPORTED_VERSIONS), "requested": version},
            )
        return Era(version, modern=True)
    if negotiated is None:
        raise ProtocolError(
            INVALID_PARAMS,
            "Invalid params: no initialize yet (2025-11-25 and earlier), and _meta carries no "
            f"{PROTOCOL_VERSION_KEY} (2026-07-28)",
            id=message.id,
        )
    return Era(negotiated, modern=False)


def negotiate(requested: Any) -> str:
    """``initialize``: the requested revision if served, else the newest legacy one."""
    return requested if requested in LEGACY_VERSIONS else LEGACY_VERSIONS[0]


def result(request_id: str | int, value: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": value}


def notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


def progress_token(message: Message) -> str | int | None:
    """The request's ``_meta.progressToken`` (2025-11-25 basic/utilities/progress.mdx),
    or None when it asks for no progress; a token that is no string or integer is -32602."""
    meta = message.params.get("_meta")
    if not isinstance(meta, dict) or "progressToken" not in meta:
        return None
    token = meta["progressToken"]
    if isinstance(token, str) or (isinstance(token, int) and not isinstance(token, bool)):
        return token
    raise ProtocolError(
        INVALID_PARAMS,
        "Invalid params: _meta.progressToken must be a string or an integer",
        id=message.id,
    )
