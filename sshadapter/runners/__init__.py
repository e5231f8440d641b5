"""The seam between the pipeline and whatever runs a command.

``interface.Runner`` runs one command on one host and returns bytes, exit
status and timing. Implementations: ``scripted`` (a table of recorded answers: tests) and,
in production, asyncssh.
"""

from sshadapter.runners.interface import Runner, RunResult

__all__ = ["RunResult", "Runner"]
