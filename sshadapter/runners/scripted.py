"""A runner that returns recorded output: offline fixture checks and tests."""

from __future__ import annotations

from collections.abc import Callable

from sshadapter.runners.interface import RunResult


class ScriptedRunner:
    """Answers every command with ``script(host, command)``, capped like a real runner."""

    def __init__(self, script: Callable[[str, str], RunResult]) -> None:
        self._script = script
        self.commands: list[tuple[str, str]] = []

    async def run(
        self, host: str, command: str, *, timeout: float, max_stdout: int, max_stderr: int
    ) -> RunResult:
        self.commands.append((host, command))
        result = self._script(host, command)
        return RunResult(
            result.stdout[: max_stdout + 1],
            result.stderr[: max_stderr + 1],
            result.exit_status,
            result.duration_seconds,
        )
