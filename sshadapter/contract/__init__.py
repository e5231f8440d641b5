"""The contract engine: command files, bytes and a clock in, a verdict out.

Pure: no asyncio, no sockets, no processes. ``registry.load_registry`` reads
the command files and schemas; ``evaluate.evaluate`` judges one run;
``evaluate.seal_line`` makes the envelope. ``codes`` holds the error codes and
the system tool name, import-free, for the MCP bridge. Imports only the root
leaves (errors, strict_json, sections, bounded_read) and
``runners.interface.RunResult``, the seam's value type; tests/test_layers.py
checks what importing each module loads, not only what it names.
"""
