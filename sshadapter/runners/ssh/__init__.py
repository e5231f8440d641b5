"""The production runner: asyncssh, one pooled connection per host.

``runner.SshRunner`` is the runner the daemon uses.
"""
