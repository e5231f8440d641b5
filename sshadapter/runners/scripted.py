"""A runner that answers from a table of recorded outputs: tests and offline runs."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from sshadapter.runners.interface import RunResult

Answer = RunResult | Callable[[], Awaitable[RunResult]]
NO_SUCH_COMMAND = RunResult(b"", b"no such command\n", 127)  # what a shell says, exit 127


class ScriptedRunner:
    """Answers each command string from ``table`` (a RunResult, or an async callable for
    slow, changing or failing answers), capped like a real runner."""

    def __init__(self, table: Mapping[str, Answer]) -> None:
        self.table = dict(table)
        self.calls: list[str] = []
        """Every command asked for, in order."""

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        self.calls.append(command)
        answer = self.table.get(command, NO_SUCH_COMMAND)
        if callable(answer):
            answer = await answer()
        return RunResult(
            answer.stdout[: max_stdout + 1],
            answer.stderr[: max_stderr + 1],
            answer.exit_status,
            answer.duration_seconds,
        )

    async def warm(self, host: str, *, evict: bool = False) -> None:
        """Nothing to connect to."""

    async def close(self) -> None:
        """Nothing to release."""
