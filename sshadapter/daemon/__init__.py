"""The long-running process behind the Unix socket (``sshadapter serve``).

``server.assemble`` builds the parts from the configuration, ``server.run_daemon``
runs them; ``service`` reads top to bottom as the stages of a call. Uses the
contract, the runners and the dispatch policies; nothing imports the daemon but
the CLI and the demo.
"""
