"""An agent host on another machine: `ssh -T agent@adapter-host sshadapter mcp` as the MCP
command, the agent account's key forced to the bridge (docs/guide.md "From an agent host on
another machine"), driven by the official Python SDK's stdio client through a real sshd."""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import anyio
import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters
from mcp_harness import ROOT, Daemon, write_daemon_files
from sshd import Sshd, generate_key, running_sshd

INSTALLED_COMMAND: Final = "/usr/local/bin/sshadapter mcp"
"""The forced command as the guide's authorized_keys line gives it."""
CALL_TIMEOUT_SECONDS: Final = 30.0  # one answer over SSH; a call takes milliseconds


def readme_key_options() -> str:
    """The options of the guide's authorized_keys line (everything before the key type)."""
    block = re.search(
        r"<!-- ssh:authorized-keys -->\n```text\n(?P<line>[^\n]+)\n```",
        (ROOT / "docs" / "guide.md").read_text(),
    )
    assert block is not None
    options, _, key = block["line"].partition(" ssh-ed25519 ")
    assert key and options == f'restrict,command="{INSTALLED_COMMAND}"', options
    return options


PYTHONS: Final = (os.path.realpath(sys.executable), "/usr/bin/python3")
"""This interpreter where the agent account may run it (not under a 0700 /root), else the
system's: the copied extensions (orjson) load in the same minor version."""
_IMPORTED: Final = """
import sys
import sshadapter.cli, sshadapter.mcp.bridge, sshadapter.mcp.stdio
sshadapter.cli._parser().parse_args(["mcp"])
for name, module in list(sys.modules.items()):
    if "." not in name and getattr(module, "__file__", None):
        print(module.__file__)
"""


def install_for_agent(directory: Path, agent: pwd.struct_passwd) -> Path:
    """A `sshadapter` shim in ``directory`` the agent account can run, as if installed for
    every user: this checkout and its interpreter may be root's alone (under /root), so it
    runs a copy of the packages the bridge imports."""
    found = subprocess.run(
        [sys.executable, "-c", _IMPORTED], capture_output=True, text=True, check=True, cwd=ROOT
    )
    lib = directory / "lib"
    lib.mkdir()
    for path in map(Path, found.stdout.split()):
        if "site-packages" in path.parts or path.is_relative_to(ROOT):
            if path.name == "__init__.py":
                shutil.copytree(path.parent, lib / path.parent.name, ignore=_NO_CACHE)
            else:
                shutil.copy(path, lib)
    shim = directory / "sshadapter"
    for python in PYTHONS:
        shim.write_text(f'#!/bin/sh\nPYTHONPATH="{lib}" exec "{python}" -m sshadapter.cli "$@"\n')
        shim.chmod(0o755)
        probe = subprocess.run(
            [str(shim), "--version"],
            cwd=directory,
            user=agent.pw_uid,
            group=agent.pw_gid,
            extra_groups=[],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0:
            return shim
    raise AssertionError(f"no Python the agent account can run: {probe.stderr}")


_NO_CACHE: Final = shutil.ignore_patterns("__pycache__")


@pytest.fixture(scope="module")
def adapter_host() -> Iterator[tuple[Sshd, Daemon, Path]]:
    """The test sshd (the adapter host's and the target's), the daemon, and the agent's key
    authorized with the guide's options; the socket is the agent account's group's."""
    with running_sshd() as sshd:
        workdir = Path(tempfile.mkdtemp(prefix="sshadapter-remote-"))
        try:
            workdir.chmod(0o755)  # the agent account reaches the socket inside it
            agent = pwd.getpwnam(sshd.user)
            config = write_daemon_files(workdir, sshd)
            for path in [config, *(workdir / "commands").glob("*.toml")]:
                text = path.read_text().replace(
                    f"uids = [{os.getuid()}]", f"uids = [{os.getuid()}, {agent.pw_uid}]"
                )
                path.write_text(text)
            group = grp.getgrgid(agent.pw_gid).gr_name
            config.write_text(
                config.read_text().replace(
                    "[server]\n", f'[server]\nsocket_group = "{group}"\nsocket_mode = "0660"\n'
                )
            )
            daemon = Daemon(workdir, config)
            daemon.start()
            try:
                (workdir / "agent").mkdir(mode=0o755)
                agent_key = workdir / "agent_key"
                generate_key(agent_key, "agent-host-key")
                shim = install_for_agent(workdir / "agent", agent)
                bridge = f"{shim} mcp --socket {daemon.socket}"
                options = readme_key_options().replace(INSTALLED_COMMAND, bridge)
                assert options != readme_key_options()
                sshd.authorize(more={agent_key: options})  # the daemon's own key stays plain
                yield sshd, daemon, agent_key
            finally:
                daemon.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def ssh_argv(sshd: Sshd, key: Path) -> list[str]:
    """The guide's `ssh -T -o BatchMode=yes agent@adapter-host sshadapter mcp`, with the
    test sshd's port, key and known_hosts (no user ssh_config read)."""
    return [
        "ssh",
        "-F",
        "/dev/null",
        "-T",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={sshd.known_hosts}",
        "-i",
        str(key),
        "-p",
        str(sshd.port),
        f"{sshd.user}@{sshd.address}",
        "sshadapter",
        "mcp",
    ]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
def test_an_agent_host_on_another_machine_uses_the_bridge_over_ssh(
    adapter_host: tuple[Sshd, Daemon, Path], mode: str
) -> None:
    """List and call over `ssh -T`: the bridge runs as the agent account, audited as it."""
    sshd, daemon, key = adapter_host
    argv = ssh_argv(sshd, key)

    async def main() -> str:
        async with Client(
            StdioServerParameters(command=argv[0], args=argv[1:]),
            mode=mode,
            read_timeout_seconds=CALL_TIMEOUT_SECONDS,
        ) as client:
            tools = [t.name for t in (await client.list_tools()).tools]
            assert "disk_usage" in tools and "load_average" in tools
            result = await client.call_tool("load_average", {})
            assert isinstance(result.content[0], types.TextContent)
            envelope = json.loads(result.content[0].text)
            assert result.is_error is False and envelope["outcome"] == "success", envelope
            assert result.structured_content == envelope
            invalid = await client.call_tool("disk_usage", {"path": "../etc"})
            assert invalid.is_error is True
            assert invalid.structured_content is not None
            assert invalid.structured_content["error"]["hint"] == {
                "parameter": "path",
                "rule": "pattern",
            }
            request_id: str = envelope["request_id"]
            return request_id

    request_id = anyio.run(main)
    record = daemon.wait_for_result("load_average", request_id=request_id)
    assert record["caller"]["uid"] == pwd.getpwnam(sshd.user).pw_uid  # the agent account


def test_the_forced_command_ignores_what_the_client_asks_for(
    adapter_host: tuple[Sshd, Daemon, Path],
) -> None:
    """Another command asked for over the agent's key still gets the bridge: JSON-RPC."""
    sshd, _, key = adapter_host
    argv = [*ssh_argv(sshd, key)[:-2], "id"]
    ping = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + "\n"
    done = subprocess.run(argv, input=ping.encode(), capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"jsonrpc": "2.0", "id": 1, "result": {}}
