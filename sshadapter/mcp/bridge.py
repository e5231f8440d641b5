"""``sshadapter mcp``: an MCP server on stdio that hands every tool call to the daemon.

The boundary stays where it was. The agent's host starts the bridge as the
agent's own user; the bridge holds no credential, no configuration and no
policy, and talks to the daemon over its Unix socket like any other client,
so the daemon still identifies the caller by ``SO_PEERCRED``, decides, audits
and answers. The bridge translates: the daemon's ``list`` becomes
``tools/list``, ``tools/call`` becomes one ``call``, and the envelope comes
back unchanged as the tool result (``tools``). Both protocol eras are
served (``protocol``); the reference is docs/mcp.md. A call that carries a
``progressToken`` asks the daemon for its progress lines and gets each as a
``notifications/progress`` (hosts done of total; "waiting for approval"). In
2025-11-25 a call may run as a task (``tasks``): answered at once, polled,
its result kept for the task's TTL.

One daemon connection per request in flight (``daemon_link``): the daemon
answers in order per connection, so concurrent calls need their own, and
closing one is how a cancelled call is let go. Connections are opened when
needed, never at start, so the bridge starts before the daemon and carries on
across its restarts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Final, Protocol

import orjson

from sshadapter.contract.codes import SYSTEM_TOOL
from sshadapter.mcp.daemon_link import DaemonLink, DaemonProgress, DaemonUnreachable, OnProgress
from sshadapter.mcp.protocol import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LEGACY_METHODS,
    METHOD_NOT_FOUND,
    MODERN_METHODS,
    SERVER_INFO_KEY,
    SUBSCRIPTION_ID_KEY,
    SUPPORTED_VERSIONS,
    TASKS_METHODS,
    Era,
    Message,
    ProtocolError,
    era_of,
    has_modern_envelope,
    negotiate,
    notification,
    parse_message,
    progress_token,
    result,
)
from sshadapter.mcp.stdio import END, TOO_LONG, Item, StdinLines, claim_stdout, write_all
from sshadapter.mcp.tasks import RELATED_TASK_KEY, TERMINAL, Task, Tasks, task_ttl
from sshadapter.mcp.tool_list import LIST_CHECK_MIN_SECONDS, LIST_POLL_SECONDS, ToolList
from sshadapter.mcp.tools import (
    INSTRUCTIONS,
    LIST_TTL_MS,
    SERVER_INFO,
    TARGETS_TOOL,
    Listing,
    bridge_envelope,
    call_params,
    call_result,
)

log = logging.getLogger("sshadapter.mcp")

MAX_IN_FLIGHT: Final = 32
"""Daemon requests of one bridge at once: the daemon's own default of concurrent calls.
Beyond it a call is answered at once with a bridge-made OVERLOADED envelope."""
EOF_DRAIN_SECONDS: Final = 10.0
"""At end of input, answers still being made get this long (an operation's default
timeout); the daemon finishes and audits any call the bridge stops waiting for."""
CAPABILITIES: Final = {"tools": {"listChanged": True}}
TASKS_CAPABILITY: Final[dict[str, Any]] = {
    "list": {},
    "cancel": {},
    "requests": {"tools": {"call": {}}},
}
"""2025-11-25 tasks.mdx "Server Capabilities": tasks/list, tasks/cancel, task-augmented
tools/call."""


class Lines(Protocol):
    """Where the client's lines come from (StdinLines; a queue in tests)."""

    async def get(self) -> Item: ...

    def stop(self) -> None: ...


