"""The seam between the pipeline and whatever runs a command.

``interface.Runner`` runs one command on one host and returns bytes, exit
status and timing (``interface.RunResult``). Implementations: ``scripted`` (a
table of recorded answers: tests and offline checks) and ``ssh`` (asyncssh, in
production). Imports only the root leaves (errors, config, bounded_read).
"""
