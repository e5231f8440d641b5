"""A fan-out: every host of a target, each alone, and the one answer (docs/protocol.md
"The fan-out envelope").

``FanOut`` is the orchestration: workers take the hosts in turn within the call's
deadline and concurrency, the daemon's hosts in flight and the rate hosts start;
what happens on one host (stages 4-10) is the service's, handed in as ``OnHost``.
``FanoutAnswer`` is the answer, built as hosts finish: it counts every host but shows
at most ``[fanout] max_results`` entries, failures first (by code, then alias), then
successes (by alias). That order is known the moment a host is sealed, so each host's
entry (its envelope line, cut by ``envelope.host_entry``, never parsed) is kept only
while it is among the first ``max_results`` so far and dropped as soon as one before
it pushes it out: what a fan-out holds is the counts and at most ``max_results``
entries, however many hosts it has and however much each one printed. The answer is
sealed by the contract (``evaluate.seal_fanout``), as a single host's is.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from sshadapter.contract import envelope
from sshadapter.contract.evaluate import Sealed, Verdict, seal_fanout, seal_line
from sshadapter.daemon.metrics import Metrics
from sshadapter.daemon.records import CallRecord, HostRun
from sshadapter.errors import UpstreamError, failure_of
from sshadapter.pacing import HOST_STARTS, Pacer
from sshadapter.runners.interface import FANOUT_HOST
from sshadapter.shown import shown

log = logging.getLogger(__name__)

OnHost = Callable[[HostRun], Awaitable[Verdict]]
"""Stages 4-10 on one host of a fan-out: its verdict (a failure of its own included)."""

_Key = tuple[int, str, str]
"""A host's place in the answer: (0, code, alias) for a failure, (1, "", alias) after."""


class FanoutAnswer:
    """The counts of every host of one fan-out, and the entries of those shown."""

    def __init__(self, tool: str, request_id: str, max_results: int) -> None:
        self.tool = tool
        self.request_id = request_id
        self.max_results = max_results
        self.kinds: collections.Counter[tuple[str, str]] = collections.Counter()
        """Hosts by (outcome, code), the code empty on success: the answer's counts and
        the metrics' series."""
        self._shown: list[tuple[_Key, bytes]] = []
        """The hosts shown so far, in the answer's order, each with its entry."""

    def add(self, host: str, sealed: Sealed) -> None:
        """Count ``host``; keep its entry only while it is among the first ``max_results``."""
        self.kinds[sealed.outcome, sealed.code or ""] += 1
        key = (1, "", host) if sealed.code is None else (0, sealed.code, host)
        place = bisect.bisect(self._shown, key, key=lambda kept: kept[0])
        if place >= self.max_results:
            return  # after every entry shown so far: never shown
        # A new, exact-size bytes: orjson's buffer behind a line can be twice its length.
        entry = envelope.host_entry(self.tool, self.request_id, host, sealed.line)
        self._shown.insert(place, (key, entry))
        if len(self._shown) > self.max_results:
            self._shown.pop()  # the last in the answer's order: never shown now

    def failures_by_code(self) -> dict[str, int]:
        """Hosts failed, by code, in the codes' order (the answer's and the log line's)."""
        return dict(
            sorted((code, n) for (outcome, code), n in self.kinds.items() if outcome == "failure")
        )

    def counts(self, target: str) -> dict[str, Any]:
        """The answer's `data` but its `results`: the target and the counts."""
        by_code = self.failures_by_code()
        hosts = sum(self.kinds.values())
        failed = sum(by_code.values())
        return {
            "target": target,
            "hosts": hosts,
            "succeeded": hosts - failed,
            "failed": failed,
            "omitted": hosts - len(self._shown),
            "failures_by_code": by_code,
        }

    def entries(self) -> list[bytes]:
        """The entries shown, in the answer's order."""
        return [entry for _, entry in self._shown]


