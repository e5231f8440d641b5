"""The names the agent contract hands out: the error codes and the system tool.

Reference: docs/protocol.md "Error codes". Import-free on purpose: the
envelope, the registry and the MCP bridge share this one definition, and the
bridge (which starts once per agent session) must not load what the rest of
the contract needs (tests/mcp/test_mcp_tools.py pins what it may import).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# code -> retryable by default (docs/protocol.md "Error codes"). UPSTREAM_UNAVAILABLE is not
# retryable for a host key mismatch or an authentication failure.
CODES: Final[Mapping[str, bool]] = {
    "INVALID_REQUEST": False,
    "DENIED": False,
    "NOT_FOUND": False,
    "UPSTREAM_UNAVAILABLE": True,
    "INVALID_RESPONSE": False,
    "OVERLOADED": True,
    "INTERNAL": False,
}
SYSTEM_TOOL: Final = "sshadapter"
"""The `tool` of the daemon's answer to a request naming no known tool: reserved, no
command file may take it."""
RESERVED_TOOL_PREFIX: Final = SYSTEM_TOOL + "_"
"""Names the MCP bridge gives tools of its own (``sshadapter_targets``): no command file may
take one, so a bridge tool never shadows an operation, now or later."""
TOOL_NAME_PATTERN: Final = "[a-z][a-z0-9_]{1,62}"
"""Every name a command file may give a tool (its stem), matched whole."""
TARGET_ARGUMENT: Final = "run_on"
"""The agent's one reserved argument: which host or group a multi-target operation runs on
(not "target": mount_info already has a parameter of that name, and so may others). No
parameter may have this name (the loader refuses it), so it never collides."""
HINT_RULES: Final = (
    "missing",
    "unknown",
    "type",
    "pattern",
    "enum",
    "const",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "choice",
    "hosts",
)
"""What an INVALID_REQUEST's ``error.hint.rule`` may say (docs/protocol.md "Argument hints"):
a parameter keyword of the operation's own schema that the argument broke, or ``missing``,
``unknown`` (a key the schema does not declare), ``choice`` (`run_on` names nothing this
caller may use: one rule for a target that does not exist, is not listed or not granted,
so no existence oracle) and ``hosts`` (`run_on` has more hosts than the operation takes)."""
HINT_PARAMETER_PATTERN: Final = "^[a-z][a-z0-9_]{0,62}$"
"""``error.hint.parameter``: commandfile.PARAM_NAME. An undeclared key the agent sent is named
only when it fits this too; any other is left out, so the hint stays short and plain."""
