"""MCP tasks (2025-11-25 basic/utilities/tasks.mdx, SEP-1686): a tool call the host polls.

A ``tools/call`` with ``params.task`` is answered at once with a CreateTaskResult;
the call runs on, and its result (or its JSON-RPC error) is kept for the task's
TTL, for ``tasks/result`` to return. Ids are ``secrets.token_urlsafe``: nobody
guesses one. A task lives in the bridge process that made it, and the bridge is
one agent session (the host starts it per session, on stdio): no other session
can name, list or read it, and at the session's end every task still running is
cancelled, its pending approval with it.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from sshadapter.mcp.protocol import INTERNAL_ERROR, INVALID_PARAMS, ProtocolError

MIN_TASK_TTL_MS: Final = 1_800_000
"""A task is kept at least this long from its creation: DAEMON_TIMEOUT_SECONDS, the most
a call can take (an approval wait plus any retry budget), so no TTL a host asks for
ends a call it still waits for; a shorter one asked is raised (tasks.mdx: receivers
MAY override the requested ttl, and say the actual one)."""
MAX_TASK_TTL_MS: Final = 3_600_000
"""A result is kept at most an hour after its task began, whatever the host asked."""
POLL_INTERVAL_MS: Final = 1_000
"""The polling interval suggested: a fan-out says where it is twice a second, an approval
takes a person's seconds; one `tasks/get` a second is one local round trip."""
MAX_TASKS: Final = 32
"""Tasks one session keeps (running, or done and within their TTL): the bridge's own
requests in flight (MAX_IN_FLIGHT). Each may hold a result up to the daemon's answer cap;
beyond it a task-augmented call is refused (-32603) until one expires."""
TERMINAL: Final = frozenset({"completed", "failed", "cancelled"})
RELATED_TASK_KEY: Final = "io.modelcontextprotocol/related-task"
TASK_ID_BYTES: Final = 16
"""128 random bits: an id nobody guesses."""


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_ttl(params: Mapping[str, Any], request_id: str | int) -> int:
    """The TTL (ms) of a task-augmented request: the one asked, within the bounds, or
    -32602 for a ``task`` that is no object or a ``ttl`` that is no integer."""
    task = params["task"]
    ttl = task.get("ttl") if isinstance(task, dict) else None
    if not isinstance(task, dict) or not (
        ttl is None or (isinstance(ttl, int) and not isinstance(ttl, bool))
    ):
        raise ProtocolError(
            INVALID_PARAMS,
            "Invalid params: task must be an object whose ttl is an integer",
            id=request_id,
        )
    return min(max(ttl or 0, MIN_TASK_TTL_MS), MAX_TASK_TTL_MS)


@dataclass(eq=False)
class Task:
    """One task: its state as tasks/get says it, and then its result or error."""

    ttl: int
    task_id: str = field(default_factory=lambda: secrets.token_urlsafe(TASK_ID_BYTES))
    status: str = "working"
    message: str | None = None
    """``statusMessage``: a fixed text ("waiting for approval"), never the daemon's bytes."""
    created: str = field(default_factory=_now)
    updated: str = ""
    outcome: Mapping[str, Any] | ProtocolError | None = None
    """The tools/call result, or its error; None until the task ends."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    runner: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.updated = self.created

    def state(self) -> dict[str, Any]:
        """The ``Task`` object (schema.ts): what tasks/get, tasks/list and tasks/cancel say."""
        state: dict[str, Any] = {"taskId": self.task_id, "status": self.status}
        if self.message is not None:
            state["statusMessage"] = self.message
        state.update(
            createdAt=self.created,
            lastUpdatedAt=self.updated,
            ttl=self.ttl,
            pollInterval=POLL_INTERVAL_MS,
        )
        return state

    def says(self, message: str | None) -> None:
        if self.status == "working" and message != self.message:
            self.message = message
            self.updated = _now()

    def end(self, outcome: Mapping[str, Any] | ProtocolError) -> None:
        """The call's answer: completed, or failed for a tool error or a protocol error.
        A cancelled task stays cancelled (tasks.mdx), whatever comes after."""
        if self.status in TERMINAL:
            return
        failed = isinstance(outcome, ProtocolError) or outcome.get("isError") is True
        self.status = "failed" if failed else "completed"
        self.message = None
        self.outcome = outcome
        self.updated = _now()
        self.ended.set()

    def cancel(self) -> None:
        self.status = "cancelled"
        self.message = "The task was cancelled by request."
        self.outcome = ProtocolError(
            INVALID_PARAMS, f"Invalid params: task {self.task_id} was cancelled"
        )
        self.updated = _now()
        self.ended.set()
        if self.runner is not None:
            self.runner.cancel()  # its daemon connection closes: a pending approval ends


class Tasks:
    """The tasks of one session, by id; each forgotten when its TTL has passed."""

    def __init__(self) -> None:
        self._tasks: dict[str, Task] = {}

    def create(self, ttl: int, request_id: str | int) -> Task:
        if len(self._tasks) >= MAX_TASKS:
            raise ProtocolError(
                INTERNAL_ERROR,
                f"Too many tasks: {MAX_TASKS} kept; retry once one expires",
                id=request_id,
            )
        task = Task(ttl)
        self._tasks[task.task_id] = task
        asyncio.get_running_loop().call_later(ttl / 1000, self._expire, task.task_id)
        return task

    def _expire(self, task_id: str) -> None:
        task = self._tasks.pop(task_id, None)
        if task is not None and task.status not in TERMINAL:
            task.cancel()  # unreachable within MIN_TASK_TTL_MS: the bridge gave up before

    def get(self, params: Mapping[str, Any], request_id: str | int) -> Task:
        """The task ``params.taskId`` names, or -32602 for an unknown or malformed id."""
        task_id = params.get("taskId")
        task = self._tasks.get(task_id) if isinstance(task_id, str) else None
        if task is None:
            raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown taskId", id=request_id)
        return task

    def listing(self) -> list[dict[str, Any]]:
        return [task.state() for task in self._tasks.values()]

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """The session ends: nobody can read a result any more, so nothing runs on.
        Returns the runners cancelled, to be awaited."""
        runners = []
        for task in self._tasks.values():
            if task.status not in TERMINAL and task.runner is not None:
                runners.append(task.runner)
                task.cancel()
        return runners
