"""The long-running process behind the Unix socket (``sshadapter serve``).

``assemble.assemble`` builds the parts from the configuration,
``assemble.run_daemon`` runs them; ``server`` is the socket's lifecycle and
``service`` reads top to bottom as the stages of a call. Uses the
contract, the runners, the dispatch policies, the inventory and the audit trail;
nothing imports the daemon but the CLI and the demo.
"""
