"""The daemon's tool list as one MCP session knows it: `tools/list`, the targets tool,
and `list_changed` (docs/mcp.md).

``ToolList`` is the part of ``bridge.Bridge`` that fetches the daemon's `list`,
answers `tools/list` and the targets tool from it, and compares its digest after
calls and on a poll, telling the client when a reload changed it. The session's
state it reads (the daemon link, what the client negotiated, its subscriptions)
is the bridge's own, declared here.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from sshadapter.mcp.daemon_link import DaemonLink, DaemonUnreachable
from sshadapter.mcp.protocol import (
    INVALID_PARAMS,
    SUBSCRIPTION_ID_KEY,
    Era,
    ProtocolError,
    notification,
    result,
)
from sshadapter.mcp.tools import (
    TARGET_NAME_PATTERN,
    TARGETS_ARGUMENTS,
    TARGETS_TOOL,
    DaemonAnswerError,
    Listing,
    bridge_envelope,
    call_result,
    list_result,
    listing,
    targets_failure,
    targets_page,
)

log = logging.getLogger("sshadapter.mcp")

LIST_CHECK_MIN_SECONDS: Final = 1.0
"""After a call, the daemon's `list` digest is compared again at most this often."""
LIST_POLL_SECONDS: Final = 30.0
"""Between calls, the digest is compared this often while a client can be told."""
TARGET_NAME: Final = re.compile(TARGET_NAME_PATTERN)


class ToolList:
    """tools/list, the targets tool and list_changed, for ``bridge.Bridge``."""

    daemon: DaemonLink
    negotiated: str | None
    initialized: bool
    subscriptions: dict[str | int, bool]
    known: Listing | None
    _clock: Callable[[], float]
    _poll_seconds: float
    _last_check: float
    _checking: asyncio.Task[None] | None
    _check_again: bool
    _deferred: asyncio.TimerHandle | None
    _closing: bool
    send: Callable[[Mapping[str, Any]], None]
    _unreachable_error: Callable[[str | int, DaemonUnreachable], dict[str, Any]]

    async def _list(self, request_id: str | int, era: Era) -> None:
        try:
            tools = await self._fetch(notify=False)  # the client is fetching it already
        except DaemonUnreachable as exc:
            self.send(self._unreachable_error(request_id, exc))
            return
        self.send(result(request_id, list_result(tools, era)))

    async def _targets(self, request_id: str | int, era: Era, arguments: Mapping[str, Any]) -> None:
        """TARGETS_TOOL: one page of the daemon's `targets` answer, or a failure envelope.

        Known only while the last list published it (some tool without a `run_on` enum);
        ``tool`` must be one of those tools, as its input schema says.
        """
        try:
            paged = (self.known or await self._fetch(notify=False)).paged
            if not paged:  # not published: as unknown as any unlisted name
                self.send(
                    ProtocolError(
                        INVALID_PARAMS, f"Unknown tool: {TARGETS_TOOL}", id=request_id
                    ).response()
                )
                return
            tool, after = arguments.get("tool"), arguments.get("after")
            if (
                arguments.keys() - TARGETS_ARGUMENTS
                or tool not in paged
                or not (after is None or (isinstance(after, str) and TARGET_NAME.fullmatch(after)))
            ):
                sealed: Mapping[str, Any] = bridge_envelope(TARGETS_TOOL, "INVALID_REQUEST", False)
                log.info(
                    "%s %s: arguments outside its input schema", sealed["request_id"], TARGETS_TOOL
                )
            else:
                ask = {"op": "targets", "tool": tool, **({"after": after} if after else {})}
                answer = await self.daemon.ask(ask)
                found = targets_page(answer, str(tool)) or targets_failure(answer)
                if found is None:
                    raise DaemonUnreachable("response_invalid")
                sealed = found
        except DaemonUnreachable as exc:
            sealed = bridge_envelope(TARGETS_TOOL, "INTERNAL", exc.retryable)
            log.warning(
                "%s %s: daemon not reachable at %s (%s): answered INTERNAL, retryable %s",
                sealed["request_id"],
                TARGETS_TOOL,
                self.daemon.socket_path,
                exc.reason,
                str(exc.retryable).lower(),
            )
        self.send(result(request_id, call_result(sealed, era)))

    # --- list_changed --------------------------------------------------------------------

    async def _fetch(self, *, notify: bool) -> Listing:
        self._last_check = self._clock()
        answer = await self.daemon.ask({"op": "list"})
        try:
            tools = listing(answer)
        except DaemonAnswerError as exc:
            raise DaemonUnreachable("response_invalid") from exc
        previous, self.known = self.known, tools
        if notify and previous is not None and tools.digest != previous.digest:
            self._list_changed()
        return tools

    def _listening(self) -> bool:
        return (self.negotiated is not None and self.initialized) or any(
            self.subscriptions.values()
        )

    def _check_soon(self) -> None:
        """After a call: compare the digest in the background, at most once a LIST_CHECK_MIN.

        A check the limit holds back is not dropped but deferred until the limit allows
        (one timer, however many calls ask), and a call that ends while a check is under
        way gets another one after it: a reload just after a call is announced within
        about LIST_CHECK_MIN_SECONDS, not at the next poll.
        """
        if self._closing or not self._listening():
            return
        if self._checking is not None:
            self._check_again = True
            return
        wait = self._last_check + LIST_CHECK_MIN_SECONDS - self._clock()
        if wait <= 0:
            self._checking = asyncio.create_task(self._check())
        elif self._deferred is None:
            self._deferred = asyncio.get_running_loop().call_later(wait, self._deferred_check)

    def _deferred_check(self) -> None:
        self._deferred = None
        self._check_soon()

    async def _check(self) -> None:
        try:
            await self._fetch(notify=True)
        except DaemonUnreachable:
            pass  # the next call says so; a poll is no place to report it
        finally:
            self._checking = None
            if self._check_again:
                self._check_again = False
                self._check_soon()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_seconds)
            if self._listening() and self._checking is None:
                self._checking = asyncio.create_task(self._check())

    def _list_changed(self) -> None:
        """Tell the client where its era allows: legacy after initialized, modern on a stream."""
        method = "notifications/tools/list_changed"
        if self.negotiated is not None and self.initialized:
            self.send({"jsonrpc": "2.0", "method": method})
        for subscription, tools in self.subscriptions.items():
            if tools:
                self.send(notification(method, {"_meta": {SUBSCRIPTION_ID_KEY: subscription}}))
