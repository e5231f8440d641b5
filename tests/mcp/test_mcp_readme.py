"""The MCP host configurations of docs/guide.md parse, have each host's shape, start the bridge."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"<!-- mcp:(?P<name>[a-z-]+) -->\n```(?P<lang>\w+)\n(?P<body>.*?)\n```", re.S)
GUIDE = ROOT / "docs" / "guide.md"
SNIPPETS = {m["name"]: (m["lang"], m["body"]) for m in BLOCK.finditer(GUIDE.read_text())}
INSTALLED = "/usr/local/bin/sshadapter"
ARGS = ["mcp", "--socket", "/run/sshadapter/sshadapter.sock"]
REMOTE_ARGS = ["-T", "-o", "BatchMode=yes", "agent@adapter-host", "sshadapter", "mcp"]
"""`ssh -T agent@adapter-host sshadapter mcp` (tests/mcp/test_mcp_remote.py runs it)."""
# openai/codex codex-rs/core/src/config/types.rs RawMcpServerConfig (deny_unknown_fields).
CODEX_KEYS = {
    "command", "args", "env", "env_vars", "cwd", "startup_timeout_sec", "startup_timeout_ms",
    "tool_timeout_sec", "enabled", "required", "enabled_tools", "disabled_tools",
}  # fmt: skip


def server(name: str) -> tuple[str, list[str], dict[str, Any]]:
    """The command, arguments and whole entry a host would read from snippet ``name``."""
    lang, body = SNIPPETS[name]
    if name == "claude-code":
        words = shlex.split(body)
        assert words[:3] == ["claude", "mcp", "add"]
        split = words.index("--")
        options, command = words[3:split], words[split + 1 :]
        assert options == ["--transport", "stdio", "sshadapter"]  # flags before the name
        return command[0], command[1:], {}
    if lang == "toml":
        entry = tomllib.loads(body)["mcp_servers"]["sshadapter"]
    else:
        top = "servers" if name == "vscode" else "mcpServers"
        document = json.loads(body)
        assert list(document) == [top]
        entry = document[top]["sshadapter"]
    return entry["command"], entry["args"], entry


def test_every_host_has_its_snippet() -> None:
    """Claude Code (command and project file), Claude Desktop, Cursor, Codex CLI, VS Code."""
    assert set(SNIPPETS) == {
        "claude-code",
        "claude-code-project",
        "claude-desktop",
        "cursor",
        "codex",
        "vscode",
    }


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_snippet_has_the_hosts_shape(name: str) -> None:
    """Each parses as its host reads it, and all start the same command."""
    command, args, entry = server(name)
    if name == "claude-desktop":  # no Linux build: always on another machine, over SSH
        assert (command, args) == ("ssh", REMOTE_ARGS)
        return
    assert (command, args) == (INSTALLED, ARGS)
    if name in ("vscode", "claude-code-project"):
        assert entry["type"] == "stdio"
    if name == "codex":
        assert set(entry) <= CODEX_KEYS
        assert entry["tool_timeout_sec"] == 60


def test_the_configured_command_line_starts_the_bridge() -> None:
    """The arguments every snippet gives are the real CLI's: it answers initialize and ping."""
    requests = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"protocolVersion": "2025-11-25"},
        },
        {"jsonrpc": "2.0", "id": 2, "method": "ping"},
    ]
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", *ARGS],
        input="".join(json.dumps(r) + "\n" for r in requests).encode(),
        capture_output=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert answers[0]["result"]["serverInfo"]["name"] == "sshadapter"
    assert answers[1] == {"jsonrpc": "2.0", "id": 2, "result": {}}
