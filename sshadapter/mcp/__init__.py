"""``sshadapter mcp``: the MCP bridge between an agent's stdio and the daemon's socket.

``bridge.run_bridge`` is the entry. ``protocol`` and ``tools`` are pure;
``stdio`` and ``daemon_link`` do the I/O. It imports only the root leaves and
``contract.codes`` (tests/mcp/test_mcp_tools.py pins what it may load: it starts
once per agent session).
"""