class Bridge(ToolList):
    """One MCP client on stdio, served against one daemon socket."""

    def __init__(
        self,
        daemon: DaemonLink,
        send: Callable[[bytes], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        poll_seconds: float = LIST_POLL_SECONDS,
    ) -> None:
        self.daemon = daemon
        self._send_line = send
        self._clock = clock
        self._poll_seconds = poll_seconds
        self.negotiated: str | None = None
        """The legacy revision `initialize` agreed on; None before it."""
        self.initialized = False
        """The legacy client said `notifications/initialized`: notifications may flow."""
        self.in_flight: dict[str | int, asyncio.Task[None]] = {}
        self.subscriptions: dict[str | int, bool] = {}
        """Open `subscriptions/listen` streams (2026-07-28) -> wants toolsListChanged."""
        self.known: Listing | None = None
        """The last `list` fetched: its names tell an unknown tool, its digest a reload."""
        self._last_check = -LIST_CHECK_MIN_SECONDS
        self._checking: asyncio.Task[None] | None = None
        self._check_again = False
        """A call ended while a check was under way: that one may have fetched too early."""
        self._deferred: asyncio.TimerHandle | None = None
        """The check a call asked for within LIST_CHECK_MIN_SECONDS of the last: one, pending."""
        self._closing = False
        self._lines: Lines | None = None
        self.client_gone = False
        self.tasks = Tasks()
        """This session's tasks (2025-11-25): only it can name them."""

    # --- the loop ------------------------------------------------------------------------

    async def serve(self, lines: Lines) -> None:
        """Serve until end of input, then give answers in flight EOF_DRAIN_SECONDS."""
        self._lines = lines
        poller = asyncio.create_task(self._poll())
        try:
            while True:
                item = await lines.get()
                if item is END or self.client_gone:
                    break
                if item is TOO_LONG:
                    self.send(
                        ProtocolError(
                            INVALID_REQUEST, "Invalid Request: line over the size limit"
                        ).response()
                    )
                    continue
                assert isinstance(item, bytes)
                self.receive(item)
        finally:
            poller.cancel()
            await self._drain()
            self.daemon.close()

    async def _drain(self) -> None:
        tasks = list(self.in_flight.values())
        if tasks and not self.client_gone:
            await asyncio.wait(tasks, timeout=EOF_DRAIN_SECONDS)
        tasks += self.tasks.cancel_all()  # nobody can ask for their results any more
        self._closing = True  # no check is started or deferred from here on
        if self._deferred is not None:
            self._deferred.cancel()
        for task in [*tasks, *([self._checking] if self._checking else [])]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for subscription in list(self.subscriptions):  # subscriptions.mdx "Graceful Closure"
            self.send(result(subscription, _closed_stream(subscription)))
        self.subscriptions.clear()

    def send(self, message: Mapping[str, Any]) -> None:
        if self.client_gone:
            return
        try:
            self._send_line(orjson.dumps(message) + b"\n")
        except OSError:  # the client closed our stdout: nobody is listening any more
            self.client_gone = True
            if self._lines is not None:
                self._lines.stop()

    def receive(self, line: bytes) -> None:
        """One line from the client; requests needing the daemon continue in a task."""
        message = None
        try:
            message = parse_message(line)
            if message is None:
                return
            if message.is_request:
                self._request(message)
            else:
                self._notified(message)
        except ProtocolError as exc:
            self.send(exc.response())
        except Exception as exc:  # a bug of the bridge's: the client is answered all the same
            self._internal_error(message.id if message is not None else None, exc)

    def _internal_error(self, request_id: str | int | None, exc: Exception) -> None:
        log.error("internal error on request %r: %s: %s", request_id, type(exc).__name__, exc)
        if request_id is not None:
            self.send(ProtocolError(INTERNAL_ERROR, "Internal error", id=request_id).response())

    # --- requests ------------------------------------------------------------------------

    def _request(self, m: Message) -> None:
        assert m.id is not None
        if m.method == "initialize":
            self.send(result(m.id, self._initialize(m)))
            return
        if m.method == "ping" and not has_modern_envelope(m.params):
            self.send(result(m.id, {}))  # legacy lifecycle.mdx: allowed even before initialize
            return
        if m.method not in LEGACY_METHODS | MODERN_METHODS:
            raise ProtocolError(METHOD_NOT_FOUND, f"Method not found: {m.method}", id=m.id)
        era = era_of(m, self.negotiated)
        if m.method not in (MODERN_METHODS if era.modern else LEGACY_METHODS):
            raise ProtocolError(
                METHOD_NOT_FOUND, f"Method not found in {era.version}: {m.method}", id=m.id
            )
        if m.id in self.in_flight or m.id in self.subscriptions:
            raise ProtocolError(INVALID_REQUEST, "Invalid Request: id already in flight", id=m.id)
        if m.method == "server/discover":
            self.send(result(m.id, _discover()))
        elif m.method == "subscriptions/listen":
            self._listen(m)
        elif m.method in TASKS_METHODS:
            self._task_request(m, era)
        elif m.method == "tools/list":
            cursor = m.params.get("cursor")
            if cursor is not None:  # never handed out: the whole list is one page
                raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown cursor", id=m.id)
            self._start(m, era, self._list(m.id, era))
        else:
            name, arguments = call_params(m)
            if "task" in m.params and era.tasks:
                self._create_task(m, era, name, arguments)
            elif name == TARGETS_TOOL:
                self._start(m, era, self._targets(m.id, era, arguments))
            else:  # tasks.mdx: a revision without tasks ignores the field
                token = progress_token(m)
                self._start(m, era, self._call(m.id, era, name, arguments, token))

    def _initialize(self, m: Message) -> dict[str, Any]:
        requested = m.params.get("protocolVersion")
        if not isinstance(requested, str):
            raise ProtocolError(
                INVALID_PARAMS, "Invalid params: protocolVersion must be a string", id=m.id
            )
        self.negotiated = negotiate(requested)
        tasks = {"tasks": TASKS_CAPABILITY} if Era(self.negotiated, modern=False).tasks else {}
        return {
            "protocolVersion": self.negotiated,
            "capabilities": {**CAPABILITIES, **tasks},
            "serverInfo": SERVER_INFO,
            "instructions": INSTRUCTIONS,
        }

    def _listen(self, m: Message) -> None:
        """subscriptions.mdx: acknowledge first, with the honoured subset; tools only."""
        assert m.id is not None
        wanted = m.params.get("notifications")
        if not isinstance(wanted, dict):
            raise ProtocolError(
                INVALID_PARAMS, "Invalid params: notifications must be an object", id=m.id
            )
        tools = wanted.get("toolsListChanged") is True
        self.subscriptions[m.id] = tools
        honoured = {"toolsListChanged": True} if tools else {}
        self.send(
            notification(
                "notifications/subscriptions/acknowledged",
                {"_meta": {SUBSCRIPTION_ID_KEY: m.id}, "notifications": honoured},
            )
        )

    def _start(self, m: Message, era: Era, work: Coroutine[Any, Any, None]) -> None:
        assert m.id is not None
        if len(self.in_flight) >= MAX_IN_FLIGHT:
            work.close()  # never started
            if m.method != "tools/call":
                raise ProtocolError(INTERNAL_ERROR, "Too many requests in flight", id=m.id)
            name = m.params["name"]
            sealed = bridge_envelope(name, "OVERLOADED", True)
            log.warning("%s %s: %d requests in flight", sealed["request_id"], name, MAX_IN_FLIGHT)
            self.send(result(m.id, call_result(sealed, era)))
            return
        request_id = m.id
        task = asyncio.create_task(self._guarded(request_id, work))
        self.in_flight[request_id] = task

        def done(finished: asyncio.Task[None]) -> None:
            if self.in_flight.get(request_id) is finished:
                del self.in_flight[request_id]

        task.add_done_callback(done)

    async def _guarded(self, request_id: str | int, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception as exc:  # not CancelledError: a cancelled request gets no answer
            self._internal_error(request_id, exc)

    async def _call(
        self,
        request_id: str | int,
        era: Era,
        name: str,
        arguments: Mapping[str, Any],
        token: str | int | None = None,
    ) -> None:
        try:
            answered = await self._called(era, name, arguments, self._progress(token))
        except ProtocolError as exc:
            exc.id = request_id
            self.send(exc.response())
        else:
            self.send(result(request_id, answered))
        self._check_soon()  # caching.mdx: an unknown tool may well mean the list changed

    async def _called(
        self, era: Era, name: str, arguments: Mapping[str, Any], progress: OnProgress | None
    ) -> Mapping[str, Any]:
        """The tools/call result for one call of ``name``, or ProtocolError (no id)."""
        try:
            answer = await self.daemon.ask(
                {"op": "call", "tool": name, "args": arguments}, progress
            )
            sealed = self._envelope(name, answer)
        except DaemonUnreachable as exc:
            sealed = bridge_envelope(name, "INTERNAL", exc.retryable)
            log.warning(
                "%s %s: daemon not reachable at %s (%s): answered INTERNAL, retryable %s; "
                "no daemon record exists for this call",
                sealed["request_id"],
                name,
                self.daemon.socket_path,
                exc.reason,
                str(exc.retryable).lower(),
            )
        return call_result(sealed, era)

    # --- tasks (2025-11-25) --------------------------------------------------------------

    def _create_task(self, m: Message, era: Era, name: str, arguments: Mapping[str, Any]) -> None:
        """A task-augmented tools/call: its task at once (tasks.mdx "Creating Tasks"), the
        call in the background, its result kept for the task's TTL."""
        assert m.id is not None
        if name == TARGETS_TOOL:  # tasks.mdx: no taskSupport listed, so -32601
            raise ProtocolError(METHOD_NOT_FOUND, f"{TARGETS_TOOL} runs as no task", id=m.id)
        token = progress_token(m)
        task = self.tasks.create(task_ttl(m.params, m.id), m.id)
        task.runner = asyncio.create_task(self._run_task(task, era, name, arguments, token))
        self.send(result(m.id, {"task": task.state()}))
        log.info("task %s: %s started", task.task_id, name)

    async def _run_task(
        self,
        task: Task,
        era: Era,
        name: str,
        arguments: Mapping[str, Any],
        token: str | int | None,
    ) -> None:
        try:
            task.end(await self._called(era, name, arguments, self._progress(token, task)))
        except ProtocolError as exc:
            task.end(exc)
        except Exception as exc:  # a bug of the bridge's: the task fails, the session goes on
            log.error("task %s: internal error: %s: %s", task.task_id, type(exc).__name__, exc)
            task.end(ProtocolError(INTERNAL_ERROR, "Internal error"))
        self._check_soon()

    def _task_request(self, m: Message, era: Era) -> None:
        """tasks/get, tasks/list, tasks/cancel at once; tasks/result once the task ends."""
        assert m.id is not None
        if not era.tasks:
            raise ProtocolError(
                METHOD_NOT_FOUND, f"Method not found in {era.version}: {m.method}", id=m.id
            )
        if m.method == "tasks/list":
            if m.params.get("cursor") is not None:  # never handed out: one page holds them all
                raise ProtocolError(INVALID_PARAMS, "Invalid params: unknown cursor", id=m.id)
            self.send(result(m.id, {"tasks": self.tasks.listing()}))
            return
        task = self.tasks.get(m.params, m.id)
        if m.method == "tasks/get":
            self.send(result(m.id, task.state()))
        elif m.method == "tasks/cancel":
            if task.status in TERMINAL:  # tasks.mdx "Task Cancellation" 1
                raise ProtocolError(
                    INVALID_PARAMS, f"Invalid params: task already {task.status}", id=m.id
                )
            task.cancel()
            log.info("task %s cancelled by the client", task.task_id)
            self.send(result(m.id, task.state()))
        else:
            self._start(m, era, self._task_result(m.id, task))

    async def _task_result(self, request_id: str | int, task: Task) -> None:
        """tasks.mdx "Result Retrieval": blocks until the task ends, then exactly what the
        call would have answered, with the related-task key in its ``_meta``."""
        await task.ended.wait()
        outcome = task.outcome
        if isinstance(outcome, ProtocolError):
            error = ProtocolError(outcome.code, outcome.message, id=request_id, data=outcome.data)
            self.send(error.response())
            return
        assert outcome is not None  # by ended
        meta = {**outcome.get("_meta", {}), RELATED_TASK_KEY: {"taskId": task.task_id}}
        self.send(result(request_id, {**outcome, "_meta": meta}))

    def _progress(self, token: str | int | None, task: Task | None = None) -> OnProgress | None:
        """The daemon's progress lines for one call, as ``notifications/progress`` for
        ``token``: counts and a fixed message only, each progress above the last
        (progress.mdx: "The progress value MUST increase with each notification"); a
        task's statusMessage says the wait. None when nobody is told."""
        if token is None and task is None:
            return None
        last = -1

        def said(progress: DaemonProgress) -> None:
            nonlocal last
            message = None if progress.waiting is None else WAITING_MESSAGES[progress.waiting]
            if task is not None:
                task.says(message)
            if token is None or progress.done <= last:
                return
            last = progress.done
            params: dict[str, Any] = {"progressToken": token, "progress": progress.done}
            if progress.total is not None:
                params["total"] = progress.total
            if message is not None:
                params["message"] = message
            self.send(notification("notifications/progress", params))

        return said

    def _envelope(self, name: str, answer: Any) -> Mapping[str, Any]:
        """The daemon's envelope for ``name``, or the error for one it could not be."""
        if not (
            isinstance(answer, dict)
            and isinstance(answer.get("error", {}), dict)
            and answer.get("outcome") in ("success", "failure")
        ):
            raise DaemonUnreachable("response_invalid")
        # The system answer first: its `tool` is a name an agent may send as well.
        if answer.get("tool") != SYSTEM_TOOL:
            if answer.get("tool") == name:
                return answer
            raise DaemonUnreachable("response_invalid")
        code, retryable = answer["error"].get("code"), answer["error"].get("retryable") is True
        if code == "INVALID_REQUEST":  # server/tools.mdx: an unknown tool is a protocol error
            known = self.known is not None and name in self.known.names
            raise ProtocolError(
                INVALID_PARAMS,
                f"Invalid request for tool {name}: refused by the daemon"
                if known
                else f"Unknown tool: {name}",
                data={"request_id": answer.get("request_id")},
            )
        # The daemon refused the connection itself (OVERLOADED at max_connections): it kept
        # no record of the call, so the answer is the bridge's, under the tool's name.
        return bridge_envelope(name, code if code in PASSED_ON_CODES else "INTERNAL", retryable)

    def _unreachable_error(self, request_id: str | int, exc: DaemonUnreachable) -> dict[str, Any]:
        log.warning("daemon not reachable at %s (%s)", self.daemon.socket_path, exc.reason)
        return ProtocolError(
            INTERNAL_ERROR,
            f"sshadapter daemon not reachable ({exc.reason})",
            id=request_id,
            data={"reason": exc.reason, "retryable": exc.retryable},
        ).response()

    # --- notifications -------------------------------------------------------------------

    def _notified(self, m: Message) -> None:
        if m.method == "notifications/initialized":
            self.initialized = True
        elif m.method == "notifications/cancelled":
            target = m.params.get("requestId")
            if not isinstance(target, str | int) or isinstance(target, bool):
                return  # cancellation.mdx: a malformed cancellation is ignored
            task = self.in_flight.pop(target, None)
            if task is not None:  # no answer for it (cancellation.mdx); the daemon finishes it
                task.cancel()
                log.info("request %r cancelled by the client", target)
            self.subscriptions.pop(target, None)
        # Any other notification needs nothing from a tools-only server.


PASSED_ON_CODES: Final = frozenset({"OVERLOADED", "INTERNAL"})
"""Codes of a daemon's own refusal that the bridge passes on under the tool's name."""
WAITING_MESSAGES: Final = {"approval": "waiting for approval"}
"""A progress notification's message for each wait a daemon progress line names."""


def _discover() -> dict[str, Any]:
    """server/discover.mdx: every version served (both eras), capabilities, identity."""
    return {
        "resultType": "complete",
        "supportedVersions": list(SUPPORTED_VERSIONS),
        "capabilities": CAPABILITIES,
        "instructions": INSTRUCTIONS,
        "ttlMs": LIST_TTL_MS,
        "cacheScope": "public",
        "_meta": {SERVER_INFO_KEY: SERVER_INFO},
    }


def _closed_stream(subscription: str | int) -> dict[str, Any]:
    return {
        "resultType": "complete",
        "_meta": {SUBSCRIPTION_ID_KEY: subscription, SERVER_INFO_KEY: SERVER_INFO},
    }


async def run_bridge(socket_path: Path) -> int:
    """`sshadapter mcp`: serve stdin/stdout until the client closes stdin."""
    protocol_fd = claim_stdout()
    lines = StdinLines(asyncio.get_running_loop())
    bridge = Bridge(DaemonLink(socket_path), lambda data: write_all(protocol_fd, data))
    lines.start()
    try:
        await bridge.serve(lines)
    finally:
        with contextlib.suppress(OSError):
            os.close(protocol_fd)
    return 0