class FanOut:
    """Every fan-out of the daemon: the hosts in flight across them, the rate they start."""

    def __init__(self, max_hosts_in_flight: int, metrics: Metrics) -> None:
        self.max_hosts_in_flight = max_hosts_in_flight
        """The most workers one fan-out starts (each takes its hosts in turn)."""
        self.hosts = asyncio.Semaphore(max_hosts_in_flight)
        """Hosts in flight across every fan-out (DEFAULT_MAX_FANOUT_HOSTS_IN_FLIGHT)."""
        self.starts = Pacer(HOST_STARTS)
        """How fast fan-out hosts start, all fan-outs together (sshadapter/pacing.py)."""
        self.metrics = metrics

    async def run(self, call: CallRecord, on_host: OnHost) -> Verdict:
        """``on_host`` on every host of the call, within the call's deadline and its
        concurrency, and the daemon's hosts in flight; then the answer, sealed. A host
        that fails, fails alone; ``call.runs`` holds the hosts, the intent is written."""
        fanout = call.op.spec.fanout
        # One host is a single call, wherever it was named: it takes no fan-out slot and no
        # start's turn, so it never waits behind a fan-out (its call slot bounds it already).
        fanning = len(call.hosts) > 1
        slot = self.hosts if fanning else contextlib.nullcontext()
        answer = FanoutAnswer(call.op.name, call.request_id, fanout.max_results)
        # The call's concurrency and the daemon's hosts in flight bound the hosts running at
        # once: that many workers take the hosts in turn, so a waiting host is one HostRun,
        # not a task of its own (1,000 pending tasks were ~1 KB each).
        waiting = iter(call.runs.values())

        async def worker() -> None:
            # Set in this worker's own context: its hosts' connect failures are not logged
            # one by one; _verdict logs the fan-out's one line with the counts.
            FANOUT_HOST.set(fanning)
            for run in waiting:  # shared: each host is taken by one worker
                async with slot:
                    if fanning:
                        await self.starts.start()  # the rate the loop's lag allows
                    _answered(call, answer, run, await on_host(run))

        workers = min(len(call.runs), fanout.concurrency, self.max_hosts_in_flight)
        tasks = [asyncio.ensure_future(worker()) for _ in range(workers)]
        try:
            done, _ = await asyncio.wait(tasks, timeout=fanout.deadline_seconds)
        finally:
            for task in tasks:
                task.cancel()  # a no-op on those done; on cancellation, every host stops
            await asyncio.gather(*tasks, return_exceptions=True)
        for task in done:
            if not task.cancelled() and (exc := task.exception()) is not None:
                raise exc  # a bug in one host's stages: the whole call is INTERNAL
        deadline = Verdict(
            failure=failure_of(UpstreamError("fanout_deadline", retryable=True, ran=True))
        )
        for run in call.runs.values():
            if run.span is None:  # running or waiting when the deadline passed
                run.close_attempt(deadline)
                _answered(call, answer, run, deadline)
        return self._verdict(call, answer)

    def _verdict(self, call: CallRecord, answer: FanoutAnswer) -> Verdict:
        """The hosts counted in the metrics, the fan-out's one log line, the answer sealed."""
        for (outcome, code), n in answer.kinds.items():  # one series update per kind of answer
            self.metrics.fanout_hosts.labels(call.op.name, outcome, code).inc(n)
        _log_fanout(call, answer)
        sealed = seal_fanout(call.op, call.request_id, answer.counts(call.target), answer.entries())
        return Verdict(sealed=sealed)


def _answered(call: CallRecord, answer: FanoutAnswer, run: HostRun, verdict: Verdict) -> None:
    """One host is done: its own envelope (checked by the operation's host guard) goes to
    the answer, which keeps it only if it is shown; the host keeps its audit row,
    serialized. So no host's output outlives its judging."""
    answer.add(run.host, seal_line(call.op, call.request_id, verdict))
    run.answered(verdict)
    call.progress.host_done(len(call.hosts))


def _log_fanout(call: CallRecord, answer: FanoutAnswer) -> None:
    """The one warning line of a fan-out whose hosts failed, however many: its request id,
    tool, target and the hosts failed by code (closed lists); which host failed how is in
    the audit's host rows."""
    failed = answer.failures_by_code()
    if not failed:
        return
    log.warning(
        "%s %s on %s: %d of %d hosts failed: %s",
        call.request_id,
        call.op.name,
        shown(call.target),
        sum(failed.values()),
        len(call.hosts),
        " ".join(f"{code}={n}" for code, n in failed.items()),
        extra={"request_id": call.request_id, "tool": call.op.name},
    )
